//! Directory quotas on a mounted volume: EDQUOT exactly at the byte and
//! inode limits for every call that adds usage, renames and hard links in
//! and out, df under a quota directory and on a bind mount of it, a limit
//! set while mounted, and usage after kill -9 between a write and its
//! commit. Each test mounts its own volume with the real `fsclient`
//! binary; limits are set through the metadata while it is mounted, as
//! `fsctl quota set` does. Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use baton_meta::{MetaStore, QuotaUsage};
use common::*;

const MIB: u64 = 1 << 20;

fn meta(vol: &Volume) -> Box<dyn MetaStore> {
    baton_meta::open(s(&vol.meta_path())).unwrap()
}

/// `fsctl quota set` on the mounted volume: by the directory's inode.
fn set_quota(vol: &Volume, dir: &std::path::Path, bytes: Option<u64>, inodes: Option<u64>) {
    let ino = fs::metadata(dir).unwrap().ino();
    meta(vol).set_quota(ino, bytes, inodes).unwrap();
}

fn usage(vol: &Volume, dir: &std::path::Path) -> QuotaUsage {
    let ino = fs::metadata(dir).unwrap().ino();
    meta(vol).quota(ino).unwrap().unwrap().used
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("the call must fail").raw_os_error().unwrap()
}

#[test]
fn bytes_limit_refuses_the_first_byte_past_it_and_keeps_what_fits() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    set_quota(&vol, &q, Some(MIB), None);

    // O_DIRECT: each write(2) is a WRITE, so the error reaches it.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(q.join("a"))
        .unwrap();
    let block = vec![7u8; 4096];
    for i in 0..(MIB / 4096) {
        f.write_all_at(&block, i * 4096).unwrap();
    }
    assert_eq!(errno_of(f.write_all_at(&block, MIB)), libc::EDQUOT);
    f.sync_all().unwrap();
    assert_eq!(errno_of(f.set_len(MIB + 1)), libc::EDQUOT);
    assert_eq!(errno_of(nix_fallocate(&f, 0, 0, MIB + 4096)), libc::EDQUOT);
    // ZERO_RANGE grows like mode 0; with KEEP_SIZE it reserves past the
    // end like KEEP_SIZE (refused here too, nothing zeroed); within the
    // size it adds nothing.
    let zero = libc::FALLOC_FL_ZERO_RANGE;
    assert_eq!(
        errno_of(nix_fallocate(&f, zero, MIB - 4096, 8192)),
        libc::EDQUOT
    );
    let keep = zero | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        errno_of(nix_fallocate(&f, keep, MIB - 4096, 8192)),
        libc::EDQUOT
    );
    nix_fallocate(&f, keep, MIB - 8192, 8192).unwrap();
    f.write_all_at(&block, MIB - 4096).unwrap();
    drop(f);
    assert_eq!(fs::metadata(q.join("a")).unwrap().len(), MIB);
    assert_eq!(usage(&vol, &q).bytes, MIB);

    // Shrinking frees room; the same bytes fit again.
    let f = OpenOptions::new().write(true).open(q.join("a")).unwrap();
    f.set_len(MIB - 4096).unwrap();
    f.set_len(MIB).unwrap();
    drop(f);

    // Through the page cache (the writeback cache of a SQLite volume):
    // write(2) may succeed into the cache, then fsync reports the refusal,
    // and nothing past the limit is stored.
    let mut g = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(q.join("buffered"))
        .unwrap();
    let refused = g.write_all(&block).and_then(|()| g.sync_all());
    assert_eq!(errno_of(refused), libc::EDQUOT);
    drop(g);
    m.stop();
    let m = vol.mount(&vol.mountpoint("mnt"));
    assert_eq!(fs::metadata(m.p("q/buffered")).unwrap().len(), 0);
    assert_eq!(usage(&vol, &m.p("q")).bytes, MIB);
    // A deleted file's bytes are free for the very next write.
    fs::remove_file(m.p("q/a")).unwrap();
    let b = OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("q/b"))
        .unwrap();
    b.write_all_at(&block, 0).unwrap();
    drop(b);
    m.stop();
}

