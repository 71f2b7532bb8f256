//! [`SqliteMeta`]: the embedded SQLite engine behind [`MetaStore`].
//!
//! Connections: one read-write connection behind a mutex serialises all
//! writes, in batches (one `BEGIN IMMEDIATE` transaction for up to 5 ms of
//! requests, each in a `SAVEPOINT`, `oplog.rs`); reads run on it when it is free
//! (its page cache stays warm across its own writes), else on a pool of
//! [`READ_CONNECTIONS_MAX`] read-only connections beside the writer (WAL
//! mode). A multi-statement read runs in its own deferred transaction so it
//! sees one snapshot; a one-statement read (lookup, getattr) needs none. A
//! thread with a connection of its own copies the write-ahead log back
//! into the database (`checkpointer.rs`). Pragmas: `journal_mode = WAL`,
//! `synchronous = NORMAL`, `foreign_keys = ON`, `temp_store = MEMORY`, and
//! a busy handler that polls every 100 µs (`schema::busy_poll`).
//!
//! # Durability
//! - A write survives the death of the process at any instant (kill -9,
//!   OOM) once it returned: its row changes were appended to the operation
//!   log with `write(2)` (`oplog.rs`; the next writer replays them), and
//!   its batch's commit writes its WAL frames with `write(2)`; the kernel
//!   keeps both.
//! - It survives a power loss or kernel crash once [`MetaStore::sync`]
//!   returned after it (the batch's commit, an fdatasync of the `-wal` file, plus one fsync of
//!   the directory the first time so the `-wal` entry itself is durable), or
//!   once a checkpoint copied it (SQLite fsyncs the WAL before and the
//!   database after each checkpoint in this mode).
//!
//! This is the contract of a local POSIX filesystem (rename/unlink/create
//! are durable after `fsync` of the directory), and it costs a `write(2)`
//! per request instead of an fsync.
//!
//! The schema (v1: tables, columns, versioning) is documented at the top of
//! `sqlite/schema.rs`.
//!
//! A panic inside a request poisons its mutex; its savepoint was rolled back
//! on unwind, so the connection is reused as is.

mod checkpointer;
mod oplog;
mod reserve;
mod row_changes;
mod row_events;
mod schema;

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rusqlite::{Connection, OpenFlags};

use self::checkpointer::Checkpointer;
use self::oplog::{Batching, Flusher, Logged, OpLog};
use self::row_changes::Capture;
use crate::answered::AnsweredQueue;
use crate::engine::Engine;
use crate::error::{MetaError, Result};
use crate::limits::READ_CONNECTIONS_MAX;
use crate::ops::requests;
use crate::record::Recorded;
use crate::row_cache::RowCache;
use crate::store::Location;
use crate::tx_stats::{TxCounters, TxKind};
use crate::types::{RequestKey, Timespec, VolumeConfig, VolumeRecord};
use crate::FORMAT_VERSION;

/// A Baton volume's metadata in a SQLite database file.
#[derive(Debug)]
pub struct SqliteMeta {
    path: PathBuf,
    volume: VolumeRecord,
    writer: Arc<Mutex<Connection>>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    /// Answered requests whose records a later write deletes.
    answered: AnsweredQueue,
    tx: TxCounters,
    /// Set by `fence`: every later write fails with `Fenced`.
    fenced: AtomicBool,
    /// Corruption found while serving: writes refused.
    quarantine: crate::quarantine::Quarantine,
    /// The directory was fsynced after the `-wal` file existed.
    wal_entry_synced: AtomicBool,
    /// Checkpoints the write-ahead log off the writer's path.
    checkpointer: Checkpointer,
    /// The writer's open batch and the operation log behind it (`oplog.rs`).
    batching: Arc<Batching>,
    /// The rows the writer's current request changed.
    capture: Capture,
    /// Attributes, entries and absent xattrs served from memory once this
    /// process serves the volume (`row_cache.rs`).
    rows: Arc<RowCache>,
    /// The writer's `PRAGMA data_version` when its last batch began: it
    /// changes when another connection commits.
    data_version: AtomicI64,
    /// Commits a batch that is due when no write comes to do it.
    _flusher: Flusher,
    /// Room for deletions on a full disk (`reserve.rs`).
    reserve: Arc<reserve::DiskReserve>,
}

