//! [`Engine`]: what a metadata engine (SQLite, PostgreSQL) really does
//! its own way — transactions, retries, connection pools, fencing,
//! durability — and the ONE implementation of [`MetaStore`] for every
//! engine on top of it: each trait method runs its `crate::ops` operation
//! inside the engine's [`Engine::read`] or [`Engine::write`], under the
//! operation name its errors carry.
//!
//! The impl is generic (`impl<E: Engine> MetaStore for E`), so each engine
//! gets its own monomorphised copy: no boxing, no dynamic dispatch and no
//! allocation added per call. The operations are always passed as closures
//! (`|c| orphan::list(c)`): a bare generic `fn` item cannot take
//! PostgreSQL's transaction of any lifetime.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::time::{Instant, SystemTime};

use crate::answered::AnsweredQueue;
use crate::error::{MetaError, Result};
use crate::ops::{acl, locks, quota, sessions, setattr, xattr};
use crate::ops::{blockmap, inode, namespace, orphan, readdir, rename, requests, reserve, scan};
use crate::record::Recorded;
use crate::row_cache::{Known, RowCache};
use crate::sql::Db;
use crate::store::MetaStore;
use crate::tx_stats::TxKind;
use crate::types::{
    Attr, BlockRef, CommitBlocks, CreateArgs, DirEntry, DirEntryPlus, LockSpace, LockWait,
    ObjectRef, Parked, Quota, QuotaDrift, RangeLock, RenameFlags, Renamed, RequestKey, SessionInfo,
    SessionRecord, SetAttr, ShareBlocks, StatFs, Timespec, TruncatedBlocks, Unlinked, VolumeRecord,
    XattrFlags,
};
use crate::ROOT_INO;

/// One metadata engine: how it runs a read or a write transaction, and
/// the few things it does its own way. Every [`MetaStore`] method is
/// written once below in terms of these.
pub(crate) trait Engine: Send + Sync + std::fmt::Debug {
    /// The connection or open transaction the operations run on.
    type Conn<'c>: Db;

    /// Whether each statement is a round trip to a server. Then one
    /// statement that reads more beats two simple ones: a `lookup` that may
    /// miss reads the entry and its parent in one
    /// (`namespace::lookup_one_plus`). In process (SQLite), the simple
    /// statement is cheaper for the common case, a name that is there.
    const STATEMENT_IS_ROUND_TRIP: bool;

    /// [`MetaStore::shared_by_hosts`].
    const SHARED_BY_HOSTS: bool;

    /// The volume record read when the store was opened.
    fn volume_record(&self) -> &VolumeRecord;

    /// Answered requests whose exactly-once records a later write deletes.
    fn answered_queue(&self) -> &AnsweredQueue;

    /// The counters [`Engine::write`], [`Engine::read`] and
    /// [`Engine::read_one`] keep.
    fn tx_counters(&self) -> &crate::tx_stats::TxCounters;

    /// Runs `f` as one write transaction; with a request key, also records
    /// `encode(result)` and forgets the answered requests that are due, in
    /// that transaction. Refused with `Fenced { op }` once fenced; errors
    /// carry `op`. `f` may run more than once (an engine may retry a
    /// transaction that lost a conflict); only the committed run counts.
    fn write<T>(
        &self,
        op: &'static str,
        req: Option<RequestKey>,
        f: impl Fn(&Self::Conn<'_>) -> Result<T>,
        encode: impl Fn(&T) -> Recorded,
    ) -> Result<T>;

    /// Runs `f` in one read-only snapshot; errors carry `op`.
    fn read<T>(&self, op: &'static str, f: impl FnOnce(&Self::Conn<'_>) -> Result<T>) -> Result<T>;

