//! One PostgreSQL volume mounted through two fs-supervisors on this machine
//! (two sockets, state dirs, base dirs and mountpoints: two "hosts"): each
//! sees the other's closed files, and when one host's filesystem process is
//! killed with -9 its supervisor hands the mount to a new generation while
//! the other host carries on.
//!
//! Skips loudly without `BATON_TEST_POSTGRES_URL` unless
//! `BATON_REQUIRE_POSTGRES=1` (CI).

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const URL_ENV: &str = "BATON_TEST_POSTGRES_URL";
const DEADLINE: Duration = Duration::from_secs(30);
const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
/// Numbers each host's cgroup parent: tests run in parallel threads of one
/// process, and a host's drop kills every process under its parent.
static HOSTS: AtomicU32 = AtomicU32::new(0);

/// The single value `sql` returns, as text.
fn psql_value(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-qtA", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .expect("psql (postgresql-client)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn psql(url: &str, sql: &str) -> Output {
    Command::new("psql")
        .args(["-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .expect("psql (postgresql-client)")
}

/// One fs-supervisor with its own state, base dir and mountpoint.
struct Host {
    dir: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    supervisor: Option<ChildGuard>,
    guard: Option<MountGuard>,
}

impl Host {
    fn start(root: &Path, name: &str) -> Host {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        let socket = dir.join("supervisor.sock");
        let cgroup_parent = format!(
            "baton-test-pg-{}-{}-{name}",
            std::process::id(),
            HOSTS.fetch_add(1, Ordering::SeqCst)
        );
        let log = std::fs::File::create(dir.join("supervisor.log")).unwrap();
        let child = Command::new(workspace_binary("fs-supervisor"))
            .arg("--client-binary")
            .arg(workspace_binary("fsclient"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--socket")
            .arg(&socket)
            .args(["--cgroup-parent", &cgroup_parent])
            .env("RUST_LOG", "info")
            // Generations inherit it: a dead mount's session expires in 1 s.
            .env("BATON_SESSION_EXPIRY_MS", "1000")
            .stdin(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fs-supervisor (build the workspace first)");
        let host = Host {
            dir,
            socket,
            cgroup_parent,
            supervisor: Some(ChildGuard(child)),
            guard: None,
        };
        assert!(
            wait_until(DEADLINE, || host.socket.exists()),
            "fs-supervisor did not start:\n{}",
            host.logs()
        );
        host
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    fn fsctl(&self, args: &[&str]) -> Output {
        Command::new(workspace_binary("fsctl"))
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("run fsctl")
    }

    fn mount(&mut self, url: &str) {
        let mnt = self.mnt();
        let base = self.dir.join("base");
        let out = self.fsctl(&[
            "mount",
            url,
            mnt.to_str().unwrap(),
            "--base-dir",
            base.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "fsctl mount: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        self.guard = Some(MountGuard::new(&mnt));
    }

    fn status(&self) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        assert!(out.status.success());
        let report: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        report["mounts"][0].clone()
    }

    fn wait_serving(&self, generation: u64) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = self.status();
            if status["state"] == "serving" && status["generation"].as_u64() >= Some(generation) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "generation {generation} never served: {status}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn logs(&self) -> String {
        let mut out = std::fs::read_to_string(self.dir.join("supervisor.log")).unwrap_or_default();
        if let Ok(entries) = std::fs::read_dir(self.dir.join("state/logs")) {
            for entry in entries.flatten() {
                out.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
        out
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.dir.display(), self.logs());
            let _ = fuse_wire::abort_connection(&self.mnt());
        }
        let mnt = self.mnt();
        let _ = self.fsctl(&["umount", mnt.to_str().unwrap_or_default()]);
        if let Some(mut child) = self.supervisor.take() {
            let _ = kill(child.pid(), Signal::SIGTERM);
            let _ = child.wait_timeout(DEADLINE);
        }
        let parent = Path::new(CGROUP_V1_MEMORY).join(&self.cgroup_parent);
        for cgroup in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if cgroup.path().is_dir() {
                let procs =
                    std::fs::read_to_string(cgroup.path().join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = wait_until(Duration::from_secs(5), || {
                    std::fs::remove_dir(cgroup.path()).is_ok()
                });
            }
        }
        let _ = std::fs::remove_dir(parent);
        drop(self.guard.take());
    }
}

/// The admin URL, or None (skipped loudly) without a server.
fn server(test: &str) -> Option<String> {
    let Ok(admin) = std::env::var(URL_ENV) else {
        let required = std::env::var("BATON_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{URL_ENV} is not set but BATON_REQUIRE_POSTGRES=1"
        );
        eprintln!("\n!!!!! SKIPPED {test}: {URL_ENV} is not set; start a server with .ci/start-postgres DIR PORT !!!!!\n");
        return None;
    };
    Some(admin)
}

/// A database formatted as a volume (data in `root`/data), dropped with
/// this value.
struct PgVolume {
    admin: String,
    db: String,
    url: String,
    root: tempfile::TempDir,
}

impl PgVolume {
    fn format(admin: &str, name: &str) -> PgVolume {
        let db = format!("baton_s_{name}_{}", std::process::id());
        assert!(psql(admin, &format!("CREATE DATABASE {db}"))
            .status
            .success());
        let url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
        let vol = PgVolume {
            admin: admin.to_string(),
            db,
            url,
            root: tempfile::tempdir().unwrap(),
        };
        let data = vol.root.path().join("data");
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", "vol", "--meta", &vol.url, "--block-size", "64K"])
            .arg("--storage")
            .arg(format!("file://{}", data.display()))
            .arg("--base-dir")
            .arg(vol.root.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        vol
    }
}

impl Drop for PgVolume {
    fn drop(&mut self) {
        let _ = psql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db),
        );
    }
}

#[test]
fn two_supervised_mounts_share_a_postgres_volume_across_a_generation_kill() {
    let Some(admin) = server("supervised postgres mounts") else {
        return;
    };
    let vol = PgVolume::format(&admin, "share");
    let (url, root) = (&vol.url, &vol.root);

    let mut a = Host::start(root.path(), "a");
    let mut b = Host::start(root.path(), "b");
    a.mount(url);
    b.mount(url);
    a.wait_serving(1);
    b.wait_serving(1);

    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(a.mnt().join("from-a"), &body).unwrap();
    assert!(std::fs::read(b.mnt().join("from-a")).unwrap() == body);
    std::fs::write(b.mnt().join("from-b"), b"written on b").unwrap();
    // Attributes are cached for fsclient's default 1 s: close-to-open holds
    // once that has passed.
    let seen = wait_until(Duration::from_secs(5), || {
        std::fs::read(a.mnt().join("from-b")).is_ok_and(|d| d == b"written on b")
    });
    assert!(seen, "a sees b's file");

    // a has a file open that b unlinks: a's session holds it.
    use std::os::unix::fs::{FileExt, MetadataExt};
    let held_body: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(b.mnt().join("held"), &held_body).unwrap();
    let seen = wait_until(Duration::from_secs(5), || a.mnt().join("held").exists());
    assert!(seen, "a sees b's file");
    let held = std::fs::File::open(a.mnt().join("held")).unwrap();
    let ino = held.metadata().unwrap().ino();
    std::fs::remove_file(b.mnt().join("held")).unwrap();
    let inode_exists = || {
        psql_value(
            url,
            &format!("SELECT count(*) FROM inodes WHERE ino = {ino}"),
        ) == "1"
    };

    // kill -9 of a's filesystem process: its supervisor starts the next
    // generation on the same mount; b is unaffected.
    let pid = a.status()["pid"].as_i64().expect("a serving pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    std::fs::write(b.mnt().join("during"), b"b during a's restart").unwrap();
    a.wait_serving(2);
    assert!(std::fs::read(a.mnt().join("from-a")).unwrap() == body);
    let seen = wait_until(Duration::from_secs(5), || {
        std::fs::read(a.mnt().join("during")).is_ok_and(|d| d == b"b during a's restart")
    });
    assert!(seen, "a's new generation sees b's file");

    // The new generation continued a's session (same connection): after
    // several expiry periods the file a's kernel still has open is intact.
    std::thread::sleep(Duration::from_millis(3_000));
    assert_eq!(psql_value(url, "SELECT count(*) FROM sessions"), "2");
    assert!(
        inode_exists(),
        "the orphan a holds survived the generation kill"
    );
    let mut read = vec![0; held_body.len()];
    held.read_exact_at(&mut read, 0).unwrap();
    assert!(
        read == held_body,
        "a reads the unlinked file whole after the takeover"
    );
    // The handle came from the dead generation, so this one cannot know
    // when the kernel's last handle goes: it keeps the hold until the mount
    // ends; then the orphan is reclaimed.
    drop(held);
    let out = a.fsctl(&["umount", a.mnt().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reclaimed = wait_until(DEADLINE, || !inode_exists());
    assert!(reclaimed, "reclaimed once a's mount ended\n{}", a.logs());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains("postgres://"), "no URL in /proc/mounts");
}

/// A POSIX lock wait through the other host survives a kill -9 of its
/// host's filesystem process: the resent F_SETLKW parks again in the next
/// generation, whose published locks and waits are what the dead one
/// published, so the other host's request closing the cycle is still
/// EDEADLK, and the resent one is granted once that one lets go.
#[test]
fn a_lock_wait_resent_after_a_generation_kill_still_closes_its_cycle_into_edeadlk() {
    let Some(admin) = server("supervised postgres lock cycle") else {
        return;
    };
    let vol = PgVolume::format(&admin, "cycle");
    let mut a = Host::start(vol.root.path(), "a");
    let mut b = Host::start(vol.root.path(), "b");
    a.mount(&vol.url);
    b.mount(&vol.url);
    a.wait_serving(1);
    b.wait_serving(1);
    std::fs::write(a.mnt().join("cycle"), b"").unwrap();
    assert!(wait_until(Duration::from_secs(5), || b
        .mnt()
        .join("cycle")
        .exists()));
    let count = |table: &str| psql_value(&vol.url, &format!("SELECT count(*) FROM {table}"));

    // Process 0 (on a) holds byte 0 and waits for byte 1, held by process
    // 1 (on b); the plan pauses there.
    let control = vol.root.path().join("control");
    std::fs::create_dir(&control).unwrap();
    let files = format!(
        "{},{}",
        a.mnt().join("cycle").display(),
        b.mnt().join("cycle").display()
    );
    let mut plan = ChildGuard(
        Command::new("python3")
            .arg("-c")
            .arg(chaos_tests::LOCK_PLAN)
            .args([&files, "2", "0>1,p,1>0,w1000", "20"])
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3"),
    );
    assert!(
        wait_until(DEADLINE, || control.join("paused").exists()),
        "the plan never paused"
    );
    let published = || (count("locks"), count("lock_waits")) == ("2".into(), "1".into());
    assert!(
        wait_until(DEADLINE, published),
        "before the kill: {} locks, {} waits",
        count("locks"),
        count("lock_waits")
    );

    let pid = a.status()["pid"].as_i64().expect("a serving pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    a.wait_serving(2);
    // The new generation republishes what it holds and what parked again.
    assert!(
        wait_until(DEADLINE, published),
        "after the takeover: {} locks, {} waits\n{}",
        count("locks"),
        count("lock_waits"),
        a.logs()
    );
    std::fs::write(control.join("resume"), b"").unwrap();
    let status = plan
        .wait_timeout(DEADLINE)
        .expect("the lock plan finishes by its deadline");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut plan.0.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "lock plan failed: {out}");
    assert_eq!(
        out.trim(),
        "0:early-granted 1:early-EDEADLK",
        "\n{}",
        a.logs()
    );
    assert!(
        wait_until(DEADLINE, || count("lock_waits") == "0"),
        "a wait row outlived its request"
    );
}
