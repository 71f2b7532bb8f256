//! flock and fcntl locks between processes on a mounted volume: conflicts,
//! release on close, a blocked lock granted when the holder lets go, an
//! interrupted blocking lock, and EDEADLK for a wait that closes a cycle of
//! POSIX lock owners (beside the same sequence on the local disk). Lock
//! holders are child processes (`flock(1)`, python3's fcntl) killed on
//! drop. Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A child that runs `script` with python3 (killed on drop).
fn python(script: &str, args: &[&str]) -> ChildGuard {
    ChildGuard(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn python3"),
    )
}

fn flock_cmd(args: &str) -> ChildGuard {
    ChildGuard(
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec flock {args}"))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn flock"),
    )
}

fn wait_file(path: &Path) {
    assert!(
        wait_until(DEADLINE, || path.exists()),
        "{} never appeared",
        path.display()
    );
}

const HOLD_FLOCK: &str = r#"
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
"#;

#[test]
fn flock_conflicts_and_is_released_on_close() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = m.p("lockfile");
    std::fs::write(&f, b"").unwrap();
    let marker = vol.path("held");
    let holder = python(HOLD_FLOCK, &[s(&f), s(&marker), "60"]);
    wait_file(&marker);
    let (ok, _, _) = sh(&format!("flock -n -x {} -c true", s(&f)));
    assert!(!ok, "an exclusive flock conflicts");
    let (ok, _, _) = sh(&format!("flock -n -s {} -c true", s(&f)));
    assert!(!ok, "a shared flock conflicts with an exclusive one");
    drop(holder); // SIGKILL: the kernel closes its file, RELEASE drops the flock.
    assert!(
        wait_until(DEADLINE, || sh(&format!("flock -n -x {} -c true", s(&f))).0),
        "the flock was released when its holder died"
    );

    // Shared locks coexist.
    let marker2 = vol.path("shared");
    let _reader = flock_cmd(&format!(
        "-s {} -c 'touch {}; sleep 60'",
        s(&f),
        s(&marker2)
    ));
    wait_file(&marker2);
    let (ok, _, err) = sh(&format!("flock -n -s {} -c true", s(&f)));
    assert!(ok, "{err}");
    m.stop();
}

#[test]
fn a_blocked_flock_is_granted_when_the_holder_unlocks() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = m.p("lockfile");
    std::fs::write(&f, b"").unwrap();
    let held = vol.path("held");
    let got = vol.path("got");
    let mut holder = flock_cmd(&format!("-x {} -c 'touch {}; sleep 1'", s(&f), s(&held)));
    wait_file(&held);
    let start = Instant::now();
    let mut waiter = flock_cmd(&format!("-x {} -c 'touch {}'", s(&f), s(&got)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!got.exists(), "the second flock waits");
    let status = holder.wait_timeout(DEADLINE).unwrap();
    assert!(status.success());
    let status = waiter
        .wait_timeout(DEADLINE)
        .expect("the waiter gets the lock");
    assert!(status.success());
    assert!(got.exists());
    assert!(start.elapsed() >= Duration::from_millis(500));
    m.stop();
}

const HOLD_POSIX: &str = r#"
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)   # bytes 0..99
fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 100, 200) # bytes 200..299
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
"#;

const PROBE_POSIX: &str = r#"
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
def conflict(kind, start, length):
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
        fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
        return "free"
    except OSError as e:
        return "busy"
out = [
    conflict(fcntl.LOCK_EX, 50, 10),
    conflict(fcntl.LOCK_SH, 50, 10),
    conflict(fcntl.LOCK_EX, 100, 100),
    conflict(fcntl.LOCK_SH, 250, 10),
    conflict(fcntl.LOCK_EX, 250, 10),
]
# F_GETLK names the holder.
lk = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 10, 0)
res = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, lk))
out.append("getlk type=%d start=%d len=%d pid=%d" % (res[0], res[2], res[3], res[4]))
print(" ".join(out[:5]))
print(out[5])
"#;

