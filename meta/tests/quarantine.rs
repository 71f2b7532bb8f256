//! Corruption found while serving puts the store in quarantine: the first
//! operation that meets it fails (EIO), every later change is refused with
//! EROFS before it starts, and reads of undamaged metadata go on. Runs on
//! the engine BATON_META_BACKEND names.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{CreateArgs, FileKind, MetaError, ROOT_INO};
use common::*;

#[test]
fn a_broken_invariant_stops_every_change_and_reads_go_on() {
    let v = fresh();
    let m = v.meta.as_ref();
    let kept = file(m, ROOT_INO, "kept");
    let damaged = file(m, ROOT_INO, "damaged");
    assert_eq!(m.quarantined(), None);
    // Damage behind the store's back: a named file with a link count of 0.
    raw_exec(
        &v,
        "UPDATE inodes SET nlink = 0 WHERE ino = ?1",
        &[damaged.ino as i64],
    );

    let err = m.unlink(ROOT_INO, n("damaged"), None).unwrap_err();
    assert!(err.is_corruption(), "{err}");
    assert_eq!(err.errno(), libc::EIO);
    let why = m.quarantined().expect("quarantined after the corruption");
    assert!(why.contains("nlink 0"), "{why}");

    // Every change is refused before it starts, and says what to do.
    let args = CreateArgs::new(FileKind::Regular, 0o644);
    let refused = m.create(ROOT_INO, n("new"), &args, None).unwrap_err();
    assert!(
        matches!(refused, MetaError::Quarantined { .. }),
        "{refused}"
    );
    assert_eq!(refused.errno(), libc::EROFS);
    assert!(refused.to_string().contains("fsctl fsck"), "{refused}");
    assert!(m.unlink(ROOT_INO, n("kept"), None).is_err());
    assert!(m.set_quota(ROOT_INO, Some(1), None).is_err());

    // Reads go on, and nothing changed.
    assert_eq!(m.lookup(ROOT_INO, n("kept")).unwrap().ino, kept.ino);
    let mut listed = names(m, ROOT_INO);
    listed.sort();
    assert_eq!(listed, ["damaged", "kept"]);
    assert!(m.lookup(ROOT_INO, n("new")).is_err());
}

#[test]
fn a_fresh_open_starts_without_quarantine() {
    let v = fresh();
    let damaged = file(v.meta.as_ref(), ROOT_INO, "damaged");
    raw_exec(
        &v,
        "UPDATE inodes SET nlink = 0 WHERE ino = ?1",
        &[damaged.ino as i64],
    );
    assert!(v.meta.unlink(ROOT_INO, n("damaged"), None).is_err());
    assert!(v.meta.quarantined().is_some());
    // After a repair (here: the row put right), a new open serves again.
    raw_exec(
        &v,
        "UPDATE inodes SET nlink = 1 WHERE ino = ?1",
        &[damaged.ino as i64],
    );
    let v = v.reopen();
    assert_eq!(v.meta.quarantined(), None);
    v.meta.unlink(ROOT_INO, n("damaged"), None).unwrap();
}

#[test]
fn unreadable_sqlite_pages_and_postgres_data_corruption_count_as_corruption() {
    let corrupt = rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
        Some("database disk image is malformed".into()),
    );
    let busy =
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
    assert!(MetaError::from(corrupt).is_corruption());
    assert!(!MetaError::from(busy).is_corruption());
    let pg = |code: &str| MetaError::Postgres {
        op: "lookup",
        code: Some(code.into()),
        message: "x".into(),
    };
    assert!(pg("XX001").is_corruption() && pg("XX002").is_corruption());
    assert!(!pg("40001").is_corruption());
    let enoent = MetaError::NotFound { ino: 1, name: None };
    assert!(!enoent.is_corruption());
}