fn nix_fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd; plain syscall.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn inode_limit_refuses_every_call_that_adds_one_and_renames_move_usage() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    fs::write(m.p("outside"), b"12345").unwrap();
    set_quota(&vol, &q, None, Some(3));
    fs::write(q.join("one"), b"1").unwrap();
    fs::create_dir(q.join("two")).unwrap();
    std::os::unix::fs::symlink("target", q.join("three")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 7,
            inodes: 3
        }
    );

    assert_eq!(errno_of(fs::write(q.join("four"), b"")), libc::EDQUOT);
    assert_eq!(errno_of(fs::create_dir(q.join("four"))), libc::EDQUOT);
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("t", q.join("four"))),
        libc::EDQUOT
    );
    assert_eq!(
        errno_of(fs::hard_link(m.p("outside"), q.join("four"))),
        libc::EDQUOT
    );
    assert_eq!(
        errno_of(fs::rename(m.p("outside"), q.join("four"))),
        libc::EDQUOT
    );
    // Nothing of the refused calls was applied.
    assert!(fs::symlink_metadata(q.join("four")).is_err());
    assert_eq!(fs::read(m.p("outside")).unwrap(), b"12345");
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 7,
            inodes: 3
        }
    );
    // An unlinked file counts until reclaimed, a few ms later; a full
    // quota does not make the next create wait for that.
    fs::remove_file(q.join("one")).unwrap();
    fs::write(q.join("one"), b"1").unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 7,
            inodes: 3
        }
    );

    // A rename out frees its usage, a rename in takes it.
    fs::rename(q.join("one"), m.p("one")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 6,
            inodes: 2
        }
    );
    fs::rename(m.p("outside"), q.join("in")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 11,
            inodes: 3
        }
    );
    // Within the quota a rename changes nothing.
    fs::rename(q.join("in"), q.join("two/in")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 11,
            inodes: 3
        }
    );
    // A hard link inside the quota is counted once; one that leaves the
    // quota only when its last name there goes.
    fs::remove_file(q.join("three")).unwrap();
    let reclaimed = QuotaUsage {
        bytes: 5,
        inodes: 2,
    };
    assert!(wait_until(DEADLINE, || usage(&vol, &q) == reclaimed));
    fs::hard_link(q.join("two/in"), q.join("again")).unwrap();
    assert_eq!(usage(&vol, &q), reclaimed);
    fs::hard_link(q.join("again"), m.p("outer-name")).unwrap();
    fs::remove_file(q.join("again")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 5,
            inodes: 2
        }
    );
    fs::remove_file(q.join("two/in")).unwrap();
    // Its last name in the quota went (it lives on outside): at once.
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 0,
            inodes: 1
        }
    );
    assert_eq!(fs::read(m.p("outer-name")).unwrap(), b"12345");
    // A directory moved in brings its tree.
    fs::create_dir_all(m.p("tree/sub")).unwrap();
    fs::write(m.p("tree/sub/f"), b"xy").unwrap();
    assert_eq!(
        errno_of(fs::rename(m.p("tree"), q.join("tree"))),
        libc::EDQUOT
    );
    set_quota(&vol, &q, None, Some(4));
    fs::rename(m.p("tree"), q.join("tree")).unwrap();
    assert_eq!(
        usage(&vol, &q),
        QuotaUsage {
            bytes: 2,
            inodes: 4
        }
    );
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    m.stop();
}

