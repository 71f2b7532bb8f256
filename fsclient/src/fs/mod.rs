//! [`BatonFs`]: the POSIX filesystem served over FUSE. This module holds the
//! shared state and the conversions to kernel attributes; `dispatch` holds
//! the [`fuse_wire::Filesystem`] impl, which only routes each request to the
//! submodule doing the work and turns its `Result` into the reply:
//!
//! - [`namespace`]: lookup, getattr, setattr, mknod, mkdir, symlink, link,
//!   unlink, rmdir, rename, readlink;
//! - [`orphans`]: this mount's session and when an orphan is reclaimed;
//! - [`data`]: open, create, tmpfile (O_TMPFILE), read, write, fallocate,
//!   lseek;
//! - [`flush`]: flush, fsync, release and the durability protocol;
//! - [`write_through`]: a WRITE of a whole small file, committed at once;
//! - [`copy`]: copy_file_range, sharing whole blocks;
//! - [`dir`]: opendir, readdir(plus), releasedir;
//! - [`xattr`]: extended attributes;
//! - [`lock`]: getlk, setlk, setlkw and interrupts.
//!
//! Nodeids are inode numbers (root 1 on both sides), so nothing maps ids and
//! lookup counts need no tracking: FORGET is a no-op, and a later
//! generation understands every nodeid the kernel holds.

mod committed_bytes;
mod copy;
mod counters;
mod data;
mod dir;
mod dispatch;
mod durable;
mod flush;
pub mod held_locks;
pub mod inline;
pub mod lock;
mod namespace;
mod once;
mod orphans;
pub mod quota_free;
mod seek;
mod staging_dirs;
mod write_through;
mod xattr;

#[cfg(test)]
mod attr_tests;
#[cfg(test)]
mod fence_tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

use baton_blocks::{BlockCache, BlockStore, Staging};
use baton_meta::{Attr, FileKind, MetaStore};
use fuse_wire::{abi, AttrOut, EntryOut, Kstatfs, NodeId};
use fuse_wire::{Errno, InitParams, Request};

use crate::error::{Error, Result};
use crate::handles::Handles;
use crate::locks::LockTable;
use baton_volume::Volume;
use upgrade_protocol::LockState;

pub use flush::FLUSH_ROUNDS_MAX;
pub use lock::LOCK_RETRY_INTERVAL;
pub use once::{replaying_journal, RECORD_AGE_MAX};
pub use orphans::{ORPHAN_RELEASE_BATCH_MAX, ORPHAN_SETTLE_DELAY, UNHELD_RECLAIM_COUNT_MAX};

/// Per-inode mutexes, hashed by inode number.
pub const INODE_LOCK_STRIPE_COUNT: usize = 256;
/// The capacity STATFS reports for a volume on a remote object store
/// without a quota on its root (and for a quota without a byte limit):
/// 1 PiB, a stand-in for "as much as the object store holds". A local
/// store reports its disk instead.
pub const VOLUME_CAPACITY_BYTES: u64 = 1 << 50;
/// The inode count STATFS reports for a volume without an inode limit
/// (2^40; inode numbers themselves go to 2^63).
pub const VOLUME_INODES_MAX: u64 = 1 << 40;
/// Inodes whose read pattern is remembered (for readahead).
pub const READAHEAD_ENTRIES_MAX: usize = 4096;
/// Blocks prefetched ahead of a sequential reader.
pub const READAHEAD_BLOCKS: u32 = 4;
/// A READ at least this large from offset 0 starts a scan. The kernel's
/// first readahead is four times the application's read (to 256 KiB for
/// a 64 KiB read), so only reads of 128 KiB and more, and mappings, reach
/// it; a small read of a file's header does not.
pub const SCAN_START_BYTES_MIN: u64 = 512 << 10;

