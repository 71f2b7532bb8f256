//! File contents: open, create, tmpfile, read, write, fallocate and lseek.
//!
//! Reads assemble each block from the committed block map (`BlockCache`,
//! whole blocks, zeros for holes and past a row's length), then lay the
//! staged bytes over them (`Staging::read_overlay`, which also zeroes
//! committed bytes hidden by a truncation floor). The overlay is read first
//! and the block map second: a flush that commits in between makes the
//! committed data equal to the staged data already in hand. A block object
//! deleted by a concurrent flush between the two reads is retried.
//!
//! Writes go to staging before the reply (see [`super::flush`] for the
//! durability protocol). A sparse file costs nothing: holes have no rows
//! and no staged blocks, and every walk over the block map pages through
//! rows only.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use baton_blocks::{BlocksError, ObjectKey, FILE_SIZE_BYTES_MAX};
use baton_meta::limits::{BLOCKS_QUERY_COUNT_MAX, COMMIT_BLOCKS_ROWS_MAX};
use baton_meta::{BlockRef, CreateArgs, FileKind, MetaError, Recorded};
use bytes::Bytes;
use fuse_wire::{
    CreateIn, EntryOut, Errno, FallocateFlags, FallocateIn, LseekIn, OpenInFlags, ReadIn, Request,
    WriteFlags, WriteIn,
};

use super::{lock, BatonFs, READAHEAD_BLOCKS, READAHEAD_ENTRIES_MAX, SCAN_START_BYTES_MIN};
use crate::error::{Error, Result};
use crate::handles::Handle;

/// Attempts of a read that raced with a flush deleting a replaced object.
pub const READ_ATTEMPTS_MAX: u32 = 3;
use super::namespace::Caller;
use super::seek::{SEEK_DATA, SEEK_HOLE};
/// Partial blocks a punch rewrites with zeros: the one at each edge.
pub const PUNCH_EDGE_BLOCK_COUNT_MAX: usize = 2;
/// Block rows one commit of a punch removes: with the edges, a commit
/// stays within `COMMIT_BLOCKS_ROWS_MAX`.
pub const PUNCH_CHUNK_ROWS_MAX: usize = COMMIT_BLOCKS_ROWS_MAX - PUNCH_EDGE_BLOCK_COUNT_MAX;

/// A cursor over the block-map rows of one file, fetched a page at a time.
pub(super) struct Rows<'a> {
    fs: &'a BatonFs,
    ino: u64,
    page_start: u64,
    page_end: u64,
    page: BTreeMap<u64, u32>,
}

impl<'a> Rows<'a> {
    pub(super) fn new(fs: &'a BatonFs, ino: u64) -> Rows<'a> {
        Rows {
            fs,
            ino,
            page_start: 0,
            page_end: 0,
            page: BTreeMap::new(),
        }
    }

    fn load(&mut self, index: u64) -> Result<()> {
        let rows = self
            .fs
            .meta
            .blocks(self.ino, index, BLOCKS_QUERY_COUNT_MAX)?;
        self.page = rows.into_iter().map(|r| (r.index, r.len)).collect();
        self.page_start = index;
        self.page_end = index.saturating_add(u64::from(BLOCKS_QUERY_COUNT_MAX));
        Ok(())
    }

    /// The length of row `index`, if it exists.
    pub(super) fn get(&mut self, index: u64) -> Result<Option<u32>> {
        if index < self.page_start || index >= self.page_end {
            self.load(index)?;
        }
        Ok(self.page.get(&index).copied())
    }

    /// The first row with `from <= index < until`.
    pub(super) fn next_from(&mut self, from: u64, until: u64) -> Result<Option<(u64, u32)>> {
        let mut index = from;
        while index < until {
            if index < self.page_start || index >= self.page_end {
                self.load(index)?;
            }
            if let Some((i, len)) = self.page.range(index..self.page_end).next() {
                return Ok((*i < until).then_some((*i, *len)));
            }
            index = self.page_end;
        }
        Ok(None)
    }
}

impl BatonFs {
    /// OPEN. The handle is registered BEFORE the inode is read, so that a
    /// session decision about an orphan sees it (`orphans.rs`); an inode
    /// found at nlink 0 (another host unlinked it) is held by this session.
    /// `fuse_open_flags`: `fuse_open_in.open_flags` (the kill flag).
    pub(super) fn do_open(
        &self,
        ino: u64,
        open_flags: u32,
        fuse_open_flags: OpenInFlags,
        caller: Caller,
    ) -> Result<u64> {
        let fh = self.register(ino, open_flags, false)?;
        let kill_suidgid = fuse_open_flags
            .contains(OpenInFlags::KILL_SUIDGID)
            .then_some(caller);
        match self.check_open(ino, open_flags, kill_suidgid) {
            Ok(()) => Ok(fh),
            Err(e) => {
                self.unregister(fh);
                Err(e)
            }
        }
    }

