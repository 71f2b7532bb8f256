//! [`BlockStore`]: a synchronous facade over an `object_store::ObjectStore`
//! that uploads immutable block objects, reads byte ranges of them, deletes
//! them, and probes reachability.
//!
//! The store owns a small tokio runtime and `block_on`s it from the
//! caller's (FUSE worker) thread. Transient errors are retried with bounded
//! exponential backoff; uploads of many blocks run at most
//! [`UPLOAD_PARALLEL_MAX`] at once.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::codec::{Codec, CodecSpec, KEY_BYTES};
use crate::error::{BlocksError, Result};
use crate::key::{KeyLayout, ObjectKey};
use crate::op_stats::{StoreCounters, StoreOp, StoreStats};
use crate::s3::S3Location;

/// Maximum attempts for one object operation (first try included).
pub const RETRY_ATTEMPT_COUNT_MAX: u32 = 5;
/// First backoff between attempts.
pub const RETRY_BACKOFF_MS_INITIAL: u64 = 25;
/// Upper bound of one backoff sleep.
pub const RETRY_BACKOFF_MS_MAX: u64 = 1_000;
/// Maximum uploads in flight for one [`BlockStore::put_blocks`] call.
pub const UPLOAD_PARALLEL_MAX: usize = 8;
/// Maximum deletes in flight for one [`BlockStore::delete`] call.
pub const DELETE_PARALLEL_MAX: usize = 16;
/// Worker threads of the internal runtime.
pub const RUNTIME_WORKER_COUNT: usize = 2;
/// Maximum blocking threads of the internal runtime (LocalFileSystem I/O).
pub const RUNTIME_BLOCKING_THREAD_COUNT_MAX: usize = 16;
/// Key prefix under which [`BlockStore::check_reachable`] writes its probe.
pub const PROBE_PREFIX: &str = "probe";
/// Longest a reachability probe may take before it is reported as a timeout.
pub const PROBE_TIMEOUT_MS: u64 = 20_000;
/// Blocks of at least this size are uploaded in parts (multipart upload).
pub const MULTIPART_THRESHOLD_BYTES: usize = 16 << 20;
/// Size of one part of a multipart upload (S3's minimum is 5 MiB).
pub const MULTIPART_PART_BYTES: usize = 8 << 20;
/// Parts of one block in flight at once.
pub const MULTIPART_PARALLEL_MAX: usize = 4;

/// Builds an object store from a URL.
///
/// Supported: `file:///absolute/dir` (the directory must exist),
/// `s3://BUCKET/PREFIX?endpoint=URL&region=NAME` (see [`S3Location`]) and
/// `memory://` (in-process, for tests). Anything else is
/// [`BlocksError::UnsupportedScheme`].
pub fn store_from_url(url: &str) -> Result<Arc<dyn ObjectStore>> {
    // Codec parameters are the block store's business, not the backend's.
    let (url, _) = CodecSpec::split_url(url)?;
    let url = url.as_str();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| BlocksError::InvalidUrl {
            url: url.to_string(),
            reason: "missing scheme (expected file:///dir or memory://)".to_string(),
        })?;
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(BlocksError::InvalidUrl {
                    url: url.to_string(),
                    reason: "file:// URLs need an absolute path (file:///dir)".to_string(),
                });
            }
            // Cleanup: in the per-inode key layout every inode's objects
            // are in a directory of their own, which would otherwise
            // outlive them (a fanned directory emptied goes too, and the
            // next upload into it makes it again).
            let local = object_store::local::LocalFileSystem::new_with_prefix(rest)
                .map_err(|source| BlocksError::unreachable(url, source))?
                .with_automatic_cleanup(true);
            Ok(Arc::new(local))
        }
        "s3" => S3Location::parse(url)?.build(),
        "memory" => Ok(Arc::new(object_store::memory::InMemory::new())),
        _ => Err(BlocksError::UnsupportedScheme {
            url: url.to_string(),
        }),
    }
}

/// Whether an object store error is worth retrying (a full disk under a
/// local store is not: it stays full for longer than the backoff).
fn is_transient(err: &object_store::Error) -> bool {
    matches!(
        err,
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
    ) && !BlocksError::chain_is_no_space(err)
}

/// Backoff before attempt `attempt` (1-based count of failures so far).
fn backoff(attempt: u32) -> Duration {
    let shift = attempt.saturating_sub(1).min(16);
    let ms = RETRY_BACKOFF_MS_INITIAL.saturating_mul(1u64 << shift);
    Duration::from_millis(ms.min(RETRY_BACKOFF_MS_MAX))
}