/// Tunables of a [`BatonFs`].
#[derive(Clone, Copy, Debug)]
pub struct FsConfig {
    /// How long the kernel may cache entries and attributes.
    pub attr_ttl: Duration,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            attr_ttl: Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct ReadPattern {
    next_offset: u64,
    prefetched_to_index: u64,
}

/// A Baton volume served over FUSE.
pub struct BatonFs {
    meta: Arc<dyn MetaStore>,
    store: Arc<BlockStore>,
    cache: BlockCache,
    staging: Staging,
    block_size: u64,
    /// Largest file whose block is kept inline (`inline.rs`); 0 on a
    /// volume older than inline blocks.
    inline_bytes_max: u64,
    config: FsConfig,
    /// WRITEBACK_CACHE was negotiated: the kernel owns mtime on writes.
    writeback: AtomicBool,
    /// POSIX_ACL was negotiated: the kernel enforces ACLs, this mount keeps
    /// them (`xattr.rs`) and creations inherit default ACLs.
    posix_acl: AtomicBool,
    /// DONT_MASK was negotiated: creations carry the umask unapplied, and
    /// baton-meta applies it (unless a default ACL is inherited).
    dont_mask: AtomicBool,
    handles: Handles,
    locks: Mutex<LockTable<lock::ParkedLock>>,
    /// Where the held locks are kept for a successor after a crash, and
    /// the table's change count last written there.
    held_locks_file: Option<held_locks::HeldLocksFile>,
    held_locks_saved: AtomicU64,
    /// The session timer's thread, which runs [`BatonFs::retry_locks`] and
    /// [`BatonFs::settle_queued_orphans`]: woken when a request parks or an
    /// inode loses its last name.
    timer_thread: Mutex<Option<std::thread::Thread>>,
    /// LSEEKs waiting for the timer thread (`seek.rs`).
    parked_seeks: Mutex<seek::ParkedSeeks>,
    /// Inodes that lost their last name, for the timer thread to settle.
    orphans_to_settle: Mutex<orphans::OrphanQueue>,
    /// Held shared by a TMPFILE from its metadata transaction until its
    /// handle is registered, exclusively by the session tick while it
    /// reads which orphans this session holds: an orphan born held by
    /// this session is never let go of for want of its handle
    /// (`orphans.rs`).
    tmpfile_births: RwLock<()>,
    /// With an inherited handle table: orphans this session keeps because
    /// the kernel still had their inode; FORGET of one settles it again.
    kernel_held_orphans: Mutex<std::collections::HashSet<u64>>,
    inode_locks: Vec<Mutex<()>>,
    committed_bytes: committed_bytes::CommittedBytes,
    /// Objects committed but maybe not on the disk, for FSYNC
    /// (`durable.rs`).
    unsynced: Mutex<durable::Unsynced>,
    /// Set when a write-through upload failed (`write_through.rs`).
    write_through_pause: write_through::Pause,
    readahead: Mutex<HashMap<u64, ReadPattern>>,
    /// Inodes no byte-limited quota counted when last asked (WRITE).
    quota_free: quota_free::QuotaFree,
    /// The random identity of the FUSE connection served (exactly-once
    /// keys, the metadata session); not the kernel's fusectl number. Set
    /// once, before serving ([`BatonFs::set_connection`]).
    connection_identity: OnceLock<u64>,
    /// The FUSE connection, for notifications the kernel did not ask for
    /// ([`BatonFs::invalidate_kernel_attrs`]). Set once, before serving.
    kernel: OnceLock<Arc<dyn fuse_wire::reply::ReplyChannel>>,
    /// When [`BatonFs::set_connection`] ran (this generation adopted).
    adopted_at: OnceLock<std::time::Instant>,
    /// Handing over: no more staging writes (metadata is fenced too).
    fenced: AtomicBool,
    /// Replayed requests answered from an earlier generation's record.
    recovered: AtomicU64,
    /// Requests by opcode, latencies, bytes (for the supervisor's metrics).
    counters: counters::RequestCounters,
    /// This mount's session, once registered (`orphans.rs`).
    session: Mutex<Option<baton_meta::SessionInfo>>,
    /// Since when every session tick succeeded (`orphans.rs`).
    session_healthy_since: Mutex<Option<std::time::Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every guarded map is valid after any single statement, so a panic in
    // another worker leaves nothing half-done.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for a guard with no data (`BatonFs::tmpfile_births`), shared.
fn read_lock(m: &RwLock<()>) -> RwLockReadGuard<'_, ()> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for a guard with no data, exclusive.
fn write_lock(m: &RwLock<()>) -> RwLockWriteGuard<'_, ()> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

impl BatonFs {
    /// A filesystem over an opened volume. The volume's lock stays with the
    /// caller.
    pub fn new(
        meta: Arc<dyn MetaStore>,
        store: Arc<BlockStore>,
        cache: BlockCache,
        staging: Staging,
        config: FsConfig,
    ) -> BatonFs {
        let volume = meta.volume();
        let block_size = u64::from(volume.block_size_bytes);
        let inline_bytes_max = if volume.format_version >= baton_meta::INLINE_BLOCKS_FORMAT_VERSION
        {
            inline::INLINE_BYTES_MAX.min(block_size)
        } else {
            0
        };
        BatonFs {
            meta,
            store,
            cache,
            staging,
            block_size,
            inline_bytes_max,
            config,
            writeback: AtomicBool::new(true),
            posix_acl: AtomicBool::new(false),
            dont_mask: AtomicBool::new(false),
            handles: Handles::default(),
            locks: Mutex::new(LockTable::default()),
            held_locks_file: held_locks::HeldLocksFile::from_env(),
            held_locks_saved: AtomicU64::new(0),
            timer_thread: Mutex::new(None),
            parked_seeks: Mutex::new(seek::ParkedSeeks::default()),
            orphans_to_settle: Mutex::new(orphans::OrphanQueue::default()),
            tmpfile_births: RwLock::new(()),
            kernel_held_orphans: Mutex::new(std::collections::HashSet::new()),
            inode_locks: (0..INODE_LOCK_STRIPE_COUNT)
                .map(|_| Mutex::new(()))
                .collect(),
            committed_bytes: committed_bytes::CommittedBytes::default(),
            unsynced: Mutex::default(),
            write_through_pause: write_through::Pause::default(),
            readahead: Mutex::new(HashMap::new()),
            quota_free: quota_free::QuotaFree::default(),
            connection_identity: OnceLock::new(),
            kernel: OnceLock::new(),
            adopted_at: OnceLock::new(),
            fenced: AtomicBool::new(false),
            recovered: AtomicU64::new(0),
            counters: counters::RequestCounters::default(),
            session: Mutex::new(None),
            session_healthy_since: Mutex::new(None),
        }
    }

