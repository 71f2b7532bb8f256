//! A supervised Baton mount for the stall benches: its own fs-supervisor
//! (own socket, state dir and cgroup parent), a freshly formatted volume on
//! the embedded default, mounted through `fsctl mount`. Dropping it
//! unmounts (MNT_DETACH) and then stops the supervisor. The socket and the
//! state dir (which holds more sockets) live in a short temporary
//! directory, not under the bench's `--dir`: a unix socket's path holds at
//! most 107 bytes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};

/// A mount served under its own fs-supervisor.
pub struct SupervisedMount {
    /// The supervisor's control socket.
    pub socket: PathBuf,
    /// The mountpoint.
    pub mnt: PathBuf,
    state: PathBuf,
    /// Where the bench put it all (`start`'s `dir`).
    dir: PathBuf,
    base: PathBuf,
    supervisor_args: Vec<String>,
    // Field order is drop order: unmount first, then stop the supervisor.
    more_mounts: Vec<MountGuard>,
    _guard: MountGuard,
    supervisor: ChildGuard,
    /// Holds the socket and the state dir; removed last.
    _sockets: tempfile::TempDir,
}

/// Starts fs-supervisor on `socket` and `state` with `args`.
fn spawn_supervisor(socket: &Path, state: &Path, args: &[String]) -> anyhow::Result<ChildGuard> {
    Ok(ChildGuard(
        Command::new(workspace_binary("fs-supervisor"))
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state)
            .args(["--cgroup-parent", "baton-bench"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting fs-supervisor")?,
    ))
}

impl SupervisedMount {
    /// Starts fs-supervisor in `dir` with `supervisor_args`, formats
    /// `volume` and mounts it at `dir/mnt`.
    pub fn start(dir: &Path, volume: &str, supervisor_args: &[&str]) -> anyhow::Result<Self> {
        let sockets = tempfile::Builder::new()
            .prefix("baton-bench-")
            .tempdir()
            .context("creating a directory for fs-supervisor's sockets")?;
        let socket = sockets.path().join("sup.sock");
        let state = sockets.path().join("state");
        let supervisor_args: Vec<String> = supervisor_args.iter().map(|a| a.to_string()).collect();
        let supervisor = spawn_supervisor(&socket, &state, &supervisor_args)?;
        if !wait_until(Duration::from_secs(20), || socket.exists()) {
            bail!("fs-supervisor did not start");
        }
        let base = dir.join("base");
        format(&base, volume)?;
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt)?;
        fsctl(
            &socket,
            &["mount", volume, utf8(&mnt)?, "--base-dir", utf8(&base)?],
        )?;
        Ok(SupervisedMount {
            _guard: MountGuard::new(&mnt),
            more_mounts: Vec::new(),
            socket,
            mnt,
            state,
            dir: dir.to_path_buf(),
            base,
            supervisor_args,
            supervisor,
            _sockets: sockets,
        })
    }

    /// Formats `volume` beside the first and mounts it under the same
    /// fs-supervisor; returns its mountpoint (unmounted on drop).
    pub fn mount_another(&mut self, volume: &str) -> anyhow::Result<PathBuf> {
        format(&self.base, volume)?;
        let mnt = self.dir.join(format!("mnt-{volume}"));
        std::fs::create_dir_all(&mnt)?;
        fsctl(
            &self.socket,
            &[
                "mount",
                volume,
                utf8(&mnt)?,
                "--base-dir",
                utf8(&self.base)?,
            ],
        )?;
        self.more_mounts.push(MountGuard::new(&mnt));
        Ok(mnt)
    }

    /// A DaemonSet rollout in small: starts a successor (`--successor`),
    /// stops the serving supervisor with SIGTERM so it hands the mount
    /// over, and waits until the successor serves it.
    pub fn hand_over_to_successor(&mut self) -> anyhow::Result<()> {
        let mut args = self.supervisor_args.clone();
        args.push("--successor".into());
        let successor = spawn_supervisor(&self.socket, &self.state, &args)?;
        let waiting = self.state.join("run/successor.sock");
        if !wait_until(Duration::from_secs(20), || waiting.exists()) {
            bail!("the successor fs-supervisor did not start waiting");
        }
        let mut old = std::mem::replace(&mut self.supervisor, successor);
        nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM)?;
        match old.wait_timeout(Duration::from_secs(20)) {
            Some(status) if status.success() => {}
            other => bail!("the old fs-supervisor did not hand over and exit: {other:?}"),
        }
        let serving = wait_until(Duration::from_secs(20), || {
            fsctl(&self.socket, &["status", "--json"])
                .ok()
                .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
                .is_some_and(|s| s["mounts"][0]["state"] == "serving")
        });
        if !serving {
            bail!("the successor fs-supervisor does not serve the mount");
        }
        Ok(())
    }
}

/// The serving generation's pid of every mount of a supervisor.
pub fn generation_pids(socket: &Path) -> anyhow::Result<Vec<u32>> {
    let status: serde_json::Value = serde_json::from_str(&fsctl(socket, &["status", "--json"])?)?;
    Ok(status["mounts"]
        .as_array()
        .map(|mounts| {
            mounts
                .iter()
                .filter_map(|m| m["pid"].as_u64().map(|p| p as u32))
                .collect()
        })
        .unwrap_or_default())
}

/// Formats `volume` on the embedded default under `base`.
fn format(base: &Path, volume: &str) -> anyhow::Result<()> {
    let out = Command::new(workspace_binary("fsctl"))
        .args(["format", volume, "--base-dir", utf8(base)?])
        .output()?;
    if !out.status.success() {
        bail!("fsctl format: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Runs `fsctl` against a supervisor's socket and returns its stdout.
pub fn fsctl(socket: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(workspace_binary("fsctl"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()?;
    if !out.status.success() {
        bail!(
            "fsctl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `path` as UTF-8 (the bench passes paths as arguments).
pub fn utf8(path: &Path) -> anyhow::Result<&str> {
    path.to_str().context("the bench needs UTF-8 paths")
}
