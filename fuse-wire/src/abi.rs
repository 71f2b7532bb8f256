//! The FUSE kernel ABI at protocol 7.45: opcodes, flags and the `#[repr(C)]`
//! structs exchanged over /dev/fuse.
//!
//! Debian 12's `linux/fuse.h` is protocol 7.38 and lacks the RESEND constants,
//! so everything is defined here. Struct sizes are pinned with const asserts:
//! a wrong size would silently corrupt every message after it.
//!
//! All structs are plain data (`zerocopy`), read from unaligned buffers with
//! `read_from_prefix` and written with `as_bytes`. Identifiers and flag sets
//! inside them have `#[repr(transparent)]` types ([`NodeId`], [`FileHandle`],
//! [`LockOwner`], [`SetattrValid`], [`FallocateFlags`], ...): the same bytes,
//! typed. The raw constant modules below stay for code that
//! handles integers (the INIT handshake, opcode tables).

#![allow(missing_docs)] // Field names follow the kernel header verbatim.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::types::{
    FallocateFlags, FileHandle, FopenFlags, FsyncFlags, GetattrFlags, LkFlags, LockOwner, NodeId,
    OpenInFlags, ReadFlags, ReleaseFlags, RenameFlags, SetattrValid, WriteFlags,
};

/// Protocol major version this layer speaks.
pub const KERNEL_VERSION: u32 = 7;
/// Highest protocol minor version this layer speaks.
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The nodeid of the root directory.
pub const ROOT_ID: u64 = 1;
/// The kernel refuses reads into buffers smaller than this.
pub const MIN_READ_BUFFER: usize = 8192;

/// Bit 63 of `unique` on a request the kernel re-queued after FUSE_NOTIFY_RESEND.
/// A reply must carry the unique exactly as read; mask it only for keys.
pub const UNIQUE_RESEND: u64 = 1 << 63;

/// Request opcodes (`enum fuse_opcode`).
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
    pub const COPY_FILE_RANGE_64: u32 = 53;
}

/// Notification codes (`enum fuse_notify_code`), sent as `error` of an
/// out header with `unique == 0`.
pub mod notify_code {
    pub const POLL: i32 = 1;
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
    pub const RETRIEVE: i32 = 5;
    pub const DELETE: i32 = 6;
    /// Re-queue every request of the connection that was read but not answered.
    pub const RESEND: i32 = 7;
    pub const INC_EPOCH: i32 = 8;
    pub const PRUNE: i32 = 9;
}

/// INIT flags (`flags | flags2 << 32`).
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    /// The kernel understands FUSE_NOTIFY_RESEND (it works on 6.18 even
    /// when not negotiated; we negotiate it anyway).
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
    /// Never negotiated by Baton: a kernel timeout aborts the whole mount
    /// during a handover gap.
    pub const REQUEST_TIMEOUT: u64 = 1 << 42;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags` bits.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_fallocate_in.mode` bits: fallocate(2)'s `FALLOC_FL_*`
/// (`linux/falloc.h`).
pub mod falloc {
    pub const KEEP_SIZE: u32 = 0x01;
    pub const PUNCH_HOLE: u32 = 0x02;
    pub const NO_HIDE_STALE: u32 = 0x04;
    pub const COLLAPSE_RANGE: u32 = 0x08;
    pub const ZERO_RANGE: u32 = 0x10;
    pub const INSERT_RANGE: u32 = 0x20;
    pub const UNSHARE_RANGE: u32 = 0x40;
}

/// `fuse_rename2_in.flags`: renameat2(2)'s `RENAME_*` (`linux/fs.h`).
pub mod rename {
    pub const NOREPLACE: u32 = 1 << 0;
    pub const EXCHANGE: u32 = 1 << 1;
    pub const WHITEOUT: u32 = 1 << 2;
}