    /// `kill_suidgid`: the caller, if the kernel asked for set-ID bits to
    /// be cleared.
    fn check_open(&self, ino: u64, open_flags: u32, kill_suidgid: Option<Caller>) -> Result<()> {
        let attr = self.meta.getattr(ino)?;
        let flags = open_flags as i32;
        if attr.kind == FileKind::Directory && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Error::refused(
                ino,
                "directory opened for writing",
                Errno::EISDIR,
            ));
        }
        if attr.nlink == 0 {
            self.hold_open_orphan(ino)?;
        }
        if attr.kind == FileKind::Regular
            && flags & libc::O_TRUNC != 0
            && flags & libc::O_ACCMODE != libc::O_RDONLY
        {
            // The handle just registered is the only one: commit at once.
            self.truncate_open(ino, 0, 1)?;
            if let Some(caller) = kill_suidgid {
                self.kill_suidgid(ino, caller)?;
            }
        }
        Ok(())
    }

    /// Forgets a handle OPEN registered but could not complete.
    pub(super) fn unregister(&self, fh: u64) {
        let released = self.handles.release(fh);
        if let (Some(handle), true) = (released.handle, released.reclaim) {
            if let Err(err) = self.settle_orphan(handle.ino) {
                tracing::warn!(nodeid = handle.ino, %err, "orphan kept after a failed open");
            }
        }
    }

    pub(super) fn register(&self, ino: u64, open_flags: u32, dir: bool) -> Result<u64> {
        let handle = Handle {
            ino,
            flags: open_flags,
            dir,
        };
        self.handles
            .open(handle)
            .ok_or_else(|| Error::refused(ino, "too many open handles", Errno::ENFILE))
    }

    pub(super) fn do_create(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        arg: &CreateIn,
    ) -> Result<(EntryOut, u64)> {
        let (uid, gid, _) = req.caller();
        let mut args = CreateArgs {
            kind: FileKind::Regular,
            mode: arg.mode & 0o7777,
            umask: 0,
            uid,
            gid,
            rdev: 0,
            symlink_target: None,
            inherit_acl: false,
        };
        self.creation_rules(&mut args, arg.umask);
        let created = self.once(
            req,
            |recorded| match recorded {
                Recorded::Attr(attr) => Ok(Some(attr)),
                _ => Err(super::once::mismatched(
                    parent,
                    "replayed create has another kind of record",
                )),
            },
            |key| match self.meta.create(parent, name, &args, key) {
                Ok(attr) => Ok(Some(attr)),
                // Lost a race with another creator and O_EXCL was not asked:
                // open the file that won (below).
                Err(MetaError::Exists { .. }) if arg.flags as i32 & libc::O_EXCL == 0 => Ok(None),
                Err(e) => Err(e.into()),
            },
        )?;
        let Some(attr) = created else {
            let attr = self.meta.lookup(parent, name)?;
            let fh = self.do_open(attr.ino, arg.flags, arg.open_flags, Caller::of(req))?;
            let attr = self.meta.getattr(attr.ino)?;
            return Ok((self.entry_out(&attr)?, fh));
        };
        // A replayed create opens a new handle: the kernel never saw the
        // dead generation's.
        let fh = self.register(attr.ino, arg.flags, false)?;
        Ok((self.entry_out(&attr)?, fh))
    }

    /// TMPFILE (open(2) with O_TMPFILE): a regular file without a name,
    /// opened; an orphan from birth held by this session and kept by its
    /// handle, reclaimed at its last release unless a LINK named it.
    /// Mode, owner and set-group-ID directory as CREATE. Without O_EXCL it
    /// may be linked (the kernel also refuses that link itself: ENOENT).
    pub(super) fn do_tmpfile(
        &self,
        req: &Request<'_>,
        parent: u64,
        arg: &CreateIn,
    ) -> Result<(EntryOut, u64)> {
        let (uid, gid, _) = req.caller();
        let mut args = CreateArgs {
            kind: FileKind::Regular,
            mode: arg.mode & 0o7777,
            umask: 0,
            uid,
            gid,
            rdev: 0,
            symlink_target: None,
            inherit_acl: false,
        };
        self.creation_rules(&mut args, arg.umask);
        let linkable = arg.flags as i32 & libc::O_EXCL == 0;
        crate::fault::delay(fuse_wire::abi::opcode::TMPFILE);
        // Until the handle is registered, the session tick does not look
        // at this session's holds (`orphans.rs`).
        let _births = super::read_lock(&self.tmpfile_births);
        let attr = self.once(
            req,
            |recorded| match recorded {
                Recorded::Attr(attr) => Ok(attr),
                _ => Err(super::once::mismatched(
                    parent,
                    "replayed tmpfile has another kind of record",
                )),
            },
            |key| {
                let session = self.connection_identity();
                Ok(self.meta.tmpfile(parent, &args, session, linkable, key)?)
            },
        )?;
        // A replayed TMPFILE opens a new handle too: the kernel never saw
        // the dead generation's. Its orphan is then kept to the mount's
        // end (an inherited table never lets go).
        let fh = self.register(attr.ino, arg.flags, false)?;
        self.handles.mark_orphan(attr.ino);
        tracing::debug!(nodeid = attr.ino, parent, linkable, "tmpfile created");
        Ok((self.entry_out(&attr)?, fh))
    }

    pub(super) fn do_read(&self, ino: u64, arg: &ReadIn) -> Result<Vec<u8>> {
        let buf = self.read_retrying(ino, arg.offset, u64::from(arg.size))?;
        self.note_read(ino, arg.offset, buf.len() as u64);
        Ok(buf)
    }

    /// [`BatonFs::read_range`], again while an object was replaced (and
    /// deleted) between the rows' lookup and the object's read.
    pub(super) fn read_retrying(&self, ino: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut attempt = 1;
        loop {
            match self.read_range(ino, offset, len) {
                Err(Error::Blocks(e)) if matches!(*e, BlocksError::ObjectMissing { .. }) => {
                    if attempt >= READ_ATTEMPTS_MAX {
                        return Err(Error::Blocks(e));
                    }
                    tracing::debug!(nodeid = ino, err = %e, attempt, "object replaced during a read; retrying");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Bytes `offset..offset+len` clipped at EOF: committed blocks, then
    /// staged bytes over them.
    fn read_range(&self, ino: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let overlay = self.staging.read_overlay(ino, offset, len)?;
        // The size and the rows of the range, from one snapshot: rows past
        // the committed size are clipped below.
        let bs = self.block_size;
        let first = offset / bs;
        let last = offset.saturating_add(len.max(1)) - 1;
        let count = (last / bs - first + 1).min(u64::from(u32::MAX)) as u32;
        let (attr, rows) = self.meta.read_plan(ino, first, count)?;
        if attr.kind != FileKind::Regular {
            return Err(Error::refused(
                ino,
                "read of a non-regular file",
                Errno::EISDIR,
            ));
        }
        let size = overlay.size.map_or(attr.size, |s| s.resolve(attr.size));
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len));
        let mut buf = vec![0u8; (end - offset) as usize];
        let committed_end = end.min(attr.size);
        if offset < committed_end {
            self.read_committed(&rows, offset, committed_end, &mut buf)?;
        }
        overlay.apply(offset, &mut buf);
        Ok(buf)
    }

    /// Fills `buf` (bytes `offset..end`) from the committed `rows` that
    /// cover it.
    fn read_committed(
        &self,
        rows: &[BlockRef],
        offset: u64,
        end: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let bs = self.block_size;
        for row in rows {
            let block_start = row.index * bs;
            let lo = offset.max(block_start);
            let hi = end.min(block_start + u64::from(row.len));
            if lo >= hi {
                continue;
            }
            let at = (lo - offset) as usize;
            self.read_row_into(row, lo - block_start, &mut buf[at..at + (hi - lo) as usize])?;
        }
        Ok(())
    }

    /// Readahead: a large read from the start of the file, or a read that
    /// starts where the last one ended, prefetches the next blocks once per
    /// block; a file read again from its start is prefetched again.
    fn note_read(&self, ino: u64, offset: u64, len: u64) {
        let bs = self.block_size;
        let next_index = (offset + len).div_ceil(bs);
        let wanted = {
            let mut map = lock(&self.readahead);
            if map.len() >= READAHEAD_ENTRIES_MAX && !map.contains_key(&ino) {
                map.clear();
            }
            let pattern = map.entry(ino).or_default();
            let sequential = if offset == 0 {
                // Read again from the start: what an earlier scan prefetched
                // may have left memory since. (Not on every other jump: the
                // kernel's concurrent READs arrive out of order, and each
                // would prefetch the same blocks again.)
                pattern.prefetched_to_index = 0;
                len >= SCAN_START_BYTES_MIN
            } else {
                pattern.next_offset == offset
            };
            pattern.next_offset = offset + len;
            if !sequential || len == 0 || pattern.prefetched_to_index > next_index {
                None
            } else {
                pattern.prefetched_to_index = next_index + u64::from(READAHEAD_BLOCKS);
                Some(next_index)
            }
        };
        let Some(first) = wanted else {
            return;
        };
        let rows = match self.meta.blocks(ino, first, READAHEAD_BLOCKS) {
            Ok(rows) => rows,
            Err(err) => {
                tracing::debug!(nodeid = ino, %err, "readahead lookup failed");
                return;
            }
        };
        let blocks: Vec<(ObjectKey, u64)> = rows
            .iter()
            .filter_map(|r| Some((ObjectKey::parse(&r.object_key).ok()?, u64::from(r.len))))
            .collect();
        let queued = self.cache.prefetch(&blocks);
        tracing::trace!(nodeid = ino, first, queued, "readahead");
    }

    /// Committed content of block `index`, for the first staged write to it.
    fn base_block(&self, ino: u64, index: u64) -> baton_blocks::Result<Option<Bytes>> {
        let base_err = |source: Box<dyn std::error::Error + Send + Sync>| BlocksError::BaseRead {
            ino,
            index,
            source,
        };
        let rows = self
            .meta
            .blocks(ino, index, 1)
            .map_err(|e| base_err(Box::new(e)))?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let len = u64::from(row.len);
        Ok(Some(self.read_row(&row, 0, len)?))
    }

    /// WRITE by `caller`.
    pub(super) fn do_write(
        &self,
        ino: u64,
        arg: &WriteIn,
        data: &[u8],
        caller: Caller,
    ) -> Result<u32> {
        let end = arg.offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > FILE_SIZE_BYTES_MAX) {
            return Err(Error::refused(
                ino,
                "write past the largest file size",
                Errno::EFBIG,
            ));
        }
        if let Some(end) = end {
            self.check_quota_growth(ino, end)?;
        }
        self.stage_bytes(ino, arg.offset, data)?;
        if arg.write_flags.contains(WriteFlags::KILL_SUIDGID) {
            self.kill_suidgid(ino, caller)?;
        }
        tracing::trace!(
            nodeid = ino,
            fh = arg.fh.get(),
            offset = arg.offset,
            len = data.len(),
            "staged"
        );
        Ok(data.len() as u32)
    }

    /// Stages `data` at `offset` of `ino` as a WRITE does (the caller
    /// checked the size limit and the quota). Staging full: what is staged
    /// is committed (this file, then every file) to make room, once.
    pub(super) fn stage_bytes(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        let mut flushed = false;
        loop {
            let written = {
                // Handing over: the next generation writes it (journal).
                let _guard = self.staging_lock(ino, "write")?;
                if self.wrote_through(ino, offset, data) {
                    Ok(())
                } else {
                    self.staging
                        .write(ino, offset, data, &|index| self.base_block(ino, index))
                }
            };
            match written {
                Ok(()) => break,
                // Staging is full: upload and commit what is staged (this
                // file first, then every file) to make room, once; the
                // write is redone whole (rewriting its first blocks is
                // harmless). Still full: ENOSPC.
                Err(BlocksError::StagingFull { .. }) if !flushed => {
                    flushed = true;
                    tracing::info!(
                        nodeid = ino,
                        "staging full: committing staged data to make room"
                    );
                    self.flush_inode(ino)?;
                    self.flush_all()?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// FALLOCATE. Per mode:
    /// - 0 and KEEP_SIZE: `reserve`: the holes of the range are reserved
    ///   in the metadata (counted by statfs and the quotas, so a later
    ///   write into them is not refused for lack of space; they stay holes
    ///   until written: docs/design-notes.md#fallocate); mode 0 also grows
    ///   the size to `offset + length` if that is larger, in the same
    ///   transaction.
    /// - PUNCH_HOLE | KEEP_SIZE: `punch_locked` (reservations in the range
    ///   end too).
    /// - ZERO_RANGE (| KEEP_SIZE): `zero_range`: the range within the size
    ///   is punched, so it reads as zeros, then reserved as for 0 and
    ///   KEEP_SIZE (the size grows without KEEP_SIZE).
    /// - COLLAPSE_RANGE, INSERT_RANGE: EOPNOTSUPP, deliberately. The block
    ///   map is keyed by block index, so shifting the data after the range
    ///   rewrites every later row (and, for an offset that is not a
    ///   multiple of the block size, every later block): a rewrite of the
    ///   file, not a cheap map edit. Linux's FUSE does not forward them
    ///   anyway (it answers EOPNOTSUPP itself); this arm is for a kernel
    ///   that would. Anything else (UNSHARE_RANGE, WRITE_ZEROES, unknown
    ///   bits, PUNCH_HOLE without KEEP_SIZE) is EOPNOTSUPP too.
    pub(super) fn do_fallocate(
        &self,
        req: &Request<'_>,
        ino: u64,
        arg: &FallocateIn,
    ) -> Result<()> {
        let end = arg
            .offset
            .checked_add(arg.length)
            .filter(|e| *e <= FILE_SIZE_BYTES_MAX)
            .ok_or_else(|| {
                Error::refused(ino, "fallocate past the largest file size", Errno::EFBIG)
            })?;
        let keep_size = arg.mode.contains(FallocateFlags::KEEP_SIZE);
        match arg.mode.difference(FallocateFlags::KEEP_SIZE) {
            mode if mode.is_empty() => self.reserve(req, ino, arg.offset, end, !keep_size),
            // fallocate(2) takes PUNCH_HOLE only together with KEEP_SIZE.
            FallocateFlags::PUNCH_HOLE if keep_size => {
                let _guard = self.staging_lock(ino, "punch hole")?;
                self.punch_locked(ino, arg.offset, end)
            }
            FallocateFlags::ZERO_RANGE => self.zero_range(req, ino, arg.offset, end, keep_size),
            _ => Err(Error::refused(
                ino,
                "unsupported fallocate mode",
                Errno::EOPNOTSUPP,
            )),
        }
    }

    /// fallocate mode 0 (`grow`) or KEEP_SIZE: what is staged is committed
    /// first (the metadata then holds the file's size and blocks), then
    /// one metadata transaction reserves the holes of `offset..end` and
    /// grows the size, exactly once (a resent request is answered from its
    /// record).
    fn reserve(
        &self,
        req: &Request<'_>,
        ino: u64,
        offset: u64,
        end: u64,
        grow: bool,
    ) -> Result<()> {
        self.reserve_once(req, ino, offset..end, grow, "fallocate", || {
            self.flush_locked(ino, &[])
        })
    }

    /// ZERO_RANGE: `offset..end` reads as zeros afterwards (punched within
    /// the size), then its holes are reserved as for mode 0 (the punched
    /// blocks among them, so a later write into the range is no more
    /// refused than after mode 0: ext4 keeps them allocated) and, without
    /// `keep_size`, the size grows to `end` if that is larger: the punch
    /// then `reserve`'s one transaction, exactly once. The quota is checked
    /// before the punch, so a refusal zeroes nothing.
    fn zero_range(
        &self,
        req: &Request<'_>,
        ino: u64,
        offset: u64,
        end: u64,
        keep_size: bool,
    ) -> Result<()> {
        self.check_quota_growth(ino, end)?;
        // Idempotent: one killed after the punch is redone whole.
        self.reserve_once(req, ino, offset..end, !keep_size, "zero range", || {
            self.punch_locked(ino, offset, end)
        })
    }

    /// Under the inode lock, `first` (what must precede the reservation),
    /// then the reservation of `range`'s holes, exactly once. The lock is
    /// taken per attempt, not across `once`'s retry after EDQUOT, which
    /// settles orphans under their locks.
    fn reserve_once(
        &self,
        req: &Request<'_>,
        ino: u64,
        range: std::ops::Range<u64>,
        grow: bool,
        what: &'static str,
        first: impl Fn() -> Result<()>,
    ) -> Result<()> {
        self.once(
            req,
            |recorded| match recorded {
                Recorded::Attr(_) => Ok(()),
                _ => Err(super::once::mismatched(ino, "fallocate")),
            },
            |key| {
                let _guard = self.staging_lock(ino, what)?;
                first()?;
                self.meta.fallocate_reserve(ino, range.clone(), grow, key)?;
                Ok(())
            },
        )?;
        self.invalidate(ino);
        Ok(())
    }

    /// Zeroes `offset..end` within the file; the caller holds the inode
    /// lock. Whole blocks lose their rows, the partial blocks at the edges
    /// are rewritten with zeros. Up to [`PUNCH_CHUNK_ROWS_MAX`] rows this is
    /// one commit. A longer punch first commits chunks of that many rows
    /// (front to back), then the last chunk with the edges: a commit takes
    /// at most `COMMIT_BLOCKS_ROWS_MAX` rows. Each commit is a valid state
    /// and punching is idempotent, so a crash between two leaves the range
    /// partly punched (zeros where punched, the old data elsewhere): the
    /// call was not answered, and the kernel resends it to the next
    /// generation, which punches the rest.
    fn punch_locked(&self, ino: u64, offset: u64, end: u64) -> Result<()> {
        self.flush_locked(ino, &[])?;
        // Reservations first, past the size too (KEEP_SIZE ones);
        // idempotent, so a resent punch needs no record of it.
        self.meta.release_reserved(ino, offset..end, None)?;
        let attr = self.meta.getattr(ino)?;
        let end = end.min(attr.size);
        if offset >= end {
            return Ok(());
        }
        let bs = self.block_size;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        let mut punched = Vec::new();
        let mut commits = 1u64;
        let mut rows = Rows::new(self, ino);
        let mut index = first_full;
        while let Some((found, _)) = rows.next_from(index, end_full)? {
            if punched.len() == PUNCH_CHUNK_ROWS_MAX {
                // Nothing of this file is staged (flushed above, edges not
                // yet written): the commit is this chunk alone. The cursor
                // stays right: the rows it has yet to return are past it.
                self.flush_locked(ino, &punched)?;
                punched.clear();
                commits += 1;
            }
            punched.push(found);
            index = found + 1;
        }
        self.zero_edges(ino, offset, end, (first_full, end_full))?;
        self.flush_locked(ino, &punched)?;
        if commits > 1 {
            tracing::debug!(nodeid = ino, offset, end, commits, "hole punched in chunks");
        }
        Ok(())
    }

    /// Stages zeros over the partial blocks at the edges of `offset..end`
    /// (at most [`PUNCH_EDGE_BLOCK_COUNT_MAX`]); `full`: the whole blocks
    /// inside it, as a range of block indices.
    fn zero_edges(&self, ino: u64, offset: u64, end: u64, full: (u64, u64)) -> Result<()> {
        let bs = self.block_size;
        let (first_full, end_full) = full;
        let zero = |lo: u64, hi: u64| -> Result<()> {
            if lo < hi {
                let zeros = vec![0u8; (hi - lo) as usize];
                self.staging
                    .write(ino, lo, &zeros, &|index| self.base_block(ino, index))?;
            }
            Ok(())
        };
        if first_full > end_full {
            zero(offset, end)
        } else {
            zero(offset, (first_full * bs).min(end))?;
            zero((end_full * bs).max(offset), end)
        }
    }

    /// EDQUOT if making the file `end` bytes long would take a quota that
    /// counts it past its byte limit: the growth over the committed size
    /// (what this file has staged included) against what the quotas still
    /// allow. Checked here, at WRITE and fallocate, because the commit
    /// that makes staged bytes durable must never refuse them; growth
    /// staged for other files and by other mounts is not seen, which is
    /// the bound by which a quota can be passed (docs/quotas.md).
    /// Unlinked files still count until reclaimed (a few ms after their
    /// last close): a refusal settles them and looks once more.
    pub(super) fn check_quota_growth(&self, ino: u64, end: u64) -> Result<()> {
        match self.quota_growth_fits(ino, end)? {
            false if self.settle_orphans_now() => {}
            fits => return self.quota_growth_result(ino, end, fits),
        }
        let fits = self.quota_growth_fits(ino, end)?;
        self.quota_growth_result(ino, end, fits)
    }

    fn quota_growth_fits(&self, ino: u64, end: u64) -> Result<bool> {
        let volume_limited = self.quota_free.volume_may_limit(|| {
            Ok::<bool, Error>(self.meta.quotas()?.iter().any(|q| q.bytes_max.is_some()))
        })?;
        if !volume_limited || self.quota_free.is_free(ino) {
            return Ok(true);
        }
        let Some(headroom) = self.meta.quota_bytes_headroom(ino)? else {
            self.quota_free.remember(ino);
            return Ok(true);
        };
        // The size readers see: staged over committed. Staging is read
        // first: a flush commits before it clears, so a record gone by
        // then is in the metadata read after it.
        let staged = self.staging.staged_size(ino)?;
        let attr = self.meta.getattr(ino)?;
        let logical = staged.map_or(attr.size, |s| s.resolve(attr.size));
        if end <= logical {
            return Ok(true);
        }
        let growth = i64::try_from(end.saturating_sub(attr.size)).unwrap_or(i64::MAX);
        Ok(growth <= headroom)
    }

    fn quota_growth_result(&self, ino: u64, end: u64, fits: bool) -> Result<()> {
        if !fits {
            tracing::debug!(nodeid = ino, end, "write refused: quota full");
            return Err(Error::refused(
                ino,
                "the write would take a directory quota past its byte limit",
                Errno::EDQUOT,
            ));
        }
        Ok(())
    }

    pub(super) fn do_lseek(&self, ino: u64, arg: &LseekIn) -> Result<u64> {
        if arg.whence != SEEK_DATA && arg.whence != SEEK_HOLE {
            return Err(Error::refused(
                ino,
                "lseek whence other than SEEK_DATA/SEEK_HOLE",
                Errno::EINVAL,
            ));
        }
        // Staging first, as in `quota_growth_fits`.
        let staged = self.staging.staged_size(ino)?;
        let attr = self.meta.getattr(ino)?;
        let size = staged.map_or(attr.size, |s| s.resolve(attr.size));
        let offset = arg.offset;
        if offset >= size {
            return Err(Error::refused(ino, "lseek at or past EOF", Errno::ENXIO));
        }
        let dirty = self.staging.dirty_blocks(ino)?;
        let map = DataMap {
            bs: self.block_size,
            size,
            committed_size: attr.size,
            dirty: &dirty,
        };
        let mut rows = Rows::new(self, ino);
        if arg.whence == SEEK_DATA {
            map.next_data(&mut rows, offset)?
                .ok_or_else(|| Error::refused(ino, "no data past the offset", Errno::ENXIO))
        } else {
            map.next_hole(&mut rows, offset)
        }
    }
}

/// Where a file has data: committed rows and staged blocks, block-granular.
struct DataMap<'a> {
    bs: u64,
    size: u64,
    committed_size: u64,
    dirty: &'a [u64],
}

impl DataMap<'_> {
    /// End of the data covering byte `pos` of block `index`, if any.
    fn data_end(&self, rows: &mut Rows<'_>, index: u64, pos: u64) -> Result<Option<u64>> {
        let start = index * self.bs;
        let mut end = None;
        if self.dirty.binary_search(&index).is_ok() {
            end = Some((start + self.bs).min(self.size));
        }
        if let Some(len) = rows.get(index)? {
            let e = (start + u64::from(len))
                .min(self.committed_size)
                .min(self.size);
            end = Some(end.map_or(e, |d: u64| d.max(e)));
        }
        Ok(end.filter(|e| *e > pos))
    }

    fn next_data(&self, rows: &mut Rows<'_>, offset: u64) -> Result<Option<u64>> {
        let last = self.size.div_ceil(self.bs);
        let mut index = offset / self.bs;
        while index < last {
            let pos = offset.max(index * self.bs);
            if self.data_end(rows, index, pos)?.is_some() {
                return Ok(Some(pos));
            }
            let next_row = rows.next_from(index + 1, last)?.map(|(i, _)| i);
            let next_dirty = self.dirty.iter().copied().find(|i| *i > index);
            index = match (next_row, next_dirty) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return Ok(None),
            };
        }
        Ok(None)
    }

    fn next_hole(&self, rows: &mut Rows<'_>, offset: u64) -> Result<u64> {
        let mut pos = offset;
        while pos < self.size {
            let index = pos / self.bs;
            match self.data_end(rows, index, pos)? {
                None => return Ok(pos),
                Some(end) if end < (index + 1) * self.bs => return Ok(end.min(self.size)),
                Some(end) => pos = end,
            }
        }
        Ok(self.size)
    }
}
