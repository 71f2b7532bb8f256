//! The [`MetaStore`] trait: the engine-neutral seam between the FUSE server
//! and a metadata engine (SQLite today, PostgreSQL later), plus the parsing
//! of metadata locations (`sqlite:///abs/path` or a plain path).
//!
//! Contract shared by every engine:
//! - each mutating method is ONE transaction: it fully happens or not at all;
//! - once a mutating method returned `Ok`, its transaction survives the
//!   death of the calling process at any instant (kill -9, OOM kill);
//! - it survives a power loss or kernel crash once a later
//!   [`MetaStore::sync`] returned `Ok` (as a local filesystem's changes do
//!   after `fsync`); without `sync` the latest transactions may be lost by a
//!   power loss, never half-applied;
//! - a mutating method given `Some(RequestKey)` also records its encoded
//!   result ([`crate::record::Recorded`]) in that same transaction, and fails
//!   with `DuplicateRequest` (changing nothing) if the key is already recorded;
//! - object keys returned as released are no longer referenced by any
//!   block-map row once the call returns; the caller deletes those objects
//!   AFTER the call returned (never before: the transaction might not commit).

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

use crate::error::{MetaError, Result};
use crate::types::{
    Attr, BlockRef, CommitBlocks, CreateArgs, DirEntry, DirEntryPlus, LockSpace, LockWait,
    ObjectRef, Parked, Quota, QuotaDrift, RangeLock, RenameFlags, Renamed, RequestKey, SessionInfo,
    SessionRecord, SetAttr, ShareBlocks, StatFs, TruncatedBlocks, Unlinked, VolumeRecord,
    XattrFlags,
};

