//! Data survives: a clean unmount and remount, an external umount, and a
//! kill -9 of fsclient with acknowledged writes still only staged (the next
//! mount commits them before serving). Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use common::*;

fn sync_range(f: &File) {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a valid fd; writes back the page cache without FUSE fsync.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, flags) };
    assert_eq!(r, 0, "sync_file_range: {}", errno());
}

#[test]
fn data_survives_unmount_and_remount() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let big = pattern(1_000_003, 1);
    fs::write(m.p("big"), &big).unwrap();
    fs::create_dir_all(m.p("a/b")).unwrap();
    fs::write(m.p("a/b/small"), b"small").unwrap();
    std::os::unix::fs::symlink("b/small", m.p("a/link")).unwrap();
    let f = OpenOptions::new().write(true).open(m.p("big")).unwrap();
    f.set_len(700_000).unwrap();
    f.write_all_at(b"patched", 10).unwrap();
    // Left open and unflushed: SIGTERM must flush it.
    let open_direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("direct"))
        .unwrap();
    open_direct.write_all_at(b"staged at shutdown", 0).unwrap();
    drop(f);
    m.stop();
    assert_eq!(staged_inodes(&vol), 0, "shutdown committed all staged data");
    drop(open_direct);

    let m = vol.mount(&mnt);
    let mut want = big[..700_000].to_vec();
    want[10..17].copy_from_slice(b"patched");
    assert_eq!(fs::read(m.p("big")).unwrap(), want);
    assert_eq!(fs::read(m.p("a/link")).unwrap(), b"small");
    assert_eq!(fs::read(m.p("direct")).unwrap(), b"staged at shutdown");

    // An external (non-lazy) umount ends fsclient cleanly too.
    fs::write(m.p("late"), b"late").unwrap();
    let Mounted {
        mut child,
        guard,
        watchdog,
        ..
    } = m;
    let (ok, _, err) = sh(&format!("umount {}", s(&mnt)));
    assert!(ok, "{err}");
    let status = child
        .wait_timeout(DEADLINE)
        .expect("fsclient exits after umount");
    assert!(status.success(), "{status}");
    drop((guard, watchdog));
    let m = vol.mount(&mnt);
    assert_eq!(fs::read(m.p("late")).unwrap(), b"late");
    m.stop();
}

#[test]
fn acknowledged_writes_survive_kill_9_of_fsclient() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    fs::write(m.p("committed"), pattern(300_000, 2)).unwrap();

    // O_DIRECT: write(2) returns once fsclient acknowledged the WRITE.
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("direct"))
        .unwrap();
    let direct_data = pattern(150_000, 3);
    direct.write_all_at(&direct_data, 0).unwrap();
    // Buffered: written back to fsclient (WRITE requests), never fsynced.
    let buffered = File::create(m.p("buffered")).unwrap();
    buffered.write_all_at(&pattern(90_000, 4), 0).unwrap();
    sync_range(&buffered);
    // A truncation of an open file is staged too (the floor), with a write
    // past it.
    let trunc = OpenOptions::new()
        .write(true)
        .open(m.p("committed"))
        .unwrap();
    trunc.set_len(100_000).unwrap();
    trunc.write_all_at(b"after", 200_000).unwrap();
    sync_range(&trunc);
    // `direct` and `buffered` are still open, so their data cannot have
    // been committed by a flush or release. (`committed` may have been: the
    // RELEASE of the handle `fs::write` closed is asynchronous and can land
    // after the truncation was staged.)
    assert!(
        staged_inodes(&vol) >= 2,
        "the data is staged, not committed"
    );

    m.kill9();
    drop((direct, buffered, trunc)); // closes on a dead connection fail harmlessly
    assert!(staged_inodes(&vol) >= 2, "staging survived the kill");

    let m = vol.mount(&mnt);
    assert_eq!(fs::read(m.p("direct")).unwrap(), direct_data);
    assert_eq!(fs::read(m.p("buffered")).unwrap(), pattern(90_000, 4));
    let back = fs::read(m.p("committed")).unwrap();
    assert_eq!(back.len(), 200_005);
    assert_eq!(&back[..100_000], &pattern(300_000, 2)[..100_000]);
    assert!(
        back[100_000..200_000].iter().all(|b| *b == 0),
        "the floor hid the old bytes"
    );
    assert_eq!(&back[200_000..], b"after");
    assert_eq!(
        staged_inodes(&vol),
        0,
        "recovery committed and cleared staging"
    );
    m.stop();
}

