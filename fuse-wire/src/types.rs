//! Typed values at the kernel boundary: identifiers that are all `u64` on the
//! wire ([`NodeId`], [`FileHandle`], [`LockOwner`]) and the flag sets of the
//! request and reply structs ([`SetattrValid`], [`FallocateFlags`], ...).
//!
//! Every type here is `#[repr(transparent)]` over its wire integer and is
//! used as the field type inside the [`crate::abi`] structs, so decoding
//! stays a plain copy of the kernel's bytes and the layout is unchanged
//! (the structs' const size asserts still hold). Flag sets keep every bit
//! the kernel sent, known or not: decoding never drops or rejects bits.

use std::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::abi;

macro_rules! wire_id {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
            FromBytes, IntoBytes, Immutable, KnownLayout,
        )]
        pub struct $name(u64);

        impl $name {
            /// Wraps the kernel's integer.
            pub const fn new(value: u64) -> Self {
                Self(value)
            }

            /// The kernel's integer.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl From<u64> for $name {
            fn from(value: u64) -> Self {
                Self(value)
            }
        }

        impl From<$name> for u64 {
            fn from(value: $name) -> u64 {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

wire_id!(
    /// The kernel's name for an inode (`nodeid` in requests, entries and
    /// notifications). The filesystem chooses it in LOOKUP-like replies;
    /// [`NodeId::ROOT`] is fixed. 0 means "no node" in READDIRPLUS entries.
    NodeId
);
wire_id!(
    /// A file or directory handle (`fh`): chosen by the filesystem in the
    /// OPEN, OPENDIR or CREATE reply and sent back with every request on
    /// that open file.
    FileHandle
);
wire_id!(
    /// The kernel's identity of a lock owner (`lock_owner`, `fuse_lk_in.owner`):
    /// an opaque value per `files_struct` (POSIX) or open file (flock).
    LockOwner
);

impl NodeId {
    /// The root directory.
    pub const ROOT: NodeId = NodeId(abi::ROOT_ID);
}

macro_rules! wire_flags {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
            FromBytes, IntoBytes, Immutable, KnownLayout,
        )]
        pub struct $name(u32);
    };
}