    /// Runs `f`, which issues ONE statement (its own snapshot); errors
    /// carry `op`. By default a [`Engine::read`].
    fn read_one<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Self::Conn<'_>) -> Result<T>,
    ) -> Result<T> {
        self.read(op, f)
    }

    /// Runs `f` in a read-only snapshot on EVERY connection the engine
    /// keeps, so that each has prepared the statements `f` issues and
    /// cached the pages they read ([`MetaStore::warm_up`]). By default one
    /// [`Engine::read`].
    fn read_on_every_connection(
        &self,
        op: &'static str,
        f: impl Fn(&Self::Conn<'_>) -> Result<()>,
    ) -> Result<()> {
        self.read(op, f)
    }

    /// See [`MetaStore::sync`].
    fn make_durable(&self) -> Result<()>;

    /// Corruption found while serving ([`MetaStore::quarantined`]).
    fn quarantine(&self) -> &crate::quarantine::Quarantine;

    /// See [`MetaStore::fence`].
    fn fence_writes(&self);

    /// See [`MetaStore::unfence`].
    fn unfence_writes(&self);

    /// See [`MetaStore::replay_log`]. Engines that commit each request
    /// have no log.
    fn replay_log(&self) -> Result<u64> {
        Ok(0)
    }

    /// The rows served from memory once this process serves the volume as
    /// its only writer (`row_cache.rs`); engines shared by hosts have none.
    fn row_cache(&self) -> Option<&RowCache> {
        None
    }

    /// What memory knows for a write request before its first change.
    fn known(&self) -> Known<'_> {
        Known::new(self.row_cache())
    }

    /// `found` (what memory answered, if anything), counted as a read
    /// from memory that started at `start` when there is one.
    fn served_from_memory<T>(&self, start: Instant, found: Option<T>) -> Option<T> {
        if found.is_some() {
            self.tx_counters().record(TxKind::Memory, start, true);
        }
        found
    }
}

/// The error a lookup of `name` in `parent` answers when memory knows the
/// directory lacks it (as the lookup's statements would), if it knows.
fn known_missing(cache: &RowCache, parent: u64, name: &OsStr) -> Option<MetaError> {
    let b = inode::check_name(parent, name).ok()?;
    if inode::is_dot(b) || !cache.entry_absent(parent, b) {
        return None;
    }
    Some(MetaError::NotFound {
        ino: parent,
        name: Some(name.to_owned()),
    })
}

impl<E: Engine> MetaStore for E {
    fn volume(&self) -> VolumeRecord {
        self.volume_record().clone()
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        if let Some(cache) = self.row_cache() {
            let start = Instant::now();
            if let Some(attr) =
                self.served_from_memory(start, cache.lookup(parent, name.as_bytes()))
            {
                return Ok(attr);
            }
            if let Some(missing) =
                self.served_from_memory(start, known_missing(cache, parent, name))
            {
                return Err(missing);
            }
        }
        let entry = self.read_one("lookup", |c| namespace::lookup_entry(c, parent, name))?;
        if let Some(attr) = entry {
            return Ok(attr);
        }
        self.read("lookup", |c| namespace::lookup(c, parent, name))
    }

    fn getattr(&self, ino: u64) -> Result<Attr> {
        let Some(cache) = self.row_cache() else {
            return self.read_one("getattr", |c| inode::attr(c, ino));
        };
        if let Some(attr) = self.served_from_memory(Instant::now(), cache.attr(ino)) {
            return Ok(attr);
        }
        let epoch = cache.epoch();
        let attr = self.read_one("getattr", |c| inode::attr(c, ino))?;
        cache.fill_attr(epoch, &attr, None);
        Ok(attr)
    }

    fn warm_up(&self) -> Result<()> {
        let bs = self.volume_record().block_size_bytes;
        // A name no directory holds (it has a slash): the lookups find nothing.
        let absent = OsStr::new(".baton/warm-up");
        self.read_on_every_connection("warm up", |c| {
            inode::attr(c, ROOT_INO)?;
            inode::attr_plus(c, ROOT_INO, bs)?;
            namespace::lookup_entry(c, ROOT_INO, absent)?;
            namespace::lookup_entry_plus(c, ROOT_INO, absent, bs)?;
            readdir::readdir(c, ROOT_INO, 0, 1)?;
            readdir::readdir_plus(c, ROOT_INO, 0, 1, bs)?;
            match xattr::get(c, ROOT_INO, OsStr::new("security.capability")) {
                Ok(_) | Err(MetaError::NoXattr { .. }) => {}
                Err(err) => return Err(err),
            }
            blockmap::rows(c, ROOT_INO, 0, 1)?;
            Ok(())
        })
    }

