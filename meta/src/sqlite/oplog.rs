//! The operation log: a SQLite volume's metadata writes made durable
//! against the death of the process by one `write(2)` of their row changes,
//! and committed to SQLite in batches (docs/design-notes.md#operation-log).
//!
//! Before, each write request was its own `BEGIN IMMEDIATE` ... `COMMIT`:
//! a create wrote 9 WAL pages (18 `pwrite`s) and took and dropped 8
//! `fcntl` locks, about 45 µs of its 107. Now the writer connection keeps
//! one transaction (a *batch*) open across requests:
//! - each request runs in a `SAVEPOINT` inside it; SQLite's pre-update
//!   hook hands every row it changes (cascades included) to
//!   `row_changes::Capture`, which encodes the row's old and new values;
//! - before the request's reply, those changes are appended to this log
//!   (`meta.db-oplog`, 0600) with one `pwrite`; the page cache outlives the
//!   process, so a replied request survives kill -9 as a committed
//!   transaction did;
//! - the batch commits after [`BATCH_AGE`], at [`BATCH_RECORDS_MAX`]
//!   records, and before anything that needs it committed (`sync`, a fence,
//!   closing the store, every-connection reads); the commit stores the last
//!   record's sequence number in `oplog_applied` and empties the log.
//!
//! Invariants:
//! - A batch holds SQLite's write lock from its `BEGIN IMMEDIATE` to its
//!   `COMMIT`, so at most one process has records not yet committed, and a
//!   process that holds the write lock with no batch of its own finds in the
//!   log only records that are committed (sequence at most `oplog_applied`)
//!   or those of a writer that died (SQLite rolled its batch back).
//! - A batch starts only on an empty log ([`Batch::begin`]), after
//!   replaying what is there ([`replay`]); [`replay`] runs when the store
//!   opens and when a generation adopts a mount, before any read.
//! - Reads of this process go to the writer connection while a batch is
//!   open (it alone sees the batch); other processes see committed state,
//!   at most [`BATCH_AGE`] behind.
//! - A record is whole or ignored: a header with a CRC over sequence and
//!   changes; a torn tail (the process died in the `pwrite`, before the
//!   reply) ends the log.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::reserve::DiskReserve;
use super::row_changes;
use super::Tx;
use crate::error::{MetaError, Result};

/// How long a batch stays open before the flusher commits it: the lag of
/// other processes' view, and the most a process that wants the write lock
/// waits for this one's batch.
pub(crate) const BATCH_AGE: Duration = Duration::from_millis(5);

/// Records after which the writer commits its batch itself.
pub(crate) const BATCH_RECORDS_MAX: u32 = 512;

/// "BOL1", little-endian.
const MAGIC: u32 = u32::from_le_bytes(*b"BOL1");
/// magic u32, length u32, sequence u64, CRC-32 u32 (over sequence and
/// changes).
const HEADER_BYTES: usize = 20;
/// The largest record: a request that changes more (the reclaim of a file
/// of many blocks, a big truncate) is not logged; the batch commits with
/// it before its reply instead. A longer length read back is corrupt.
pub(crate) const RECORD_BYTES_MAX: u32 = 1 << 20;

/// One replied request's row changes (`row_changes`' encoding).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) seq: u64,
    pub(crate) changes: Vec<u8>,
}

/// The log file beside the database.
#[derive(Debug)]
pub(crate) struct OpLog {
    path: PathBuf,
    file: File,
    /// Where the next record goes: this process's end of the file.
    len: u64,
}