/// The metadata operations of a Baton volume. Implementations are shared by
/// the FUSE worker threads, hence `Send + Sync`.
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    /// The volume record written by `format`.
    fn volume(&self) -> VolumeRecord;

    /// Finds `name` in directory `parent` (`.` and `..` resolve too).
    fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr>;

    /// Attributes of an inode, orphans included.
    fn getattr(&self, ino: u64) -> Result<Attr>;

    /// Readies every connection for the hot read paths (LOOKUP, GETATTR,
    /// READDIR, GETXATTR, READ): prepares their statements (SQLite also
    /// parses the schema on a connection's first statement) and reads the
    /// pages near the root. Changes nothing. A standby does this before it
    /// says it is ready, so that a new generation's first requests, inside
    /// an upgrade's stall, do not pay for it (the slowest tenth of them took
    /// 0.47 ms with it and 0.62-0.74 ms without, `baton-bench
    /// upgrade-stall`).
    fn warm_up(&self) -> Result<()>;

    /// [`MetaStore::lookup`] with the bytes of the inode's committed blocks
    /// below its size (for `st_blocks`), read in the same snapshot.
    fn lookup_plus(&self, parent: u64, name: &OsStr) -> Result<(Attr, u64)>;

    /// [`MetaStore::getattr`] with the committed bytes, as
    /// [`MetaStore::lookup_plus`].
    fn getattr_plus(&self, ino: u64) -> Result<(Attr, u64)>;

    /// Changes attributes; always sets ctime. A `size` change updates the
    /// block map (see [`TruncatedBlocks`]). When uid or gid changes on a
    /// regular file, clears set-user-ID, and set-group-ID if group-execute
    /// is set; an explicit `mode` in the same call is applied afterwards.
    fn setattr(
        &self,
        ino: u64,
        set: &SetAttr,
        req: Option<RequestKey>,
    ) -> Result<(Attr, TruncatedBlocks)>;

    /// Creates a file, directory, symlink, fifo, socket or device node named
    /// `name` in `parent`. The mode is `args.mode & !args.umask & 0o7777`; in
    /// a set-group-ID parent the gid is the parent's and a new directory
    /// inherits set-group-ID. Updates the parent's mtime/ctime (and nlink for
    /// a directory).
    fn create(
        &self,
        parent: u64,
        name: &OsStr,
        args: &CreateArgs,
        req: Option<RequestKey>,
    ) -> Result<Attr>;

    /// Creates a regular file without a name in `parent` (O_TMPFILE): mode,
    /// owner and group as [`MetaStore::create`], nlink 0, an orphan from
    /// birth held by `session` alone, charged to the quotas holding
    /// `parent`. `linkable` (no O_EXCL): [`MetaStore::link`] may give it
    /// a name, once. The parent directory is not changed.
    fn tmpfile(
        &self,
        parent: u64,
        args: &CreateArgs,
        session: u64,
        linkable: bool,
        req: Option<RequestKey>,
    ) -> Result<Attr>;

    /// Adds the name `new_name` in `new_parent` for `ino` (not a
    /// directory). At nlink 0 only a linkable unnamed O_TMPFILE may be
    /// linked (it leaves the orphan list and its quotas follow its name);
    /// any other inode at nlink 0 is `NotFound`.
    fn link(
        &self,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
        req: Option<RequestKey>,
    ) -> Result<Attr>;

    /// Removes a non-directory entry; at nlink 0 the inode becomes an orphan.
    fn unlink(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked>;

    /// Removes an empty directory entry; the directory becomes an orphan.
    fn rmdir(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked>;

    /// Renames with POSIX semantics plus `RENAME_NOREPLACE`/`RENAME_EXCHANGE`.
    fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
        req: Option<RequestKey>,
    ) -> Result<Renamed>;

    /// Deletes an orphan (nlink 0) with its block map, xattrs and symlink
    /// target; returns the objects to delete after commit.
    fn reclaim(&self, ino: u64, req: Option<RequestKey>) -> Result<Vec<ObjectRef>>;

    /// Inodes with nlink 0 awaiting `reclaim`, ascending.
    fn orphans(&self) -> Result<Vec<u64>>;

    /// Whether `ino` is an unnamed O_TMPFILE that [`MetaStore::link`] may
    /// still name (its data may yet be published, unlike an unlinked
    /// file's).
    fn is_linkable_tmpfile(&self, ino: u64) -> Result<bool>;

    /// Target of a symlink.
    fn readlink(&self, ino: u64) -> Result<OsString>;

    /// Up to `limit` entries of a directory after cookie `offset` (0 = start).
    /// `.` has cookie 1 and `..` cookie 2; other cookies are per-entry and
    /// stay valid while entries are added or removed.
    fn readdir(&self, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntry>>;

    /// [`MetaStore::readdir`] with each entry's attributes and committed
    /// bytes (but `.` and `..`'s), read in the same snapshot.
    fn readdir_plus(&self, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntryPlus>>;

    /// Sets an extended attribute; sets ctime.
    fn setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: XattrFlags,
        req: Option<RequestKey>,
    ) -> Result<()>;

    /// Value of an extended attribute.
    fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>>;

    /// Names of all extended attributes, sorted.
    fn listxattr(&self, ino: u64) -> Result<Vec<OsString>>;

    /// Removes an extended attribute; sets ctime.
    fn removexattr(&self, ino: u64, name: &OsStr, req: Option<RequestKey>) -> Result<()>;

    /// Volume usage.
    fn statfs(&self) -> Result<StatFs>;

    // Directory quotas (`ops/quota.rs`): usage changes in the transaction
    // of the change it counts; a change that adds usage past a limit fails
    // with `QuotaExceeded` (EDQUOT) and changes nothing, but for
    // `commit_blocks`, which counts and never refuses (WRITE checks
    // [`MetaStore::quota_bytes_headroom`] before it accepts bytes).

    /// Sets the limits of the quota on directory `dir` (`None`: no such
    /// limit); a new quota first counts the tree under `dir`. Takes effect
    /// for every mount at its next change: each reads the limits in the
    /// change's transaction.
    fn set_quota(&self, dir: u64, bytes_max: Option<u64>, inodes_max: Option<u64>)
        -> Result<Quota>;

    /// Removes the quota on `dir`; `false` if it had none.
    fn remove_quota(&self, dir: u64) -> Result<bool>;

    /// The quota on `dir`, if any.
    fn quota(&self, dir: u64) -> Result<Option<Quota>>;

    /// Every quota, by directory inode.
    fn quotas(&self) -> Result<Vec<Quota>>;

    /// The quota `statfs` on `ino` reports: the deepest holding it (a
    /// directory's own first); `None` if none.
    fn nearest_quota(&self, ino: u64) -> Result<Option<Quota>>;

    /// Bytes the quotas counting `ino` still allow (the least; negative
    /// past a limit), `None` if no byte limit counts it.
    fn quota_bytes_headroom(&self, ino: u64) -> Result<Option<i64>>;

    /// Recounts every quota's tree; returns those whose stored usage
    /// differed. With `repair`, stores the recount.
    fn recount_quotas(&self, repair: bool) -> Result<Vec<QuotaDrift>>;

    /// The path of directory `dir` from the volume's root.
    fn dir_path(&self, dir: u64) -> Result<PathBuf>;

    /// Block-map rows of a regular file with `first_index <= index <
    /// first_index + count`, ascending; a missing index is a hole.
    fn blocks(&self, ino: u64, first_index: u64, count: u32) -> Result<Vec<BlockRef>>;

    /// What a READ needs: the inode's attributes and its [`MetaStore::blocks`]
    /// rows, from one snapshot (one read transaction, not two). Any kind
    /// of inode: one that is not a regular file has no rows.
    fn read_plan(&self, ino: u64, first_index: u64, count: u32) -> Result<(Attr, Vec<BlockRef>)>;

    /// Block-map rows of the whole volume strictly after `(ino, index)`
    /// (from the start for `None`), ordered by `(ino, index)`, at most
    /// `limit` (capped at `BLOCKS_QUERY_COUNT_MAX`): every object the
    /// metadata refers to, page by page (storage checks and gc).
    fn scan_blocks(&self, after: Option<(u64, u64)>, limit: u32) -> Result<Vec<(u64, BlockRef)>>;

    /// The POSIX ACL xattrs of the whole volume (`system.posix_acl_access`
    /// and `_default`, raw bytes) strictly after `(ino, name)` (from the
    /// start for `None`), ordered by `(ino, name)`, at most `limit` (capped
    /// at `BLOCKS_QUERY_COUNT_MAX`): `fsctl fsck` parses each.
    fn scan_acls(
        &self,
        after: Option<(u64, OsString)>,
        limit: u32,
    ) -> Result<Vec<(u64, OsString, Vec<u8>)>>;

    /// fallocate mode 0 (`grow`) and KEEP_SIZE: reserves the holes of
    /// `range` (whole blocks from the first one the range touches) so that
    /// a later write into them cannot be refused for lack of space, and
    /// with `grow` sets the size to `range.end` if larger; one
    /// transaction. Reserved bytes count in [`MetaStore::statfs`] and in
    /// the quotas (a file counts `max(size, end of its last reservation)`;
    /// EDQUOT past a limit, nothing applied). A reservation ends when its
    /// block is committed, punched ([`MetaStore::release_reserved`]),
    /// truncated away, or the inode is deleted. Idempotent.
    fn fallocate_reserve(
        &self,
        ino: u64,
        range: std::ops::Range<u64>,
        grow: bool,
        req: Option<RequestKey>,
    ) -> Result<Attr>;

    /// A hole punched over `range`: the reservations of the whole blocks
    /// inside it end.
    fn release_reserved(
        &self,
        ino: u64,
        range: std::ops::Range<u64>,
        req: Option<RequestKey>,
    ) -> Result<()>;

    /// THE DURABILITY POINT OF A WRITE. Once this returns `Ok`, the written
    /// blocks are part of the file and survive the death of the process;
    /// after a later [`MetaStore::sync`] they survive a power loss too (as
    /// far as the metadata goes); before, they do not exist for readers. The caller must upload
    /// the objects named in `commit.blocks` BEFORE calling, and delete the
    /// returned released objects only AFTER it returns.
    ///
    /// In one transaction: replaces the rows in `commit.blocks`, removes the
    /// `punched` rows, sets the size exactly when `new_size` is `Some` (a
    /// shrink drops rows past it), sets mtime and ctime if given.
    /// Fails with `InvalidArgument` if a row would extend past the size.
    fn commit_blocks(
        &self,
        ino: u64,
        commit: &CommitBlocks,
        req: Option<RequestKey>,
    ) -> Result<(Attr, Vec<ObjectRef>)>;

    /// Block sharing (copy_file_range inside a volume), in one transaction:
    /// the rows of `share.source` in its range are copied to `ino`'s range,
    /// naming the same objects (a hole punches the row it lands on); the
    /// size grows to `share.size_min` if smaller (the growth is counted in
    /// the quotas, never refused: the caller checked it), mtime and ctime
    /// are set. `InvalidArgument` for a range past the source's size, over
    /// the source range itself, or of more than `COMMIT_BLOCKS_ROWS_MAX`
    /// blocks. Returns the attributes and the objects no row names any
    /// more: delete them only AFTER it returns (a shared object is never
    /// among them while a row names it). Recorded as `Recorded::Copied`.
    fn share_blocks(
        &self,
        ino: u64,
        share: &ShareBlocks,
        req: Option<RequestKey>,
    ) -> Result<(Attr, Vec<ObjectRef>)>;

    /// Makes every transaction that committed before this call durable
    /// against power loss and kernel crashes (FUSE FSYNC, FSYNCDIR, SYNCFS).
    fn sync(&self) -> Result<()>;

    /// The encoded result of a request recorded as completed, if any.
    fn completed_request(&self, key: RequestKey) -> Result<Option<Vec<u8>>>;

    /// Forgets completed requests recorded before `older_than`; returns how
    /// many were removed.
    fn prune_completed(&self, older_than: SystemTime) -> Result<u64>;

    /// The reply to request `key` reached the kernel, which will never
    /// resend it: its record may go. Cheap: the key is queued in memory and
    /// deleted inside a later write transaction (no extra commit). A record
    /// whose deletion is lost with the process is removed by
    /// [`MetaStore::prune_completed`].
    fn request_answered(&self, key: RequestKey);

    /// Whether mounts on other hosts can serve the volume at the same time
    /// (PostgreSQL). A SQLite volume is served by one mount at a time (it
    /// holds the volume's exclusive lock), so its locks need not be
    /// published for others ([`MetaStore::publish_locks`]).
    fn shared_by_hosts(&self) -> bool;

    /// Why the store refuses every change, if it found its metadata corrupt
    /// while serving (then writes fail with [`crate::MetaError::Quarantined`],
    /// EROFS, and reads go on); None while healthy.
    fn quarantined(&self) -> Option<String>;

    /// Read and write transactions run so far, with errors and latency
    /// (for the generation's metrics).
    fn transaction_stats(&self) -> crate::tx_stats::TxStats;

    /// Fences the store for a handover: waits for the write transaction in
    /// progress (if any), then makes every later mutation fail with
    /// [`crate::MetaError::Fenced`] so that nothing this process still runs
    /// can commit after the next generation took over.
    fn fence(&self);

    /// Lifts [`MetaStore::fence`] (the handover was rolled back and this
    /// process serves again).
    fn unfence(&self);

    /// Commits what a writer process that died had replied but not
    /// committed (SQLite's operation log, `sqlite/oplog.rs`); returns how
    /// many requests' changes that was. A generation calls it when it
    /// adopts a mount, before it serves: a predecessor may have died after
    /// this store was opened. Opening the store does it too.
    fn replay_log(&self) -> Result<u64>;

    /// This process now serves the volume and is its only writer (a
    /// generation that adopted or mounted it, after [`MetaStore::replay_log`]):
    /// attributes, directory entries and absent xattrs are served from
    /// memory from here on, kept exact by the process's own writes
    /// (`row_cache.rs`). Only SQLite volumes have one writer; on an engine
    /// shared by hosts this does nothing. Call it again after a rolled-back
    /// handover: it starts from nothing.
    fn serve_as_only_writer(&self);

    // Sessions: one per mount (FUSE connection), with a heartbeat. The
    // transaction that brings an inode to nlink 0 makes every registered
    // session hold it; a session drops the holds on inodes it has no handle
    // on ([`MetaStore::release_orphan`]), and the drop of the last hold
    // reclaims the orphan. A session whose heartbeat is too old is deleted
    // by any other ([`MetaStore::expire_sessions`]) with its holds.

    /// Registers the session, or takes over the row with the same id (a
    /// generation continuing its dead predecessor's connection keeps its
    /// holds). Sets the heartbeat to now.
    fn open_session(&self, info: &SessionInfo) -> Result<()>;

    /// Renews the session's heartbeat. `Ok(false)`: the session is gone
    /// (another expired it; its holds were dropped).
    fn heartbeat(&self, session: u64) -> Result<bool>;

    /// Ends the session (its mount is gone): deletes it and its holds, and
    /// returns the inodes it held, for [`MetaStore::release_orphan`] with
    /// no session.
    fn close_session(&self, session: u64) -> Result<Vec<u64>>;

    /// Deletes every session whose heartbeat is older than `max_age` (by
    /// the store's clock), with its holds, locks and lock waits; returns
    /// their ids. Orphans they
    /// held alone are then in [`MetaStore::unheld_orphans`].
    fn expire_sessions(&self, max_age: std::time::Duration) -> Result<Vec<u64>>;

    /// Every registered session, by id.
    fn sessions(&self) -> Result<Vec<SessionRecord>>;

    /// The orphans `session` holds, ascending.
    fn held_orphans(&self, session: u64) -> Result<Vec<u64>>;

    /// Orphans no session holds (their holders ended or expired, or none
    /// was registered when they lost their last name), ascending, at most
    /// `limit`.
    fn unheld_orphans(&self, limit: u32) -> Result<Vec<u64>>;

    /// `session` has `ino` open and found it at nlink 0: records its hold
    /// (no-op if held). `NotFound` if the inode was reclaimed meanwhile.
    fn hold_orphan(&self, session: u64, ino: u64) -> Result<()>;

    /// Drops `session`'s hold on `ino` (`None`: drops nothing), then, in
    /// the same transaction, reclaims `ino` if it is an orphan nobody
    /// holds. Returns the objects to delete after the call when it was
    /// reclaimed, `None` when it is still held, linked again or gone.
    fn release_orphan(&self, session: Option<u64>, ino: u64) -> Result<Option<Vec<ObjectRef>>> {
        let mut reclaimed = self.release_orphans(session, &[ino])?;
        Ok(reclaimed.pop().map(|(_, objects)| objects))
    }

    /// [`MetaStore::release_orphan`] of each of `inos`, in one
    /// transaction. Returns the inodes it reclaimed, each with the objects
    /// to delete after the call.
    fn release_orphans(
        &self,
        session: Option<u64>,
        inos: &[u64],
    ) -> Result<Vec<(u64, Vec<ObjectRef>)>>;

    // Locks shared by the volume's mounts: each session publishes the
    // locks its mount holds, per inode and lock space; a mount takes a lock
    // only if no other session's published lock conflicts with it, checked
    // and published in one transaction. A session's locks go with it
    // (close, expiry) and with the inode (reclaim).

    /// Replaces `session`'s locks of `space` on `ino` with `held`, unless
    /// `wanted` conflicts with a lock another session holds there: then
    /// returns that lock and changes nothing. `granted`: the key of the
    /// parked request ([`MetaStore::park_lock`]) this grants, whose wait
    /// is forgotten with it. One transaction.
    fn publish_locks(
        &self,
        session: u64,
        ino: u64,
        space: LockSpace,
        wanted: Option<&RangeLock>,
        held: &[RangeLock],
        granted: Option<u64>,
    ) -> Result<Option<RangeLock>>;

    /// Records that `session` parked the POSIX request `wait`, unless it
    /// would close a cycle of lock owners (across sessions: `(session,
    /// owner)`) each waiting for a lock the next holds: then records
    /// nothing and says [`Parked::WouldDeadlock`]. The search and the
    /// record are one transaction, over every session's held locks and
    /// parked requests, bounded by
    /// [`crate::limits::LOCK_WAIT_SEARCH_OWNERS_MAX`] owners. A row of the
    /// same key is replaced.
    fn park_lock(&self, session: u64, wait: &LockWait) -> Result<Parked>;

    /// Forgets `session`'s parked requests `keys` (interrupted, cancelled).
    fn unpark_locks(&self, session: u64, keys: &[u64]) -> Result<()>;

    /// Every parked request `session` publishes, by key (tests, status).
    fn session_lock_waits(&self, session: u64) -> Result<Vec<LockWait>>;

    /// A lock another session holds on `ino` that conflicts with `wanted`.
    fn conflicting_lock(
        &self,
        session: u64,
        ino: u64,
        space: LockSpace,
        wanted: &RangeLock,
    ) -> Result<Option<RangeLock>>;

    /// Replaces every lock `session` publishes with `held` and every
    /// parked request with `waits` (a generation taking over a connection
    /// states what it holds and what waits), in one transaction.
    fn replace_session_locks(
        &self,
        session: u64,
        held: &[(u64, LockSpace, RangeLock)],
        waits: &[LockWait],
    ) -> Result<()>;

    /// Every lock `session` publishes, by inode (tests, status).
    fn session_locks(&self, session: u64) -> Result<Vec<(u64, LockSpace, RangeLock)>>;
}

/// Where a metadata store lives, parsed from a URL or path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite database file.
    Sqlite(PathBuf),
}