/// Runs `op` until it succeeds, fails permanently or reaches
/// [`RETRY_ATTEMPT_COUNT_MAX`] attempts. Returns the result and attempt count.
async fn with_retry<T, F, Fut>(
    what: &str,
    attempt_count_max: u32,
    mut op: F,
) -> (Result<T, object_store::Error>, u32)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, object_store::Error>>,
{
    let mut attempt_count = 0;
    loop {
        attempt_count += 1;
        match op().await {
            Ok(v) => return (Ok(v), attempt_count),
            Err(err) if is_transient(&err) && attempt_count < attempt_count_max => {
                tracing::warn!(object = what, attempt_count, error = %err, "transient object store error, retrying");
                tokio::time::sleep(backoff(attempt_count)).await;
            }
            Err(err) => return (Err(err), attempt_count),
        }
    }
}

/// One block object as listed by the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredObject {
    /// Its key.
    pub key: ObjectKey,
    /// Its size.
    pub size_bytes: u64,
    /// When it was written (second resolution).
    pub last_modified: std::time::SystemTime,
}

/// Synchronous access to immutable block objects.
pub struct BlockStore {
    store: Arc<dyn ObjectStore>,
    url: String,
    // Attempts per operation made by this facade: 1 for S3, whose client
    // retries transient errors itself with backoff (RetryConfig).
    attempt_count_max: u32,
    // Compression/encryption of objects, when the volume has one.
    codec: Option<Arc<Codec>>,
    // The directory of a plain local store not wrapped by injected faults:
    // its objects are files on this host's disk (see `reads_in_place`).
    local_root: Option<PathBuf>,
    // How new uploads' keys are spelled: the volume's, set by its opener.
    key_layout: KeyLayout,
    // Calls, errors, latency and bytes by operation, for metrics.
    counters: Arc<StoreCounters>,
    // Invariant: Some until Drop; taken there to shut down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for BlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockStore")
            .field("url", &self.url)
            .finish()
    }
}

