//! Opening a volume: every check that must pass before mount(2), each
//! failure saying what to fix and changing nothing.
//!
//! Order of checks: metadata present (else "run `fsctl format`"),
//! metadata readable and ours, storage answering (its probe object is
//! deleted at once), then the lock ([`VolumePaths::lock_path`], flock held
//! for the process's life; the first file this creates), staging directory
//! writable, cache directory usable.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_blocks::{private_fs, BlockCache, BlockStore, BlocksError, KeyLayout, Staging};
use baton_meta::{MetaError, MetaStore, VolumeRecord};
use nix::fcntl::Flock;

use crate::lock::{take_lock, LockMode};
use crate::{VolumeError, VolumePaths};

type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// Default block cache capacity: 1 GiB.
pub const DEFAULT_CACHE_SIZE_BYTES: u64 = 1 << 30;

/// Local options of a volume.
#[derive(Clone, Debug, Default)]
pub struct VolumeOptions {
    /// Block cache directory (default: `DIR/cache`).
    pub cache_dir: Option<PathBuf>,
    /// Block cache capacity (default [`DEFAULT_CACHE_SIZE_BYTES`]). With
    /// neither a capacity nor `cache_dir`, a store that
    /// [`BlockStore::reads_in_place`] gets no cache.
    pub cache_size_bytes: Option<u64>,
    /// Staging directory (default: `DIR/staging`).
    pub staging_dir: Option<PathBuf>,
    /// S3 endpoint replacing the one the volume records (this host reaches
    /// the server under another address).
    pub s3_endpoint: Option<String>,
    /// S3 region replacing the one the volume records.
    pub s3_region: Option<String>,
    /// Key file of an encrypted volume.
    pub key_file: Option<PathBuf>,
    /// Passphrase file of a volume encrypted with a passphrase.
    pub passphrase_file: Option<PathBuf>,
}

/// An opened volume: its parts, and the lock held while it lives.
pub struct Volume {
    /// Name for logs and mount source.
    pub name: String,
    /// Metadata.
    pub meta: Arc<dyn MetaStore>,
    /// Object storage.
    pub store: Arc<BlockStore>,
    /// Local block cache.
    pub cache: BlockCache,
    /// Local write staging.
    pub staging: Staging,
    /// Block size of the volume.
    pub block_size_bytes: u64,
    /// Other hosts may serve the volume too (PostgreSQL metadata): orphans
    /// are not reclaimed at start (another host may have them open).
    pub shared: bool,
    /// The flock on `meta.db.lock`; released when the process exits.
    pub lock: Flock<File>,
}

impl Volume {
    /// Runs every check and opens the volume. Nothing in the volume changes
    /// when a check fails.
    pub fn open(paths: &VolumePaths, options: &VolumeOptions, mode: LockMode) -> Result<Volume> {
        let display = paths.display.clone();
        match &paths.sqlite_path {
            None => private_fs::create_dir_all(&paths.dir).map_err(|cause| VolumeError::Lock {
                volume: display.clone(),
                path: paths.dir.clone(),
                cause,
            })?,
            Some(path) if !path.exists() => {
                return Err(VolumeError::NotFormatted {
                    volume: display,
                    path: path.clone(),
                })
            }
            Some(_) => {}
        }
        // Generations of `fsclient serve` open beside the serving one.
        let open_meta = match mode {
            LockMode::Shared => baton_meta::open_beside_writer,
            LockMode::Exclusive => baton_meta::open,
        };
        let meta = open_meta(&paths.meta_url).map_err(|source| match source {
            MetaError::NotFormatted { path } => VolumeError::NotFormatted {
                volume: display.clone(),
                path,
            },
            source => VolumeError::MetaOpen {
                volume: display.clone(),
                cause: Box::new(source),
            },
        })?;
        let record = meta.volume();
        let storage_url = baton_blocks::with_s3_settings(
            &record.storage_url,
            options.s3_endpoint.as_deref(),
            options.s3_region.as_deref(),
        )
        .map_err(|source| VolumeError::StorageUnreachable {
            volume: display.clone(),
            url: record.storage_url.clone(),
            cause: Box::new(source),
        })?;
        let store = open_store(&display, &storage_url, options, key_layout(&record))?;
        // Read-only checks passed; from here on we write, so take the lock.
        let lock = take_lock(paths, mode)?;
        warn_if_shared(&display, &paths.dir);
        let block_size_bytes = u64::from(record.block_size_bytes);
        let staging_dir = options
            .staging_dir
            .clone()
            .unwrap_or_else(|| paths.dir.join("staging"));
        check_writable(&staging_dir)?;
        let local = |cause| VolumeError::Local {
            volume: display.clone(),
            cause: Box::new(cause),
        };
        let staging = Staging::open(&staging_dir, block_size_bytes).map_err(local)?;
        let cache_asked = options.cache_dir.is_some() || options.cache_size_bytes.is_some();
        let (cache, cache_shown) = if store.reads_in_place() && !cache_asked {
            (
                BlockCache::in_place(&store).map_err(local)?,
                "none (read in place)".to_string(),
            )
        } else {
            let dir = options
                .cache_dir
                .clone()
                .unwrap_or_else(|| paths.dir.join("cache"));
            let size = options.cache_size_bytes.unwrap_or(DEFAULT_CACHE_SIZE_BYTES);
            let cache = BlockCache::open(&dir, size, Arc::clone(&store)).map_err(local)?;
            (cache, dir.display().to_string())
        };
        tracing::info!(
            volume = %record.name,
            storage = %storage_url,
            block_size_bytes,
            staging = %staging_dir.display(),
            cache = %cache_shown,
            "volume opened"
        );
        Ok(Volume {
            name: record.name,
            meta: Arc::from(meta),
            store,
            cache,
            staging,
            block_size_bytes,
            shared: paths.is_shared(),
            lock,
        })
    }
}

