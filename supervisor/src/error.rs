//! The supervisor's error type: every failure names the object (path,
//! mountpoint, generation) and, where there is one, the next step.

use std::path::PathBuf;

use nix::errno::Errno;

/// Errors of the supervisor daemon and of fsctl's client side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A unix socket this supervisor binds would have a path longer than
    /// the kernel's limit.
    #[error("{what} {path} is {len} bytes long; a unix socket path holds at most {max} (`sun_path`): give a shorter {flag}")]
    SocketPathTooLong {
        /// Which socket.
        what: &'static str,
        /// Its (longest) path.
        path: std::path::PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
        /// The option to change.
        flag: &'static str,
    },
    /// A FUSE request timeout is configured in the kernel.
    #[error("/proc/sys/fs/fuse/{name} is {value_s} s: a kernel request timeout aborts the whole mount when a handover takes longer; set it to 0 (`sysctl -w fs.fuse.{name}=0`) before starting fs-supervisor")]
    RequestTimeout {
        /// The sysctl name.
        name: &'static str,
        /// Its value in seconds.
        value_s: u64,
    },
    /// `--kubernetes` cannot run (not built in, or no node name).
    #[error("--kubernetes: {0}")]
    Kubernetes(String),
    /// A file or directory operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{op} failed: {errno}")]
    Sys {
        /// Which call, and on what.
        op: String,
        /// The errno.
        errno: Errno,
    },
    /// `--memory-max` was given but no memory cgroup controller is mounted.
    #[error("--memory-max needs a memory cgroup, but neither cgroup v2 with the memory controller nor a cgroup v1 memory hierarchy is mounted under {root}")]
    NoMemoryCgroup {
        /// Where cgroups were looked for.
        root: PathBuf,
    },
    /// Another supervisor answers on the control socket.
    #[error(
        "another fs-supervisor already answers on {path}; stop it first or pass another --socket"
    )]
    AlreadyRunning {
        /// The socket.
        path: PathBuf,
    },
    /// Another process holds the state directory (`state_lock.rs`).
    #[error("state directory {dir} is in use by {holder}: talk to that supervisor with its --socket, or give this one a --state-dir of its own")]
    StateDirInUse {
        /// The state directory.
        dir: PathBuf,
        /// Who holds it, as it recorded itself.
        holder: String,
    },
    /// The control protocol failed.
    #[error("talking to fs-supervisor at {path}: {source}")]
    Protocol {
        /// The socket.
        path: PathBuf,
        /// The cause.
        source: upgrade_protocol::ProtocolError,
    },
    /// The FUSE layer failed (mount, INIT, unmount).
    #[error(transparent)]
    Fuse(#[from] fuse_wire::Error),
    /// Taking the mounts over from a stopping supervisor failed.
    #[error(transparent)]
    Succession(#[from] crate::daemon::succession::SuccessionError),
}

impl Error {
    /// An [`Error::Io`] for `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }

    /// An [`Error::Sys`] for `op`.
    pub fn sys(op: impl Into<String>) -> impl FnOnce(Errno) -> Error {
        let op = op.into();
        move |errno| Error::Sys { op, errno }
    }
}
