//! Shared helpers for the integration tests: a fresh volume in a temp dir
//! and short constructors for names and create arguments.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;

use baton_meta::{Attr, CreateArgs, FileKind, MetaStore, VolumeConfig};

/// Block size used by the tests: small so block arithmetic is easy to read.
pub const BS: u32 = 4096;

/// `sqlite` (default) or `postgres`: the engine the trait-level tests run on.
pub const BACKEND_ENV: &str = "BATON_META_BACKEND";
/// Admin URL of a PostgreSQL server the tests may create databases on
/// (`.ci/run` starts one and exports it).
pub const POSTGRES_URL_ENV: &str = "BATON_TEST_POSTGRES_URL";

pub struct Vol {
    pub dir: tempfile::TempDir,
    pub meta: Box<dyn MetaStore>,
    /// The PostgreSQL database of this volume (dropped last), if any.
    pub db: Option<TestDatabase>,
}

impl Vol {
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("meta.db")
    }

    /// The URL the volume was formatted at.
    pub fn url(&self) -> String {
        match &self.db {
            Some(db) => db.url.clone(),
            None => self.path().to_str().unwrap().to_string(),
        }
    }

    /// Closes and reopens the store on the same file or database.
    pub fn reopen(self) -> Vol {
        let url = self.url();
        drop(self.meta);
        let meta = baton_meta::open(&url).unwrap();
        Vol {
            dir: self.dir,
            meta,
            db: self.db,
        }
    }
}

pub fn config() -> VolumeConfig {
    VolumeConfig {
        name: "testvol".into(),
        storage_url: "file:///tmp/objects".into(),
        block_size_bytes: BS,
    }
}

/// A fresh volume in a SQLite file (tests of the file format itself).
pub fn fresh_sqlite() -> Vol {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let meta = baton_meta::format(path.to_str().unwrap(), &config()).unwrap();
    // As a mount serves it: attributes and entries from memory.
    meta.serve_as_only_writer();
    Vol {
        dir,
        meta,
        db: None,
    }
}

/// A fresh volume on the engine [`BACKEND_ENV`] names.
pub fn fresh() -> Vol {
    let dir = tempfile::tempdir().unwrap();
    match std::env::var(BACKEND_ENV).as_deref() {
        Ok("postgres") => {
            let db = TestDatabase::create();
            let meta = baton_meta::format(&db.url, &config()).unwrap();
            Vol {
                dir,
                meta,
                db: Some(db),
            }
        }
        Ok("sqlite") | Err(_) => fresh_sqlite(),
        Ok(other) => panic!("{BACKEND_ENV}={other}: use sqlite or postgres"),
    }
}

/// An empty PostgreSQL database, dropped (with its connections) on drop.
pub struct TestDatabase {
    pub admin_url: String,
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    /// Creates one on the server [`POSTGRES_URL_ENV`] names; panics without it.
    pub fn create() -> TestDatabase {
        let admin_url = std::env::var(POSTGRES_URL_ENV).unwrap_or_else(|_| {
            panic!("{POSTGRES_URL_ENV} is not set: start a server with .ci/start-postgres DIR PORT and export the URL it prints")
        });
        TestDatabase::create_on(&admin_url)
    }

    /// Creates one on `admin_url`'s server.
    pub fn create_on(admin_url: &str) -> TestDatabase {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("baton_t_{}_{n}_{nanos}", std::process::id());
        let mut admin = postgres::Client::connect(admin_url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let (base, _) = admin_url.rsplit_once('/').unwrap();
        TestDatabase {
            admin_url: admin_url.to_string(),
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = postgres::Client::connect(&self.admin_url, postgres::NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

pub fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

pub fn mk(m: &dyn MetaStore, parent: u64, name: &str, kind: FileKind) -> Attr {
    let mode = if kind == FileKind::Directory {
        0o755
    } else {
        0o644
    };
    let mut args = CreateArgs::new(kind, mode);
    if kind == FileKind::Symlink {
        args.symlink_target = Some("target".into());
    }
    m.create(parent, n(name), &args, None).unwrap()
}

pub fn file(m: &dyn MetaStore, parent: u64, name: &str) -> Attr {
    mk(m, parent, name, FileKind::Regular)
}

pub fn dir(m: &dyn MetaStore, parent: u64, name: &str) -> Attr {
    mk(m, parent, name, FileKind::Directory)
}

/// Names listed by readdir, `.` and `..` excluded.
pub fn names(m: &dyn MetaStore, ino: u64) -> Vec<String> {
    m.readdir(ino, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .filter(|s| s != "." && s != "..")
        .collect()
}

/// Opens a raw SQLite connection on the volume file, for tests that must
/// corrupt or bulk-load the database.
/// The store's own writes are committed first (`sync`): a connection of
/// its own sees only what the store committed.
pub fn raw(v: &Vol) -> rusqlite::Connection {
    v.meta.sync().unwrap();
    rusqlite::Connection::open(v.path()).unwrap()
}

/// Runs one statement with integer parameters (`?N`) behind the store's
/// back, on whichever engine the volume uses (to corrupt or bulk-load).
pub fn raw_exec(v: &Vol, sql: &str, params: &[i64]) {
    match &v.db {
        None => {
            raw(v)
                .execute(sql, rusqlite::params_from_iter(params.iter()))
                .unwrap();
        }
        Some(db) => {
            let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                .iter()
                .map(|p| p as &(dyn postgres::types::ToSql + Sync))
                .collect();
            c.execute(&sql.replace('?', "$"), &refs).unwrap();
        }
    }
}

/// Adds `count` regular files named `e0`, `e1`, ... to the root directory
/// in one transaction behind the store's back (thousands of separate
/// creates would only slow a test down).
pub fn raw_bulk_files(v: &Vol, count: u32) {
    let inode = "INSERT INTO inodes (ino, generation, kind, mode, nlink, uid, gid, rdev, size,
               atime_sec, atime_nsec, mtime_sec, mtime_nsec, ctime_sec, ctime_nsec)
             VALUES (?1, 1, 1, 420, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)";
    let entry = "INSERT INTO dentries (parent, name, ino) VALUES (1, ?1, ?2)";
    // Inode numbers far above what the test's own creates reach.
    let ino = |i: u32| 1_000_000 + i64::from(i);
    match &v.db {
        None => {
            let mut c = raw(v);
            let tx = c.transaction().unwrap();
            for i in 0..count {
                tx.execute(inode, [ino(i)]).unwrap();
                tx.execute(entry, (format!("e{i}").into_bytes(), ino(i)))
                    .unwrap();
            }
            tx.commit().unwrap();
        }
        Some(db) => {
            let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
            let mut tx = c.transaction().unwrap();
            let inode = tx.prepare(&inode.replace('?', "$")).unwrap();
            let entry = tx.prepare(&entry.replace('?', "$")).unwrap();
            for i in 0..count {
                tx.execute(&inode, &[&ino(i)]).unwrap();
                tx.execute(&entry, &[&format!("e{i}").into_bytes(), &ino(i)])
                    .unwrap();
            }
            tx.commit().unwrap();
        }
    }
}
