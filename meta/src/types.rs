//! Plain value types passed in and out of a [`crate::MetaStore`]: attributes,
//! arguments of the mutating operations and their results.
//!
//! None of these derive serde (style: core types are not serializable); the
//! only byte encoding is the explicit one in [`crate::record`].

use std::ffi::OsString;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::MetaError;
use crate::limits::{BLOCK_SIZE_BYTES_MAX, BLOCK_SIZE_BYTES_MIN};

/// Inode number of the root directory. Inode numbers are never reused.
pub const ROOT_INO: u64 = 1;

/// Permission bits stored in [`Attr::mode`]: rwx for user/group/other plus
/// set-user-ID, set-group-ID and sticky. The file type is never stored there.
pub const MODE_PERMISSION_MASK: u32 = 0o7777;
/// Set-user-ID bit.
pub const S_ISUID: u32 = 0o4000;
/// Set-group-ID bit.
pub const S_ISGID: u32 = 0o2000;
/// Sticky bit.
pub const S_ISVTX: u32 = 0o1000;
/// Group-execute bit.
pub const S_IXGRP: u32 = 0o0010;

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file with a block map.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link; its target is stored with the inode.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A UNIX domain socket.
    Socket,
    /// A character device (see [`Attr::rdev`]).
    CharDevice,
    /// A block device (see [`Attr::rdev`]).
    BlockDevice,
}

impl FileKind {
    /// The `S_IFMT` type bits for this kind (e.g. `0o100000` for regular).
    pub fn type_bits(self) -> u32 {
        match self {
            FileKind::Regular => 0o100000,
            FileKind::Directory => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDevice => 0o020000,
            FileKind::BlockDevice => 0o060000,
        }
    }

    /// The stable small integer stored in the `kind` column.
    pub(crate) fn code(self) -> u8 {
        match self {
            FileKind::Regular => 1,
            FileKind::Directory => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDevice => 6,
            FileKind::BlockDevice => 7,
        }
    }

    /// Inverse of [`FileKind::code`]; `None` for an unknown code.
    pub(crate) fn from_code(code: i64) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDevice,
            7 => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// A point in time: seconds since the UNIX epoch plus nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timespec {
    /// Seconds since 1970-01-01T00:00:00Z (negative before).
    pub sec: i64,
    /// Nanoseconds within the second, `0..1_000_000_000`.
    pub nsec: u32,
}

impl Timespec {
    /// The current wall-clock time.
    pub fn now() -> Timespec {
        Timespec::from_system_time(SystemTime::now())
    }

    /// Converts a [`SystemTime`], including times before the epoch.
    pub fn from_system_time(t: SystemTime) -> Timespec {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                match d.subsec_nanos() {
                    0 => Timespec { sec, nsec: 0 },
                    n => Timespec {
                        sec: sec - 1,
                        nsec: 1_000_000_000 - n,
                    },
                }
            }
        }
    }
}

/// A time given explicitly or "now" (as in `utimensat` with `UTIME_NOW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeOrNow {
    /// The store's current wall-clock time at commit.
    Now,
    /// An explicit time.
    At(Timespec),
}

impl TimeOrNow {
    /// Resolves `Now` against `now`.
    pub fn resolve(self, now: Timespec) -> Timespec {
        match self {
            TimeOrNow::Now => now,
            TimeOrNow::At(t) => t,
        }
    }
}

/// Attributes of one inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// Inode number, never reused.
    pub ino: u64,
    /// File type.
    pub kind: FileKind,
    /// Permission bits only (`& 0o7777`, including suid/sgid/sticky); the
    /// type bits are NOT included. Use [`Attr::st_mode`] for `st_mode`.
    pub mode: u32,
    /// Number of directory entries naming this inode; for a directory
    /// 2 + number of subdirectories. 0 means orphan (see `orphans`).
    pub nlink: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Device number for character and block devices, else 0.
    pub rdev: u32,
    /// Size in bytes (for a symlink, the length of its target).
    pub size: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last content modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Inode generation; constant 1 because numbers are never reused.
    pub generation: u64,
}

impl Attr {
    /// `st_mode`: type bits or'ed with the permission bits.
    pub fn st_mode(&self) -> u32 {
        self.kind.type_bits() | self.mode
    }
}

/// Changes requested by `setattr`; `None` leaves a field unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (type bits, if present, are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (regular files only); updates the block map.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeOrNow>,
    /// New modification time (defaults to now when `size` changes).
    pub mtime: Option<TimeOrNow>,
    /// Explicit change time; by default ctime becomes now.
    pub ctime: Option<Timespec>,
}

