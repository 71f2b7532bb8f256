//! Volumes on the embedded default: where a named volume lives under the
//! base directory, and formatting one (metadata in SQLite, data in a local
//! directory, or the URLs the user gives).

use std::path::{Path, PathBuf};

use baton_meta::VolumeConfig;

/// Where Baton keeps volumes, the supervisor state and caches by default.
pub const DEFAULT_BASE_DIR: &str = "/var/lib/baton";
/// Block size of a new volume unless told otherwise.
pub const DEFAULT_BLOCK_SIZE_BYTES: u32 = 4 << 20;

/// Errors of formatting a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The name cannot be a directory name.
    #[error("volume name `{name}` is invalid: use letters, digits, `-`, `_` and `.` (not starting with `.`)")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// A directory could not be created.
    #[error("cannot create {path}: {source}; check permissions or pick another --base-dir")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The metadata engine refused.
    #[error(transparent)]
    Meta(#[from] baton_meta::MetaError),
    /// The data store does not answer.
    #[error(transparent)]
    Storage(#[from] baton_blocks::BlocksError),
    /// Both a key file and a passphrase were given.
    #[error("give either an encryption key file or a passphrase file, not both")]
    TwoKeys,
}

/// The default locations of volume `name` under `base`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePaths {
    /// `BASE/NAME`.
    pub dir: PathBuf,
    /// `sqlite:///BASE/NAME/meta.db`.
    pub meta_url: String,
    /// `file:///BASE/NAME/data`.
    pub storage_url: String,
}

impl VolumePaths {
    /// Paths of volume `name` under `base`, after checking the name.
    pub fn new(base: &Path, name: &str) -> Result<Self, VolumeError> {
        let valid = !name.is_empty()
            && !name.starts_with('.')
            && name.len() <= 128
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            return Err(VolumeError::InvalidName {
                name: name.to_string(),
            });
        }
        let dir = base.join(name);
        Ok(VolumePaths {
            meta_url: format!("sqlite://{}", dir.join("meta.db").display()),
            storage_url: format!("file://{}", dir.join("data").display()),
            dir,
        })
    }
}

/// What `format` should create.
#[derive(Debug, Clone)]
pub struct FormatRequest {
    /// Volume name.
    pub name: String,
    /// Base directory for defaults.
    pub base_dir: PathBuf,
    /// Metadata URL; default `sqlite:///BASE/NAME/meta.db`.
    pub meta_url: Option<String>,
    /// Storage URL; default `file:///BASE/NAME/data`.
    pub storage_url: Option<String>,
    /// S3 endpoint recorded in an `s3://` storage URL (custom servers).
    pub s3_endpoint: Option<String>,
    /// S3 region recorded in an `s3://` storage URL.
    pub s3_region: Option<String>,
    /// Block size in bytes.
    pub block_size_bytes: u32,
    /// Compress objects with LZ4.
    pub compression: bool,
    /// Encrypt objects with the key in this file (32 bytes, raw or hex).
    pub key_file: Option<PathBuf>,
    /// Encrypt objects with a key derived (Argon2id, random salt recorded
    /// in the volume) from the passphrase in this file. Not with `key_file`.
    pub passphrase_file: Option<PathBuf>,
}

/// What was created.
#[derive(Debug, Clone)]
pub struct Formatted {
    /// The metadata URL to mount.
    pub meta_url: String,
    /// Where the data goes.
    pub storage_url: String,
}

/// Creates a volume: checks the storage answers (creating a local data
/// directory; an S3 bucket must exist and accept the credentials), then
/// writes the metadata. Refuses an existing volume. Nothing is written to
/// the metadata when the storage check fails.
pub fn format(request: &FormatRequest) -> Result<Formatted, VolumeError> {
    let defaults = VolumePaths::new(&request.base_dir, &request.name)?;
    let meta_url = request.meta_url.clone().unwrap_or(defaults.meta_url);
    let storage_url = baton_blocks::with_s3_settings(
        request
            .storage_url
            .as_deref()
            .unwrap_or(&defaults.storage_url),
        request.s3_endpoint.as_deref(),
        request.s3_region.as_deref(),
    )?;
    if let Some(meta_path) = meta_url.strip_prefix("sqlite://") {
        create_dir(Path::new(meta_path).parent().unwrap_or(Path::new("/")))?;
    }
    if let Some(data_dir) = storage_url.strip_prefix("file://") {
        create_dir(Path::new(data_dir))?;
    }
    let (key, kdf_salt) = match (&request.key_file, &request.passphrase_file) {
        (Some(file), None) => (Some(baton_blocks::read_key_file(file)?), None),
        (None, Some(file)) => {
            let passphrase = baton_blocks::read_passphrase_file(file)?;
            let salt = baton_blocks::new_salt()?;
            let key = baton_blocks::derive_key(&passphrase, &salt)?;
            (Some(key), Some(salt))
        }
        (None, None) => (None, None),
        (Some(_), Some(_)) => return Err(VolumeError::TwoKeys),
    };
    let codec = baton_blocks::CodecSpec {
        compress: request.compression,
        key_check: key.as_ref().map(baton_blocks::key_check),
        kdf_salt,
    };
    let storage_url = codec.add_to_url(&storage_url);
    baton_blocks::BlockStore::open_with_key(&storage_url, key.as_ref())?.check_reachable()?;
    let config = VolumeConfig {
        name: request.name.clone(),
        storage_url: storage_url.clone(),
        block_size_bytes: request.block_size_bytes,
    };
    let meta = baton_meta::format(&meta_url, &config)?;
    tracing::info!(
        volume = %meta.volume().name,
        meta_url = %baton_meta::postgres::redact_url(&meta_url),
        %storage_url,
        "volume formatted"
    );
    Ok(Formatted {
        meta_url,
        storage_url,
    })
}

fn create_dir(path: &Path) -> Result<(), VolumeError> {
    std::fs::create_dir_all(path).map_err(|source| VolumeError::CreateDir {
        path: path.to_path_buf(),
        source,
    })
}