#[test]
fn df_under_a_quota_directory_and_on_a_bind_mount_shows_the_quota() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("pvc");
    fs::create_dir(&q).unwrap();
    fs::write(m.p("big-outside"), vec![1u8; 300_000]).unwrap();
    // No quota yet: the volume's figures. Its store is a local directory,
    // so what is available is what that disk has (not a made-up 1 PiB).
    let disk_available = || {
        let st = nix::sys::statvfs::statvfs(vol.data.as_path()).unwrap();
        st.blocks_available() * st.fragment_size()
    };
    let st = nix::sys::statvfs::statvfs(&q).unwrap();
    let available = st.blocks_available() * st.fragment_size();
    assert!(
        available.abs_diff(disk_available()) < 64 * MIB,
        "df's available {available} is not the store disk's {}",
        disk_available()
    );
    assert!(st.blocks() * st.fragment_size() < 1 << 50, "no quota yet");
    // Set while mounted: the next statfs shows it.
    set_quota(&vol, &q, Some(10 * MIB), Some(1000));
    fs::write(q.join("f"), vec![2u8; 100_000]).unwrap();
    let bind = vol.mountpoint("bind");
    let (ok, _, err) = sh(&format!("mount --bind {} {}", s(&q), s(&bind)));
    assert!(ok, "bind mount: {err}");
    let _bind_guard = MountGuard::new(&bind);
    for path in [&q, &q.join("f"), &bind] {
        let st = nix::sys::statvfs::statvfs(path.as_path()).unwrap();
        assert_eq!(st.blocks() * st.fragment_size(), 10 * MIB, "{path:?}");
        let used = (st.blocks() - st.blocks_free()) * st.fragment_size();
        assert_eq!(used, 100_000u64.div_ceil(4096) * 4096, "{path:?}");
        assert_eq!(st.files(), 1000);
        assert_eq!(st.files() - st.files_free(), 1);
    }
    let (ok, out, _) = sh(&format!("df -B1 --output=size {}", s(&bind)));
    assert!(ok);
    assert_eq!(out.lines().nth(1).map(str::trim), Some("10485760"));
    // A changed limit is seen by the next statfs.
    set_quota(&vol, &q, Some(20 * MIB), Some(1000));
    let st = nix::sys::statvfs::statvfs(&bind).unwrap();
    assert_eq!(st.blocks() * st.fragment_size(), 20 * MIB);
    // The volume's own figures: real usage, and as size that usage plus
    // what the store's disk has available.
    let st = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    let used = (st.blocks() - st.blocks_free()) * st.fragment_size();
    assert!(used >= 400_000, "volume used {used}");
    let size = st.blocks() * st.fragment_size();
    assert!(
        size.abs_diff(used + disk_available()) < 64 * MIB,
        "size {size} is not used {used} + available {}",
        disk_available()
    );
    assert_eq!(st.files() - st.files_free(), 4, "root, pvc, f, big-outside");
    drop(_bind_guard);
    m.stop();
}

#[test]
fn usage_is_right_after_kill_9_between_a_write_and_its_commit() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    fs::create_dir(m.p("q")).unwrap();
    set_quota(&vol, &m.p("q"), Some(MIB), None);
    m.stop();
    // Written (staged and acknowledged), not committed: no flush, fsync or
    // close before the kill.
    let m = vol.mount(&mnt);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("q/f"))
        .unwrap();
    f.write_all_at(&vec![3u8; 200_000], 0).unwrap();
    assert_eq!(usage(&vol, &m.p("q")).bytes, 0, "not committed yet");
    let q_path = m.p("q");
    let q_ino = fs::metadata(&q_path).unwrap().ino();
    m.kill9();
    drop(f);
    // A fresh mount commits what the dead one staged, and counts it in
    // that commit.
    let m = vol.mount(&mnt);
    assert_eq!(fs::metadata(m.p("q/f")).unwrap().len(), 200_000);
    let used = meta(&vol).quota(q_ino).unwrap().unwrap().used;
    assert_eq!(
        used,
        QuotaUsage {
            bytes: 200_000,
            inodes: 1
        }
    );
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    m.stop();
}

/// A PostgreSQL database for one test, dropped at the end (`psql`).
struct PgDatabase {
    admin: String,
    name: String,
    url: String,
}

impl PgDatabase {
    /// `None` (the test skips, loudly) without a server, unless
    /// BATON_REQUIRE_POSTGRES=1.
    fn create() -> Option<PgDatabase> {
        let Ok(admin) = std::env::var("BATON_TEST_POSTGRES_URL") else {
            assert!(
                std::env::var("BATON_REQUIRE_POSTGRES").is_err(),
                "BATON_REQUIRE_POSTGRES is set but BATON_TEST_POSTGRES_URL is not"
            );
            eprintln!("skipped: no PostgreSQL (set BATON_TEST_POSTGRES_URL)");
            return None;
        };
        let name = format!("baton_quota_{}", std::process::id());
        let (ok, _, err) = sh(&format!("psql -q '{admin}' -c 'CREATE DATABASE {name}'"));
        assert!(ok, "create database: {err}");
        let (base, _) = admin.rsplit_once('/').unwrap();
        Some(PgDatabase {
            url: format!("{base}/{name}"),
            admin,
            name,
        })
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let _ = sh(&format!(
            "psql -q '{}' -c 'DROP DATABASE IF EXISTS {} WITH (FORCE)'",
            self.admin, self.name
        ));
    }
}