/// Result of a size change: what the caller must clean up after commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TruncatedBlocks {
    /// Objects no block-map row references any more; delete them after commit.
    pub released: Vec<ObjectRef>,
    /// Index of a block that now extends past the new end of file. Its row's
    /// `len` was clamped to the new end; the caller may rewrite the object.
    pub partial_block: Option<u64>,
}

/// Arguments of `create` (mknod, mkdir, symlink and create in one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateArgs {
    /// Type of the new inode.
    pub kind: FileKind,
    /// Requested permission bits (type bits, if present, are ignored).
    pub mode: u32,
    /// Bits cleared from `mode`.
    pub umask: u32,
    /// Owner.
    pub uid: u32,
    /// Group (overridden by a set-group-ID parent directory).
    pub gid: u32,
    /// Device number for char/block devices.
    pub rdev: u32,
    /// Target bytes; required for [`FileKind::Symlink`], refused otherwise.
    pub symlink_target: Option<OsString>,
    /// The mount enforces POSIX ACLs: a default ACL on the parent is
    /// inherited (and `umask` then not applied), as `posix_acl_create`.
    pub inherit_acl: bool,
}

impl CreateArgs {
    /// Arguments for a kind with owner root and umask 0, no rdev, no target.
    pub fn new(kind: FileKind, mode: u32) -> CreateArgs {
        CreateArgs {
            kind,
            mode,
            umask: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink_target: None,
            inherit_acl: false,
        }
    }
}

/// Flags of `rename` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target name exists.
    pub noreplace: bool,
    /// Atomically swap two existing entries.
    pub exchange: bool,
}

/// Flags of `setxattr` (`XATTR_CREATE`, `XATTR_REPLACE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XattrFlags {
    /// Fail with `Exists` if the attribute exists.
    pub create: bool,
    /// Fail with `NoXattr` if the attribute does not exist.
    pub replace: bool,
    /// Setting an access ACL also clears set-group-ID: the caller is not
    /// in the file's group and lacks CAP_FSETID (the kernel's
    /// `FUSE_SETXATTR_ACL_KILL_SGID`, as `posix_acl_update_mode`).
    pub acl_kill_sgid: bool,
}

/// Result of `unlink`/`rmdir`, and of a target replaced by `rename`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unlinked {
    /// The inode that lost a name.
    pub ino: u64,
    /// Its link count afterwards; 0 means it is now an orphan awaiting `reclaim`.
    pub nlink_after: u32,
    /// Its type.
    pub kind: FileKind,
}

/// Result of `rename`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Renamed {
    /// The inode whose name was replaced, if any (never with `exchange`).
    pub replaced: Option<Unlinked>,
}

/// One directory entry returned by `readdir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode of the entry.
    pub ino: u64,
    /// Name of the entry (`.` and `..` included).
    pub name: OsString,
    /// Type of the entry.
    pub kind: FileKind,
    /// Cookie to pass as `offset` to continue after this entry.
    pub offset_next: u64,
}

/// One entry of [`crate::MetaStore::readdir_plus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryPlus {
    /// The entry.
    pub entry: DirEntry,
    /// Its inode's attributes (`None` for `.` and `..`).
    pub attr: Option<Attr>,
    /// Bytes of its committed blocks below its size (for `st_blocks`).
    pub committed_bytes: u64,
}

/// A reference to an object in object storage, by key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Object key, opaque to the metadata layer.
    pub key: String,
}

/// Start of the key of an inline block: one whose bytes are kept in its
/// block-map row (`BlockRef::inline`) instead of an object. The rest of
/// the key is unique per write, as an object key is; it names no object.
pub const INLINE_KEY_PREFIX: &str = "inline/";

/// Whether `key` is an inline block's (see [`INLINE_KEY_PREFIX`]).
pub fn is_inline_key(key: &str) -> bool {
    key.starts_with(INLINE_KEY_PREFIX)
}

/// One row of a file's block map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    /// Block index: the block covers bytes `index * block_size ..`.
    pub index: u64,
    /// Object holding the block's bytes, or an inline key
    /// ([`INLINE_KEY_PREFIX`]).
    pub object_key: String,
    /// Valid bytes in the block, `1..=block_size`; bytes after it read as zero.
    pub len: u32,
    /// An inline block's bytes as stored (the caller's encoding: Baton's
    /// block codec, keyed by `object_key`); `None` for an object. Read
    /// with the row, written by `commit_blocks`, copied by `share_blocks`.
    /// Only volumes of [`crate::INLINE_BLOCKS_FORMAT_VERSION`] or later
    /// hold them.
    pub inline: Option<Vec<u8>>,
}

