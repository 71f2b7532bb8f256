//! Inline blocks: a small file's bytes kept in its block-map row
//! (`baton_meta::BlockRef::inline`) instead of in an object of their own.
//!
//! Why: a small file's object was most of its create and its unlink. In a
//! local-directory store it is a file made (a temporary file, its write,
//! a rename) and later unlinked, each an inode allocated or freed on the
//! host's disk; on S3 a PUT and a DELETE. In its row it costs nothing the
//! commit's metadata transaction did not already do: the block's bytes go
//! where its key would have gone, and leave with the row.
//!
//! Which blocks: block 0 of a file whose size after the commit is at most
//! [`INLINE_BYTES_MAX`], on volumes of metadata format
//! [`baton_meta::INLINE_BLOCKS_FORMAT_VERSION`] or later (an older build
//! would read an inline key as an object's, so older volumes get none).
//! A file that grows past it gets an object at the commit that grows it
//! (the write staged block 0, reading the inline bytes as its base).
//!
//! Durability is the row's: the commit that writes it is the durability
//! point of the bytes too, and FSYNC's metadata sync covers them; there is
//! no object to sync. The bytes are sealed with the volume's block codec
//! under the block's inline key, as its object would have been.
//! Block sharing (copy_file_range) copies the row, bytes and all.

use std::borrow::Cow;

use baton_blocks::{BlocksError, ObjectKey};
use baton_meta::{BlockRef, INLINE_KEY_PREFIX};
use bytes::Bytes;

use super::BatonFs;

/// Largest file whose one block is kept inline. Small files of source
/// trees and datasets are mostly below it; above it, the bytes a metadata
/// transaction writes twice (its log, then the checkpoint) outweigh the
/// object file they save.
pub const INLINE_BYTES_MAX: u64 = 16 << 10;

impl BatonFs {
    /// Whether a commit leaving the file at `size` bytes keeps block
    /// `index` inline.
    pub(super) fn keeps_inline(&self, index: u64, size: u64) -> bool {
        index == 0 && size <= self.inline_bytes_max
    }

    /// The row of block `index` of `ino` holding `data` inline.
    pub(super) fn inline_row(
        &self,
        ino: u64,
        index: u64,
        data: &[u8],
    ) -> baton_blocks::Result<BlockRef> {
        let key = baton_blocks::inline_key(INLINE_KEY_PREFIX, ino, index);
        let stored = self.store.seal_inline(&key, data)?;
        Ok(BlockRef {
            index,
            object_key: key,
            len: data.len() as u32,
            inline: Some(stored),
        })
    }

    /// [`baton_blocks::BlockCache::read_into`] for committed `row`, whose
    /// bytes are in the row itself or in its object: fills `buf` from
    /// `offset` of the block, as much as the block holds; returns how
    /// many bytes it copied.
    pub(super) fn read_row_into(
        &self,
        row: &BlockRef,
        offset: u64,
        buf: &mut [u8],
    ) -> baton_blocks::Result<usize> {
        if !row.is_inline() {
            let key = ObjectKey::parse(&row.object_key)?;
            return self.cache.read_into(&key, u64::from(row.len), offset, buf);
        }
        let bytes = self.inline_bytes(row)?;
        let range = clip(row, offset, buf.len() as u64);
        let n = range.len();
        buf[..n].copy_from_slice(&bytes[range]);
        Ok(n)
    }

    /// [`baton_blocks::BlockCache::read`] for committed `row`: `len`
    /// bytes from `offset`, fewer at the end of the block.
    pub(super) fn read_row(
        &self,
        row: &BlockRef,
        offset: u64,
        len: u64,
    ) -> baton_blocks::Result<Bytes> {
        if !row.is_inline() {
            let key = ObjectKey::parse(&row.object_key)?;
            return self.cache.read(&key, u64::from(row.len), offset, len);
        }
        let bytes = self.inline_bytes(row)?;
        Ok(Bytes::copy_from_slice(&bytes[clip(row, offset, len)]))
    }

    /// The block bytes of inline `row`, at least its length of them.
    fn inline_bytes<'r>(&self, row: &'r BlockRef) -> baton_blocks::Result<Cow<'r, [u8]>> {
        let corrupt = |reason: String| BlocksError::Decode {
            key: row.object_key.clone(),
            reason,
        };
        let stored = row
            .inline
            .as_deref()
            .ok_or_else(|| corrupt("an inline key without inline bytes in its row".into()))?;
        let bytes = self.store.open_inline(&row.object_key, stored)?;
        if bytes.len() < row.len as usize {
            return Err(corrupt(format!(
                "the row holds {} bytes but says the block has {}; run `fsctl fsck`",
                bytes.len(),
                row.len
            )));
        }
        Ok(bytes)
    }
}

/// Bytes `offset..offset + len` of `row`'s block, cut at its length.
fn clip(row: &BlockRef, offset: u64, len: u64) -> std::ops::Range<usize> {
    let block_len = u64::from(row.len);
    let start = offset.min(block_len);
    let end = offset.saturating_add(len).min(block_len);
    start as usize..end as usize
}
