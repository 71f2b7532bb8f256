//! fallocate(2) on a mounted Baton volume, every mode: punching holes over
//! more block rows than one commit takes, KEEP_SIZE alone, ZERO_RANGE with
//! and without KEEP_SIZE, and util-linux `fallocate` run step by step on
//! the mount and on a local filesystem with the results compared.
//! COLLAPSE_RANGE and INSERT_RANGE are EOPNOTSUPP on Baton (README, POSIX
//! gaps). Each test mounts its own volume with the real `fsclient` binary.
//! Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use baton_blocks::ObjectKey;
use baton_meta::limits::COMMIT_BLOCKS_ROWS_MAX;
use baton_meta::{BlockRef, CommitBlocks};
use common::*;

const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;

fn read_all(f: &File) -> Vec<u8> {
    let mut back = vec![0u8; f.metadata().unwrap().len() as usize];
    f.read_exact_at(&mut back, 0).unwrap();
    back
}

/// Asserts `back` is `want` with `lo..hi` zeroed (bounded by both lengths).
fn assert_zeroed(back: &[u8], want: &[u8], lo: usize, hi: usize) {
    assert_eq!(back.len(), want.len(), "size");
    let hi = hi.min(want.len());
    assert!(back[..lo] == want[..lo], "data before the range changed");
    assert!(
        back[lo..hi].iter().all(|b| *b == 0),
        "the range does not read as zeros"
    );
    assert!(back[hi..] == want[hi..], "data after the range changed");
}

/// Adds rows `indices` to the block map of `ino` with the volume unmounted,
/// a commit per `COMMIT_BLOCKS_ROWS_MAX`, naming objects that were never
/// stored (`key` gives the volume's key layout). Writing 65,536 blocks
/// through the mount takes minutes in a debug build; these rows are only
/// ever punched, never read.
fn add_unstored_rows(vol: &Volume, ino: u64, indices: std::ops::Range<u64>, len: u32) {
    let meta = baton_meta::open(s(&vol.meta_path())).unwrap();
    let first = meta.blocks(ino, 0, 1).unwrap();
    let layout = ObjectKey::parse(&first[0].object_key).unwrap().layout();
    let indices: Vec<u64> = indices.collect();
    for chunk in indices.chunks(COMMIT_BLOCKS_ROWS_MAX) {
        let commit = CommitBlocks {
            new_size: None,
            mtime: None,
            ctime: None,
            blocks: chunk
                .iter()
                .map(|i| BlockRef {
                    index: *i,
                    object_key: ObjectKey::generate(ino, *i, layout).to_string(),
                    len,
                    inline: None,
                })
                .collect(),
            punched: Vec::new(),
        };
        meta.commit_blocks(ino, &commit, None).unwrap();
    }
}

#[test]
fn punch_hole_over_more_rows_than_one_commit_takes() {
    // 512-byte blocks; real data in the edge blocks of the punch and
    // around it, unstored rows between.
    let bs = 512usize;
    let vol = Volume::with_block_size(bs as u32);
    let blocks = COMMIT_BLOCKS_ROWS_MAX + 200;
    let (head, tail) = (101, blocks - 51);
    let data = pattern(blocks * bs, 9);
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = open_rw(&m.p("big"));
    f.write_all_at(&data[..head * bs], 0).unwrap();
    f.write_all_at(&data[tail * bs..], (tail * bs) as u64)
        .unwrap();
    f.sync_all().unwrap();
    let ino = f.metadata().unwrap().ino();
    drop(f);
    m.stop();
    add_unstored_rows(&vol, ino, head as u64..tail as u64, bs as u32);

    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = open_rw(&m.p("big"));
    let before = f.metadata().unwrap().blocks();
    // Partial edges, and more whole rows than a commit takes between them.
    let (lo, hi) = ((head - 1) * bs + 7, (tail + 1) * bs + 300);
    assert!((hi / bs - lo.div_ceil(bs)) > COMMIT_BLOCKS_ROWS_MAX);
    fallocate(&f, PUNCH, lo as u64, (hi - lo) as u64).unwrap();
    let meta = f.metadata().unwrap();
    assert_eq!(meta.len(), data.len() as u64, "a punch keeps the size");
    assert!(meta.blocks() < before / 10, "the punched rows are freed");
    assert_zeroed(&read_all(&f), &data, lo, hi);
    drop(f);
    m.stop();
    // Committed: a new mount reads the same.
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = open_rw(&m.p("big"));
    assert_zeroed(&read_all(&f), &data, lo, hi);
    drop(f);
    m.stop();
}

#[test]
fn keep_size_alone_succeeds_and_changes_nothing() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let data = pattern(100_000, 3);
    let f = open_rw(&m.p("k"));
    f.write_all_at(&data, 0).unwrap();
    fallocate(&f, KEEP_SIZE, 0, 10).unwrap();
    fallocate(&f, KEEP_SIZE, 50_000, 1 << 20).unwrap();
    fallocate(&f, KEEP_SIZE, 1 << 30, 1 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    assert_eq!(read_all(&f), data);
    assert_eq!(
        fallocate(&f, KEEP_SIZE, i64::MAX as u64 - 10, 100),
        Err(libc::EFBIG)
    );
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("k")).unwrap(), data);
    m.stop();
}