impl BlockStore {
    /// Opens the store named by `url` (see [`store_from_url`]).
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with_key(url, None)
    }

    /// Opens the store named by `url` whose objects may be encrypted:
    /// refuses a missing or wrong `key` before anything is read or written.
    pub fn open_with_key(url: &str, key: Option<&[u8; KEY_BYTES]>) -> Result<Self> {
        let (_, spec) = CodecSpec::split_url(url)?;
        let mut store = Self::open_undecoded(url)?;
        if !spec.is_plain() {
            store.codec = Some(Arc::new(Codec::new(url, &spec, key)?));
        }
        Ok(store)
    }

    /// Opens the store with the key `source` gives (a key file, or a
    /// passphrase derived with the volume's salt); refuses a missing,
    /// wrong or wrong-kind key before anything is read or written.
    pub fn open_with_key_source(url: &str, source: Option<&crate::KeySource>) -> Result<Self> {
        let (_, spec) = CodecSpec::split_url(url)?;
        let key = crate::passphrase::key_for(url, &spec, source)?;
        Self::open_with_key(url, key.as_ref())
    }

    /// Opens the store without its codec: for listing and deleting objects
    /// (`fsctl gc`), never for reading blocks.
    pub fn open_undecoded(url: &str) -> Result<Self> {
        let backend = store_from_url(url)?;
        let wrapped = crate::faulty_store::wrap_from_env(Arc::clone(&backend))?;
        let faults_injected = !Arc::ptr_eq(&backend, &wrapped);
        let mut store = Self::new(wrapped, url)?;
        if !faults_injected {
            let (plain, _) = CodecSpec::split_url(url)?;
            store.local_root = plain.strip_prefix("file://").map(PathBuf::from);
        }
        if url.starts_with("s3://") {
            store.attempt_count_max = 1;
        }
        Ok(store)
    }

    /// Whether objects are stored encoded (their sizes are not block sizes).
    pub fn is_encoded(&self) -> bool {
        self.codec.is_some()
    }

    /// Whether a ranged read can be served from the object as stored: the
    /// store is a directory on this host (`file://`) and objects are not
    /// encoded. A disk cache in front of such a store would only copy
    /// every block to the same disk (see [`crate::BlockCache::in_place`]).
    pub fn reads_in_place(&self) -> bool {
        self.in_place_root().is_some()
    }

    /// The counters of this store's calls (shared with an in-place reader).
    pub(crate) fn counters(&self) -> Arc<StoreCounters> {
        Arc::clone(&self.counters)
    }

    /// The directory of a local store (`file://`), whose disk's free
    /// space is the volume's (STATFS); `None` for a remote store.
    pub fn local_dir(&self) -> Option<&Path> {
        self.local_root.as_deref()
    }

    /// The directory whose files are the objects, when
    /// [`BlockStore::reads_in_place`].
    pub(crate) fn in_place_root(&self) -> Option<&Path> {
        match self.codec {
            None => self.local_root.as_deref(),
            Some(_) => None,
        }
    }

    /// Wraps an existing object store; `url` is used in messages only.
    pub fn new(store: Arc<dyn ObjectStore>, url: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_WORKER_COUNT)
            .max_blocking_threads(RUNTIME_BLOCKING_THREAD_COUNT_MAX)
            .thread_name("baton-blocks-io")
            .enable_all()
            .build()
            .map_err(|source| BlocksError::Runtime { source })?;
        Ok(BlockStore {
            store,
            url: url.to_string(),
            attempt_count_max: RETRY_ATTEMPT_COUNT_MAX,
            codec: None,
            local_root: None,
            key_layout: KeyLayout::default(),
            counters: Arc::new(StoreCounters::default()),
            runtime: Some(runtime),
        })
    }

    /// Spells the keys of new uploads in `layout` (the default,
    /// [`KeyLayout::PerInode`], is the one every build reads). The volume's
    /// opener sets it from the volume's metadata format.
    pub fn with_key_layout(mut self, layout: KeyLayout) -> Self {
        self.key_layout = layout;
        self
    }

    /// The URL this store was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Object store calls so far: by operation, with errors, latency and
    /// bytes each way (blocks written to or read in place from a local
    /// directory count too; a retried call counts once).
    pub fn stats(&self) -> StoreStats {
        self.counters.snapshot()
    }

    fn block_on<F: std::future::Future>(&self, fut: F) -> Result<F::Output> {
        // Invariant: runtime is only None inside Drop, where no method runs.
        match &self.runtime {
            Some(rt) => Ok(rt.block_on(fut)),
            None => Err(BlocksError::InvalidArgument {
                what: "block store used after shutdown".to_string(),
            }),
        }
    }

    /// Uploads one block under a fresh key and returns the key.
    pub fn put_block(&self, ino: u64, index: u64, data: Bytes) -> Result<ObjectKey> {
        if let Some(root) = &self.local_root {
            return self.put_local(root, ino, index, &data);
        }
        let store = self.store.clone();
        let codec = self.codec.clone();
        let key = ObjectKey::generate(ino, index, self.key_layout);
        let counters = Arc::clone(&self.counters);
        self.block_on(put_one(
            store,
            codec,
            self.attempt_count_max,
            key,
            data,
            counters,
        ))?
    }

    /// Uploads many blocks, at most [`UPLOAD_PARALLEL_MAX`] at once. Keys are
    /// returned in input order. If any upload fails, the objects that did
    /// upload are deleted (best effort) and the first error is returned.
    pub fn put_blocks(&self, blocks: Vec<(u64, u64, Bytes)>) -> Result<Vec<ObjectKey>> {
        // One block to a local directory: on this thread (`local_put.rs`);
        // several go through the runtime, which writes them in parallel.
        if let (Some(root), [(ino, index, data)]) = (&self.local_root, blocks.as_slice()) {
            return Ok(vec![self.put_local(root, *ino, *index, data)?]);
        }
        let store = self.store.clone();
        let attempts = self.attempt_count_max;
        let codec = self.codec.clone();
        let layout = self.key_layout;
        let counters = &self.counters;
        let results: Vec<Result<ObjectKey>> = self.block_on(async move {
            futures::stream::iter(blocks)
                .map(|(ino, index, data)| {
                    let key = ObjectKey::generate(ino, index, layout);
                    let counters = Arc::clone(counters);
                    put_one(store.clone(), codec.clone(), attempts, key, data, counters)
                })
                .buffered(UPLOAD_PARALLEL_MAX)
                .collect()
                .await
        })?;
        let mut keys = Vec::with_capacity(results.len());
        let mut first_err = None;
        for r in results {
            match r {
                Ok(k) => keys.push(k),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(keys),
            Some(err) => {
                self.delete(&keys);
                Err(err)
            }
        }
    }

    /// Writes one block as a file of the local store at `root`.
    fn put_local(&self, root: &Path, ino: u64, index: u64, data: &Bytes) -> Result<ObjectKey> {
        let start = Instant::now();
        let key = ObjectKey::generate(ino, index, self.key_layout);
        let put = |bytes: &[u8]| {
            let result = crate::local_put::put_file(root, &key, bytes);
            self.counters.record(StoreOp::Put, start, result.is_ok());
            if result.is_ok() {
                self.counters.sent(bytes.len() as u64);
            }
            result
        };
        match &self.codec {
            Some(codec) => {
                let encoded = codec.encode(key.to_path().as_ref(), data)?;
                put(&encoded)?
            }
            None => put(data)?,
        }
        Ok(key)
    }

    /// The stored form of an inline block's `data` (kept in its block-map
    /// row, never in the store) under its inline key `key`: encoded by
    /// the volume's codec when it has one, as its object would have been,
    /// so a small file is no less sealed for being inline.
    pub fn seal_inline(&self, key: &str, data: &[u8]) -> Result<Vec<u8>> {
        match &self.codec {
            Some(codec) => codec.encode(key, data),
            None => Ok(data.to_vec()),
        }
    }

    /// The block bytes of an inline block kept as `stored` under `key`.
    pub fn open_inline<'a>(&self, key: &str, stored: &'a [u8]) -> Result<Cow<'a, [u8]>> {
        match &self.codec {
            Some(codec) => Ok(Cow::Owned(codec.decode(key, stored)?)),
            None => Ok(Cow::Borrowed(stored)),
        }
    }

    /// Makes objects `keys` durable against power loss (an fsync's part
    /// of the store). A local directory store writes its files without
    /// syncing them: here their data and the directory entries naming them
    /// reach the disk. A remote store's acknowledged PUT is durable already.
    pub fn make_durable(&self, keys: &[ObjectKey]) -> Result<()> {
        match &self.local_root {
            Some(root) if !keys.is_empty() => crate::local_put::sync_files(root, keys),
            _ => Ok(()),
        }
    }

    /// Makes every object durable (SYNCFS): a local directory store syncs
    /// the filesystem holding it, in one call.
    pub fn make_all_durable(&self) -> Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        let synced = std::fs::File::open(root)
            .and_then(|dir| nix::unistd::syncfs(&dir).map_err(std::io::Error::from));
        synced.map_err(|source| BlocksError::ObjectFileWrite {
            path: root.clone(),
            source,
        })
    }

    /// Whether [`BlockStore::make_durable`] has work to do for new objects.
    pub fn syncs_objects(&self) -> bool {
        self.local_root.is_some()
    }

    /// Reads bytes `range` of object `key` (ranged GET). The result has
    /// exactly `range.end - range.start` bytes or an error is returned.
    pub fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        if range.start > range.end {
            return Err(BlocksError::InvalidArgument {
                what: format!("range {}..{} of {key} is reversed", range.start, range.end),
            });
        }
        if range.start == range.end {
            return Ok(Bytes::new());
        }
        let store = self.store.clone();
        let codec = self.codec.clone();
        let start = Instant::now();
        let result = self.block_on(get_range(
            store,
            codec,
            self.attempt_count_max,
            key.clone(),
            range,
            Arc::clone(&self.counters),
        ))?;
        self.counters.record(StoreOp::Get, start, result.is_ok());
        result
    }

    /// Deletes objects, best effort: failures are logged, not returned
    /// (an undeleted immutable object is garbage, never wrong data).
    /// Returns how many deletes succeeded (a missing object counts as deleted).
    pub fn delete(&self, keys: &[ObjectKey]) -> usize {
        self.delete_counting(keys, &AtomicU64::new(0))
    }

    /// [`BlockStore::delete`], adding each delete that succeeded to
    /// `deleted` as it does (progress for `fsctl gc`).
    pub fn delete_counting(&self, keys: &[ObjectKey], deleted: &AtomicU64) -> usize {
        let store = self.store.clone();
        let keys = keys.to_vec();
        let attempts = self.attempt_count_max;
        let counters = &self.counters;
        let fut = async move {
            futures::stream::iter(keys)
                .map(|key| {
                    let store = store.clone();
                    async move {
                        let path = key.to_path();
                        let start = Instant::now();
                        let (res, attempt_count) =
                            with_retry(&key.to_string(), attempts, || store.delete(&path)).await;
                        let ok = matches!(res, Ok(()) | Err(object_store::Error::NotFound { .. }));
                        counters.record(StoreOp::Delete, start, ok);
                        match res {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => true,
                            Err(error) => {
                                tracing::warn!(object = %key, attempt_count, %error, "delete of block object failed; it stays as garbage");
                                false
                            }
                        }
                    }
                })
                .buffer_unordered(DELETE_PARALLEL_MAX)
                .filter(|ok| {
                    if *ok {
                        deleted.fetch_add(1, Ordering::Relaxed);
                    }
                    futures::future::ready(*ok)
                })
                .count()
                .await
        };
        match self.block_on(fut) {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(%error, "delete skipped");
                0
            }
        }
    }

    /// Probes the store by writing and deleting a small object under
    /// `probe/`. Returns [`BlocksError::StorageUnreachable`] if it fails,
    /// except for lack of space (a full disk under a local store).
    pub fn check_reachable(&self) -> Result<()> {
        let store = self.store.clone();
        let path = object_store::path::Path::from(format!(
            "{PROBE_PREFIX}/{:016x}",
            rand::random::<u64>()
        ));
        let attempts = self.attempt_count_max;
        let probe = async move {
            let payload = PutPayload::from_static(b"baton-blocks probe");
            let (put, _) = with_retry(path.as_ref(), attempts, || {
                store.put(&path, payload.clone())
            })
            .await;
            put?;
            let (del, _) = with_retry(path.as_ref(), attempts, || store.delete(&path)).await;
            del
        };
        let timeout = Duration::from_millis(PROBE_TIMEOUT_MS);
        // The timer must be created inside the runtime.
        match self.block_on(async move { tokio::time::timeout(timeout, probe).await })? {
            Ok(Ok(())) => Ok(()),
            // It answered, and is full: serving (reads, and writes once
            // space is freed) beats refusing to start; writes hear ENOSPC.
            Ok(Err(source)) if BlocksError::chain_is_no_space(&source) => {
                tracing::warn!(url = %self.url, error = %source, "object store is full: writes fail with ENOSPC until space is freed");
                Ok(())
            }
            Ok(Err(source)) => Err(BlocksError::unreachable(&self.url, source)),
            Err(_elapsed) => Err(BlocksError::StorageTimeout {
                url: self.url.clone(),
                timeout_ms: PROBE_TIMEOUT_MS,
            }),
        }
    }

    /// Lists every block object in the store with its size and age (for
    /// `fsctl gc` and `fsck`). Objects whose names are not block keys are
    /// left out.
    pub fn list_objects(&self) -> Result<Vec<StoredObject>> {
        self.list_objects_counting(&AtomicU64::new(0))
    }

    /// [`BlockStore::list_objects`], adding each object listed to `listed`
    /// as the listing goes (progress for `fsctl fsck` and `gc`).
    pub fn list_objects_counting(&self, listed: &AtomicU64) -> Result<Vec<StoredObject>> {
        let store = self.store.clone();
        let url = self.url.clone();
        let start = Instant::now();
        let listing = self.block_on(async move {
            let prefix = object_store::path::Path::from(crate::key::KEY_PREFIX);
            store
                .list(Some(&prefix))
                .inspect_ok(|_| {
                    listed.fetch_add(1, Ordering::Relaxed);
                })
                .try_collect::<Vec<object_store::ObjectMeta>>()
                .await
        })?;
        self.counters.record(StoreOp::List, start, listing.is_ok());
        let metas = listing.map_err(|source| BlocksError::unreachable(&url, source))?;
        Ok(metas
            .iter()
            .filter_map(|m| {
                let key = ObjectKey::parse(m.location.as_ref()).ok()?;
                let secs = u64::try_from(m.last_modified.timestamp()).unwrap_or(0);
                Some(StoredObject {
                    key,
                    size_bytes: m.size,
                    last_modified: std::time::UNIX_EPOCH + Duration::from_secs(secs),
                })
            })
            .collect())
    }

    /// Lists every block object key currently in the store (for garbage
    /// collection by the caller and for tests).
    pub fn list_keys(&self) -> Result<Vec<ObjectKey>> {
        Ok(self.list_objects()?.into_iter().map(|o| o.key).collect())
    }
}

