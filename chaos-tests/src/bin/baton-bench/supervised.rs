//! A supervised Baton mount for the stall benches: its own fs-supervisor
//! (own socket, state dir and cgroup parent), a freshly formatted volume on
//! the embedded default, mounted through `fsctl mount`. Dropping it
//! unmounts (MNT_DETACH) and then stops the supervisor.

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
    // Field order is drop order: unmount first, then stop the supervisor.
    _guard: MountGuard,
    _supervisor: ChildGuard,
}

impl SupervisedMount {
    /// Starts fs-supervisor in `dir` with `supervisor_args`, formats
    /// `volume` and mounts it at `dir/mnt`.
    pub fn start(dir: &Path, volume: &str, supervisor_args: &[&str]) -> anyhow::Result<Self> {
        let socket = dir.join("sup.sock");
        let supervisor = ChildGuard(
            Command::new(workspace_binary("fs-supervisor"))
                .arg("--socket")
                .arg(&socket)
                .arg("--state-dir")
                .arg(dir.join("state"))
                .args(["--cgroup-parent", "baton-bench"])
                .args(supervisor_args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting fs-supervisor")?,
        );
        if !wait_until(Duration::from_secs(20), || socket.exists()) {
            bail!("fs-supervisor did not start");
        }
        let base = dir.join("base");
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", volume, "--base-dir", utf8(&base)?])
            .output()?;
        if !out.status.success() {
            bail!("fsctl format: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt)?;
        fsctl(
            &socket,
            &["mount", volume, utf8(&mnt)?, "--base-dir", utf8(&base)?],
        )?;
        Ok(SupervisedMount {
            _guard: MountGuard::new(&mnt),
            socket,
            mnt,
            _supervisor: supervisor,
        })
    }
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