impl BlockRef {
    /// A row naming an object.
    pub fn object(index: u64, object_key: impl Into<String>, len: u32) -> Self {
        BlockRef {
            index,
            object_key: object_key.into(),
            len,
            inline: None,
        }
    }

    /// Whether the block's bytes are in the row.
    pub fn is_inline(&self) -> bool {
        is_inline_key(&self.object_key)
    }
}

/// One write's metadata, committed atomically by `commit_blocks`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitBlocks {
    /// New file size, set exactly when `Some` (shrinking drops blocks past it).
    pub new_size: Option<u64>,
    /// New modification time; `None` leaves it.
    pub mtime: Option<TimeOrNow>,
    /// New change time; `None` leaves it (under the kernel's writeback
    /// cache the kernel owns mtime and ctime of a written file and sends
    /// them in a SETATTR of its own, which a later commit must not undo).
    pub ctime: Option<TimeOrNow>,
    /// Rows to insert or replace.
    pub blocks: Vec<BlockRef>,
    /// Indexes whose rows are removed (become holes).
    pub punched: Vec<u64>,
}

/// Whole blocks of one file to share with another (or another range of
/// the same file), committed atomically by `share_blocks`: the rows of
/// `source` at `source_first_index..+count` are copied, object keys and
/// all, to `first_index..+count` of the destination, over its rows there
/// (a hole in the source punches the destination). No byte is copied: both
/// rows name the same immutable object, which is deleted only once no row
/// names it (`docs/design-notes.md#block-sharing`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareBlocks {
    /// The inode whose rows are shared; its size must cover the whole
    /// source range.
    pub source: u64,
    /// First source block index.
    pub source_first_index: u64,
    /// First destination block index.
    pub first_index: u64,
    /// Blocks shared, at most `COMMIT_BLOCKS_ROWS_MAX` (0: none, the
    /// transaction only sets the size and times and records the request).
    pub count: u64,
    /// The destination's size grows to this if it is smaller (a copy's
    /// end); never shrinks.
    pub size_min: u64,
    /// What a recorded request reports (`Recorded::Copied`): the bytes the
    /// whole copy copied.
    pub copied_bytes: u64,
}

/// What a directory quota counts: every inode under the directory (not
/// the directory itself) once, hard links once per quota, orphans still
/// open until reclaimed; bytes are the sizes of the non-directories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaUsage {
    /// Sum of the sizes (`st_size`) of the regular files and symlinks.
    pub bytes: u64,
    /// Inodes, directories included.
    pub inodes: u64,
}

/// A quota on a directory: a byte limit and an inode limit, either or
/// both, and what it counts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The directory's inode.
    pub dir: u64,
    /// Byte limit (`None`: none).
    pub bytes_max: Option<u64>,
    /// Inode limit (`None`: none).
    pub inodes_max: Option<u64>,
    /// Usage as counted by every change, in the change's transaction.
    pub used: QuotaUsage,
}

/// A quota whose stored usage differs from a recount of its tree
/// ([`crate::MetaStore::recount_quotas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaDrift {
    /// The quota's directory.
    pub dir: u64,
    /// The usage stored.
    pub stored: QuotaUsage,
    /// The usage recounted.
    pub counted: QuotaUsage,
}

/// Usage numbers for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Inodes that exist, orphans included.
    pub inodes_used: u64,
    /// Sum of the `len` of all block-map rows.
    pub bytes_used: u64,
    /// The volume's block size.
    pub block_size_bytes: u32,
}

/// Parameters of a new volume, given to `format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeConfig {
    /// Human-readable volume name, non-empty.
    pub name: String,
    /// Where the data objects live, e.g. `s3://bucket/prefix`; stored only.
    pub storage_url: String,
    /// Block size, within [`crate::limits::BLOCK_SIZE_BYTES_MIN`]..=[`crate::limits::BLOCK_SIZE_BYTES_MAX`].
    pub block_size_bytes: u32,
}

