//! The SQLite schema (formats 1 and 2 have the same tables; see
//! [`crate::FORMAT_VERSION`]), connection pragmas, and the checks `open`
//! runs before touching a file so a foreign file is never modified.
//!
//! The format version is kept twice and both must agree: `PRAGMA
//! user_version` and `volume.format_version`. The tables:
//!
//! ```text
//! volume(id=1, magic='baton-meta', format_version, name, uuid BLOB(16, big-endian),
//!        storage_url, block_size_bytes, created_sec, created_nsec)
//! inodes(ino INTEGER PRIMARY KEY AUTOINCREMENT   -- AUTOINCREMENT: never reused
//!        generation, kind (1 reg 2 dir 3 symlink 4 fifo 5 sock 6 chr 7 blk),
//!        mode (permission bits only), nlink, uid, gid, rdev, size,
//!        atime_sec/nsec, mtime_sec/nsec, ctime_sec/nsec,
//!        parent -- directories: the directory holding its entry (for ..);
//!                  a regular file: only while it is an unnamed O_TMPFILE
//!                  that may be linked, the directory it was made in
//!                  (ops/inode.rs `linkable_tmpfile_dir`); NULL otherwise)
//! dentries(cookie INTEGER PRIMARY KEY AUTOINCREMENT -- readdir cookie, never reused
//!        parent -> inodes, name BLOB, ino -> inodes, UNIQUE(parent, name))
//!        + index on (parent, cookie), added in place by `open`
//! symlinks(ino -> inodes PRIMARY KEY, target BLOB)
//! xattrs(ino -> inodes, name BLOB, value BLOB, PRIMARY KEY(ino, name))
//! blocks(ino -> inodes, idx, object_key TEXT, len, inline_data BLOB,
//!        PRIMARY KEY(ino, idx))
//!        + index on object_key (a key is released only when no row uses it)
//!        inline_data: an inline block's bytes (format 3), else NULL; the
//!        column is added in place by `open`
//! orphans(ino -> inodes PRIMARY KEY, since_sec)  -- nlink 0, awaiting reclaim
//! request_results(connection, unique_id, result BLOB, recorded_sec,
//!        PRIMARY KEY(connection, unique_id))   -- see ops/requests.rs
//! sessions(id PRIMARY KEY, host, pid, mount, started_ms, heartbeat_ms)
//! orphan_holds(session -> sessions, ino -> inodes, PRIMARY KEY(session, ino))
//!        -- see ops/sessions.rs; both added in place by `open`
//! quotas(ino -> inodes PRIMARY KEY, bytes_max, inodes_max, bytes_used,
//!        inodes_used)                          -- see ops/quota.rs
//! quota_charges(quota -> quotas, ino -> inodes, PRIMARY KEY(quota, ino))
//!        -- the inodes each quota counts; both added in place by `open`
//! reserved_ranges(ino -> inodes, idx, end_idx, last_len, PRIMARY KEY(ino, idx))
//!        -- fallocate's reserved holes, a row per run of blocks
//!           (ops/reserve.rs); added by `open`, which converts the rows
//!           of the `reservations` table (a row per block) of earlier
//!           builds into it
//! locks(session -> sessions, ino -> inodes, space, owner, start_byte,
//!        end_byte, exclusive, pid)              -- held (ops/locks.rs)
//! lock_waits(session -> sessions, wait_key, ino -> inodes, owner,
//!        start_byte, end_byte, exclusive, pid, PRIMARY KEY(session, wait_key))
//!        -- parked POSIX requests (ops/locks.rs); both added by `open`
//! ```
//! u64 values (request keys) are stored bit-cast to i64.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::error::{MetaError, Result};
use crate::limits::{BUSY_TIMEOUT_MS, PREPARED_STATEMENTS_CACHED_MAX};
use crate::types::{Timespec, VolumeRecord};
use crate::FORMAT_VERSION;

/// Value of `volume.magic`.
const MAGIC: &str = "baton-meta";
/// First 16 bytes of every SQLite 3 database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

