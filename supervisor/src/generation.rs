//! One generation process: `fsclient serve --connect SOCKET VOLUME ...`,
//! started in its own memory cgroup (joined from a `pre_exec` hook, so it
//! is in the cgroup before it execs), watched through a pidfd (readable the
//! moment the whole process has exited: death is seen at once, without
//! polling), its death classified as exit code, signal or OOM kill from
//! its exit status read without reaping it, and reaped after the
//! supervisor has acted on the death ([`Process::exit_cause`]).
//!
//! A process gets the /dev/fuse fd only in its Adopt message; until then it
//! is a standby that has opened the volume and waits on its socket.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use upgrade_protocol::ClientOptions;

use crate::cgroup::Cgroup;
use crate::lifecycle::mount::Cause;
use crate::scheduling::{self, Startup, BACKGROUND_START_MAX};
use crate::Error;

/// How to start one generation.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The `fsclient` binary.
    pub client_binary: &'a Path,
    /// The mount's generation socket.
    pub socket: &'a Path,
    /// Where the generation keeps the held locks (`BATON_HELD_LOCKS_FILE`).
    pub held_locks: &'a Path,
    /// The mount's id, a field of every line the generation logs
    /// (`BATON_MOUNT_ID`).
    pub mount_id: &'a str,
    /// The volume (name or URL).
    pub volume: &'a str,
    /// Where named volumes live.
    pub base_dir: &'a Path,
    /// Forwarded options.
    pub options: &'a ClientOptions,
    /// Its stdout and stderr go here.
    pub log: &'a File,
    /// The generation number.
    pub generation: u64,
    /// How it is scheduled until it connected.
    pub startup: Startup,
}

/// The command line of a generation. Pure.
pub fn command_args(launch: &Launch<'_>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "serve".into(),
        "--connect".into(),
        launch.socket.into(),
        "--base-dir".into(),
        launch.base_dir.into(),
    ];
    if let Some(dir) = &launch.options.cache_dir {
        args.extend(["--cache-dir".into(), dir.into()]);
    }
    if let Some(dir) = &launch.options.staging_dir {
        args.extend(["--staging-dir".into(), dir.into()]);
    }
    if let Some(threads) = launch.options.threads {
        args.extend(["--threads".into(), threads.to_string().into()]);
    }
    if let Some(bytes) = launch.options.cache_size_bytes {
        args.extend(["--cache-size".into(), bytes.to_string().into()]);
    }
    args.push(launch.volume.into());
    args
}

/// A started generation process.
#[derive(Debug)]
pub struct Process {
    /// Its generation number.
    pub generation: u64,
    /// Its pid.
    pub pid: u32,
    child: Child,
    pidfd: OwnedFd,
    /// Its control connection, once it connected (and until it closes it).
    pub conn: Option<OwnedFd>,
    /// It connected at least once.
    pub connected: bool,
    /// It was sent the fd.
    pub adopted: bool,
    /// Its memory cgroup.
    pub cgroup: Option<Cgroup>,
    /// When it was started.
    pub spawned_at: Instant,
    /// When it reported serving.
    pub serving_since: Option<Instant>,
    /// How it was scheduled when started.
    startup: Startup,
    /// [`Process::raise_priority`] ran.
    priority_raised: bool,
    /// [`Process::lift_if_starved`] lifted it.
    lifted: bool,
}

/// Writes "0" (itself) to a cgroup's procs file. Runs between fork and
/// exec, so only async-signal-safe calls: open, write, close.
fn join_cgroup(procs: &CString) -> std::io::Result<()> {
    // SAFETY: plain syscalls on a NUL-terminated path and a static buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(err);
        }
    }
    Ok(())
}

/// A pidfd for `pid` (close-on-exec): readable once the process has
/// exited, and it pins this process, never a later one with the same pid.
pub(crate) fn pidfd_open(pid: u32) -> Result<OwnedFd, Errno> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or(Errno::ESRCH)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|errno| Errno::from_raw(errno.raw_os_error()))
}

