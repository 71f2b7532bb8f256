//! [`BlockCache`]: where block reads are served from. Usually a bounded
//! on-disk cache of whole block objects, keyed by object key, with LRU
//! eviction by size and background prefetch.
//!
//! Keys name immutable objects, so entries never need invalidation, only
//! eviction. Layout: one file per block, `cache_dir/{ino:016x}-{index:08x}-{unique:016x}.blk`,
//! written as `cache_dir/.tmp-{random:016x}` and renamed into place, so a
//! file with a block name is always complete. Opening the cache re-indexes
//! the directory (oldest modification time evicted first) and deletes
//! leftover temp files.
//!
//! A store whose objects are plain files on this host is read in place
//! instead ([`BlockCache::in_place`]): no cache directory, no copies.
//!
//! Miss policy: a miss fetches the **whole block** with one GET and caches
//! it. FUSE reads are mostly sequential and the kernel already splits them
//! into 128 KiB..1 MiB requests, so one 4 MiB GET serves many later
//! requests; a small-range GET would save bandwidth for truly random
//! readers but cost a round trip per request and leave nothing cached.
//! Two threads missing the same key at once both fetch it (harmless:
//! the object is immutable and the second insert is discarded).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::error::{BlocksError, Result};
use crate::in_place::InPlaceReader;
use crate::key::ObjectKey;
use crate::private_fs;
use crate::store::BlockStore;

/// Maximum prefetch requests waiting for a worker; further hints are dropped.
pub const PREFETCH_QUEUE_MAX: usize = 64;
/// Background threads serving prefetch requests.
pub const PREFETCH_WORKER_COUNT: usize = 2;
/// A partial cache file younger than this may belong to another live
/// process sharing the directory, so opening the cache leaves it alone.
pub const PARTIAL_FILE_AGE_S_MIN: u64 = 60;
/// Maximum number of cached blocks, whatever their size.
pub const CACHE_ENTRY_COUNT_MAX: usize = 1 << 20;
/// Name prefix of files being written (deleted at open once old).
const TMP_PREFIX: &str = ".tmp-";

/// Counters of a [`BlockCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads served from disk.
    pub hit_count: u64,
    /// Reads that fetched from the store.
    pub miss_count: u64,
    /// Prefetch hints queued.
    pub prefetch_queued_count: u64,
    /// Prefetch hints dropped because the queue was full.
    pub prefetch_dropped_count: u64,
    /// Prefetches that failed (logged).
    pub prefetch_failed_count: u64,
    /// Bytes currently cached.
    pub used_bytes: u64,
    /// What the cache may hold (0: no cache, blocks read in place).
    pub capacity_bytes: u64,
    /// Blocks currently cached.
    pub entry_count: u64,
    /// Blocks evicted to stay within capacity since the cache was opened
    /// (those evicted while opening it not counted).
    pub eviction_count: u64,
}

/// In-memory LRU index (pure: no I/O).
#[derive(Debug)]
struct Lru {
    entries: HashMap<ObjectKey, (u64, u64)>,
    order: BTreeMap<u64, ObjectKey>,
    used_bytes: u64,
    tick_next: u64,
    capacity_bytes: u64,
    entry_count_max: usize,
}

