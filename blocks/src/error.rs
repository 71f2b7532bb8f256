//! The one error type of `baton-blocks`, [`BlocksError`], and its mapping to
//! the errno a FUSE reply should carry.
//!
//! Every variant names the object, path or inode it concerns and, where an
//! operator can act, the next step.

use std::path::PathBuf;

/// Convenience alias used throughout the crate.
pub type Result<T, E = BlocksError> = std::result::Result<T, E>;

/// Errors from the block store, the block cache and the write staging area.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlocksError {
    /// The object store URL uses a scheme this build does not support.
    #[error("unsupported scheme in object store URL {url:?}: use file:///absolute/dir, s3://BUCKET/PREFIX or memory://")]
    UnsupportedScheme {
        /// The URL as given.
        url: String,
    },

    /// The object store URL could not be understood.
    #[error("invalid object store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The object store did not answer a probe (or could not be opened).
    #[error("object store {url} is unreachable: {summary}; {hint}")]
    StorageUnreachable {
        /// The store URL.
        url: String,
        /// The innermost cause, or the server's error code and message.
        summary: String,
        /// The next step, from what the store said.
        hint: &'static str,
        /// The underlying object store error (its chain repeats itself, so
        /// it is summarized above rather than printed as a source).
        cause: Box<object_store::Error>,
    },

    /// The S3 client could not be built from the URL and the environment.
    #[error("cannot set up S3 storage {url}: {source}; check the URL (s3://BUCKET/PREFIX?endpoint=URL&region=NAME) and the AWS_* environment variables")]
    S3Config {
        /// The store URL.
        url: String,
        /// What object_store said.
        #[source]
        source: object_store::Error,
    },

    /// The object store did not answer a probe in time.
    #[error("object store {url} did not answer within {timeout_ms} ms; check that the endpoint is reachable from this host (and, for S3, that credentials are available without waiting for an instance metadata service)")]
    StorageTimeout {
        /// The store URL.
        url: String,
        /// How long we waited.
        timeout_ms: u64,
    },

    /// A key file is unusable.
    #[error("key file {path} {reason}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The volume is encrypted and no key was given.
    #[error("the objects of {url} are encrypted: give the volume's key file with --key-file (or BATON_KEY_FILE), or its passphrase with --passphrase-file (or BATON_PASSPHRASE_FILE)")]
    KeyNeeded {
        /// The store URL.
        url: String,
    },

    /// A key file was given for a passphrase volume, or the reverse.
    #[error("wrong kind of key for {url}: {reason}")]
    KeyKind {
        /// The store URL.
        url: String,
        /// Which kind the volume needs.
        reason: String,
    },

    /// The key given is not the volume's.
    #[error("the key does not match the one {url} was formatted with (a wrong key file or passphrase): give the volume's own; nothing was read or written")]
    WrongKey {
        /// The store URL.
        url: String,
    },

    /// A stored object cannot be decoded (decrypted or decompressed).
    #[error("object {key} cannot be decoded: {reason}")]
    Decode {
        /// Object key.
        key: String,
        /// Why.
        reason: String,
    },

    /// Uploading a block object failed, after retries when the error was transient.
    #[error("upload of object {key} failed after {attempt_count} attempt(s): {source}; the data is still staged and the upload can be retried")]
    Put {
        /// Object key.
        key: String,
        /// Attempts made.
        attempt_count: u32,
        /// Last error.
        #[source]
        source: object_store::Error,
    },

    /// Reading a block object failed, after retries when the error was transient.
    #[error("read of object {key} bytes {start}..{end} failed after {attempt_count} attempt(s): {source}")]
    Get {
        /// Object key.
        key: String,
        /// First byte requested.
        start: u64,
        /// One past the last byte requested.
        end: u64,
        /// Attempts made.
        attempt_count: u32,
        /// Last error.
        #[source]
        source: object_store::Error,
    },

    /// A block object referenced by metadata does not exist in the store.
    #[error("object {key} is missing from the store although metadata references it; the file's data is lost, check the store and run a metadata/object consistency check")]
    ObjectMissing {
        /// Object key.
        key: String,
    },

    /// A block object is shorter than metadata says.
    #[error("object {key} returned {got_bytes} bytes where {expected_bytes} were expected; the object or its metadata is corrupt")]
    ShortObject {
        /// Object key.
        key: String,
        /// Length metadata recorded.
        expected_bytes: u64,
        /// Length actually returned.
        got_bytes: u64,
    },

    /// A string is not a valid block object key.
    #[error(
        "invalid object key {key:?}: expected blocks/{{ino:016x}}/{{index:08x}}-{{unique:016x}}"
    )]
    InvalidKey {
        /// The offending string.
        key: String,
    },

    /// A caller passed an argument outside the supported range.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What was wrong.
        what: String,
    },

    /// The staging filesystem is out of space (ENOSPC or EDQUOT).
    #[error("staging directory {dir} is full: the write was not applied and earlier staged data is intact; free space on that filesystem or let dirty files flush, then retry")]
    StagingFull {
        /// Staging root directory.
        dir: PathBuf,
    },

    /// Any other I/O error in the staging area.
    #[error("staging I/O error during {op} on {path}: {source}")]
    StagingIo {
        /// What was being done.
        op: &'static str,
        /// File or directory concerned.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The staging area holds a record that fails its checks.
    #[error("staging record {path} is corrupt: {reason}; move the staging directory aside and inspect it before restarting")]
    StagingCorrupt {
        /// Record file.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },

    /// Writing a block object's file in a local store's directory failed.
    #[error("writing block object file {path} failed: {source}; check free space and permissions of the volume's data directory")]
    ObjectFileWrite {
        /// The object's file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Reading a block object's file in a local store's directory failed.
    #[error("reading block object file {path} failed: {source}; check the volume's data directory and its disk")]
    ObjectFileIo {
        /// The object's file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// An I/O error in the block cache directory.
    #[error("block cache I/O error during {op} on {path}: {source}")]
    CacheIo {
        /// What was being done.
        op: &'static str,
        /// File or directory concerned.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The caller-provided base reader (committed content of a block) failed.
    #[error("reading committed content of inode {ino} block {index} failed: {source}")]
    BaseRead {
        /// Inode.
        ino: u64,
        /// Block index.
        index: u64,
        /// Caller's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The internal tokio runtime could not be started.
    #[error("could not start the block I/O runtime: {source}")]
    Runtime {
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl BlocksError {
    /// A [`BlocksError::StorageUnreachable`] for `url` from `cause`, with a
    /// summary and a next step read from what the store said.
    pub(crate) fn unreachable(url: &str, cause: object_store::Error) -> Self {
        let text = error_chain_text(&cause);
        tracing::debug!(url, error = %text, "object store unreachable");
        BlocksError::StorageUnreachable {
            url: url.to_string(),
            summary: summarize(&text, &cause),
            hint: unreachable_hint(&text),
            cause: Box::new(cause),
        }
    }
}

/// Every message of an error chain, joined. Pure.
fn error_chain_text(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// The S3 `<Code>`/`<Message>` when the server sent one, else the innermost
/// cause of the chain. Pure.
fn summarize(text: &str, err: &dyn std::error::Error) -> String {
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{name}>"))? + start;
        Some(text[start..end].to_string())
    };
    if let Some(code) = tag("Code") {
        return match tag("Message") {
            Some(message) => format!("the server answered {code}: {message}"),
            None => format!("the server answered {code}"),
        };
    }
    let mut innermost: &dyn std::error::Error = err;
    while let Some(cause) = innermost.source() {
        innermost = cause;
    }
    innermost.to_string()
}

/// The next step for an operator, from the text of a failed probe. Pure.
pub(crate) fn unreachable_hint(error_text: &str) -> &'static str {
    let has = |needle: &str| error_text.contains(needle);
    if has("NoSuchBucket") || has("bucket does not exist") {
        "the bucket does not exist: create it (e.g. `aws s3 mb s3://BUCKET`) or fix the bucket name"
    } else if has("InvalidAccessKeyId")
        || has("SignatureDoesNotMatch")
        || has("AccessDenied")
        || has("403 Forbidden")
        || has("credential")
    {
        "the credentials were refused: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) and the bucket policy"
    } else if has("error sending request") || has("connect") || has("timed out") {
        "the endpoint does not answer: check its URL, that the server runs and that this host can reach it"
    } else {
        "check that it exists and is writable, then retry"
    }
}

impl BlocksError {
    /// The errno a FUSE reply should carry for this error (positive value).
    pub fn errno(&self) -> i32 {
        match self {
            BlocksError::StagingFull { .. } => libc::ENOSPC,
            BlocksError::InvalidArgument { .. } | BlocksError::InvalidKey { .. } => libc::EINVAL,
            BlocksError::StagingIo { source, .. }
            | BlocksError::CacheIo { source, .. }
            | BlocksError::ObjectFileIo { source, .. }
            | BlocksError::ObjectFileWrite { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            // A local-directory store on a full disk: the writer hears
            // "no space", not an I/O error.
            BlocksError::Put { source, .. } if Self::chain_is_no_space(source) => libc::ENOSPC,
            BlocksError::StorageUnreachable { .. } => libc::EIO,
            _ => libc::EIO,
        }
    }

    /// Whether an I/O error with ENOSPC/EDQUOT is somewhere in `err`'s
    /// chain of sources.
    pub(crate) fn chain_is_no_space(err: &(dyn std::error::Error + 'static)) -> bool {
        let mut next = Some(err);
        while let Some(err) = next {
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(Self::is_no_space)
            {
                return true;
            }
            next = err.source();
        }
        false
    }

    /// Whether an I/O error means the filesystem is out of space.
    pub(crate) fn is_no_space(err: &std::io::Error) -> bool {
        matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    }

    /// Staging I/O error constructor that turns ENOSPC/EDQUOT into
    /// [`BlocksError::StagingFull`].
    pub(crate) fn staging(
        dir: &std::path::Path,
        op: &'static str,
        path: &std::path::Path,
        source: std::io::Error,
    ) -> Self {
        if Self::is_no_space(&source) {
            BlocksError::StagingFull {
                dir: dir.to_path_buf(),
            }
        } else {
            BlocksError::StagingIo {
                op,
                path: path.to_path_buf(),
                source,
            }
        }
    }

    /// Cache I/O error constructor.
    pub(crate) fn cache(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        BlocksError::CacheIo {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}
