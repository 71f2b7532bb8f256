//! Orphans (files unlinked while open) under a supervised mount whose
//! generations are killed with -9: the generation that adopts the dead
//! one's open files reclaims each orphan once its last file is closed; a
//! clean `fsctl umount` after such takeovers leaves none; and what a crash
//! of the whole mount (supervisor and generation) left is reclaimed within
//! seconds of the next mount, which serves meanwhile.
//!
//! Build the binaries first: `cargo build -p fsclient -p supervisor -p
//! fsctl`. Needs root, /dev/fuse and a memory cgroup. Every test has its
//! own supervisor, state dir, socket, volume and cgroup parent; on drop the
//! supervisor is stopped (it unmounts), what is left in the cgroups is
//! killed and the mount is detached. Everything done on the mount runs in
//! child processes (`bash`, `sh`). The session expiry is left at its
//! default (30 s), as in production.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);
const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
/// How long orphans whose files are all closed may take to go.
const RECLAIM_BOUND: Duration = Duration::from_secs(5);
static FIXTURES: AtomicU32 = AtomicU32::new(0);

fn binary(name: &str) -> PathBuf {
    let path = workspace_binary(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p fsclient -p supervisor -p fsctl` first",
        path.display()
    );
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// A formatted volume, one fs-supervisor (`start_supervisor`) and a mountpoint.
struct Fixture {
    dir: tempfile::TempDir,
    base: PathBuf,
    mnt: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    supervisor: Option<ChildGuard>,
    guard: Option<MountGuard>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().join("base");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mountpoint");
        let out = Command::new(binary("fsctl"))
            .args(["format", "vol", "--base-dir", s(&base)])
            .args(["--block-size", "64K"])
            .output()
            .expect("fsctl format");
        assert!(
            out.status.success(),
            "format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cgroup_parent = format!(
            "baton-test-orphans-{}-{}",
            std::process::id(),
            FIXTURES.fetch_add(1, Ordering::SeqCst)
        );
        let mut fixture = Fixture {
            socket: dir.path().join("supervisor.sock"),
            dir,
            base,
            mnt,
            cgroup_parent,
            supervisor: None,
            guard: None,
        };
        fixture.start_supervisor("state");
        fixture
    }

    /// Starts fs-supervisor on state directory `state` and waits for its
    /// socket.
    fn start_supervisor(&mut self, state: &str) {
        let _ = std::fs::remove_file(&self.socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("supervisor.log"))
            .expect("log");
        let child = Command::new(binary("fs-supervisor"))
            .args(["--client-binary", s(&binary("fsclient"))])
            .args(["--state-dir", s(&self.dir.path().join(state))])
            .args(["--socket", s(&self.socket)])
            .args(["--cgroup-parent", &self.cgroup_parent])
            .env(
                "RUST_LOG",
                std::env::var("BATON_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fs-supervisor");
        self.supervisor = Some(ChildGuard(child));
        assert!(
            wait_until(DEADLINE, || self.socket.exists()),
            "fs-supervisor did not start:\n{}",
            self.logs()
        );
    }

    fn fsctl(&self, args: &[&str]) -> Output {
        Command::new(binary("fsctl"))
            .args(args)
            .args(["--socket", s(&self.socket)])
            .output()
            .expect("run fsctl")
    }

    fn mount(&mut self) {
        drop(self.guard.take());
        let out = self.fsctl(&["mount", "vol", s(&self.mnt), "--base-dir", s(&self.base)]);
        assert!(
            out.status.success(),
            "fsctl mount failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        self.guard = Some(MountGuard::new(&self.mnt));
    }

    fn umount(&mut self) {
        let out = self.fsctl(&["umount", s(&self.mnt)]);
        assert!(
            out.status.success(),
            "fsctl umount failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        let gone = wait_until(DEADLINE, || {
            self.status_report()["mounts"]
                .as_array()
                .is_some_and(|m| m.is_empty())
        });
        assert!(gone, "the mount is still listed\n{}", self.logs());
        drop(self.guard.take());
    }

    fn status_report(&self) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    fn status(&self) -> Value {
        self.status_report()["mounts"][0].clone()
    }

    fn active_pid(&self) -> i32 {
        self.status()["pid"].as_i64().expect("a serving pid") as i32
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
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the serving generation with -9 and waits for the next one.
    fn kill_generation(&self, next: u64) {
        kill(Pid::from_raw(self.active_pid()), Signal::SIGKILL).unwrap();
        self.wait_serving(next);
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("supervisor.log")).unwrap_or_default()
    }

    fn meta_count(&self, table: &str) -> i64 {
        let db = rusqlite::Connection::open(self.base.join("vol/meta.db")).expect("open meta.db");
        db.busy_timeout(DEADLINE).expect("busy timeout");
        db.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .expect("count")
    }

    fn orphans(&self) -> i64 {
        self.meta_count("orphans")
    }

    /// Objects in the volume's storage (every file here has at least one).
    fn objects(&self) -> usize {
        std::fs::read_dir(self.base.join("vol/data/blocks"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|d| std::fs::read_dir(d.path()).map(|f| f.count()).unwrap_or(0))
            .sum()
    }

    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for root in [
            PathBuf::from(CGROUP_V1_MEMORY),
            PathBuf::from("/sys/fs/cgroup"),
        ] {
            let parent = root.join(&self.cgroup_parent);
            if let Ok(entries) = std::fs::read_dir(&parent) {
                dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        dirs
    }

    /// SIGKILL of every generation process (the cgroups the supervisor
    /// made for them).
    fn kill_generations(&self) {
        for cgroup in self.cgroup_dirs() {
            let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    /// A whole-mount crash: kill -9 of the supervisor and of every
    /// generation; the connection ends, the mount point is detached.
    fn crash(&mut self) {
        if let Some(mut supervisor) = self.supervisor.take() {
            let _ = supervisor.0.kill();
            let _ = supervisor.0.wait();
        }
        self.kill_generations();
        for cgroup in self.cgroup_dirs() {
            let _ = wait_until(Duration::from_secs(5), || {
                std::fs::remove_dir(&cgroup).is_ok()
            });
        }
        drop(self.guard.take());
    }

    /// Runs `script` with sh in the mount (a child process).
    fn sh(&self, script: &str) -> Output {
        let mut child = ChildGuard(
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .current_dir(&self.mnt)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn sh"),
        );
        let status = child.wait_timeout(DEADLINE);
        assert!(status.is_some(), "`{script}` did not finish");
        let mut out = Output {
            status: status.unwrap(),
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        // Read after the exit: the scripts here print less than a pipe holds.
        if let Some(mut o) = child.0.stdout.take() {
            let _ = std::io::Read::read_to_end(&mut o, &mut out.stdout);
        }
        if let Some(mut e) = child.0.stderr.take() {
            let _ = std::io::Read::read_to_end(&mut e, &mut out.stderr);
        }
        out
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            let _ = fuse_wire::abort_connection(&self.mnt);
        }
        if let Some(mut supervisor) = self.supervisor.take() {
            let _ = kill(supervisor.pid(), Signal::SIGTERM);
            let _ = supervisor.wait_timeout(DEADLINE);
        }
        self.kill_generations();
        for cgroup in self.cgroup_dirs() {
            let _ = wait_until(Duration::from_secs(5), || {
                std::fs::remove_dir(&cgroup).is_ok()
            });
        }
        for root in [
            PathBuf::from(CGROUP_V1_MEMORY),
            PathBuf::from("/sys/fs/cgroup"),
        ] {
            let _ = std::fs::remove_dir(root.join(&self.cgroup_parent));
        }
        drop(self.guard.take());
    }
}

/// A bash process in the mount holding `count` files open that it wrote
/// (`bytes` each) and unlinked: orphans until it closes them.
struct Holder {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Holder {
    fn start(mnt: &Path, prefix: &str, count: u32, bytes: usize) -> Holder {
        let script = r#"ulimit -n 4096 || exit 1
            body=$(head -c "$3" /dev/zero | tr '\0' x)
            i=0
            while [ $i -lt "$2" ]; do
                printf %s "$body" > "$1$i" || exit 1
                exec {fd}<"$1$i" || exit 1
                rm "$1$i" || exit 1
                i=$((i+1))
            done
            echo ready
            read -r _
        "#;
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("holder")
            .arg(prefix)
            .arg(count.to_string())
            .arg(bytes.to_string())
            .current_dir(mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn bash");
        let stdout = child.stdout.take().expect("stdout");
        let holder = Holder {
            child: Some(child),
            mnt: mnt.to_path_buf(),
        };
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        assert_eq!(line.trim(), "ready", "the holder did not open its files");
        holder
    }

    /// Closes every file (the process exits).
    fn close(mut self) {
        let mut child = self.child.take().expect("holder");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let mut guard = ChildGuard(child);
        let status = guard.wait_timeout(DEADLINE);
        assert!(
            status.is_some_and(|s| s.success()),
            "the holder did not exit cleanly: {status:?}"
        );
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        if !wait_until(Duration::from_secs(2), || {
            matches!(child.try_wait(), Ok(Some(_)))
        }) {
            let _ = fuse_wire::abort_connection(&self.mnt);
        }
        let _ = child.wait();
    }
}

/// Waits up to `limit` for no orphan and no object; returns how long it
/// took, or `None`.
fn reclaimed_within(fx: &Fixture, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    wait_until(limit, || fx.orphans() == 0 && fx.objects() == 0).then(|| started.elapsed())
}

#[test]
fn orphans_open_across_a_kill_are_reclaimed_when_the_next_generation_sees_them_closed() {
    let mut fx = Fixture::new();
    fx.mount();
    fx.wait_serving(1);
    // Past the inline limit (16 KiB): each file's data is an object.
    let holder = Holder::start(&fx.mnt, "held", 200, 20_000);
    // Read from outside: the metadata commits a few ms after the replies.
    assert!(
        wait_until(DEADLINE, || fx.orphans() == 200),
        "200 files unlinked while open, {} orphan(s) in the metadata",
        fx.orphans()
    );
    assert!(fx.objects() >= 200, "their data is kept");

    fx.kill_generation(2);
    holder.close();
    let took = reclaimed_within(&fx, RECLAIM_BOUND);
    eprintln!(
        "orphans left {:?} after the close: {} (objects {})",
        took,
        fx.orphans(),
        fx.objects()
    );
    assert!(
        took.is_some(),
        "the adopting generation reclaims the orphans once their files are closed: {} orphan(s), {} object(s) left after {RECLAIM_BOUND:?}",
        fx.orphans(),
        fx.objects()
    );
    let out = fx.sh("echo after > after && cat after");
    assert!(out.status.success(), "the mount serves on");
    fx.umount();
}

#[test]
fn a_clean_umount_after_takeovers_leaves_no_orphan() {
    let mut fx = Fixture::new();
    fx.mount();
    fx.wait_serving(1);
    let mut holders = Vec::new();
    for round in 0..4u64 {
        // Past the inline limit: an object per held orphan.
        holders.push(Holder::start(&fx.mnt, &format!("r{round}-"), 100, 20_000));
        // Files closed before they are unlinked: no orphan at all.
        let out = fx.sh(&format!(
            "i=0; while [ $i -lt 50 ]; do echo closed > c{round}-$i; rm c{round}-$i; i=$((i+1)); done"
        ));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The timer thread deletes the closed files' objects a moment
        // after their unlinks: a kill between its transaction and the
        // deletes leaves those objects as garbage (`fsctl gc`'s to
        // delete), not what this test is about. Kill once they are gone:
        // every object left belongs to a held orphan.
        let settled = wait_until(DEADLINE, || fx.objects() as i64 == fx.orphans());
        assert!(
            settled,
            "the closed files' objects were not deleted: {} object(s), {} orphan(s)",
            fx.objects(),
            fx.orphans()
        );
        fx.kill_generation(round + 2);
        // The previous round's files close in this generation.
        if round % 2 == 1 {
            for holder in holders.drain(..) {
                holder.close();
            }
        }
    }
    for holder in holders.drain(..) {
        holder.close();
    }
    let before = fx.orphans();
    fx.umount();
    let left = fx.orphans();
    eprintln!("orphans before the umount: {before}, after: {left}");
    assert_eq!(
        left,
        0,
        "a clean umount leaves no orphan no file holds ({} object(s) left)",
        fx.objects()
    );
    assert_eq!(
        fx.objects(),
        0,
        "every object of the unlinked files is gone"
    );
}

#[test]
fn orphans_a_crashed_mount_left_are_reclaimed_seconds_into_the_next_mount() {
    const COUNT: u32 = 2_000;
    let mut fx = Fixture::new();
    fx.mount();
    fx.wait_serving(1);
    let holder = Holder::start(&fx.mnt, "crash", COUNT, 2_000);
    assert_eq!(fx.orphans(), i64::from(COUNT));
    // Supervisor and generations die; the files' last holder goes with them.
    fx.crash();
    drop(holder);
    assert_eq!(fx.orphans(), i64::from(COUNT), "the crash left them");

    fx.start_supervisor("state-after-crash");
    let mounting = Instant::now();
    fx.mount();
    let out = fx.sh("echo fresh > fresh && cat fresh >/dev/null && rm fresh && ls >/dev/null");
    let first_answer = mounting.elapsed();
    assert!(
        out.status.success(),
        "the new mount serves: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = reclaimed_within(&fx, Duration::from_secs(120));
    eprintln!(
        "mount + first requests {first_answer:?}; {COUNT} orphans reclaimed {took:?} after (left {})",
        fx.orphans()
    );
    assert!(
        first_answer < Duration::from_secs(5),
        "the new mount answers at once ({first_answer:?})"
    );
    let took = took.expect("the orphans are reclaimed at all");
    assert!(
        took < RECLAIM_BOUND,
        "the next mount reclaims what the crash left within {RECLAIM_BOUND:?}, not {took:?}"
    );
    fx.umount();
}

/// The bytes `df` says the mount uses (a STATFS).
fn df_used_bytes(fx: &Fixture, script_before: &str) -> u64 {
    let out = fx.sh(&format!("{script_before} df -B1 --output=used . | tail -1"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("df printed {text:?}"))
}

/// Files nobody has open are reclaimed in a pause between requests, and
/// within the queue's bound (10 s) under requests that never pause; `df`
/// right after an `rm` shows their space back either way.
#[test]
fn files_removed_under_load_are_freed_for_df_at_once_and_reclaimed_within_the_bound() {
    let mut fx = Fixture::new();
    fx.mount();
    fx.wait_serving(1);
    // Requests that hardly pause: each round opens, truncates, writes and
    // closes a file on the mount.
    let _busy = ChildGuard(
        Command::new("sh")
            .arg("-c")
            .arg("while :; do echo x > busy; done")
            .current_dir(&fx.mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the busy loop"),
    );
    // Past the inline limit: an object each.
    let write = "i=0; while [ $i -lt 100 ]; do head -c 100000 /dev/zero > big$i || exit 1; i=$((i+1)); done;";
    let before = df_used_bytes(&fx, "");
    let written = df_used_bytes(&fx, write);
    assert!(
        written >= before + 9_000_000,
        "100 files of 100 kB count: {before} bytes used before, {written} after"
    );
    let after = df_used_bytes(&fx, "rm big* &&");
    assert!(
        after < before + 1_000_000,
        "df right after the rm shows the space back: {before} bytes used before the files, {written} with them, {after} after the rm"
    );
    assert_eq!(fx.orphans(), 0, "the STATFS reclaimed them");

    // The same files removed with no STATFS after: the queue waits for a
    // pause, at most 10 s.
    let out = fx.sh(&format!("{write} rm big*"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = reclaimed_within(&fx, Duration::from_secs(20));
    eprintln!("reclaimed under load after {took:?}");
    assert!(
        took.is_some(),
        "unlinked files are reclaimed within the queue's bound under load: {} orphan(s), {} object(s) left after 20 s",
        fx.orphans(),
        fx.objects()
    );
    fx.umount();
}
