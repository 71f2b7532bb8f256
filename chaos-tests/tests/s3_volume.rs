//! A volume whose data lives in S3 (a real S3-compatible server, moto,
//! started per test on 127.0.0.1): the data-path checks the local backend
//! runs (write, read, fsync, remount, kill -9 with staged data, the
//! exerciser), multipart upload of large blocks, and bad storage (missing
//! bucket, refused credentials, unreachable endpoint) failing format and
//! mount with a clear message, a non-zero exit and no mount left.
//!
//! Skips loudly when `moto_server` is not installed, unless
//! `BATON_REQUIRE_S3=1` (CI), which makes that a failure.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chaos_tests::fsx::{run, FsxConfig};
use chaos_tests::mount_guard::{workspace_binary, ChildGuard, MountGuard};
use chaos_tests::s3_server::{S3Server, S3_TEST_ACCESS_KEY_ID, S3_TEST_SECRET_ACCESS_KEY};
use chaos_tests::staged::staged_inodes;

const BUCKET: &str = "baton-test";
const PREFIX: &str = "volumes/vol";
const DEADLINE: Duration = Duration::from_secs(30);

/// A volume formatted on S3, with its base dir and mountpoint.
struct S3Volume {
    dir: tempfile::TempDir,
}

fn with_credentials(command: &mut Command) -> &mut Command {
    command
        .env("AWS_ACCESS_KEY_ID", S3_TEST_ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", S3_TEST_SECRET_ACCESS_KEY)
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env_remove("AWS_PROFILE")
}

/// Runs a workspace binary to completion within the deadline.
fn run_binary(name: &str, args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = with_credentials(&mut Command::new(workspace_binary(name)))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the binary (build the workspace first)");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{name} {args:?} did not exit within {DEADLINE:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (child.wait_with_output().unwrap(), started.elapsed())
}

fn fsctl_format(base: &Path, storage: &str, endpoint: &str, block_size: &str) -> Output {
    let args = [
        "format",
        "vol",
        "--base-dir",
        base.to_str().unwrap(),
        "--storage",
        storage,
        "--s3-endpoint",
        endpoint,
        "--block-size",
        block_size,
    ];
    run_binary("fsctl", &args).0
}

impl S3Volume {
    fn format(server: &S3Server, block_size: &str) -> S3Volume {
        server.create_bucket(BUCKET);
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("s3://{BUCKET}/{PREFIX}");
        let out = fsctl_format(dir.path(), &storage, &server.endpoint(), block_size);
        assert!(
            out.status.success(),
            "fsctl format on S3 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        fs::create_dir_all(dir.path().join("mnt")).unwrap();
        S3Volume { dir }
    }

    fn base(&self) -> &Path {
        self.dir.path()
    }

    fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn staged_inodes(&self) -> usize {
        staged_inodes(&self.base().join("vol/staging"))
    }

    fn mount(&self) -> Mounted {
        let mnt = self.mountpoint();
        let mut child = ChildGuard(
            with_credentials(&mut Command::new(workspace_binary("fsclient")))
                .arg("mount")
                .arg("vol")
                .arg(&mnt)
                .arg("--base-dir")
                .arg(self.base())
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn fsclient"),
        );
        let up = chaos_tests::mount_guard::wait_until(DEADLINE, || {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("fsclient exited before mounting: {status}");
            }
            fuse_wire::connection_id(&mnt).is_ok()
        });
        assert!(up, "fsclient did not mount {}", mnt.display());
        let guard = MountGuard::new(&mnt);
        Mounted { guard, child, mnt }
    }
}

struct Mounted {
    guard: MountGuard,
    child: ChildGuard,
    mnt: PathBuf,
}

impl Mounted {
    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// SIGTERM: fsclient flushes, unmounts and exits 0.
    fn stop(mut self) {
        nix::sys::signal::kill(self.child.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait_timeout(DEADLINE).expect("fsclient exits");
        assert!(status.success(), "fsclient exit status {status}");
        drop(self.guard);
    }

    /// SIGKILL, then detach the dead mount.
    fn kill9(mut self) {
        self.child.0.kill().unwrap();
        self.child.0.wait().unwrap();
        fuse_wire::unmount(&self.mnt).unwrap();
        drop(self.guard);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

#[test]
fn data_on_s3_survives_fsync_remount_and_kill_9_with_staged_writes() {
    let logs = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start_or_skip("s3 data path", logs.path(), false) else {
        return;
    };
    let vol = S3Volume::format(&server, "256K");
    let m = vol.mount();
    let big = pattern(1_500_007, 1);
    fs::write(m.p("big"), &big).unwrap();
    fs::create_dir_all(m.p("a/b")).unwrap();
    let f = File::create(m.p("a/b/synced")).unwrap();
    f.write_all_at(b"fsynced bytes", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("big")).unwrap(), big);
    let objects = server.list_keys(BUCKET, &format!("{PREFIX}/blocks/"));
    assert!(
        objects.len() >= 6,
        "1.5 MB in 256K blocks are objects in the bucket: {objects:?}"
    );
    m.stop();

    // Remount: everything comes back from S3 (the cache is dropped too).
    fs::remove_dir_all(vol.base().join("vol/cache")).unwrap();
    let m = vol.mount();
    assert_eq!(fs::read(m.p("big")).unwrap(), big);
    assert_eq!(fs::read(m.p("a/b/synced")).unwrap(), b"fsynced bytes");

    // kill -9 with acknowledged writes only staged (O_DIRECT: write(2)
    // returned after fsclient acknowledged the WRITE).
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("direct"))
        .unwrap();
    let direct_data = pattern(600_000, 3);
    direct.write_all_at(&direct_data, 0).unwrap();
    assert!(vol.staged_inodes() >= 1, "the data is staged");
    m.kill9();
    drop(direct);

    let m = vol.mount();
    assert_eq!(fs::read(m.p("direct")).unwrap(), direct_data);
    assert_eq!(
        vol.staged_inodes(),
        0,
        "recovery uploaded and cleared staging"
    );
    assert_eq!(fs::read(m.p("big")).unwrap(), big);
    m.stop();
    let objects_after_recovery = server.list_keys(BUCKET, &format!("{PREFIX}/blocks/")).len();

    // fsck and gc list the bucket through the prefix: consistent, and a
    // planted leftover (an uncommitted upload) is found and deleted.
    let base = vol.base().to_str().unwrap();
    let (out, _) = run_binary("fsctl", &["fsck", "vol", "--base-dir", base]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && said.contains("0 missing or short"),
        "{said}"
    );
    let leftover = format!("{PREFIX}/blocks/00000000000000ff/00000000-00000000deadbeef");
    server.put_empty_object(BUCKET, &leftover);
    let gc = ["gc", "vol", "--min-age-secs", "0", "--base-dir", base];
    let (out, _) = run_binary("fsctl", &gc);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && said.contains("deleted 1 of 1"),
        "{said}"
    );
    let keys = server.list_keys(BUCKET, &format!("{PREFIX}/blocks/"));
    assert!(!keys.contains(&leftover), "the leftover is gone");
    assert_eq!(keys.len(), objects_after_recovery, "live objects stay");
}

#[test]
fn exerciser_agrees_with_a_plain_directory_on_s3_across_a_remount() {
    let logs = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start_or_skip("s3 exerciser", logs.path(), false) else {
        return;
    };
    let ops = std::env::var("BATON_S3_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    let vol = S3Volume::format(&server, "64K");
    let reference = tempfile::tempdir().unwrap();
    let mnt = vol.mountpoint();
    let mut mounted = Some(vol.mount());
    let mut remount = || {
        let m = mounted.take().ok_or("not mounted")?;
        m.stop();
        mounted = Some(vol.mount());
        Ok(())
    };
    // Every kind of operation the exerciser has (every fallocate mode,
    // copy_file_range, O_TMPFILE, ACLs), COLLAPSE_RANGE and INSERT_RANGE
    // expected to be refused with EOPNOTSUPP.
    let config = FsxConfig {
        file_len_max: 2 << 20,
        io_len_max: 200 << 10,
        remount_at: Some(ops / 2),
        ..FsxConfig::every_op(0x53_b470, ops)
    };
    if let Err(failure) = run(&config, &mnt, reference.path(), &mut remount) {
        panic!("{failure}");
    }
    if let Some(m) = mounted.take() {
        m.stop();
    }
}

#[test]
fn large_blocks_upload_to_s3_in_parts_and_read_back() {
    let logs = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start_or_skip("s3 multipart", logs.path(), false) else {
        return;
    };
    // 24 MiB blocks: past the 16 MiB multipart threshold.
    let vol = S3Volume::format(&server, "24M");
    let m = vol.mount();
    let data = pattern(30 << 20, 7);
    fs::write(m.p("large"), &data).unwrap();
    m.stop();
    let log = server.log_text();
    assert!(
        log.contains("?uploads"),
        "a multipart upload was started (CreateMultipartUpload); server log:\n{}",
        &log[log.len().saturating_sub(3000)..]
    );
    assert!(log.contains("partNumber="), "parts were uploaded");
    fs::remove_dir_all(vol.base().join("vol/cache")).unwrap();
    let m = vol.mount();
    assert!(fs::read(m.p("large")).unwrap() == data, "read back whole");
    m.stop();
}

fn assert_refused(out: &Output, took: Duration, what: &str, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: succeeded");
    for needle in says {
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} not in:\n{stderr}"
        );
    }
    assert!(took < Duration::from_secs(25), "{what}: took {took:?}");
}

