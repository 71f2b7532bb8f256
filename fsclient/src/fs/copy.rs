//! COPY_FILE_RANGE inside one mount: whole blocks are shared, not copied
//! (docs/design-notes.md#block-sharing).
//!
//! Objects are immutable and a block-map row names one whole object, so
//! two rows may name the same object: a copy points the destination's
//! rows at the source's objects (`MetaStore::share_blocks`) and a later
//! write to either side stages a new block and repoints only that side's
//! row (copy-on-write falls out of immutability). An object is deleted
//! only once no row names it: every path that releases objects asks the
//! metadata which of them no row names any more (`blockmap::unreferenced`,
//! over the `blocks(object_key)` index), in the transaction that drops the
//! row. The AEAD of an encrypted object binds its key, which the sharing
//! row stores whole, so a shared object decodes for either file.
//!
//! # Steps
//! 1. Under both inodes' stripe mutexes, commit what is staged for the
//!    source (the copy sees every acknowledged write) and the destination
//!    (nothing staged can later land over the shared rows); read the
//!    source's size, which clips the copy. A caller other than root then
//!    clears the destination's set-ID bits, as a WRITE does (`copy_range`).
//! 2. The bytes that are not whole blocks aligned alike on both sides (the
//!    edges, or everything when `off_in` and `off_out` differ modulo the
//!    block size) are read and staged as WRITEs would be.
//! 3. Under the mutexes again, commit the destination's staged bytes, then
//!    share the whole blocks, [`COMMIT_BLOCKS_ROWS_MAX`] per transaction;
//!    the last one (always run, maybe sharing nothing) sets the size and
//!    times and records the request's result (exactly once: a resent
//!    request that the dead generation finished is answered from it).
//!
//! Every step can run again: a crash before the last transaction leaves a
//! partial copy that the resent request completes.

use baton_blocks::FILE_SIZE_BYTES_MAX;
use baton_meta::limits::COMMIT_BLOCKS_ROWS_MAX;
use baton_meta::{ObjectRef, Recorded, RequestKey, ShareBlocks};
use fuse_wire::abi::opcode;
use fuse_wire::{CopyFileRangeIn, Errno, Request};

use super::namespace::Caller;
use super::{lock, BatonFs};
use crate::error::{Error, Result};

/// Bytes read and staged at a time by the byte part of a copy.
pub const COPY_CHUNK_BYTES_MAX: u64 = 1 << 20;

/// The most bytes COPY_FILE_RANGE (the narrow opcode, a 32-bit answer)
/// copies: what the kernel asks at most, page-aligned.
const NARROW_COPY_BYTES_MAX: u64 = (u32::MAX as u64) & !4095;

/// How a copy of `len` bytes splits: bytes before the shared blocks,
/// whole blocks, bytes after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CopyPlan {
    off_in: u64,
    off_out: u64,
    len: u64,
    /// Bytes copied as bytes before the first shared block.
    head_len: u64,
    /// Whole blocks shared.
    block_count: u64,
}

impl CopyPlan {
    /// Pure: shares whole source blocks only when both offsets sit alike
    /// within a block.
    fn new(off_in: u64, off_out: u64, len: u64, block_size: u64) -> CopyPlan {
        let aligned = off_in % block_size == off_out % block_size;
        let head_len = (off_in.next_multiple_of(block_size) - off_in).min(len);
        let block_count = if aligned {
            (len - head_len) / block_size
        } else {
            0
        };
        CopyPlan {
            off_in,
            off_out,
            len,
            head_len: if aligned { head_len } else { len },
            block_count,
        }
    }

    /// The byte ranges copied as bytes: `(source offset, destination
    /// offset, length)`, empty ones left out.
    fn byte_ranges(&self, block_size: u64) -> Vec<(u64, u64, u64)> {
        let shared = self.block_count * block_size;
        let tail_at = self.head_len + shared;
        [
            (self.off_in, self.off_out, self.head_len),
            (
                self.off_in + tail_at,
                self.off_out + tail_at,
                self.len - tail_at,
            ),
        ]
        .into_iter()
        .filter(|r| r.2 > 0)
        .collect()
    }
}

