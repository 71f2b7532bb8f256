//! The shipped unit (`deploy/systemd/fs-supervisor.service`) under a real
//! systemd: `systemd --user` runs without systemd as PID 1 inside
//! `unshare --mount --propagation private` with a tmpfs on /run/systemd
//! holding an empty `system/` directory. A drop-in only points ExecStart at
//! the built binaries and this test's directories. `systemctl start`
//! returns once READY=1 came; the mount's /dev/fuse fd is in the fd store;
//! after a kill -9 of the service, systemd restarts it with the fd, the new
//! supervisor adopts the mount and a reader on it the whole time sees no
//! error; after `systemctl stop` + `start` (the store is emptied on stop)
//! the fd is copied from the still-serving generation; `fsctl umount`
//! empties the store.
//!
//! Needs root, /dev/fuse, systemd (Debian package `systemd`), unshare and
//! nsenter (util-linux); build the binaries first (`cargo build --workspace`).

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);
const UNIT: &str = "fs-supervisor.service";

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn binary(name: &str) -> PathBuf {
    let path = workspace_binary(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` first",
        path.display()
    );
    path
}

fn shipped_unit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/systemd")
        .join(UNIT)
}

/// A `systemd --user` manager in its own mount namespace.
struct Manager {
    dir: tempfile::TempDir,
    systemd: Option<ChildGuard>,
    cgroup_parent: String,
}

impl Manager {
    fn start() -> Manager {
        let systemd_binary = ["/lib/systemd/systemd", "/usr/lib/systemd/systemd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("systemd is not installed: `apt-get install systemd` (.ci/run does)");
        let dir = tempfile::tempdir().unwrap();
        let manager = |name: &str| dir.path().join(name);
        let runtime = manager("runtime");
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let units = manager("config/systemd/user");
        std::fs::create_dir_all(units.join(format!("{UNIT}.d"))).unwrap();
        let shipped = std::fs::read_to_string(shipped_unit()).unwrap();
        std::fs::write(units.join(UNIT), shipped).unwrap();
        let cgroup_parent = format!("baton-test-unit-{}", std::process::id());
        let drop_in = format!(
            "[Service]\nExecStart=\nExecStart={supervisor} --client-binary {client} --state-dir {state} --socket {socket} --cgroup-parent {cgroup_parent} --keep-mounts-on-exit\nRestartSec=100ms\nEnvironment=RUST_LOG=info\nStandardError=append:{log}\n",
            supervisor = s(&binary("fs-supervisor")),
            client = s(&binary("fsclient")),
            state = s(&manager("state")),
            socket = s(&manager("supervisor.sock")),
            log = s(&manager("supervisor.log")),
        );
        std::fs::write(units.join(format!("{UNIT}.d/test.conf")), drop_in).unwrap();
        let log = std::fs::File::create(manager("systemd.log")).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec {systemd_binary} --user"
            ))
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("XDG_CONFIG_HOME", manager("config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare (util-linux)");
        let m = Manager {
            dir,
            systemd: Some(ChildGuard(child)),
            cgroup_parent,
        };
        let private = runtime.join("systemd/private");
        assert!(
            wait_until(DEADLINE, || private.exists()),
            "systemd --user did not start:\n{}",
            m.logs()
        );
        // `start` below needs the manager past its own start-up.
        assert!(wait_until(DEADLINE, || {
            let out = m.in_namespace(&["systemctl", "--user", "is-system-running"]);
            let state = String::from_utf8_lossy(&out.stdout);
            state.trim() == "running" || state.trim() == "degraded"
        }));
        m
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pid(&self) -> i32 {
        self.systemd.as_ref().map(|c| c.0.id() as i32).unwrap_or(0)
    }

    /// Runs `args` in the manager's mount namespace, with its environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["-t", &self.pid().to_string(), "-m", "--"])
            .args(args)
            .env("XDG_RUNTIME_DIR", self.path("runtime"))
            .env("XDG_CONFIG_HOME", self.path("config"));
        command
    }

    fn in_namespace(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn systemctl(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl", "--user", "--no-pager"];
        all.extend_from_slice(args);
        let out = self.in_namespace(&all);
        assert!(
            out.status.success(),
            "systemctl {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn property(&self, name: &str) -> String {
        self.systemctl(&["show", "-p", name, "--value", UNIT])
    }

    fn fsctl(&self, args: &[&str]) -> Output {
        Command::new(binary("fsctl"))
            .args(args)
            .args(["--socket", s(&self.path("supervisor.sock"))])
            .output()
            .unwrap()
    }

    fn status(&self) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        if !out.status.success() {
            return Value::Null; // Restarting.
        }
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        report["mounts"][0].clone()
    }

    fn wait_serving(&self, generation_min: u64) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = self.status();
            if status["state"] == "serving" && status["generation"].as_u64() >= Some(generation_min)
            {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "generation {generation_min} never served: {status}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["systemd.log", "supervisor.log"] {
            out.push_str(&format!("--- {name} ---\n"));
            out.push_str(&std::fs::read_to_string(self.path(name)).unwrap_or_default());
        }
        out
    }

    /// Every process in the manager's mount namespace (its services and
    /// their orphans included).
    fn namespace_pids(&self) -> Vec<i32> {
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/mnt", self.pid())) else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|pid| {
                        std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                            .ok()
                            .as_ref()
                            == Some(&ns)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // Everything in the namespace dies, so its mounts go with it.
        let _ = self
            .command(&["systemctl", "--user", "stop", UNIT])
            .output();
        let pids = self.namespace_pids();
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        drop(self.systemd.take());
        let _ = wait_until(Duration::from_secs(5), || {
            pids.iter().all(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map_or(true, |s| s.contains(") Z "))
            })
        });
        for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
            let parent = Path::new(root).join(&self.cgroup_parent);
            if let Ok(entries) = std::fs::read_dir(&parent) {
                for cgroup in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
                    let _ = wait_until(Duration::from_secs(5), || {
                        std::fs::remove_dir(&cgroup).is_ok()
                    });
                }
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

#[test]
fn the_shipped_unit_keeps_the_fuse_fd_across_a_kill_9_and_a_reader_sees_no_error() {
    let m = Manager::start();
    let base = m.path("base");
    let mnt = m.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new(binary("fsctl"))
        .args(["format", "vol", "--base-dir", s(&base)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Type=notify: `start` returns after READY=1.
    m.systemctl(&["start", UNIT]);
    assert_eq!(m.property("ActiveState"), "active");
    let status_text = m.property("StatusText");
    assert!(status_text.starts_with("0 mounts"), "{status_text}");
    assert_eq!(m.property("NFileDescriptorStore"), "0");

    let out = m.fsctl(&["mount", "--persist", "vol", s(&mnt), "--base-dir", s(&base)]);
    assert!(
        out.status.success(),
        "mount: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        m.logs()
    );
    let status = m.wait_serving(1);
    assert_eq!(m.property("NFileDescriptorStore"), "1");
    // Standbys start in the background only if the supervisor can give
    // them normal priority back (supervisor/src/scheduling.rs).
    let supervisor_status =
        std::fs::read_to_string(format!("/proc/{}/status", m.property("MainPID"))).unwrap();
    let caps = supervisor_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap();
    const CAP_SYS_NICE: u32 = 23;
    assert!(
        caps & (1 << CAP_SYS_NICE) != 0,
        "the unit keeps no CAP_SYS_NICE: {caps:x}"
    );
    assert!(wait_until(DEADLINE, || m
        .property("StatusText")
        .starts_with("1 mounts: 1 serving")));

    let mp = s(&mnt).to_string();
    let out = m.in_namespace(&[
        "sh",
        "-c",
        &format!("seq 1 20000 > {mp}/data && sync {mp}/data"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stop = m.path("reader.stop");
    let mut reader = ChildGuard(
        m.command(&[
            "sh",
            "-c",
            &format!(
                "n=0; want=$(seq 1 20000 | md5sum); while [ ! -e {stop} ]; do \
                 got=$(md5sum < {mp}/data) || {{ echo \"error: read $n failed\"; exit 1; }}; \
                 [ \"$got\" = \"$want\" ] || {{ echo \"error: read $n differs\"; exit 1; }}; \
                 ls {mp} > /dev/null || {{ echo \"error: ls $n failed\"; exit 1; }}; \
                 n=$((n+1)); done; echo reads=$n",
                stop = s(&stop)
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));

    let main_pid: i32 = m.property("MainPID").parse().unwrap();
    let old_generation = status["pid"].as_i64().unwrap();
    let killed = Instant::now();
    kill(Pid::from_raw(main_pid), Signal::SIGKILL).unwrap();
    assert!(
        wait_until(DEADLINE, || {
            m.property("MainPID")
                .parse::<i32>()
                .is_ok_and(|pid| pid != 0 && pid != main_pid)
                && m.property("ActiveState") == "active"
        }),
        "systemd did not restart the service:\n{}",
        m.logs()
    );
    let status = m.wait_serving(2);
    eprintln!(
        "kill -9 of the service to generation 2 serving: {:?} (RestartSec=100ms)",
        killed.elapsed()
    );
    assert_ne!(status["pid"].as_i64(), Some(old_generation));
    let logs = m.logs();
    assert!(logs.contains("adopted a live mount"), "{logs}");
    assert_eq!(
        logs.matches("mounted and initialized").count(),
        1,
        "the restart mounted again:\n{logs}"
    );
    assert_eq!(m.property("NFileDescriptorStore"), "1");

    assert!(!logs.contains("copied the /dev/fuse fd"), "{logs}");
    std::thread::sleep(Duration::from_millis(300));

    // `systemctl stop` empties the fd store (systemd 252) but leaves the
    // generation serving (KillMode=process, --keep-mounts-on-exit); the
    // next start copies the fd from that generation (pidfd_getfd, under
    // the unit's hardening) and adopts the mount again.
    let serving_pid = m.status()["pid"].as_i64().unwrap();
    m.systemctl(&["stop", UNIT]);
    assert_eq!(m.property("NFileDescriptorStore"), "0");
    m.systemctl(&["start", UNIT]);
    let status = m.wait_serving(3);
    assert_ne!(status["pid"].as_i64(), Some(serving_pid));
    let logs = m.logs();
    assert!(
        logs.contains("copied the /dev/fuse fd from the previous generation"),
        "{logs}"
    );
    assert_eq!(logs.matches("mounted and initialized").count(), 1, "{logs}");
    assert_eq!(m.property("NFileDescriptorStore"), "1");

    // `systemctl restart`: SIGTERM, then a new supervisor adopts again.
    let copies = m.logs().matches("copied the /dev/fuse fd").count();
    m.systemctl(&["restart", UNIT]);
    m.wait_serving(4);
    let copied = m.logs().matches("copied the /dev/fuse fd").count() > copies;
    eprintln!(
        "systemctl restart: fd {}",
        if copied {
            "copied from the generation"
        } else {
            "from the fd store"
        }
    );
    assert_eq!(m.logs().matches("mounted and initialized").count(), 1);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&stop, b"").unwrap();
    let exit = reader.wait_timeout(DEADLINE).expect("the reader finished");
    let mut out = String::new();
    std::io::Read::read_to_string(reader.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(
        exit.success(),
        "the reader saw an error across the restart: {out}\n{}",
        m.logs()
    );
    let reads: u64 = out
        .trim()
        .strip_prefix("reads=")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(reads > 0, "the reader did not read: {out}");

    let out = m.fsctl(&["umount", s(&mnt)]);
    assert!(
        out.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(wait_until(DEADLINE, || m.property("NFileDescriptorStore") == "0"));
}
