//! Write-through of a whole small file: a WRITE at offset 0 that replaces
//! everything the file holds, on a file with nothing staged, is uploaded
//! and committed at once, as the FLUSH after it would have done, instead
//! of being staged.
//!
//! This is what a new small file's close sends with the writeback cache
//! (CREATE, then one WRITE with all its bytes, then FLUSH). Staging it cost
//! a staging directory, a block file and a size record (three inodes
//! allocated on the local disk, freed again by the flush a moment later),
//! and reading them back; on a local disk without a journal, allocating an
//! inode next to recently freed ones was most of a small file's create.
//!
//! Durability is the flush's: the commit is a metadata transaction before
//! the reply, and an object uploaded for a commit that did not happen is
//! garbage, never wrong data. Run again (a WRITE resent after a kill -9)
//! it commits the same bytes once more. Anything else, and any failure
//! (an object store outage, a full disk), stages the write as before: this
//! is a shortcut, never a new way to fail. After an upload failed, WRITEs
//! are staged without trying for [`WRITE_THROUGH_PAUSE`]: an object store
//! that is down would otherwise make every small WRITE wait out its
//! timeouts and retries before being staged (and its FLUSH wait again).
//! A file small enough to be inline (`inline.rs`) needs no upload, so it
//! is committed at once even then.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use baton_meta::FileKind;
use bytes::Bytes;

use super::flush::CommitPlan;
use super::{lock, BatonFs};
use crate::error::{Error, Result};

/// Largest WRITE committed at once. A file's first WRITE is committed
/// only if it is the whole file so far; one that turns out not to be the
/// last (the file grows later) makes the next write to its first block
/// read it back to stage the block. Small files are written whole by one
/// WRITE; a larger one usually is not.
pub const WRITE_THROUGH_BYTES_MAX: usize = 64 << 10;
/// How long WRITEs are staged without trying after a write-through upload
/// failed.
pub const WRITE_THROUGH_PAUSE: Duration = Duration::from_secs(10);

/// Until when write-through is paused (an upload failed).
#[derive(Debug, Default)]
pub(super) struct Pause {
    until: Mutex<Option<Instant>>,
}

impl Pause {
    fn active(&self) -> bool {
        lock(&self.until).is_some_and(|until| Instant::now() < until)
    }

    fn start(&self) {
        *lock(&self.until) = Some(Instant::now() + WRITE_THROUGH_PAUSE);
    }
}

impl BatonFs {
    /// Commits the WRITE of `data` at `offset` at once if it is a whole
    /// small file (module docs); `false`: stage it. The caller holds the
    /// inode mutex.
    pub(super) fn wrote_through(&self, ino: u64, offset: u64, data: &[u8]) -> bool {
        if offset != 0
            || data.is_empty()
            || data.len() > WRITE_THROUGH_BYTES_MAX
            || data.len() as u64 > self.block_size
            // Inline bytes need no store: the pause is for uploads.
            || (self.write_through_pause.active() && !self.keeps_inline(0, data.len() as u64))
        {
            return false;
        }
        match self.write_through(ino, data) {
            Ok(committed) => committed,
            Err(err) => {
                if matches!(err, Error::Blocks(_)) {
                    self.write_through_pause.start();
                    tracing::info!(nodeid = ino, %err, pause = ?WRITE_THROUGH_PAUSE, "write-through upload failed; staging writes for a while");
                } else {
                    tracing::debug!(nodeid = ino, %err, "write-through failed; staging the write");
                }
                false
            }
        }
    }

    fn write_through(&self, ino: u64, data: &[u8]) -> Result<bool> {
        // An open orphan's data stays staged until it is reclaimed.
        if self.handles.is_open_orphan(ino) || !self.staging.is_unstaged(ino)? {
            return Ok(false);
        }
        let attr = self.meta.getattr(ino)?;
        let len = data.len() as u64;
        if attr.kind != FileKind::Regular || attr.size > len {
            return Ok(false);
        }
        let plan = CommitPlan {
            size: len,
            uploads: vec![(0, Bytes::copy_from_slice(data))],
            punched: Vec::new(),
        };
        // `during-upload@write` fires only here (a flush reports no opcode).
        let released = self.upload_and_commit(ino, &plan, fuse_wire::abi::opcode::WRITE)?;
        self.delete_objects(released.iter().map(|o| o.key.as_str()));
        tracing::trace!(nodeid = ino, len, "written through");
        Ok(true)
    }
}