    /// Request, byte, cache and upload counters since this process started
    /// (for `Message::Stats`; lists the staging area, so call it from a
    /// timer, not per request).
    pub fn counters(&self) -> upgrade_protocol::GenerationCounters {
        let mut counters = self.counters.snapshot();
        let cache = self.cache.stats();
        counters.cache_hit_count = cache.hit_count;
        counters.cache_miss_count = cache.miss_count;
        counters.cache_used_bytes = cache.used_bytes;
        counters.cache_capacity_bytes = cache.capacity_bytes;
        counters.uploads_pending = self
            .staging
            .staged_inodes()
            .map(|inodes| inodes.len() as u64)
            .unwrap_or(0);
        counters.metadata_quarantined = self.meta.quarantined();
        counters.storage = counters::storage_counters(
            &self.store.stats(),
            &self.meta.transaction_stats(),
            self.staging.pending().unwrap_or((0, None)),
            cache.eviction_count,
        );
        counters
    }

    /// Builds the filesystem from a [`Volume`], returning its lock to keep.
    pub fn from_volume(
        volume: Volume,
        config: FsConfig,
    ) -> (BatonFs, nix::fcntl::Flock<std::fs::File>) {
        let fs = BatonFs::new(
            volume.meta,
            volume.store,
            volume.cache,
            volume.staging,
            config,
        );
        (fs, volume.lock)
    }

    /// Sets what a creation carries from INIT's choices: the request's
    /// `umask` when the kernel did not apply it (DONT_MASK; applying it
    /// again would change nothing, but a default ACL replaces it), and
    /// whether a default ACL of the parent is inherited (POSIX_ACL).
    pub(super) fn creation_rules(&self, args: &mut baton_meta::CreateArgs, umask: u32) {
        args.umask = if self.dont_mask.load(Ordering::Relaxed) {
            umask & 0o777
        } else {
            0
        };
        args.inherit_acl = self.posix_acl.load(Ordering::Relaxed);
    }

    /// POSIX_ACL was negotiated: ACL xattrs are kept, not refused.
    pub(super) fn acls_enforced(&self) -> bool {
        self.posix_acl.load(Ordering::Relaxed)
    }

    /// Records what INIT negotiated (before serving).
    pub fn set_init(&self, params: &InitParams) {
        self.writeback.store(
            params.has(abi::init_flags::WRITEBACK_CACHE),
            Ordering::Relaxed,
        );
        self.posix_acl
            .store(params.has(abi::init_flags::POSIX_ACL), Ordering::Relaxed);
        self.dont_mask
            .store(params.has(abi::init_flags::DONT_MASK), Ordering::Relaxed);
    }