impl Process {
    /// Starts a generation in `cgroup` (if any). The cgroup is removed if
    /// the start fails.
    pub fn spawn(launch: &Launch<'_>, cgroup: Option<Cgroup>) -> Result<Process, Error> {
        let procs = match &cgroup {
            Some(c) => Some(
                CString::new(c.procs_path().as_os_str().as_bytes()).map_err(|_| Error::Io {
                    op: "joining cgroup",
                    path: c.procs_path(),
                    source: std::io::Error::other("path contains NUL"),
                })?,
            ),
            None => None,
        };
        let result = Self::spawn_in(launch, procs);
        match result {
            Ok((child, pid, pidfd)) => Ok(Process {
                generation: launch.generation,
                pid,
                child,
                pidfd,
                conn: None,
                connected: false,
                adopted: false,
                cgroup,
                spawned_at: Instant::now(),
                serving_since: None,
                startup: launch.startup,
                priority_raised: false,
                lifted: false,
            }),
            Err(err) => {
                if let Some(cgroup) = cgroup {
                    cgroup.remove();
                }
                Err(err)
            }
        }
    }

    fn spawn_in(
        launch: &Launch<'_>,
        procs: Option<CString>,
    ) -> Result<(Child, u32, OwnedFd), Error> {
        let out = launch
            .log
            .try_clone()
            .map_err(Error::io("duplicating log of", launch.socket))?;
        let err = launch
            .log
            .try_clone()
            .map_err(Error::io("duplicating log of", launch.socket))?;
        let mut command = Command::new(launch.client_binary);
        command
            .args(command_args(launch))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        // The log is a file: no terminal colour codes in it.
        command.env("NO_COLOR", "1");
        command.env("BATON_HELD_LOCKS_FILE", launch.held_locks);
        command.env("BATON_MOUNT_ID", launch.mount_id);
        if let Some(procs) = procs {
            // SAFETY: join_cgroup only makes async-signal-safe syscalls.
            unsafe {
                command.pre_exec(move || join_cgroup(&procs));
            }
        }
        let mut child = crate::preflight::retrying_busy(|| command.spawn())
            .map_err(Error::io("starting", launch.client_binary))?;
        let pid = child.id();
        // spawn() returned, so the child has exec'd and holds none of our
        // fds: now it may be starved (Startup::apply).
        launch.startup.apply(pid);
        match pidfd_open(pid) {
            Ok(pidfd) => Ok((child, pid, pidfd)),
            Err(errno) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(Error::Sys {
                    op: format!("pidfd_open({pid})"),
                    errno,
                })
            }
        }
    }

    /// Gives every thread of the process normal priority (it may have
    /// started in the background: [`crate::scheduling`]); called once it
    /// connected (it has started and waits, idle, for the fd), when a
    /// standby is promoted, and again, a no-op then, before it gets the fd.
    /// Threads it starts later inherit from their creator, so they are
    /// normal too.
    pub fn raise_priority(&mut self) {
        if self.startup == Startup::Urgent || std::mem::replace(&mut self.priority_raised, true) {
            return;
        }
        scheduling::raise(self.pid);
    }

    /// When a background start-up that has not connected is due to be
    /// lifted ([`Process::lift_if_starved`]); `None` if it is not one.
    pub fn startup_deadline(&self) -> Option<Instant> {
        (self.startup == Startup::Background && !self.priority_raised && !self.lifted)
            .then(|| self.spawned_at + BACKGROUND_START_MAX)
    }

    /// Lifts a background start-up that is still starting at `now`, past
    /// [`BACKGROUND_START_MAX`], out of `SCHED_IDLE`: the node is busy
    /// enough that it would not start at all.
    pub fn lift_if_starved(&mut self, now: Instant) {
        if self.startup_deadline().is_some_and(|due| due <= now) {
            self.lifted = true;
            tracing::info!(
                pid = self.pid,
                generation = self.generation,
                waited_ms = BACKGROUND_START_MAX.as_millis() as u64,
                nice = scheduling::STARTUP_NICE,
                "generation still starting in the background; lifting it out of SCHED_IDLE"
            );
            scheduling::lift(self.pid);
        }
    }

    /// The pidfd: readable once the process has exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Sends `signal` (the process is not reaped yet, so the pid is ours).
    pub fn signal(&self, signal: Signal) {
        if let Err(errno) = nix::sys::signal::kill(Pid::from_raw(self.pid as i32), signal) {
            tracing::warn!(pid = self.pid, generation = self.generation, %errno, ?signal, "cannot signal generation");
        }
    }

    /// How the process ended, if it has: its exit status, read without
    /// reaping it (`WNOWAIT`), and its cgroup's OOM kill count. The caller
    /// acts on the death first and then calls [`Process::reap`]: the pidfd
    /// is readable once the last thread has notified its parent, but
    /// reaping waits for that thread to finish its exit, and a supervisor
    /// woken on the same vCPU waited there for it: 2.5 ms in `wait4` in one
    /// traced takeover, until the scheduler moved the thread to the idle
    /// vCPU. A takeover's `Adopt` does not need the process reaped.
    pub fn exit_cause(&self) -> Result<Option<Cause>, Error> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let status = waitid(Id::PIDFd(self.pidfd.as_fd()), flags).map_err(|errno| {
            Error::io("waiting for", PathBuf::from(format!("pid {}", self.pid)))(
                std::io::Error::from(errno),
            )
        })?;
        let (code, signal) = match status {
            WaitStatus::Exited(_, code) => (Some(code), None),
            WaitStatus::Signaled(_, signal, _) => (None, Some(signal as i32)),
            _ => return Ok(None),
        };
        let oom_kills = self.cgroup.as_ref().map(Cgroup::oom_kills);
        Ok(Some(classify(code, signal, oom_kills.and_then(Result::ok))))
    }

    /// Reaps the exited process and removes its cgroup.
    pub fn reap(mut self) {
        if let Err(err) = self.child.wait() {
            tracing::warn!(pid = self.pid, generation = self.generation, %err, "cannot reap a generation");
        }
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.remove();
        }
    }
}

