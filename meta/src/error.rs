//! The crate's one error type, [`MetaError`], and its errno mapping.
//!
//! Every variant names the object (inode, entry name, path) and each message
//! says what to do next. [`MetaError::errno`] gives the value the FUSE layer
//! replies with.

use std::ffi::OsString;
use std::path::PathBuf;

/// Shorthand for results of this crate.
pub type Result<T, E = MetaError> = std::result::Result<T, E>;

/// Everything that can go wrong in the metadata engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// No metadata database at the path.
    #[error(
        "no Baton metadata database at {path}: create one with `fsctl format`, or check the path"
    )]
    NotFormatted {
        /// The path that was opened.
        path: PathBuf,
    },
    /// The database file, or the directory its log files go in, cannot be
    /// written (a read-only filesystem or mode): SQLite opens a WAL
    /// database for writing even to read it.
    #[error("metadata {path} cannot be written ({reason}): Baton needs it writable, with the directory it is in (for its -wal and -shm files); remount read-write or fix the mode")]
    ReadOnly {
        /// The file or directory that cannot be written.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// `format` found a file where the database should be created.
    #[error("{path} already exists: refusing to format over it; remove it or choose another path")]
    AlreadyFormatted {
        /// The existing file.
        path: PathBuf,
    },
    /// The file exists but is not a Baton metadata database.
    #[error("{path} is not a Baton metadata database ({reason}): check the path")]
    Foreign {
        /// The file opened.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The database was written by a newer Baton.
    #[error("metadata format version {found} is newer than the supported {supported}: upgrade Baton to open this volume")]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Highest version this build reads.
        supported: u32,
    },
    /// A URL scheme this build cannot open.
    #[error("unsupported metadata location {url:?}: use sqlite:///absolute/path/meta.db or a plain path")]
    UnsupportedUrl {
        /// The location given.
        url: String,
    },
    /// A volume parameter given to `format` is out of range.
    #[error("invalid volume configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// No such inode or entry (`ENOENT`).
    #[error("{}: not found", subject(*.ino, .name))]
    NotFound {
        /// The inode, or the parent directory when `name` is set.
        ino: u64,
        /// The entry name looked up in `ino`.
        name: Option<OsString>,
    },
    /// The entry already exists, or the xattr exists with `create` (`EEXIST`).
    #[error("{}: already exists", subject(*.ino, .name))]
    Exists {
        /// The parent directory, or the inode for an xattr.
        ino: u64,
        /// The entry or xattr name.
        name: Option<OsString>,
    },
    /// A directory was required (`ENOTDIR`).
    #[error("{}: not a directory", subject(*.ino, .name))]
    NotDirectory {
        /// The inode, or the parent when `name` is set.
        ino: u64,
        /// The entry name.
        name: Option<OsString>,
    },
    /// A non-directory was required (`EISDIR`).
    #[error("{}: is a directory", subject(*.ino, .name))]
    IsDirectory {
        /// The inode, or the parent when `name` is set.
        ino: u64,
        /// The entry name.
        name: Option<OsString>,
    },
    /// The directory still has entries (`ENOTEMPTY`).
    #[error("{}: directory not empty; remove its entries first", subject(*.ino, .name))]
    NotEmpty {
        /// The inode, or the parent when `name` is set.
        ino: u64,
        /// The entry name.
        name: Option<OsString>,
    },
    /// An argument is invalid for this inode (`EINVAL`).
    #[error("inode {ino}: invalid argument: {reason}")]
    InvalidArgument {
        /// The inode concerned.
        ino: u64,
        /// Why.
        reason: String,
    },
    /// The operation is not allowed on this inode (`EPERM`).
    #[error("inode {ino}: operation not permitted: {reason}")]
    NotPermitted {
        /// The inode concerned.
        ino: u64,
        /// Why.
        reason: String,
    },
    /// The inode's type does not support the operation (`EOPNOTSUPP`): an
    /// ACL on a symlink.
    #[error("inode {ino}: not supported: {reason}")]
    NotSupported {
        /// The inode concerned.
        ino: u64,
        /// Why.
        reason: String,
    },
    /// Refused as ext4 refuses it (`EACCES`): a default ACL on a file.
    #[error("inode {ino}: access denied: {reason}")]
    AccessDenied {
        /// The inode concerned.
        ino: u64,
        /// Why.
        reason: String,
    },
    /// A name longer than [`crate::limits::NAME_LEN_MAX`] (`ENAMETOOLONG`).
    #[error("name of {len_bytes} bytes in directory {parent} is longer than {max} bytes: use a shorter name")]
    NameTooLong {
        /// The directory.
        parent: u64,
        /// Length given.
        len_bytes: usize,
        /// Limit.
        max: usize,
    },
    /// No such extended attribute (`ENODATA`).
    #[error("inode {ino}: no extended attribute {name:?}")]
    NoXattr {
        /// The inode.
        ino: u64,
        /// The attribute name.
        name: OsString,
    },
    /// An xattr name or value over its limit (`E2BIG`, or `ERANGE` for names).
    #[error("inode {ino}: extended attribute {what} of {len_bytes} bytes exceeds {max} bytes")]
    XattrTooLarge {
        /// The inode.
        ino: u64,
        /// `"name"` or `"value"`.
        what: &'static str,
        /// Length given.
        len_bytes: usize,
        /// Limit.
        max: usize,
    },
    /// A per-inode or per-volume limit is full (`ENOSPC`).
    #[error("inode {ino}: no space: {reason}")]
    NoSpace {
        /// The inode.
        ino: u64,
        /// Which limit.
        reason: String,
    },
    /// The change would take a directory quota past its limit (`EDQUOT`);
    /// nothing of it was applied.
    #[error("quota on directory inode {quota}: {what} would be {would_be}, over its limit of {max}; free space under that directory or raise the limit (`fsctl quota set`)")]
    QuotaExceeded {
        /// The quota's directory.
        quota: u64,
        /// `"bytes"` or `"inodes"`.
        what: &'static str,
        /// The usage the change would have made.
        would_be: u64,
        /// The limit.
        max: u64,
    },
    /// A directory renamed across quota boundaries holds more than
    /// [`crate::limits::QUOTA_MOVE_INODES_MAX`] inodes (`EXDEV`: `mv`
    /// then copies and deletes, which quotas count as it goes).
    #[error("directory inode {ino} holds more than {max} inodes: too many to move across quota boundaries in one rename; copy and delete instead (mv does so by itself)")]
    QuotaMoveTooLarge {
        /// The directory.
        ino: u64,
        /// Limit.
        max: u64,
    },
    /// Link count would exceed [`crate::limits::NLINK_MAX`] (`EMLINK`).
    #[error("inode {ino}: too many links (max {max})")]
    TooManyLinks {
        /// The inode.
        ino: u64,
        /// Limit.
        max: u32,
    },
    /// A size past [`crate::limits::FILE_SIZE_BYTES_MAX`] (`EFBIG`).
    #[error("inode {ino}: size {size_bytes} exceeds the maximum file size")]
    FileTooLarge {
        /// The inode.
        ino: u64,
        /// The size asked for.
        size_bytes: u64,
    },
    /// `reclaim` of an inode that still has names (`EBUSY`).
    #[error(
        "inode {ino} still has {nlink} link(s): only orphans can be reclaimed; unlink it first"
    )]
    StillLinked {
        /// The inode.
        ino: u64,
        /// Its link count.
        nlink: u32,
    },
    /// A mutation carried a request key that is already recorded (`EIO`).
    /// The mutation was rolled back; look the result up with
    /// `completed_request` instead of re-executing.
    #[error("request {request_key} is already recorded as completed: use completed_request() for its result")]
    DuplicateRequest {
        /// The key.
        request_key: crate::types::RequestKey,
    },
    /// The store was fenced by [`crate::MetaStore::fence`] (`EIO`): this
    /// generation is handing over and may change nothing more. The request
    /// is answered by the next generation.
    #[error(
        "metadata is fenced for a handover: {op} refused; the next generation answers the request"
    )]
    Fenced {
        /// The refused operation.
        op: &'static str,
    },
    /// Stored data breaks an invariant (`EIO`); the database needs repair.
    #[error("metadata corrupt: {what}; restore from backup or run a consistency check")]
    Corrupt {
        /// What was found.
        what: String,
    },
    /// The store found its metadata corrupt earlier and takes no more
    /// changes (`EROFS`): see `quarantine.rs`.
    #[error("metadata found corrupt while serving ({what}): {op} refused, the volume serves reads only; unmount it and run `fsctl fsck`")]
    Quarantined {
        /// The refused operation.
        op: &'static str,
        /// The corruption first found.
        what: String,
    },
    /// A SQLite call failed (`EIO`, or `ENOSPC` for a full disk).
    #[error("metadata store error in {op}: {source}; check the disk and the database file")]
    Store {
        /// The operation that failed.
        op: &'static str,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// A PostgreSQL call failed (`EIO`).
    #[error("metadata store error in {op}: PostgreSQL: {message}; check that the server runs and accepts this client, and its log")]
    Postgres {
        /// The operation that failed.
        op: &'static str,
        /// SQLSTATE, when the server sent one (`40001`: serialization failure).
        code: Option<String>,
        /// What the server or client library said.
        message: String,
    },
    /// A file-system call on the database path failed (`EIO`).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn subject(ino: u64, name: &Option<OsString>) -> String {
    match name {
        Some(n) => format!("entry {n:?} in directory {ino}"),
        None => format!("inode {ino}"),
    }
}