#[test]
fn an_orphan_left_by_a_killed_server_is_reclaimed_at_the_next_mount() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    fs::write(m.p("doomed"), pattern(200_000, 5)).unwrap();
    let ino = fs::metadata(m.p("doomed")).unwrap().ino();
    let held = File::open(m.p("doomed")).unwrap();
    fs::remove_file(m.p("doomed")).unwrap();
    assert!(!object_files(&vol, ino).is_empty(), "open: objects kept");
    m.kill9();
    drop(held);
    let m = vol.mount(&mnt);
    assert_eq!(object_files(&vol, ino), Vec::<std::path::PathBuf>::new());
    m.stop();
}

#[test]
fn a_write_killed_between_its_blocks_and_its_size_record_is_recovered() {
    // Staging writes the blocks of a WRITE, then the size record, then the
    // reply goes out. A kill between the two leaves blocks reaching past
    // the recorded size: those bytes were never acknowledged (the kernel
    // resends the WRITE). The next mount must commit the acknowledged part,
    // not fail on the inconsistency (it once crash-looped on it).
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("grown"))
        .unwrap();
    let first = pattern(100 * 1024, 5);
    direct.write_all_at(&first, 0).unwrap();
    let ino = fs::metadata(m.p("grown")).unwrap().ino();
    let record = vol
        .base
        .join(VOLUME)
        .join("staging")
        .join(format!("{ino:016x}"))
        .join("size");
    let acknowledged = fs::read(&record).unwrap();
    direct
        .write_all_at(&pattern(100 * 1024, 6), 100 * 1024)
        .unwrap();
    m.kill9();
    drop(direct);
    // The second WRITE's blocks are staged; put back the size record as it
    // was before it, as if the process died between the two steps.
    fs::write(&record, &acknowledged).unwrap();

    let m = vol.mount(&mnt);
    assert_eq!(fs::read(m.p("grown")).unwrap(), first);
    assert_eq!(
        staged_inodes(&vol),
        0,
        "recovery committed and cleared staging"
    );
    m.stop();
}

#[test]
fn a_file_larger_than_the_staging_disk_is_written_without_fsync() {
    // Staging on an 8 MiB tmpfs; 24 MiB written with plain writes and no
    // fsync: when staging fills up, fsclient commits what is staged to make
    // room instead of answering ENOSPC.
    let vol = Volume::new();
    let staging = vol.path("staging-tmpfs");
    fs::create_dir(&staging).unwrap();
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs", s(&staging)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _tmpfs = MountGuard::new(&staging);
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount_with(&mnt, &["--staging-dir", s(&staging)]);
    let data = pattern(24 << 20, 9);
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("big"))
        .unwrap();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        direct
            .write_all_at(chunk, (i << 20) as u64)
            .unwrap_or_else(|e| panic!("write of MiB {i} with an 8 MiB staging disk: {e}"));
    }
    drop(direct);
    assert_eq!(fs::read(m.p("big")).unwrap(), data);
    m.stop();
}

/// The staging directory of `path`'s inode exists (it held staged data
/// at some point since its last retirement).
fn has_staging_dir(vol: &Volume, path: &std::path::Path) -> bool {
    let ino = fs::metadata(path).unwrap().ino();
    vol.base
        .join(VOLUME)
        .join("staging")
        .join(format!("{ino:016x}"))
        .exists()
}

