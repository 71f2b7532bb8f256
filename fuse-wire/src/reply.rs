//! Typed replies: each is consumed by value, so one request gets one answer.
//!
//! A reply can be sent to any unique, from any thread, including a unique
//! read by an earlier generation (a journaled request) as long as it goes
//! through the same open file description. An unanswered reply is logged and
//! counted when dropped; it never answers by itself (a generation that
//! journals a request must be able to leave it unanswered on purpose, with
//! [`ReplyEntry::abandon`] and friends).

use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use zerocopy::{Immutable, IntoBytes};

use crate::abi;
use crate::types::{FileHandle, FopenFlags};

/// Where replies go: the device, or a buffer in tests.
pub trait ReplyChannel: Send + Sync {
    /// Writes one whole message (header and payload) in one `writev`.
    fn send(&self, message: &[IoSlice<'_>]) -> std::io::Result<()>;
}

static UNANSWERED_DROPS: AtomicU64 = AtomicU64::new(0);
static SEND_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Counters of replies that went wrong, for status and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyStats {
    /// Replies dropped without an answer and without `abandon`.
    pub unanswered_drops: u64,
    /// Replies the kernel refused (e.g. ENOENT: the request was already gone).
    pub send_failures: u64,
}

/// Process-wide reply counters.
pub fn reply_stats() -> ReplyStats {
    ReplyStats {
        unanswered_drops: UNANSWERED_DROPS.load(Ordering::Relaxed),
        send_failures: SEND_FAILURES.load(Ordering::Relaxed),
    }
}

/// Builds one message: out header plus payload slices.
pub fn send_message(channel: &dyn ReplyChannel, unique: u64, error: i32, payload: &[&[u8]]) {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let header = abi::OutHeader {
        len: (std::mem::size_of::<abi::OutHeader>() + payload_len) as u32,
        error,
        unique,
    };
    // Replies have at most three payload parts: no allocation on this path.
    const INLINE_PARTS_MAX: usize = 4;
    let mut inline = [IoSlice::new(&[]); INLINE_PARTS_MAX];
    let heap: Vec<IoSlice<'_>>;
    let iov: &[IoSlice<'_>] = if payload.len() < INLINE_PARTS_MAX {
        inline[0] = IoSlice::new(header.as_bytes());
        for (slot, part) in inline[1..].iter_mut().zip(payload) {
            *slot = IoSlice::new(part);
        }
        &inline[..1 + payload.len()]
    } else {
        heap = std::iter::once(IoSlice::new(header.as_bytes()))
            .chain(payload.iter().map(|p| IoSlice::new(p)))
            .collect();
        &heap
    };
    if let Err(err) = channel.send(iov) {
        SEND_FAILURES.fetch_add(1, Ordering::Relaxed);
        // ENOENT: the request was interrupted, aborted or already answered.
        tracing::warn!(unique, error, %err, "reply refused by the kernel");
    }
}

/// The answer slot shared by every typed reply.
struct Slot {
    channel: Arc<dyn ReplyChannel>,
    unique: u64,
    done: bool,
    /// A GETATTR answer that really answers a STATX request.
    attr_as_statx: bool,
}

impl Slot {
    fn send(mut self, error: i32, payload: &[&[u8]]) {
        self.done = true;
        send_message(&*self.channel, self.unique, error, payload);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.done {
            UNANSWERED_DROPS.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                unique = self.unique,
                "request dropped without a reply; the caller will hang"
            );
            // Invariant: every request is answered or explicitly abandoned.
            if !std::thread::panicking() {
                debug_assert!(false, "request {:#x} dropped without a reply", self.unique);
            }
        }
    }
}

macro_rules! reply_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        pub struct $name(Slot);

        impl $name {
            /// A reply for `unique` through `channel`.
            pub fn new(channel: Arc<dyn ReplyChannel>, unique: u64) -> Self {
                Self(Slot { channel, unique, done: false, attr_as_statx: false })
            }

            /// The unique this reply answers, exactly as read.
            pub fn unique(&self) -> u64 {
                self.0.unique
            }

            /// Answers with an error.
            pub fn error(self, errno: Errno) {
                self.0.send(-(errno as i32), &[]);
            }

            /// Leaves the request unanswered on purpose (it was journaled and
            /// a later generation will answer it).
            pub fn abandon(mut self) {
                self.0.done = true;
            }

            #[allow(dead_code)]
            fn ok_struct<T: IntoBytes + Immutable>(self, value: &T) {
                self.0.send(0, &[value.as_bytes()]);
            }
        }
    };
}