wire_flags!(
    /// `fuse_setattr_in.valid`: which fields of a SETATTR apply.
    SetattrValid
);
bitflags::bitflags! {
    impl SetattrValid: u32 {
        /// `mode` applies.
        const MODE = abi::fattr::MODE;
        /// `uid` applies.
        const UID = abi::fattr::UID;
        /// `gid` applies.
        const GID = abi::fattr::GID;
        /// `size` applies (truncate).
        const SIZE = abi::fattr::SIZE;
        /// `atime` applies.
        const ATIME = abi::fattr::ATIME;
        /// `mtime` applies.
        const MTIME = abi::fattr::MTIME;
        /// `fh` is valid (the change comes through an open file).
        const FH = abi::fattr::FH;
        /// Set atime to the filesystem's now.
        const ATIME_NOW = abi::fattr::ATIME_NOW;
        /// Set mtime to the filesystem's now.
        const MTIME_NOW = abi::fattr::MTIME_NOW;
        /// `lock_owner` is valid.
        const LOCKOWNER = abi::fattr::LOCKOWNER;
        /// `ctime` applies.
        const CTIME = abi::fattr::CTIME;
        /// Clear set-user-ID and set-group-ID bits (HANDLE_KILLPRIV_V2).
        const KILL_SUIDGID = abi::fattr::KILL_SUIDGID;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_getattr_in.getattr_flags` (also in `fuse_statx_in`).
    GetattrFlags
);
bitflags::bitflags! {
    impl GetattrFlags: u32 {
        /// `fh` is valid.
        const FH = abi::flags::GETATTR_FH;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_open_in.open_flags` / `fuse_create_in.open_flags`: FUSE's own
    /// open flags (the `O_*` flags are in `flags`).
    OpenInFlags
);
bitflags::bitflags! {
    impl OpenInFlags: u32 {
        /// An open that truncates clears set-user-ID and set-group-ID bits
        /// (HANDLE_KILLPRIV_V2).
        const KILL_SUIDGID = abi::flags::OPEN_KILL_SUIDGID;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_open_out.open_flags`: how the kernel treats the opened file
    /// (`FOPEN_*`).
    FopenFlags
);
bitflags::bitflags! {
    impl FopenFlags: u32 {
        /// Bypass the page cache.
        const DIRECT_IO = abi::fopen::DIRECT_IO;
        /// Keep cached pages across this open.
        const KEEP_CACHE = abi::fopen::KEEP_CACHE;
        /// The file is not seekable.
        const NONSEEKABLE = abi::fopen::NONSEEKABLE;
        /// Cache the directory listing (OPENDIR).
        const CACHE_DIR = abi::fopen::CACHE_DIR;
        /// A stream: no file position.
        const STREAM = abi::fopen::STREAM;
        /// Send no FLUSH on close.
        const NOFLUSH = abi::fopen::NOFLUSH;
        /// Allow parallel direct writes.
        const PARALLEL_DIRECT_WRITES = abi::fopen::PARALLEL_DIRECT_WRITES;
        /// Passthrough to a backing file.
        const PASSTHROUGH = abi::fopen::PASSTHROUGH;
        /// Bits a newer kernel may understand.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_read_in.read_flags`.
    ReadFlags
);
bitflags::bitflags! {
    impl ReadFlags: u32 {
        /// `lock_owner` is valid.
        const LOCKOWNER = abi::flags::READ_LOCKOWNER;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_write_in.write_flags`.
    WriteFlags
);
bitflags::bitflags! {
    impl WriteFlags: u32 {
        /// A delayed write from the page cache.
        const CACHE = abi::flags::WRITE_CACHE;
        /// `lock_owner` is valid.
        const LOCKOWNER = abi::flags::WRITE_LOCKOWNER;
        /// Clear set-user-ID and set-group-ID bits (HANDLE_KILLPRIV_V2).
        const KILL_SUIDGID = abi::flags::WRITE_KILL_SUIDGID;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_release_in.release_flags`.
    ReleaseFlags
);
bitflags::bitflags! {
    impl ReleaseFlags: u32 {
        /// Flush before release.
        const FLUSH = abi::flags::RELEASE_FLUSH;
        /// Drop the flock locks of `lock_owner`.
        const FLOCK_UNLOCK = abi::flags::RELEASE_FLOCK_UNLOCK;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_fsync_in.fsync_flags`.
    FsyncFlags
);
bitflags::bitflags! {
    impl FsyncFlags: u32 {
        /// Data only (fdatasync).
        const FDATASYNC = abi::flags::FSYNC_FDATASYNC;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_lk_in.lk_flags`.
    LkFlags
);
bitflags::bitflags! {
    impl LkFlags: u32 {
        /// A BSD flock rather than a POSIX lock.
        const FLOCK = abi::flags::LK_FLOCK;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_rename2_in.flags`: renameat2(2)'s `RENAME_*` flags (empty for
    /// a plain RENAME).
    RenameFlags
);
bitflags::bitflags! {
    impl RenameFlags: u32 {
        /// Fail with EEXIST if the new name exists.
        const NOREPLACE = abi::rename::NOREPLACE;
        /// Swap the two names atomically.
        const EXCHANGE = abi::rename::EXCHANGE;
        /// Leave a whiteout at the old name (overlay filesystems).
        const WHITEOUT = abi::rename::WHITEOUT;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

wire_flags!(
    /// `fuse_fallocate_in.mode`: fallocate(2)'s `FALLOC_FL_*` mode. The
    /// empty set is a plain allocation (which may extend the file).
    FallocateFlags
);
bitflags::bitflags! {
    impl FallocateFlags: u32 {
        /// Do not change the file size.
        const KEEP_SIZE = abi::falloc::KEEP_SIZE;
        /// Deallocate the range (always with KEEP_SIZE).
        const PUNCH_HOLE = abi::falloc::PUNCH_HOLE;
        /// Reserved by the kernel; never valid from user space.
        const NO_HIDE_STALE = abi::falloc::NO_HIDE_STALE;
        /// Remove the range and shift the rest of the file down.
        const COLLAPSE_RANGE = abi::falloc::COLLAPSE_RANGE;
        /// Zero the range.
        const ZERO_RANGE = abi::falloc::ZERO_RANGE;
        /// Insert a hole at the range, shifting the rest of the file up.
        const INSERT_RANGE = abi::falloc::INSERT_RANGE;
        /// Unshare shared blocks in the range.
        const UNSHARE_RANGE = abi::falloc::UNSHARE_RANGE;
        /// The kernel may set bits this layer does not know.
        const _ = !0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_flags_are_their_wire_integers() {
        // Invariant: the abi structs' layouts rely on these being exactly
        // their integers.
        assert_eq!(std::mem::size_of::<NodeId>(), 8);
        assert_eq!(std::mem::size_of::<FileHandle>(), 8);
        assert_eq!(std::mem::size_of::<LockOwner>(), 8);
        assert_eq!(std::mem::size_of::<FallocateFlags>(), 4);
        assert_eq!(NodeId::new(7).as_bytes(), 7u64.as_bytes());
        assert_eq!(u64::from(FileHandle::from(9)), 9);
        assert_eq!(NodeId::ROOT.get(), 1);
    }

    #[test]
    fn falloc_and_rename_bits_match_the_c_headers() {
        let falloc = [
            (FallocateFlags::KEEP_SIZE, libc::FALLOC_FL_KEEP_SIZE),
            (FallocateFlags::PUNCH_HOLE, libc::FALLOC_FL_PUNCH_HOLE),
            (
                FallocateFlags::COLLAPSE_RANGE,
                libc::FALLOC_FL_COLLAPSE_RANGE,
            ),
            (FallocateFlags::ZERO_RANGE, libc::FALLOC_FL_ZERO_RANGE),
            (FallocateFlags::INSERT_RANGE, libc::FALLOC_FL_INSERT_RANGE),
            (FallocateFlags::UNSHARE_RANGE, libc::FALLOC_FL_UNSHARE_RANGE),
        ];
        for (ours, theirs) in falloc {
            assert_eq!(i64::from(ours.bits()), i64::from(theirs));
        }
        assert_eq!(RenameFlags::NOREPLACE.bits(), libc::RENAME_NOREPLACE);
        assert_eq!(RenameFlags::EXCHANGE.bits(), libc::RENAME_EXCHANGE);
        assert_eq!(RenameFlags::WHITEOUT.bits(), libc::RENAME_WHITEOUT);
    }

    #[test]
    fn unknown_flag_bits_survive_decoding() {
        let raw = (1u32 << 30) | abi::falloc::KEEP_SIZE;
        let (mode, _) = FallocateFlags::read_from_prefix(raw.as_bytes()).expect("4 bytes");
        assert_eq!(mode.bits(), raw);
        assert!(mode.contains(FallocateFlags::KEEP_SIZE));
        assert_ne!(mode, FallocateFlags::KEEP_SIZE);
    }
}
