//! Guards for tests that mount: unmount (MNT_DETACH) on every path, kill
//! child processes on drop, and never leave a caller stuck.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Unmounts `path` with MNT_DETACH when dropped; aborts the connection first
/// if asked to, so no process stays blocked on a dead server.
pub struct MountGuard {
    path: PathBuf,
    /// Abort the FUSE connection before unmounting (for tests that failed).
    pub abort_on_drop: bool,
}

impl MountGuard {
    /// Guards the mount at `path`.
    pub fn new(path: &Path) -> Self {
        MountGuard {
            path: path.to_path_buf(),
            abort_on_drop: false,
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.abort_on_drop || std::thread::panicking() {
            let _ = fuse_wire::abort_connection(&self.path);
        }
        // Unmount every FUSE layer stacked on the path.
        while fuse_wire::connection_id(&self.path).is_ok() {
            if fuse_wire::unmount(&self.path).is_err() {
                break;
            }
        }
    }
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// The child's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }

    /// Waits up to `timeout` for the child to exit; returns its status.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `condition` every 5 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `path` is a FUSE mount that answers (INIT done).
pub fn wait_for_mount(path: &Path, timeout: Duration) -> bool {
    wait_until(timeout, || fuse_wire::connection_id(path).is_ok())
}

/// A workspace binary built next to the running test or bench executable
/// (`target/<profile>/NAME`); `cargo test --workspace` builds them all.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// `fsclient mount vol MNT --base-dir BASE EXTRA...` in the background
/// (stdin closed), once the mount is up; panics if it is not within
/// `timeout`. The guards kill the process and unmount on drop.
pub fn mount_fsclient(
    base: &Path,
    mnt: &Path,
    extra: &[&str],
    timeout: Duration,
) -> (ChildGuard, MountGuard) {
    let child = ChildGuard(
        std::process::Command::new(workspace_binary("fsclient"))
            .args(["mount", "vol"])
            .arg(mnt)
            .arg("--base-dir")
            .arg(base)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spawn fsclient (build the workspace first)"),
    );
    assert!(
        wait_for_mount(mnt, timeout),
        "fsclient did not mount {} within {timeout:?}",
        mnt.display()
    );
    (child, MountGuard::new(mnt))
}