impl BatonFs {
    /// COPY_FILE_RANGE from `ino_in`, exactly once; returns the bytes
    /// copied.
    pub(super) fn do_copy_file_range(
        &self,
        req: &Request<'_>,
        ino_in: u64,
        arg: &CopyFileRangeIn,
    ) -> Result<u64> {
        let ino_out = arg.nodeid_out.get();
        if arg.flags != 0 {
            return Err(Error::refused(
                ino_out,
                "copy_file_range flags",
                Errno::EINVAL,
            ));
        }
        let len_max = match req.opcode() {
            opcode::COPY_FILE_RANGE => NARROW_COPY_BYTES_MAX,
            _ => u64::MAX,
        };
        let len = arg.len.min(len_max);
        // Root keeps the bits, as CAP_FSETID does on a local filesystem.
        let kill_suidgid = (req.caller().0 != 0).then(|| Caller::of(req));
        self.once(
            req,
            |recorded| match recorded {
                Recorded::Copied(_, bytes, _) => Ok(bytes),
                _ => Err(super::once::mismatched(ino_out, "copy_file_range")),
            },
            |key| {
                let range = (arg.off_in, arg.off_out, len);
                self.copy_range(ino_in, ino_out, range, kill_suidgid, key)
            },
        )
    }

    /// The steps of the module docs; `(off_in, off_out, len)`. With
    /// `kill_suidgid` (a caller other than root), the destination loses
    /// its set-ID bits before any byte lands, as a WRITE's kill flag does
    /// (`kill_suidgid`): with HANDLE_KILLPRIV_V2 the kernel leaves that to
    /// the filesystem, and COPY_FILE_RANGE carries no kill flag.
    /// Idempotent, so a copy redone after a crash is fine.
    fn copy_range(
        &self,
        ino_in: u64,
        ino_out: u64,
        (off_in, off_out, len): (u64, u64, u64),
        kill_suidgid: Option<Caller>,
        key: Option<RequestKey>,
    ) -> Result<u64> {
        let size_in = {
            let _guards = self.staging_locks(&[ino_in, ino_out])?;
            self.flush_locked(ino_in, &[])?;
            if ino_out != ino_in {
                self.flush_locked(ino_out, &[])?;
            }
            self.meta.getattr(ino_in)?.size
        };
        let len = len.min(size_in.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        let end_out = off_out
            .checked_add(len)
            .filter(|e| *e <= FILE_SIZE_BYTES_MAX)
            .ok_or_else(|| {
                Error::refused(ino_out, "copy past the largest file size", Errno::EFBIG)
            })?;
        let overlaps = ino_in == ino_out && off_in < end_out && off_out < off_in + len;
        if overlaps {
            // The kernel refuses these before they reach FUSE.
            return Err(Error::refused(
                ino_out,
                "copy over its own source range",
                Errno::EINVAL,
            ));
        }
        self.check_quota_growth(ino_out, end_out)?;
        if let Some(caller) = kill_suidgid {
            self.kill_suidgid(ino_out, caller)?;
        }
        let bs = self.block_size;
        let plan = CopyPlan::new(off_in, off_out, len, bs);
        for (from, to, count) in plan.byte_ranges(bs) {
            self.copy_bytes(ino_in, ino_out, from, to, count)?;
        }
        // Test hook: the bytes are staged, no block is shared yet.
        crate::fault::hit(
            crate::fault::Point::DuringUpload,
            opcode::COPY_FILE_RANGE_64,
        );
        let released = {
            let _guards = self.staging_locks(&[ino_in, ino_out])?;
            self.flush_locked(ino_out, &[])?;
            self.share_locked(ino_in, ino_out, &plan, end_out, key)?
        };
        self.delete_objects(released.iter().map(|o| o.key.as_str()));
        tracing::debug!(
            nodeid = ino_out,
            source = ino_in,
            off_in,
            off_out,
            len,
            shared_blocks = plan.block_count,
            released = released.len(),
            "copy_file_range"
        );
        Ok(len)
    }

    /// Step 2: bytes `from..from+count` of `ino_in` staged at `to` of
    /// `ino_out`, a chunk at a time.
    fn copy_bytes(&self, ino_in: u64, ino_out: u64, from: u64, to: u64, count: u64) -> Result<()> {
        let mut done = 0;
        while done < count {
            let chunk = (count - done).min(COPY_CHUNK_BYTES_MAX);
            let data = self.read_retrying(ino_in, from + done, chunk)?;
            if data.is_empty() {
                // The source shrank meanwhile: a concurrent truncate.
                return Err(Error::refused(
                    ino_in,
                    "copy source shrank during the copy",
                    Errno::EIO,
                ));
            }
            self.stage_bytes(ino_out, to + done, &data)?;
            done += data.len() as u64;
        }
        Ok(())
    }

    /// Step 3's transactions; the caller holds both stripe mutexes.
    /// Returns the objects released.
    fn share_locked(
        &self,
        ino_in: u64,
        ino_out: u64,
        plan: &CopyPlan,
        end_out: u64,
        key: Option<RequestKey>,
    ) -> Result<Vec<ObjectRef>> {
        let bs = self.block_size;
        let first_in = (plan.off_in + plan.head_len) / bs;
        let first_out = (plan.off_out + plan.head_len) / bs;
        let mut released = Vec::new();
        let mut done = 0;
        loop {
            let count = (plan.block_count - done).min(COMMIT_BLOCKS_ROWS_MAX as u64);
            let last = done + count == plan.block_count;
            let share = ShareBlocks {
                source: ino_in,
                source_first_index: first_in + done,
                first_index: first_out + done,
                count,
                size_min: end_out,
                copied_bytes: plan.len,
            };
            let (_, gone) =
                self.meta
                    .share_blocks(ino_out, &share, if last { key } else { None })?;
            released.extend(gone);
            done += count;
            if last {
                break;
            }
        }
        self.invalidate(ino_out);
        if self.store.syncs_objects() {
            // Its rows now name objects another file may not have synced:
            // its next FSYNC syncs its whole block map.
            lock(&self.unsynced).synced(ino_out, false);
        }
        Ok(released)
    }

    /// The stripe mutexes of `inos` (ascending, so no deadlock), refused
    /// once fenced (as [`BatonFs::staging_lock`]).
    fn staging_locks(&self, inos: &[u64]) -> Result<Vec<std::sync::MutexGuard<'_, ()>>> {
        let guards = self.inode_locks_of(inos);
        if self.fenced.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(baton_meta::MetaError::Fenced {
                op: "copy_file_range",
            }
            .into());
        }
        Ok(guards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 1000;

    #[test]
    fn aligned_copies_share_whole_blocks_and_copy_the_edges() {
        let p = CopyPlan::new(1500, 7500, 3700, BS);
        assert_eq!((p.head_len, p.block_count), (500, 3));
        assert_eq!(
            p.byte_ranges(BS),
            vec![(1500, 7500, 500), (5000, 11000, 200)]
        );
        let p = CopyPlan::new(2000, 0, 3000, BS);
        assert_eq!((p.head_len, p.block_count), (0, 3));
        assert!(p.byte_ranges(BS).is_empty());
        // Shorter than the head: all bytes.
        let p = CopyPlan::new(1500, 500, 300, BS);
        assert_eq!((p.head_len, p.block_count), (300, 0));
        assert_eq!(p.byte_ranges(BS), vec![(1500, 500, 300)]);
    }

    #[test]
    fn unaligned_copies_copy_every_byte() {
        let p = CopyPlan::new(0, 1, 5000, BS);
        assert_eq!((p.head_len, p.block_count), (5000, 0));
        assert_eq!(p.byte_ranges(BS), vec![(0, 1, 5000)]);
    }
}
