//! Inline blocks: a file of at most 16 KiB keeps its bytes in its
//! block-map row, with no object in the store; a file that grows past that
//! gets an object, and one rewritten small goes back inline. Needs root and
//! /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};

use common::*;

/// The inline limit of a volume made by this build (`fsclient::fs::inline`).
const INLINE_MAX: usize = 16 << 10;

fn ino(m: &Mounted, name: &str) -> u64 {
    fs::metadata(m.p(name)).unwrap().ino()
}

/// Rows of the volume's block map that hold their bytes, read from the
/// SQLite file (the mount may be running: WAL readers see committed rows,
/// so a running mount's are synced first).
fn inline_rows(vol: &Volume) -> u64 {
    let db = rusqlite::Connection::open(vol.meta_path()).unwrap();
    db.query_row(
        "SELECT COUNT(*) FROM blocks WHERE inline_data IS NOT NULL",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn small_files_live_in_the_metadata_and_grow_into_objects() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let sizes = [
        ("tiny", 1),
        ("page", 4096),
        ("limit", INLINE_MAX),
        ("over", INLINE_MAX + 1),
        ("two_blocks", BLOCK_SIZE as usize + 5_000),
    ];
    for (seed, (name, len)) in sizes.iter().enumerate() {
        fs::write(m.p(name), pattern(*len, seed as u64)).unwrap();
    }
    // Written in three appends, each closed: committed by flushes.
    for part in 0..3u64 {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(m.p("appended"))
            .unwrap();
        f.write_all(&pattern(1_000, 10 + part)).unwrap();
    }
    let objects = |name: &str| object_files(&vol, ino(&m, name)).len();
    assert_eq!(objects("tiny"), 0, "a 1-byte file has an object");
    assert_eq!(objects("page"), 0);
    assert_eq!(objects("limit"), 0, "a file at the limit has an object");
    assert_eq!(objects("appended"), 0, "an appended small file");
    assert_eq!(objects("over"), 1, "a file past the limit is inline");
    assert_eq!(objects("two_blocks"), 2);
    m.sync_metadata();
    assert_eq!(inline_rows(&vol), 4);

    // Growing past the limit makes an object; rewriting small drops it.
    let tail = pattern(50_000, 20);
    OpenOptions::new()
        .append(true)
        .open(m.p("tiny"))
        .unwrap()
        .write_all(&tail)
        .unwrap();
    fs::write(m.p("over"), b"short again").unwrap();
    assert_eq!(objects("tiny"), 1, "grown past the limit");
    assert_eq!(objects("over"), 0, "rewritten small");
    let over_ino = ino(&m, "over");
    m.stop();

    let m = vol.mount(&mnt);
    for (seed, (name, len)) in sizes.iter().enumerate() {
        let want = match *name {
            "tiny" => [pattern(1, 0), tail.clone()].concat(),
            "over" => b"short again".to_vec(),
            _ => pattern(*len, seed as u64),
        };
        assert!(fs::read(m.p(name)).unwrap() == want, "{name} differs");
    }
    let appended: Vec<u8> = (0..3).flat_map(|p| pattern(1_000, 10 + p)).collect();
    assert!(fs::read(m.p("appended")).unwrap() == appended);
    // An inline file is read at any offset, and a hole past its end.
    let f = fs::File::open(m.p("page")).unwrap();
    let mut buf = [0u8; 100];
    assert_eq!(f.read_at(&mut buf, 4000).unwrap(), 96);
    assert_eq!(&buf[..96], &pattern(4096, 1)[4000..]);
    OpenOptions::new()
        .write(true)
        .open(m.p("page"))
        .unwrap()
        .set_len(10_000)
        .unwrap();
    let mut grown = pattern(4096, 1);
    grown.resize(10_000, 0);
    assert!(
        fs::read(m.p("page")).unwrap() == grown,
        "zeros past the bytes"
    );
    fs::remove_file(m.p("over")).unwrap();
    m.stop();
    assert!(object_files(&vol, over_ino).is_empty());
}

/// A small file written with O_DIRECT is committed by its WRITE, inline;
/// one partly overwritten in place is staged over its inline bytes. Both
/// survive a kill -9 of the server before any close.
#[test]
fn inline_bytes_survive_a_kill_9_and_are_the_base_of_later_writes() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    // O_DIRECT: each write(2) is one WRITE, acknowledged before it returns.
    let whole = open_direct(&m.p("whole"));
    whole.write_all_at(b"whole file", 0).unwrap();
    fs::write(m.p("patched"), pattern(8_000, 3)).unwrap();
    let patched = open_direct(&m.p("patched"));
    // FUSE takes O_DIRECT writes at any alignment: one WRITE each.
    patched.write_all_at(&[b'P'; 4096], 4096).unwrap();
    m.kill9();
    drop((whole, patched));
    let m = vol.mount(&mnt);
    assert_eq!(fs::read(m.p("whole")).unwrap(), b"whole file");
    let mut want = pattern(8_000, 3);
    want.resize(8192, 0);
    want[4096..].fill(b'P');
    assert!(fs::read(m.p("patched")).unwrap() == want);
    m.stop();
}

/// A volume made by an older build (format 2) never gets inline blocks:
/// that build would read their keys as objects'.
#[test]
fn a_format_2_volume_keeps_small_files_as_objects() {
    let vol = Volume::new();
    let db = rusqlite::Connection::open(vol.meta_path()).unwrap();
    db.execute_batch("PRAGMA user_version = 2; UPDATE volume SET format_version = 2;")
        .unwrap();
    drop(db);
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("small"), b"abc").unwrap();
    assert_eq!(object_files(&vol, ino(&m, "small")).len(), 1);
    assert_eq!(inline_rows(&vol), 0);
    m.stop();
}
