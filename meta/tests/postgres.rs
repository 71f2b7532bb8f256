//! The PostgreSQL engine on a real server: schema migrations (an older
//! volume opens and is migrated; a newer one is refused unchanged), format
//! and open refusals, two stores on one database (two hosts) creating in
//! the same directory at once and sharing exactly-once records, and a clear
//! error for an unreachable server.
//!
//! Needs `BATON_TEST_POSTGRES_URL` (`.ci/run` starts a server and exports
//! it); skips loudly without it unless `BATON_REQUIRE_POSTGRES=1`.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_meta::{CreateArgs, FileKind, MetaError, MetaStore, PostgresMeta, RequestKey, ROOT_INO};
use common::*;

fn server(test: &str) -> Option<String> {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) => Some(url),
        Err(_) => {
            let required = std::env::var("BATON_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{test}: {POSTGRES_URL_ENV} is not set but BATON_REQUIRE_POSTGRES=1"
            );
            eprintln!("\n!!!!! SKIPPED {test}: {POSTGRES_URL_ENV} is not set; start a server with .ci/start-postgres DIR PORT (CI sets BATON_REQUIRE_POSTGRES=1 and fails instead) !!!!!\n");
            None
        }
    }
}

fn schema_version(url: &str) -> i64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query_one("SELECT version FROM schema_version", &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_volume_formatted_at_an_older_schema_is_migrated_on_open() {
    let Some(admin) = server("postgres migration") else {
        return;
    };
    let db = TestDatabase::create_on(&admin);
    let old = PostgresMeta::format_at_version(&db.url, &config(), 1).unwrap();
    drop(old);
    // A file made by that older build (behind this build's back: this
    // build's create also counts quotas, whose tables come later).
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let f_ino: i64 = c
        .query_one(
            "INSERT INTO inodes (generation, kind, mode, nlink, uid, gid, rdev, size,
                 atime_sec, atime_nsec, mtime_sec, mtime_nsec, ctime_sec, ctime_nsec)
             VALUES (1, 1, 420, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) RETURNING ino",
            &[],
        )
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO dentries (parent, name, ino) VALUES (1, $1, $2)",
        &[&b"before".as_slice(), &f_ino],
    )
    .unwrap();
    drop(c);
    let f_ino = f_ino as u64;
    assert_eq!(schema_version(&db.url), 1);
    let latest = PostgresMeta::latest_schema_version();
    assert!(latest >= 2, "there is a migration to run");

    let meta = baton_meta::open(&db.url).unwrap();
    assert_eq!(schema_version(&db.url), latest);
    assert_eq!(meta.lookup(ROOT_INO, n("before")).unwrap().ino, f_ino);
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let index: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'completed_requests_by_time'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(index, 1, "migration 2 ran");
    // Migration 4: sessions and orphan holds work on the migrated volume.
    let info = baton_meta::SessionInfo {
        id: 5,
        host: "h".into(),
        pid: 1,
        mount: "/m".into(),
    };
    meta.open_session(&info).unwrap();
    meta.unlink(ROOT_INO, n("before"), None).unwrap();
    assert_eq!(meta.held_orphans(5).unwrap(), vec![f_ino]);
    // Migration 6: quotas count on the migrated volume.
    let q = meta
        .create(
            ROOT_INO,
            n("q"),
            &CreateArgs::new(FileKind::Directory, 0o755),
            None,
        )
        .unwrap();
    meta.set_quota(q.ino, None, Some(1)).unwrap();
    meta.create(
        q.ino,
        n("one"),
        &CreateArgs::new(FileKind::Regular, 0o644),
        None,
    )
    .unwrap();
    let refused = meta.create(
        q.ino,
        n("two"),
        &CreateArgs::new(FileKind::Regular, 0o644),
        None,
    );
    assert_eq!(refused.unwrap_err().errno(), libc::EDQUOT);
    // A second open finds nothing to do.
    drop(meta);
    baton_meta::open(&db.url).unwrap();
    assert_eq!(schema_version(&db.url), latest);
}

