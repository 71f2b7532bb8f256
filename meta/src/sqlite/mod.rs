//! [`SqliteMeta`]: the embedded SQLite engine behind [`MetaStore`].
//!
//! Connections: one read-write connection behind a mutex serialises all
//! write transactions (`BEGIN IMMEDIATE`); a pool of
//! [`READ_CONNECTIONS_MAX`] read-only connections serves reads, each in its
//! own deferred transaction so a multi-statement read sees one snapshot
//! (WAL mode lets readers run beside the writer). Pragmas: `journal_mode =
//! WAL`, `synchronous = FULL`, `foreign_keys = ON`, `busy_timeout`.
//!
//! The schema (v1: tables, columns, versioning) is documented at the top of
//! `sqlite/schema.rs`.
//!
//! A panic inside a transaction poisons its mutex; the transaction was rolled
//! back on unwind, so the connection is reused as is.

mod blockmap;
mod inode;
mod namespace;
mod orphan;
mod readdir;
mod rename;
mod requests;
mod scan;
mod schema;
mod setattr;
mod xattr;

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::{MetaError, Result};
use crate::limits::{BLOCK_SIZE_BYTES_MAX, BLOCK_SIZE_BYTES_MIN, READ_CONNECTIONS_MAX};
use crate::record::Recorded;
use crate::store::{Location, MetaStore};
use crate::types::{
    Attr, BlockRef, CommitBlocks, CreateArgs, DirEntry, ObjectRef, RenameFlags, Renamed,
    RequestKey, SetAttr, StatFs, Timespec, TruncatedBlocks, Unlinked, VolumeConfig, VolumeRecord,
    XattrFlags,
};
use crate::FORMAT_VERSION;

/// A Baton volume's metadata in a SQLite database file.
#[derive(Debug)]
pub struct SqliteMeta {
    path: PathBuf,
    volume: VolumeRecord,
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    /// Keys of answered requests (and when), whose records a later write
    /// deletes once [`ANSWERED_RECORD_KEEP`] has passed.
    answered: Mutex<VecDeque<(Instant, RequestKey)>>,
    /// Set by `fence`: every later write fails with `Fenced`.
    fenced: AtomicBool,
}

/// Answered request keys queued at most before they are deleted in a
/// transaction of their own rather than riding along with the next write.
pub const ANSWERED_QUEUE_MAX: usize = 1024;
/// How long the record of an answered request is kept. A handover may
/// journal a request whose reply was just written (the worker had not yet
/// withdrawn it); the next generation must still find its record then.
pub const ANSWERED_RECORD_KEEP: Duration = Duration::from_secs(2);

impl SqliteMeta {
    /// Creates a new metadata database at `url_or_path` with the volume
    /// record and the root directory, and opens it. Refuses with
    /// [`MetaError::AlreadyFormatted`] if any file exists there.
    pub fn format(url_or_path: &str, config: &VolumeConfig) -> Result<SqliteMeta> {
        check_config(config)?;
        let Location::Sqlite(path) = Location::parse(url_or_path)?;
        let io = |source| MetaError::Io {
            path: path.clone(),
            source,
        };
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(MetaError::AlreadyFormatted { path });
            }
            Err(e) => return Err(io(e)),
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
                schema::configure_writer(&conn)?;
                schema::create(&mut conn, &volume)?;
                Ok(conn)
            });
        match made {
            Ok(conn) => SqliteMeta::from_writer(path, volume, conn),
            Err(e) => {
                remove_db_files(&path);
                Err(e.in_op("format"))
            }
        }
    }

    /// Opens an existing metadata database, checking it is a Baton volume of
    /// a supported format version before changing anything in the file.
    pub fn open(url_or_path: &str) -> Result<SqliteMeta> {
        let Location::Sqlite(path) = Location::parse(url_or_path)?;
        if !path.exists() {
            return Err(MetaError::NotFormatted { path });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| MetaError::Foreign {
            path: path.clone(),
            reason: format!("SQLite cannot open it: {e}"),
        })?;
        let volume = schema::validate(&path, &conn)?;
        schema::configure_writer(&conn).map_err(|e| e.in_op("open"))?;
        requests::ensure(&conn).map_err(|e| e.in_op("open"))?;
        SqliteMeta::from_writer(path, volume, conn)
    }

    fn from_writer(path: PathBuf, volume: VolumeRecord, writer: Connection) -> Result<SqliteMeta> {
        let mut readers = Vec::with_capacity(READ_CONNECTIONS_MAX);
        for _ in 0..READ_CONNECTIONS_MAX {
            let reader = schema::open_reader(&path).map_err(|e| e.in_op("open reader"))?;
            readers.push(Mutex::new(reader));
        }
        tracing::debug!(path = %path.display(), volume = %volume.name, "metadata opened");
        Ok(SqliteMeta {
            path,
            volume,
            writer: Mutex::new(writer),
            readers,
            next_reader: AtomicUsize::new(0),
            answered: Mutex::new(VecDeque::new()),
            fenced: AtomicBool::new(false),
        })
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction; with a request key,
    /// also records `encode(result)` in it and deletes the records of
    /// requests answered since the last write. Commits only if all
    /// succeeded; refuses everything once fenced.
    fn write<T>(
        &self,
        op: &'static str,
        req: Option<RequestKey>,
        f: impl FnOnce(&Transaction<'_>) -> Result<T>,
        encode: impl FnOnce(&T) -> Recorded,
    ) -> Result<T> {
        let mut conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the writer lock, which `fence` takes: no write
        // starts after a fence returns.
        if self.fenced.load(Ordering::SeqCst) {
            return Err(MetaError::Fenced { op });
        }
        let answered = match req {
            Some(_) => self.take_answered(ANSWERED_RECORD_KEEP),
            None => Vec::new(),
        };
        let run = || -> Result<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            if let Some(key) = req {
                requests::record(&tx, key, &encode(&out).encode())?;
                requests::forget(&tx, &answered)?;
            }
            tx.commit()?;
            Ok(out)
        };
        let result = run();
        if result.is_err() && !answered.is_empty() {
            // Rolled back: keep the keys for the next write.
            let now = Instant::now() - ANSWERED_RECORD_KEEP;
            lock(&self.answered).extend(answered.into_iter().map(|k| (now, k)));
        }
        result.map_err(|e| log_store_error(e.in_op(op)))
    }

    /// Takes the answered keys queued at least `age` ago.
    fn take_answered(&self, age: Duration) -> Vec<RequestKey> {
        let mut queue = lock(&self.answered);
        let mut keys = Vec::new();
        while let Some((at, key)) = queue.front() {
            if at.elapsed() < age {
                break;
            }
            keys.push(*key);
            queue.pop_front();
        }
        keys
    }

    /// Runs `f` in a deferred read transaction on a pool connection.
    fn read<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.reader();
        let run = || -> Result<T> {
            let tx = conn.transaction()?;
            let out = f(&tx)?;
            tx.finish()?;
            Ok(out)
        };
        run().map_err(|e| log_store_error(e.in_op(op)))
    }

    /// A free pool connection if there is one, else waits for one.
    fn reader(&self) -> MutexGuard<'_, Connection> {
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

