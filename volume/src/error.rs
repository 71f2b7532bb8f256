//! The crate's one error type. Every message names the volume and says
//! what to do next; a failed check changes nothing in the volume.

use std::path::PathBuf;

/// Everything that can go wrong finding, formatting, opening or checking
/// a volume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    /// The volume string names no volume.
    #[error(transparent)]
    BadVolume(#[from] upgrade_protocol::VolumeSpecError),
    /// `fsctl format` and `fsctl up` take a volume name, not a URL.
    #[error("volume name `{name}` is invalid: use letters, digits, `-`, `_` and `.` (not starting with `.`, at most 128)")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// No metadata database where the volume should be.
    #[error("volume {volume} is not formatted (no metadata at {path}): run `fsctl format {volume}` first, or check --base-dir")]
    NotFormatted {
        /// The volume as given.
        volume: String,
        /// Where the metadata was looked for.
        path: PathBuf,
    },
    /// Another process serves this volume on this host.
    #[error("volume {volume} is already mounted (pid {pid}); unmount it first (lock file {path})")]
    AlreadyMounted {
        /// The volume.
        volume: String,
        /// The pid recorded in the lock file (0 if unreadable).
        pid: u32,
        /// The lock file.
        path: PathBuf,
    },
    /// fsck or gc found the volume served on this host.
    #[error("volume {volume} is mounted on this host (lock {lock} is held): unmount it first, or run `fsctl gc --dry-run` to only report")]
    Mounted {
        /// The volume.
        volume: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// The lock file next to the metadata cannot be opened or locked.
    #[error(
        "cannot lock volume {volume} with {path}: {cause}; check that the directory is writable"
    )]
    Lock {
        /// The volume.
        volume: String,
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The staging directory cannot take writes.
    #[error("staging directory {path} is not writable: {cause}; pass --staging-dir with a writable local directory")]
    StagingNotWritable {
        /// The staging directory.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The volume's objects are encrypted and the key is missing, wrong or
    /// unreadable.
    #[error("volume {volume}: {cause}")]
    StorageKey {
        /// The volume.
        volume: String,
        /// The data layer's error (it says which key to give).
        cause: Box<baton_blocks::BlocksError>,
    },
    /// The storage named by the volume record does not answer.
    #[error("storage {url} of volume {volume} does not answer: {cause}")]
    StorageUnreachable {
        /// The volume.
        volume: String,
        /// The storage URL from the volume record.
        url: String,
        /// The data layer's error (it says what to check).
        cause: Box<baton_blocks::BlocksError>,
    },
    /// The storage could not be listed (fsck, gc).
    #[error("storage of volume {volume}: {cause}")]
    Storage {
        /// The volume.
        volume: String,
        /// The data layer's error.
        cause: Box<baton_blocks::BlocksError>,
    },
    /// The metadata cannot be opened (corrupt, foreign or newer).
    #[error("metadata of volume {volume} cannot be opened: {cause}")]
    MetaOpen {
        /// The volume.
        volume: String,
        /// The metadata engine's error (it says what to do).
        cause: Box<baton_meta::MetaError>,
    },
    /// The metadata could not be read or written.
    #[error("metadata of volume {volume}: {cause}")]
    Meta {
        /// The volume.
        volume: String,
        /// The metadata engine's error.
        cause: Box<baton_meta::MetaError>,
    },
    /// The local staging area or block cache failed to open.
    #[error("local state of volume {volume}: {cause}")]
    Local {
        /// The volume.
        volume: String,
        /// The data layer's error.
        cause: Box<baton_blocks::BlocksError>,
    },
    /// `fsctl format` was given something it cannot use (a bad storage
    /// URL, an unreadable key file, ...).
    #[error("formatting volume {volume}: {cause}")]
    FormatStorage {
        /// The volume.
        volume: String,
        /// The data layer's error (it says what to fix).
        cause: Box<baton_blocks::BlocksError>,
    },
    /// A directory could not be created.
    #[error("cannot create {path}: {cause}; check permissions or pick another --base-dir")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A path the user gave lies in a directory that does not exist.
    #[error("directory {path} for {what} does not exist: check the path, create it, or pass --create-dirs")]
    MissingDir {
        /// The missing directory.
        path: PathBuf,
        /// What was to go in it.
        what: &'static str,
    },
    /// Both a key file and a passphrase were given.
    #[error("give either an encryption key file or a passphrase file, not both")]
    TwoKeys,
}