impl Location {
    /// Parses `sqlite:///abs/path`, `sqlite:/abs/path` or a plain path.
    /// Other schemes (e.g. `postgres://`) are [`MetaError::UnsupportedUrl`].
    pub fn parse(url_or_path: &str) -> Result<Location> {
        let unsupported = || MetaError::UnsupportedUrl {
            url: url_or_path.to_owned(),
        };
        if let Some(rest) = url_or_path.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(unsupported());
            }
            return Ok(Location::Sqlite(PathBuf::from(path)));
        }
        if url_or_path.is_empty() || url_or_path.contains("://") {
            return Err(unsupported());
        }
        Ok(Location::Sqlite(PathBuf::from(url_or_path)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_and_plain_paths_parse() {
        let p = |s| Location::parse(s).unwrap();
        assert_eq!(
            p("sqlite:///var/lib/baton/meta.db"),
            Location::Sqlite("/var/lib/baton/meta.db".into())
        );
        assert_eq!(p("sqlite:/x/m.db"), Location::Sqlite("/x/m.db".into()));
        assert_eq!(p("rel/meta.db"), Location::Sqlite("rel/meta.db".into()));
        assert_eq!(p("/abs/meta.db"), Location::Sqlite("/abs/meta.db".into()));
    }

    #[test]
    fn other_schemes_and_relative_urls_are_refused() {
        for bad in ["postgres://h/db", "sqlite://relative/x.db", "", "s3://b/k"] {
            let e = Location::parse(bad).unwrap_err();
            assert!(matches!(e, MetaError::UnsupportedUrl { .. }), "{bad}: {e}");
        }
    }
}
