//! One fs-supervisor for one chaos scenario: its own temp dir, state dir,
//! control socket, cgroup parent and volume; mount through `fsctl`, status
//! as JSON, and on drop: stop it, kill whatever is left in its cgroups,
//! detach the mount (aborting the connection first after a failure) and
//! unmount a tmpfs staging dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};

/// How long a start, a mount or a takeover may take.
pub const SERVE_TIMEOUT: Duration = Duration::from_secs(30);
const CGROUP_ROOTS: [&str; 2] = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"];

/// A workspace binary, or an error naming the build command.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_binary(name);
    if !path.exists() {
        bail!(
            "{} is missing: build the workspace first (`cargo build --workspace`)",
            path.display()
        );
    }
    Ok(path)
}

/// How to start the supervisor.
#[derive(Debug, Clone, Default)]
pub struct SupervisorOptions {
    /// Extra fs-supervisor arguments (`--no-standby`, `--memory-max 1G`).
    pub args: Vec<String>,
    /// Environment for the supervisor and so for its generations.
    pub env: Vec<(String, String)>,
    /// Mount a tmpfs of this many bytes as the staging dir.
    pub staging_tmpfs_bytes: Option<u64>,
}

/// A running supervisor with one formatted volume.
pub struct Supervisor {
    dir: tempfile::TempDir,
    base: PathBuf,
    /// The mountpoint.
    pub mnt: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    staging: Option<PathBuf>,
    child: Option<ChildGuard>,
    guard: Option<MountGuard>,
    /// Abort the connection before unmounting on drop (a failed scenario).
    pub abort_on_drop: bool,
    options: SupervisorOptions,
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

impl Supervisor {
    /// Formats a volume and starts fs-supervisor; `tag` names its cgroup parent.
    pub fn start(options: &SupervisorOptions, tag: &str) -> anyhow::Result<Supervisor> {
        let dir = tempfile::Builder::new()
            .prefix("baton-chaos-")
            .tempdir()
            .context("creating the scenario's temp dir")?;
        let base = dir.path().join("base");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        let out = Command::new(binary("fsctl")?)
            .args(["format", "vol", "--base-dir", path_str(&base)?])
            .output()
            .context("running fsctl format")?;
        if !out.status.success() {
            bail!("fsctl format: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut sup = Supervisor {
            socket: dir.path().join("supervisor.sock"),
            cgroup_parent: format!("baton-chaos-{}-{tag}", std::process::id()),
            staging: None,
            child: None,
            guard: None,
            abort_on_drop: false,
            options: options.clone(),
            dir,
            base,
            mnt,
        };
        if let Some(bytes) = options.staging_tmpfs_bytes {
            let staging = sup.path("staging");
            std::fs::create_dir(&staging)?;
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                .arg(&staging)
                .output()
                .context("running mount -t tmpfs")?;
            if !out.status.success() {
                bail!(
                    "mounting a {bytes}-byte tmpfs staging dir: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            sup.staging = Some(staging);
        }
        sup.spawn(options)?;
        Ok(sup)
    }

    fn spawn(&mut self, options: &SupervisorOptions) -> anyhow::Result<()> {
        self.spawn_process(options)?;
        // The socket file appears at bind(2), before listen(2): wait until
        // fsctl gets an answer.
        let answers = wait_until(SERVE_TIMEOUT, || {
            self.socket.exists() && self.fsctl(&["status"]).is_ok_and(|o| o.status.success())
        });
        if !answers {
            bail!("fs-supervisor did not start:\n{}", self.logs());
        }
        Ok(())
    }

    fn spawn_process(&mut self, options: &SupervisorOptions) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("supervisor.log"))?;
        let child = Command::new(binary("fs-supervisor")?)
            .args(["--client-binary", path_str(&binary("fsclient")?)?])
            .args(["--state-dir", path_str(&self.path("state"))?])
            .args(["--socket", path_str(&self.socket)?])
            .args(["--cgroup-parent", &self.cgroup_parent])
            .args(&options.args)
            .envs(options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "RUST_LOG",
                std::env::var("BATON_CHAOS_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting fs-supervisor")?;
        self.child = Some(ChildGuard(child));
        Ok(())
    }

    /// A DaemonSet rollout in small: starts a successor (`--successor`)
    /// beside the serving fs-supervisor, stops that one with SIGTERM so it
    /// hands the mount over, and waits for it to exit. Returns its pid.
    pub fn hand_over_to_successor(&mut self) -> anyhow::Result<i32> {
        let Some(mut old) = self.child.take() else {
            bail!("fs-supervisor is not running");
        };
        let mut options = self.options.clone();
        options.args.push("--successor".into());
        self.spawn_process(&options)?;
        let waiting = self.path("state/run/successor.sock");
        if !wait_until(SERVE_TIMEOUT, || waiting.exists()) {
            bail!("the successor fs-supervisor did not wait:\n{}", self.logs());
        }
        let pid = old.pid();
        kill(pid, Signal::SIGTERM).context("SIGTERM of fs-supervisor")?;
        match old.wait_timeout(SERVE_TIMEOUT) {
            Some(status) if status.success() => Ok(pid.as_raw()),
            other => bail!(
                "fs-supervisor (pid {pid}) did not hand over and exit: {other:?}\n{}",
                self.logs()
            ),
        }
    }

    /// SIGKILLs fs-supervisor and starts it again with the same options,
    /// state dir and socket. Returns the killed pid.
    pub fn kill_and_restart(&mut self) -> anyhow::Result<i32> {
        let Some(mut child) = self.child.take() else {
            bail!("fs-supervisor is not running");
        };
        let pid = child.pid();
        kill(pid, Signal::SIGKILL).context("kill -9 of fs-supervisor")?;
        if child.wait_timeout(SERVE_TIMEOUT).is_none() {
            bail!("fs-supervisor (pid {pid}) did not die");
        }
        drop(child);
        let options = self.options.clone();
        self.spawn(&options)?;
        Ok(pid.as_raw())
    }

    /// The executable the supervisor runs now (changes with an upgrade).
    pub fn supervisor_exe(&self) -> Option<PathBuf> {
        let pid = self.child.as_ref()?.pid();
        std::fs::read_link(format!("/proc/{pid}/exe")).ok()
    }

    /// A path in the scenario's temp dir.
    /// The tmpfs staging dir, if this supervisor's mounts use one.
    pub fn staging_dir(&self) -> Option<&Path> {
        self.staging.as_deref()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn fsctl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Command::new(binary("fsctl")?)
            .args(args)
            .args(["--socket", path_str(&self.socket)?])
            .output()
            .context("running fsctl")
    }

    /// Mounts the volume (with the tmpfs staging dir if any).
    pub fn mount(&mut self) -> anyhow::Result<()> {
        let mut args = vec![
            "mount".to_string(),
            "vol".to_string(),
            path_str(&self.mnt)?.to_string(),
            "--base-dir".to_string(),
            path_str(&self.base)?.to_string(),
        ];
        if let Some(staging) = &self.staging {
            args.extend(["--staging-dir".to_string(), path_str(staging)?.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.fsctl(&args)?;
        if !out.status.success() {
            bail!(
                "fsctl mount: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            );
        }
        self.guard = Some(MountGuard::new(&self.mnt));
        Ok(())
    }

    /// `fsctl upgrade MNT --binary BINARY --json`: a planned handover to
    /// `binary`; returns the first report (ok, stall_us, elapsed_ms, ...).
    pub fn upgrade(&self, binary: &Path) -> anyhow::Result<Value> {
        let out = self.fsctl(&[
            "upgrade",
            path_str(&self.mnt)?,
            "--binary",
            path_str(binary)?,
            "--json",
        ])?;
        let reports: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "fsctl upgrade printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let report = match &reports {
            Value::Array(list) => list.first().cloned().unwrap_or(Value::Null),
            other => other.clone(),
        };
        if !out.status.success() || report["ok"] != true {
            bail!(
                "fsctl upgrade failed: {report} {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(report)
    }

    /// `fsctl upgrade-supervisor --binary BINARY`: the supervisor re-executes
    /// in place keeping every mount; returns what fsctl printed.
    pub fn upgrade_supervisor(&self, binary: &Path) -> anyhow::Result<String> {
        let out = self.fsctl(&["upgrade-supervisor", "--binary", path_str(binary)?])?;
        if !out.status.success() {
            bail!(
                "fsctl upgrade-supervisor failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The mount's entry of `fsctl status --json`.
    pub fn status(&self) -> anyhow::Result<Value> {
        let out = self.fsctl(&["status", "--json"])?;
        if !out.status.success() {
            bail!("fsctl status: {}", String::from_utf8_lossy(&out.stderr));
        }
        let report: Value = serde_json::from_slice(&out.stdout).context("fsctl status JSON")?;
        Ok(report["mounts"][0].clone())
    }

    /// Waits until generation `generation` or later serves.
    pub fn wait_serving(&self, generation: u64, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status()?;
            if status["state"] == "serving" && status["generation"].as_u64() >= Some(generation) {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("generation {generation} did not serve within {timeout:?}: {status}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The last lines of the supervisor's and every generation's log.
    pub fn logs(&self) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        let mut out = format!(
            "--- supervisor log ---\n{}\n",
            tail(&self.path("supervisor.log"))
        );
        if let Ok(entries) = std::fs::read_dir(self.path("state/logs")) {
            for entry in entries.flatten() {
                out.push_str(&format!(
                    "--- {} ---\n{}\n",
                    entry.path().display(),
                    tail(&entry.path())
                ));
            }
        }
        out
    }

    fn cleanup_cgroups(&self) {
        for root in CGROUP_ROOTS {
            let parent = Path::new(root).join(&self.cgroup_parent);
            let Ok(entries) = std::fs::read_dir(&parent) else {
                continue;
            };
            for cgroup in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
                let procs =
                    std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = wait_until(Duration::from_secs(5), || {
                    std::fs::remove_dir(&cgroup).is_ok()
                });
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.abort_on_drop {
            let _ = fuse_wire::abort_connection(&self.mnt);
        }
        if let Some(mut child) = self.child.take() {
            let _ = kill(child.pid(), Signal::SIGTERM);
            if child.wait_timeout(SERVE_TIMEOUT).is_none() {
                let _ = fuse_wire::abort_connection(&self.mnt);
            }
        }
        self.cleanup_cgroups();
        if let Some(mut guard) = self.guard.take() {
            guard.abort_on_drop = self.abort_on_drop;
        }
        if let Some(staging) = &self.staging {
            let _ = nix::mount::umount2(staging, nix::mount::MntFlags::MNT_DETACH);
        }
        // For a post-mortem: the whole scenario dir (volume, staging,
        // logs), copied once the mount is gone.
        if let Some(keep) = std::env::var_os(KEEP_ENV) {
            let to = std::path::Path::new(&keep).join(
                self.dir
                    .path()
                    .file_name()
                    .unwrap_or_else(|| std::ffi::OsStr::new("scenario")),
            );
            let copied = Command::new("cp")
                .arg("-a")
                .arg(self.dir.path())
                .arg(&to)
                .status();
            eprintln!(
                "baton-chaos: scenario dir kept at {} ({copied:?})",
                to.display()
            );
        }
    }
}

/// `BATON_CHAOS_KEEP=DIR`: copy every scenario's dir there at the end.
pub const KEEP_ENV: &str = "BATON_CHAOS_KEEP";