impl Lru {
    fn new(capacity_bytes: u64, entry_count_max: usize) -> Self {
        Lru {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            used_bytes: 0,
            tick_next: 0,
            capacity_bytes,
            entry_count_max,
        }
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Marks `key` most recently used; false if absent.
    fn touch(&mut self, key: &ObjectKey) -> bool {
        let tick = self.tick_next;
        match self.entries.get_mut(key) {
            None => false,
            Some((_, old)) => {
                self.order.remove(old);
                *old = tick;
                self.order.insert(tick, key.clone());
                self.tick_next += 1;
                true
            }
        }
    }

    /// Inserts `key` as most recently used and returns the keys evicted to
    /// stay within capacity (never `key` itself).
    fn insert(&mut self, key: ObjectKey, len_bytes: u64) -> Vec<ObjectKey> {
        if self.touch(&key) {
            return Vec::new();
        }
        let tick = self.tick_next;
        self.tick_next += 1;
        self.entries.insert(key.clone(), (len_bytes, tick));
        self.order.insert(tick, key.clone());
        self.used_bytes += len_bytes;
        let mut evicted = Vec::new();
        while self.used_bytes > self.capacity_bytes || self.entries.len() > self.entry_count_max {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if oldest == key {
                // Invariant: the new entry is kept; put it back and stop.
                self.order.insert(tick, oldest);
                break;
            }
            if let Some((len, _)) = self.entries.remove(&oldest) {
                self.used_bytes -= len;
            }
            evicted.push(oldest);
        }
        debug_assert_eq!(self.entries.len(), self.order.len());
        evicted
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some((len, tick)) = self.entries.remove(key) {
            self.order.remove(&tick);
            self.used_bytes -= len;
        }
    }
}

struct Inner {
    dir: PathBuf,
    store: Arc<BlockStore>,
    lru: Mutex<Lru>,
    hit_count: AtomicU64,
    miss_count: AtomicU64,
    prefetch_queued_count: AtomicU64,
    prefetch_dropped_count: AtomicU64,
    prefetch_failed_count: AtomicU64,
    eviction_count: AtomicU64,
    shutdown: AtomicBool,
}

fn lock(m: &Mutex<Lru>) -> MutexGuard<'_, Lru> {
    // A panic while holding the lock leaves the index consistent enough
    // (worst case: an entry whose file is gone, treated as a miss).
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where block reads are served from: a bounded on-disk cache of whole
/// blocks in front of a [`BlockStore`] ([`BlockCache::open`]), or, for a
/// store whose objects are plain files on this host, the objects
/// themselves ([`BlockCache::in_place`]).
pub struct BlockCache(Backing);

#[derive(Debug)]
enum Backing {
    OnDisk(DiskCache),
    InPlace(InPlaceReader),
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl BlockCache {
    /// Opens (creating if needed) the on-disk cache in `dir`, re-indexing
    /// existing blocks, deleting leftover temp files and evicting down to
    /// `capacity_bytes`.
    pub fn open(dir: &Path, capacity_bytes: u64, store: Arc<BlockStore>) -> Result<Self> {
        Ok(BlockCache(Backing::OnDisk(DiskCache::open(
            dir,
            capacity_bytes,
            store,
        )?)))
    }

    /// No cache: every read is a ranged read of the object's own file,
    /// and nothing is copied. For a store that
    /// [`BlockStore::reads_in_place`] (a local directory): a cached copy
    /// would be a second file on the same disk, costing a file creation
    /// per uploaded block and a whole-block write per miss, for no faster
    /// read. `InvalidArgument` for any other store.
    pub fn in_place(store: &BlockStore) -> Result<Self> {
        let root = store
            .in_place_root()
            .ok_or_else(|| BlocksError::InvalidArgument {
                what: format!(
                    "store {} cannot be read in place (not a plain local directory)",
                    store.url()
                ),
            })?;
        Ok(BlockCache(Backing::InPlace(InPlaceReader::new(
            root.to_path_buf(),
            store.counters(),
        )?)))
    }

    /// Reads `len` bytes at `offset` of the block `key` whose length is
    /// `block_len_bytes` (from metadata). The result is shorter than `len`
    /// only at the end of the block. On disk, a miss fetches and caches
    /// the whole block.
    pub fn read(
        &self,
        key: &ObjectKey,
        block_len_bytes: u64,
        offset: u64,
        len: u64,
    ) -> Result<Bytes> {
        match &self.0 {
            Backing::OnDisk(cache) => cache.read(key, block_len_bytes, offset, len),
            Backing::InPlace(reader) => {
                if offset >= block_len_bytes || len == 0 {
                    return Ok(Bytes::new());
                }
                let end = offset.saturating_add(len).min(block_len_bytes);
                reader.read(key, offset, end)
            }
        }
    }

    /// [`BlockCache::read`] into `buf`, as many bytes as it holds; returns
    /// how many were read (fewer only at the end of the block). In place,
    /// the object's file is read straight into `buf`: a cold scan's every
    /// request then costs one copy, not an allocation, a fill and two.
    pub fn read_into(
        &self,
        key: &ObjectKey,
        block_len_bytes: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let len = (buf.len() as u64).min(block_len_bytes.saturating_sub(offset)) as usize;
        if len == 0 {
            return Ok(0);
        }
        match &self.0 {
            Backing::OnDisk(cache) => {
                let bytes = cache.read(key, block_len_bytes, offset, len as u64)?;
                buf[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            }
            Backing::InPlace(reader) => {
                reader.read_into(key, offset, &mut buf[..len])?;
                Ok(len)
            }
        }
    }

    /// Inserts a block the caller already has (e.g. just uploaded). Best
    /// effort: a cache write failure is logged and ignored. In place:
    /// nothing to do.
    pub fn insert(&self, key: &ObjectKey, data: &[u8]) {
        if let Backing::OnDisk(cache) = &self.0 {
            cache.insert(key, data);
        }
    }

    /// Whether `key` is cached (never, in place).
    pub fn contains(&self, key: &ObjectKey) -> bool {
        match &self.0 {
            Backing::OnDisk(cache) => cache.contains(key),
            Backing::InPlace(_) => false,
        }
    }

    /// Readahead hint: fetches `(key, block_len_bytes)` blocks in the
    /// background. Blocks already cached are skipped; hints beyond
    /// [`PREFETCH_QUEUE_MAX`] waiting requests are dropped. Returns how many
    /// were queued. In place, the kernel reads the objects' files ahead
    /// ([`InPlaceReader::prefetch`]).
    pub fn prefetch(&self, blocks: &[(ObjectKey, u64)]) -> usize {
        match &self.0 {
            Backing::OnDisk(cache) => cache.prefetch(blocks),
            Backing::InPlace(reader) => reader.prefetch(blocks),
        }
    }

    /// Current counters. In place, every read counts as a miss (it went to
    /// the store).
    pub fn stats(&self) -> CacheStats {
        match &self.0 {
            Backing::OnDisk(cache) => cache.stats(),
            Backing::InPlace(reader) => CacheStats {
                miss_count: reader.read_count(),
                ..CacheStats::default()
            },
        }
    }
}

/// The on-disk cache behind [`BlockCache::open`].
struct DiskCache {
    inner: Arc<Inner>,
    prefetch_tx: Option<SyncSender<(ObjectKey, u64)>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("dir", &self.inner.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

impl DiskCache {
    fn open(dir: &Path, capacity_bytes: u64, store: Arc<BlockStore>) -> Result<Self> {
        private_fs::create_dir_all(dir)
            .map_err(|e| BlocksError::cache("create cache dir", dir, e))?;
        let mut lru = Lru::new(capacity_bytes, CACHE_ENTRY_COUNT_MAX);
        for (key, len, _) in scan_dir(dir)? {
            for old in lru.insert(key, len) {
                remove_quietly(&dir.join(old.file_name()));
            }
        }
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            store,
            lru: Mutex::new(lru),
            hit_count: AtomicU64::new(0),
            miss_count: AtomicU64::new(0),
            prefetch_queued_count: AtomicU64::new(0),
            prefetch_dropped_count: AtomicU64::new(0),
            prefetch_failed_count: AtomicU64::new(0),
            eviction_count: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH_QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::with_capacity(PREFETCH_WORKER_COUNT);
        for i in 0..PREFETCH_WORKER_COUNT {
            let (inner, rx) = (inner.clone(), rx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("baton-prefetch-{i}"))
                .spawn(move || prefetch_worker(&inner, &rx))
                .map_err(|e| BlocksError::cache("spawn prefetch worker", dir, e))?;
            workers.push(handle);
        }
        Ok(DiskCache {
            inner,
            prefetch_tx: Some(tx),
            workers,
        })
    }

    fn read(&self, key: &ObjectKey, block_len_bytes: u64, offset: u64, len: u64) -> Result<Bytes> {
        if offset >= block_len_bytes || len == 0 {
            return Ok(Bytes::new());
        }
        let end = offset.saturating_add(len).min(block_len_bytes);
        if let Some(bytes) = self.inner.read_hit(key, offset, end) {
            self.inner.hit_count.fetch_add(1, Ordering::Relaxed);
            return Ok(bytes);
        }
        self.inner.miss_count.fetch_add(1, Ordering::Relaxed);
        let block = self.inner.fetch(key, block_len_bytes)?;
        // Both bounds are <= block_len_bytes == block.len(), checked by fetch.
        Ok(block.slice(offset as usize..end as usize))
    }

    fn insert(&self, key: &ObjectKey, data: &[u8]) {
        self.inner.insert(key, data);
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        lock(&self.inner.lru).contains(key)
    }

    fn prefetch(&self, blocks: &[(ObjectKey, u64)]) -> usize {
        let Some(tx) = &self.prefetch_tx else {
            return 0;
        };
        let mut queued_count = 0;
        for (key, len) in blocks {
            if self.contains(key) {
                continue;
            }
            match tx.try_send((key.clone(), *len)) {
                Ok(()) => {
                    queued_count += 1;
                    self.inner
                        .prefetch_queued_count
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.inner
                        .prefetch_dropped_count
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        queued_count
    }

    fn stats(&self) -> CacheStats {
        let (used_bytes, capacity_bytes, entry_count) = {
            let lru = lock(&self.inner.lru);
            (lru.used_bytes, lru.capacity_bytes, lru.entries.len() as u64)
        };
        let i = &self.inner;
        CacheStats {
            hit_count: i.hit_count.load(Ordering::Relaxed),
            miss_count: i.miss_count.load(Ordering::Relaxed),
            prefetch_queued_count: i.prefetch_queued_count.load(Ordering::Relaxed),
            prefetch_dropped_count: i.prefetch_dropped_count.load(Ordering::Relaxed),
            prefetch_failed_count: i.prefetch_failed_count.load(Ordering::Relaxed),
            eviction_count: i.eviction_count.load(Ordering::Relaxed),
            used_bytes,
            capacity_bytes,
            entry_count,
        }
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Relaxed);
        self.prefetch_tx = None;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::error!("prefetch worker panicked");
            }
        }
    }
}

impl Inner {
    /// Reads `offset..end` from the cached file, or `None` on a miss (also
    /// when the file vanished or is damaged: the read falls back to the store).
    fn read_hit(&self, key: &ObjectKey, offset: u64, end: u64) -> Option<Bytes> {
        if !lock(&self.lru).touch(key) {
            return None;
        }
        let path = self.dir.join(key.file_name());
        let mut buf = vec![0u8; (end - offset) as usize];
        let res = File::open(&path).and_then(|f| f.read_exact_at(&mut buf, offset));
        match res {
            Ok(()) => Some(Bytes::from(buf)),
            Err(error) => {
                tracing::warn!(object = %key, path = %path.display(), %error, "cached block unreadable, refetching");
                let mut lru = lock(&self.lru);
                lru.remove(key);
                remove_quietly(&path);
                None
            }
        }
    }

    fn fetch(&self, key: &ObjectKey, block_len_bytes: u64) -> Result<Bytes> {
        let data = self.store.get_range(key, 0..block_len_bytes)?;
        self.insert(key, &data);
        Ok(data)
    }

    fn insert(&self, key: &ObjectKey, data: &[u8]) {
        if let Err(error) = self.try_insert(key, data) {
            tracing::warn!(object = %key, %error, "could not cache block");
        }
    }

    fn try_insert(&self, key: &ObjectKey, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        {
            let lru = lock(&self.lru);
            if lru.contains(key) || len > lru.capacity_bytes {
                return Ok(());
            }
        }
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{:016x}", rand::random::<u64>()));
        let written = private_fs::create_new(&tmp).and_then(|mut f| f.write_all(data));
        if let Err(e) = written {
            remove_quietly(&tmp);
            return Err(BlocksError::cache("write cache temp file", &tmp, e));
        }
        let mut lru = lock(&self.lru);
        if lru.contains(key) {
            remove_quietly(&tmp);
            return Ok(());
        }
        let path = self.dir.join(key.file_name());
        if let Err(e) = fs::rename(&tmp, &path) {
            remove_quietly(&tmp);
            return Err(BlocksError::cache("rename cache file", &path, e));
        }
        // Unlink under the lock so a concurrent re-insert of an evicted key
        // cannot lose its fresh file.
        for old in lru.insert(key.clone(), len) {
            self.eviction_count.fetch_add(1, Ordering::Relaxed);
            remove_quietly(&self.dir.join(old.file_name()));
        }
        Ok(())
    }
}

fn prefetch_worker(inner: &Inner, rx: &Mutex<Receiver<(ObjectKey, u64)>>) {
    loop {
        let next = match rx.lock() {
            Ok(guard) => guard.recv(),
            Err(_) => return,
        };
        let Ok((key, len)) = next else {
            return;
        };
        if inner.shutdown.load(Ordering::Relaxed) {
            continue;
        }
        if lock(&inner.lru).contains(&key) {
            continue;
        }
        if let Err(error) = inner.fetch(&key, len) {
            inner.prefetch_failed_count.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(object = %key, %error, "prefetch failed");
        }
    }
}

/// Lists cached blocks as (key, length, mtime), oldest first, deleting temp files.
fn scan_dir(dir: &Path) -> Result<Vec<(ObjectKey, u64, std::time::SystemTime)>> {
    let mut found = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| BlocksError::cache("list cache dir", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| BlocksError::cache("list cache dir", dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if name.starts_with(TMP_PREFIX) {
            // A young temp file may be another live process's insert in
            // progress (a standby opens the dir the serving generation uses).
            let age = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            if age.is_some_and(|a| a.as_secs() >= PARTIAL_FILE_AGE_S_MIN) {
                tracing::info!(path = %path.display(), "removing partial cache file");
                remove_quietly(&path);
            }
            continue;
        }
        let Some(key) = ObjectKey::from_file_name(&name) else {
            tracing::warn!(path = %path.display(), "ignoring foreign file in cache dir");
            continue;
        };
        // Another process sharing the cache dir (the serving generation,
        // while a standby opens it) may evict the file meanwhile.
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(BlocksError::cache("stat cache file", &path, e)),
        };
        let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        found.push((key, meta.len(), mtime));
    }
    found.sort_by_key(|(_, _, mtime)| *mtime);
    Ok(found)
}

fn remove_quietly(path: &Path) {
    if let Err(error) = fs::remove_file(path) {
        if error.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), %error, "could not remove cache file");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn k(i: u64) -> ObjectKey {
        ObjectKey::from_parts(1, i, i, crate::KeyLayout::PerInode)
    }

    #[test]
    fn lru_evicts_oldest_until_within_capacity() {
        let mut lru = Lru::new(10, 100);
        assert!(lru.insert(k(1), 4).is_empty());
        assert!(lru.insert(k(2), 4).is_empty());
        assert!(lru.touch(&k(1)));
        assert_eq!(lru.insert(k(3), 4), vec![k(2)]);
        assert_eq!(lru.used_bytes, 8);
        assert!(lru.contains(&k(1)) && lru.contains(&k(3)));
    }

    #[test]
    fn lru_entry_count_max_is_enforced() {
        let mut lru = Lru::new(u64::MAX, 3);
        for i in 0..3 {
            assert!(lru.insert(k(i), 1).is_empty());
        }
        assert_eq!(lru.insert(k(3), 1), vec![k(0)]);
        assert_eq!(lru.entries.len(), 3);
    }

    #[test]
    fn lru_never_evicts_the_new_entry() {
        let mut lru = Lru::new(5, 100);
        lru.insert(k(1), 2);
        let evicted = lru.insert(k(2), 7);
        assert_eq!(evicted, vec![k(1)]);
        assert!(lru.contains(&k(2)));
    }
}