    /// Records which connection is served and which generation serves it
    /// (before serving). `inherited`: an earlier generation served this
    /// connection and its handle table was lost with it, so the kernel may
    /// hold handles this process never issued.
    pub fn set_connection(&self, connection_identity: u64, generation: u64, inherited: bool) {
        // Invariant: one process serves one connection: a second identity
        // would split its exactly-once records and its session in two.
        assert!(
            self.connection_identity.set(connection_identity).is_ok(),
            "the connection was set twice"
        );
        self.handles.start_generation(generation, inherited);
        let _ = self.adopted_at.set(std::time::Instant::now());
        // A SQLite volume has one mount at a time: no other mount to ask,
        // and a lock costs no metadata transaction.
        if self.meta.shared_by_hosts() {
            lock(&self.locks).set_registry(Box::new(lock::VolumeLocks::new(
                Arc::clone(&self.meta),
                connection_identity,
            )));
        }
    }

    /// The connection's random identity.
    fn connection_identity(&self) -> u64 {
        // Invariant: set before serving (`fsclient mount` sets it before
        // mount(2), a generation when it adopts): a request keyed without
        // it would record its exactly-once result under no connection.
        // Broken, this generation dies; the next one answers the request.
        match self.connection_identity.get() {
            Some(identity) => *identity,
            None => panic!("a request was served before the connection was set"),
        }
    }

    /// Fences this process for a handover: no metadata change and no
    /// staging write starts after this returns (the one in progress, if
    /// any, finished first). Requests that hit the fence are abandoned, not
    /// answered: the next generation answers them.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        // A staging write in progress holds its inode's stripe: wait for
        // each, so none is still writing when this returns.
        for stripe in &self.inode_locks {
            drop(lock(stripe));
        }
        self.meta.fence();
    }

    /// Lifts [`BatonFs::fence`] (the handover was rolled back).
    pub fn unfence(&self) {
        self.meta.unfence();
        self.fenced.store(false, Ordering::SeqCst);
        // The successor may have republished the session's locks and
        // waits as it saw them: ours again.
        self.republish_locks();
    }

    /// Handles, next handle number and open orphans, for a handover.
    pub fn export_handles(&self) -> (Vec<(u64, crate::handles::Handle)>, u64, Vec<u64>) {
        self.handles.export()
    }

    /// Takes over a predecessor's handle table.
    pub fn import_handles(
        &self,
        handles: &[(u64, crate::handles::Handle)],
        next_fh: u64,
        orphans: &[u64],
    ) {
        self.handles.import(handles, next_fh, orphans);
    }

    /// Held locks and the raw bytes of parked lock requests, for a
    /// handover (call fenced: nothing changes them meanwhile). The parked
    /// requests stay parked here in case the handover is rolled back.
    pub fn export_locks(&self) -> (Vec<LockState>, Vec<Vec<u8>>) {
        let locks = lock(&self.locks);
        let held = held_locks::lock_states(&locks);
        let parked = locks.parked().map(|p| p.raw().to_vec()).collect();
        (held, parked)
    }

    /// Takes over a predecessor's held locks (before serving).
    pub fn import_locks(&self, held: &[LockState]) {
        let mut table = lock(&self.locks);
        table.import_held(&held_locks::held_from_states(held));
        self.save_held_locks(&table);
    }

    /// After a crash: takes over the locks the dead generation kept on
    /// disk (see `held_locks.rs`). Call after `set_connection`.
    pub fn restore_held_locks(&self) {
        let Some(file) = &self.held_locks_file else {
            return;
        };
        match file.read(self.connection_identity()) {
            // Nothing held, but the dead one may have published waits
            // that will not come back (a request interrupted meanwhile):
            // the session's rows become what this table holds and parks.
            Ok(held) if held.is_empty() => self.republish_locks(),
            Ok(held) => {
                tracing::info!(locks = held.len(), file = %file.path().display(), "held locks restored after a crash");
                self.import_locks(&held);
            }
            Err(err) => {
                tracing::error!(err, "the held locks of the dead generation cannot be read; callers that held locks lose them");
            }
        }
    }

