//! The /dev/fuse open file: reading requests and writing replies.
//!
//! A [`Channel`] wraps an fd that may be shared with other processes (the
//! supervisor, the previous generation) through SCM_RIGHTS: the same open
//! file description, so a reply to a request read by any of them is
//! accepted. The fd stays in blocking mode: O_NONBLOCK is shared by every
//! copy, so setting it here would change every other holder.
//!
//! A channel can be *sealed* for a handover: from then on replies are
//! dropped, not written, so a request this process still works on is left
//! for the next generation (which answers it from the in-flight journal).
//! Notifications and reads are unaffected.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::errno::Errno;

use crate::reply::ReplyChannel;

/// What a read from the device produced besides a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// Nothing to do this time (interrupted, or a request vanished); retry.
    Retry,
    /// The filesystem was unmounted or the connection aborted: stop for good.
    Ended(Errno),
}

/// One open /dev/fuse file description.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
    sealed: AtomicBool,
    sealed_drops: AtomicU64,
}

impl Channel {
    /// Wraps an fd of /dev/fuse that is already mounted.
    pub fn new(fd: OwnedFd) -> Self {
        Channel {
            fd,
            sealed: AtomicBool::new(false),
            sealed_drops: AtomicU64::new(0),
        }
    }

    /// Drops every later reply instead of writing it (handover).
    pub fn seal(&self) {
        self.sealed.store(true, Ordering::SeqCst);
    }

    /// Writes replies again (the handover was rolled back).
    pub fn unseal(&self) {
        self.sealed.store(false, Ordering::SeqCst);
    }

    /// Replies dropped because the channel was sealed.
    pub fn sealed_drops(&self) -> u64 {
        self.sealed_drops.load(Ordering::Relaxed)
    }

    /// The fd, e.g. to pass a copy to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reads one request into `buf` (which must hold max_write plus a page).
    pub fn receive(&self, buf: &mut [u8]) -> ReadOutcome {
        match nix::unistd::read(self.fd.as_fd(), buf) {
            Ok(len) => ReadOutcome::Request(len),
            // EINTR: kicked by a stop signal. ENOENT: the request was
            // interrupted before we got it. EAGAIN: someone set O_NONBLOCK.
            Err(Errno::EINTR | Errno::ENOENT | Errno::EAGAIN) => ReadOutcome::Retry,
            Err(errno) => ReadOutcome::Ended(errno),
        }
    }

    /// Writes one whole message.
    pub fn write_message(&self, message: &[IoSlice<'_>]) -> std::io::Result<()> {
        let expected: usize = message.iter().map(|s| s.len()).sum();
        let written =
            nix::sys::uio::writev(self.fd.as_fd(), message).map_err(std::io::Error::from)?;
        if written != expected {
            return Err(std::io::Error::other(format!(
                "short write to /dev/fuse: {written} of {expected} bytes (fd {})",
                self.fd.as_raw_fd()
            )));
        }
        Ok(())
    }
}

impl ReplyChannel for Channel {
    fn send(&self, message: &[IoSlice<'_>]) -> std::io::Result<()> {
        if self.sealed.load(Ordering::SeqCst) {
            self.sealed_drops.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.write_message(message)
    }
}