impl Drop for BlockStore {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Does not block, so dropping from any context is safe.
            rt.shutdown_background();
        }
    }
}

async fn put_one(
    store: Arc<dyn ObjectStore>,
    codec: Option<Arc<Codec>>,
    attempt_count_max: u32,
    key: ObjectKey,
    data: Bytes,
    counters: Arc<StoreCounters>,
) -> Result<ObjectKey> {
    let path = key.to_path();
    let data = match &codec {
        Some(codec) => Bytes::from(codec.encode(path.as_ref(), &data)?),
        None => data,
    };
    let start = Instant::now();
    let sent_bytes = data.len() as u64;
    let (res, attempt_count) = if data.len() >= MULTIPART_THRESHOLD_BYTES {
        with_retry(path.as_ref(), attempt_count_max, || {
            put_in_parts(store.as_ref(), &path, data.clone())
        })
        .await
    } else {
        let payload = PutPayload::from_bytes(data);
        let (res, attempt_count) = with_retry(path.as_ref(), attempt_count_max, || {
            store.put(&path, payload.clone())
        })
        .await;
        (res.map(|_| ()), attempt_count)
    };
    counters.record(StoreOp::Put, start, res.is_ok());
    if res.is_ok() {
        counters.sent(sent_bytes);
    }
    match res {
        Ok(()) => Ok(key),
        Err(source) => Err(BlocksError::Put {
            key: key.to_string(),
            attempt_count,
            source,
        }),
    }
}