/// Two mounts of one PostgreSQL volume (two base directories: two
/// hosts as far as the volume is concerned) race into one quota: the
/// inode limit holds exactly, the byte limit is passed by at most what
/// the other mount had accepted and not committed (one write here, each
/// followed by fsync).
#[test]
fn two_mounts_of_a_postgres_volume_racing_into_one_quota() {
    let Some(db) = PgDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fs::create_dir_all(&data).unwrap();
    let config = baton_meta::VolumeConfig {
        name: "shared".into(),
        storage_url: format!("file://{}", data.display()),
        block_size_bytes: BLOCK_SIZE,
    };
    drop(baton_meta::format(&db.url, &config).unwrap());
    let mount = |host: &str| {
        let base = dir.path().join(host);
        let mnt = dir.path().join(format!("mnt-{host}"));
        fs::create_dir_all(&base).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        let mut child = ChildGuard(
            std::process::Command::new(env!("CARGO_BIN_EXE_fsclient"))
                .args(["mount", &db.url, s(&mnt), "--base-dir", s(&base)])
                .env("RUST_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let up = wait_until(DEADLINE, || {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("fsclient exited before mounting: {status}");
            }
            fuse_wire::connection_id(&mnt).is_ok()
        });
        assert!(up, "fsclient did not mount {}", mnt.display());
        let guard = MountGuard::new(&mnt);
        (mnt, guard, child)
    };
    let (a, _guard_a, _child_a) = mount("host-a");
    let (b, _guard_b, _child_b) = mount("host-b");
    fs::create_dir(a.join("files")).unwrap();
    fs::create_dir(a.join("bytes")).unwrap();
    let meta = baton_meta::open(&db.url).unwrap();
    let files_ino = fs::metadata(a.join("files")).unwrap().ino();
    let bytes_ino = fs::metadata(a.join("bytes")).unwrap().ino();
    meta.set_quota(files_ino, None, Some(40)).unwrap();
    meta.set_quota(bytes_ino, Some(MIB), None).unwrap();

    const WRITE_BYTES: usize = 16 * 1024;
    let race = |mnt: std::path::PathBuf, host: &'static str| {
        std::thread::spawn(move || {
            let mut created = 0u64;
            loop {
                match fs::write(mnt.join(format!("files/{host}-{created}")), b"") {
                    Ok(()) => created += 1,
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{host}: {e}");
                        break;
                    }
                }
            }
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(mnt.join(format!("bytes/{host}")))
                .unwrap();
            let mut written = 0u64;
            loop {
                match f.write_all_at(&[9u8; WRITE_BYTES], written) {
                    Ok(()) => {
                        f.sync_all().unwrap();
                        written += WRITE_BYTES as u64;
                    }
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{host}: {e}");
                        break;
                    }
                }
            }
            (created, written)
        })
    };
    let ta = race(a.clone(), "a");
    let tb = race(b.clone(), "b");
    let (created_a, written_a) = ta.join().unwrap();
    let (created_b, written_b) = tb.join().unwrap();
    assert_eq!(created_a + created_b, 40, "the inode limit is exact");
    let files = meta.quota(files_ino).unwrap().unwrap().used;
    assert_eq!(files.inodes, 40);
    let bytes = meta.quota(bytes_ino).unwrap().unwrap().used;
    assert_eq!(bytes.bytes, written_a + written_b);
    assert!(
        bytes.bytes <= MIB + WRITE_BYTES as u64,
        "passed the limit by more than one write of the other mount: {} bytes",
        bytes.bytes
    );
    assert!(
        bytes.bytes + WRITE_BYTES as u64 > MIB,
        "stopped short: {}",
        bytes.bytes
    );
    assert!(meta.recount_quotas(false).unwrap().is_empty());
    // Both mounts see the same quota through statfs.
    for mnt in [&a, &b] {
        let st = nix::sys::statvfs::statvfs(mnt.join("files").as_path()).unwrap();
        assert_eq!(st.files(), 40);
        assert_eq!(st.files_free(), 0);
    }
}

/// A first byte limit set above a file a mount is writing (which it had
/// found free of quotas) stops its growth within the recheck time; the
/// usage then agrees with a recount.
#[test]
fn a_limit_set_while_a_file_is_written_stops_its_growth() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(q.join("f"))
        .unwrap();
    let block = vec![4u8; 4096];
    f.write_all_at(&block, 0).unwrap();
    set_quota(&vol, &q, Some(8192), None);
    let mut offset = 4096;
    let refused = wait_until(DEADLINE, || match f.write_all_at(&block, offset) {
        Ok(()) => {
            offset += 4096;
            false
        }
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
            true
        }
    });
    assert!(refused, "still growing past the limit at {offset} bytes");
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::metadata(q.join("f")).unwrap().len(), offset);
    assert_eq!(usage(&vol, &q).bytes, offset);
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    m.stop();
}

