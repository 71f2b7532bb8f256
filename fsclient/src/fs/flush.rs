//! Durability: where staged writes become part of the file.
//!
//! # The protocol
//! 1. WRITE: the bytes go into the staging area (`Staging::write`, a local
//!    file written with pwrite) BEFORE the reply. The page cache of the
//!    staging filesystem is enough to survive the death of this process;
//!    FUSE fsync additionally commits (below) and then syncs the metadata
//!    (`MetaStore::sync`), which makes the commit survive power loss.
//!    The one exception, a WRITE at offset 0 that holds a whole small file
//!    with nothing staged, runs the upload and commit of step 2 itself
//!    before its reply (`write_through.rs`).
//! 2. FLUSH (every close), FSYNC, RELEASE, SYNCFS, shutdown, and recovery at
//!    start run these steps under the inode's mutex, until staging is empty
//!    for the inode (at most [`FLUSH_ROUNDS_MAX`] rounds):
//!    - take up to 16 staged blocks and the size record
//!      (`Staging::take_for_upload`);
//!    - upload them as new immutable objects (`BlockStore::put_blocks`, at
//!      most `UPLOAD_PARALLEL_MAX` in flight);
//!    - commit the new block-map rows, the rows a truncation floor kills and
//!      the size in ONE metadata transaction (`commit_blocks`): the
//!      durability point;
//!    - clear what was taken from staging (`Staging::clear`; anything
//!      written meanwhile stays staged);
//!    - delete the objects the commit released (never before: the commit
//!      might not have happened).
//!
//! # Durability contract
//! - Process death (kill -9, OOM) at any instant loses no acknowledged
//!   operation: a WRITE is staged before its reply, a namespace change and a
//!   flush's commit are committed metadata transactions before theirs (they
//!   live in the kernel's page cache from then on).
//! - Power loss or a kernel crash: what FSYNC acknowledged survives whole.
//!   It syncs the file's objects first (a local directory store's files
//!   and the directory entries naming them, `durable.rs`; a remote store's
//!   acknowledged PUT is durable already), then the metadata log
//!   (`MetaStore::sync`). FSYNCDIR syncs the metadata log; SYNCFS syncs
//!   every object and the log, but Linux sends it only on virtiofs:
//!   `sync(1)` on a /dev/fuse mount never reaches Baton. FLUSH (close) does
//!   not sync: later changes may be lost, as on a local filesystem without
//!   fsync. What a crashed boot left staged (maybe torn) is set aside at
//!   the next open, never applied over committed data (`Staging`'s
//!   `boot.rs`). Test: `chaos-tests/tests/power_cut.rs`.
//!
//! A crash between any two steps loses nothing: staging is cleared only
//! after the commit, and redoing a flush from the staged state (what start-
//! up recovery does with `Staging::recover`) uploads under fresh keys and
//! re-applies the same floor, rows and size. Objects uploaded by a flush
//! that did not commit are deleted on failure, or left as unreferenced
//! garbage after a crash (never wrong data).
//!
//! # The truncation floor
//! `Staging::set_size` records a floor: committed bytes at or past it are
//! dead. The commit punches committed rows starting at or past the floor
//! and, when the size grew again past the floor, rewrites the committed
//! block containing it cut at the floor (a row cannot be clamped otherwise).

use std::collections::BTreeSet;

use baton_blocks::{ObjectKey, UploadSet};
use baton_meta::limits::COMMIT_BLOCKS_ROWS_MAX;
use baton_meta::{BlockRef, CommitBlocks, FileKind, ObjectRef, TimeOrNow};
use bytes::Bytes;
use fuse_wire::{FlushIn, ReleaseFlags, ReleaseIn};

use super::data::Rows;
use super::durable::ToSync;
use super::{lock, BatonFs};
use crate::error::{Error, Result};
use crate::locks::LockKind;

/// One commit's content: the new size, the blocks to upload (index,
/// content) and the rows to punch.
pub(super) struct CommitPlan {
    pub(super) size: u64,
    pub(super) uploads: Vec<(u64, Bytes)>,
    pub(super) punched: Vec<u64>,
}

/// Objects an FSYNC syncs one by one at most; more, and it syncs the
/// store's filesystem (`sync_objects_locked`).
pub const SYNC_OBJECTS_ONE_BY_ONE_MAX: usize = 4096;

/// Upload-and-commit rounds of one flush at most; each takes up to
/// `UPLOAD_SET_BLOCK_COUNT_MAX` blocks. A writer racing the flush can only
/// keep it busy this long.
pub const FLUSH_ROUNDS_MAX: usize = 1 << 16;