/// Miscellaneous request flag bits.
pub mod flags {
    /// `fuse_release_in.release_flags`: flush before release.
    pub const RELEASE_FLUSH: u32 = 1 << 0;
    /// `fuse_release_in.release_flags`: drop flock locks of this owner.
    pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
    /// `fuse_getattr_in.getattr_flags`: `fh` is valid.
    pub const GETATTR_FH: u32 = 1 << 0;
    /// `fuse_read_in.read_flags`: `lock_owner` is valid.
    pub const READ_LOCKOWNER: u32 = 1 << 1;
    /// `fuse_lk_in.lk_flags`: a BSD flock rather than a POSIX lock.
    pub const LK_FLOCK: u32 = 1 << 0;
    /// `fuse_write_in.write_flags`: delayed write from the page cache.
    pub const WRITE_CACHE: u32 = 1 << 0;
    /// `fuse_write_in.write_flags`: `lock_owner` is valid.
    pub const WRITE_LOCKOWNER: u32 = 1 << 1;
    /// `fuse_write_in.write_flags`: kill suid and sgid bits.
    pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
    /// `fuse_open_in.open_flags` / `fuse_create_in.open_flags`: an open
    /// that truncates kills suid and sgid bits.
    pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
    /// `fuse_fsync_in.fsync_flags`: data only.
    pub const FSYNC_FDATASYNC: u32 = 1 << 0;
    /// `fuse_notify_inval_entry_out.flags`: only expire the entry.
    pub const EXPIRE_ONLY: u32 = 1 << 0;
    /// `fuse_setxattr_in.setxattr_flags`: ACL change kills sgid.
    pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
    /// `fuse_poll_in.flags`: the kernel wants a poll notification.
    pub const POLL_SCHEDULE_NOTIFY: u32 = 1 << 0;
}

/// Size of `fuse_setxattr_in` when FUSE_SETXATTR_EXT was not negotiated.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;

/// Extension type in the request extension area: supplementary groups.
pub const EXT_GROUPS: u32 = 2;

macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct $name { $(pub $field: $ty),* }
        // Invariant: the layout matches the kernel's struct exactly.
        const _: () = assert!(std::mem::size_of::<$name>() == $size);
    };
}

