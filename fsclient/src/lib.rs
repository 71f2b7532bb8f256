//! `fsclient`: serves a Baton volume as a complete POSIX filesystem over
//! FUSE (through `fuse-wire`). Metadata lives in `baton-meta` (SQLite);
//! file data lives as fixed-size immutable block objects in object storage
//! (`baton-blocks`), read through a bounded local block cache, and written
//! through a local staging area.
//!
//! This crate is glue (style: like ripgrep's core): it owns no format of its
//! own and decides only how the pieces meet.
//!
//! # Brief overview
//! - [`fs::BatonFs`]: implements [`fuse_wire::Filesystem`]; nodeid = inode
//!   number, so nothing maps ids and every server generation understands
//!   every nodeid the kernel holds.
//! - [`handles`]: open handles and open counts (unlinked-but-open files).
//! - [`idle_trim`]: an idle generation gives freed heap memory back.
//! - [`locks`]: the POSIX/flock lock table; SETLKW parks, never blocks.
//! - [`runtime`]: `fsclient mount` and `fsclient serve` (adopting a
//!   supervisor's connection), signals and orderly shutdown.
//! - [`cli`]: the command line. [`Error`]: the crate's error type.
//!
//! # Invariants
//! - **Durability.** An acknowledged WRITE is in the staging area (a local
//!   file written with pwrite) before its reply, so it survives a kill -9 of
//!   this process. FLUSH (every close), FSYNC, RELEASE, SYNCFS and shutdown
//!   upload the staged blocks and commit the block map and size in ONE
//!   metadata transaction, then clear staging, then delete replaced
//!   objects. At start, staged data a dead process left is committed before
//!   serving. The protocol is documented where it happens, in
//!   `fs/flush.rs`. Note: with the kernel's writeback cache (negotiated), a
//!   buffered write(2) sits in the kernel page cache until the kernel writes
//!   it back (close, fsync, sync_file_range, memory pressure or its flusher
//!   thread); only then does fsclient receive, stage and acknowledge it.
//!   The kernel then also owns the file's mtime and ctime (set at the
//!   write, sent in a SETATTR at the close or fsync): a commit leaves them.
//!   Without it (a volume other hosts share) the commit dates them.
//! - Reads see staged bytes over committed ones; holes cost nothing.
//! - Writes, truncations and flushes of one inode are serialized by a
//!   per-inode (striped) mutex; different files proceed in parallel.
//! - An unlinked inode stays readable and writable while any mount of the
//!   volume (this one, another generation of it, another host) has it
//!   open; every mount is a session with a heartbeat, and the last session
//!   to let go of an orphan reclaims it (staging discarded, metadata
//!   deleted, objects deleted). A dead mount's session expires and the
//!   others reclaim what it held (`fs/orphans.rs`, [`session`]).
//! - No operation ever answers ENOSYS; every failure maps to an errno from
//!   `MetaError::errno` or `BlocksError::errno`.
//! - Locks live in this process only; a new generation starts without them.
//! - **Exactly once.** Non-idempotent mutations record their result under
//!   (connection, unique) in their own transaction; a resent or journaled
//!   request that an earlier generation committed is answered from the
//!   record (`fs/once.rs`).
//! - Handle numbers carry the generation that issued them in their high
//!   bits, so a new generation never reissues a number the kernel holds.
//!   After a crash (handles not handed over) the new generation continues
//!   the same session and keeps every orphan it holds until the mount ends:
//!   the kernel may still have them open.
//!
//! # Example
//! ```no_run
//! # fn demo() -> Result<(), fsclient::Error> {
//! use std::path::Path;
//! use std::sync::Arc;
//! use fsclient::fs::{BatonFs, FsConfig};
//! use baton_volume::{LockMode, Volume, VolumeOptions, VolumePaths};
//!
//! let paths = VolumePaths::resolve("vol", Path::new("/var/lib/baton"))?;
//! let options = VolumeOptions {
//!     cache_dir: None,
//!     cache_size_bytes: None,
//!     staging_dir: None,
//!     s3_endpoint: None,
//!     s3_region: None,
//!     key_file: None,
//!     passphrase_file: None,
//! };
//! let volume = Volume::open(&paths, &options, LockMode::Exclusive)?;
//! let (fs, _lock) = BatonFs::from_volume(volume, FsConfig::default());
//! fs.recover(true)?; // commit what a dead process left staged
//! let fd = fuse_wire::mount_fuse(Path::new("/mnt/vol"), &Default::default())?;
//! let channel = Arc::new(fuse_wire::Channel::new(fd));
//! let params = fuse_wire::initialize(&channel, &fuse_wire::InitConfig::baton())?;
//! fs.set_init(&params);
//! let workers = fuse_wire::Session::new(channel, params, Arc::new(fs)).start(4)?;
//! workers.join();
//! # Ok(()) }
//! ```

pub mod cli;
mod error;
pub mod fault;
pub mod fs;
pub mod generation;
pub mod handles;
pub mod idle_trim;
pub mod locks;
pub mod runtime;
pub mod session;

pub use error::{Error, Result};