/// Waits (a bounded while) for an unlinked file's usage to be released.
fn wait_for_usage(vol: &Volume, dir: &std::path::Path, bytes: u64) -> u64 {
    let mut last = 0;
    for _ in 0..100 {
        last = usage(vol, dir).bytes;
        if last == bytes {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    last
}

#[test]
fn fallocated_space_is_reserved_in_the_quota_and_writes_into_it_never_fail() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    set_quota(&vol, &q, Some(12 * MIB), None);

    // KEEP_SIZE: the size stays 0, yet the 10 MiB are reserved.
    let f = open_direct(&q.join("reserved"));
    nix_fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 10 * MIB).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 0);
    assert_eq!(usage(&vol, &q).bytes, 10 * MIB, "the quota counts it");
    assert_eq!(df_used_bytes(&q), 10 * MIB, "df on the quota shows it");
    assert!(
        df_used_bytes(&m.mnt) >= 10 * MIB,
        "df on the volume shows it"
    );

    // 3 MiB elsewhere do not fit in the 2 MiB left.
    let other = open_direct(&q.join("other"));
    let chunk = vec![5u8; MIB as usize];
    let refused = (0..3).try_for_each(|i| other.write_all_at(&chunk, i * MIB));
    assert_eq!(errno_of(refused), libc::EDQUOT);
    drop(other);
    fs::remove_file(q.join("other")).unwrap();
    assert_eq!(wait_for_usage(&vol, &q, 10 * MIB), 10 * MIB);

    // Writing into the reservation: never refused, and the blocks count
    // instead of the reservation (no double count).
    for i in 0..10 {
        f.write_all_at(&chunk, i * MIB).unwrap();
    }
    f.sync_all().unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10 * MIB);
    assert_eq!(usage(&vol, &q).bytes, 10 * MIB);
    assert_eq!(df_used_bytes(&q), 10 * MIB);
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    drop(f);
    m.stop();
}

#[test]
fn a_reservation_shows_in_df_until_punched_truncated_or_unlinked_and_survives_kill_9() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let q = m.p("q");
    fs::create_dir(&q).unwrap();
    set_quota(&vol, &q, Some(64 * MIB), None);
    let volume_used = df_used_bytes(&m.mnt);
    let reserved = |m: &Mounted| df_used_bytes(&m.mnt) - volume_used;

    // Mode 0: a 10 MiB hole, reserved in the volume's usage.
    let f = open_direct(&q.join("f"));
    nix_fallocate(&f, 0, 0, 10 * MIB).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10 * MIB);
    assert_eq!(
        reserved(&m),
        10 * MIB,
        "df on the volume shows the reservation"
    );
    // A punch releases what it covers.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    nix_fallocate(&f, punch, 0, 4 * MIB).unwrap();
    assert_eq!(reserved(&m), 6 * MIB);
    // A truncate releases what is past the new size, KEEP_SIZE's too.
    nix_fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 10 * MIB, 6 * MIB).unwrap();
    assert_eq!(reserved(&m), 12 * MIB);
    assert_eq!(usage(&vol, &q).bytes, 16 * MIB);
    // (A truncate is staged like a write: its release commits with it.)
    f.set_len(8 * MIB).unwrap();
    f.sync_all().unwrap();
    assert_eq!(reserved(&m), 4 * MIB);
    assert_eq!(usage(&vol, &q).bytes, 8 * MIB);
    drop(f);
    // An unlink releases the rest once the file is reclaimed.
    fs::remove_file(q.join("f")).unwrap();
    assert_eq!(wait_for_usage(&vol, &q, 0), 0);
    assert_eq!(reserved(&m), 0);

    // Durable: reserved, then the generation is killed.
    let g = open_direct(&q.join("g"));
    nix_fallocate(&g, libc::FALLOC_FL_KEEP_SIZE, 0, 10 * MIB).unwrap();
    m.kill9();
    drop(g);
    let m = vol.mount(&mnt);
    assert_eq!(reserved(&m), 10 * MIB);
    assert_eq!(usage(&vol, &m.p("q")).bytes, 10 * MIB);
    assert!(meta(&vol).recount_quotas(false).unwrap().is_empty());
    m.stop();
}
