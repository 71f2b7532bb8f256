//! [`Staging`]: the durability mechanism for writes. An acknowledged write is
//! in a staged block file on local disk before the FUSE reply, so killing
//! the process loses nothing; [`Staging::sync`] adds fsync for FUSE fsync.
//!
//! # Layout
//!
//! ```text
//! staging_dir/FORMAT                        "baton-staging v1" + block size
//! staging_dir/BOOT                          the boot whose writes may be unsynced (`boot.rs`)
//! staging_dir/unsynced-{boot}/{ino:016x}/   what a crashed boot left staged, set aside
//! staging_dir/{ino:016x}/{index:08x}.blk    complete new content of a dirty block
//! staging_dir/{ino:016x}/size               size record (see `record`)
//! staging_dir/{ino:016x}/*.tmp              being written; deleted at open
//! staging_dir/retired/{ino:016x}.{n}        an empty inode dir, to be removed
//! ```
//!
//! An inode dir that a flush empties stays until the timer thread retires
//! it (`retire.rs`): moved into `retired/` under the
//! stripe lock, then removed. Removing a directory frees its block, and on
//! a filesystem mounted with `discard` and no journal (this project's CI
//! machines) that is a synchronous discard of ~0.3 ms: it must not be paid
//! inside a FLUSH. Older builds ignore `retired/` (not an inode dir name)
//! and treat an empty inode dir as nothing staged.
//!
//! A staged block file holds the **complete** new content of its block up
//! to its length (bytes past its length, within the block, are zeros): the
//! first write to a block copies the committed content (obtained through
//! the caller's `base` reader) into a temp file, applies the write, then
//! renames it into place. Holes stay sparse.
//!
//! # Which inodes are staged
//!
//! Every GETATTR, LOOKUP, READDIRPLUS entry and READ asks whether its
//! inode has staged data; almost always it has not, and asking the files
//! (a failed `open` of the size record) costs a path walk each time. So
//! once this process is the only writer ([`Staging::own`]: the generation
//! before it is dead, or fenced for a handover), each stripe knows the
//! inodes that may have staged files: those found by the scan in `own`,
//! and those this process staged for since (inserted under the stripe lock
//! before their first file is created). An inode leaves the set only when
//! a clear or discard removed its last file. Until `own` (a standby that
//! opened the area while its predecessor still writes), every question
//! goes to the files.
//!
//! # Truncation floor
//!
//! `set_size` records a *floor*: committed bytes at or past it are dead
//! (truncated away) until the next commit. Reads see zeros there unless a
//! block is staged, and the commit must drop committed blocks starting at or
//! past the floor and clamp the block containing it (see [`UploadSet`]).
//!
//! # Flush protocol and crash safety
//!
//! 1. [`Staging::take_for_upload`] reads staged blocks and the size record.
//! 2. The caller uploads the blocks ([`crate::BlockStore::put_blocks`]).
//! 3. The caller commits metadata in one transaction, applying
//!    [`UploadSet::floor_bytes`] first, then the new block mappings, then the size.
//! 4. [`Staging::clear`] removes what was taken, unless it changed meanwhile
//!    (per-block and per-record sequence numbers).
//!
//! A crash before 4 leaves staging intact, so redoing 1-4 after restart
//! (from [`Staging::recover`]) produces the same data: uploads use fresh
//! keys (a crash after 2 leaves unreferenced objects for garbage collection),
//! and re-applying the same floor, blocks and size is idempotent.

mod boot;
mod io;
mod record;
mod retire;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use crate::error::{BlocksError, Result};
use crate::private_fs;
pub use record::StagedSize;
use record::{SizeRecord, RECORD_BYTES};

/// Lock stripes: inodes hash onto this many locks.
pub const STAGING_LOCK_STRIPE_COUNT: usize = 64;
/// Maximum blocks returned by one [`Staging::take_for_upload`].
pub const UPLOAD_SET_BLOCK_COUNT_MAX: usize = 16;
/// Maximum length of one [`Staging::read_overlay`] request.
pub const OVERLAY_READ_BYTES_MAX: u64 = 64 << 20;
/// Largest supported block size.
pub const BLOCK_SIZE_BYTES_MAX: u64 = 256 << 20;
/// Largest supported file offset (POSIX `off_t`).
pub const FILE_SIZE_BYTES_MAX: u64 = i64::MAX as u64;
pub use retire::STAGING_RETIRE_DELAY;
const FORMAT_FILE: &str = "FORMAT";
const FORMAT_MAGIC: &str = "baton-staging v1";
const SIZE_FILE: &str = "size";
const TMP_SUFFIX: &str = ".tmp";
const RETIRED_DIR: &str = "retired";
const BLOCK_SUFFIX: &str = ".blk";

/// Staged data overlapping a read: apply over committed data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    /// Staged size, if any (clamp reads with [`StagedSize::resolve`]).
    pub size: Option<StagedSize>,
    /// Non-overlapping staged ranges, ascending; zeros where a truncation
    /// floor hides committed data.
    pub segments: Vec<OverlaySegment>,
}

/// One staged byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlaySegment {
    /// File offset of `data[0]`.
    pub offset: u64,
    /// The bytes.
    pub data: Bytes,
}

impl Overlay {
    /// Copies the segments over `buf`, which holds file bytes starting at `offset`.
    pub fn apply(&self, offset: u64, buf: &mut [u8]) {
        let end = offset.saturating_add(buf.len() as u64);
        for seg in &self.segments {
            let seg_end = seg.offset + seg.data.len() as u64;
            let (lo, hi) = (seg.offset.max(offset), seg_end.min(end));
            if lo < hi {
                let src = &seg.data[(lo - seg.offset) as usize..(hi - seg.offset) as usize];
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(src);
            }
        }
    }
}

/// One staged block handed out for upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedBlock {
    /// Block index.
    pub index: u64,
    /// Complete new block content (its length is the block's new length).
    pub data: Bytes,
    seq: u64,
}

/// What one flush must upload and commit; pass it back to [`Staging::clear`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadSet {
    /// Inode.
    pub ino: u64,
    /// Size to commit (`None`: keep the committed size).
    pub size: Option<StagedSize>,
    /// Truncation floor to apply first: drop committed blocks starting at or
    /// after it, clamp the committed block containing it to end there.
    pub floor_bytes: Option<u64>,
    /// Blocks to upload and map, ascending by index.
    pub blocks: Vec<StagedBlock>,
    /// False when more blocks remain staged (at most
    /// [`UPLOAD_SET_BLOCK_COUNT_MAX`] per set): take again after clearing.
    pub complete: bool,
    record_seq: Option<u64>,
    floor_seq: u64,
}

#[derive(Default)]
struct Stripe {
    /// Write sequence of blocks dirtied by this process ((ino, index) -> seq);
    /// blocks absent here (recovered ones) have seq 0.
    block_seq: HashMap<(u64, u64), u64>,
    /// Inodes of this stripe that may have staged files (module docs,
    /// "Which inodes are staged"); consulted once the area is owned.
    staged: HashSet<u64>,
}

/// The write staging area. See the module docs for layout and protocol.
pub struct Staging {
    dir: PathBuf,
    block_size_bytes: u64,
    stripes: Vec<Mutex<Stripe>>,
    seq_next: AtomicU64,
    /// Inode dirs emptied by flushes, waiting to be retired.
    emptied: Mutex<retire::EmptiedDirs>,
    /// Set by [`Staging::own`]: the stripes' `staged` sets are complete.
    owned: AtomicBool,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("dir", &self.dir)
            .field("block_size_bytes", &self.block_size_bytes)
            .finish()
    }
}

mod ops;