impl SqliteMeta {
    /// Creates a new metadata database at `url_or_path` with the volume
    /// record and the root directory, and opens it. Refuses with
    /// [`MetaError::AlreadyFormatted`] if any file exists there.
    pub fn format(url_or_path: &str, config: &VolumeConfig) -> Result<SqliteMeta> {
        config.check()?;
        schema::configure_library();
        let Location::Sqlite(path) = Location::parse(url_or_path)?;
        let io = |source| MetaError::Io {
            path: path.clone(),
            source,
        };
        // 0600: metadata names every file and its owner (WAL and shm files
        // get the database file's mode from SQLite).
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(MetaError::AlreadyFormatted { path });
            }
            Err(e) => return Err(io(e)),
        }
        // An operation log left by a database of this name that is gone
        // belongs to nothing: replayed into this one it would be refused.
        match std::fs::remove_file(oplog::log_path(&path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        let volume = VolumeRecord {
            name: config.name.clone(),
            uuid: random_u128().map_err(io)?,
            storage_url: config.storage_url.clone(),
            block_size_bytes: config.block_size_bytes,
            format_version: FORMAT_VERSION,
            created: Timespec::now(),
        };
        let made = Connection::open(&path)
            .map_err(MetaError::from)
            .and_then(|mut conn| {
                schema::configure_writer(&mut conn)?;
                schema::create(&mut conn, &volume)?;
                Ok(conn)
            });
        match made {
            Ok(conn) => SqliteMeta::from_writer(path, volume, conn, true),
            Err(e) => {
                remove_db_files(&path);
                Err(e.in_op("format"))
            }
        }
    }

    /// Opens an existing metadata database, checking it is a Baton volume of
    /// a supported format version before changing anything in the file.
    ///
    /// A writer serving the volume in another process commits its open
    /// batch first (this waits for it, at most one batch), so the store
    /// sees everything that writer replied.
    pub fn open(url_or_path: &str) -> Result<SqliteMeta> {
        SqliteMeta::open_with(url_or_path, true)
    }

    /// [`SqliteMeta::open`] for a generation that opens the volume beside
    /// the one serving it (a standby, an incoming upgrade): nothing waits
    /// for the serving writer's batch. Its adoption replays what that
    /// writer left if it died ([`MetaStore::replay_log`]).
    pub fn open_beside_writer(url_or_path: &str) -> Result<SqliteMeta> {
        SqliteMeta::open_with(url_or_path, false)
    }

    fn open_with(url_or_path: &str, wait_for_writer: bool) -> Result<SqliteMeta> {
        schema::configure_library();
        let Location::Sqlite(path) = Location::parse(url_or_path)?;
        if !path.exists() {
            return Err(MetaError::NotFormatted { path });
        }
        check_writable(&path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn =
            Connection::open_with_flags(&path, flags).map_err(|e| MetaError::Foreign {
                path: path.clone(),
                reason: format!("SQLite cannot open it: {e}"),
            })?;
        let volume = schema::validate(&path, &conn)?;
        schema::configure_writer(&mut conn).map_err(|e| e.in_op("open"))?;
        schema::ensure_additive_tables(&conn).map_err(|e| e.in_op("open"))?;
        SqliteMeta::from_writer(path, volume, conn, wait_for_writer)
    }

    fn from_writer(
        path: PathBuf,
        volume: VolumeRecord,
        mut writer: Connection,
        wait_for_writer: bool,
    ) -> Result<SqliteMeta> {
        // Before anything reads: what a writer that died logged and never
        // committed (with `wait_for_writer`, this waits for a live writer's
        // batch to commit; without, a live writer's log is left to it).
        let mut log = OpLog::open(&path)?;
        let replayed = if wait_for_writer {
            oplog::replay(&writer, &mut log)
        } else {
            oplog::replay_unless_busy(&mut writer, &mut log)
        };
        replayed.map_err(|e| e.in_op("open: replay the operation log"))?;
        let batching = Arc::new(Batching::new(log));
        let capture = Capture::default();
        let rows = Arc::new(RowCache::new(volume.block_size_bytes));
        if !row_events::layout_matches(&writer) {
            tracing::warn!(path = %path.display(), "metadata tables laid out unlike this build's: attributes are not served from memory");
            rows.disable_for_good();
        }
        capture
            .install(&mut writer, Arc::clone(&rows))
            .map_err(|e| e.in_op("open"))?;
        let reserve = Arc::new(reserve::DiskReserve::open(&path));
        let writer = Arc::new(Mutex::new(writer));
        let flusher = Flusher::start(
            Arc::clone(&writer),
            Arc::clone(&batching),
            Arc::clone(&reserve),
        )?;
        let checkpointer =
            Checkpointer::start(&path, &writer).map_err(|e| e.in_op("open checkpointer"))?;
        let mut readers = Vec::with_capacity(READ_CONNECTIONS_MAX);
        for _ in 0..READ_CONNECTIONS_MAX {
            let reader = schema::open_reader(&path).map_err(|e| e.in_op("open reader"))?;
            readers.push(Mutex::new(reader));
        }
        tracing::debug!(path = %path.display(), volume = %volume.name, "metadata opened");
        Ok(SqliteMeta {
            path,
            volume,
            writer,
            readers,
            next_reader: AtomicUsize::new(0),
            answered: AnsweredQueue::default(),
            tx: TxCounters::default(),
            fenced: AtomicBool::new(false),
            quarantine: crate::quarantine::Quarantine::default(),
            wal_entry_synced: AtomicBool::new(false),
            checkpointer,
            batching,
            capture,
            rows,
            data_version: AtomicI64::new(0),
            _flusher: flusher,
            reserve,
        })
    }

    /// See [`MetaStore::replay_log`].
    fn replay_dead_writer(&self) -> Result<u64> {
        let conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let replayed = self.batching.lock().replay_unless_open(&conn);
        replayed.map_err(|e| log_store_error(e.in_op("replay the operation log")))
    }

    /// Forgets the rows served from memory if another connection committed
    /// since the writer's last batch began (run as a batch begins: from
    /// then on, until it commits, nobody else can), or if it cannot tell.
    fn forget_rows_if_others_wrote(&self, conn: &Connection) {
        if !self.rows.is_enabled() {
            return;
        }
        let version = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut stmt| stmt.query_row([], |r| r.get::<_, i64>(0)));
        match version {
            Ok(version) if self.data_version.swap(version, Ordering::SeqCst) == version => {}
            Ok(_) => self.rows.clear(),
            Err(err) => {
                tracing::warn!(%err, "cannot read the metadata's data version; forgetting the rows kept in memory");
                self.rows.clear();
            }
        }
    }

    /// Commits the writer's open batch, if any (`oplog.rs`).
    fn commit_batch(&self) {
        let conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.batching
            .lock()
            .commit(&conn, &self.batching, &self.reserve);
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of the write-ahead log beside the database file.
    fn wal_path(&self) -> PathBuf {
        wal_path(&self.path)
    }

    /// See [`MetaStore::sync`]. Every transaction committed before this
    /// call has written its frames to the `-wal` file (or been checkpointed
    /// into the database, which the checkpoint fsynced), so one fdatasync of
    /// the `-wal` file makes them all durable. The WAL file is never deleted
    /// while this store's connections are open, and any open file
    /// description of it syncs the same inode.
    fn sync_wal(&self) -> Result<()> {
        let wal = self.wal_path();
        let io = |path: &Path, source| MetaError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::File::open(&wal) {
            Ok(file) => file.sync_data().map_err(|e| io(&wal, e))?,
            // Everything is in the database file, synced by the checkpoint
            // that removed the WAL.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(&wal, e)),
        }
        if !self.wal_entry_synced.load(Ordering::Acquire) {
            let dir = match self.path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(dir, e))?;
            self.wal_entry_synced.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The writer connection if it is free, else a free pool connection,
    /// else waits for one. The writer first: in WAL mode a connection drops
    /// its whole page cache when another connection wrote since its last
    /// transaction, so after each write a pool connection re-reads every
    /// page it touches (a pread each), while the writer's cache stays warm
    /// across its own writes. The pool serves reads beside a running write.
    ///
    /// While a batch is open only the writer sees it: reads wait for the
    /// writer then.
    fn reader(&self) -> MutexGuard<'_, Connection> {
        if self.batching.open.load(Ordering::SeqCst) {
            return self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        }
        if let Ok(writer) = self.writer.try_lock() {
            return writer;
        }
        let count = self.readers.len();
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed) % count;
        for i in 0..count {
            if let Ok(guard) = self.readers[(start + i) % count].try_lock() {
                return guard;
            }
        }
        self.readers[start]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// An explicit transaction begun and ended with cached statements (no SQL
/// parsed per transaction, failed ones included: a negative lookup before
/// every create ends in an error); rolled back when dropped unfinished (a
/// panic in between, or a failed COMMIT).
struct Tx<'c> {
    conn: &'c Connection,
    finished: bool,
}

impl<'c> Tx<'c> {
    fn begin(conn: &'c Connection, sql: &'static str) -> Result<Tx<'c>> {
        conn.prepare_cached(sql)?.execute([])?;
        Ok(Tx {
            conn,
            finished: false,
        })
    }

    /// Leaves it open (a batch, `oplog.rs`).
    fn keep_open(mut self) {
        self.finished = true;
    }

    /// Ends it with `COMMIT` or `ROLLBACK`; on failure, `Drop` rolls back.
    fn end(mut self, sql: &'static str) -> Result<()> {
        self.conn.prepare_cached(sql)?.execute([])?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.finished && !self.conn.is_autocommit() {
            if let Err(err) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(%err, "metadata rollback failed");
            }
        }
    }
}