/// Multipart upload of one large block: [`MULTIPART_PART_BYTES`] parts, at
/// most [`MULTIPART_PARALLEL_MAX`] in flight; aborted on failure, so no
/// parts are left behind (the key is fresh, nothing else is affected).
async fn put_in_parts(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    data: Bytes,
) -> Result<(), object_store::Error> {
    let upload = store.put_multipart(path).await?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART_BYTES);
    let mut offset = 0;
    while offset < data.len() {
        if let Err(err) = writer.wait_for_capacity(MULTIPART_PARALLEL_MAX).await {
            let _ = writer.abort().await;
            return Err(err);
        }
        let end = (offset + MULTIPART_PART_BYTES).min(data.len());
        writer.put(data.slice(offset..end));
        offset = end;
    }
    writer.finish().await.map(|_| ())
}

async fn get_range(
    store: Arc<dyn ObjectStore>,
    codec: Option<Arc<Codec>>,
    attempt_count_max: u32,
    key: ObjectKey,
    range: Range<u64>,
    counters: Arc<StoreCounters>,
) -> Result<Bytes> {
    let path = key.to_path();
    if let Some(codec) = codec {
        return get_decoded(store, &codec, attempt_count_max, key, range, &counters).await;
    }
    let (res, attempt_count) = with_retry(path.as_ref(), attempt_count_max, || {
        store.get_range(&path, range.clone())
    })
    .await;
    if let Ok(bytes) = &res {
        counters.received(bytes.len() as u64);
    }
    let expected_bytes = range.end - range.start;
    match res {
        Ok(bytes) if bytes.len() as u64 == expected_bytes => Ok(bytes),
        Ok(bytes) => Err(BlocksError::ShortObject {
            key: key.to_string(),
            expected_bytes,
            got_bytes: bytes.len() as u64,
        }),
        Err(object_store::Error::NotFound { .. }) => Err(BlocksError::ObjectMissing {
            key: key.to_string(),
        }),
        Err(source) => Err(BlocksError::Get {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            attempt_count,
            source,
        }),
    }
}

