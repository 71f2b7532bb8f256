//! FUSE_INIT: negotiating the connection once, and the parameters every
//! later generation adopts without ever seeing INIT again.
//!
//! INIT flags are fixed for the life of the mount, so [`InitConfig::baton`]
//! asks for everything any later version may want. FUSE_REQUEST_TIMEOUT is
//! never negotiated: a kernel timeout aborts the whole mount during a
//! handover gap.

use crate::abi::{self, init_flags as f};
use crate::channel::{Channel, ReadOutcome};
use crate::reply::send_message;
use crate::request::{DecodeOptions, Operation, Request};
use crate::Error;
use zerocopy::IntoBytes;

/// What this side asks for at INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitConfig {
    /// Flags wanted (`flags | flags2 << 32`); the kernel grants a subset.
    pub flags: u64,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Largest number of pages in one request.
    pub max_pages: u16,
    /// Background requests (readahead, writeback) in flight at most.
    pub max_background: u16,
    /// Background requests before the kernel marks the bdi congested.
    pub congestion_threshold: u16,
    /// Timestamp granularity in nanoseconds.
    pub time_gran: u32,
}

impl InitConfig {
    /// Everything a later Baton version may want, fixed for the mount's life:
    /// 1 MiB writes, async reads, parallel dirops, readdirplus, writeback
    /// cache, POSIX and flock locks served by the filesystem, RESEND, and
    /// set-user-ID/set-group-ID cleared by the filesystem
    /// (`HANDLE_KILLPRIV_V2`: the server clears them on the WRITE, SETATTR
    /// and OPEN that carry a kill flag). Without that last one the kernel
    /// asks for `security.capability` (a GETXATTR round trip) on every
    /// `write(2)`, even one the writeback cache absorbs; with it the
    /// superblock is `SB_NOSEC` and it asks once per inode until the
    /// attributes are next refreshed. POSIX ACLs are enforced by the
    /// kernel and kept by the filesystem (`POSIX_ACL`), which also applies
    /// the umask and inherits default ACLs at creation (`DONT_MASK`: the
    /// kernel passes the umask instead of applying it).
    pub fn baton() -> Self {
        InitConfig {
            flags: f::ASYNC_READ
                | f::POSIX_LOCKS
                | f::ATOMIC_O_TRUNC
                | f::BIG_WRITES
                | f::FLOCK_LOCKS
                | f::AUTO_INVAL_DATA
                | f::DO_READDIRPLUS
                | f::READDIRPLUS_AUTO
                | f::ASYNC_DIO
                | f::WRITEBACK_CACHE
                | f::PARALLEL_DIROPS
                | f::ABORT_ERROR
                | f::MAX_PAGES
                | f::CACHE_SYMLINKS
                | f::SETXATTR_EXT
                | f::INIT_EXT
                | f::HAS_EXPIRE_ONLY
                | f::DIRECT_IO_ALLOW_MMAP
                | f::HAS_RESEND
                | f::HANDLE_KILLPRIV_V2
                | f::POSIX_ACL
                | f::DONT_MASK,
            max_write: 1 << 20,
            max_pages: 256,
            max_background: 64,
            congestion_threshold: 48,
            time_gran: 1,
        }
    }

    /// Like [`InitConfig::baton`] but with locks, set-user-ID clearing and
    /// the umask left to the kernel, no ACLs, no writeback cache and no AUTO_INVAL_DATA (which
    /// costs a GETATTR per read once attributes expire): for simple
    /// filesystems that keep no lock table and whose data changes only
    /// through the mount.
    pub fn simple() -> Self {
        let mut config = Self::baton();
        config.flags &= !(f::POSIX_LOCKS
            | f::FLOCK_LOCKS
            | f::WRITEBACK_CACHE
            | f::AUTO_INVAL_DATA
            | f::HANDLE_KILLPRIV_V2
            | f::POSIX_ACL
            | f::DONT_MASK);
        config
    }
}