impl OpLog {
    /// Opens (creates, 0600) the log of database `db`.
    pub(crate) fn open(db: &Path) -> Result<OpLog> {
        let path = log_path(db);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| MetaError::Io {
                path: path.clone(),
                source,
            })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(OpLog { path, file, len })
    }

    fn io(&self, source: io::Error) -> MetaError {
        MetaError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// The file's length now (any process's records).
    fn file_len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.io(e))
    }

    /// Appends one record with one `pwrite`. On failure nothing of it
    /// stays: a later record never follows a partial one.
    fn append(&mut self, seq: u64, changes: &[u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(HEADER_BYTES + changes.len());
        let len = u32::try_from(changes.len())
            .ok()
            .filter(|&l| l <= RECORD_BYTES_MAX)
            .ok_or_else(|| MetaError::corrupt("an operation log record past its largest size"))?;
        buf.extend_from_slice(&MAGIC.to_le_bytes());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&crc(seq, changes).to_le_bytes());
        buf.extend_from_slice(changes);
        match self.file.write_all_at(&buf, self.len) {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                if let Err(cut) = self.file.set_len(self.len) {
                    // A torn record ends the log for a replay: the records
                    // before it are whole, and none follows it (this
                    // process commits or dies before appending again).
                    tracing::error!(path = %self.path.display(), error = %cut, "cannot cut a failed operation log record");
                }
                Err(self.io(e))
            }
        }
    }

    /// Every whole record, in order; reading stops at the first torn or
    /// foreign one.
    pub(crate) fn records(&self) -> Result<Vec<Record>> {
        let len = self.file_len()?;
        let mut bytes = vec![0; usize::try_from(len).unwrap_or(usize::MAX)];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(|e| self.io(e))?;
        Ok(parse(&bytes))
    }

    /// Empties the log (every record in it is committed).
    fn clear(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(|e| self.io(e))?;
        self.len = 0;
        Ok(())
    }
}

/// The log of database `db`: `db` + `-oplog`.
pub(crate) fn log_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-oplog");
    PathBuf::from(p)
}

fn crc(seq: u64, changes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(changes);
    h.finalize()
}

/// The whole records at the start of `bytes`.
fn parse(mut bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    while bytes.len() >= HEADER_BYTES {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (magic, len) = (word(0), word(4));
        let seq = u64::from(word(8)) | (u64::from(word(12)) << 32);
        let sum = word(16);
        let Some(end) = HEADER_BYTES.checked_add(len as usize) else {
            break;
        };
        if magic != MAGIC || len > RECORD_BYTES_MAX || bytes.len() < end {
            break;
        }
        let changes = &bytes[HEADER_BYTES..end];
        if crc(seq, changes) != sum {
            break;
        }
        out.push(Record {
            seq,
            changes: changes.to_vec(),
        });
        bytes = &bytes[end..];
    }
    out
}

/// The sequence number of the last committed record.
fn applied_seq(conn: &Connection) -> Result<u64> {
    let seq: i64 = conn
        .prepare_cached("SELECT seq FROM oplog_applied WHERE id = 1")?
        .query_row([], |r| r.get(0))
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(0),
            e => Err(e),
        })?;
    Ok(u64::try_from(seq).unwrap_or(0))
}

fn set_applied_seq(conn: &Connection, seq: u64) -> Result<()> {
    let seq = i64::try_from(seq).map_err(|_| MetaError::Corrupt {
        what: format!("operation log sequence {seq} out of range"),
    })?;
    conn.prepare_cached("INSERT OR REPLACE INTO oplog_applied (id, seq) VALUES (1, ?1)")?
        .execute([seq])?;
    Ok(())
}

/// [`replay`], unless a live writer holds the write lock: then the
/// records in the log are its own (its batch is open), and nothing waits
/// for it. Used at open, where a standby or an incoming generation opens
/// the volume beside the serving one; the takeover replays (`replay_log`).
pub(crate) fn replay_unless_busy(conn: &mut Connection, log: &mut OpLog) -> Result<u64> {
    conn.busy_handler(None::<fn(i32) -> bool>)?;
    let replayed = replay(conn, log);
    conn.busy_handler(Some(super::schema::busy_poll))?;
    match replayed {
        Err(MetaError::Store {
            source: rusqlite::Error::SqliteFailure(e, _),
            ..
        }) if e.code == rusqlite::ErrorCode::DatabaseBusy => {
            tracing::debug!(path = %log.path.display(), "a live writer holds the operation log; not replayed at open");
            Ok(0)
        }
        other => other,
    }
}

