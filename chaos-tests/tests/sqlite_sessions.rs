//! Sessions on the embedded default (SQLite): a file unlinked while open
//! stays whole until closed, then its objects are deleted; after a kill -9
//! of `fsclient mount` with the file still open and unlinked, the next
//! mount of the volume (which holds the volume's exclusive lock, so no
//! other mount can be alive) deletes the dead session and reclaims it.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chaos_tests::mount_guard::{
    mount_fsclient, wait_until, workspace_binary, ChildGuard, MountGuard,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn objects(data: &Path) -> usize {
    fs::read_dir(data.join("blocks"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| fs::read_dir(d.path()).map(|f| f.count()).unwrap_or(0))
        .sum()
}

fn mount(base: &Path, mnt: &Path) -> (ChildGuard, MountGuard) {
    mount_fsclient(base, mnt, &["--session-expiry-ms", "1000"], DEADLINE)
}

#[test]
fn an_unlinked_open_file_is_kept_until_closed_and_a_dead_mounts_is_reclaimed_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let out = Command::new(workspace_binary("fsctl"))
        .args(["format", "vol", "--block-size", "64K", "--base-dir"])
        .arg(base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = base.join("vol/data");
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();

    // Unlinked while open: whole until closed, then its objects go.
    let (mut child, guard) = mount(base, &mnt);
    fs::write(mnt.join("kept"), &body).unwrap();
    assert_eq!(objects(&data), 4, "200 KB in 64 KiB blocks");
    let held = fs::File::open(mnt.join("kept")).unwrap();
    fs::remove_file(mnt.join("kept")).unwrap();
    std::thread::sleep(Duration::from_millis(1_500)); // several session ticks
    assert_eq!(objects(&data), 4, "kept while open");
    let mut read = vec![0; body.len()];
    held.read_exact_at(&mut read, 0).unwrap();
    assert!(read == body, "the unlinked file reads whole");
    drop(held);
    assert!(
        wait_until(DEADLINE, || objects(&data) == 0),
        "reclaimed at close"
    );

    // kill -9 with an unlinked file open: nothing reclaims it while the
    // dead mount's session is the only one; the next mount does.
    fs::write(mnt.join("orphaned"), &body).unwrap();
    let held = fs::File::open(mnt.join("orphaned")).unwrap();
    fs::remove_file(mnt.join("orphaned")).unwrap();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    drop(held);
    drop(guard);
    assert_eq!(objects(&data), 4, "the dead mount's orphan is still there");
    let (mut child, guard) = mount(base, &mnt);
    assert!(
        wait_until(DEADLINE, || objects(&data) == 0),
        "the next mount reclaimed it"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let status = child.wait_timeout(DEADLINE).expect("fsclient exits");
    assert!(status.success(), "fsclient exit status {status}");
    drop(guard);
}