#[test]
fn zero_range_reads_zeros_and_grows_only_without_keep_size() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let bs = BLOCK_SIZE as usize;
    let mut want = pattern(4 * bs + 1000, 4);
    let f = open_rw(&m.p("z"));
    f.write_all_at(&want, 0).unwrap();
    f.sync_all().unwrap();
    // Within one block, then over whole blocks with partial edges; staged
    // (unsynced) data in the range is zeroed too.
    fallocate(&f, ZERO, 10, 20).unwrap();
    assert_zeroed(&read_all(&f), &want, 10, 30);
    want[10..30].fill(0);
    f.write_all_at(&pattern(bs, 5), bs as u64).unwrap();
    want[bs..2 * bs].copy_from_slice(&pattern(bs, 5));
    fallocate(&f, ZERO | KEEP_SIZE, 1000, 3 * bs as u64).unwrap();
    assert_zeroed(&read_all(&f), &want, 1000, 1000 + 3 * bs);
    want[1000..1000 + 3 * bs].fill(0);
    // Past the size with KEEP_SIZE: zeros to the end, the size stays.
    fallocate(&f, ZERO | KEEP_SIZE, 4 * bs as u64, 1 << 20).unwrap();
    assert_zeroed(&read_all(&f), &want, 4 * bs, usize::MAX);
    want[4 * bs..].fill(0);
    // Past the size without: the file grows to the range's end.
    let end = 5 * bs + 77;
    fallocate(&f, ZERO, 3 * bs as u64 + 5, (end - 3 * bs - 5) as u64).unwrap();
    want.resize(end, 0);
    want[3 * bs + 5..].fill(0);
    assert_eq!(f.metadata().unwrap().len(), end as u64);
    assert_eq!(read_all(&f), want);
    // A range inside the size never shrinks it.
    fallocate(&f, ZERO, 0, 10).unwrap();
    want[..10].fill(0);
    assert_eq!(read_all(&f), want);
    f.sync_all().unwrap();
    drop(f);
    m.stop();
    let m = vol.mount(&vol.mountpoint("mnt"));
    assert_eq!(fs::read(m.p("z")).unwrap(), want);
    m.stop();
}

/// Runs `fallocate ARGS FILE` in `dir`: Ok, or Err(stderr).
fn fallocate_cli(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("fallocate")
        .args(args)
        .arg("f")
        .current_dir(dir)
        .output()
        .expect("util-linux fallocate");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn fallocate_cli_matches_a_local_filesystem() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // The reference: a directory under cargo's target dir, on the
    // project's disk (ext4 or xfs, which take every mode; a /tmp on tmpfs
    // would refuse ZERO_RANGE and COLLAPSE_RANGE).
    let reference_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let reference = reference_dir.path().to_path_buf();
    let data = pattern(300_000, 6);
    for dir in [&reference, &m.mnt] {
        fs::write(dir.join("f"), &data).unwrap();
    }
    let steps: &[&[&str]] = &[
        &["-l", "400000"],
        &["-n", "-o", "350000", "-l", "200000"],
        &["-p", "-o", "10000", "-l", "150000"],
        &["-z", "-o", "200000", "-l", "100000"],
        &["-z", "-n", "-o", "380000", "-l", "100000"],
        &["-z", "-o", "390000", "-l", "100000"],
        &["-o", "0", "-l", "100"],
        &["-n", "-o", "0", "-l", "1000000"],
        &["-p", "-o", "0", "-l", "1000000"],
        &["-o", "1000", "-l", "600000"],
    ];
    for step in steps {
        let local = fallocate_cli(&reference, step);
        assert_eq!(local, Ok(()), "reference fallocate {step:?}");
        assert_eq!(fallocate_cli(&m.mnt, step), Ok(()), "fallocate {step:?}");
        let (want, got) = (reference.join("f"), m.p("f"));
        let size = fs::metadata(&want).unwrap().len();
        assert_eq!(
            fs::metadata(&got).unwrap().len(),
            size,
            "size after {step:?}"
        );
        assert!(
            fs::read(&want).unwrap() == fs::read(&got).unwrap(),
            "contents differ after {step:?}"
        );
    }
    // Documented gaps: the reference shifts the data, Baton refuses and
    // leaves the file as it was.
    let before = fs::read(m.p("f")).unwrap();
    for step in [
        &["-c", "-o", "65536", "-l", "65536"],
        &["-i", "-o", "65536", "-l", "65536"],
    ] {
        assert_eq!(
            fallocate_cli(&reference, step),
            Ok(()),
            "reference {step:?}"
        );
        let err = fallocate_cli(&m.mnt, step).expect_err("Baton refuses it");
        assert!(err.contains("Operation not supported"), "{step:?}: {err}");
        assert!(
            fs::read(m.p("f")).unwrap() == before,
            "{step:?} changed the file"
        );
    }
    m.stop();
}