/// One request's `SAVEPOINT` inside the writer's batch: released when the
/// request is logged, rolled back when it fails, and rolled back when
/// dropped unfinished (a panic unwinding: the partial changes must not
/// reach the batch's commit, which another thread may run before the
/// process aborts).
struct Savepoint<'c> {
    conn: &'c Connection,
    finished: bool,
}

impl<'c> Savepoint<'c> {
    fn begin(conn: &'c Connection) -> Result<Savepoint<'c>> {
        conn.prepare_cached("SAVEPOINT request")?.execute([])?;
        Ok(Savepoint {
            conn,
            finished: false,
        })
    }

    fn release(mut self) -> Result<()> {
        self.finished = true;
        self.conn.prepare_cached("RELEASE request")?.execute([])?;
        Ok(())
    }

    fn roll_back(mut self) -> Result<()> {
        self.finished = true;
        self.conn
            .prepare_cached("ROLLBACK TO request")?
            .execute([])?;
        self.conn.prepare_cached("RELEASE request")?.execute([])?;
        Ok(())
    }

    /// SQLite ended the whole transaction, the savepoint with it.
    fn gone(mut self) {
        self.finished = true;
    }
}

impl Drop for Savepoint<'_> {
    fn drop(&mut self) {
        if !self.finished && !self.conn.is_autocommit() {
            if let Err(err) = self
                .conn
                .execute_batch("ROLLBACK TO request; RELEASE request")
            {
                tracing::warn!(%err, "metadata savepoint rollback failed");
            }
        }
    }
}

