//! `baton-blocks` is the data layer of Baton's POSIX filesystem: file data
//! cut into fixed-size blocks, stored as immutable objects in an
//! `object_store::ObjectStore`, cached on local disk, and staged durably on
//! local disk between an acknowledged write and its upload.
//!
//! # Brief overview
//!
//! - [`ObjectKey`]: `blocks/{ino:016x}/{index:08x}-{unique:016x}`, fresh per
//!   upload, so objects are never overwritten.
//! - [`BlockStore`]: synchronous put / ranged get / delete / reachability
//!   probe over an object store ([`store_from_url`]: `file://`, `s3://`
//!   ([`S3Location`]), `memory://`), with bounded retries, bounded parallel
//!   uploads and multipart upload of large blocks.
//! - [`BlockCache`]: bounded on-disk LRU cache of whole blocks keyed by
//!   object key, surviving restarts, with background prefetch; or, in
//!   front of a local directory store, none: objects are read in place
//!   (`in_place.rs`).
//! - [`Staging`]: per-inode staged block files and size record that make an
//!   acknowledged write survive process death, and the take/clear halves of
//!   a flush ([`UploadSet`]).
//! - [`Codec`]: optional LZ4 compression and ChaCha20-Poly1305 encryption
//!   of objects at rest ([`CodecSpec`]: recorded in the storage URL).
//! - [`FaultyStore`]: a fault-injecting wrapper (slow, erroring,
//!   unreachable) that [`BlockStore::open`] puts around the backend when
//!   `BATON_STORAGE_FAULT` is set, for chaos tests.
//! - [`BlocksError`]: the crate's one error type, with [`BlocksError::errno`].
//!
//! # Architecture invariants
//!
//! - This crate knows nothing of FUSE or SQLite. Callers pass inode numbers,
//!   block indices and object keys; the metadata engine maps
//!   (inode, block index) to (object key, length).
//! - Objects are immutable: a key is written once, never overwritten, so the
//!   cache needs eviction but no invalidation.
//! - The API is synchronous, for FUSE worker threads. [`BlockStore`] owns a
//!   2-thread tokio runtime and `block_on`s it; never call it from inside an
//!   async runtime.
//! - A staged block file always holds the complete new content of its block
//!   up to its length; staging is cleared only after the caller committed
//!   metadata, so a crash between any two flush steps loses nothing.
//! - Every queue, retry and parallelism has a named `*_MAX` const.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use baton_blocks::{BlockCache, BlockStore, Staging};
//!
//! # fn main() -> Result<(), baton_blocks::BlocksError> {
//! let tmp = std::env::temp_dir().join(format!("baton-blocks-doc-{}", std::process::id()));
//! let store = Arc::new(BlockStore::open("memory://")?);
//! store.check_reachable()?;
//! let cache = BlockCache::open(&tmp.join("cache"), 64 << 20, store.clone())?;
//! let staging = Staging::open(&tmp.join("staging"), 4 << 20)?;
//!
//! // A FUSE WRITE: staged on disk before it is acknowledged.
//! staging.write(7, 0, b"hello", &|_index| Ok(None))?;
//!
//! // Flush: upload, commit metadata (caller), then clear.
//! let set = staging.take_for_upload(7)?;
//! let blocks = set.blocks.iter().map(|b| (7, b.index, b.data.clone())).collect();
//! let keys = store.put_blocks(blocks)?;
//! // ... the caller commits (7, index) -> (key, len) and the size here ...
//! staging.clear(&set)?;
//!
//! // A later READ goes through the cache.
//! assert_eq!(&cache.read(&keys[0], 5, 0, 5)?[..], b"hello");
//! # drop(cache);
//! # std::fs::remove_dir_all(&tmp).ok();
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod cache;
mod codec;
mod error;
mod faulty_store;
mod in_place;
mod key;
mod local_put;
mod op_stats;
mod passphrase;
pub mod private_fs;
mod s3;
mod staging;
mod store;

pub use cache::{
    BlockCache, CacheStats, CACHE_ENTRY_COUNT_MAX, PARTIAL_FILE_AGE_S_MIN, PREFETCH_QUEUE_MAX,
    PREFETCH_WORKER_COUNT,
};
pub use codec::{key_check, read_key_file, Codec, CodecSpec, CODEC_PARAMS, KEY_BYTES};
pub use error::{BlocksError, Result};
pub use faulty_store::{FaultyStore, StorageFaults, FAULT_DELAY_MS_MAX, STORAGE_FAULT_ENV};
pub use in_place::OPEN_OBJECT_FILES_MAX;
pub use key::{inline_key, KeyLayout, ObjectKey, KEY_PREFIX};
pub use op_stats::{StoreOp, StoreOpSnapshot, StoreStats, STORE_LATENCY_BOUNDS_US};
pub use passphrase::{
    derive_key, key_for, new_salt, read_passphrase_file, KeySource, KDF_ARGON2ID,
};
pub use s3::{
    with_s3_settings, S3Location, S3_BACKOFF_MS_INITIAL, S3_BACKOFF_MS_MAX, S3_CONNECT_TIMEOUT_MS,
    S3_REQUEST_TIMEOUT_MS, S3_RETRY_COUNT_MAX, S3_RETRY_WINDOW_MS_MAX,
};
pub use staging::{
    Overlay, OverlaySegment, StagedBlock, StagedSize, Staging, UploadSet, BLOCK_SIZE_BYTES_MAX,
    FILE_SIZE_BYTES_MAX, OVERLAY_READ_BYTES_MAX, STAGING_LOCK_STRIPE_COUNT, STAGING_RETIRE_DELAY,
    UPLOAD_SET_BLOCK_COUNT_MAX,
};
pub use store::{
    store_from_url, BlockStore, StoredObject, DELETE_PARALLEL_MAX, MULTIPART_PARALLEL_MAX,
    MULTIPART_PART_BYTES, MULTIPART_THRESHOLD_BYTES, PROBE_PREFIX, PROBE_TIMEOUT_MS,
    RETRY_ATTEMPT_COUNT_MAX, RETRY_BACKOFF_MS_INITIAL, RETRY_BACKOFF_MS_MAX,
    RUNTIME_BLOCKING_THREAD_COUNT_MAX, RUNTIME_WORKER_COUNT, UPLOAD_PARALLEL_MAX,
};