#[test]
fn posix_locks_conflict_by_range_and_type_and_getlk_names_the_holder() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let f = m.p("ranges");
    std::fs::write(&f, vec![0u8; 400]).unwrap();
    let marker = vol.path("held");
    let holder = python(HOLD_POSIX, &[s(&f), s(&marker), "60"]);
    wait_file(&marker);
    let out = Command::new("python3")
        .arg("-c")
        .arg(PROBE_POSIX)
        .arg(s(&f))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("busy busy free free busy"));
    let getlk = lines.next().unwrap();
    assert!(
        getlk.starts_with("getlk type=1 start=0 len=100 pid="),
        "{getlk}"
    );
    assert!(
        getlk.ends_with(&format!("pid={}", holder.0.id())),
        "{getlk}"
    );
    drop(holder);
    m.stop();
}

const WAIT_POSIX: &str = r#"
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)   # blocks (F_SETLKW) until free
open(sys.argv[2], "w").close()
"#;

const INTERRUPTED_POSIX: &str = r#"
import fcntl, os, signal, sys
class Alarm(Exception):
    pass
def on_alarm(signum, frame):
    raise Alarm()
signal.signal(signal.SIGALRM, on_alarm)
fd = os.open(sys.argv[1], os.O_RDWR)
signal.alarm(1)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
    print("granted")
except Alarm:
    print("interrupted")
"#;

#[test]
fn a_blocking_posix_lock_waits_without_a_worker_and_is_granted_on_close() {
    let vol = Volume::new();
    // One worker thread: a parked SETLKW must not occupy it.
    let m = vol.mount_with(&vol.mountpoint("mnt"), &["--threads", "1"]);
    let f = m.p("w");
    std::fs::write(&f, b"").unwrap();
    let held = vol.path("held");
    let holder = python(HOLD_POSIX, &[s(&f), s(&held), "60"]);
    wait_file(&held);

    let out = Command::new("python3")
        .arg("-c")
        .arg(INTERRUPTED_POSIX)
        .arg(s(&f))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "interrupted");

    let got = vol.path("got");
    let mut waiter = python(WAIT_POSIX, &[s(&f), s(&got)]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!got.exists(), "the lock waits");
    // The server still answers other requests meanwhile.
    std::fs::write(m.p("other"), b"still served").unwrap();
    assert_eq!(std::fs::read(m.p("other")).unwrap(), b"still served");
    drop(holder); // its close (FLUSH with its lock owner) drops its locks
    let status = waiter
        .wait_timeout(DEADLINE)
        .expect("the waiter is granted");
    assert!(status.success());
    assert!(got.exists());
    m.stop();
}

/// Runs [`chaos_tests::LOCK_PLAN`] on `file`; its output.
fn lock_plan(file: &Path, processes: usize, plan: &str) -> String {
    let mut child = ChildGuard(
        Command::new("python3")
            .arg("-c")
            .arg(chaos_tests::LOCK_PLAN)
            .args([s(file), &processes.to_string(), plan, "5"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3"),
    );
    let status = child
        .wait_timeout(DEADLINE)
        .expect("the lock plan finishes by its deadline");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "lock plan {plan:?} failed: {out}");
    out.trim().to_string()
}

/// `plan` on a file of the mount and on one of the local disk: the same
/// answers, and `expected`.
fn same_as_local(vol: &Volume, m: &Mounted, processes: usize, plan: &str, expected: &str) {
    let local = vol.path("local-lockfile");
    std::fs::write(&local, b"").unwrap();
    assert_eq!(lock_plan(&local, processes, plan), expected, "local disk");
    let on_mount = m.p("lockfile");
    std::fs::write(&on_mount, b"").unwrap();
    assert_eq!(lock_plan(&on_mount, processes, plan), expected, "the mount");
}

#[test]
fn a_posix_wait_closing_a_cycle_of_two_processes_is_edeadlk_and_the_other_is_granted() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // 0 waits for 1's byte; 1 asking for 0's closes the cycle: EDEADLK,
    // and its close grants 0.
    same_as_local(&vol, &m, 2, "0>1,1>0", "0:granted 1:EDEADLK");
    m.stop();
}

#[test]
fn a_posix_wait_closing_a_cycle_of_three_processes_is_edeadlk() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    same_as_local(&vol, &m, 3, "0>1,1>2,2>0", "0:granted 1:granted 2:EDEADLK");
    m.stop();
}

#[test]
fn posix_waits_without_a_cycle_wait_until_granted() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // 0 waits for 1 (which waits for nobody), 2 waits for 0: a chain.
    // Nothing is answered for 500 ms; 1's close grants 0, 0's grants 2.
    same_as_local(&vol, &m, 3, "0>1,2>0,w500,r1", "0:granted 2:granted");
    m.stop();
}