reply_type!(
    /// An answer with no payload (success or error).
    ReplyEmpty
);
reply_type!(
    /// An answer to LOOKUP, MKNOD, MKDIR, SYMLINK and LINK.
    ReplyEntry
);
reply_type!(
    /// An answer to GETATTR and SETATTR.
    ReplyAttr
);
reply_type!(
    /// Bytes: READ, READLINK, READDIR, READDIRPLUS.
    ReplyData
);
reply_type!(
    /// An answer to OPEN and OPENDIR.
    ReplyOpen
);
reply_type!(
    /// An answer to WRITE.
    ReplyWrite
);
reply_type!(
    /// An answer to STATFS.
    ReplyStatfs
);
reply_type!(
    /// An answer to CREATE and TMPFILE.
    ReplyCreate
);
reply_type!(
    /// An answer to GETXATTR and LISTXATTR: a size probe or the bytes.
    ReplyXattr
);
reply_type!(
    /// An answer to GETLK.
    ReplyLock
);
reply_type!(
    /// An answer to BMAP.
    ReplyBmap
);
reply_type!(
    /// An answer to LSEEK.
    ReplyLseek
);
reply_type!(
    /// An answer to POLL.
    ReplyPoll
);
reply_type!(
    /// An answer to IOCTL.
    ReplyIoctl
);
reply_type!(
    /// An answer to STATX.
    ReplyStatx
);

impl ReplyEmpty {
    /// Success with no payload.
    pub fn ok(self) {
        self.0.send(0, &[]);
    }
}

impl ReplyEntry {
    /// The entry found or created.
    pub fn entry(self, entry: &abi::EntryOut) {
        self.ok_struct(entry);
    }
}

impl ReplyAttr {
    /// A reply to a STATX request filled by a GETATTR handler: the
    /// attributes are sent as a `fuse_statx_out` with the basic fields.
    pub fn for_statx(channel: Arc<dyn ReplyChannel>, unique: u64) -> Self {
        let mut reply = Self::new(channel, unique);
        reply.0.attr_as_statx = true;
        reply
    }

    /// The attributes.
    pub fn attr(self, attr: &abi::AttrOut) {
        if self.0.attr_as_statx {
            self.ok_struct(&statx_from_attr(attr));
        } else {
            self.ok_struct(attr);
        }
    }
}

/// `STATX_BASIC_STATS`: type, mode, nlink, uid, gid, atime, mtime, ctime,
/// ino, size, blocks.
const STATX_BASIC_STATS: u32 = 0x7ff;

/// The basic statx fields of a GETATTR answer. Pure.
pub fn statx_from_attr(out: &abi::AttrOut) -> abi::StatxOut {
    let a = &out.attr;
    let time = |sec: u64, nsec: u32| abi::SxTime {
        tv_sec: sec as i64,
        tv_nsec: nsec,
        reserved: 0,
    };
    let rdev = u64::from(a.rdev);
    abi::StatxOut {
        attr_valid: out.attr_valid,
        attr_valid_nsec: out.attr_valid_nsec,
        stat: abi::Statx {
            mask: STATX_BASIC_STATS,
            blksize: a.blksize,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            mode: a.mode as u16,
            ino: a.ino,
            size: a.size,
            blocks: a.blocks,
            atime: time(a.atime, a.atimensec),
            ctime: time(a.ctime, a.ctimensec),
            mtime: time(a.mtime, a.mtimensec),
            rdev_major: nix::sys::stat::major(rdev) as u32,
            rdev_minor: nix::sys::stat::minor(rdev) as u32,
            ..Default::default()
        },
        ..Default::default()
    }
}

impl ReplyData {
    /// The bytes read.
    pub fn data(self, data: &[u8]) {
        self.0.send(0, &[data]);
    }

    /// The bytes read, gathered from several buffers.
    pub fn data_vectored(self, parts: &[&[u8]]) {
        self.0.send(0, parts);
    }
}

impl ReplyOpen {
    /// The file handle and FOPEN_* flags.
    pub fn opened(self, fh: FileHandle, open_flags: FopenFlags) {
        self.ok_struct(&abi::OpenOut {
            fh,
            open_flags,
            backing_id: 0,
        });
    }
}

impl ReplyWrite {
    /// The number of bytes written.
    pub fn written(self, size: u32) {
        self.ok_struct(&abi::WriteOut { size, padding: 0 });
    }
}

impl ReplyStatfs {
    /// The filesystem statistics.
    pub fn statfs(self, st: &abi::Kstatfs) {
        self.ok_struct(&abi::StatfsOut { st: *st });
    }
}

impl ReplyCreate {
    /// The created entry and its open file.
    pub fn created(self, entry: &abi::EntryOut, fh: FileHandle, open_flags: FopenFlags) {
        let open = abi::OpenOut {
            fh,
            open_flags,
            backing_id: 0,
        };
        self.0.send(0, &[entry.as_bytes(), open.as_bytes()]);
    }
}

impl ReplyXattr {
    /// The size a buffer needs (the request asked with size 0).
    pub fn size(self, size: u32) {
        self.ok_struct(&abi::GetxattrOut { size, padding: 0 });
    }

    /// The value, or the NUL-separated list of names.
    pub fn data(self, data: &[u8]) {
        self.0.send(0, &[data]);
    }
}

