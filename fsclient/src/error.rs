//! The crate's one error type, [`Error`]: failures while preparing a volume
//! (bad input, every one with the fix in its message) and failures of a
//! filesystem operation (carrying the errno the FUSE reply gets).

use std::path::PathBuf;

use fuse_wire::Errno;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in fsclient.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The metadata engine failed (its errno comes from `MetaError::errno`).
    #[error(transparent)]
    Meta(Box<baton_meta::MetaError>),
    /// The data layer failed (its errno comes from `BlocksError::errno`).
    #[error(transparent)]
    Blocks(Box<baton_blocks::BlocksError>),
    /// A filesystem operation refused with a plain errno.
    #[error("inode {nodeid}: {what} ({errno})")]
    Refused {
        /// The inode concerned.
        nodeid: u64,
        /// Why.
        what: &'static str,
        /// The errno to reply with.
        errno: Errno,
    },
    /// The volume cannot be found, opened or locked (the message says
    /// what to fix).
    #[error(transparent)]
    Volume(Box<baton_volume::VolumeError>),
    /// The supervisor sent something other than an adoptable connection.
    #[error("handover from {socket} failed: {reason}; is the socket a Baton supervisor's?")]
    Handover {
        /// The socket connected to.
        socket: PathBuf,
        /// What was wrong.
        reason: &'static str,
    },
    /// The connection was negotiated with INIT flags this build does not
    /// serve (a newer build made the mount): serving it would silently
    /// drop what those flags promise the kernel.
    #[error("the FUSE connection was negotiated with INIT flags {unknown:#x} this fsclient does not know (a newer build made the mount); serve it with that build or newer, or unmount and mount again with this one")]
    UnknownInitFlags {
        /// The granted flags outside this build's.
        unknown: u64,
    },
    /// A planned handover cannot be made now; this generation serves on.
    #[error("handover refused: {0}")]
    HandoverRefused(String),
    /// Writing or reading a handover file failed.
    #[error("{what} at {path} failed: {source}; the upgrade rolls back, check that the directory is writable and has space")]
    HandoverIo {
        /// The step.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `BATON_FAULT` is malformed (test hooks).
    #[error("{0}")]
    Fault(String),
    /// The FUSE layer failed (mount, INIT, serving).
    #[error(transparent)]
    Fuse(Box<fuse_wire::Error>),
    /// The supervisor protocol failed.
    #[error(transparent)]
    Protocol(Box<upgrade_protocol::ProtocolError>),
    /// The last flush before exit could not upload everything: the data is
    /// safe in the staging directory and the next mount commits it.
    #[error("{files} file(s), {bytes} bytes of acknowledged writes are still staged in {dir} ({cause}); they are kept there, and the next mount of this volume commits them once the object store takes them")]
    LeftStaged {
        /// Files with staged data.
        files: usize,
        /// Their staged bytes.
        bytes: u64,
        /// The staging directory.
        dir: PathBuf,
        /// Why the upload failed (the first error).
        cause: String,
    },
}

impl From<baton_meta::MetaError> for Error {
    fn from(e: baton_meta::MetaError) -> Error {
        Error::Meta(Box::new(e))
    }
}

impl From<baton_blocks::BlocksError> for Error {
    fn from(e: baton_blocks::BlocksError) -> Error {
        Error::Blocks(Box::new(e))
    }
}

impl From<baton_volume::VolumeError> for Error {
    fn from(e: baton_volume::VolumeError) -> Error {
        Error::Volume(Box::new(e))
    }
}

impl From<fuse_wire::Error> for Error {
    fn from(e: fuse_wire::Error) -> Error {
        Error::Fuse(Box::new(e))
    }
}

impl From<upgrade_protocol::ProtocolError> for Error {
    fn from(e: upgrade_protocol::ProtocolError) -> Error {
        Error::Protocol(Box::new(e))
    }
}

impl Error {
    /// The process is fenced for a handover: abandon the request (the next
    /// generation answers it) rather than answer an error.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Meta(e) if matches!(**e, baton_meta::MetaError::Fenced { .. }))
    }

    /// A refusal with `errno`.
    pub fn refused(nodeid: u64, what: &'static str, errno: Errno) -> Error {
        Error::Refused {
            nodeid,
            what,
            errno,
        }
    }

    /// The errno a FUSE reply carries for this error.
    pub fn errno(&self) -> Errno {
        match self {
            Error::Meta(e) => Errno::from_raw(e.errno()),
            Error::Blocks(e) => Errno::from_raw(e.errno()),
            Error::Refused { errno, .. } => *errno,
            _ => Errno::EIO,
        }
    }
}