/// How a process ended, from its wait status and its cgroup's OOM kill
/// count. Pure.
pub fn classify(code: Option<i32>, signal: Option<i32>, oom_kills: Option<u64>) -> Cause {
    match (code, signal) {
        (_, Some(libc::SIGKILL)) if oom_kills.is_some_and(|n| n > 0) => Cause::Oom,
        (_, Some(signal)) => Cause::Signal(signal),
        (Some(code), None) => Cause::Exit(code),
        (None, None) => Cause::Exit(-1),
    }
}

/// `exit 2`, `signal 9 (SIGKILL)`, `oom`. Pure.
pub fn describe(cause: Cause) -> String {
    match cause {
        Cause::Exit(code) => format!("exit {code}"),
        Cause::Signal(signal) => match Signal::try_from(signal) {
            Ok(name) => format!("signal {signal} ({name})"),
            Err(_) => format!("signal {signal}"),
        },
        Cause::Oom => "oom".to_string(),
        Cause::SpawnFailed => "could not start".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deaths_are_classified_with_oom_only_for_sigkill_with_a_kill_count() {
        assert_eq!(classify(Some(0), None, None), Cause::Exit(0));
        assert_eq!(classify(None, Some(9), Some(0)), Cause::Signal(9));
        assert_eq!(classify(None, Some(9), Some(1)), Cause::Oom);
        assert_eq!(classify(None, Some(9), None), Cause::Signal(9));
        assert_eq!(classify(None, Some(15), Some(1)), Cause::Signal(15));
        assert_eq!(describe(Cause::Signal(9)), "signal 9 (SIGKILL)");
        assert_eq!(describe(Cause::Exit(2)), "exit 2");
    }

    #[test]
    fn command_line_forwards_options_and_ends_with_the_volume() {
        let log = tempfile::tempfile().unwrap();
        let options = ClientOptions {
            cache_dir: None,
            staging_dir: Some("/s".into()),
            threads: Some(2),
            cache_size_bytes: Some(64 << 20),
        };
        let launch = Launch {
            held_locks: Path::new("/nonexistent/locks"),
            mount_id: "m",
            client_binary: Path::new("/bin/fsclient"),
            socket: Path::new("/state/run/m.sock"),
            volume: "vol",
            base_dir: Path::new("/base"),
            options: &options,
            log: &log,
            generation: 1,
            startup: Startup::Urgent,
        };
        let args: Vec<String> = command_args(&launch)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "serve",
                "--connect",
                "/state/run/m.sock",
                "--base-dir",
                "/base",
                "--staging-dir",
                "/s",
                "--threads",
                "2",
                "--cache-size",
                "67108864",
                "vol"
            ]
        );
    }

    /// A generation of `binary` with no socket, volume or cgroup.
    fn test_launch<'a>(
        binary: &'a Path,
        options: &'a ClientOptions,
        log: &'a File,
        startup: Startup,
    ) -> Launch<'a> {
        Launch {
            held_locks: Path::new("/nonexistent/locks"),
            mount_id: "m",
            client_binary: binary,
            socket: Path::new("/nonexistent"),
            volume: "v",
            base_dir: Path::new("/"),
            options,
            log,
            generation: 1,
            startup,
        }
    }

    #[test]
    fn a_spawned_process_is_seen_exiting_through_its_pidfd_and_reaped() {
        let (log, options) = (tempfile::tempfile().unwrap(), ClientOptions::default());
        let launch = test_launch(Path::new("/bin/false"), &options, &log, Startup::Urgent);
        let process = Process::spawn(&launch, None).unwrap();
        let mut fds = [nix::poll::PollFd::new(
            process.pidfd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10_000u16)).unwrap();
        assert_eq!(ready, 1);
        assert_eq!(process.exit_cause().unwrap(), Some(Cause::Exit(1)));
        // Read without reaping: asked again, the same answer.
        assert_eq!(process.exit_cause().unwrap(), Some(Cause::Exit(1)));
        let pid = process.pid;
        process.reap();
        let gone = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        assert_eq!(
            gone,
            Err(nix::errno::Errno::ECHILD),
            "the process is reaped"
        );
    }

    /// The policy and nice value of `pid` (its main thread).
    fn scheduling_of(pid: u32) -> (i32, i32) {
        // SAFETY: plain queries of a child's scheduling.
        unsafe {
            (
                libc::sched_getscheduler(pid as i32),
                libc::getpriority(libc::PRIO_PROCESS, pid),
            )
        }
    }

    #[test]
    fn a_background_start_is_idle_then_lifted_when_starved_then_raised() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fsclient");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let (log, options) = (tempfile::tempfile().unwrap(), ClientOptions::default());
        let launch = test_launch(&script, &options, &log, Startup::Background);
        // ETXTBSY: another test's fork may briefly hold the script open
        // for writing (inherited until that child execs).
        let mut process = loop {
            match Process::spawn(&launch, None) {
                Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                spawned => break spawned.unwrap(),
            }
        };
        // spawn returns after the exec: the policy was set before it.
        assert_eq!(scheduling_of(process.pid), (libc::SCHED_IDLE, 10));
        let due = process.startup_deadline().unwrap();
        process.lift_if_starved(due - Duration::from_millis(1));
        assert_eq!(scheduling_of(process.pid), (libc::SCHED_IDLE, 10));
        process.lift_if_starved(due);
        assert_eq!(scheduling_of(process.pid), (libc::SCHED_OTHER, 10));
        assert_eq!(process.startup_deadline(), None);
        process.raise_priority();
        assert_eq!(scheduling_of(process.pid), (libc::SCHED_OTHER, 0));
        process.signal(Signal::SIGKILL);
        let _ = process.child.wait();
    }
}