/// The volume's metadata, opened beside the mount (as `fsctl quota` does).
fn meta(vol: &Volume) -> Box<dyn baton_meta::MetaStore> {
    baton_meta::open(s(&vol.meta_path())).unwrap()
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn zero_range_reserves_its_holes_in_the_quota_and_in_df() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    let q_ino = fs::metadata(&q).unwrap().ino();
    meta(&vol).set_quota(q_ino, Some(16 * MIB), None).unwrap();
    let quota_used = || meta(&vol).quota(q_ino).unwrap().unwrap().used.bytes;
    let base = df_used_bytes(&m.mnt);
    let reserved_or_written = || df_used_bytes(&m.mnt) - base;

    let f = open_direct(&q.join("z"));
    let chunk = vec![3u8; MIB as usize];
    for i in 0..4 {
        f.write_all_at(&chunk, i * MIB).unwrap();
    }
    f.sync_all().unwrap();
    assert_eq!(reserved_or_written(), 4 * MIB);
    // Over the data and 4 MiB past it: zeros, the size grows, and every
    // block of the range is reserved (the punched ones too).
    fallocate(&f, ZERO, 0, 8 * MIB).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 8 * MIB);
    assert!(read_all(&f).iter().all(|b| *b == 0));
    assert_eq!(reserved_or_written(), 8 * MIB, "df shows the reservation");
    // KEEP_SIZE past the end: reserved, and counted by the quota.
    fallocate(&f, ZERO | KEEP_SIZE, 8 * MIB, 6 * MIB).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 8 * MIB);
    assert_eq!(reserved_or_written(), 14 * MIB);
    assert_eq!(quota_used(), 14 * MIB);
    assert_eq!(df_used_bytes(&q), 14 * MIB, "df on the quota shows it");

    // 3 MiB elsewhere do not fit in the 2 MiB left...
    let other = open_direct(&q.join("other"));
    let refused = (0..3).try_for_each(|i| other.write_all_at(&chunk, i * MIB));
    let refused = refused.expect_err("past the quota").raw_os_error();
    assert_eq!(refused, Some(libc::EDQUOT));
    drop(other);
    fs::remove_file(q.join("other")).unwrap();
    assert!(wait_until(DEADLINE, || quota_used() == 14 * MIB));
    // ...and writes into the zeroed range are never refused; the blocks
    // count instead of the reservations.
    for i in 0..14 {
        f.write_all_at(&chunk, i * MIB).unwrap();
    }
    f.sync_all().unwrap();
    assert_eq!(f.metadata().unwrap().len(), 14 * MIB);
    assert_eq!(quota_used(), 14 * MIB);
    assert_eq!(reserved_or_written(), 14 * MIB);
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    drop(f);
    m.stop();
}

/// Runs `f` and prints how long it took under `what`; returns the time.
fn timed(what: &str, f: impl FnOnce()) -> std::time::Duration {
    let started = std::time::Instant::now();
    f();
    let took = started.elapsed();
    eprintln!("{what}: {took:?}");
    took
}

#[test]
fn a_reservation_of_any_length_is_made_and_released_in_well_under_a_second() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let base = df_used_bytes(&m.mnt);
    let reserved = || df_used_bytes(&m.mnt) - base;
    let f = open_rw(&m.p("big"));
    // 64 GiB KEEP_SIZE: 2^20 blocks of 64 KiB.
    let took = timed("fallocate -n 64 GiB", || {
        fallocate(&f, KEEP_SIZE, 0, 64 * GIB).unwrap()
    });
    assert!(took.as_millis() < 500, "took {took:?}");
    assert_eq!(f.metadata().unwrap().len(), 0);
    assert_eq!(reserved(), 64 * GIB, "df shows the reservation");
    // A punch releases what it covers, a truncate below it what is past
    // the new size (committed with the size, at fsync).
    let took = timed("punch 16 GiB of it", || {
        fallocate(&f, PUNCH, 0, 16 * GIB).unwrap()
    });
    assert!(took.as_millis() < 500, "took {took:?}");
    assert_eq!(reserved(), 48 * GIB);
    f.set_len(32 * GIB).unwrap();
    f.sync_all().unwrap();
    assert_eq!(reserved(), 48 * GIB, "a growth releases nothing");
    let took = timed("truncate below it", || {
        f.set_len(24 * GIB).unwrap();
        f.sync_all().unwrap();
    });
    assert!(took.as_millis() < 500, "took {took:?}");
    assert_eq!(reserved(), 8 * GIB);
    drop(f);
    // util-linux, as a user types it: 100 GiB is 1.6 million blocks.
    let took = timed("fallocate -l 100G", || {
        assert_eq!(fallocate_cli(&m.mnt, &["-l", "100G"]), Ok(()));
    });
    assert!(took.as_millis() < 1000, "took {took:?}");
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 100 * GIB);
    assert_eq!(reserved(), 108 * GIB);
    // An unlink releases the rest once the file is reclaimed.
    fs::remove_file(m.p("f")).unwrap();
    fs::remove_file(m.p("big")).unwrap();
    assert!(wait_until(DEADLINE, || reserved() == 0));
    m.stop();
}