    /// Rewrites the held-locks file if the held locks changed since it was
    /// last written. Call with the table locked.
    fn save_held_locks(&self, table: &LockTable<lock::ParkedLock>) {
        let Some(file) = &self.held_locks_file else {
            return;
        };
        if table.changes() == self.held_locks_saved.load(Ordering::Relaxed) {
            return;
        }
        match file.write(self.connection_identity(), table) {
            Ok(()) => self
                .held_locks_saved
                .store(table.changes(), Ordering::Relaxed),
            Err(err) => {
                tracing::error!(%err, file = %file.path().display(), "cannot keep the held locks on disk; a crash now would lose them");
            }
        }
    }

    /// Readies the metadata connections for a first request
    /// ([`MetaStore::warm_up`]). A failure only costs speed: logged.
    pub fn warm_up(&self) {
        if let Err(err) = self.meta.warm_up() {
            tracing::warn!(%err, "cannot warm up the metadata connections; the first requests will be slower");
        }
    }

    /// Makes the current thread the one [`BatonFs::retry_locks`] and
    /// [`BatonFs::settle_queued_orphans`] run on (`None`: no such thread
    /// any more; orphans are settled by the requests themselves): it is
    /// unparked whenever a lock request parks or an inode is orphaned.
    pub fn set_timer_thread(&self, thread: Option<std::thread::Thread>) {
        *lock(&self.timer_thread) = thread;
    }

    fn wake_timer_thread(&self) {
        if let Some(thread) = lock(&self.timer_thread).as_ref() {
            thread.unpark();
        }
    }

    /// Publishes every held lock again (this session's rows may be gone).
    fn republish_locks(&self) {
        lock(&self.locks).republish_all();
        self.wake_timer_thread();
    }

    /// The metadata store.
    pub fn meta(&self) -> &Arc<dyn MetaStore> {
        &self.meta
    }

    fn inode_lock(&self, ino: u64) -> MutexGuard<'_, ()> {
        lock(&self.inode_locks[self.inode_stripe(ino)])
    }