/// The result of INIT, recorded once per connection and handed to every
/// generation that adopts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitParams {
    /// Protocol major (7).
    pub major: u32,
    /// The protocol minor both sides use: min(kernel, ours).
    pub minor: u32,
    /// The minor the kernel offered.
    pub kernel_minor: u32,
    /// Granted flags (`flags | flags2 << 32`).
    pub flags: u64,
    /// Readahead in bytes.
    pub max_readahead: u32,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Largest number of pages in one request.
    pub max_pages: u16,
    /// Background requests in flight at most.
    pub max_background: u16,
    /// Congestion threshold.
    pub congestion_threshold: u16,
    /// Timestamp granularity in nanoseconds.
    pub time_gran: u32,
}

impl InitParams {
    /// True if `flag` was granted.
    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag != 0
    }

    /// How requests on this connection are laid out.
    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            setxattr_ext: self.has(f::SETXATTR_EXT),
        }
    }

    /// The read buffer a worker needs: the largest write plus its headers.
    pub fn read_buffer_len(&self) -> usize {
        read_buffer_len(self.max_write)
    }
}

/// The read buffer a request of up to `max_write` bytes of data needs.
pub fn read_buffer_len(max_write: u32) -> usize {
    (max_write as usize + 4096).max(abi::MIN_READ_BUFFER)
}

/// Negotiates: what the kernel offered intersected with what we want.
/// Returns the parameters and the reply payload. Pure.
pub fn negotiate(
    offer: &abi::InitIn,
    config: &InitConfig,
) -> Result<(InitParams, abi::InitOut), Error> {
    if offer.major != abi::KERNEL_VERSION {
        return Err(Error::UnsupportedProtocol {
            major: offer.major,
            minor: offer.minor,
        });
    }
    let mut offered = u64::from(offer.flags);
    if offered & f::INIT_EXT != 0 {
        offered |= u64::from(offer.flags2) << 32;
    }
    // Invariant: a kernel timeout would abort the mount during a handover gap.
    let flags = offered & config.flags & !f::REQUEST_TIMEOUT;
    let max_pages = if flags & f::MAX_PAGES != 0 {
        config.max_pages
    } else {
        32
    };
    let max_write = config.max_write.min(u32::from(max_pages) * 4096);
    let params = InitParams {
        major: abi::KERNEL_VERSION,
        minor: offer.minor.min(abi::KERNEL_MINOR_VERSION),
        kernel_minor: offer.minor,
        flags,
        max_readahead: offer.max_readahead,
        max_write,
        max_pages,
        max_background: config.max_background,
        congestion_threshold: config.congestion_threshold,
        time_gran: config.time_gran,
    };
    let out = abi::InitOut {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION,
        max_readahead: params.max_readahead,
        flags: flags as u32,
        max_background: params.max_background,
        congestion_threshold: params.congestion_threshold,
        max_write: params.max_write,
        time_gran: params.time_gran,
        max_pages: params.max_pages,
        flags2: (flags >> 32) as u32,
        ..Default::default()
    };
    Ok((params, out))
}

/// Reads INIT from a freshly mounted connection and answers it.
///
/// Only INIT can arrive before INIT is answered; anything else is a
/// protocol error (someone else is serving this connection).
pub fn initialize(channel: &Channel, config: &InitConfig) -> Result<InitParams, Error> {
    let mut buf = vec![0u8; abi::MIN_READ_BUFFER.max(64 * 1024)];
    loop {
        let len = match channel.receive(&mut buf) {
            ReadOutcome::Request(len) => len,
            ReadOutcome::Retry => continue,
            ReadOutcome::Ended(errno) => return Err(Error::ConnectionEnded { errno }),
        };
        let request = Request::parse(&buf[..len], DecodeOptions::default())?;
        let Operation::Init { arg } = request.operation() else {
            return Err(Error::NotInit {
                opcode: request.opcode(),
                unique: request.unique(),
            });
        };
        return match negotiate(arg, config) {
            Ok((params, out)) => {
                send_message(channel, request.unique(), 0, &[out.as_bytes()]);
                tracing::info!(
                    minor = params.minor,
                    flags = format_args!("{:#x}", params.flags),
                    max_write = params.max_write,
                    "FUSE connection initialized"
                );
                Ok(params)
            }
            Err(err) => {
                send_message(channel, request.unique(), -libc::EPROTO, &[]);
                Err(err)
            }
        };
    }
}
