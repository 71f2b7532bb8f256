//! Nothing Baton writes on the host is readable by other users: after a
//! supervised mount has written files, and after an encrypted volume with a
//! block cache (which holds decrypted blocks) has been written and read
//! back, every file and directory Baton created under the volume, its
//! staging, its cache and the supervisor's state dir is owner-only, and uid
//! 65534 cannot read a block object or a cache file. Needs root and
//! /dev/fuse.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use chaos_tests::chaos::supervisor::{Supervisor, SupervisorOptions};
use chaos_tests::mount_guard::{wait_for_mount, workspace_binary, ChildGuard, MountGuard};

const MARKER: &[u8] = b"PLAINTEXT-MARKER-0123456789 ";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every path under `root`, itself included.
fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    out.push(root.to_path_buf());
    if fs::symlink_metadata(root).unwrap().is_dir() {
        for entry in fs::read_dir(root).unwrap() {
            walk(&entry.unwrap().path(), out);
        }
    }
}

/// Paths under `root` with any group or other permission bit, as
/// `MODE PATH` lines; and how many paths were checked.
fn shared_with_others(root: &Path) -> (Vec<String>, Vec<PathBuf>) {
    let mut paths = Vec::new();
    walk(root, &mut paths);
    let open = paths
        .iter()
        .filter_map(|p| {
            let mode = fs::symlink_metadata(p).ok()?.permissions().mode();
            (mode & 0o077 != 0 && mode & 0o170000 != 0o120000)
                .then(|| format!("{:o} {}", mode & 0o7777, p.display()))
        })
        .collect();
    (open, paths)
}

/// `cat PATH` as uid/gid 65534: whether it read anything.
fn nobody_reads(path: &Path) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .unwrap()
        .status
        .success()
}

fn first_file_under(dir: &Path) -> PathBuf {
    let mut paths = Vec::new();
    walk(dir, &mut paths);
    paths
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no file under {}", dir.display()))
}

#[test]
fn an_encrypted_volume_with_a_cache_leaves_nothing_other_users_can_read() {
    let dir = tempfile::tempdir().unwrap();
    // Like /var/lib: reachable by everyone, so only Baton's modes protect.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let base = dir.path().join("baton");
    let key = dir.path().join("volume.key");
    fs::write(&key, [0x5a; 32]).unwrap();
    let out = Command::new(workspace_binary("fsctl"))
        .args([
            "format",
            "vol",
            "--block-size",
            "256K",
            "--encryption-key-file",
        ])
        .arg(&key)
        .arg("--base-dir")
        .arg(&base)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();

    let content = MARKER.repeat(40_000); // ~1.1 MB: five blocks
    for read_back in [false, true] {
        let mut child = ChildGuard(
            Command::new(workspace_binary("fsclient"))
                .args(["mount", "vol"])
                .arg(&mnt)
                .arg("--base-dir")
                .arg(&base)
                .arg("--key-file")
                .arg(&key)
                .args(["--cache-size", "64M"])
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        assert!(wait_for_mount(&mnt, Duration::from_secs(20)), "not mounted");
        let guard = MountGuard::new(&mnt);
        if read_back {
            assert!(fs::read(mnt.join("model.bin")).unwrap() == content);
        } else {
            fs::write(mnt.join("model.bin"), &content).unwrap();
        }
        assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
        let status = child.wait_timeout(Duration::from_secs(30)).unwrap();
        assert!(status.success(), "fsclient exited with {status}");
        drop(guard);
    }

    let (open, checked) = shared_with_others(&base);
    assert!(open.is_empty(), "readable by others:\n{}", open.join("\n"));
    let vol = base.join("vol");
    for must in ["meta.db", "data", "cache", "staging"] {
        assert!(
            checked.contains(&vol.join(must)),
            "{must} was not checked: {checked:?}"
        );
    }
    let cached = first_file_under(&vol.join("cache"));
    let cached_bytes = fs::read(&cached).unwrap();
    assert!(
        cached_bytes.windows(MARKER.len()).any(|w| w == MARKER),
        "the cache holds plaintext, which is why it must be private: {}",
        cached.display()
    );
    assert!(
        !nobody_reads(&cached),
        "uid 65534 read {}",
        cached.display()
    );
    let object = first_file_under(&vol.join("data/blocks"));
    assert!(
        !nobody_reads(&object),
        "uid 65534 read {}",
        object.display()
    );
    assert!(
        !nobody_reads(&vol.join("meta.db")),
        "uid 65534 read meta.db"
    );
}

#[test]
fn a_supervised_mount_leaves_nothing_other_users_can_read() {
    let mut sup = Supervisor::start(&SupervisorOptions::default(), "private").unwrap();
    sup.mount().unwrap();
    let file = sup.mnt.join("secret");
    fs::write(&file, MARKER.repeat(10_000)).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    fs::File::open(&file).unwrap().sync_all().unwrap();

    // What fsctl format, the generations and fs-supervisor made; the temp
    // dir around them, the mountpoint and the harness's log are the test's.
    let mut open = Vec::new();
    let mut checked = Vec::new();
    for root in ["base", "state", "supervisor.sock"] {
        let (o, c) = shared_with_others(&sup.path(root));
        open.extend(o);
        checked.extend(c);
    }
    assert!(
        open.is_empty(),
        "readable by others:\n{}\n{}",
        open.join("\n"),
        sup.logs()
    );
    for must in [
        "base/vol/meta.db",
        "base/vol/data",
        "base/vol/staging",
        "state/logs",
    ] {
        assert!(
            checked.contains(&sup.path(must)),
            "{must} was not checked: {checked:?}"
        );
    }
}