    fn lookup_plus(&self, parent: u64, name: &OsStr) -> Result<(Attr, u64)> {
        let bs = self.volume_record().block_size_bytes;
        let cache = self.row_cache();
        let start = Instant::now();
        let known = cache.and_then(|c| c.lookup_plus(parent, name.as_bytes()));
        if let Some(found) = self.served_from_memory(start, known) {
            return Ok(found);
        }
        let missing = cache.and_then(|c| known_missing(c, parent, name));
        if let Some(missing) = self.served_from_memory(start, missing) {
            return Err(missing);
        }
        let epoch = cache.map(RowCache::epoch);
        let entry = if E::STATEMENT_IS_ROUND_TRIP {
            self.read_one("lookup", |c| {
                namespace::lookup_one_plus(c, parent, name, bs)
            })?
        } else {
            self.read_one("lookup", |c| {
                namespace::lookup_entry_plus(c, parent, name, bs)
            })?
        };
        if let Some((attr, bytes)) = &entry {
            if let (Some(cache), Some(epoch)) = (cache, epoch) {
                cache.fill_entry(epoch, parent, name.as_bytes(), attr, *bytes);
            }
        }
        if let Some(found) = entry {
            return Ok(found);
        }
        self.read("lookup", |c| {
            let attr = namespace::lookup(c, parent, name)?;
            inode::attr_plus(c, attr.ino, bs)
        })
    }

    fn getattr_plus(&self, ino: u64) -> Result<(Attr, u64)> {
        let bs = self.volume_record().block_size_bytes;
        let Some(cache) = self.row_cache() else {
            return self.read_one("getattr", |c| inode::attr_plus(c, ino, bs));
        };
        if let Some(found) = self.served_from_memory(Instant::now(), cache.attr_plus(ino)) {
            return Ok(found);
        }
        let epoch = cache.epoch();
        let (attr, bytes) = self.read_one("getattr", |c| inode::attr_plus(c, ino, bs))?;
        cache.fill_attr(epoch, &attr, Some(bytes));
        Ok((attr, bytes))
    }

    fn setattr(
        &self,
        ino: u64,
        set: &SetAttr,
        req: Option<RequestKey>,
    ) -> Result<(Attr, TruncatedBlocks)> {
        let bs = self.volume_record().block_size_bytes;
        self.write(
            "setattr",
            req,
            |c| setattr::setattr(c, self.known(), ino, set, bs),
            |(a, t)| Recorded::SetAttr(a.clone(), t.clone()),
        )
    }