    /// The inode's stripe, held for a change to staging (a write, a size
    /// record); refused once fenced.
    /// Invariant: a fenced generation starts no staging write. The next
    /// generation owns staging from its adoption on, and replays the
    /// journaled request itself: a late write here (a truncate's size
    /// record after the new generation's write, say) would undo its work.
    /// [`BatonFs::fence`] waits for every stripe, so a change that got its
    /// stripe before the fence has finished when `fence` returns.
    fn staging_lock(&self, ino: u64, op: &'static str) -> Result<MutexGuard<'_, ()>> {
        let guard = self.inode_lock(ino);
        if self.fenced.load(Ordering::SeqCst) {
            return Err(baton_meta::MetaError::Fenced { op }.into());
        }
        Ok(guard)
    }

    fn inode_stripe(&self, ino: u64) -> usize {
        (ino % INODE_LOCK_STRIPE_COUNT as u64) as usize
    }

    fn ttl(&self) -> (u64, u32) {
        (
            self.config.attr_ttl.as_secs(),
            self.config.attr_ttl.subsec_nanos(),
        )
    }

    /// Kernel attributes: the staged size over the committed one;
    /// `committed_bytes` of `a` when the caller read them with it (else
    /// looked up).
    ///
    /// `read_since`: for attributes read without the inode's mutex (LOOKUP,
    /// GETATTR, READDIRPLUS), the [`CommittedBytes::token`] taken before
    /// `a` was read. A flush may commit a new size and clear its staged
    /// record between that read and this one's look at staging: the
    /// committed size then read is older than the cleared record (a grown
    /// file would look short, and reads past the old size end early). The
    /// commit invalidates the inode first, so a changed token with nothing
    /// staged means `a` is read again.
    fn kernel_attr(
        &self,
        a: &Attr,
        committed_bytes: Option<u64>,
        read_since: Option<u64>,
    ) -> Result<fuse_wire::Attr> {
        let (size, blocks) = if a.kind == FileKind::Regular {
            let staged = self.staging.staged_size(a.ino)?;
            let committed_since = read_since.is_some_and(|t| t != self.committed_bytes.token());
            let reread;
            let (a, committed_bytes) = if staged.is_none() && committed_since {
                reread = self.meta.getattr(a.ino)?;
                (&reread, None)
            } else {
                (a, committed_bytes)
            };
            let size = staged.map_or(a.size, |s| s.resolve(a.size));
            let mut bytes = match committed_bytes {
                Some(bytes) => bytes,
                None => self.committed_alloc(a.ino)?,
            };
            if staged.is_some() {
                let dirty = self.staging.dirty_blocks(a.ino)?.len() as u64;
                bytes = bytes.saturating_add(dirty.saturating_mul(self.block_size));
            }
            (size, bytes.min(size.div_ceil(512) * 512).div_ceil(512))
        } else {
            (a.size, a.size.div_ceil(512))
        };
        Ok(fuse_wire::Attr {
            ino: a.ino,
            size,
            blocks,
            atime: a.atime.sec as u64,
            mtime: a.mtime.sec as u64,
            ctime: a.ctime.sec as u64,
            atimensec: a.atime.nsec,
            mtimensec: a.mtime.nsec,
            ctimensec: a.ctime.nsec,
            mode: a.st_mode(),
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: self.block_size.clamp(4096, 1 << 20) as u32,
            flags: 0,
        })
    }

    fn attr_out(&self, a: &Attr) -> Result<AttrOut> {
        self.attr_out_with(a, None, None)
    }

    /// [`BatonFs::attr_out`] as [`BatonFs::kernel_attr`].
    fn attr_out_with(
        &self,
        a: &Attr,
        committed_bytes: Option<u64>,
        read_since: Option<u64>,
    ) -> Result<AttrOut> {
        let (secs, nanos) = self.ttl();
        Ok(AttrOut {
            attr_valid: secs,
            attr_valid_nsec: nanos,
            dummy: 0,
            attr: self.kernel_attr(a, committed_bytes, read_since)?,
        })
    }

    fn entry_out(&self, a: &Attr) -> Result<EntryOut> {
        self.entry_out_with(a, None, None)
    }

    /// [`BatonFs::entry_out`] as [`BatonFs::kernel_attr`].
    fn entry_out_with(
        &self,
        a: &Attr,
        committed_bytes: Option<u64>,
        read_since: Option<u64>,
    ) -> Result<EntryOut> {
        let (secs, nanos) = self.ttl();
        Ok(EntryOut {
            nodeid: NodeId::new(a.ino),
            generation: a.generation,
            entry_valid: secs,
            attr_valid: secs,
            entry_valid_nsec: nanos,
            attr_valid_nsec: nanos,
            attr: self.kernel_attr(a, committed_bytes, read_since)?,
        })
    }

    /// Bytes of committed blocks of a regular file (remembered per inode).
    fn committed_alloc(&self, ino: u64) -> Result<u64> {
        if let Some(bytes) = self.committed_bytes.get(ino) {
            return Ok(bytes);
        }
        let token = self.committed_bytes.token();
        let (_, bytes) = self.meta.getattr_plus(ino)?;
        self.committed_bytes.remember(ino, bytes, token);
        Ok(bytes)
    }

    /// Lets the filesystem notify the kernel on `channel` (the connection it
    /// serves). Called once, before serving.
    pub fn set_kernel_channel(&self, channel: Arc<dyn fuse_wire::reply::ReplyChannel>) {
        let _ = self.kernel.set(channel);
    }

    /// Has the kernel drop its cached attributes of `ino` after a change
    /// the request's reply does not carry (set-ID bits a WRITE or OPEN
    /// cleared): otherwise `stat` shows the old mode until the attribute
    /// TTL passes. Attributes only (offset -1), so it never waits on the
    /// page cache and is safe inside a request.
    fn invalidate_kernel_attrs(&self, ino: u64) {
        let Some(channel) = self.kernel.get() else {
            return;
        };
        // ENOENT: the kernel has no such inode cached; nothing to drop.
        if let Err(err) = fuse_wire::notify::inval_inode(channel.as_ref(), NodeId::from(ino), -1, 0)
        {
            if err.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(ino, %err, "could not invalidate the kernel's attributes");
            }
        }
    }

    /// Whether this mount's kernel may still reference `ino` (an open
    /// file, a cached inode): asks it to drop its cached attributes of
    /// `ino`, which it refuses with ENOENT when it has no such inode. An
    /// open file pins its inode, and an inode without a name cannot come
    /// back (no LOOKUP finds it), so `false` is final for an orphan.
    /// Without a connection or on any other failure: `true`.
    fn kernel_may_hold(&self, ino: u64) -> bool {
        let Some(channel) = self.kernel.get() else {
            return true;
        };
        match fuse_wire::notify::inval_inode(channel.as_ref(), NodeId::from(ino), -1, 0) {
            Ok(()) => true,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => false,
            Err(err) => {
                tracing::warn!(nodeid = ino, %err, "cannot ask the kernel whether it holds an orphan; kept");
                true
            }
        }
    }