impl ReplyLock {
    /// The conflicting lock, or one with type F_UNLCK.
    pub fn lock(self, lk: &abi::FileLock) {
        self.ok_struct(&abi::LkOut { lk: *lk });
    }
}

impl ReplyBmap {
    /// The device block.
    pub fn block(self, block: u64) {
        self.ok_struct(&abi::BmapOut { block });
    }
}

impl ReplyLseek {
    /// The resulting offset.
    pub fn offset(self, offset: u64) {
        self.ok_struct(&abi::LseekOut { offset });
    }
}

impl ReplyPoll {
    /// The ready events.
    pub fn revents(self, revents: u32) {
        self.ok_struct(&abi::PollOut {
            revents,
            padding: 0,
        });
    }
}

impl ReplyIoctl {
    /// A completed ioctl with its result and output bytes.
    pub fn done(self, result: i32, data: &[u8]) {
        let out = abi::IoctlOut {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        self.0.send(0, &[out.as_bytes(), data]);
    }
}

impl ReplyStatx {
    /// The extended attributes.
    pub fn statx(self, out: &abi::StatxOut) {
        self.ok_struct(out);
    }
}

/// An answer to COPY_FILE_RANGE (32-bit count) or COPY_FILE_RANGE_64.
pub struct ReplyCopy {
    inner: ReplyEmpty,
    wide: bool,
}

impl ReplyCopy {
    /// A reply for `unique`; `wide` for COPY_FILE_RANGE_64.
    pub fn new(channel: Arc<dyn ReplyChannel>, unique: u64, wide: bool) -> Self {
        ReplyCopy {
            inner: ReplyEmpty::new(channel, unique),
            wide,
        }
    }

    /// The number of bytes copied (clamped to u32 for the narrow opcode).
    pub fn copied(self, bytes: u64) {
        if self.wide {
            self.inner.ok_struct(&abi::CopyFileRangeOut {
                bytes_copied: bytes,
            });
        } else {
            let size = u32::try_from(bytes).unwrap_or(u32::MAX);
            self.inner.ok_struct(&abi::WriteOut { size, padding: 0 });
        }
    }

    /// Answers with an error.
    pub fn error(self, errno: Errno) {
        self.inner.error(errno);
    }

    /// Leaves the request unanswered on purpose.
    pub fn abandon(self) {
        self.inner.abandon();
    }
}

/// Builds the payload of a READDIR or READDIRPLUS reply within the size the
/// kernel asked for.
#[derive(Debug)]
pub struct DirentBuf {
    bytes: Vec<u8>,
    size_max: usize,
    plus: bool,
}

/// One directory entry to add to a [`DirentBuf`].
#[derive(Debug, Clone, Copy)]
pub struct DirentRecord<'a> {
    /// Inode number shown in `d_ino`.
    pub ino: u64,
    /// The cookie that resumes the listing after this entry.
    pub offset_next: u64,
    /// `DT_*` type.
    pub typ: u32,
    /// The entry's name.
    pub name: &'a [u8],
}

impl DirentBuf {
    /// A READDIR buffer of at most `size_max` bytes.
    pub fn new(size_max: u32) -> Self {
        DirentBuf {
            bytes: Vec::with_capacity(size_max as usize),
            size_max: size_max as usize,
            plus: false,
        }
    }

    /// A READDIRPLUS buffer of at most `size_max` bytes.
    pub fn new_plus(size_max: u32) -> Self {
        DirentBuf {
            plus: true,
            ..Self::new(size_max)
        }
    }

    /// True for READDIRPLUS buffers: each entry needs an `EntryOut`.
    pub fn is_plus(&self) -> bool {
        self.plus
    }

    /// Adds an entry; returns false (adding nothing) when it does not fit.
    /// For READDIRPLUS, `entry` is the lookup result (it counts as a lookup
    /// unless its nodeid is 0).
    pub fn push(&mut self, record: DirentRecord<'_>, entry: Option<&abi::EntryOut>) -> bool {
        let dirent_len = std::mem::size_of::<abi::Dirent>() + record.name.len();
        let entry_len = if self.plus {
            std::mem::size_of::<abi::EntryOut>()
        } else {
            0
        };
        let total = entry_len + abi::dirent_align(dirent_len);
        if self.bytes.len() + total > self.size_max {
            return false;
        }
        if self.plus {
            let empty = abi::EntryOut::default();
            self.bytes
                .extend_from_slice(entry.unwrap_or(&empty).as_bytes());
        }
        let dirent = abi::Dirent {
            ino: record.ino,
            off: record.offset_next,
            namelen: record.name.len() as u32,
            typ: record.typ,
        };
        self.bytes.extend_from_slice(dirent.as_bytes());
        self.bytes.extend_from_slice(record.name);
        self.bytes.resize(
            self.bytes.len() + abi::dirent_align(dirent_len) - dirent_len,
            0,
        );
        true
    }

    /// The encoded entries.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}
