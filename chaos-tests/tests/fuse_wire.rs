//! fuse-wire on real mounts: serving, adoption of an initialized connection
//! by another process, recovery of a request a killed generation had read
//! (RESEND), answering a journaled request, and stopping between requests.
//!
//! Every test mounts under its own temp dir, unmounts on every path
//! (`MountGuard`), kills its children on drop (`ChildGuard`), and waits for
//! blocked application calls with a deadline; on failure the guard aborts
//! the connection so nothing stays stuck. Needs root and /dev/fuse.
//!
//! Everything that touches the mount while a generation is stalled, dead or
//! changing runs in a child process (`cat`, `baton-testfs workload`): a test
//! thread blocked in the kernel on a FUSE request cannot be cancelled.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos_tests::memfs::{pattern_byte, HELLO, PATTERN_FILE_LEN};
use chaos_tests::mount_guard::{wait_for_mount, wait_until, ChildGuard, MountGuard};
use nix::sys::signal::{kill, Signal};

const DEADLINE: Duration = Duration::from_secs(20);

struct Fixture {
    dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mountpoint");
        Fixture { dir, mnt }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn testfs(&self, args: &[&str]) -> ChildGuard {
        let child = Command::new(env!("CARGO_BIN_EXE_baton-testfs"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn baton-testfs");
        ChildGuard(child)
    }

    fn holder(&self, extra: &[&str]) -> (ChildGuard, MountGuard, PathBuf) {
        let socket = self.path("holder.sock");
        let mut args = vec!["holder", "--mount", s(&self.mnt), "--socket", s(&socket)];
        args.extend_from_slice(extra);
        let holder = self.testfs(&args);
        assert!(wait_for_mount(&self.mnt, DEADLINE), "holder did not mount");
        assert!(
            wait_until(DEADLINE, || socket.exists()),
            "holder socket missing"
        );
        let guard = MountGuard::new(&self.mnt);
        (holder, guard, socket)
    }
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn expected_pattern() -> Vec<u8> {
    (0..PATTERN_FILE_LEN as u64).map(pattern_byte).collect()
}

/// An application reading a whole file with `cat` in its own process.
struct App {
    child: ChildGuard,
    out: PathBuf,
}

impl App {
    fn read(fx: &Fixture, name: &str) -> App {
        let out = fx.path(&format!("{name}.out"));
        let file = std::fs::File::create(&out).expect("app output file");
        let child = Command::new("cat")
            .arg(fx.mnt.join(name))
            .stdout(file)
            .spawn()
            .expect("spawn cat");
        App {
            child: ChildGuard(child),
            out,
        }
    }

    fn is_blocked(&mut self) -> bool {
        matches!(self.child.0.try_wait(), Ok(None))
    }

    /// Waits for the read to finish and returns what it read.
    fn finish(mut self) -> Vec<u8> {
        let status = self
            .child
            .wait_timeout(DEADLINE)
            .expect("the application's read completes");
        assert!(status.success(), "the application's read failed: {status}");
        std::fs::read(&self.out).expect("app output")
    }
}

fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn shell_commands_work_on_a_mounted_memfs() {
    let fx = Fixture::new();
    let _server = fx.testfs(&["serve", "--mount", s(&fx.mnt)]);
    assert!(wait_for_mount(&fx.mnt, DEADLINE));
    let _guard = MountGuard::new(&fx.mnt);
    let m = s(&fx.mnt);

    assert_eq!(sh(&format!("ls {m}")), "big\nhello\nstall\n");
    assert_eq!(sh(&format!("cat {m}/hello")).as_bytes(), HELLO);
    assert_eq!(
        sh(&format!("stat -c %s {m}/big")),
        format!("{PATTERN_FILE_LEN}\n")
    );
    sh(&format!(
        "echo written > {m}/new && mkdir {m}/dir && mv {m}/new {m}/dir/moved"
    ));
    assert_eq!(sh(&format!("cat {m}/dir/moved")), "written\n");
    assert_eq!(sh(&format!("ls {m}/dir")), "moved\n");
    sh(&format!("rm {m}/dir/moved && rmdir {m}/dir"));
    assert_eq!(sh(&format!("ls {m}")), "big\nhello\nstall\n");
    assert_eq!(
        std::fs::read(fx.mnt.join("big")).expect("read big"),
        expected_pattern()
    );
    let missing = std::fs::metadata(fx.mnt.join("absent")).expect_err("absent file");
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    let not_empty = std::fs::remove_dir(&fx.mnt).expect_err("rmdir of mountpoint root");
    assert!(not_empty.raw_os_error().is_some());
}

/// `baton-testfs workload` in its own process: progress and errors come
/// back through its stdout.
struct Workload {
    child: ChildGuard,
    ops: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    fn start(mnt: &Path, threads: usize) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_baton-testfs"))
            .args([
                "workload",
                "--mount",
                s(mnt),
                "--threads",
                &threads.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn workload");
        let stdout = child.stdout.take().expect("workload stdout");
        let (ops, errors) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (ops2, errors2) = (Arc::clone(&ops), Arc::clone(&errors));
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                match line.strip_prefix("ops ") {
                    Some(n) => ops2.store(n.parse().unwrap_or(0), Ordering::Relaxed),
                    None => errors2.lock().expect("errors").push(line),
                }
            }
        });
        Workload {
            child: ChildGuard(child),
            ops,
            errors,
        }
    }

    fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Waits until `count` more operations completed.
    fn progresses(&self, count: u64) -> bool {
        let start = self.ops();
        wait_until(DEADLINE, || {
            self.ops() >= start + count || !self.errors().is_empty()
        }) && self.errors().is_empty()
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("errors").clone()
    }

    /// Stops it and returns every error it saw.
    fn finish(mut self) -> Vec<String> {
        let exited = self.child.0.try_wait().ok().flatten();
        let mut errors = self.errors();
        if let Some(status) = exited {
            errors.push(format!("workload exited early: {status}"));
        }
        errors
    }
}

#[test]
fn another_process_adopts_an_initialized_connection() {
    let fx = Fixture::new();
    let handoff = fx.path("handoff.sock");
    let mut gen_a = fx.testfs(&[
        "serve",
        "--mount",
        s(&fx.mnt),
        "--handoff",
        s(&handoff),
        "--cache-secs",
        "0",
    ]);
    assert!(wait_for_mount(&fx.mnt, DEADLINE));
    let mut guard = MountGuard::new(&fx.mnt);
    guard.abort_on_drop = true;
    assert!(wait_until(DEADLINE, || handoff.exists()));

    let workload = Workload::start(&fx.mnt, 2);
    assert!(
        workload.progresses(200),
        "workload made no progress under A: {:?}",
        workload.errors()
    );
    let _gen_b = fx.testfs(&["adopt", "--connect", s(&handoff), "--cache-secs", "0"]);
    let status = gen_a
        .wait_timeout(DEADLINE)
        .expect("A exits after the handoff");
    assert!(status.success(), "A exited with {status}");

    assert!(
        workload.progresses(400),
        "B does not serve: {:?}",
        workload.errors()
    );
    let errors = workload.finish();
    assert!(
        errors.is_empty(),
        "the application saw errors across the handoff: {errors:?}"
    );
    assert_eq!(sh(&format!("cat {}/hello", s(&fx.mnt))).as_bytes(), HELLO);
    guard.abort_on_drop = false;
}

#[test]
fn request_read_by_a_killed_generation_is_resent_to_the_next() {
    let fx = Fixture::new();
    let (_holder, mut guard, socket) = fx.holder(&[]);
    guard.abort_on_drop = true;
    let marker = fx.path("stalled");
    let mut gen_b = fx.testfs(&[
        "adopt",
        "--connect",
        s(&socket),
        "--stall",
        "stall",
        "--stall-marker",
        s(&marker),
    ]);

    let mut app = App::read(&fx, "stall");
    assert!(
        wait_until(DEADLINE, || marker.exists()),
        "B never read the request"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        app.is_blocked(),
        "the read finished while its request was stalled"
    );

    kill(gen_b.pid(), Signal::SIGKILL).expect("kill B");
    gen_b.wait_timeout(DEADLINE).expect("B is dead");
    let _gen_c = fx.testfs(&["adopt", "--connect", s(&socket)]);

    assert_eq!(
        app.finish(),
        expected_pattern(),
        "the resent read returned the wrong bytes"
    );
    guard.abort_on_drop = false;
}

#[test]
fn journaled_request_is_answered_by_the_next_generation() {
    let fx = Fixture::new();
    let (_holder, mut guard, socket) = fx.holder(&["--no-resend"]);
    guard.abort_on_drop = true;
    let (marker, journal) = (fx.path("stalled"), fx.path("journal.bin"));
    let mut gen_b = fx.testfs(&[
        "adopt",
        "--connect",
        s(&socket),
        "--stall",
        "stall",
        "--journal",
        s(&journal),
        "--stall-marker",
        s(&marker),
    ]);

    let mut app = App::read(&fx, "stall");
    assert!(
        wait_until(DEADLINE, || marker.exists()),
        "B never journaled the request"
    );
    kill(gen_b.pid(), Signal::SIGUSR1).expect("stop B");
    let status = gen_b
        .wait_timeout(DEADLINE)
        .expect("B stops between requests");
    assert!(status.success(), "B exited with {status}");
    std::thread::sleep(Duration::from_millis(100));
    assert!(app.is_blocked(), "the journaled request was answered by B");

    let _gen_c = fx.testfs(&["adopt", "--connect", s(&socket), "--replay", s(&journal)]);
    assert_eq!(app.finish(), expected_pattern());
    guard.abort_on_drop = false;
}

#[test]
fn stopping_between_requests_loses_no_request() {
    let fx = Fixture::new();
    let (_holder, mut guard, socket) = fx.holder(&["--no-resend"]);
    guard.abort_on_drop = true;
    let serving = [
        "--connect",
        s(&socket),
        "--direct-io",
        "--cache-secs",
        "0",
        "--threads",
        "4",
    ];

    let mut generation = None;
    let workload = Workload::start(&fx.mnt, 4);
    for cycle in 0..8 {
        let mut args = vec!["adopt"];
        args.extend_from_slice(&serving);
        let mut current = fx.testfs(&args);
        assert!(
            workload.progresses(400),
            "cycle {cycle}: the workload stalled or failed: {:?}",
            workload.errors()
        );
        kill(current.pid(), Signal::SIGUSR1).expect("stop generation");
        let status = current.wait_timeout(DEADLINE).expect("generation stops");
        assert!(
            status.success(),
            "cycle {cycle}: generation exited with {status}"
        );
        generation = Some(current);
    }
    drop(generation);
    let mut last = vec!["adopt"];
    last.extend_from_slice(&serving);
    let _final_generation = fx.testfs(&last);
    assert!(
        workload.progresses(400),
        "the final generation does not serve: {:?}",
        workload.errors()
    );
    let errors = workload.finish();
    assert!(errors.is_empty(), "the application saw errors: {errors:?}");
    guard.abort_on_drop = false;
}
