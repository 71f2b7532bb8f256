//! `fsctl upgrade-supervisor`: fs-supervisor replaces itself by re-executing
//! a new binary in place.
//!
//! The pid does not change, so every generation stays its child (reaped and
//! watched as before). Each mount's /dev/fuse fd crosses the exec the way
//! systemd hands stored fds back (`LISTEN_PID`/`LISTEN_FDS`/
//! `LISTEN_FDNAMES`, fds from 3, named by mount id), so the new image
//! restores its mounts through the same path as a restart under systemd
//! (`restore.rs`): adopt the fd, replace the generation (RESEND, exactly
//! once), no mount(2) and no INIT. systemd's own variables are put back,
//! so a supervisor under systemd keeps notifying. Everything else is
//! close-on-exec and goes away with the old image.
//!
//! Before anything is touched, the new binary must run (`--version`), so
//! a missing or broken binary is refused while the old image serves on.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg};

use crate::systemd::LISTEN_FDS_START;

use upgrade_protocol::client::UPGRADE_SUPERVISOR_PREFLIGHT_TIMEOUT as PREFLIGHT_TIMEOUT;
/// Fds are parked above this while they are moved to 3, 4, ...
const PARK_FD_MIN: RawFd = 1000;

/// Checks that `binary` runs (`--version` exits 0); returns its version line.
pub fn preflight(binary: &Path) -> Result<String, String> {
    crate::preflight::check_client_binary(binary)?;
    let mut command = Command::new(binary);
    command
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = crate::preflight::retrying_busy(|| command.spawn())
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let deadline = Instant::now() + PREFLIGHT_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                return Err(format!(
                    "{} --version failed ({status}); is it an fs-supervisor binary?",
                    binary.display()
                ))
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                return Err(format!(
                    "{} --version did not finish within {PREFLIGHT_TIMEOUT:?}",
                    binary.display()
                ));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", binary.display())),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("reading {} --version: {e}", binary.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !version.starts_with("fs-supervisor") {
        return Err(format!(
            "{} --version printed {version:?}, not fs-supervisor's version; refusing to run it as the supervisor",
            binary.display()
        ));
    }
    Ok(version)
}

/// Re-executes `binary` with this process's arguments, handing `mounts`
/// (name, fd) over as LISTEN_FDS and setting `env`. The fsclient binary
/// this image runs, `client_binary`, is passed on as `--client-binary`
/// when the arguments do not name one: its default is next to the
/// executable, and the new binary may live elsewhere. Returns only on
/// failure, and then this process has lost its own fds 3.. (they were
/// overwritten): the caller must exit. Call [`preflight`] first.
pub fn exec(
    binary: &Path,
    client_binary: &Path,
    mounts: &[(String, BorrowedFd<'_>)],
    env: &[(&str, OsString)],
) -> std::io::Error {
    // Park copies high, so moving them to 3.. cannot overwrite one not yet
    // moved. (dup2 clears close-on-exec on the target.)
    let mut parked: Vec<OwnedFd> = Vec::with_capacity(mounts.len());
    for (_, fd) in mounts {
        match fcntl(*fd, FcntlArg::F_DUPFD_CLOEXEC(PARK_FD_MIN)) {
            // SAFETY: fcntl returned a new fd nobody else owns.
            Ok(raw) => {
                parked.push(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
            }
            Err(errno) => return std::io::Error::from(errno),
        }
    }
    let names: Vec<&str> = mounts.iter().map(|(name, _)| name.as_str()).collect();
    // The environment of the new image. (Other threads of this image do
    // not read the environment.)
    std::env::set_var("LISTEN_PID", std::process::id().to_string());
    std::env::set_var("LISTEN_FDS", mounts.len().to_string());
    std::env::set_var("LISTEN_FDNAMES", names.join(":"));
    for (name, value) in env {
        std::env::set_var(name, value);
    }
    for (i, fd) in parked.iter().enumerate() {
        let target = LISTEN_FDS_START + i as RawFd;
        // SAFETY: dup2 onto a number we give away on purpose: the image is
        // replaced right after.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return std::io::Error::last_os_error();
        }
    }
    let path = match CString::new(binary.as_os_str().as_bytes()) {
        Ok(path) => path,
        Err(_) => return std::io::Error::other("the binary path contains a NUL byte"),
    };
    let mut args_os: Vec<OsString> = std::env::args_os().collect();
    if !names_client_binary(&args_os) {
        args_os.push("--client-binary".into());
        args_os.push(client_binary.as_os_str().to_owned());
    }
    let mut args: Vec<CString> = Vec::new();
    for arg in args_os {
        match CString::new(arg.as_bytes()) {
            Ok(arg) => args.push(arg),
            Err(_) => return std::io::Error::other("an argument contains a NUL byte"),
        }
    }
    if let Some(first) = args.first_mut() {
        *first = path.clone();
    }
    let exec = crate::preflight::retrying_busy(|| match nix::unistd::execv(&path, &args) {
        Ok(never) => match never {},
        Err(errno) => Err::<(), _>(std::io::Error::from(errno)),
    });
    match exec {
        Ok(()) => std::io::Error::other("execv returned"),
        Err(err) => err,
    }
}

/// Whether fs-supervisor's arguments name its fsclient binary.
fn names_client_binary(args: &[OsString]) -> bool {
    args.iter().skip(1).any(|arg| {
        let arg = arg.as_bytes();
        arg == b"--client-binary" || arg.starts_with(b"--client-binary=")
    })
}

/// Reaps the children an earlier image of this process left (after `fsctl
/// upgrade-supervisor` the old generations and standbys are still our
/// children): one thread per pid waits for exactly that pid, so no
/// generation started by this image is ever reaped behind its pidfd.
/// Call at start, before any generation is spawned.
pub fn reap_inherited_children() {
    let mut pids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    for pid in pids {
        tracing::info!(
            pid,
            "a process of the previous fs-supervisor image; reaped when it exits"
        );
        std::thread::spawn(move || {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_binary_is_named_by_the_flag_with_or_without_an_equals_sign() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(names_client_binary(&args(&[
            "fs-supervisor",
            "--client-binary",
            "/x"
        ])));
        assert!(names_client_binary(&args(&[
            "fs-supervisor",
            "--client-binary=/x"
        ])));
        assert!(!names_client_binary(&args(&[
            "fs-supervisor",
            "--socket",
            "/s"
        ])));
        // The program name is not an argument.
        assert!(!names_client_binary(&args(&["--client-binary"])));
    }
}