const DDL: &str = "
CREATE TABLE volume (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    magic TEXT NOT NULL,
    format_version INTEGER NOT NULL,
    name TEXT NOT NULL,
    uuid BLOB NOT NULL,
    storage_url TEXT NOT NULL,
    block_size_bytes INTEGER NOT NULL,
    created_sec INTEGER NOT NULL,
    created_nsec INTEGER NOT NULL
);
CREATE TABLE inodes (
    ino INTEGER PRIMARY KEY AUTOINCREMENT,
    generation INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    nlink INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    rdev INTEGER NOT NULL,
    size INTEGER NOT NULL,
    atime_sec INTEGER NOT NULL, atime_nsec INTEGER NOT NULL,
    mtime_sec INTEGER NOT NULL, mtime_nsec INTEGER NOT NULL,
    ctime_sec INTEGER NOT NULL, ctime_nsec INTEGER NOT NULL,
    parent INTEGER
);
CREATE TABLE dentries (
    cookie INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL REFERENCES inodes(ino),
    name BLOB NOT NULL,
    ino INTEGER NOT NULL REFERENCES inodes(ino),
    UNIQUE (parent, name)
);
CREATE INDEX dentries_by_ino ON dentries(ino);
CREATE TABLE symlinks (
    ino INTEGER PRIMARY KEY REFERENCES inodes(ino) ON DELETE CASCADE,
    target BLOB NOT NULL
);
CREATE TABLE xattrs (
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    name BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
CREATE TABLE blocks (
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    object_key TEXT NOT NULL,
    len INTEGER NOT NULL,
    inline_data BLOB,
    PRIMARY KEY (ino, idx)
) WITHOUT ROWID;
CREATE INDEX blocks_by_object_key ON blocks(object_key);
CREATE TABLE orphans (
    ino INTEGER PRIMARY KEY REFERENCES inodes(ino) ON DELETE CASCADE,
    since_sec INTEGER NOT NULL
);
";

/// The request-results table (`ops/requests.rs`) and its index. It is
/// additive to format v1 (it replaced the unused `completed_requests` of the
/// first v1 builds): `IF NOT EXISTS`, so [`ensure_additive_tables`] creates
/// it when an older v1 database is opened; v1 builds that predate it never
/// touch it.
pub(crate) const REQUESTS_DDL: &str = "
CREATE TABLE IF NOT EXISTS request_results (
    connection INTEGER NOT NULL,
    unique_id INTEGER NOT NULL,
    result BLOB NOT NULL,
    recorded_sec INTEGER NOT NULL,
    PRIMARY KEY (connection, unique_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS request_results_by_time ON request_results(recorded_sec);
";

/// The session tables (`ops/sessions.rs`); `IF NOT EXISTS` so a database made before them gets them at
/// open (additive to format v1).
pub(crate) const SESSIONS_DDL: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    mount TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS orphan_holds (
    session INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    PRIMARY KEY (session, ino)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS orphan_holds_by_ino ON orphan_holds(ino);
";

/// The locks each session (mount) holds (`ops/locks.rs`).
pub(crate) const LOCKS_DDL: &str = "
CREATE TABLE IF NOT EXISTS locks (
    session INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    space INTEGER NOT NULL,
    owner INTEGER NOT NULL,
    start_byte INTEGER NOT NULL,
    end_byte INTEGER NOT NULL,
    exclusive INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    PRIMARY KEY (session, ino, space, owner, start_byte)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS locks_by_ino ON locks(ino, space);
";

/// The POSIX lock requests each session has parked (`ops/locks.rs`: the
/// cycle search across sessions); additive, added at open. A build from
/// before it publishes no waits, so its cycles through other sessions go
/// unseen, as they did.
pub(crate) const LOCK_WAITS_DDL: &str = "
CREATE TABLE IF NOT EXISTS lock_waits (
    session INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    wait_key INTEGER NOT NULL,
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    owner INTEGER NOT NULL,
    start_byte INTEGER NOT NULL,
    end_byte INTEGER NOT NULL,
    exclusive INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    PRIMARY KEY (session, wait_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lock_waits_by_owner ON lock_waits(session, owner);
";

/// Space fallocate reserved over holes (`ops/reserve.rs`), a row per run
/// of blocks; `IF NOT EXISTS`, added at open (additive to format v1). A
/// build from before it ignores it: its statfs and quotas then count only
/// blocks and sizes (`fsctl fsck --repair-quotas` recounts).
pub(crate) const RESERVED_RANGES_DDL: &str = "
CREATE TABLE IF NOT EXISTS reserved_ranges (
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    end_idx INTEGER NOT NULL,
    last_len INTEGER NOT NULL,
    PRIMARY KEY (ino, idx)
) WITHOUT ROWID;
";

/// Moves the rows of `reservations`, the table of the builds that kept a
/// row per reserved block, into `reserved_ranges` (a run of one block
/// each; one a run already covers is dropped: a build from before the runs
/// ran between two later ones), in one transaction; the emptied table
/// stays (those builds create it anyway).
fn convert_block_reservations(conn: &Connection) -> Result<()> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reservations')",
        [],
        |r| r.get(0),
    )?;
    // Read first: an open with nothing to convert takes no write lock.
    let rows = exists
        && conn.query_row("SELECT EXISTS (SELECT 1 FROM reservations)", [], |r| {
            r.get::<_, bool>(0)
        })?;
    if rows {
        // Rolled back on drop if a statement fails.
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(
            "INSERT OR IGNORE INTO reserved_ranges (ino, idx, end_idx, last_len)
                 SELECT o.ino, o.idx, o.idx + 1, o.len FROM reservations o
                 WHERE NOT EXISTS (SELECT 1 FROM reserved_ranges r
                                   WHERE r.ino = o.ino AND r.idx <= o.idx AND r.end_idx > o.idx);
             DELETE FROM reservations;",
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// Directory quotas and the inodes each counts (`ops/quota.rs`). Additive:
/// a volume without them has no quota, which empty tables say too.
pub(crate) const QUOTAS_DDL: &str = "
CREATE TABLE IF NOT EXISTS quotas (
    ino INTEGER PRIMARY KEY REFERENCES inodes(ino) ON DELETE CASCADE,
    bytes_max INTEGER,
    inodes_max INTEGER,
    bytes_used INTEGER NOT NULL,
    inodes_used INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quota_charges (
    quota INTEGER NOT NULL REFERENCES quotas(ino) ON DELETE CASCADE,
    ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
    PRIMARY KEY (quota, ino)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS quota_charges_by_ino ON quota_charges(ino, quota);
";

/// The last operation-log record committed (`sqlite/oplog.rs`); additive,
/// added at open.
pub(crate) const OPLOG_DDL: &str = "
CREATE TABLE IF NOT EXISTS oplog_applied (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
";

/// A directory's entries in cookie order from a cookie (readdir). Without
/// it every READDIR batch read and sorted all of the directory's entries
/// (a temporary B-tree per batch), so listing n entries cost O(n²): 78 ms
/// for 10,000 entries in SQL alone, 6 ms with it. Additive: builds from
/// before it neither need nor mind it, and SQLite keeps it current for
/// them too.
pub(crate) const DENTRIES_BY_PARENT_DDL: &str =
    "CREATE INDEX IF NOT EXISTS dentries_by_parent_cookie ON dentries(parent, cookie);";

/// Creates the tables and indexes added to format v1 after its first
/// builds in a database made before they existed (the first open by a
/// newer build; an index over a large table takes a while to build once).
pub(crate) fn ensure_additive_tables(conn: &Connection) -> Result<()> {
    conn.execute_batch(REQUESTS_DDL)?;
    conn.execute_batch(SESSIONS_DDL)?;
    conn.execute_batch(LOCKS_DDL)?;
    conn.execute_batch(DENTRIES_BY_PARENT_DDL)?;
    conn.execute_batch(QUOTAS_DDL)?;
    conn.execute_batch(RESERVED_RANGES_DDL)?;
    convert_block_reservations(conn)?;
    conn.execute_batch(LOCK_WAITS_DDL)?;
    conn.execute_batch(OPLOG_DDL)?;
    ensure_inline_column(conn)
}

/// Adds `blocks.inline_data` to a database made before it existed. Older
/// builds name the columns they read, so the column is invisible to them;
/// only a format-3 volume ever fills it.
fn ensure_inline_column(conn: &Connection) -> Result<()> {
    let present: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('blocks') WHERE name = 'inline_data')",
        [],
        |r| r.get(0),
    )?;
    if !present {
        conn.execute_batch("ALTER TABLE blocks ADD COLUMN inline_data BLOB")?;
    }
    Ok(())
}

/// Creates the tables, the volume row and the root directory (inode 1) in
/// one transaction on a fresh, empty database configured by
/// [`configure_writer`].
pub(crate) fn create(conn: &mut Connection, volume: &VolumeRecord) -> Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(DDL)?;
    tx.execute_batch(REQUESTS_DDL)?;
    tx.execute_batch(SESSIONS_DDL)?;
    tx.execute_batch(LOCKS_DDL)?;
    tx.execute_batch(DENTRIES_BY_PARENT_DDL)?;
    tx.execute_batch(QUOTAS_DDL)?;
    tx.execute_batch(RESERVED_RANGES_DDL)?;
    tx.execute_batch(LOCK_WAITS_DDL)?;
    tx.execute_batch(OPLOG_DDL)?;
    tx.execute(
        "INSERT INTO volume (id, magic, format_version, name, uuid, storage_url,
             block_size_bytes, created_sec, created_nsec)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            MAGIC,
            volume.format_version,
            volume.name,
            volume.uuid.to_be_bytes().to_vec(),
            volume.storage_url,
            volume.block_size_bytes,
            volume.created.sec,
            volume.created.nsec,
        ],
    )?;
    let t = volume.created;
    tx.execute(
        "INSERT INTO inodes (ino, generation, kind, mode, nlink, uid, gid, rdev, size,
             atime_sec, atime_nsec, mtime_sec, mtime_nsec, ctime_sec, ctime_nsec, parent)
         VALUES (1, 1, 2, 493, 2, 0, 0, 0, 0, ?1, ?2, ?1, ?2, ?1, ?2, 1)",
        params![t.sec, t.nsec],
    )?;
    tx.pragma_update(None, "user_version", FORMAT_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// Process-wide SQLite settings, applied once before the first connection
/// opens (later calls, and a library some other code already initialised,
/// keep the defaults: SQLite refuses configuration after initialisation).
///
/// No bulk page-cache allocation: by default every page cache SQLite
/// creates starts with a 20-page (about 85 KiB) allocation. Each
/// statement that needs a temporary b-tree creates one (`RETURNING`, and
/// the `ON DELETE CASCADE` actions of deleting an inode, four per orphan
/// reclaimed), and glibc hands that memory back in between, so every
/// reclaim paid page faults and zeroing for about 400 KiB; profiled, that
/// was a third of the time an unlink burst held the writer. Pages are
/// then allocated one by one, as they are used.
pub(crate) fn configure_library() {
    static CONFIGURED: std::sync::Once = std::sync::Once::new();
    CONFIGURED.call_once(|| {
        // SAFETY: SQLITE_CONFIG_PAGECACHE takes (void *, int, int); a null
        // buffer with 0 pages only sets the bulk allocation size. Called
        // before any connection of this process opens (or refused with
        // SQLITE_MISUSE, changing nothing).
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0 as std::ffi::c_int,
                0 as std::ffi::c_int,
            )
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(rc, "SQLite already initialised; page cache defaults kept");
        }
    });
}

/// How often a writer waiting for SQLite's write lock tries again.
const BUSY_POLL: Duration = Duration::from_micros(100);

/// The writer connections' busy handler: tries again every [`BUSY_POLL`]
/// for [`BUSY_TIMEOUT_MS`]. SQLite's own (`busy_timeout`) sleeps 1, 2, 5,
/// ... up to 100 ms between tries, and a process that commits in batches
/// (`oplog.rs`) holds the lock for 5 ms at a time and takes it again tens
/// of microseconds after each commit: another process (`fsctl`, the next
/// generation) polling that slowly waited seconds. Polled this often it
/// finds a gap within a few batches.
pub(crate) fn busy_poll(attempt: i32) -> bool {
    let attempts_max = BUSY_TIMEOUT_MS * 1000 / BUSY_POLL.as_micros() as u64;
    if u64::try_from(attempt).unwrap_or(u64::MAX) >= attempts_max {
        return false;
    }
    std::thread::sleep(BUSY_POLL);
    true
}

/// Sets the pragmas every read-write connection uses.
///
/// `synchronous = NORMAL` in WAL mode: a commit is a `write(2)` of its WAL
/// frames without fsync, so a committed transaction survives the death of
/// the process (the frames are in the kernel's page cache) but the latest
/// ones can be lost by a power loss or kernel crash until the next
/// [`super::SqliteMeta::sync`] or checkpoint (which fsyncs the WAL first and
/// the database after). The database is never corrupted either way.
pub(crate) fn configure_writer(conn: &mut Connection) -> Result<()> {
    conn.busy_handler(Some(busy_poll))?;
    keep_plans(conn)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Statement journals and temporary b-trees in memory. Each request is
    // a savepoint of a batch (`oplog.rs`), which copies every page it
    // first changes into a sub-journal; once one request passed 64 KiB of
    // it (a release of many orphans can), SQLite moved it to a temporary
    // file for the rest of the batch: two `pwrite`s per page, on the disk.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    set_wal(conn)
}

/// Opens one read-only pool connection.
pub(crate) fn open_reader(path: &Path) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
    keep_plans(&conn)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// Keeps every prepared statement, and turns on the query planner
/// stability guarantee. Without it SQLite
/// re-prepares (parses and plans again) a cached statement with bound
/// parameters and an `ORDER BY` on EVERY run, because the plan may depend
/// on the parameter values; measured at 40 % of the CPU time of a stat-heavy
/// workload. Our queries are all primary-key or index lookups, so one plan
/// is right for every value.
fn keep_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.set_prepared_statement_cache_capacity(PREPARED_STATEMENTS_CACHED_MAX);
    Ok(())
}

/// Puts the database in WAL mode (it stays so), and makes `conn` read the
/// file, so it knows the mode.
pub(crate) fn set_wal(conn: &Connection) -> Result<()> {
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(MetaError::corrupt(format!(
            "SQLite refused WAL journal mode (got {mode})"
        )));
    }
    Ok(())
}

/// Checks that `path` is a Baton metadata database this build can read,
/// without writing to it, and returns its volume record.
pub(crate) fn validate(path: &Path, conn: &Connection) -> Result<VolumeRecord> {
    check_header(path)?;
    let foreign = |reason: &str| MetaError::Foreign {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let user_version: u32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| foreign(&format!("SQLite cannot read it: {e}")))?;
    let has_volume: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'volume'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| foreign(&format!("SQLite cannot read it: {e}")))?;
    if has_volume.is_none() {
        return Err(foreign("no volume table"));
    }
    let magic: Option<String> = conn
        .query_row("SELECT magic FROM volume WHERE id = 1", [], |r| r.get(0))
        .optional()
        .map_err(|e| foreign(&format!("unreadable volume table: {e}")))?;
    if magic.as_deref() != Some(MAGIC) {
        return Err(foreign("volume record missing or not Baton's"));
    }
    if user_version > FORMAT_VERSION {
        return Err(MetaError::UnsupportedVersion {
            found: user_version,
            supported: FORMAT_VERSION,
        });
    }
    let volume = read_volume(conn)?;
    if volume.format_version != user_version {
        return Err(MetaError::corrupt(format!(
            "format version {} in volume record but {user_version} in user_version",
            volume.format_version
        )));
    }
    Ok(volume)
}

/// How long a database file shorter than its header says may take to
/// grow: a checkpoint in another process (the serving generation, while a
/// standby or an upgrade's new generation opens the volume) writes page 1,
/// with the new page count, first and the pages that extend the file last.
const CHECKPOINT_GROWTH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn check_header(path: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + CHECKPOINT_GROWTH_WAIT;
    loop {
        match check_header_once(path) {
            Err(MetaError::Corrupt { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn check_header_once(path: &Path) -> Result<()> {
    let io = |source| MetaError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let file_bytes = file.metadata().map_err(io)?.len();
    let mut head = Vec::with_capacity(HEADER_BYTES);
    (&mut file)
        .take(HEADER_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    if !head.starts_with(SQLITE_HEADER) {
        return Err(MetaError::Foreign {
            path: path.to_owned(),
            reason: "not a SQLite database file".to_owned(),
        });
    }
    if let Some((page_size, page_count)) = header_pages(&head) {
        // The header's page count is the file's size at the last checkpoint
        // (later pages live in the WAL): a shorter file lost pages, and
        // SQLite would only find out when a query touched them (EIO on rm),
        // unless a checkpoint is under way (`check_header` waits for it) or
        // was killed after page 1: the WAL still holds every page it was
        // copying, and SQLite copies them again.
        let expected = page_count * page_size;
        let first_missing = file_bytes / page_size + 1;
        if file_bytes < expected && !wal_holds(path, page_size, first_missing..=page_count)? {
            return Err(MetaError::corrupt(format!(
                "{} is truncated: {file_bytes} bytes where its header says {expected}",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Whether the write-ahead log beside `path` (`-wal`) holds every page of
/// `pages` in a frame of its current generation (the salts of its header;
/// older frames are dead). No log, or one of another page size: `false`.
fn wal_holds(path: &Path, page_size: u64, pages: std::ops::RangeInclusive<u64>) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    const WAL_HEADER_BYTES: u64 = 32;
    const FRAME_HEADER_BYTES: u64 = 24;
    let wal_path = super::wal_path(path);
    let io = |source| MetaError::Io {
        path: wal_path.clone(),
        source,
    };
    let wal = match std::fs::File::open(&wal_path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(io(err)),
    };
    let wal_bytes = wal.metadata().map_err(io)?.len();
    let mut header = [0u8; WAL_HEADER_BYTES as usize];
    if wal_bytes < WAL_HEADER_BYTES || wal.read_exact_at(&mut header, 0).is_err() {
        return Ok(false);
    }
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if !matches!(be32(&header, 0), 0x377f_0682 | 0x377f_0683)
        || u64::from(be32(&header, 8)) != page_size
    {
        return Ok(false);
    }
    let salts = &header[16..24];
    // Frames count once a commit frame (a non-zero database size) follows:
    // SQLite ignores those after the last commit.
    let mut held = std::collections::BTreeSet::new();
    let mut uncommitted = Vec::new();
    let mut at = WAL_HEADER_BYTES;
    let mut frame = [0u8; FRAME_HEADER_BYTES as usize];
    while at + FRAME_HEADER_BYTES + page_size <= wal_bytes {
        wal.read_exact_at(&mut frame, at).map_err(io)?;
        if &frame[8..16] == salts {
            uncommitted.push(u64::from(be32(&frame, 0)));
            if be32(&frame, 4) != 0 {
                held.extend(uncommitted.drain(..));
            }
        }
        at += FRAME_HEADER_BYTES + page_size;
    }
    Ok(pages.into_iter().all(|page| held.contains(&page)))
}

/// Bytes of the database file header SQLite documents.
const HEADER_BYTES: usize = 100;

/// The page size and page count the header records, if the header says
/// that count is valid (written by SQLite 3.7.0 or later: its
/// version-valid-for number equals the change counter).
fn header_pages(head: &[u8]) -> Option<(u64, u64)> {
    let be32 = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(head.get(at..at + 4)?.try_into().ok()?))
    };
    let page_size = match u16::from_be_bytes(head.get(16..18)?.try_into().ok()?) {
        1 => 65536,
        n => u64::from(n),
    };
    let page_count = u64::from(be32(28)?);
    (page_size > 0 && page_count > 0 && be32(24)? == be32(92)?).then_some((page_size, page_count))
}

fn read_volume(conn: &Connection) -> Result<VolumeRecord> {
    let row = conn.query_row(
        "SELECT format_version, name, uuid, storage_url, block_size_bytes,
                created_sec, created_nsec
         FROM volume WHERE id = 1",
        [],
        |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, u32>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, u32>(6)?,
            ))
        },
    )?;
    let (format_version, name, uuid, storage_url, block_size_bytes, sec, nsec) = row;
    let uuid: [u8; 16] = uuid
        .try_into()
        .map_err(|_| MetaError::corrupt("volume uuid is not 16 bytes"))?;
    Ok(VolumeRecord {
        name,
        uuid: u128::from_be_bytes(uuid),
        storage_url,
        block_size_bytes,
        format_version,
        created: Timespec { sec, nsec },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A database file of `file_pages` pages of 4 KiB whose header says it
    /// has `header_pages`.
    fn database_file(path: &Path, header_pages: u32, file_pages: u64) {
        let mut head = vec![0u8; HEADER_BYTES];
        head[..16].copy_from_slice(SQLITE_HEADER);
        head[16..18].copy_from_slice(&4096u16.to_be_bytes());
        head[24..28].copy_from_slice(&7u32.to_be_bytes());
        head[28..32].copy_from_slice(&header_pages.to_be_bytes());
        head[92..96].copy_from_slice(&7u32.to_be_bytes());
        std::fs::write(path, &head).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(file_pages * 4096)
            .unwrap();
    }

    #[test]
    fn a_file_a_checkpoint_is_still_growing_passes_and_a_truncated_one_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        database_file(&path, 3, 3);
        check_header(&path).unwrap();

        // Another process's checkpoint: page 1 (the new count) written,
        // the last page not yet.
        database_file(&path, 3, 2);
        let growing = path.clone();
        let checkpoint = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::File::options()
                .write(true)
                .open(&growing)
                .unwrap()
                .set_len(3 * 4096)
                .unwrap();
        });
        check_header(&path).unwrap();
        checkpoint.join().unwrap();

        database_file(&path, 3, 2);
        let started = std::time::Instant::now();
        let err = check_header(&path).unwrap_err();
        assert!(err.to_string().contains("is truncated"), "{err}");
        assert!(started.elapsed() >= CHECKPOINT_GROWTH_WAIT);
    }

    /// A WAL of 4 KiB pages whose header has `salts`, with a frame per
    /// `(page, frame salts)`.
    fn wal_file(db: &Path, salts: [u8; 8], frames: &[(u32, [u8; 8])]) {
        let mut wal = vec![0u8; 32];
        wal[0..4].copy_from_slice(&0x377f_0682u32.to_be_bytes());
        wal[4..8].copy_from_slice(&3_007_000u32.to_be_bytes());
        wal[8..12].copy_from_slice(&4096u32.to_be_bytes());
        wal[16..24].copy_from_slice(&salts);
        for (i, &(page, frame_salts)) in frames.iter().enumerate() {
            let mut header = vec![0u8; 24];
            header[0..4].copy_from_slice(&page.to_be_bytes());
            // The last frame commits the transaction.
            if i + 1 == frames.len() {
                header[4..8].copy_from_slice(&4u32.to_be_bytes());
            }
            header[8..16].copy_from_slice(&frame_salts);
            wal.extend_from_slice(&header);
            wal.extend_from_slice(&[0u8; 4096]);
        }
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        std::fs::write(path, wal).unwrap();
    }

    /// A real SQLite database whose checkpoint was killed after it wrote
    /// page 1: a copy taken while the writer is open (the WAL holds every
    /// page since the file was made), then page 1 copied from the WAL
    /// into the file, as a checkpoint does first. It opens, and every row
    /// reads back.
    #[test]
    fn a_database_whose_checkpoint_was_killed_after_page_1_opens_with_every_row() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.db");
        let c = Connection::open(&live).unwrap();
        c.pragma_update(None, "journal_mode", "wal").unwrap();
        c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
            .unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        for i in 0..200 {
            c.execute("INSERT INTO t VALUES (?1, zeroblob(3000))", [i])
                .unwrap();
        }
        let path = dir.path().join("meta.db");
        std::fs::copy(&live, &path).unwrap();
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::copy(dir.path().join("live.db-wal"), &wal).unwrap();
        drop(c);

        // The newest frame of page 1, written over the file's page 1.
        let wal = std::fs::read(&wal).unwrap();
        let frame_bytes = 24 + 4096;
        let page_1 = (0..(wal.len() - 32) / frame_bytes)
            .map(|i| 32 + i * frame_bytes)
            .rfind(|&at| {
                wal[at..at + 4] == 1u32.to_be_bytes() && wal[at + 8..at + 16] == wal[16..24]
            })
            .unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.write_all_at(&wal[page_1 + 24..page_1 + frame_bytes], 0)
            .unwrap();
        drop(file);
        let head = std::fs::read(&path).unwrap();
        let (page_size, pages) = header_pages(&head).unwrap();
        assert!(
            (head.len() as u64) < page_size * pages,
            "the file is shorter than its header says"
        );

        check_header(&path).unwrap();
        let c = Connection::open(&path).unwrap();
        let rows: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 200);
        assert_eq!(
            c.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
                .unwrap(),
            "ok"
        );
    }

    #[test]
    fn a_file_a_killed_checkpoint_left_short_passes_when_its_wal_holds_the_missing_pages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        // A checkpoint killed after page 1: the header says 4 pages, the
        // file has 2, and the WAL holds pages 3 and 4.
        database_file(&path, 4, 2);
        let live = [1, 2, 3, 4, 5, 6, 7, 8];
        wal_file(&path, live, &[(3, live), (1, live), (4, live)]);
        let started = std::time::Instant::now();
        check_header(&path).unwrap();
        assert!(started.elapsed() < CHECKPOINT_GROWTH_WAIT, "no wait");

        // Page 4 only in a dead frame (older salts): truncated.
        let old = [9, 9, 9, 9, 9, 9, 9, 9];
        wal_file(&path, live, &[(3, live), (4, old)]);
        let err = check_header_once(&path).unwrap_err();
        assert!(err.to_string().contains("is truncated"), "{err}");
        // Page 4 missing from the WAL: truncated.
        wal_file(&path, live, &[(3, live)]);
        assert!(check_header_once(&path).is_err());
    }
}
