//! Finding and opening a volume: where its metadata, cache and staging
//! live, the one-mount-per-host lock, and every check that must pass before
//! mount(2) (each failure says what to fix and changes nothing).
//!
//! Order of checks: mountpoint (a directory, empty), metadata present (else
//! "run `fsctl format`"), metadata readable and ours, storage answering
//! (its probe object is deleted at once), then the lock (`meta.db.lock`,
//! flock held for the process's life; the first file this creates), staging
//! directory writable, cache directory usable.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_blocks::{BlockCache, BlockStore, BlocksError, KeyLayout, Staging};
use baton_meta::{Location, MetaError, MetaStore, VolumeRecord};
use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// Default base directory of named volumes.
pub const DEFAULT_BASE_DIR: &str = "/var/lib/baton";
/// Default block cache capacity: 1 GiB.
pub const DEFAULT_CACHE_SIZE_BYTES: u64 = 1 << 30;

/// Where a volume's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePaths {
    /// The volume as given (a name or a URL), for messages.
    pub display: String,
    /// The metadata URL handed to `baton_meta::open`.
    pub meta_url: String,
    /// The metadata database file.
    pub meta_path: PathBuf,
    /// The directory holding the metadata (defaults are relative to it);
    /// for a PostgreSQL volume, this host's local state of the mount.
    pub dir: PathBuf,
    /// The metadata is on a server other hosts may mount too (PostgreSQL).
    pub shared: bool,
}

impl VolumePaths {
    /// Resolves `volume`: a name (`BASE/NAME/meta.db`) or a metadata URL
    /// (`sqlite:///path/meta.db`, or `postgres://user@host:port/db`, whose
    /// local state — lock, staging, cache — is `BASE/pg-DB`).
    pub fn resolve(volume: &str, base_dir: &Path) -> Result<VolumePaths> {
        let bad = |reason| Error::BadVolume {
            volume: baton_meta::postgres::redact_url(volume),
            reason,
        };
        if baton_meta::postgres::is_postgres_url(volume) {
            let db = baton_meta::postgres::database_name(volume).ok_or_else(|| {
                bad("a PostgreSQL URL names its database: postgres://user@host:port/DB")
            })?;
            let dir = base_dir.join(format!("pg-{db}"));
            return Ok(VolumePaths {
                display: baton_meta::postgres::redact_url(volume),
                meta_url: volume.to_string(),
                meta_path: dir.join("meta.db"),
                dir,
                shared: true,
            });
        }
        if volume.contains("://") || volume.starts_with("sqlite:") {
            let Location::Sqlite(path) = Location::parse(volume)
                .map_err(|_| bad("only sqlite:///absolute/path URLs are supported"))?;
            let dir = path
                .parent()
                .map(Path::to_path_buf)
                .ok_or_else(|| bad("the URL names no file"))?;
            return Ok(VolumePaths {
                display: volume.to_string(),
                meta_url: volume.to_string(),
                meta_path: path,
                dir,
                shared: false,
            });
        }
        if volume.is_empty() || volume.contains('/') || volume == "." || volume == ".." {
            return Err(bad("a volume name is one path component"));
        }
        let dir = base_dir.join(volume);
        let meta_path = dir.join("meta.db");
        Ok(VolumePaths {
            display: volume.to_string(),
            meta_url: meta_path.display().to_string(),
            meta_path,
            dir,
            shared: false,
        })
    }

    /// The lock file next to the metadata (for a shared volume: in this
    /// host's local state directory, one mount per directory).
    pub fn lock_path(&self) -> PathBuf {
        if self.shared {
            return self.dir.join("mount.lock");
        }
        let mut name = self.meta_path.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }
}

/// Local options of a volume.
#[derive(Clone, Debug)]
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

/// Who else may hold the volume lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// `fsclient mount`: the only server of the volume on this host.
    Exclusive,
    /// `fsclient serve`: generations of one supervisor may overlap during a
    /// planned upgrade, but a `mount` of the same volume is refused.
    Shared,
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

/// Checks that `path` exists, is a directory and is empty.
pub fn check_mountpoint(path: &Path) -> Result<()> {
    let problem = |problem: String, fix| Error::Mountpoint {
        path: path.to_path_buf(),
        problem,
        fix,
    };
    let meta = std::fs::metadata(path).map_err(|e| {
        problem(
            format!("cannot be used: {e}"),
            "create it with `mkdir -p` or pick another path",
        )
    })?;
    if !meta.is_dir() {
        return Err(problem(
            "is not a directory".into(),
            "mount on an empty directory",
        ));
    }
    let mut entries = std::fs::read_dir(path).map_err(|e| {
        problem(
            format!("cannot be listed: {e}"),
            "mount on an empty directory you can read",
        )
    })?;
    if entries.next().is_some() {
        return Err(problem(
            "is not empty".into(),
            "mount on an empty directory (or move its contents away)",
        ));
    }
    Ok(())
}