    /// Forgets cached per-inode facts after its block map changed.
    fn invalidate(&self, ino: u64) {
        self.committed_bytes.forget(ino);
    }

    /// STATFS on `ino`: under a directory quota (the deepest that holds
    /// `ino`, a quota directory's own first) its limits and usage, so
    /// that `df` on the directory or a bind mount of it shows the quota;
    /// elsewhere the volume's usage from the metadata. A limit a quota
    /// lacks is the volume's figure (a quota on the root directory is the
    /// way to give the volume a capacity). The volume's size: on a local
    /// store its usage plus what the store's disk has available (so `df`
    /// shows the room writes really have), on a remote one
    /// [`VOLUME_CAPACITY_BYTES`]; inodes: [`VOLUME_INODES_MAX`]. What is
    /// available is never more than the local store's disk has.
    fn do_statfs(&self, ino: u64) -> Result<Kstatfs> {
        const FRAGMENT_BYTES: u64 = 4096;
        // What unlinked files hold is freed first, as on a local
        // filesystem: `rm -rf dir; df` shows the space back (the timer
        // thread would settle them only at a pause in the requests).
        self.settle_orphans_now();
        let disk_available_bytes = self.store.local_dir().and_then(|dir| {
            match nix::sys::statvfs::statvfs(dir) {
                Ok(st) => Some(st.blocks_available() * st.fragment_size()),
                Err(errno) => {
                    tracing::debug!(dir = %dir.display(), %errno, "statvfs of the local store failed; reporting the remote figures");
                    None
                }
            }
        });
        let capacity_without_limit = |used_bytes: u64| {
            disk_available_bytes.map_or(VOLUME_CAPACITY_BYTES, |available| {
                used_bytes.saturating_add(available)
            })
        };
        // A quota's figures are one row; the volume's are counted (kept
        // off the quota path: kubelet asks every PVC's statfs often).
        let (capacity_bytes, used_bytes, inodes_max, used_inodes) =
            match self.meta.nearest_quota(ino)? {
                Some(q) => (
                    q.bytes_max
                        .unwrap_or_else(|| capacity_without_limit(q.used.bytes)),
                    q.used.bytes,
                    q.inodes_max.unwrap_or(VOLUME_INODES_MAX),
                    q.used.inodes,
                ),
                None => {
                    let usage = self.meta.statfs()?;
                    (
                        capacity_without_limit(usage.bytes_used),
                        usage.bytes_used,
                        VOLUME_INODES_MAX,
                        usage.inodes_used,
                    )
                }
            };
        let blocks = capacity_bytes.div_ceil(FRAGMENT_BYTES);
        let used = used_bytes.div_ceil(FRAGMENT_BYTES).min(blocks);
        let free = blocks - used;
        let available = disk_available_bytes.map_or(free, |bytes| free.min(bytes / FRAGMENT_BYTES));
        Ok(Kstatfs {
            blocks,
            bfree: free,
            bavail: available,
            files: inodes_max,
            ffree: inodes_max.saturating_sub(used_inodes),
            bsize: self.block_size.clamp(FRAGMENT_BYTES, 1 << 20) as u32,
            namelen: baton_meta::limits::NAME_LEN_MAX as u32,
            frsize: FRAGMENT_BYTES as u32,
            ..Default::default()
        })
    }

    /// Logs a failed operation and returns the errno to reply with.
    fn fail(&self, op: &'static str, req: &Request<'_>, nodeid: u64, err: &Error) -> Errno {
        self.fail_unique(op, req.unique(), nodeid, err)
    }

    /// [`BatonFs::fail`] of the request `unique`, answered after its
    /// handler returned (a parked request).
    fn fail_unique(&self, op: &'static str, unique: u64, nodeid: u64, err: &Error) -> Errno {
        let errno = err.errno();
        match errno {
            Errno::EIO | Errno::ENOSPC => {
                tracing::warn!(op, unique, nodeid, %errno, error = %err, "operation failed")
            }
            _ => tracing::debug!(op, unique, nodeid, %errno, error = %err, "operation refused"),
        }
        errno
    }
}