    fn create(
        &self,
        parent: u64,
        name: &OsStr,
        args: &CreateArgs,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        self.write(
            "create",
            req,
            |c| namespace::create(c, self.known(), parent, name, args),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn tmpfile(
        &self,
        parent: u64,
        args: &CreateArgs,
        session: u64,
        linkable: bool,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        self.write(
            "tmpfile",
            req,
            |c| namespace::tmpfile(c, parent, args, session, linkable),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn link(
        &self,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        self.write(
            "link",
            req,
            |c| namespace::link(c, ino, new_parent, new_name),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn unlink(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked> {
        self.write(
            "unlink",
            req,
            |c| namespace::unlink(c, parent, name),
            |u| Recorded::Unlinked(*u),
        )
    }

    fn rmdir(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked> {
        self.write(
            "rmdir",
            req,
            |c| namespace::rmdir(c, parent, name),
            |u| Recorded::Unlinked(*u),
        )
    }

    fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
        req: Option<RequestKey>,
    ) -> Result<Renamed> {
        self.write(
            "rename",
            req,
            |c| rename::rename(c, (parent, name), (new_parent, new_name), flags),
            |r| Recorded::Renamed(*r),
        )
    }

    fn reclaim(&self, ino: u64, req: Option<RequestKey>) -> Result<Vec<ObjectRef>> {
        self.write(
            "reclaim",
            req,
            |c| orphan::reclaim(c, ino),
            |v| Recorded::Released(v.clone()),
        )
    }

    fn orphans(&self) -> Result<Vec<u64>> {
        self.read("orphans", |c| orphan::list(c))
    }

    fn is_linkable_tmpfile(&self, ino: u64) -> Result<bool> {
        self.read("linkable tmpfile", |c| {
            let a = inode::attr(c, ino)?;
            Ok(inode::linkable_tmpfile_dir(c, &a)?.is_some())
        })
    }

    fn readlink(&self, ino: u64) -> Result<OsString> {
        self.read("readlink", |c| namespace::readlink(c, ino))
    }

    fn readdir(&self, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntry>> {
        self.read("readdir", |c| readdir::readdir(c, ino, offset, limit))
    }

    fn readdir_plus(&self, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntryPlus>> {
        let block_size = self.volume_record().block_size_bytes;
        self.read("readdir plus", |c| {
            readdir::readdir_plus(c, ino, offset, limit, block_size)
        })
    }

    fn setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: XattrFlags,
        req: Option<RequestKey>,
    ) -> Result<()> {
        self.write(
            "setxattr",
            req,
            |c| xattr::set(c, ino, name, value, flags),
            |_| Recorded::Unit,
        )
    }

    fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        let Some(cache) = self.row_cache() else {
            return self.read_one("getxattr", |c| xattr::get(c, ino, name));
        };
        let start = Instant::now();
        let absent = cache
            .xattr_absent(ino, xattr::check_name(ino, name)?)
            .then_some(());
        if self.served_from_memory(start, absent).is_some() {
            return Err(xattr::no_xattr(ino, name));
        }
        let epoch = cache.epoch();
        let got = self.read_one("getxattr", |c| xattr::get(c, ino, name));
        if let Err(MetaError::NoXattr { .. }) = &got {
            cache.fill_absent_xattr(epoch, ino, name.as_bytes());
        }
        got
    }

    fn listxattr(&self, ino: u64) -> Result<Vec<OsString>> {
        self.read("listxattr", |c| xattr::list(c, ino))
    }

    fn removexattr(&self, ino: u64, name: &OsStr, req: Option<RequestKey>) -> Result<()> {
        self.write(
            "removexattr",
            req,
            |c| xattr::remove(c, ino, name),
            |_| Recorded::Unit,
        )
    }

    fn statfs(&self) -> Result<StatFs> {
        let bs = self.volume_record().block_size_bytes;
        self.read("statfs", |c| inode::statfs(c, bs))
    }

    fn set_quota(
        &self,
        dir: u64,
        bytes_max: Option<u64>,
        inodes_max: Option<u64>,
    ) -> Result<Quota> {
        self.write(
            "set quota",
            None,
            |c| quota::set(c, dir, bytes_max, inodes_max),
            |_| Recorded::Unit,
        )
    }

    fn remove_quota(&self, dir: u64) -> Result<bool> {
        self.write(
            "remove quota",
            None,
            |c| quota::remove(c, dir),
            |_| Recorded::Unit,
        )
    }

    fn quota(&self, dir: u64) -> Result<Option<Quota>> {
        self.read("quota", |c| quota::get(c, dir))
    }

    fn quotas(&self) -> Result<Vec<Quota>> {
        self.read("quotas", |c| quota::list(c))
    }

    fn nearest_quota(&self, ino: u64) -> Result<Option<Quota>> {
        self.read("nearest quota", |c| quota::nearest(c, ino))
    }

    fn quota_bytes_headroom(&self, ino: u64) -> Result<Option<i64>> {
        self.read("quota headroom", |c| quota::bytes_headroom(c, ino))
    }

    fn recount_quotas(&self, repair: bool) -> Result<Vec<QuotaDrift>> {
        if repair {
            self.write(
                "recount quotas",
                None,
                |c| quota::recount(c, true),
                |_| Recorded::Unit,
            )
        } else {
            self.read("recount quotas", |c| quota::recount(c, false))
        }
    }

    fn dir_path(&self, dir: u64) -> Result<std::path::PathBuf> {
        self.read("directory path", |c| quota::dir_path(c, dir))
    }

    fn blocks(&self, ino: u64, first_index: u64, count: u32) -> Result<Vec<BlockRef>> {
        self.read("blocks", |c| blockmap::blocks(c, ino, first_index, count))
    }

    fn read_plan(&self, ino: u64, first_index: u64, count: u32) -> Result<(Attr, Vec<BlockRef>)> {
        self.read("read plan", |c| {
            let attr = inode::attr(c, ino)?;
            // The caller checks the kind (a non-regular file has no rows).
            Ok((attr, blockmap::rows(c, ino, first_index, count)?))
        })
    }

    fn scan_blocks(&self, after: Option<(u64, u64)>, limit: u32) -> Result<Vec<(u64, BlockRef)>> {
        self.read("scan blocks", |c| scan::scan_blocks(c, after, limit))
    }

    fn scan_acls(
        &self,
        after: Option<(u64, OsString)>,
        limit: u32,
    ) -> Result<Vec<(u64, OsString, Vec<u8>)>> {
        let limit = limit.min(crate::limits::BLOCKS_QUERY_COUNT_MAX);
        self.read("scan acls", |c| acl::scan(c, after.clone(), limit))
    }

    fn fallocate_reserve(
        &self,
        ino: u64,
        range: std::ops::Range<u64>,
        grow: bool,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        let bs = self.volume_record().block_size_bytes;
        self.write(
            "fallocate_reserve",
            req,
            |c| reserve::reserve(c, ino, range.start, range.end, grow, bs),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn release_reserved(
        &self,
        ino: u64,
        range: std::ops::Range<u64>,
        req: Option<RequestKey>,
    ) -> Result<()> {
        let bs = self.volume_record().block_size_bytes;
        self.write(
            "release_reserved",
            req,
            |c| reserve::release_range(c, ino, range.start, range.end, bs),
            |()| Recorded::Unit,
        )
    }

    fn commit_blocks(
        &self,
        ino: u64,
        commit: &CommitBlocks,
        req: Option<RequestKey>,
    ) -> Result<(Attr, Vec<ObjectRef>)> {
        let bs = self.volume_record().block_size_bytes;
        self.write(
            "commit_blocks",
            req,
            |c| blockmap::commit(c, self.known(), ino, commit, bs),
            |(a, v)| Recorded::Committed(a.clone(), v.clone()),
        )
    }

    fn share_blocks(
        &self,
        ino: u64,
        share: &ShareBlocks,
        req: Option<RequestKey>,
    ) -> Result<(Attr, Vec<ObjectRef>)> {
        let bs = self.volume_record().block_size_bytes;
        let copied = share.copied_bytes;
        self.write(
            "share_blocks",
            req,
            |c| blockmap::share(c, ino, share, bs),
            |(a, v)| Recorded::Copied(a.clone(), copied, v.clone()),
        )
    }

    fn sync(&self) -> Result<()> {
        self.make_durable()
    }

    fn completed_request(&self, key: RequestKey) -> Result<Option<Vec<u8>>> {
        self.read("completed_request", |c| requests::get(c, key))
    }

    fn prune_completed(&self, older_than: SystemTime) -> Result<u64> {
        let before = Timespec::from_system_time(older_than);
        self.write(
            "prune_completed",
            None,
            |c| requests::prune(c, before),
            |_| Recorded::Unit,
        )
    }

    fn request_answered(&self, key: RequestKey) {
        if self.answered_queue().push(key) {
            let keys = self.answered_queue().take_due();
            if keys.is_empty() {
                return;
            }
            let forgotten = self.write(
                "forget answered requests",
                None,
                |c| requests::forget(c, &keys),
                |_| Recorded::Unit,
            );
            if let Err(e) = forgotten {
                // Harmless: prune_completed removes them later.
                tracing::debug!(error = %e, count = keys.len(), "answered request records kept");
            }
        }
    }

    fn shared_by_hosts(&self) -> bool {
        E::SHARED_BY_HOSTS
    }

    fn quarantined(&self) -> Option<String> {
        self.quarantine().reason().map(str::to_string)
    }

    fn transaction_stats(&self) -> crate::tx_stats::TxStats {
        self.tx_counters().snapshot()
    }

    fn fence(&self) {
        self.fence_writes();
    }

    fn unfence(&self) {
        self.unfence_writes();
    }

    fn replay_log(&self) -> Result<u64> {
        Engine::replay_log(self)
    }

    fn serve_as_only_writer(&self) {
        if let Some(cache) = self.row_cache() {
            cache.enable();
        }
    }

    fn open_session(&self, info: &SessionInfo) -> Result<()> {
        self.write(
            "open session",
            None,
            |c| sessions::open(c, info),
            |_| Recorded::Unit,
        )
    }

    fn heartbeat(&self, session: u64) -> Result<bool> {
        self.write(
            "heartbeat",
            None,
            |c| sessions::heartbeat(c, session),
            |_| Recorded::Unit,
        )
    }

    fn close_session(&self, session: u64) -> Result<Vec<u64>> {
        self.write(
            "close session",
            None,
            |c| sessions::close(c, session),
            |_| Recorded::Unit,
        )
    }

    fn expire_sessions(&self, max_age: std::time::Duration) -> Result<Vec<u64>> {
        let max_age_ms = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
        self.write(
            "expire sessions",
            None,
            |c| sessions::expire(c, max_age_ms),
            |_| Recorded::Unit,
        )
    }

    fn sessions(&self) -> Result<Vec<SessionRecord>> {
        self.read("sessions", |c| sessions::list(c))
    }

    fn held_orphans(&self, session: u64) -> Result<Vec<u64>> {
        self.read("held orphans", |c| sessions::held_by(c, session))
    }

    fn unheld_orphans(&self, limit: u32) -> Result<Vec<u64>> {
        self.read("unheld orphans", |c| sessions::unheld(c, limit))
    }

    fn hold_orphan(&self, session: u64, ino: u64) -> Result<()> {
        self.write(
            "hold orphan",
            None,
            |c| sessions::hold(c, session, ino),
            |_| Recorded::Unit,
        )
    }

    fn release_orphans(
        &self,
        session: Option<u64>,
        inos: &[u64],
    ) -> Result<Vec<(u64, Vec<ObjectRef>)>> {
        if inos.is_empty() {
            return Ok(Vec::new());
        }
        self.write(
            "release orphans",
            None,
            |c| {
                let mut reclaimed = Vec::new();
                for &ino in inos {
                    if let Some(objects) = sessions::release(c, session, ino)? {
                        reclaimed.push((ino, objects));
                    }
                }
                Ok(reclaimed)
            },
            |_| Recorded::Unit,
        )
    }

    fn publish_locks(
        &self,
        session: u64,
        ino: u64,
        space: LockSpace,
        wanted: Option<&RangeLock>,
        held: &[RangeLock],
        granted: Option<u64>,
    ) -> Result<Option<RangeLock>> {
        self.write(
            "publish locks",
            None,
            |c| locks::publish(c, session, ino, space, wanted, held, granted),
            |_| Recorded::Unit,
        )
    }

    fn park_lock(&self, session: u64, wait: &LockWait) -> Result<Parked> {
        self.write(
            "park lock",
            None,
            |c| locks::park(c, session, wait),
            |_| Recorded::Unit,
        )
    }

    fn unpark_locks(&self, session: u64, keys: &[u64]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        self.write(
            "unpark locks",
            None,
            |c| locks::unpark(c, session, keys),
            |_| Recorded::Unit,
        )
    }

    fn session_lock_waits(&self, session: u64) -> Result<Vec<LockWait>> {
        self.read("session lock waits", |c| {
            locks::waits_of_session(c, session)
        })
    }

    fn conflicting_lock(
        &self,
        session: u64,
        ino: u64,
        space: LockSpace,
        wanted: &RangeLock,
    ) -> Result<Option<RangeLock>> {
        self.read("conflicting lock", |c| {
            locks::conflicting(c, session, ino, space, wanted)
        })
    }

    fn replace_session_locks(
        &self,
        session: u64,
        held: &[(u64, LockSpace, RangeLock)],
        waits: &[LockWait],
    ) -> Result<()> {
        self.write(
            "replace session locks",
            None,
            |c| locks::replace_all(c, session, held, waits),
            |_| Recorded::Unit,
        )
    }

    fn session_locks(&self, session: u64) -> Result<Vec<(u64, LockSpace, RangeLock)>> {
        self.read("session locks", |c| locks::of_session(c, session))
    }
}
