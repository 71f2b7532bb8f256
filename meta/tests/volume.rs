//! Formatting, opening and reopening volumes, and the errors for paths that
//! are missing, foreign or from a newer format.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{FileKind, MetaError, XattrFlags, FORMAT_VERSION, ROOT_INO};
use common::*;

#[test]
fn format_creates_volume_record_and_root_directory() {
    let v = fresh();
    let vol = v.meta.volume();
    assert_eq!(vol.name, "testvol");
    assert_eq!(vol.storage_url, "file:///tmp/objects");
    assert_eq!(vol.block_size_bytes, BS);
    assert_eq!(vol.format_version, FORMAT_VERSION);
    assert_ne!(vol.uuid, 0);
    assert!(vol.created.sec > 1_600_000_000);
    let root = v.meta.getattr(ROOT_INO).unwrap();
    assert_eq!(root.kind, FileKind::Directory);
    assert_eq!(root.mode, 0o755);
    assert_eq!(root.st_mode(), 0o40755);
    assert_eq!(
        (root.uid, root.gid, root.nlink, root.generation),
        (0, 0, 2, 1)
    );
}

#[test]
fn two_volumes_get_different_uuids() {
    assert_ne!(fresh().meta.volume().uuid, fresh().meta.volume().uuid);
}

#[test]
fn format_refuses_an_existing_file() {
    let v = fresh_sqlite();
    let e = baton_meta::format(v.path().to_str().unwrap(), &config()).unwrap_err();
    assert!(
        matches!(e, MetaError::AlreadyFormatted { ref path } if *path == v.path()),
        "{e}"
    );
    assert_eq!(e.errno(), libc::EEXIST);
    // The existing volume is untouched.
    assert_eq!(v.meta.getattr(ROOT_INO).unwrap().nlink, 2);
}

#[test]
fn format_accepts_sqlite_urls_and_refuses_bad_configs() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/m.db", dir.path().display());
    let m = baton_meta::format(&url, &config()).unwrap();
    drop(m);
    assert_eq!(baton_meta::open(&url).unwrap().volume().name, "testvol");

    let mut bad = config();
    bad.block_size_bytes = baton_meta::limits::BLOCK_SIZE_BYTES_MIN - 1;
    let p = dir.path().join("small.db");
    let e = baton_meta::format(p.to_str().unwrap(), &bad).unwrap_err();
    assert!(matches!(e, MetaError::InvalidConfig { .. }), "{e}");
    assert!(!p.exists(), "a refused format leaves no file");
    bad.block_size_bytes = baton_meta::limits::BLOCK_SIZE_BYTES_MAX + 1;
    assert!(baton_meta::format(p.to_str().unwrap(), &bad).is_err());
    let mut unnamed = config();
    unnamed.name.clear();
    assert!(baton_meta::format(p.to_str().unwrap(), &unnamed).is_err());
    let e = baton_meta::format("mysql://db/meta", &config()).unwrap_err();
    assert!(matches!(e, MetaError::UnsupportedUrl { .. }), "{e}");
}

#[test]
fn open_of_missing_file_says_to_format() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope.db");
    let e = baton_meta::open(p.to_str().unwrap()).unwrap_err();
    assert!(matches!(e, MetaError::NotFormatted { .. }), "{e}");
    assert!(e.to_string().contains("fsctl format"), "{e}");
    assert!(!p.exists(), "open must not create the file");
}

#[test]
fn open_of_garbage_file_is_foreign_and_leaves_it_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("garbage.db");
    let garbage = b"this is definitely not a database, just some bytes........".repeat(100);
    std::fs::write(&p, &garbage).unwrap();
    let e = baton_meta::open(p.to_str().unwrap()).unwrap_err();
    assert!(matches!(e, MetaError::Foreign { .. }), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), garbage);
    std::fs::write(&p, b"").unwrap();
    let e = baton_meta::open(p.to_str().unwrap()).unwrap_err();
    assert!(matches!(e, MetaError::Foreign { .. }), "{e}");
}

#[test]
fn open_of_other_sqlite_database_is_foreign_and_not_converted_to_wal() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("other.db");
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("CREATE TABLE things (x INTEGER);").unwrap();
    drop(c);
    let e = baton_meta::open(p.to_str().unwrap()).unwrap_err();
    assert!(matches!(e, MetaError::Foreign { .. }), "{e}");
    let c = rusqlite::Connection::open(&p).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    // A table named volume without Baton's magic is foreign too.
    c.execute_batch("CREATE TABLE volume (id INTEGER PRIMARY KEY, magic TEXT);")
        .unwrap();
    drop(c);
    let e = baton_meta::open(p.to_str().unwrap()).unwrap_err();
    assert!(matches!(e, MetaError::Foreign { .. }), "{e}");
}