impl Volume {
    /// Runs every check and opens the volume. Nothing in the volume changes
    /// when a check fails.
    pub fn open(paths: &VolumePaths, options: &VolumeOptions, mode: LockMode) -> Result<Volume> {
        let display = paths.display.clone();
        if paths.shared {
            std::fs::create_dir_all(&paths.dir).map_err(|cause| Error::Lock {
                volume: display.clone(),
                path: paths.dir.clone(),
                cause,
            })?;
        } else if !paths.meta_path.exists() {
            return Err(Error::NotFormatted {
                volume: display,
                path: paths.meta_path.clone(),
            });
        }
        let meta = baton_meta::open(&paths.meta_url).map_err(|source| match source {
            MetaError::NotFormatted { path } => Error::NotFormatted {
                volume: display.clone(),
                path,
            },
            source => Error::MetaOpen {
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
        .map_err(|source| Error::StorageUnreachable {
            volume: display.clone(),
            url: record.storage_url.clone(),
            cause: Box::new(source),
        })?;
        let store = open_store(&display, &storage_url, options, key_layout(&record))?;
        // Read-only checks passed; from here on we write, so take the lock.
        let lock = take_lock(paths, mode)?;
        let block_size_bytes = u64::from(record.block_size_bytes);
        let staging_dir = options
            .staging_dir
            .clone()
            .unwrap_or_else(|| paths.dir.join("staging"));
        check_writable(&staging_dir)?;
        let staging = Staging::open(&staging_dir, block_size_bytes)?;
        let cache_asked = options.cache_dir.is_some() || options.cache_size_bytes.is_some();
        let (cache, cache_shown) = if store.reads_in_place() && !cache_asked {
            (
                BlockCache::in_place(&store)?,
                "none (read in place)".to_string(),
            )
        } else {
            let dir = options
                .cache_dir
                .clone()
                .unwrap_or_else(|| paths.dir.join("cache"));
            let size = options.cache_size_bytes.unwrap_or(DEFAULT_CACHE_SIZE_BYTES);
            let cache = BlockCache::open(&dir, size, Arc::clone(&store))?;
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
            shared: paths.shared,
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
    let unreachable = |source| Error::StorageUnreachable {
        volume: volume.to_string(),
        url: url.to_string(),
        cause: Box::new(source),
    };
    let key_error = |source| Error::StorageKey {
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

/// Creates `dir` if needed and proves a file can be written in it.
fn check_writable(dir: &Path) -> Result<()> {
    let fail = |cause| Error::StagingNotWritable {
        path: dir.to_path_buf(),
        cause,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    let written = File::create(&probe).and_then(|mut f| f.write_all(b"probe"));
    let _ = std::fs::remove_file(&probe);
    written.map_err(fail)
}

/// Takes the volume lock; a conflict names the pid recorded in the file.
fn take_lock(paths: &VolumePaths, mode: LockMode) -> Result<Flock<File>> {
    let path = paths.lock_path();
    let io_err = |cause| Error::Lock {
        volume: paths.display.clone(),
        path: path.clone(),
        cause,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err)?;
    let arg = match mode {
        LockMode::Exclusive => FlockArg::LockExclusiveNonblock,
        LockMode::Shared => FlockArg::LockSharedNonblock,
    };
    match Flock::lock(file, arg) {
        Ok(mut locked) => {
            let pid = std::process::id().to_string();
            let written = locked
                .set_len(0)
                .and_then(|()| locked.rewind())
                .and_then(|()| locked.write_all(pid.as_bytes()));
            written.map_err(io_err)?;
            Ok(locked)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            Err(Error::AlreadyMounted {
                volume: paths.display.clone(),
                pid: text.trim().parse().unwrap_or(0),
                path: path.clone(),
            })
        }
        Err((_, errno)) => Err(io_err(std::io::Error::from(errno))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_under_the_base_dir_and_urls_to_their_file() {
        let p = VolumePaths::resolve("vol", Path::new("/b")).unwrap();
        assert_eq!(p.meta_path, PathBuf::from("/b/vol/meta.db"));
        assert_eq!(p.dir, PathBuf::from("/b/vol"));
        assert_eq!(p.lock_path(), PathBuf::from("/b/vol/meta.db.lock"));
        let u = VolumePaths::resolve("sqlite:///x/y/meta.db", Path::new("/b")).unwrap();
        assert_eq!(u.meta_path, PathBuf::from("/x/y/meta.db"));
        assert_eq!(u.dir, PathBuf::from("/x/y"));
        let pg = VolumePaths::resolve("postgres://u:pw@h:5432/vol_1", Path::new("/b")).unwrap();
        assert_eq!(pg.dir, PathBuf::from("/b/pg-vol_1"));
        assert_eq!(pg.lock_path(), PathBuf::from("/b/pg-vol_1/mount.lock"));
        assert_eq!(pg.display, "postgres://u:***@h:5432/vol_1");
        assert!(pg.shared);
    }

    #[test]
    fn bad_volume_arguments_are_refused() {
        for bad in [
            "",
            "a/b",
            "..",
            "postgres://h",
            "postgres://h/",
            "mysql://h/db",
            "sqlite://rel/x.db",
        ] {
            let err = VolumePaths::resolve(bad, Path::new("/b")).unwrap_err();
            assert!(matches!(err, Error::BadVolume { .. }), "{bad}: {err}");
        }
    }
}