impl VolumeConfig {
    /// Refuses an empty name or a block size outside the limits, with
    /// [`MetaError::InvalidConfig`] (before any engine creates anything).
    pub(crate) fn check(&self) -> Result<(), MetaError> {
        let bad = |reason: String| Err(MetaError::InvalidConfig { reason });
        if self.name.is_empty() {
            return bad("volume name is empty".into());
        }
        let bs = self.block_size_bytes;
        if !(BLOCK_SIZE_BYTES_MIN..=BLOCK_SIZE_BYTES_MAX).contains(&bs) {
            return bad(format!(
                "block size {bs} bytes is outside {BLOCK_SIZE_BYTES_MIN}..={BLOCK_SIZE_BYTES_MAX}"
            ));
        }
        Ok(())
    }
}

/// The volume record stored at format time; immutable afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    /// Volume name.
    pub name: String,
    /// Random 128-bit volume id.
    pub uuid: u128,
    /// Storage URL.
    pub storage_url: String,
    /// Block size in bytes.
    pub block_size_bytes: u32,
    /// Metadata format version (see [`crate::FORMAT_VERSION`]).
    pub format_version: u32,
    /// When the volume was formatted.
    pub created: Timespec,
}

/// Identifies one client request for exactly-once execution: the FUSE
/// connection it arrived on (uniques restart with every connection) and its
/// `unique` without the RESEND bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// Identity of the FUSE connection (chosen at mount, random).
    pub connection: u64,
    /// The request's `unique`, bit 63 (RESEND) masked.
    pub unique: u64,
}

impl RequestKey {
    /// The key of request `unique` on `connection`.
    pub fn new(connection: u64, unique: u64) -> RequestKey {
        RequestKey { connection, unique }
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}/{}", self.connection, self.unique)
    }
}

/// Who a session is: one FUSE connection of one mount, on one host. Every
/// generation serving that connection uses the same id (the connection's
/// random identity), so a generation that takes over after a crash
/// continues its predecessor's session and keeps its holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session id: the FUSE connection's identity.
    pub id: u64,
    /// Host name of the mount.
    pub host: String,
    /// Process serving it now.
    pub pid: u32,
    /// Mountpoint (or the volume, when serving through a holder).
    pub mount: String,
}

/// A registered session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// Who it is.
    pub info: SessionInfo,
    /// When it was first registered, in ms since the epoch (store clock).
    pub started_ms: i64,
    /// Its last heartbeat, in ms since the epoch (store clock: the server's
    /// for PostgreSQL, so hosts' clocks need not agree).
    pub heartbeat_ms: i64,
}

/// Which lock space a lock lives in: fcntl record locks and BSD `flock`
/// locks never conflict with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockSpace {
    /// fcntl F_SETLK byte-range locks, owned by a lock owner.
    Posix,
    /// flock whole-file locks, owned by an open file description.
    Flock,
}

impl LockSpace {
    /// The stored code.
    pub(crate) fn code(self) -> i64 {
        match self {
            LockSpace::Posix => 0,
            LockSpace::Flock => 1,
        }
    }

    /// The space of a stored code.
    pub(crate) fn from_code(code: i64) -> LockSpace {
        if code == 1 {
            LockSpace::Flock
        } else {
            LockSpace::Posix
        }
    }
}

/// A byte-range lock held by a mount, as the volume's other mounts see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLock {
    /// The lock owner on the holding mount (FUSE `lock_owner`; only
    /// meaningful there).
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`i64::MAX`: to the end of the file).
    pub end: u64,
    /// Exclusive (write) or shared (read).
    pub exclusive: bool,
    /// The process that took it, on the holding mount's host.
    pub pid: u32,
}

/// A POSIX lock request a mount has parked (F_SETLKW), as the volume's
/// other mounts see it: the wait its owner is in, for the cycle search
/// across sessions ([`crate::MetaStore::park_lock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWait {
    /// The request on its mount (the FUSE unique without the resend bit,
    /// so a request resent to a later generation keeps its row).
    pub key: u64,
    /// The inode whose lock is wanted.
    pub ino: u64,
    /// The lock wanted, by its owner.
    pub lock: RangeLock,
}

/// What [`crate::MetaStore::park_lock`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// Recorded: the request waits.
    Waiting,
    /// Not recorded: waiting would close a cycle of owners each waiting
    /// for a lock the next one holds (answer EDEADLK).
    WouldDeadlock,
}

impl RangeLock {
    /// Whether `self` and `other` cannot both be held (by different
    /// mounts): they overlap and one of them is exclusive.
    pub fn conflicts_with(&self, other: &RangeLock) -> bool {
        self.start <= other.end && other.start <= self.end && (self.exclusive || other.exclusive)
    }
}