/// Sets a SQLite volume's format version, in both places it is kept.
fn set_format_version(path: &std::path::Path, version: u32) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(&format!(
        "PRAGMA user_version = {version}; UPDATE volume SET format_version = {version};"
    ))
    .unwrap();
}

#[test]
fn open_of_newer_format_version_is_refused() {
    let v = fresh_sqlite();
    let path = v.path();
    drop(v.meta);
    set_format_version(&path, FORMAT_VERSION + 1);
    let e = baton_meta::open(path.to_str().unwrap()).unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::UnsupportedVersion { found, supported }
                if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION
        ),
        "{e}"
    );
}

#[test]
fn a_format_1_volume_opens_and_stays_format_1() {
    let v = fresh_sqlite();
    let path = v.path();
    drop(v.meta);
    set_format_version(&path, 1);
    for _ in 0..2 {
        let meta = baton_meta::open(path.to_str().unwrap()).unwrap();
        assert_eq!(meta.volume().format_version, 1);
    }
}

#[test]
fn reopen_after_close_keeps_everything() {
    let v = fresh();
    let m = v.meta.as_ref();
    let vol = m.volume();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    let mut sl = baton_meta::CreateArgs::new(FileKind::Symlink, 0);
    sl.symlink_target = Some("../elsewhere".into());
    let s = m.create(ROOT_INO, n("s"), &sl, None).unwrap();
    m.setxattr(f.ino, n("user.k"), b"v", Default::default(), None)
        .unwrap();
    let commit = baton_meta::CommitBlocks {
        new_size: Some(5000),
        blocks: vec![
            baton_meta::BlockRef {
                index: 0,
                object_key: "o0".into(),
                len: BS,
                inline: None,
            },
            baton_meta::BlockRef {
                index: 1,
                object_key: "o1".into(),
                len: 904,
                inline: None,
            },
        ],
        ..Default::default()
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    let gone = file(m, ROOT_INO, "gone");
    m.unlink(ROOT_INO, n("gone"), None).unwrap();

    let v = v.reopen();
    let m = v.meta.as_ref();
    assert_eq!(m.volume(), vol);
    assert_eq!(m.lookup(d.ino, n("f")).unwrap().size, 5000);
    assert_eq!(m.readlink(s.ino).unwrap(), "../elsewhere");
    assert_eq!(m.getxattr(f.ino, n("user.k")).unwrap(), b"v");
    assert_eq!(m.blocks(f.ino, 0, 10).unwrap(), commit.blocks);
    assert_eq!(m.orphans().unwrap(), vec![gone.ino]);
    assert_eq!(names(m, ROOT_INO), vec!["d", "s"]);
    // Numbering continues past every number ever used.
    assert!(file(m, ROOT_INO, "new").ino > gone.ino);
}

#[test]
fn statfs_counts_inodes_and_block_bytes() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    dir(m, ROOT_INO, "d");
    let commit = baton_meta::CommitBlocks {
        new_size: Some(BS as u64 + 10),
        blocks: vec![
            baton_meta::BlockRef {
                index: 0,
                object_key: "a".into(),
                len: BS,
                inline: None,
            },
            baton_meta::BlockRef {
                index: 1,
                object_key: "b".into(),
                len: 10,
                inline: None,
            },
        ],
        ..Default::default()
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    let s = m.statfs().unwrap();
    assert_eq!(s.inodes_used, 3);
    assert_eq!(s.bytes_used, BS as u64 + 10);
    assert_eq!(s.block_size_bytes, BS);
}

#[test]
fn warm_up_changes_nothing_on_a_fresh_or_a_used_volume() {
    let v = fresh();
    let m = v.meta.as_ref();
    m.warm_up().unwrap();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    m.setxattr(f.ino, n("user.k"), b"v", XattrFlags::default(), None)
        .unwrap();
    let before = (
        m.getattr(ROOT_INO).unwrap(),
        m.getattr(f.ino).unwrap(),
        m.readdir(ROOT_INO, 0, 100).unwrap(),
    );
    m.warm_up().unwrap();
    let after = (
        m.getattr(ROOT_INO).unwrap(),
        m.getattr(f.ino).unwrap(),
        m.readdir(ROOT_INO, 0, 100).unwrap(),
    );
    assert_eq!(before, after, "warm_up reads only");
    assert_eq!(m.getxattr(f.ino, n("user.k")).unwrap(), b"v");
}