/// A WRITE at offset 0 holding a whole small file is committed at once
/// (write-through: nothing staged, as its flush would have committed it);
/// a write that keeps bytes of the file after it, one past the size
/// limit, and one over a pending truncation are staged. Every outcome
/// survives a kill -9 before any close.
#[test]
fn a_small_file_written_whole_is_committed_by_its_write() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    // O_DIRECT: each write(2) is one WRITE, acknowledged before it returns.
    let open = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.p(name))
            .unwrap()
    };
    let whole = open("whole");
    whole.write_all_at(b"abc", 0).unwrap();
    assert!(
        !has_staging_dir(&vol, &m.p("whole")),
        "a whole small file was staged"
    );
    let rewritten = open("rewritten");
    rewritten.write_all_at(b"abcdef", 0).unwrap();
    rewritten.write_all_at(b"XY", 0).unwrap();
    assert!(
        has_staging_dir(&vol, &m.p("rewritten")),
        "a write keeping the file's tail went around staging"
    );
    let large_data = pattern(100_000, 7);
    let large = open("large");
    large.write_all_at(&large_data, 0).unwrap();
    assert!(has_staging_dir(&vol, &m.p("large")));
    let truncated = open("truncated");
    truncated.write_all_at(b"0123456789", 0).unwrap();
    truncated.set_len(20).unwrap();
    truncated.write_all_at(b"abc", 0).unwrap();

    m.kill9();
    drop((whole, rewritten, large, truncated));
    let m = vol.mount(&mnt);
    assert_eq!(fs::read(m.p("whole")).unwrap(), b"abc");
    assert_eq!(fs::read(m.p("rewritten")).unwrap(), b"XYcdef");
    assert_eq!(fs::read(m.p("large")).unwrap(), large_data);
    let mut want = b"abc3456789".to_vec();
    want.resize(20, 0);
    assert_eq!(fs::read(m.p("truncated")).unwrap(), want);
    m.stop();
}

/// During an object store outage a whole small file's WRITE tries to
/// upload once, then is staged (a file small enough to be inline is
/// committed without the store); after that failure the next ones are
/// staged without waiting for the store (which would take its retries'
/// time each). Everything is committed once the store is back.
#[test]
fn small_files_written_during_a_storage_outage_are_staged_and_kept() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let outage = vol.path("outage");
    // Every store operation takes 200 ms; while `outage` exists it then
    // fails (and is retried). The mount probes the store: up at first.
    let fault = format!("delay_ms=200,unreachable_file={}", s(&outage));
    let m = vol.mount_with_env(&mnt, &[], &[("BATON_STORAGE_FAULT", &fault)]);
    fs::write(&outage, b"").unwrap();
    let write = |name: &str, data: &[u8]| {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.p(name))
            .unwrap();
        let start = std::time::Instant::now();
        f.write_all_at(data, 0).unwrap();
        (f, start.elapsed())
    };
    // Past the inline limit (16 KiB), within write-through's (64 KiB).
    let (one, two) = (pattern(20_000, 1), pattern(20_000, 2));
    let (first, tried) = write("first", &one);
    assert!(has_staging_dir(&vol, &m.p("first")), "not staged");
    let (second, skipped) = write("second", &two);
    assert!(has_staging_dir(&vol, &m.p("second")), "not staged");
    assert!(
        skipped * 2 < tried,
        "the second write waited for the store again: {skipped:?} (the first, which tried, {tried:?})"
    );
    // A file small enough to be inline needs no store at all.
    let (tiny, inline_took) = write("tiny", b"tiny");
    assert!(
        !has_staging_dir(&vol, &m.p("tiny")),
        "an inline file was staged"
    );
    assert!(
        inline_took * 2 < tried,
        "an inline file's write waited for the store: {inline_took:?}"
    );
    fs::remove_file(&outage).unwrap();
    drop((first, second, tiny));
    m.stop();
    let m = vol.mount(&mnt);
    assert!(fs::read(m.p("first")).unwrap() == one);
    assert!(fs::read(m.p("second")).unwrap() == two);
    assert_eq!(fs::read(m.p("tiny")).unwrap(), b"tiny");
    assert_eq!(staged_inodes(&vol), 0);
    m.stop();
}