impl BatonFs {
    /// Flushes `ino` (takes its mutex).
    pub fn flush_inode(&self, ino: u64) -> Result<()> {
        let _guard = self.inode_lock(ino);
        self.flush_locked(ino, &[])
    }

    /// Flushes every inode with staged data; orphans are left staged (they
    /// are discarded when reclaimed).
    pub fn flush_all(&self) -> Result<()> {
        let mut first_err = None;
        for ino in self.staging.staged_inodes()? {
            if self.handles.is_open_orphan(ino) {
                continue;
            }
            if let Err(err) = self.flush_inode(ino) {
                tracing::error!(nodeid = ino, %err, "flush failed; the data stays staged");
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The last flush before this process exits: [`BatonFs::flush_all`],
    /// and if anything could not be uploaded, [`Error::LeftStaged`] saying
    /// how much stays where. With `mount_gone` (no other process will
    /// serve this mount) what stays is synced and the area marked so, to
    /// be applied after a reboot too (`Staging::mark_synced`).
    pub fn flush_all_at_exit(&self, mount_gone: bool) -> Result<()> {
        let Err(err) = self.flush_all() else {
            return Ok(());
        };
        if mount_gone {
            if let Err(sync_err) = self.staging.mark_synced() {
                tracing::error!(%sync_err, "cannot sync what stays staged; after a power cut or a reboot it will be set aside, not applied");
            }
        }
        let left = self.staging.staged_inodes().unwrap_or_default();
        let bytes = self.staging.staged_bytes(&left).unwrap_or(0);
        Err(Error::LeftStaged {
            files: left.len(),
            bytes,
            dir: self.staging.dir().to_path_buf(),
            cause: err.to_string(),
        })
    }

    /// This process now writes the staging area alone (adopted after a
    /// death or a handover, or resumed after a rolled-back one): from here
    /// on, questions about inodes it never staged for skip the files
    /// (`Staging::own`).
    pub fn own_staging(&self) -> Result<()> {
        self.replay_metadata_log()?;
        let staged = self.staging.own()?;
        tracing::debug!(inodes = staged.len(), "staging area owned");
        Ok(())
    }

    /// Commits the metadata changes a predecessor that died had replied
    /// but not committed (`MetaStore::replay_log`), before anything reads:
    /// it may have died after this process opened the store (in an
    /// upgrade's handover, or while this one stood by).
    fn replay_metadata_log(&self) -> Result<()> {
        let replayed = self.meta.replay_log()?;
        if replayed > 0 {
            tracing::info!(
                requests = replayed,
                "metadata changes of a dead generation committed from the operation log"
            );
        }
        // From here this process is the volume's writer: what it reads it
        // may keep, as every later change is its own.
        self.meta.serve_as_only_writer();
        Ok(())
    }

    /// Commits what a dead process left staged, before serving (what the
    /// store cannot take now stays staged for the next flush). With
    /// `others_dead` (this process holds the volume's exclusive lock, so
    /// no other mount can be serving it) every registered session is
    /// deleted with its holds ([`BatonFs::expire_earlier_sessions`]), and
    /// a first batch of the orphans only they held is reclaimed before
    /// serving (one transaction); the session ticks reclaim the rest.
    pub fn recover(&self, others_dead: bool) -> Result<()> {
        self.replay_metadata_log()?;
        if others_dead {
            self.expire_earlier_sessions()?;
            self.reclaim_unheld_batches(1)?;
        }
        for ino in self.staging.recover()? {
            let attr = match self.meta.getattr(ino) {
                Ok(attr) => attr,
                Err(baton_meta::MetaError::NotFound { .. }) => {
                    tracing::warn!(nodeid = ino, "staged data of a deleted inode discarded");
                    self.staging.discard(ino)?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if attr.kind != FileKind::Regular {
                self.staging.discard(ino)?;
            } else if attr.nlink > 0 {
                // A store that cannot take the data now (full, unreachable)
                // must not stop this process from serving: that left the
                // mount in a crash loop. The data stays staged, readable
                // as it was, and the file's next flush commits it.
                match self.flush_inode(ino) {
                    Ok(()) => tracing::info!(nodeid = ino, "recovered staged data committed"),
                    Err(err) => tracing::warn!(
                        nodeid = ino,
                        %err,
                        "recovered staged data cannot be committed now; it stays staged for the next flush"
                    ),
                }
            }
        }
        Ok(())
    }

    /// A new mount of a volume no other mount can be serving (one mount
    /// of a volume per host, and the volume is not shared): deletes every
    /// registered session with its holds, so that the orphans dead mounts
    /// held go at the first session tick (in the background, in batches)
    /// instead of once their sessions expire. Call before registering
    /// this mount's session.
    pub fn expire_earlier_sessions(&self) -> Result<()> {
        let expired = self.meta.expire_sessions(std::time::Duration::ZERO)?;
        if !expired.is_empty() {
            tracing::info!(sessions = ?expired, "sessions of earlier mounts deleted");
        }
        Ok(())
    }

    /// The flush protocol (module docs); the caller holds the inode mutex.
    /// `punched` rows are removed in the first commit.
    pub(super) fn flush_locked(&self, ino: u64, punched: &[u64]) -> Result<()> {
        let mut extra = punched.to_vec();
        for _ in 0..FLUSH_ROUNDS_MAX {
            let set = self.staging.take_for_upload(ino)?;
            let empty = set.blocks.is_empty() && set.size.is_none() && set.floor_bytes.is_none();
            if empty && extra.is_empty() {
                return Ok(());
            }
            match self.commit_set(ino, &set, std::mem::take(&mut extra)) {
                Ok(()) => {}
                // The inode was reclaimed meanwhile: its staged bytes belong
                // to no file.
                Err(Error::Meta(e)) if matches!(*e, baton_meta::MetaError::NotFound { .. }) => {
                    tracing::warn!(nodeid = ino, "staged data of a deleted inode discarded");
                    self.staging.discard(ino)?;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            if set.complete {
                return Ok(());
            }
        }
        Err(Error::refused(
            ino,
            "flush did not converge",
            fuse_wire::Errno::EIO,
        ))
    }

    /// Uploads and commits one upload set, then clears it from staging and
    /// deletes the objects the commit released.
    fn commit_set(&self, ino: u64, set: &UploadSet, punched: Vec<u64>) -> Result<()> {
        let plan = self.plan(ino, set, punched)?;
        // The upload runs from flush, fsync, release or shutdown: no opcode
        // filter for the test hook.
        let released = self.upload_and_commit(ino, &plan, 0)?;
        // Test hook: committed, staging half cleared (record settled, block
        // files still there). No opcode filter, like DuringUpload.
        self.waking_retirement(|| {
            self.staging.clear_with(set, &|| {
                crate::fault::hit(crate::fault::Point::DuringClear, 0)
            })
        })?;
        self.delete_objects(released.iter().map(|o| o.key.as_str()));
        tracing::debug!(
            nodeid = ino,
            blocks = plan.uploads.len(),
            size = plan.size,
            released = released.len(),
            "staged data committed"
        );
        Ok(())
    }

    /// Steps 2 and 3 of the protocol: uploads `plan`'s blocks under fresh
    /// keys and commits them, its punched rows and its size in one
    /// metadata transaction (the objects are deleted again if it fails).
    /// Returns the objects the commit released: delete them once the
    /// caller is done. `fault_op`: the opcode the `during-upload` test hook
    /// reports.
    pub(super) fn upload_and_commit(
        &self,
        ino: u64,
        plan: &CommitPlan,
        fault_op: u32,
    ) -> Result<Vec<ObjectRef>> {
        let (inline, objects): (Vec<_>, Vec<_>) = plan
            .uploads
            .iter()
            .partition(|(index, _)| self.keeps_inline(*index, plan.size));
        let keys = if objects.is_empty() {
            Vec::new()
        } else {
            self.store
                .put_blocks(objects.iter().map(|(i, d)| (ino, *i, d.clone())).collect())?
        };
        let mut blocks = objects
            .iter()
            .zip(&keys)
            .map(|((index, data), key)| {
                BlockRef::object(*index, key.to_string(), data.len() as u32)
            })
            .collect::<Vec<_>>();
        for (index, data) in inline {
            match self.inline_row(ino, *index, data) {
                Ok(row) => blocks.push(row),
                Err(err) => {
                    self.store.delete(&keys);
                    return Err(err.into());
                }
            }
        }
        // Test hook: blocks uploaded, block map not committed.
        crate::fault::hit(crate::fault::Point::DuringUpload, fault_op);
        let writeback = self.writeback.load(std::sync::atomic::Ordering::Relaxed);
        // Under the writeback cache the kernel set mtime and ctime at the
        // write and sends them in a SETATTR (before the FLUSH, or after a
        // crash whenever the close comes): a commit, which runs at the
        // flush, at the write-back or in the next generation, leaves them.
        // A punched hole is ours to date (the kernel does not).
        let commit = CommitBlocks {
            new_size: Some(plan.size),
            mtime: (!writeback && !plan.uploads.is_empty()).then_some(TimeOrNow::Now),
            ctime: (!writeback || !plan.punched.is_empty()).then_some(TimeOrNow::Now),
            blocks,
            punched: plan.punched.clone(),
        };
        let released = match self.meta.commit_blocks(ino, &commit, None) {
            Ok((_, released)) => released,
            Err(err) => {
                self.store.delete(&keys);
                return Err(err.into());
            }
        };
        self.invalidate(ino);
        if self.store.syncs_objects() {
            lock(&self.unsynced).committed(ino, &keys);
        }
        for ((_, data), key) in objects.iter().zip(&keys) {
            self.cache.insert(key, data);
        }
        Ok(released)
    }

    /// What one commit writes: the size, the blocks to upload (staged ones
    /// and a floor rewrite) and the rows to punch.
    fn plan(&self, ino: u64, set: &UploadSet, mut punched: Vec<u64>) -> Result<CommitPlan> {
        let attr = self.meta.getattr(ino)?;
        let bs = self.block_size;
        let staged_end = set
            .blocks
            .iter()
            .map(|b| b.index * bs + b.data.len() as u64)
            .max()
            .unwrap_or(0);
        let size = match set.size {
            Some(s) => s.resolve(attr.size),
            None => attr.size.max(staged_end),
        };
        let (empty, full): (Vec<_>, Vec<_>) = set.blocks.iter().partition(|b| b.data.is_empty());
        // A staged block can reach past the staged size only when the
        // process died between writing the block and recording the size:
        // those bytes were never acknowledged (the kernel resends the
        // WRITE), so they are cut, as reads already cut them.
        let mut uploads: Vec<(u64, Bytes)> = full
            .iter()
            .filter(|b| b.index * bs < size)
            .map(|b| {
                let keep = (size - b.index * bs).min(b.data.len() as u64) as usize;
                (b.index, b.data.slice(..keep))
            })
            .collect();
        punched.extend(empty.iter().map(|b| b.index));
        let staged: BTreeSet<u64> = set.blocks.iter().map(|b| b.index).collect();
        if let Some(floor) = set.floor_bytes.filter(|f| *f < attr.size) {
            let sizes = (attr.size, size);
            self.floor_rows(ino, floor, sizes, &staged, &mut punched, &mut uploads)?;
        }
        tracing::debug!(nodeid = ino, committed_size = attr.size, size, set_size = ?set.size, floor = ?set.floor_bytes, uploads = ?uploads.iter().map(|(i, d)| (*i, d.len())).collect::<Vec<_>>(), punched = ?punched, "commit plan");
        punched.sort_unstable();
        punched.dedup();
        if uploads.len() + punched.len() > COMMIT_BLOCKS_ROWS_MAX {
            return Err(Error::refused(
                ino,
                "commit too large",
                fuse_wire::Errno::EFBIG,
            ));
        }
        Ok(CommitPlan {
            size,
            uploads,
            punched,
        })
    }

    /// Rows a truncation floor kills: committed rows starting at or past
    /// it are punched; the row containing it is rewritten cut at the floor
    /// when the size grew past the floor again (else the commit's own
    /// shrink clamps it).
    fn floor_rows(
        &self,
        ino: u64,
        floor: u64,
        (committed_size, size): (u64, u64),
        staged: &BTreeSet<u64>,
        punched: &mut Vec<u64>,
        uploads: &mut Vec<(u64, Bytes)>,
    ) -> Result<()> {
        let bs = self.block_size;
        let mut rows = Rows::new(self, ino);
        let last = committed_size.div_ceil(bs);
        let mut index = floor.div_ceil(bs);
        while let Some((found, _)) = rows.next_from(index, last)? {
            if !staged.contains(&found) {
                punched.push(found);
            }
            index = found + 1;
        }
        let cut = floor % bs;
        let straddling = floor / bs;
        if cut == 0 || size <= floor || staged.contains(&straddling) {
            return Ok(());
        }
        let rows = self.meta.blocks(ino, straddling, 1)?;
        let Some(row) = rows.into_iter().find(|r| u64::from(r.len) > cut) else {
            return Ok(());
        };
        let head = self.read_row(&row, 0, cut)?;
        uploads.push((straddling, head));
        Ok(())
    }

    /// Deletes released objects, best effort (an undeleted object is
    /// garbage, never wrong data).
    pub(super) fn delete_objects<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        let parsed: Vec<ObjectKey> = keys
            .filter_map(|k| match ObjectKey::parse(k) {
                Ok(key) => Some(key),
                Err(err) => {
                    tracing::warn!(%err, "released object key unparsable; left in storage");
                    None
                }
            })
            .collect();
        if !parsed.is_empty() {
            self.store.delete(&parsed);
        }
    }

    pub(super) fn do_flush(&self, ino: u64, arg: &FlushIn) -> Result<()> {
        let granted = self.release_locks(ino, LockKind::Posix, arg.lock_owner);
        granted.into_iter().for_each(|w| w.ok());
        if self.handles.is_open_orphan(ino) {
            return Ok(());
        }
        match self.flush_inode(ino) {
            // A reader's close does not fail for others' writes the store
            // cannot take now (a full disk): they stay staged, and their
            // writers hear of it at their own close or fsync.
            Err(err) if self.handle_is_read_only(arg.fh.get()) => {
                tracing::warn!(nodeid = ino, %err, "staged data not committed at a reader's close; it stays staged");
                Ok(())
            }
            result => result,
        }
    }

    /// Whether `fh` is a handle this table issued, opened O_RDONLY (a
    /// handle of an earlier generation is unknown: it may write).
    fn handle_is_read_only(&self, fh: u64) -> bool {
        self.handles
            .get(fh)
            .is_some_and(|h| h.flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32)
    }

    /// FSYNC: commits the staged data, then makes every committed metadata
    /// transaction durable against power loss. An unlinked file's data is
    /// left staged (it is discarded at its last close), but not that of an
    /// O_TMPFILE a link may still publish (written, fsynced, then linked).
    pub(super) fn do_fsync(&self, ino: u64) -> Result<()> {
        if !self.handles.is_open_orphan(ino) || self.meta.is_linkable_tmpfile(ino)? {
            let _guard = self.inode_lock(ino);
            self.flush_locked(ino, &[])?;
            self.sync_objects_locked(ino)?;
        }
        Ok(self.meta.sync()?)
    }

    /// Makes the objects of `ino` that may not be on the disk durable
    /// (`durable.rs`), before the metadata naming them is synced. The
    /// caller holds the inode's mutex: no commit of `ino` runs meanwhile.
    fn sync_objects_locked(&self, ino: u64) -> Result<()> {
        if !self.store.syncs_objects() {
            return Ok(());
        }
        let keys = match lock(&self.unsynced).take(ino) {
            ToSync::Keys(keys) => keys,
            ToSync::Whole => self.object_keys_of(ino)?,
        };
        // Past a few thousand files (a large file's first fsync after a
        // takeover), one syncfs of the store's disk costs less than an
        // open and fdatasync each.
        let result = if keys.len() > SYNC_OBJECTS_ONE_BY_ONE_MAX {
            self.store.make_all_durable()
        } else {
            self.store.make_durable(&keys)
        };
        lock(&self.unsynced).synced(ino, result.is_ok());
        Ok(result?)
    }

    /// Every object of `ino`'s block map.
    fn object_keys_of(&self, ino: u64) -> Result<Vec<ObjectKey>> {
        const INDICES_PER_QUERY: u64 = 1 << 16;
        let size = self.meta.getattr(ino)?.size;
        let block_count = size.div_ceil(self.block_size);
        let mut keys = Vec::new();
        let mut first = 0;
        while first < block_count {
            let count = (block_count - first).min(INDICES_PER_QUERY) as u32;
            // An inline block is in the metadata, which the caller syncs.
            for row in self.meta.blocks(ino, first, count)? {
                if !row.is_inline() {
                    keys.push(ObjectKey::parse(&row.object_key)?);
                }
            }
            first += INDICES_PER_QUERY;
        }
        Ok(keys)
    }

    /// FSYNCDIR: every namespace change is committed before its reply; this
    /// makes them durable against power loss.
    pub(super) fn do_fsyncdir(&self) -> Result<()> {
        Ok(self.meta.sync()?)
    }

    /// SYNCFS: commits every inode's staged data, then syncs the metadata.
    pub(super) fn do_syncfs(&self) -> Result<()> {
        self.flush_all()?;
        self.store.make_all_durable()?;
        Ok(self.meta.sync()?)
    }

    pub(super) fn do_release(&self, ino: u64, arg: &ReleaseIn) -> Result<()> {
        if arg.release_flags.contains(ReleaseFlags::FLOCK_UNLOCK) {
            let granted = self.release_locks(ino, LockKind::Flock, arg.lock_owner);
            granted.into_iter().for_each(|w| w.ok());
        }
        let released = self.handles.release(arg.fh.get());
        if released.reclaim {
            return self.settle_orphan(ino);
        }
        if self.handles.is_open_orphan(ino) {
            return Ok(());
        }
        self.flush_inode(ino)
    }
}