/// Commits the records in `log` that a writer which died left uncommitted
/// (sequence above `oplog_applied`), then empties the log. Takes the write
/// lock (waiting for a live writer's batch to commit); the connection must
/// have no transaction open. Returns how many records it applied.
///
/// Foreign keys are off while the records apply: each holds the rows a
/// cascade deleted, so a cascade must not fire again.
pub(crate) fn replay(conn: &Connection, log: &mut OpLog) -> Result<u64> {
    if log.file_len()? == 0 {
        return Ok(0);
    }
    let start = Instant::now();
    conn.execute_batch("PRAGMA foreign_keys = OFF")?;
    let applied = (|| -> Result<u64> {
        let tx = Tx::begin(conn, "BEGIN IMMEDIATE")?;
        let applied = applied_seq(conn)?;
        let mut tables = row_changes::Tables::default();
        let mut last = applied;
        let mut count = 0;
        for record in log.records()?.into_iter().filter(|r| r.seq > applied) {
            if record.seq != last + 1 {
                return Err(MetaError::Corrupt {
                    what: format!(
                        "operation log {} skips from record {last} to {}",
                        log.path.display(),
                        record.seq
                    ),
                });
            }
            row_changes::apply(conn, &mut tables, &record.changes).map_err(|why| {
                MetaError::Corrupt {
                    what: format!(
                        "operation log {} record {} does not apply to the database ({why}); \
                     nothing of it was applied. Moving the log aside opens the volume \
                     without the changes it holds",
                        log.path.display(),
                        record.seq
                    ),
                }
            })?;
            last = record.seq;
            count += 1;
        }
        set_applied_seq(conn, last)?;
        tx.end("COMMIT")?;
        Ok(count)
    })();
    let fk_on = conn.execute_batch("PRAGMA foreign_keys = ON");
    let count = applied?;
    fk_on?;
    log.clear()?;
    if count > 0 {
        tracing::info!(
            path = %log.path.display(),
            records = count,
            replay_us = start.elapsed().as_micros() as u64,
            "operation log replayed"
        );
    }
    Ok(count)
}

/// The writer's batch: the open transaction and the log behind it. Locked
/// only while the writer connection's lock is held (lock order: writer,
/// then batch), so it is never contended by writes.
#[derive(Debug)]
pub(crate) struct Batch {
    log: OpLog,
    /// [`BATCH_AGE`] (tests hold a batch open longer).
    pub(crate) age: Duration,
    /// When the open batch began; `None` when none is open.
    opened_at: Option<Instant>,
    next_seq: u64,
    records: u32,
    stopping: bool,
}

/// A [`Batch`] and what the flusher and readers need of it.
#[derive(Debug)]
pub(crate) struct Batching {
    pub(crate) batch: Mutex<Batch>,
    /// Wakes the flusher when a batch opens (or the store closes).
    opened: Condvar,
    /// A batch is open: reads must use the writer connection.
    pub(crate) open: AtomicBool,
}

