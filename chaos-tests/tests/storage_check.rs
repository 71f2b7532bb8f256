//! `fsctl fsck` and `fsctl gc` on a real volume written through a real
//! mount: leftover objects (what a crash between a flush's upload and its
//! commit leaves: an object under a file's key prefix that no block-map row
//! names) are found, kept while young, deleted when old, never while the
//! volume is mounted here, and the live data is untouched; a lost object is
//! reported with its inode and block and fails fsck.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use chaos_tests::mount_guard::{mount_fsclient, workspace_binary, ChildGuard, MountGuard};

fn fsctl(args: &[&str], base: &Path) -> Output {
    Command::new(workspace_binary("fsctl"))
        .args(args)
        .arg("--base-dir")
        .arg(base)
        .stdin(Stdio::null())
        .output()
        .expect("run fsctl (build the workspace first)")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mount(base: &Path, mnt: &Path) -> (ChildGuard, MountGuard) {
    mount_fsclient(base, mnt, &[], Duration::from_secs(20))
}

fn unmount(mnt: &Path, (mut child, guard): (ChildGuard, MountGuard)) {
    assert!(Command::new("umount").arg(mnt).status().unwrap().success());
    let status = child.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "fsclient exited with {status}");
    drop(guard);
}

/// Plants an object under `ino`'s key prefix, modified `age` ago.
fn plant(data: &Path, ino: u64, index: u32, unique: u64, age: &str) -> PathBuf {
    let dir = data.join(format!("blocks/{ino:016x}"));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{index:08x}-{unique:016x}"));
    fs::write(&path, vec![0xee; 70_000]).unwrap();
    let status = Command::new("touch")
        .arg("-d")
        .arg(age)
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    path
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8) ^ seed ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn gc_deletes_only_old_unreferenced_objects_and_fsck_reports_lost_ones() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let out = fsctl(&["format", "vol", "--block-size", "64K"], base);
    assert!(out.status.success(), "{}", text(&out));
    let data = base.join("vol/data");
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();

    let mounted = mount(base, &mnt);
    let (a, b) = (pattern(300_000, 1), pattern(100_000, 2));
    fs::write(mnt.join("a"), &a).unwrap();
    fs::write(mnt.join("b"), &b).unwrap();
    let ino_a = fs::metadata(mnt.join("a")).unwrap().ino();
    // gc refuses while the volume is mounted here; dry run and fsck do not.
    let out = fsctl(&["gc", "vol", "--min-age-secs", "0"], base);
    assert!(!out.status.success(), "gc ran under a live mount");
    assert!(
        text(&out).contains("mounted on this host"),
        "{}",
        text(&out)
    );
    let out = fsctl(&["fsck", "vol"], base);
    assert!(out.status.success(), "{}", text(&out));
    unmount(&mnt, mounted);

    let old = plant(&data, ino_a, 1, 0xdead_0001, "3 hours ago");
    let young = plant(&data, ino_a, 2, 0xdead_0002, "1 minute ago");
    let out = fsctl(&["fsck", "vol"], base);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("2 unreferenced (140000 bytes)"), "{said}");
    assert!(said.contains("0 missing or short"), "{said}");

    let out = fsctl(&["fsck", "vol", "--json"], base);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck JSON");
    assert_eq!(report["unreferenced_objects"], 2, "{report}");
    assert_eq!(report["unreferenced_bytes"], 140_000, "{report}");
    assert_eq!(report["consistent"], true, "{report}");

    // A dry run gives counts; --list names the keys.
    let out = fsctl(&["gc", "vol", "--dry-run"], base);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("1 object(s) would be deleted (--list names them)"),
        "{said}"
    );
    assert!(!said.contains("dead0001"), "keys only with --list: {said}");
    let out = fsctl(&["gc", "vol", "--dry-run", "--json", "--list"], base);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc JSON");
    assert_eq!(
        (
            &report["collectable"],
            &report["kept_younger_than_min_age"],
            &report["deleted"]
        ),
        (&1.into(), &1.into(), &serde_json::Value::Null),
        "{report}"
    );
    assert!(
        report["keys"][0]
            .as_str()
            .unwrap_or("")
            .contains("dead0001"),
        "{report}"
    );
    let out = fsctl(&["gc", "vol", "--dry-run", "--list"], base);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("would delete blocks/") && said.contains("dead0001"),
        "{said}"
    );
    assert!(
        !said.contains("dead0002"),
        "a young object is not listed: {said}"
    );
    assert!(said.contains("keeping 1 unreferenced"), "{said}");
    assert!(old.exists() && young.exists(), "a dry run deletes nothing");

    let out = fsctl(&["gc", "vol"], base);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("deleted 1 of 1"), "{}", text(&out));
    assert!(!old.exists() && young.exists());
    let out = fsctl(&["gc", "vol", "--min-age-secs", "0"], base);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!young.exists());
    let out = fsctl(&["fsck", "vol"], base);
    assert!(text(&out).contains(" 0 unreferenced"), "{}", text(&out));

    // The live data is untouched.
    let mounted = mount(base, &mnt);
    assert!(fs::read(mnt.join("a")).unwrap() == a);
    assert!(fs::read(mnt.join("b")).unwrap() == b);
    unmount(&mnt, mounted);

    // A lost object: fsck names the inode and block and exits 1.
    let victim = chaos_tests::stored::object_files(&data, ino_a)
        .into_iter()
        .find(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with("00000003-") || name.contains("-00000003-")
        })
        .expect("block 3 of a");
    fs::remove_file(&victim).unwrap();
    let out = fsctl(&["fsck", "vol"], base);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("inode {ino_a} block 3: object")) && said.contains("is missing"),
        "{said}"
    );
    assert!(said.contains("1 block(s) lost"), "{said}");
}
