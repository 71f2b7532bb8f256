//! fs-supervisor --kubernetes on "this node": one formatted volume,
//! mounted through fsctl; stopped, its generations killed and the mount
//! detached when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::cluster::{run, s, Process};
use crate::{DEADLINE, NODE};

const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";

/// fs-supervisor --kubernetes with one mounted volume; on drop: stopped,
/// its generations killed, the mount detached.
pub struct Supervisor {
    dir: PathBuf,
    pub mnt: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    process: Option<Process>,
}

impl Supervisor {
    pub fn fsctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(built("fsctl"))
            .args(args)
            .args(["--socket", s(&self.socket)])
            .output()
            .expect("run fsctl")
    }

    pub fn status(&self) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        assert!(
            out.status.success(),
            "fsctl status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        report["mounts"][0].clone()
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("supervisor.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = kill(Pid::from_raw(process.0.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut process = process;
            while Instant::now() < deadline && matches!(process.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let parent = Path::new(CGROUP_V1_MEMORY).join(&self.cgroup_parent);
        for cgroup in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let procs =
                std::fs::read_to_string(cgroup.path().join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let end = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(cgroup.path()).is_err() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir(&parent);
        if std::thread::panicking() {
            let _ = fuse_wire::abort_connection(&self.mnt);
        }
        while fuse_wire::connection_id(&self.mnt).is_ok() {
            if fuse_wire::unmount(&self.mnt).is_err() {
                break;
            }
        }
    }
}

/// A binary of another crate of the workspace, built beside fs-supervisor
/// (`cargo test --workspace` builds them all).
fn built(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_fs-supervisor")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p fsctl -p fsclient` first",
        path.display()
    );
    path
}

pub fn start_supervisor(dir: &Path, kubeconfig: &Path) -> Supervisor {
    let fsclient = built("fsclient");
    let base = dir.join("base");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run(Command::new(built("fsctl")).args(["format", "vol", "--base-dir", s(&base)]));
    let socket = dir.join("supervisor.sock");
    let cgroup_parent = format!("baton-test-kube-{}", std::process::id());
    let log = std::fs::File::create(dir.join("supervisor.log")).unwrap();
    let process = Command::new(env!("CARGO_BIN_EXE_fs-supervisor"))
        .args(["--kubernetes", "--client-binary", s(&fsclient)])
        .args(["--state-dir", s(&dir.join("state"))])
        .args(["--socket", s(&socket)])
        .args(["--cgroup-parent", &cgroup_parent])
        .env("KUBECONFIG", kubeconfig)
        .env("NODE_NAME", NODE)
        .env("POD_NAMESPACE", "baton-system")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn fs-supervisor");
    let supervisor = Supervisor {
        dir: dir.to_path_buf(),
        mnt,
        socket,
        cgroup_parent,
        process: Some(Process(process)),
    };
    let end = Instant::now() + DEADLINE;
    while !supervisor.socket.exists() {
        assert!(
            Instant::now() < end,
            "fs-supervisor did not start:\n{}",
            supervisor.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = supervisor.fsctl(&["mount", "vol", s(&supervisor.mnt), "--base-dir", s(&base)]);
    assert!(
        out.status.success(),
        "fsctl mount: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        supervisor.log()
    );
    supervisor
}