fn log_store_error(e: MetaError) -> MetaError {
    if let MetaError::Store { op, source } = &e {
        tracing::warn!(op, error = %source, "metadata store error");
    }
    e
}

/// Path of the write-ahead log beside the database file `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

fn random_u128() -> std::io::Result<u128> {
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(u128::from_be_bytes(buf))
}

/// Best-effort cleanup after a failed format, so the user can retry.
/// The database file and its directory must be writable (`access(2)`,
/// which also says EROFS for a read-only filesystem): otherwise SQLite only
/// says "unable to open database file".
fn check_writable(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    for target in [path, dir] {
        let c_path =
            std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).map_err(|_| {
                MetaError::ReadOnly {
                    path: target.to_path_buf(),
                    reason: "the path holds a NUL byte".into(),
                }
            })?;
        // SAFETY: a valid NUL-terminated path; access only reads it.
        if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
            return Err(MetaError::ReadOnly {
                path: target.to_path_buf(),
                reason: std::io::Error::last_os_error().to_string(),
            });
        }
    }
    Ok(())
}

fn remove_db_files(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-oplog"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

impl Drop for SqliteMeta {
    fn drop(&mut self) {
        // What is still in the log would be replayed at the next open; a
        // clean close leaves none.
        self.commit_batch();
    }
}

impl Engine for SqliteMeta {
    type Conn<'c> = Connection;

    const STATEMENT_IS_ROUND_TRIP: bool = false;
    const SHARED_BY_HOSTS: bool = false;

    fn volume_record(&self) -> &VolumeRecord {
        &self.volume
    }

    fn answered_queue(&self) -> &AnsweredQueue {
        &self.answered
    }

    fn tx_counters(&self) -> &TxCounters {
        &self.tx
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction; with a request key,
    /// also records `encode(result)` in it and deletes the records of
    /// requests answered since the last write. Commits only if all
    /// succeeded; refuses everything once fenced.
    fn write<T>(
        &self,
        op: &'static str,
        req: Option<RequestKey>,
        f: impl Fn(&Connection) -> Result<T>,
        encode: impl Fn(&T) -> Recorded,
    ) -> Result<T> {
        let start = Instant::now();
        self.checkpointer.wait_while_behind();
        let conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the writer lock, which `fence` takes: no write
        // starts after a fence returns.
        if self.fenced.load(Ordering::SeqCst) {
            return Err(MetaError::Fenced { op });
        }
        self.quarantine.check(op)?;
        let answered = match req {
            Some(_) => self.answered.take_due(),
            None => Vec::new(),
        };
        let run = || -> Result<T> {
            let mut batch = self.batching.lock();
            if batch.begin(&conn, &self.batching)? {
                self.forget_rows_if_others_wrote(&conn);
            }
            let request = Savepoint::begin(&conn)?;
            self.capture.clear();
            let rows = self.rows.begin_request();
            let outcome = (|| -> Result<(T, Logged)> {
                let out = f(&conn)?;
                if let Some(key) = req {
                    requests::record(&*conn, key, &encode(&out).encode())?;
                    requests::forget(&*conn, &answered)?;
                }
                let logged = batch.log(&self.capture.take())?;
                Ok((out, logged))
            })();
            if conn.is_autocommit() {
                // SQLite rolled the whole batch back (it may, on a full
                // disk): what it held is in the log.
                request.gone();
                rows.end(false);
                self.rows.clear();
                batch.lost(&conn, &self.batching);
                return outcome.map(|(out, _)| out);
            }
            let ended = match outcome {
                Ok((out, Logged::TooBig)) => request
                    .release()
                    .and_then(|()| batch.commit_now(&conn, &self.batching, &self.reserve))
                    .map(|()| out),
                Ok((out, Logged::Yes)) => request.release().map(|()| out),
                Err(e) => {
                    rows.end(false);
                    request.roll_back()?;
                    return Err(e);
                }
            };
            // The request's changes stand once released (and, too big for
            // the log, committed): served from memory before the reply.
            rows.end(ended.is_ok());
            if ended.is_err() {
                self.rows.clear();
            } else if batch.due() {
                batch.commit(&conn, &self.batching, &self.reserve);
            }
            ended
        };
        let mut result = run();
        // Out of space: the reserve makes room for this write and the
        // deletions after it (`reserve.rs`); nothing was committed.
        if matches!(&result, Err(e) if e.is_disk_full()) && self.reserve.release() {
            result = run();
        } else if result.is_ok() {
            self.reserve.rearm_if_due();
        }
        if result.is_err() && !answered.is_empty() {
            // Rolled back: keep the keys for the next write.
            self.answered.put_back(answered);
        }
        self.tx.record(TxKind::Write, start, result.is_ok());
        result.map_err(|e| self.quarantine.observe(log_store_error(e.in_op(op))))
    }

    /// Runs `f` in a deferred read transaction on a pool connection.
    fn read<T>(&self, op: &'static str, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let conn = self.reader();
        let run = || -> Result<T> {
            if !conn.is_autocommit() {
                // The writer's open batch: one snapshot already.
                return f(&conn);
            }
            let tx = Tx::begin(&conn, "BEGIN DEFERRED")?;
            let out = f(&conn);
            tx.end("ROLLBACK")?;
            out
        };
        let result = run();
        self.tx.record(TxKind::Read, start, result.is_ok());
        result.map_err(|e| self.quarantine.observe(log_store_error(e.in_op(op))))
    }

    /// Runs `f`, which must issue ONE statement (its own consistent
    /// snapshot), on a pool connection outside any explicit transaction:
    /// the hot read path (lookup, getattr) without BEGIN and ROLLBACK.
    fn read_one<T>(&self, op: &'static str, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let conn = self.reader();
        let result = f(&conn);
        self.tx.record(TxKind::Read, start, result.is_ok());
        result.map_err(|e| self.quarantine.observe(log_store_error(e.in_op(op))))
    }

    fn read_on_every_connection(
        &self,
        op: &'static str,
        f: impl Fn(&Connection) -> Result<()>,
    ) -> Result<()> {
        self.commit_batch();
        let run = |conn: &Connection| -> Result<()> {
            if !conn.is_autocommit() {
                return f(conn);
            }
            let tx = Tx::begin(conn, "BEGIN DEFERRED")?;
            let out = f(conn);
            tx.end("ROLLBACK")?;
            out
        };
        let lock = |m: &Mutex<Connection>| run(&m.lock().unwrap_or_else(PoisonError::into_inner));
        std::iter::once(&*self.writer)
            .chain(&self.readers)
            .try_for_each(lock)
            .map_err(|e| log_store_error(e.in_op(op)))
    }

    fn make_durable(&self) -> Result<()> {
        self.commit_batch();
        self.sync_wal()
            .map_err(|e| log_store_error(e.in_op("sync")))
    }

    fn quarantine(&self) -> &crate::quarantine::Quarantine {
        &self.quarantine
    }

    fn fence_writes(&self) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.batching
            .lock()
            .commit(&writer, &self.batching, &self.reserve);
        self.fenced.store(true, Ordering::SeqCst);
    }

    fn unfence_writes(&self) {
        // A successor may have written before the handover rolled back.
        self.rows.clear();
        self.fenced.store(false, Ordering::SeqCst);
    }

    fn replay_log(&self) -> Result<u64> {
        self.replay_dead_writer()
    }

    fn row_cache(&self) -> Option<&RowCache> {
        Some(&self.rows)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{MetaStore, ROOT_INO};
    use rusqlite::config::DbConfig;
    use std::ffi::OsStr;
    use std::time::Duration;

    fn pragma_i64(c: &Connection, name: &str) -> i64 {
        c.pragma_query_value(None, name, |r| r.get(0)).unwrap()
    }

    fn check_pragmas(m: &SqliteMeta) {
        let w = m.writer.lock().unwrap();
        assert_eq!(pragma_i64(&w, "synchronous"), 1, "synchronous = NORMAL");
        assert_eq!(pragma_i64(&w, "foreign_keys"), 1);
        assert_eq!(pragma_i64(&w, "temp_store"), 2, "temp_store = MEMORY");
        // A busy handler of our own (`schema::busy_poll`) replaces SQLite's
        // timeout.
        assert_eq!(pragma_i64(&w, "busy_timeout"), 0);
        let mode: String = w
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert!(w.db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG).unwrap());
        assert_eq!(m.readers.len(), READ_CONNECTIONS_MAX);
        for r in &m.readers {
            let r = r.lock().unwrap();
            assert_eq!(pragma_i64(&r, "query_only"), 1);
            assert!(r.db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG).unwrap());
        }
    }

    /// A new regular file `name` in the root.
    fn new_file(m: &SqliteMeta, name: &str) -> crate::types::Attr {
        use crate::types::{CreateArgs, FileKind};
        let args = CreateArgs::new(FileKind::Regular, 0o644);
        m.create(ROOT_INO, OsStr::new(name), &args, None).unwrap()
    }

    /// Every table's rows, in key order, as text: the state to compare.
    fn dump(path: &Path) -> Vec<String> {
        let c = Connection::open(path).unwrap();
        let tables: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut out = Vec::new();
        for t in tables {
            let mut stmt = c
                .prepare(&format!("SELECT * FROM \"{t}\" ORDER BY 1, 2"))
                .unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    let cells: Vec<String> = (0..n)
                        .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                        .collect();
                    Ok(format!("{t}: {}", cells.join(" | ")))
                })
                .unwrap()
                .map(Result::unwrap);
            out.extend(rows);
        }
        out
    }

    /// The files a kill -9 leaves, taken while the writer is idle: the
    /// database, its WAL and the operation log.
    fn crash_image(m: &SqliteMeta, to: &Path) -> PathBuf {
        let _writes_held = m.writer.lock().unwrap();
        let image = to.join("image.db");
        for suffix in ["", "-wal", "-oplog"] {
            let mut from = m.path.as_os_str().to_owned();
            from.push(suffix);
            let mut into = image.as_os_str().to_owned();
            into.push(suffix);
            if Path::new(&from).exists() {
                std::fs::copy(&from, &into).unwrap();
            }
        }
        image
    }

    /// Requests replied but not committed when the process died (the
    /// batch open, its rows in the operation log only) are all there when
    /// the database opens again: inserts, updates and cascading deletes of
    /// every kind a request makes, exactly-once records included.
    #[test]
    fn what_a_dead_writer_logged_is_committed_at_the_next_open() {
        use crate::types::{BlockRef, CommitBlocks, CreateArgs, FileKind, RenameFlags, XattrFlags};
        let (dir, m) = formatted();
        m.batching.lock().age = Duration::from_secs(3600);
        let key = |unique| {
            Some(RequestKey {
                connection: 7,
                unique,
            })
        };
        let d = m
            .create(
                ROOT_INO,
                OsStr::new("d"),
                &CreateArgs::new(FileKind::Directory, 0o755),
                key(1),
            )
            .unwrap();
        m.set_quota(d.ino, Some(1 << 30), None).unwrap();
        let mut files = Vec::new();
        for i in 0..20 {
            let name = format!("f{i}");
            let f = m
                .create(
                    d.ino,
                    OsStr::new(&name),
                    &CreateArgs::new(FileKind::Regular, 0o644),
                    key(10 + i),
                )
                .unwrap();
            let commit = CommitBlocks {
                new_size: Some(100),
                blocks: vec![BlockRef {
                    index: 0,
                    object_key: format!("inline/{}-0-1", f.ino),
                    len: 100,
                    inline: Some(vec![i as u8; 100]),
                }],
                ..CommitBlocks::default()
            };
            m.commit_blocks(f.ino, &commit, key(100 + i)).unwrap();
            m.setxattr(
                f.ino,
                OsStr::new("user.k"),
                b"v",
                XattrFlags::default(),
                None,
            )
            .unwrap();
            files.push(f);
        }
        let mut link_args = CreateArgs::new(FileKind::Symlink, 0o777);
        link_args.symlink_target = Some("f1".into());
        m.create(d.ino, OsStr::new("s"), &link_args, None).unwrap();
        m.link(files[2].ino, ROOT_INO, OsStr::new("hard"), None)
            .unwrap();
        m.rename(
            d.ino,
            OsStr::new("f3"),
            ROOT_INO,
            OsStr::new("moved"),
            RenameFlags::default(),
            None,
        )
        .unwrap();
        // Deletes that cascade: the inode's xattrs and block rows go too.
        for f in &files[5..10] {
            let name = format!("f{}", f.ino - files[0].ino);
            m.unlink(d.ino, OsStr::new(&name), None).unwrap();
            m.reclaim(f.ino, None).unwrap();
        }
        assert!(
            m.batching.open.load(Ordering::SeqCst),
            "the batch stayed open"
        );
        assert!(std::fs::metadata(oplog::log_path(&m.path)).unwrap().len() > 0);
        let image = crash_image(&m, dir.path());

        // Before the replay the image lacks them (nothing was committed).
        let committed = dump(&image);
        m.sync().unwrap();
        let expected = dump(&m.path);
        assert_ne!(committed, expected);
        let reopened = SqliteMeta::open(image.to_str().unwrap()).unwrap();
        drop(reopened);
        let replayed: Vec<String> = dump(&image)
            .into_iter()
            .filter(|row| !row.starts_with("oplog_applied"))
            .collect();
        let expected: Vec<String> = expected
            .into_iter()
            .filter(|row| !row.starts_with("oplog_applied"))
            .collect();
        assert_eq!(replayed, expected);
        assert_eq!(
            std::fs::metadata(oplog::log_path(&image)).unwrap().len(),
            0,
            "the log is emptied"
        );
        // The requests' exactly-once records came back with them.
        let again = SqliteMeta::open(image.to_str().unwrap()).unwrap();
        assert!(again
            .completed_request(RequestKey {
                connection: 7,
                unique: 105
            })
            .unwrap()
            .is_some());
    }

    /// A request whose changes are too big for one log record (here 20,000
    /// block rows) is not logged: its batch commits before it returns, so
    /// a kill right after finds it, and what the batch logged before it,
    /// in the database.
    #[test]
    fn a_request_too_big_to_log_commits_its_batch_before_it_returns() {
        use crate::types::{BlockRef, CommitBlocks};
        let (dir, m) = formatted();
        m.batching.lock().age = Duration::from_secs(3600);
        let small = new_file(&m, "small");
        let big = new_file(&m, "big");
        assert!(m.batching.open.load(Ordering::SeqCst));
        let rows = 20_000u64;
        let commit = CommitBlocks {
            new_size: Some(rows * 4096),
            blocks: (0..rows)
                .map(|i| BlockRef::object(i, format!("blocks/{:064}", i), 4096))
                .collect(),
            ..CommitBlocks::default()
        };
        m.commit_blocks(big.ino, &commit, None).unwrap();
        assert!(
            !m.batching.open.load(Ordering::SeqCst),
            "the batch committed"
        );
        assert_eq!(
            std::fs::metadata(oplog::log_path(&m.path)).unwrap().len(),
            0
        );
        let image = crash_image(&m, dir.path());
        std::fs::remove_file(oplog::log_path(&image)).unwrap();
        let reopened = SqliteMeta::open(image.to_str().unwrap()).unwrap();
        assert_eq!(reopened.getattr(big.ino).unwrap().size, rows * 4096);
        assert_eq!(reopened.getattr(small.ino).unwrap().ino, small.ino);
    }

    /// A kill between a batch's commit and the emptying of its log (or of
    /// a replay's): the records are committed, and the next open skips
    /// them instead of applying them twice.
    #[test]
    fn a_log_whose_batch_committed_is_skipped_at_open() {
        let (dir, m) = formatted();
        m.batching.lock().age = Duration::from_secs(3600);
        for i in 0..5 {
            let name = format!("f{i}");
            new_file(&m, &name);
        }
        let log = std::fs::read(oplog::log_path(&m.path)).unwrap();
        assert!(!log.is_empty());
        m.sync().unwrap();
        let image = crash_image(&m, dir.path());
        std::fs::write(oplog::log_path(&image), &log).unwrap();
        let expected = dump(&m.path);
        drop(SqliteMeta::open(image.to_str().unwrap()).unwrap());
        assert_eq!(dump(&image), expected, "nothing applied twice");
        assert_eq!(std::fs::metadata(oplog::log_path(&image)).unwrap().len(), 0);
    }

    /// Every table a request can change names its rows by a rowid or a
    /// primary key, so every logged change can be replayed.
    #[test]
    fn every_table_can_be_replayed() {
        let (_dir, m) = formatted();
        let c = Connection::open(&m.path).unwrap();
        let tables: Vec<String> = c
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(tables.len() > 10, "{tables:?}");
        for t in tables {
            assert!(row_changes::replayable(&c, &t), "table {t}");
        }
    }

    /// A log that does not fit the database (here: a row a logged update
    /// names is gone) stops the open with an error naming the log and the
    /// record; nothing is applied.
    #[test]
    fn a_log_that_does_not_apply_is_refused_at_open() {
        let (dir, m) = formatted();
        let f = new_file(&m, "f");
        m.sync().unwrap();
        m.batching.lock().age = Duration::from_secs(3600);
        let attr = crate::types::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        m.setattr(f.ino, &attr, None).unwrap();
        let image = crash_image(&m, dir.path());
        let c = Connection::open(&image).unwrap();
        c.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        c.execute("DELETE FROM inodes WHERE ino = ?1", [f.ino as i64])
            .unwrap();
        drop(c);
        let before = dump(&image);
        let err = SqliteMeta::open(image.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("image.db-oplog record 2 does not apply"),
            "{err}"
        );
        assert_eq!(dump(&image), before, "nothing applied");
    }

    fn formatted() -> (tempfile::TempDir, SqliteMeta) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let config = VolumeConfig {
            name: "v".into(),
            storage_url: "mem://".into(),
            block_size_bytes: 4096,
        };
        let m = SqliteMeta::format(path.to_str().unwrap(), &config).unwrap();
        (dir, m)
    }

    /// The plan of `sql` (EXPLAIN QUERY PLAN details, one per step).
    fn plan(c: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let params = [1i64, 0, 100, 4096];
        let count = stmt.parameter_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(&params[..count]))
            .unwrap();
        let mut steps = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            steps.push(row.get::<_, String>(3).unwrap());
        }
        steps
    }

    fn assert_readdir_is_a_range_scan(c: &Connection) {
        for sql in [
            crate::ops::readdir::READDIR_SQL,
            crate::ops::readdir::READDIR_PLUS_SQL,
        ] {
            let steps = plan(c, sql);
            assert!(
                steps
                    .iter()
                    .any(|s| s.contains("dentries_by_parent_cookie")),
                "{steps:?}"
            );
            // A sort here reads the whole directory for every batch.
            assert!(
                !steps.iter().any(|s| s.contains("TEMP B-TREE")),
                "{steps:?}"
            );
        }
    }

    #[test]
    fn readdir_batches_scan_the_parent_cookie_index_also_in_older_volumes() {
        let (dir, m) = formatted();
        assert_readdir_is_a_range_scan(&m.writer.lock().unwrap());
        // A volume made before the index: opening adds it.
        m.writer
            .lock()
            .unwrap()
            .execute_batch("DROP INDEX dentries_by_parent_cookie")
            .unwrap();
        drop(m);
        let path = dir.path().join("m.db");
        let m = SqliteMeta::open(path.to_str().unwrap()).unwrap();
        assert_readdir_is_a_range_scan(&m.writer.lock().unwrap());
        assert_readdir_is_a_range_scan(&m.readers[0].lock().unwrap());
    }

    #[test]
    fn cached_statements_with_order_by_are_not_reprepared_per_run() {
        let (_dir, m) = formatted();
        let sql = "SELECT name FROM dentries WHERE parent = ?1 ORDER BY cookie";
        let c = m.readers[0].lock().unwrap();
        for _ in 0..5 {
            let mut stmt = c.prepare_cached(sql).unwrap();
            let mut rows = stmt.query([ROOT_INO]).unwrap();
            while rows.next().unwrap().is_some() {}
        }
        let stmt = c.prepare_cached(sql).unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 5);
    }

    #[test]
    fn sync_succeeds_with_and_without_a_wal_and_keeps_commits() {
        let (dir, m) = formatted();
        let args = crate::CreateArgs::new(crate::FileKind::Regular, 0o644);
        let a = m.create(ROOT_INO, OsStr::new("a"), &args, None).unwrap();
        assert!(m.wal_path().exists());
        m.sync().unwrap();
        assert!(m.wal_entry_synced.load(Ordering::Relaxed));
        std::fs::remove_file(m.wal_path()).unwrap_or_default();
        m.sync().unwrap();
        drop(m);
        let m = SqliteMeta::open(dir.path().join("m.db").to_str().unwrap()).unwrap();
        assert_eq!(m.lookup(ROOT_INO, OsStr::new("a")).unwrap().ino, a.ino);
    }

    #[test]
    fn lookup_fast_path_and_fallback_agree() {
        let (_dir, m) = formatted();
        let args = crate::CreateArgs::new(crate::FileKind::Regular, 0o644);
        let a = m.create(ROOT_INO, OsStr::new("a"), &args, None).unwrap();
        assert_eq!(m.lookup(ROOT_INO, OsStr::new("a")).unwrap(), a);
        assert_eq!(m.lookup(ROOT_INO, OsStr::new(".")).unwrap().ino, ROOT_INO);
        let missing = m.lookup(ROOT_INO, OsStr::new("b")).unwrap_err();
        assert!(matches!(missing, MetaError::NotFound { .. }), "{missing}");
        let not_dir = m.lookup(a.ino, OsStr::new("x")).unwrap_err();
        assert!(
            matches!(not_dir, MetaError::NotDirectory { .. }),
            "{not_dir}"
        );
        let long = "n".repeat(300);
        let too_long = m.lookup(ROOT_INO, OsStr::new(&long)).unwrap_err();
        assert!(
            matches!(too_long, MetaError::NameTooLong { .. }),
            "{too_long}"
        );
    }

    #[test]
    fn connections_use_wal_normal_sync_foreign_keys_and_read_only_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let config = VolumeConfig {
            name: "v".into(),
            storage_url: "mem://".into(),
            block_size_bytes: 4096,
        };
        let m = SqliteMeta::format(path.to_str().unwrap(), &config).unwrap();
        check_pragmas(&m);
        drop(m);
        check_pragmas(&SqliteMeta::open(path.to_str().unwrap()).unwrap());
    }

    #[test]
    fn all_readers_busy_waits_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let config = VolumeConfig {
            name: "v".into(),
            storage_url: "mem://".into(),
            block_size_bytes: 4096,
        };
        let m = SqliteMeta::format(path.to_str().unwrap(), &config).unwrap();
        let held: Vec<_> = m.readers[1..].iter().map(|r| r.lock().unwrap()).collect();
        // Only reader 0 is free; every read finds it.
        for _ in 0..READ_CONNECTIONS_MAX * 2 {
            assert_eq!(m.getattr(crate::ROOT_INO).unwrap().nlink, 2);
        }
        drop(held);
    }
}
