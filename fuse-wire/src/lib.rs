//! Baton's FUSE protocol layer: the kernel ABI, pure decode and encode, and
//! a stoppable multi-threaded read loop that serves a `/dev/fuse` connection
//! it did not necessarily open or initialize.
//!
//! # Brief overview
//! - [`abi`]: protocol 7.45 structs and constants (incl. RESEND).
//! - [`NodeId`], [`FileHandle`], [`LockOwner`] and flag sets such as
//!   [`SetattrValid`] or [`FallocateFlags`]: the typed fields of those
//!   structs (`#[repr(transparent)]`, same bytes). The request arguments
//!   and reply payloads a [`Filesystem`] handles are re-exported here
//!   ([`SetattrIn`], [`EntryOut`], ...), so a filesystem need not reach
//!   into [`abi`].
//! - [`Request`] / [`Operation`]: one request decoded, raw bytes and `unique`
//!   still available (for an in-flight journal).
//! - [`reply`]: typed replies consumed by value; any unique can be answered.
//! - [`notify`]: RESEND, inval_inode, inval_entry, delete.
//! - [`mount_fuse`], [`initialize`]: mount and answer INIT, as two steps.
//! - [`Session`]: serves a [`Filesystem`] on an initialized connection with
//!   several workers; [`Stopper`] stops them between requests.
//!
//! # Invariants
//! - INIT is answered once per connection. A generation that adopts a
//!   connection gets the [`InitParams`] from whoever answered it, and never
//!   reads INIT.
//! - Nothing here unmounts, replies or aborts in `Drop`.
//! - The device fd stays blocking: O_NONBLOCK would be shared with every
//!   other holder of the open file description.
//! - No default method answers ENOSYS (the kernel remembers it for the
//!   mount's life).
//! - fuse-wire knows nothing of generations, journals or storage.
//!
//! # Example
//! ```no_run
//! # fn demo<F: fuse_wire::Filesystem>(fs: F) -> Result<(), fuse_wire::Error> {
//! use std::sync::Arc;
//! let fd = fuse_wire::mount_fuse("/mnt/x".as_ref(), &Default::default())?;
//! let channel = Arc::new(fuse_wire::Channel::new(fd));
//! let params = fuse_wire::initialize(&channel, &fuse_wire::InitConfig::baton())?;
//! let session = fuse_wire::Session::new(channel, params, Arc::new(fs));
//! let workers = session.start(4)?;
//! workers.join();
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod abi;
mod channel;
mod dispatch;
mod error;
mod filesystem;
mod init;
mod mount;
pub mod mountinfo;
pub mod notify;
pub mod reply;
mod request;
mod request_buffer;
mod session;
mod types;

pub use abi::{
    Attr, AttrOut, BmapIn, CopyFileRangeIn, CreateIn, EntryOut, FallocateIn, FileLock, FlushIn,
    ForgetOne, FsyncIn, IoctlIn, Kstatfs, LkIn, LseekIn, MkdirIn, MknodIn, OpenIn, PollIn, ReadIn,
    ReleaseIn, SetattrIn, SetxattrIn, StatxIn, WriteIn,
};
pub use channel::{Channel, ReadOutcome};
pub use dispatch::{dispatch, expects_reply};
pub use error::Error;
pub use filesystem::{Filesystem, DEFAULT_POLL_MASK};
pub use init::{initialize, negotiate, read_buffer_len, InitConfig, InitParams};
pub use mount::{
    abort_connection, check_mountpoint, connection_id, is_mountpoint, mount_fuse, raise_read_ahead,
    unmount, MountOptions, READ_AHEAD_KIB,
};
pub use nix::errno::Errno;
pub use request::{unique_key, DecodeError, DecodeOptions, Operation, Request};
pub use request_buffer::RequestBuffer;
pub use session::{
    adopt, handle_request, ExitReason, IdleWorkers, Session, Stopper, Workers, KICK_SIGNAL,
    WORKERS_MAX,
};
pub use types::{
    FallocateFlags, FileHandle, FopenFlags, FsyncFlags, GetattrFlags, LkFlags, LockOwner, NodeId,
    OpenInFlags, ReadFlags, ReleaseFlags, RenameFlags, SetattrValid, WriteFlags,
};
