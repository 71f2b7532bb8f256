//! Formatting a volume: metadata in SQLite and data in a local directory
//! under the base directory by default, or the URLs the user gives.

use std::path::{Path, PathBuf};

use baton_blocks::private_fs;
use baton_meta::VolumeConfig;

use crate::{VolumeError, VolumePaths};

/// Block size of a new volume unless told otherwise.
pub const DEFAULT_BLOCK_SIZE_BYTES: u32 = 4 << 20;

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
    /// Create missing parent directories of a metadata path or data
    /// directory the user named (the defaults under the base directory are
    /// always created).
    pub create_dirs: bool,
}

impl FormatRequest {
    /// Volume `name` under `base_dir` with every default: metadata in
    /// SQLite and data in a local directory there, blocks of
    /// [`DEFAULT_BLOCK_SIZE_BYTES`], no compression, no encryption.
    pub fn new(name: &str, base_dir: &Path) -> FormatRequest {
        FormatRequest {
            name: name.to_string(),
            base_dir: base_dir.to_path_buf(),
            meta_url: None,
            storage_url: None,
            s3_endpoint: None,
            s3_region: None,
            block_size_bytes: DEFAULT_BLOCK_SIZE_BYTES,
            compression: false,
            key_file: None,
            passphrase_file: None,
            create_dirs: false,
        }
    }
}

/// What was created.
#[derive(Debug, Clone)]
pub struct Formatted {
    /// The metadata URL to mount.
    pub meta_url: String,
    /// The same, its password masked: what messages show.
    pub meta_display: String,
    /// Where the data goes.
    pub storage_url: String,
}

/// Creates a volume: checks the storage answers (creating a local data
/// directory; an S3 bucket must exist and accept the credentials), then
/// writes the metadata. Refuses an existing volume. Nothing is written to
/// the metadata when the storage check fails.
pub fn format(request: &FormatRequest) -> Result<Formatted, VolumeError> {
    let name = &request.name;
    let defaults = VolumePaths::named(name, &request.base_dir)?;
    let storage_err = |cause| VolumeError::FormatStorage {
        volume: name.clone(),
        cause: Box::new(cause),
    };
    let meta_url = request
        .meta_url
        .clone()
        .unwrap_or(defaults.meta_url.clone());
    let default_storage_url = defaults.default_storage_url();
    let storage_url = baton_blocks::with_s3_settings(
        request
            .storage_url
            .as_deref()
            .unwrap_or(&default_storage_url),
        request.s3_endpoint.as_deref(),
        request.s3_region.as_deref(),
    )
    .map_err(storage_err)?;
    if let Some(meta_path) = meta_url.strip_prefix("sqlite://") {
        let meta_dir = Path::new(meta_path).parent().unwrap_or(Path::new("/"));
        if request.meta_url.is_some() && !request.create_dirs {
            require_dir(meta_dir, "the metadata file")?;
        }
        create_dir(meta_dir)?;
    }
    if let Some(data_dir) = storage_url.strip_prefix("file://") {
        let data_dir = Path::new(data_dir);
        if request.storage_url.is_some() && !request.create_dirs {
            require_dir(
                data_dir.parent().unwrap_or(Path::new("/")),
                "the data directory",
            )?;
        }
        create_dir(data_dir)?;
    }
    let (key, kdf_salt) = match (&request.key_file, &request.passphrase_file) {
        (Some(file), None) => (
            Some(baton_blocks::read_key_file(file).map_err(storage_err)?),
            None,
        ),
        (None, Some(file)) => {
            let passphrase = baton_blocks::read_passphrase_file(file).map_err(storage_err)?;
            let salt = baton_blocks::new_salt().map_err(storage_err)?;
            let key = baton_blocks::derive_key(&passphrase, &salt).map_err(storage_err)?;
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
    baton_blocks::BlockStore::open_with_key(&storage_url, key.as_ref())
        .and_then(|store| store.check_reachable())
        .map_err(storage_err)?;
    let config = VolumeConfig {
        name: request.name.clone(),
        storage_url: storage_url.clone(),
        block_size_bytes: request.block_size_bytes,
    };
    let meta = baton_meta::format(&meta_url, &config).map_err(|cause| VolumeError::Meta {
        volume: name.clone(),
        cause: Box::new(cause),
    })?;
    let meta_display = baton_meta::postgres::redact_url(&meta_url);
    tracing::info!(
        volume = %meta.volume().name,
        meta_url = %meta_display,
        %storage_url,
        "volume formatted"
    );
    Ok(Formatted {
        meta_url,
        meta_display,
        storage_url,
    })
}

/// A directory the user's path needs but did not name is not created
/// unless asked: a typo must not leave directories behind.
fn require_dir(dir: &Path, what: &'static str) -> Result<(), VolumeError> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    Err(VolumeError::MissingDir {
        path: dir.to_path_buf(),
        what,
    })
}

fn create_dir(path: &Path) -> Result<(), VolumeError> {
    private_fs::create_dir_all(path).map_err(|cause| VolumeError::CreateDir {
        path: path.to_path_buf(),
        cause,
    })
}