impl Batching {
    pub(crate) fn new(log: OpLog) -> Batching {
        Batching {
            batch: Mutex::new(Batch {
                log,
                age: BATCH_AGE,
                opened_at: None,
                next_seq: 0,
                records: 0,
                stopping: false,
            }),
            opened: Condvar::new(),
            open: AtomicBool::new(false),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Batch {
    /// Opens a batch on `conn` (the writer, no transaction open) unless
    /// one is open: replays a dead writer's records first, and starts only
    /// on an empty log. Says whether it opened one.
    pub(crate) fn begin(&mut self, conn: &Connection, batching: &Batching) -> Result<bool> {
        if self.opened_at.is_some() {
            return Ok(false);
        }
        // A writer may die between the check and BEGIN: look again with
        // the write lock held, a few times.
        for _ in 0..4 {
            replay(conn, &mut self.log)?;
            let tx = Tx::begin(conn, "BEGIN IMMEDIATE")?;
            if self.log.file_len()? != 0 {
                tx.end("ROLLBACK")?;
                continue;
            }
            self.next_seq = applied_seq(conn)? + 1;
            self.log.len = 0;
            tx.keep_open();
            self.opened_at = Some(Instant::now());
            self.records = 0;
            batching.open.store(true, Ordering::SeqCst);
            batching.opened.notify_one();
            return Ok(true);
        }
        Err(MetaError::Corrupt {
            what: format!(
                "operation log {} keeps refilling while this process holds the write lock",
                self.log.path.display()
            ),
        })
    }

    /// Logs a request's changes (run inside the open batch), or says they
    /// are too big for a record: the batch must then commit before the
    /// reply ([`Batch::commit_now`]), its commit being their durability.
    pub(crate) fn log(&mut self, changes: &[u8]) -> Result<Logged> {
        if changes.is_empty() {
            return Ok(Logged::Yes);
        }
        if changes.len() > RECORD_BYTES_MAX as usize {
            return Ok(Logged::TooBig);
        }
        assert!(self.opened_at.is_some(), "a request logged outside a batch");
        self.log.append(self.next_seq, changes)?;
        self.next_seq += 1;
        self.records += 1;
        Ok(Logged::Yes)
    }

    /// SQLite rolled the open batch back by itself (it may on a full disk
    /// or an I/O error): replays its records from the log. If that fails
    /// the process aborts, as in [`Batch::commit`].
    pub(crate) fn lost(&mut self, conn: &Connection, batching: &Batching) {
        tracing::warn!(
            "SQLite rolled the metadata batch back; applying it again from the operation log"
        );
        self.close(batching);
        self.replay_or_abort(conn);
    }

    /// No batch is open any more.
    fn close(&mut self, batching: &Batching) {
        self.opened_at = None;
        self.records = 0;
        batching.open.store(false, Ordering::SeqCst);
    }

    /// Commits what the log holds after the batch was lost; if that fails
    /// too, aborts: its requests were replied, and the next generation
    /// replays them.
    fn replay_or_abort(&mut self, conn: &Connection) {
        if let Err(err) = replay(conn, &mut self.log) {
            tracing::error!(%err, log = %self.log.path.display(), "cannot commit replied metadata changes; exiting so the next generation replays them");
            std::process::abort();
        }
    }

    /// Replays a dead writer's records if this process has no batch open
    /// (with one open, it holds the write lock: nobody else wrote).
    pub(crate) fn replay_unless_open(&mut self, conn: &Connection) -> Result<u64> {
        if self.opened_at.is_some() {
            return Ok(0);
        }
        replay(conn, &mut self.log)
    }

    /// Whether the batch should commit now.
    pub(crate) fn due(&self) -> bool {
        self.opened_at
            .is_some_and(|t| self.records >= BATCH_RECORDS_MAX || t.elapsed() >= self.age)
    }

    /// Commits the open batch, if any, and empties the log. A commit that
    /// fails (a full disk) is rolled back, and what the log holds is
    /// applied again after the disk reserve is released; the error is
    /// returned (changes of the batch that were not logged are lost with
    /// it: their request must fail). If the log cannot be applied either
    /// the process aborts: its requests were replied, and the next
    /// generation replays them.
    pub(crate) fn commit_now(
        &mut self,
        conn: &Connection,
        batching: &Batching,
        reserve: &DiskReserve,
    ) -> Result<()> {
        if self.opened_at.is_none() {
            return Ok(());
        }
        let done = set_applied_seq(conn, self.next_seq - 1)
            .and_then(|()| Ok(conn.prepare_cached("COMMIT")?.execute([]).map(drop)?));
        let result = done.map_err(|err| {
            tracing::warn!(%err, "metadata batch commit failed; applying it again from the operation log");
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            reserve.release();
            self.replay_or_abort(conn);
            err
        });
        self.close(batching);
        if let Err(err) = self.log.clear() {
            // Harmless: what it holds is committed, and the next batch
            // replays (skips) it and empties it first.
            tracing::warn!(%err, "cannot empty the operation log");
        }
        result
    }

    /// [`Batch::commit_now`] where every change was logged: a failed
    /// commit loses nothing (the log was applied instead).
    pub(crate) fn commit(&mut self, conn: &Connection, batching: &Batching, reserve: &DiskReserve) {
        if let Err(err) = self.commit_now(conn, batching, reserve) {
            tracing::warn!(%err, "metadata batch committed from the operation log after its commit failed");
        }
    }
}

/// Whether [`Batch::log`] logged a request's changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Logged {
    /// Logged (or there were none).
    Yes,
    /// Too big for a record: commit the batch before the reply.
    TooBig,
}

/// The thread that commits a batch [`BATCH_AGE`] after it opened (the
/// writer commits bigger ones itself); stopped and joined when dropped.
#[derive(Debug)]
pub(crate) struct Flusher {
    batching: Arc<Batching>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn start(
        writer: Arc<Mutex<Connection>>,
        batching: Arc<Batching>,
        reserve: Arc<DiskReserve>,
    ) -> Result<Flusher> {
        let shared = Arc::clone(&batching);
        let thread = std::thread::Builder::new()
            .name("meta-batch".into())
            .spawn(move || flush_loop(&writer, &shared, &reserve))
            .map_err(|source| MetaError::Io {
                path: PathBuf::from("meta-batch thread"),
                source,
            })?;
        Ok(Flusher {
            batching,
            thread: Some(thread),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.batching.lock().stopping = true;
        self.batching.opened.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn flush_loop(writer: &Mutex<Connection>, batching: &Batching, reserve: &DiskReserve) {
    loop {
        {
            let mut batch = batching.lock();
            loop {
                if batch.stopping {
                    return;
                }
                match batch.opened_at {
                    None => {
                        batch = batching
                            .opened
                            .wait(batch)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    Some(t) => {
                        let wait = batch.age.saturating_sub(t.elapsed());
                        if wait.is_zero() {
                            break;
                        }
                        batch = batching
                            .opened
                            .wait_timeout(batch, wait)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                }
            }
        }
        let conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut batch = batching.lock();
        if batch.due() {
            batch.commit(&conn, batching, reserve);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_a_torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("m.db");
        let mut log = OpLog::open(&db).unwrap();
        log.append(7, b"first").unwrap();
        log.append(8, b"second").unwrap();
        let whole = log.records().unwrap();
        assert_eq!(
            whole,
            vec![
                Record {
                    seq: 7,
                    changes: b"first".to_vec()
                },
                Record {
                    seq: 8,
                    changes: b"second".to_vec()
                }
            ]
        );
        // Every cut inside the second record leaves the first alone.
        let full = std::fs::metadata(log_path(&db)).unwrap().len();
        let first_end = (HEADER_BYTES + 5) as u64;
        for cut in first_end..full {
            log.file.set_len(cut).unwrap();
            assert_eq!(log.records().unwrap().len(), 1, "cut at {cut}");
        }
        // A flipped byte in a record's changes ends the log there.
        log.file.set_len(0).unwrap();
        log.len = 0;
        log.append(1, b"abc").unwrap();
        log.append(2, b"def").unwrap();
        log.file
            .write_all_at(b"X", (HEADER_BYTES + 3 + HEADER_BYTES) as u64)
            .unwrap();
        assert_eq!(log.records().unwrap().len(), 1);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(log_path(&db)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "the log is the owner's only");
    }
}
