//! Bad input to `fsclient mount`: each case exits non-zero with one clear
//! line naming the problem and the fix, mounts nothing and changes nothing
//! in the volume. Also the `sqlite://` volume form with its defaults.
//! Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;

/// Runs `fsclient mount ARGS` expecting failure; returns stderr.
fn refused(vol: &Volume, args: &[&str]) -> String {
    let before = (snapshot(&vol.base), snapshot(&vol.data));
    let out = vol.run_fsclient(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "exit status; stderr: {stderr}");
    let after = (snapshot(&vol.base), snapshot(&vol.data));
    assert!(before == after, "the volume changed; stderr: {stderr}");
    stderr
}

fn assert_unmounted(mnt: &Path) {
    assert!(
        fuse_wire::connection_id(mnt).is_err(),
        "{} got mounted",
        mnt.display()
    );
}

#[test]
fn unusable_mountpoints_are_refused_before_mounting() {
    let vol = Volume::new();
    let base = s(&vol.base).to_string();
    let missing = vol.path("missing");
    let err = refused(&vol, &["mount", VOLUME, s(&missing), "--base-dir", &base]);
    assert!(err.starts_with("fsclient: mountpoint"), "{err}");
    assert!(
        err.contains("No such file or directory") && err.contains("mkdir -p"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let file = vol.path("file");
    std::fs::write(&file, b"").unwrap();
    let err = refused(&vol, &["mount", VOLUME, s(&file), "--base-dir", &base]);
    assert!(err.contains("is not a directory"), "{err}");
    assert_unmounted(&file);

    let full = vol.mountpoint("full");
    std::fs::write(full.join("x"), b"").unwrap();
    let err = refused(&vol, &["mount", VOLUME, s(&full), "--base-dir", &base]);
    assert!(err.contains("is not empty"), "{err}");
    assert_unmounted(&full);
}

#[test]
fn unformatted_corrupt_and_unreachable_volumes_are_refused() {
    let vol = Volume::new();
    let base = s(&vol.base).to_string();
    let mnt = vol.mountpoint("mnt");

    let err = refused(&vol, &["mount", "nope", s(&mnt), "--base-dir", &base]);
    assert!(err.contains("volume nope is not formatted"), "{err}");
    assert!(err.contains("run `fsctl format nope`"), "{err}");
    assert!(!vol.base.join("nope").exists(), "nothing created for it");

    std::fs::create_dir(vol.base.join("junk")).unwrap();
    std::fs::write(vol.base.join("junk/meta.db"), vec![7u8; 8192]).unwrap();
    let err = refused(&vol, &["mount", "junk", s(&mnt), "--base-dir", &base]);
    assert!(err.contains("is not a Baton metadata database"), "{err}");
    assert_eq!(
        std::fs::read(vol.base.join("junk/meta.db")).unwrap(),
        vec![7u8; 8192]
    );

    let lost = vol.path("lost-data");
    std::fs::create_dir_all(vol.base.join("far")).unwrap();
    let config = baton_meta::VolumeConfig {
        name: "far".into(),
        storage_url: format!("file://{}", lost.display()),
        block_size_bytes: BLOCK_SIZE,
    };
    drop(baton_meta::format(s(&vol.base.join("far/meta.db")), &config).unwrap());
    let err = refused(&vol, &["mount", "far", s(&mnt), "--base-dir", &base]);
    assert!(
        err.contains("storage file://") && err.contains("does not answer"),
        "{err}"
    );
    assert!(!vol.base.join("far/staging").exists());
    assert!(!vol.base.join("far/meta.db.lock").exists());

    let err = refused(&vol, &["mount", "a/b", s(&mnt), "--base-dir", &base]);
    assert!(err.contains("volume `a/b` is not a volume name"), "{err}");
    assert_unmounted(&mnt);
}

#[test]
fn a_truncated_metadata_file_is_refused_before_mounting() {
    let vol = Volume::new();
    let base = s(&vol.base).to_string();
    let mnt = vol.mountpoint("mnt");
    // Enough entries that the lost half holds namespace pages, not the
    // volume record SQLite reads first (that case fails on its own).
    let m = vol.mount(&mnt);
    std::fs::create_dir(m.p("d")).unwrap();
    for i in 0..2000 {
        std::fs::write(m.p(&format!("d/file-with-a-long-name-{i:05}")), b"x").unwrap();
    }
    // Killed: the newest pages stay in the WAL, as after a crash.
    m.kill9();
    // Copied into the file, so that the half cut off is lost: a file
    // shorter than its header whose WAL holds every missing page is a
    // checkpoint killed midway, and opens.
    rusqlite::Connection::open(vol.meta_path())
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let meta_db = std::fs::OpenOptions::new()
        .write(true)
        .open(vol.meta_path())
        .unwrap();
    let full_bytes = meta_db.metadata().unwrap().len();
    meta_db.set_len(full_bytes / 2).unwrap();
    let err = refused(&vol, &["mount", VOLUME, s(&mnt), "--base-dir", &base]);
    assert!(
        err.contains("metadata corrupt")
            && err.contains("is truncated")
            && err.contains("restore from backup"),
        "{err}"
    );
    assert_unmounted(&mnt);
}

#[test]
fn a_second_mount_of_a_volume_names_the_first() {
    let vol = Volume::new();
    let base = s(&vol.base).to_string();
    let m = vol.mount(&vol.mountpoint("mnt"));
    std::fs::write(m.p("f"), b"x").unwrap();
    let other = vol.mountpoint("other");
    let out = vol.run_fsclient(&["mount", VOLUME, s(&other), "--base-dir", &base]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains(&format!(
            "volume vol is already mounted (pid {})",
            m.child.0.id()
        )),
        "{err}"
    );
    assert_unmounted(&other);
    m.stop();
}

#[test]
fn an_unwritable_staging_dir_is_refused() {
    let vol = Volume::new();
    let base = s(&vol.base).to_string();
    let mnt = vol.mountpoint("mnt");
    let file = vol.path("plain-file");
    std::fs::write(&file, b"").unwrap();
    let staging = file.join("staging");
    let out = vol.run_fsclient(&[
        "mount",
        VOLUME,
        s(&mnt),
        "--base-dir",
        &base,
        "--staging-dir",
        s(&staging),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("staging directory") && err.contains("is not writable"),
        "{err}"
    );
    assert!(err.contains("--staging-dir"), "{err}");
    assert_unmounted(&mnt);

    let err = refused(
        &vol,
        &[
            "mount",
            VOLUME,
            s(&mnt),
            "--base-dir",
            &base,
            "--cache-size",
            "12Q",
        ],
    );
    assert!(err.contains("unknown unit"), "{err}");
}

#[test]
fn a_sqlite_url_volume_keeps_cache_and_staging_next_to_its_metadata() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let url = format!("sqlite://{}", vol.meta_path().display());
    let mut child = ChildGuard(
        std::process::Command::new(env!("CARGO_BIN_EXE_fsclient"))
            .args([
                "mount",
                &url,
                s(&mnt),
                "--cache-size",
                "64M",
                "--threads",
                "2",
            ])
            .spawn()
            .unwrap(),
    );
    assert!(wait_until(DEADLINE, || fuse_wire::connection_id(&mnt).is_ok()));
    let _guard = MountGuard::new(&mnt);
    std::fs::write(mnt.join("f"), b"via url").unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"via url");
    nix::sys::signal::kill(child.pid(), nix::sys::signal::Signal::SIGINT).unwrap();
    assert!(child.wait_timeout(DEADLINE).unwrap().success());
    let dir = vol.meta_path().parent().unwrap().to_path_buf();
    assert!(dir.join("staging").is_dir() && dir.join("cache").is_dir());
    assert_unmounted(&mnt);
}

/// A read-only bind mount of a directory, detached on drop.
struct ReadOnlyBind(std::path::PathBuf);

impl ReadOnlyBind {
    fn new(source: &Path, target: &Path) -> ReadOnlyBind {
        use nix::mount::{mount, MsFlags};
        std::fs::create_dir_all(target).unwrap();
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let bind = ReadOnlyBind(target.to_path_buf());
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>).unwrap();
        bind
    }
}

impl Drop for ReadOnlyBind {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_read_only_metadata_database_is_named_as_such_not_as_foreign() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let read_only = vol.path("read-only-base");
    let _bind = ReadOnlyBind::new(&vol.base, &read_only);
    let err = refused(
        &vol,
        &["mount", VOLUME, s(&mnt), "--base-dir", s(&read_only)],
    );
    assert!(
        err.contains("cannot be written") && err.contains("Read-only file system"),
        "{err}"
    );
    assert!(!err.contains("not a Baton metadata database"), "{err}");
    assert_unmounted(&mnt);
}