fn log_store_error(e: MetaError) -> MetaError {
    if let MetaError::Store { op, source } = &e {
        tracing::warn!(op, error = %source, "metadata store error");
    }
    e
}

fn check_config(config: &VolumeConfig) -> Result<()> {
    let bad = |reason: String| Err(MetaError::InvalidConfig { reason });
    if config.name.is_empty() {
        return bad("volume name is empty".into());
    }
    let bs = config.block_size_bytes;
    if !(BLOCK_SIZE_BYTES_MIN..=BLOCK_SIZE_BYTES_MAX).contains(&bs) {
        return bad(format!(
            "block size {bs} bytes is outside {BLOCK_SIZE_BYTES_MIN}..={BLOCK_SIZE_BYTES_MAX}"
        ));
    }
    Ok(())
}

fn random_u128() -> std::io::Result<u128> {
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(u128::from_be_bytes(buf))
}

/// Best-effort cleanup after a failed format, so the user can retry.
fn remove_db_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

impl MetaStore for SqliteMeta {
    fn volume(&self) -> VolumeRecord {
        self.volume.clone()
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        self.read("lookup", |c| namespace::lookup(c, parent, name))
    }

    fn getattr(&self, ino: u64) -> Result<Attr> {
        self.read("getattr", |c| inode::attr(c, ino))
    }

    fn setattr(
        &self,
        ino: u64,
        set: &SetAttr,
        req: Option<RequestKey>,
    ) -> Result<(Attr, TruncatedBlocks)> {
        let bs = self.volume.block_size_bytes;
        self.write(
            "setattr",
            req,
            |c| setattr::setattr(c, ino, set, bs),
            |(a, t)| Recorded::SetAttr(a.clone(), t.clone()),
        )
    }

