//! Every bound the metadata engine enforces, in one place (style: a limit on
//! everything, units last). Each one is reached by a test in `meta/tests/`.

/// Longest directory entry name, in bytes (`NAME_MAX`).
pub const NAME_LEN_MAX: usize = 255;
/// Longest symlink target, in bytes (`PATH_MAX` less the NUL).
pub const SYMLINK_TARGET_LEN_MAX: usize = 4095;
/// Longest xattr name, in bytes (`XATTR_NAME_MAX`).
pub const XATTR_NAME_LEN_MAX: usize = 255;
/// Largest xattr value, in bytes (`XATTR_SIZE_MAX`).
pub const XATTR_VALUE_LEN_MAX: usize = 65536;
/// Most xattrs on one inode; with [`XATTR_NAME_LEN_MAX`] this keeps a
/// `listxattr` answer under 64 KiB (`XATTR_LIST_MAX`).
pub const XATTR_COUNT_PER_INODE_MAX: u64 = 128;
/// Highest link count of an inode (`EMLINK` past it).
pub const NLINK_MAX: u32 = 65000;
/// Deepest directory chain walked when checking that a directory is not
/// moved into its own subtree; deeper means the tree is corrupt.
pub const DIR_DEPTH_MAX: u32 = 65536;
/// Most entries one `readdir` call returns; larger limits are clamped.
pub const READDIR_ENTRIES_MAX: u32 = 4096;
/// Most block-map rows one `blocks` call returns; larger counts are clamped.
pub const BLOCKS_QUERY_COUNT_MAX: u32 = 65536;
/// Most rows (written plus punched) one `commit_blocks` call may change.
pub const COMMIT_BLOCKS_ROWS_MAX: usize = 65536;
/// Largest stored form of an inline block (`BlockRef::inline`): the
/// caller's inline threshold plus its codec's overhead fit well below.
pub const INLINE_STORED_BYTES_MAX: usize = 68 * 1024;
/// Smallest block size accepted by `format`.
pub const BLOCK_SIZE_BYTES_MIN: u32 = 512;
/// Largest block size accepted by `format`.
pub const BLOCK_SIZE_BYTES_MAX: u32 = 256 * 1024 * 1024;
/// Longest file size: what fits SQLite's signed 64-bit integers.
pub const FILE_SIZE_BYTES_MAX: u64 = i64::MAX as u64;
/// Read-only connections in the SQLite reader pool.
pub const READ_CONNECTIONS_MAX: usize = 4;
/// Prepared statements each SQLite connection keeps (LRU). Above the number
/// of distinct statements the engine uses (about 60), so none is ever parsed
/// again: at rusqlite's default of 16 the writer re-prepared statements on
/// every unlink.
pub const PREPARED_STATEMENTS_CACHED_MAX: usize = 256;
/// How long a SQLite connection waits for a lock before failing.
pub const BUSY_TIMEOUT_MS: u64 = 5000;
/// Write-ahead log length, in pages, at which the checkpoint thread is
/// woken (`sqlite/checkpointer.rs`); SQLite's own default threshold.
pub const WAL_CHECKPOINT_PAGES: i32 = 1000;
/// A catch-up round beside the writers that copied at most this many new
/// pages is the last: the checkpoint thread then finishes with writes held
/// off.
pub const WAL_CHECKPOINT_FINISH_PAGES: i32 = 64;
/// Checkpoints beside the writers, at most, before the finishing one.
pub const WAL_CHECKPOINT_CATCH_UP_ROUNDS_MAX: u32 = 4;
/// Write-ahead log length, in pages, past which a COMMIT checkpoints itself
/// because the checkpoint thread has not kept up (16 MiB of 4 KiB pages).
/// Reached where fsync is slow and writes come faster than the thread's
/// rounds (a loaded CI machine); if the thread is mid-round, writes wait
/// for it instead. A higher bound would make that one commit's
/// checkpoint, and its stall, longer.
pub const WAL_CHECKPOINT_INLINE_PAGES: i32 = 4 * WAL_CHECKPOINT_PAGES;
/// Most inodes a directory renamed across quota boundaries may hold: the
/// rename moves each one's usage in its transaction; past this it is
/// refused with `EXDEV` (`mv` then copies and deletes).
pub const QUOTA_MOVE_INODES_MAX: u64 = 10_000;
/// Most lock owners (session, owner) the cycle search of a parked POSIX
/// lock request visits ([`crate::MetaStore::park_lock`]); past it the
/// request parks unchecked (logged): a missed deadlock waits until one of
/// its callers gives up, as before the search existed, but nothing is
/// refused on a guess.
pub const LOCK_WAIT_SEARCH_OWNERS_MAX: u32 = 1024;
