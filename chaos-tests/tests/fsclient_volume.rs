//! fsclient as a user meets it: a freshly formatted volume mounted by the
//! real binaries holds up under the random-operation exerciser across a
//! remount, and a real source tree copied in and out with `cp -a` compares
//! equal in content, modes, times and links.
//!
//! `BATON_FSX_OPS` sets the exerciser's length (default 20000; the issue's
//! 100k run is `BATON_FSX_OPS=100000 cargo test -p chaos-tests --test
//! fsclient_volume`).

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use chaos_tests::fsx::{run, FsxConfig, KIND_NAMES};
use chaos_tests::mount_guard::{wait_for_mount, workspace_binary, ChildGuard, MountGuard};

struct Volume {
    dir: tempfile::TempDir,
    meta_url: String,
}

impl Volume {
    fn format(block_size: &str) -> Volume {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", "vol", "--block-size", block_size, "--base-dir"])
            .arg(dir.path())
            .output()
            .expect("run fsctl (build the workspace first)");
        assert!(
            out.status.success(),
            "fsctl format failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta_url = format!("sqlite://{}", dir.path().join("vol/meta.db").display());
        Volume { dir, meta_url }
    }

    fn mountpoint(&self) -> PathBuf {
        let mnt = self.dir.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        mnt
    }

    fn mount(&self) -> (ChildGuard, MountGuard) {
        let mnt = self.mountpoint();
        let child = Command::new(workspace_binary("fsclient"))
            .arg("mount")
            .arg(&self.meta_url)
            .arg(&mnt)
            .arg("--base-dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn fsclient");
        let child = ChildGuard(child);
        assert!(
            wait_for_mount(&mnt, Duration::from_secs(20)),
            "fsclient did not mount"
        );
        (child, MountGuard::new(&mnt))
    }
}

/// How long an unmount may find the mount busy. Another test of this
/// binary forking a process (`cp -a`) copies this one's open files into the
/// child until it execs, which on a loaded machine can take a while: busy
/// for that long is setup, not the behaviour under test.
const UNMOUNT_BUSY_MS_MAX: u64 = 10_000;

/// Unmounts and waits for fsclient to exit (it flushes first).
fn unmount(mnt: &Path, mut child: ChildGuard, guard: MountGuard) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_millis(UNMOUNT_BUSY_MS_MAX);
    loop {
        let out = Command::new("umount")
            .arg(mnt)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            break;
        }
        let said = String::from_utf8_lossy(&out.stderr);
        if !said.contains("busy") || std::time::Instant::now() > deadline {
            return Err(format!("umount {} failed: {}", mnt.display(), said.trim()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let exit = child
        .wait_timeout(Duration::from_secs(30))
        .ok_or("fsclient did not exit after umount")?;
    drop(guard);
    if exit.success() {
        Ok(())
    } else {
        Err(format!("fsclient exited with {exit}"))
    }
}

#[test]
fn exerciser_agrees_with_a_plain_directory_across_a_remount() {
    let ops = std::env::var("BATON_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let volume = Volume::format("64K");
    let reference = tempfile::tempdir().unwrap();
    let mnt = volume.mountpoint();
    let mut mounted = Some(volume.mount());
    let mut remount = || {
        let (child, guard) = mounted.take().ok_or("not mounted")?;
        unmount(&mnt, child, guard)?;
        mounted = Some(volume.mount());
        Ok(())
    };
    // Every kind of operation the exerciser has (every fallocate mode,
    // copy_file_range, O_TMPFILE, ACLs), COLLAPSE_RANGE and INSERT_RANGE
    // expected to be refused with EOPNOTSUPP.
    let config = FsxConfig {
        file_len_max: 4 << 20,
        io_len_max: 200 << 10,
        remount_at: Some(ops / 2),
        ..FsxConfig::every_op(0xba70, ops)
    };
    let started = std::time::Instant::now();
    let stats =
        run(&config, &mnt, reference.path(), &mut remount).unwrap_or_else(|f| panic!("{f}"));
    eprintln!(
        "fsx: {ops} operations in {:.1} s: {stats:?}",
        started.elapsed().as_secs_f64()
    );
    // Every kind was drawn (and, for COLLAPSE_RANGE and INSERT_RANGE,
    // refused as expected); ACLs only where the reference has them.
    let acl_kinds = ["acl-set", "acl-remove", "chmod"];
    for (name, &n) in KIND_NAMES.iter().zip(&stats.by_kind) {
        let skipped = stats.acl_skipped && acl_kinds.contains(name);
        assert!(n > 0 || skipped, "{name} never ran: {stats:?}");
    }
}

/// (relative path, mode, uid, gid, size, mtime s, mtime ns, nlink).
type Entry = (PathBuf, u32, u32, u32, u64, i64, i64, u64);

/// Every entry under `root`, sorted.
fn tree(root: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let size = if m.is_dir() { 0 } else { m.size() };
            out.push((
                path.strip_prefix(root).unwrap().to_path_buf(),
                m.mode(),
                m.uid(),
                m.gid(),
                size,
                m.mtime(),
                m.mtime_nsec(),
                m.nlink(),
            ));
            if m.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Fails with just the entries that differ.
fn assert_same_tree(got: &[Entry], want: &[Entry], what: &str) {
    let differ: Vec<_> = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g != w)
        .take(10)
        .collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{what}: {} entries vs {}; (got, want) of the first that differ: {differ:#?}",
        got.len(),
        want.len()
    );
}

#[test]
fn cp_a_of_a_source_tree_round_trips() {
    let volume = Volume::format("4M");
    let (child, guard) = volume.mount();
    let mnt = volume.mountpoint();
    let source = tempfile::tempdir().unwrap();
    let src = source.path().join("tree");
    // A real tree: this crate's and fuse-wire's sources, plus a symlink, a
    // hard link, odd modes and a file with a sub-second mtime.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(workspace.join("fuse-wire"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::create_dir_all(src.join("extra")).unwrap();
    std::fs::write(
        src.join("extra/data.bin"),
        (0..300_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::fs::hard_link(src.join("extra/data.bin"), src.join("extra/hardlink.bin")).unwrap();
    std::os::unix::fs::symlink("../Cargo.toml", src.join("extra/link")).unwrap();
    let sh = |script: String| {
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(
            out.status.success(),
            "`{script}`: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sh(format!("chmod 0751 {0}/extra && chmod 0600 {0}/extra/data.bin && touch -h -d '2001-02-03 04:05:06.789123456' {0}/extra/link {0}/extra/data.bin", src.display()));

    sh(format!("cp -a {} {}/tree", src.display(), mnt.display()));
    sh(format!("diff -r {} {}/tree", src.display(), mnt.display()));
    assert_same_tree(&tree(&mnt.join("tree")), &tree(&src), "inside the mount");

    // Across a remount, then out again.
    unmount(&mnt, child, guard).unwrap();
    let (_child, _guard) = volume.mount();
    let out = source.path().join("back");
    sh(format!("cp -a {}/tree {}", mnt.display(), out.display()));
    sh(format!("diff -r {} {}", src.display(), out.display()));
    assert_same_tree(&tree(&out), &tree(&src), "copied back out");
}
