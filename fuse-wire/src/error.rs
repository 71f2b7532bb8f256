//! The one error type of fuse-wire.

use std::path::PathBuf;

use nix::errno::Errno;

use crate::request::DecodeError;

/// Errors of mounting, initializing and serving a FUSE connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// /dev/fuse could not be opened.
    #[error("cannot open /dev/fuse: {errno}; load the fuse module and run as root (or give the container /dev/fuse)")]
    OpenDevice {
        /// The errno of open(2).
        errno: Errno,
    },
    /// The mountpoint is missing or unreadable.
    #[error("mountpoint {path}: {source}; create it (mkdir -p) or pick another path")]
    Mountpoint {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The mountpoint cannot take a mount.
    #[error("mountpoint {path} {problem}; {fix}")]
    UnusableMountpoint {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// What to do.
        fix: &'static str,
    },
    /// mount(2) failed.
    #[error("mount of FUSE at {path} failed: {errno}; check that the path is a directory and that you are root")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The errno of mount(2).
        errno: Errno,
    },
    /// umount2(2) failed.
    #[error("unmount of {path} failed: {errno}")]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// The errno of umount2(2).
        errno: Errno,
    },
    /// The path has no FUSE mount on it.
    #[error("{path} is not a mountpoint in /proc/self/mountinfo")]
    NotMounted {
        /// The path.
        path: PathBuf,
    },
    /// The kernel speaks a FUSE major version we do not.
    #[error("kernel offers FUSE protocol {major}.{minor}; Baton speaks 7.x")]
    UnsupportedProtocol {
        /// Kernel major.
        major: u32,
        /// Kernel minor.
        minor: u32,
    },
    /// The first request on a fresh connection was not INIT.
    #[error("expected FUSE_INIT but got opcode {opcode} (unique {unique:#x}); is another process serving this connection?")]
    NotInit {
        /// The opcode received.
        opcode: u32,
        /// Its unique.
        unique: u64,
    },
    /// The connection ended (unmounted or aborted).
    #[error("FUSE connection ended: {errno}")]
    ConnectionEnded {
        /// ENODEV (unmounted) or ECONNABORTED (aborted).
        errno: Errno,
    },
    /// A request could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// poll(2) or the eventfd failed.
    #[error("polling /dev/fuse failed: {0}")]
    Poll(Errno),
    /// Installing the worker kick signal handler failed.
    #[error("cannot install the SIGUSR2 handler that stops FUSE workers: {0}")]
    Signal(Errno),
    /// A worker thread could not be spawned.
    #[error("cannot spawn a FUSE worker thread: {0}")]
    Spawn(std::io::Error),
    /// The workers' read buffers could not be mapped.
    #[error("cannot map {bytes} bytes of FUSE read buffers: {errno}; give the generation more memory (its cgroup limit) or fewer worker threads")]
    ReadBuffers {
        /// Bytes asked for.
        bytes: usize,
        /// The errno of mmap(2).
        errno: Errno,
    },
    /// A notification was refused.
    #[error("FUSE notification refused by the kernel: {0}")]
    Notify(std::io::Error),
}