wire_struct!(InHeader, 40, { len: u32, opcode: u32, unique: u64, nodeid: NodeId, uid: u32, gid: u32, pid: u32, total_extlen: u16, padding: u16 });
wire_struct!(OutHeader, 16, { len: u32, error: i32, unique: u64 });
wire_struct!(Attr, 88, {
    ino: u64, size: u64, blocks: u64, atime: u64, mtime: u64, ctime: u64,
    atimensec: u32, mtimensec: u32, ctimensec: u32, mode: u32, nlink: u32,
    uid: u32, gid: u32, rdev: u32, blksize: u32, flags: u32,
});
wire_struct!(Kstatfs, 80, {
    blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64,
    bsize: u32, namelen: u32, frsize: u32, padding: u32, spare: [u32; 6],
});
wire_struct!(FileLock, 24, { start: u64, end: u64, typ: u32, pid: u32 });
wire_struct!(EntryOut, 128, {
    nodeid: NodeId, generation: u64, entry_valid: u64, attr_valid: u64,
    entry_valid_nsec: u32, attr_valid_nsec: u32, attr: Attr,
});
wire_struct!(ForgetIn, 8, { nlookup: u64 });
wire_struct!(ForgetOne, 16, { nodeid: NodeId, nlookup: u64 });
wire_struct!(BatchForgetIn, 8, { count: u32, dummy: u32 });
wire_struct!(GetattrIn, 16, { getattr_flags: GetattrFlags, dummy: u32, fh: FileHandle });
wire_struct!(AttrOut, 104, { attr_valid: u64, attr_valid_nsec: u32, dummy: u32, attr: Attr });
wire_struct!(MknodIn, 16, { mode: u32, rdev: u32, umask: u32, padding: u32 });
wire_struct!(MkdirIn, 8, { mode: u32, umask: u32 });
wire_struct!(RenameIn, 8, { newdir: NodeId });
wire_struct!(Rename2In, 16, { newdir: NodeId, flags: RenameFlags, padding: u32 });
wire_struct!(LinkIn, 8, { oldnodeid: NodeId });
wire_struct!(SetattrIn, 88, {
    valid: SetattrValid, padding: u32, fh: FileHandle, size: u64, lock_owner: LockOwner,
    atime: u64, mtime: u64, ctime: u64, atimensec: u32, mtimensec: u32, ctimensec: u32,
    mode: u32, unused4: u32, uid: u32, gid: u32, unused5: u32,
});
wire_struct!(OpenIn, 8, { flags: u32, open_flags: OpenInFlags });
wire_struct!(CreateIn, 16, { flags: u32, mode: u32, umask: u32, open_flags: OpenInFlags });
wire_struct!(OpenOut, 16, { fh: FileHandle, open_flags: FopenFlags, backing_id: i32 });
wire_struct!(ReleaseIn, 24, { fh: FileHandle, flags: u32, release_flags: ReleaseFlags, lock_owner: LockOwner });
wire_struct!(FlushIn, 24, { fh: FileHandle, unused: u32, padding: u32, lock_owner: LockOwner });
wire_struct!(ReadIn, 40, { fh: FileHandle, offset: u64, size: u32, read_flags: ReadFlags, lock_owner: LockOwner, flags: u32, padding: u32 });
wire_struct!(WriteIn, 40, { fh: FileHandle, offset: u64, size: u32, write_flags: WriteFlags, lock_owner: LockOwner, flags: u32, padding: u32 });
wire_struct!(WriteOut, 8, { size: u32, padding: u32 });
wire_struct!(StatfsOut, 80, { st: Kstatfs });
wire_struct!(FsyncIn, 16, { fh: FileHandle, fsync_flags: FsyncFlags, padding: u32 });
wire_struct!(SetxattrIn, 16, { size: u32, flags: u32, setxattr_flags: u32, padding: u32 });
wire_struct!(GetxattrIn, 8, { size: u32, padding: u32 });
wire_struct!(GetxattrOut, 8, { size: u32, padding: u32 });
wire_struct!(LkIn, 48, { fh: FileHandle, owner: LockOwner, lk: FileLock, lk_flags: LkFlags, padding: u32 });
wire_struct!(LkOut, 24, { lk: FileLock });
wire_struct!(AccessIn, 8, { mask: u32, padding: u32 });
wire_struct!(InitIn, 64, { major: u32, minor: u32, max_readahead: u32, flags: u32, flags2: u32, unused: [u32; 11] });
wire_struct!(InitOut, 64, {
    major: u32, minor: u32, max_readahead: u32, flags: u32,
    max_background: u16, congestion_threshold: u16, max_write: u32, time_gran: u32,
    max_pages: u16, map_alignment: u16, flags2: u32, max_stack_depth: u32,
    request_timeout: u16, unused: [u16; 11],
});
wire_struct!(InterruptIn, 8, { unique: u64 });
wire_struct!(BmapIn, 16, { block: u64, blocksize: u32, padding: u32 });
wire_struct!(BmapOut, 8, { block: u64 });
wire_struct!(IoctlIn, 32, { fh: FileHandle, flags: u32, cmd: u32, arg: u64, in_size: u32, out_size: u32 });
wire_struct!(IoctlOut, 16, { result: i32, flags: u32, in_iovs: u32, out_iovs: u32 });
wire_struct!(PollIn, 24, { fh: FileHandle, kh: u64, flags: u32, events: u32 });
wire_struct!(PollOut, 8, { revents: u32, padding: u32 });
wire_struct!(FallocateIn, 32, { fh: FileHandle, offset: u64, length: u64, mode: FallocateFlags, padding: u32 });
wire_struct!(LseekIn, 24, { fh: FileHandle, offset: u64, whence: u32, padding: u32 });
wire_struct!(LseekOut, 8, { offset: u64 });
wire_struct!(CopyFileRangeIn, 56, { fh_in: FileHandle, off_in: u64, nodeid_out: NodeId, fh_out: FileHandle, off_out: u64, len: u64, flags: u64 });
wire_struct!(CopyFileRangeOut, 8, { bytes_copied: u64 });
wire_struct!(SyncfsIn, 8, { padding: u64 });
wire_struct!(StatxIn, 24, { getattr_flags: GetattrFlags, reserved: u32, fh: FileHandle, sx_flags: u32, sx_mask: u32 });
wire_struct!(SxTime, 16, { tv_sec: i64, tv_nsec: u32, reserved: i32 });
wire_struct!(Statx, 256, {
    mask: u32, blksize: u32, attributes: u64, nlink: u32, uid: u32, gid: u32, mode: u16, spare0: u16,
    ino: u64, size: u64, blocks: u64, attributes_mask: u64,
    atime: SxTime, btime: SxTime, ctime: SxTime, mtime: SxTime,
    rdev_major: u32, rdev_minor: u32, dev_major: u32, dev_minor: u32, spare2: [u64; 14],
});
wire_struct!(StatxOut, 288, { attr_valid: u64, attr_valid_nsec: u32, flags: u32, spare: [u64; 2], stat: Statx });
wire_struct!(Dirent, 24, { ino: u64, off: u64, namelen: u32, typ: u32 });
wire_struct!(ExtHeader, 8, { size: u32, typ: u32 });
wire_struct!(NotifyInvalInodeOut, 24, { ino: NodeId, off: i64, len: i64 });
wire_struct!(NotifyInvalEntryOut, 16, { parent: NodeId, namelen: u32, flags: u32 });
wire_struct!(NotifyDeleteOut, 24, { parent: NodeId, child: NodeId, namelen: u32, padding: u32 });

/// Round `len` up to the 8-byte alignment of dirent records.
pub const fn dirent_align(len: usize) -> usize {
    (len + 7) & !7
}
