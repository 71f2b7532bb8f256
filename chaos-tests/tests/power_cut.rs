//! fsync(2) means power-loss durability on the embedded default (SQLite and
//! a local directory store): a power cut right after fsync returned keeps
//! every fsynced file whole.
//!
//! The volume lives on ext4 on a loop device over an image file. The power
//! cut is a copy of the image file taken while everything is still mounted
//! and serving: the image holds what the filesystem had written to its
//! device, not what sat dirty in the page cache. The copy is then mounted
//! (ext4 replays its journal, as after a reboot), checked with `fsctl fsck`
//! and served by `fsclient mount`, and each file is read back.
//!
//! Not covered: syncfs(2) (`sync`, `sync -f`). Linux forwards it to a FUSE
//! server only on virtiofs (`fc->sync_fs`); on a /dev/fuse mount it writes
//! the kernel's dirty pages back and never asks Baton to make anything
//! durable. A file closed and then `sync -f`ed was gone after the cut.
//!
//! Needs root, losetup and mkfs.ext4 (util-linux, e2fsprogs).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test code: a failed setup step should stop the test.
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use chaos_tests::mount_guard::{wait_for_mount, workspace_binary, ChildGuard, MountGuard};

/// An ext4 filesystem on a loop device over `image`, mounted at `at`;
/// unmounted and detached when dropped.
struct LoopDisk {
    device: String,
    at: PathBuf,
}

impl LoopDisk {
    /// Attaches `image` (formatted first when `format`) and mounts it.
    fn mount(image: &Path, at: &Path, format: bool) -> LoopDisk {
        if format {
            run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image));
        }
        let out = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image));
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        fs::create_dir_all(at).unwrap();
        let disk = LoopDisk {
            device,
            at: at.to_path_buf(),
        };
        run(Command::new("mount").arg(&disk.device).arg(at));
        disk
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

fn run(command: &mut Command) -> Output {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e} (needs util-linux and e2fsprogs)"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn mount(base: &Path, mnt: &Path) -> (ChildGuard, MountGuard) {
    fs::create_dir_all(mnt).unwrap();
    let child = ChildGuard(
        Command::new(workspace_binary("fsclient"))
            .args(["mount", "vol"])
            .arg(mnt)
            .arg("--base-dir")
            .arg(base)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn fsclient (build the workspace first)"),
    );
    assert!(
        wait_for_mount(mnt, Duration::from_secs(20)),
        "fsclient did not mount"
    );
    (child, MountGuard::new(mnt))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8) ^ seed ^ (i >> 9) as u8 ^ (i >> 17) as u8)
        .collect()
}

/// Writes `data` to `path` (appending when asked), then fsync or fdatasync.
fn write_synced(path: &Path, data: &[u8], append: bool, datasync: bool) {
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .unwrap();
    file.write_all(data).unwrap();
    if datasync {
        file.sync_data().unwrap();
    } else {
        file.sync_all().unwrap();
    }
}

#[test]
fn fsynced_files_survive_a_power_cut_taken_right_after_the_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    File::create(&image).unwrap().set_len(256 << 20).unwrap();
    let disk = LoopDisk::mount(&image, &dir.path().join("disk"), true);
    let base = disk.at.join("base");
    run(Command::new(workspace_binary("fsctl"))
        .args(["format", "vol", "--base-dir"])
        .arg(&base));
    let mnt = dir.path().join("mnt");
    let mounted = mount(&base, &mnt);

    let mut expected: Vec<(&str, Vec<u8>)> = Vec::new();
    // Several 4 MiB blocks and a tail, in one fsync.
    let big = pattern((9 << 20) + 12_345, 1);
    write_synced(&mnt.join("big"), &big, false, false);
    expected.push(("big", big));
    // A whole small file (committed by its WRITE), fdatasync.
    let small = pattern(3_000, 2);
    write_synced(&mnt.join("small"), &small, false, true);
    expected.push(("small", small));
    // Closed without fsync, then appended to and fsynced: the fsync covers
    // the part an earlier close committed too.
    let first = pattern(1 << 20, 3);
    fs::write(mnt.join("grown"), &first).unwrap();
    let second = pattern(700_000, 4);
    write_synced(&mnt.join("grown"), &second, true, false);
    expected.push(("grown", [first, second].concat()));
    // fsynced twice: the second fsync covers only what came after the first.
    let (one, two) = (pattern(5 << 20, 5), pattern(2 << 20, 6));
    write_synced(&mnt.join("twice"), &one, false, false);
    write_synced(&mnt.join("twice"), &two, true, false);
    expected.push(("twice", [one, two].concat()));
    // In a new directory, fsynced with its directory.
    fs::create_dir(mnt.join("sub")).unwrap();
    let nested = pattern(200_000, 7);
    write_synced(&mnt.join("sub/nested"), &nested, false, false);
    File::open(mnt.join("sub")).unwrap().sync_all().unwrap();
    expected.push(("sub/nested", nested));

    // The power cut: what the disk got, now.
    let cut = dir.path().join("cut.img");
    fs::copy(&image, &cut).unwrap();
    drop(mounted);
    drop(disk);

    // At the same path: the volume names its object store's directory.
    let after = LoopDisk::mount(&cut, &dir.path().join("disk"), false);
    let base = after.at.join("base");
    let out = run(Command::new(workspace_binary("fsctl"))
        .args(["fsck", "vol", "--json", "--base-dir"])
        .arg(&base));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck JSON");
    assert_eq!(
        report["missing_or_short_blocks"], 0,
        "objects lost in the power cut: {report}"
    );
    let mnt = dir.path().join("mnt-after");
    let _mounted = mount(&base, &mnt);
    for (name, want) in &expected {
        let got = fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert_eq!(got.len(), want.len(), "{name}: length after the power cut");
        assert!(got == *want, "{name}: content after the power cut differs");
    }
}
