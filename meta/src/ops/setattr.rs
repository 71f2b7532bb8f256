//! `setattr`: mode, owner, size (with block-map truncation) and times.

use crate::sql::Db;

use super::{blockmap, inode, quota};
use crate::error::{MetaError, Result};
use crate::limits::FILE_SIZE_BYTES_MAX;
use crate::row_cache::Known;
use crate::types::{
    Attr, FileKind, SetAttr, Timespec, TruncatedBlocks, MODE_PERMISSION_MASK, S_ISGID, S_ISUID,
    S_IXGRP,
};

/// Applies `set` to `ino` in the caller's transaction.
pub(crate) fn setattr<C: Db>(
    c: &C,
    known: Known<'_>,
    ino: u64,
    set: &SetAttr,
    block_size: u32,
) -> Result<(Attr, TruncatedBlocks)> {
    let mut a = inode::attr_known(c, known, ino)?;
    let now = Timespec::now();
    let mut truncated = TruncatedBlocks::default();
    if let Some(size) = set.size {
        truncated = resize(c, &mut a, size, block_size)?;
        if set.mtime.is_none() {
            a.mtime = now;
        }
    }
    apply_owner(&mut a, set.uid, set.gid);
    if let Some(mode) = set.mode {
        a.mode = mode & MODE_PERMISSION_MASK;
        super::acl::chmod(c, &a)?;
    }
    if let Some(t) = set.atime {
        a.atime = t.resolve(now);
    }
    if let Some(t) = set.mtime {
        a.mtime = t.resolve(now);
    }
    a.ctime = set.ctime.unwrap_or(now);
    inode::save(c, &a)?;
    Ok((a, truncated))
}

/// Sets the size of a regular file; a shrink truncates the block map.
fn resize<C: Db>(c: &C, a: &mut Attr, size: u64, block_size: u32) -> Result<TruncatedBlocks> {
    blockmap::regular(a)?;
    if size > FILE_SIZE_BYTES_MAX {
        return Err(MetaError::FileTooLarge {
            ino: a.ino,
            size_bytes: size,
        });
    }
    let mut out = TruncatedBlocks::default();
    let quota_before = super::reserve::quota_bytes(c, a)?;
    if size < a.size {
        let (keys, partial_block) = blockmap::truncate(c, a.ino, size, block_size)?;
        out.released = blockmap::unreferenced(c, keys)?;
        out.partial_block = partial_block;
    }
    a.size = size;
    // A growth past a quota is refused here (EDQUOT, nothing applied).
    let quota_after = super::reserve::quota_bytes(c, a)?;
    quota::add_bytes(c, a.ino, quota_after as i64 - quota_before as i64, true)?;
    Ok(out)
}

/// Changes owner and group; when either actually changes on a regular file,
/// clears set-user-ID, and set-group-ID if group-execute is set (POSIX
/// chown; a set-group-ID without group-execute means mandatory locking).
fn apply_owner(a: &mut Attr, uid: Option<u32>, gid: Option<u32>) {
    let new_uid = uid.unwrap_or(a.uid);
    let new_gid = gid.unwrap_or(a.gid);
    if (new_uid, new_gid) == (a.uid, a.gid) {
        return;
    }
    a.uid = new_uid;
    a.gid = new_gid;
    if a.kind == FileKind::Regular {
        a.mode &= !S_ISUID;
        if a.mode & S_IXGRP != 0 {
            a.mode &= !S_ISGID;
        }
    }
}