#[test]
fn a_newer_schema_is_refused_unchanged() {
    let Some(admin) = server("postgres newer schema") else {
        return;
    };
    let db = TestDatabase::create_on(&admin);
    drop(baton_meta::format(&db.url, &config()).unwrap());
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    c.execute("UPDATE schema_version SET version = 99", &[])
        .unwrap();
    let e = baton_meta::open(&db.url).unwrap_err();
    assert!(
        matches!(e, MetaError::UnsupportedVersion { found: 99, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("upgrade Baton"), "{e}");
    assert_eq!(schema_version(&db.url), 99);
}

#[test]
fn format_and_open_refuse_what_is_not_an_empty_or_baton_database() {
    let Some(admin) = server("postgres refusals") else {
        return;
    };
    let db = TestDatabase::create_on(&admin);
    let e = baton_meta::open(&db.url).unwrap_err();
    assert!(matches!(e, MetaError::NotFormatted { .. }), "{e}");
    drop(baton_meta::format(&db.url, &config()).unwrap());
    let e = baton_meta::format(&db.url, &config()).unwrap_err();
    assert!(matches!(e, MetaError::AlreadyFormatted { .. }), "{e}");

    let foreign = TestDatabase::create_on(&admin);
    let mut c = postgres::Client::connect(&foreign.url, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE volume (id INT)").unwrap();
    let e = baton_meta::open(&foreign.url).unwrap_err();
    assert!(matches!(e, MetaError::Foreign { .. }), "{e}");
}

#[test]
fn an_unreachable_server_is_a_quick_clear_error_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let url = format!("postgres://baton:hunter2@127.0.0.1:{port}/vol");
    let e = baton_meta::open(&url).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("cannot connect to postgres://baton:***@127.0.0.1"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(e.errno(), libc::EIO);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn two_stores_on_one_database_create_in_one_directory_at_once() {
    let Some(admin) = server("postgres two hosts") else {
        return;
    };
    let db = TestDatabase::create_on(&admin);
    let a: Arc<dyn MetaStore> = Arc::from(baton_meta::format(&db.url, &config()).unwrap());
    let b: Arc<dyn MetaStore> = Arc::from(baton_meta::open(&db.url).unwrap());
    let per_thread = 20;
    let handles: Vec<_> = [&a, &b, &a, &b]
        .into_iter()
        .enumerate()
        .map(|(t, m)| {
            let m = Arc::clone(m);
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    let args = CreateArgs::new(FileKind::Directory, 0o755);
                    m.create(ROOT_INO, n(&format!("d{t}-{i}")), &args, None)
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Every create landed once and the root's link count saw every one
    // (2 + subdirectories): no lost update between the two stores.
    let total = 4 * per_thread;
    assert_eq!(a.getattr(ROOT_INO).unwrap().nlink, 2 + total as u32);
    assert_eq!(b.readdir(ROOT_INO, 0, 1000).unwrap().len(), 2 + total);

    // Exactly-once across stores: a mutation recorded by one is found, and
    // not run again, by the other.
    let key = RequestKey::new(0xfeed, 0x0001);
    let args = CreateArgs::new(FileKind::Regular, 0o600);
    let made = a.create(ROOT_INO, n("once"), &args, Some(key)).unwrap();
    assert!(b.completed_request(key).unwrap().is_some());
    let e = b
        .create(ROOT_INO, n("twice"), &args, Some(key))
        .unwrap_err();
    assert!(matches!(e, MetaError::DuplicateRequest { .. }), "{e}");
    assert!(b.lookup(ROOT_INO, n("twice")).is_err(), "rolled back");
    assert_eq!(b.lookup(ROOT_INO, n("once")).unwrap().ino, made.ino);
}

/// Migration 10: the per-block reservations of schema 7 become runs that
/// count (statfs, quotas) and end (a commit) as before.
#[test]
fn per_block_reservations_of_schema_7_are_runs_after_migration_10() {
    let Some(admin) = server("postgres migration 10") else {
        return;
    };
    let db = TestDatabase::create_on(&admin);
    let old = PostgresMeta::format_at_version(&db.url, &config(), 7).unwrap();
    let f = old
        .create(
            ROOT_INO,
            n("f"),
            &CreateArgs::new(FileKind::Regular, 0o644),
            None,
        )
        .unwrap();
    // (No statfs here: this build's reads the table of migration 10.)
    drop(old);
    let base = 0;
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    c.execute(
        "INSERT INTO reservations (ino, idx, len) VALUES ($1, 0, 4096), ($1, 1, 4096), ($1, 2, 100)",
        &[&(f.ino as i64)],
    )
    .unwrap();
    let meta = baton_meta::open(&db.url).unwrap();
    assert_eq!(schema_version(&db.url), 10);
    let bs = u64::from(BS);
    assert_eq!(meta.statfs().unwrap().bytes_used - base, 2 * bs + 100);
    let q = meta.set_quota(ROOT_INO, None, None).unwrap();
    assert_eq!(q.used.bytes, 2 * bs + 100);
    let commit = baton_meta::CommitBlocks {
        new_size: Some(2 * bs),
        blocks: vec![baton_meta::BlockRef::object(1, "k1", BS)],
        ..Default::default()
    };
    meta.commit_blocks(f.ino, &commit, None).unwrap();
    assert_eq!(meta.statfs().unwrap().bytes_used - base, 2 * bs + 100);
    let runs: Vec<(i64, i64, i64)> = c
        .query(
            "SELECT idx, end_idx, last_len FROM reserved_ranges ORDER BY idx",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(runs, [(0, 1, 4096), (2, 3, 100)]);
}