/// Reads a whole encoded object, decodes it and returns `range` of the
/// block (encoded objects have no byte-range correspondence).
async fn get_decoded(
    store: Arc<dyn ObjectStore>,
    codec: &Codec,
    attempt_count_max: u32,
    key: ObjectKey,
    range: Range<u64>,
    counters: &StoreCounters,
) -> Result<Bytes> {
    let path = key.to_path();
    let (res, attempt_count) = with_retry(path.as_ref(), attempt_count_max, || async {
        store.get(&path).await?.bytes().await
    })
    .await;
    if let Ok(bytes) = &res {
        counters.received(bytes.len() as u64);
    }
    let stored = match res {
        Ok(bytes) => bytes,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(BlocksError::ObjectMissing {
                key: key.to_string(),
            })
        }
        Err(source) => {
            return Err(BlocksError::Get {
                key: key.to_string(),
                start: range.start,
                end: range.end,
                attempt_count,
                source,
            })
        }
    };
    let block = codec.decode(path.as_ref(), &stored)?;
    let expected_bytes = range.end - range.start;
    match usize::try_from(range.start)
        .ok()
        .zip(usize::try_from(range.end).ok())
        .and_then(|(start, end)| block.get(start..end))
    {
        Some(bytes) => Ok(Bytes::copy_from_slice(bytes)),
        None => Err(BlocksError::ShortObject {
            key: key.to_string(),
            expected_bytes,
            got_bytes: (block.len() as u64).saturating_sub(range.start),
        }),
    }
}