impl From<rusqlite::Error> for MetaError {
    fn from(source: rusqlite::Error) -> MetaError {
        MetaError::Store { op: "", source }
    }
}

impl MetaError {
    /// The errno the FUSE layer should reply with (positive value).
    pub fn errno(&self) -> i32 {
        match self {
            MetaError::NotFound { .. } => libc::ENOENT,
            MetaError::Exists { .. } | MetaError::AlreadyFormatted { .. } => libc::EEXIST,
            MetaError::NotDirectory { .. } => libc::ENOTDIR,
            MetaError::IsDirectory { .. } => libc::EISDIR,
            MetaError::NotEmpty { .. } => libc::ENOTEMPTY,
            MetaError::InvalidArgument { .. }
            | MetaError::InvalidConfig { .. }
            | MetaError::UnsupportedUrl { .. } => libc::EINVAL,
            MetaError::NotPermitted { .. } => libc::EPERM,
            MetaError::NotSupported { .. } => libc::EOPNOTSUPP,
            MetaError::AccessDenied { .. } => libc::EACCES,
            MetaError::NameTooLong { .. } => libc::ENAMETOOLONG,
            MetaError::NoXattr { .. } => libc::ENODATA,
            MetaError::XattrTooLarge { what: "name", .. } => libc::ERANGE,
            MetaError::XattrTooLarge { .. } => libc::E2BIG,
            MetaError::NoSpace { .. } => libc::ENOSPC,
            MetaError::TooManyLinks { .. } => libc::EMLINK,
            MetaError::QuotaExceeded { .. } => libc::EDQUOT,
            MetaError::QuotaMoveTooLarge { .. } => libc::EXDEV,
            MetaError::FileTooLarge { .. } => libc::EFBIG,
            MetaError::StillLinked { .. } => libc::EBUSY,
            MetaError::Store { source, .. } if is_disk_full(source) => libc::ENOSPC,
            // The operation log's append on a full disk.
            MetaError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                libc::ENOSPC
            }
            MetaError::Quarantined { .. } => libc::EROFS,
            MetaError::NotFormatted { .. }
            | MetaError::ReadOnly { .. }
            | MetaError::Foreign { .. }
            | MetaError::UnsupportedVersion { .. }
            | MetaError::DuplicateRequest { .. }
            | MetaError::Fenced { .. }
            | MetaError::Corrupt { .. }
            | MetaError::Store { .. }
            | MetaError::Postgres { .. }
            | MetaError::Io { .. } => libc::EIO,
        }
    }

    /// Fills in the operation name of a [`MetaError::Store`] made by `?`.
    pub(crate) fn in_op(self, op: &'static str) -> MetaError {
        match self {
            MetaError::Store { op: "", source } => MetaError::Store { op, source },
            MetaError::Postgres {
                op: "",
                code,
                message,
            } => MetaError::Postgres { op, code, message },
            other => other,
        }
    }

    /// Whether this error shows the stored metadata is damaged: a broken
    /// invariant, a SQLite page that cannot be read (`SQLITE_CORRUPT`,
    /// `SQLITE_NOTADB`), or PostgreSQL's data or index corruption
    /// (SQLSTATE XX001, XX002).
    pub fn is_corruption(&self) -> bool {
        match self {
            MetaError::Corrupt { .. } => true,
            MetaError::Store { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
            ),
            MetaError::Postgres {
                code: Some(code), ..
            } => code == "XX001" || code == "XX002",
            _ => false,
        }
    }

    /// SQLite found no room on its disk (not a quota's or a limit's
    /// ENOSPC).
    pub(crate) fn is_disk_full(&self) -> bool {
        match self {
            MetaError::Store { source, .. } => is_disk_full(source),
            MetaError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            _ => false,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> MetaError {
        MetaError::Corrupt { what: what.into() }
    }

    pub(crate) fn invalid(ino: u64, reason: impl Into<String>) -> MetaError {
        MetaError::InvalidArgument {
            ino,
            reason: reason.into(),
        }
    }
}

fn is_disk_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}