/// Opens the object store with the key the volume needs: its passphrase
/// when it records a key derivation, else its key file (so a supervisor
/// environment may name both for different volumes).
fn open_store(
    volume: &str,
    url: &str,
    options: &VolumeOptions,
    layout: KeyLayout,
) -> Result<Arc<BlockStore>> {
    let unreachable = |source| VolumeError::StorageUnreachable {
        volume: volume.to_string(),
        url: url.to_string(),
        cause: Box::new(source),
    };
    let key_error = |source| VolumeError::StorageKey {
        volume: volume.to_string(),
        cause: Box::new(source),
    };
    let derived = baton_blocks::CodecSpec::split_url(url)
        .map(|(_, spec)| spec.kdf_salt.is_some())
        .unwrap_or(false);
    let key_source = match (&options.passphrase_file, &options.key_file) {
        (Some(file), None) => Some(baton_blocks::KeySource::Passphrase(file.clone())),
        (None, Some(file)) => Some(baton_blocks::KeySource::File(file.clone())),
        (Some(file), Some(_)) if derived => Some(baton_blocks::KeySource::Passphrase(file.clone())),
        (_, Some(file)) => Some(baton_blocks::KeySource::File(file.clone())),
        (None, None) => None,
    };
    let store =
        BlockStore::open_with_key_source(url, key_source.as_ref()).map_err(
            |source| match source {
                BlocksError::KeyNeeded { .. }
                | BlocksError::WrongKey { .. }
                | BlocksError::KeyKind { .. }
                | BlocksError::Key { .. } => key_error(source),
                other => unreachable(other),
            },
        )?;
    store.check_reachable().map_err(unreachable)?;
    Ok(Arc::new(store.with_key_layout(layout)))
}

/// How the keys of the volume's new block objects are spelled: fanned
/// from [`baton_meta::FANNED_KEYS_FORMAT_VERSION`] on; an older volume
/// keeps the per-inode layout the builds that made it read.
fn key_layout(volume: &VolumeRecord) -> KeyLayout {
    if volume.format_version >= baton_meta::FANNED_KEYS_FORMAT_VERSION {
        KeyLayout::Fanned
    } else {
        KeyLayout::PerInode
    }
}

/// Volumes made before Baton created everything owner-only have a 0755
/// directory with 0644 files in it: say so once per open, with the fix. The
/// mode is left alone (the operator may share it on purpose).
fn warn_if_shared(volume: &str, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(dir) else {
        return;
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            volume,
            dir = %dir.display(),
            mode = format_args!("{mode:o}"),
            "the volume's directory is open to other users, who may read its metadata, staging and cache: `chmod 700 {}` unless that is intended",
            dir.display()
        );
    }
}

/// Creates `dir` if needed and proves a file can be written in it.
fn check_writable(dir: &Path) -> Result<()> {
    let fail = |cause| VolumeError::StagingNotWritable {
        path: dir.to_path_buf(),
        cause,
    };
    private_fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    let written = private_fs::create_new(&probe).and_then(|mut f| f.write_all(b"probe"));
    let _ = std::fs::remove_file(&probe);
    match written {
        // Writable, and full: a takeover on a full disk must serve (reads,
        // and the staged data it holds), and writes hear ENOSPC.
        Err(e) if matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded) => {
            tracing::warn!(dir = %dir.display(), "staging directory is full: writes fail with ENOSPC until space is freed");
            Ok(())
        }
        written => written.map_err(fail),
    }
}