    fn create(
        &self,
        parent: u64,
        name: &OsStr,
        args: &CreateArgs,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        self.write(
            "create",
            req,
            |c| namespace::create(c, parent, name, args),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn link(
        &self,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
        req: Option<RequestKey>,
    ) -> Result<Attr> {
        self.write(
            "link",
            req,
            |c| namespace::link(c, ino, new_parent, new_name),
            |a| Recorded::Attr(a.clone()),
        )
    }

    fn unlink(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked> {
        self.write(
            "unlink",
            req,
            |c| namespace::unlink(c, parent, name),
            |u| Recorded::Unlinked(*u),
        )
    }

    fn rmdir(&self, parent: u64, name: &OsStr, req: Option<RequestKey>) -> Result<Unlinked> {
        self.write(
            "rmdir",
            req,
            |c| namespace::rmdir(c, parent, name),
            |u| Recorded::Unlinked(*u),
        )
    }

    fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
        req: Option<RequestKey>,
    ) -> Result<Renamed> {
        self.write(
            "rename",
            req,
            |c| rename::rename(c, (parent, name), (new_parent, new_name), flags),
            |r| Recorded::Renamed(*r),
        )
    }

    fn reclaim(&self, ino: u64, req: Option<RequestKey>) -> Result<Vec<ObjectRef>> {
        self.write(
            "reclaim",
            req,
            |c| orphan::reclaim(c, ino),
            |v| Recorded::Released(v.clone()),
        )
    }

    fn orphans(&self) -> Result<Vec<u64>> {
        self.read("orphans", |c| orphan::list(c))
    }

    fn readlink(&self, ino: u64) -> Result<OsString> {
        self.read("readlink", |c| namespace::readlink(c, ino))
    }

    fn readdir(&self, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntry>> {
        self.read("readdir", |c| readdir::readdir(c, ino, offset, limit))
    }

    fn setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: XattrFlags,
        req: Option<RequestKey>,
    ) -> Result<()> {
        self.write(
            "setxattr",
            req,
            |c| xattr::set(c, ino, name, value, flags),
            |_| Recorded::Unit,
        )
    }

    fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        self.read("getxattr", |c| xattr::get(c, ino, name))
    }

    fn listxattr(&self, ino: u64) -> Result<Vec<OsString>> {
        self.read("listxattr", |c| xattr::list(c, ino))
    }

    fn removexattr(&self, ino: u64, name: &OsStr, req: Option<RequestKey>) -> Result<()> {
        self.write(
            "removexattr",
            req,
            |c| xattr::remove(c, ino, name),
            |_| Recorded::Unit,
        )
    }

    fn statfs(&self) -> Result<StatFs> {
        let bs = self.volume.block_size_bytes;
        self.read("statfs", |c| inode::statfs(c, bs))
    }

    fn blocks(&self, ino: u64, first_index: u64, count: u32) -> Result<Vec<BlockRef>> {
        self.read("blocks", |c| blockmap::blocks(c, ino, first_index, count))
    }

    fn scan_blocks(&self, after: Option<(u64, u64)>, limit: u32) -> Result<Vec<(u64, BlockRef)>> {
        self.read("scan blocks", |c| scan::scan_blocks(c, after, limit))
    }

    fn commit_blocks(
        &self,
        ino: u64,
        commit: &CommitBlocks,
        req: Option<RequestKey>,
    ) -> Result<(Attr, Vec<ObjectRef>)> {
        let bs = self.volume.block_size_bytes;
        self.write(
            "commit_blocks",
            req,
            |c| blockmap::commit(c, ino, commit, bs),
            |(a, v)| Recorded::Committed(a.clone(), v.clone()),
        )
    }

    fn completed_request(&self, key: RequestKey) -> Result<Option<Vec<u8>>> {
        self.read("completed_request", |c| requests::get(c, key))
    }

    fn prune_completed(&self, older_than: SystemTime) -> Result<u64> {
        let before = Timespec::from_system_time(older_than);
        self.write(
            "prune_completed",
            None,
            |c| requests::prune(c, before),
            |_| Recorded::Unit,
        )
    }

    fn request_answered(&self, key: RequestKey) {
        let full = {
            let mut answered = lock(&self.answered);
            answered.push_back((Instant::now(), key));
            answered.len() >= ANSWERED_QUEUE_MAX
        };
        if full {
            let keys = self.take_answered(ANSWERED_RECORD_KEEP);
            if keys.is_empty() {
                return;
            }
            let forgotten = self.write(
                "forget answered requests",
                None,
                |c| requests::forget(c, &keys),
                |_| Recorded::Unit,
            );
            if let Err(e) = forgotten {
                // Harmless: prune_completed removes them later.
                tracing::debug!(error = %e, count = keys.len(), "answered request records kept");
            }
        }
    }

    fn fence(&self) {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.fenced.store(true, Ordering::SeqCst);
    }

    fn unfence(&self) {
        self.fenced.store(false, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded queue is valid after any statement.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pragma_i64(c: &Connection, name: &str) -> i64 {
        c.pragma_query_value(None, name, |r| r.get(0)).unwrap()
    }

    fn check_pragmas(m: &SqliteMeta) {
        let w = m.writer.lock().unwrap();
        assert_eq!(pragma_i64(&w, "synchronous"), 2, "synchronous = FULL");
        assert_eq!(pragma_i64(&w, "foreign_keys"), 1);
        assert_eq!(pragma_i64(&w, "busy_timeout"), 5000);
        let mode: String = w
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(m.readers.len(), READ_CONNECTIONS_MAX);
        for r in &m.readers {
            assert_eq!(pragma_i64(&r.lock().unwrap(), "query_only"), 1);
        }
    }

    #[test]
    fn connections_use_wal_full_sync_foreign_keys_and_read_only_readers() {
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