#[test]
fn bad_s3_storage_fails_format_and_mount_clearly_and_leaves_no_mount() {
    let logs = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start_or_skip("s3 bad input", logs.path(), false) else {
        return;
    };
    let Some(strict) = S3Server::start_or_skip("s3 bad credentials", logs.path(), true) else {
        return;
    };
    let base = tempfile::tempdir().unwrap();
    let endpoint = server.endpoint();
    let format = |storage: &str, endpoint: &str| {
        let started = Instant::now();
        let out = fsctl_format(base.path(), storage, endpoint, "1M");
        (out, started.elapsed())
    };

    let (out, took) = format("s3://no-such-bucket/p", &endpoint);
    assert_refused(&out, took, "missing bucket", &["NoSuchBucket", "create it"]);
    let (out, took) = format(&format!("s3://{BUCKET}/p"), &strict.endpoint());
    assert_refused(
        &out,
        took,
        "refused credentials",
        &["InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"],
    );
    let closed = chaos_tests::s3_server::free_port().unwrap();
    let (out, took) = format(
        &format!("s3://{BUCKET}/p"),
        &format!("http://127.0.0.1:{closed}"),
    );
    assert_refused(
        &out,
        took,
        "unreachable endpoint",
        &["Connection refused", "endpoint does not answer"],
    );
    assert!(
        !base.path().join("vol/meta.db").exists(),
        "a failed format writes no metadata"
    );

    // A formatted volume whose server went away: mount fails before mount(2).
    let vol = S3Volume::format(&server, "1M");
    server.stop();
    let mnt = vol.mountpoint();
    let (out, took) = run_binary(
        "fsclient",
        &[
            "mount",
            "vol",
            mnt.to_str().unwrap(),
            "--base-dir",
            vol.base().to_str().unwrap(),
        ],
    );
    let _guard = MountGuard::new(&mnt);
    assert_refused(
        &out,
        took,
        "mount with the server gone",
        &["does not answer", "Connection refused"],
    );
    assert!(
        fuse_wire::connection_id(&mnt).is_err(),
        "nothing is mounted after a refused mount"
    );
    // The mount-time endpoint flag points it at a live server (which lacks
    // the bucket): the flag is used, and the error says so.
    let other = S3Server::start_or_skip("s3 endpoint override", logs.path(), false).unwrap();
    let (out, took) = run_binary(
        "fsclient",
        &[
            "mount",
            "vol",
            mnt.to_str().unwrap(),
            "--base-dir",
            vol.base().to_str().unwrap(),
            "--s3-endpoint",
            &other.endpoint(),
        ],
    );
    assert_refused(&out, took, "mount with --s3-endpoint", &["NoSuchBucket"]);
    assert!(fuse_wire::connection_id(&mnt).is_err());
}
