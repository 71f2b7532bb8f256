//! Restoring mounts at start from the state directory's records, with the
//! /dev/fuse fds systemd kept in its fd store (matched by mount id):
//!
//! ```text
//! record           fd (stored, or      mount live          what happens
//!                  copied)             (same connection)
//! --------------   -----------------   -----------------   -------------------------------------
//! any              yes                 yes                 adopt: the previous generation is
//!                                                          killed and waited for (pidfd), then
//!                                                          a new one starts with RESEND
//! persistent       no / stale          no                  mounted again (reboot)
//! persistent       no, nobody holds    yes (dead)          detached (MNT_DETACH), mounted again
//! persistent       no, held elsewhere  yes                 kept, error: no fd to adopt
//! not persistent   no, nobody holds    yes (dead)          detached, record removed, logged
//! not persistent   no, held elsewhere  yes                 record removed, logged
//! not persistent   no / stale          no                  record removed, logged
//! ```
//!
//! "fd copied": no stored fd, but the recorded generation still runs and
//! holds it; it is copied with pidfd_getfd.
//!
//! "Nobody holds": no stored fd, and no live process that is a generation
//! of this mount (its command line names the mount's socket) holds a
//! /dev/fuse fd. The supervisor, every generation and systemd's fd store
//! are the only holders Baton makes, so the last copy was closed and the
//! kernel aborted the connection: the mount is dead (ENOTCONN) and stays so
//! until unmounted. It is detached without a look through it (no stat: a
//! mount whose connection is alive but unserved would block one), so the
//! mountpoint is a plain directory again, then made afresh or dropped
//! (also listed in `fsctl status` as a start note). "Held elsewhere": such
//! a generation lives but its fd could not be copied; the mount may be
//! served, so it is left alone.
//!
//! The copy from a live generation covers a supervisor restarted outside
//! systemd, and `systemctl stop` + `start` (systemd 252 empties the fd
//! store on stop, while KillMode=process leaves the generations serving).
//!
//! A persistent mount made again starts like a restart: a generation that
//! fails backs off and retries (as `--give-up-after` allows) instead of
//! removing the mount and its record.
//!
//! Adopting never mounts or answers INIT again: the record holds the
//! `NegotiatedInit`. RESEND re-queues every unanswered request of the
//! connection, so the previous generation must be dead first, or requests
//! it is working on would run twice.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fuse_wire::Channel;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use upgrade_protocol::{listen_seqpacket, MountRecord};

use super::{job_starter, Daemon, START_NOTES_MAX};
use crate::executor::{Mount, NewMount};
use crate::generation::pidfd_open;

/// How long the previous supervisor's generation may take to exit after
/// SIGKILL before the mount is left alone (RESEND is unsafe while it lives).
pub const PREVIOUS_EXIT_WAIT_MS: u64 = 10_000;

/// How many times a dead mount is detached at one mountpoint before the
/// restore gives up on it (each detach removes the top mount).
pub const DEAD_DETACH_COUNT_MAX: usize = 8;

/// What to do with one record at start. See the module table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Hold the stored fd and start a generation on it.
    Adopt,
    /// Mount it again (it is not mounted any more).
    MountAgain,
    /// Its connection is dead: detach it, then mount it again.
    DetachThenMountAgain,
    /// Its connection is dead: detach it, then remove the record; log why.
    DetachThenRemove(&'static str),
    /// Leave the record; log why.
    Keep(&'static str),
    /// Remove the record; log why.
    Remove(&'static str),
}

/// Who holds a recorded mount's connection, besides the dead supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// This supervisor: systemd gave the fd back, or it was copied from
    /// the previous generation.
    Us,
    /// A generation of the mount holds a /dev/fuse fd this supervisor
    /// could not take: the mount may still be served.
    Elsewhere,
    /// No one: the connection was aborted when its last fd closed.
    Nobody,
}

/// The decision for `record`, given who holds its connection and which
/// FUSE connection is mounted at its mountpoint now. Pure.
pub fn plan(record: &MountRecord, holder: Holder, mounted_connection: Option<u32>) -> Plan {
    let live = mounted_connection == Some(record.connection_id);
    match (holder, record.persistent, live) {
        (_, true, false) => Plan::MountAgain,
        (_, false, false) => Plan::Remove("not mounted any more and not persistent"),
        (Holder::Us, _, true) => Plan::Adopt,
        (Holder::Nobody, true, true) => Plan::DetachThenMountAgain,
        (Holder::Nobody, false, true) => Plan::DetachThenRemove(
            "its connection was dead (no supervisor, generation or fd store held it: ENOTCONN); detached, and dropped since it is not persistent: mount it again to use it",
        ),
        (Holder::Elsewhere, true, true) => Plan::Keep(
            "still mounted, but systemd kept no fd for it, so it cannot be adopted; it is served by the previous generation (if alive) until you `umount` it, then restart fs-supervisor to mount it again",
        ),
        (Holder::Elsewhere, false, true) => Plan::Remove(
            "still mounted, but systemd kept no fd for it and it is not persistent: it is no longer supervised; `umount` it when done",
        ),
    }
}

/// Detaches (MNT_DETACH) every mount of connection `connection_id` at the
/// top of `mountpoint`, never looking through it. `Ok` once the top mount
/// there is another connection's or none.
pub fn detach_dead(mountpoint: &Path, connection_id: u32) -> Result<usize, String> {
    for detached in 0..DEAD_DETACH_COUNT_MAX {
        if mounted_connection(mountpoint) != Some(connection_id) {
            return Ok(detached);
        }
        fuse_wire::unmount(mountpoint).map_err(|err| err.to_string())?;
    }
    match mounted_connection(mountpoint) == Some(connection_id) {
        true => Err(format!(
            "still mounted after {DEAD_DETACH_COUNT_MAX} detaches"
        )),
        false => Ok(DEAD_DETACH_COUNT_MAX),
    }
}

/// The /dev/fuse fds of process `pid`. A process gone or exiting (a
/// zombie has closed every fd) holds none.
fn fuse_fds(pid: u32) -> Result<Vec<i32>, String> {
    match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(entries) => Ok(entries
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == Path::new("/dev/fuse")))
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()),
        Err(_) if !process_alive(pid) => Ok(Vec::new()),
        Err(err) => Err(format!("listing the fds of pid {pid}: {err}")),
    }
}

/// Whether `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name's closing parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X' | 'x'))
}

/// Whether any live generation of the mount whose socket is `socket` (its
/// command line names it) holds a /dev/fuse fd. `Err` when /proc cannot
/// tell.
pub fn generation_holds_fuse(socket: &Path) -> Result<bool, String> {
    let entries = std::fs::read_dir("/proc").map_err(|err| format!("listing /proc: {err}"))?;
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if pid != std::process::id() && is_generation_of(pid, socket) && !fuse_fds(pid)?.is_empty()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The FUSE connection mounted exactly at `mountpoint` (the top one), from
/// /proc/self/mountinfo. Never touches the mount itself: with no server,
/// any stat on it would block.
pub fn mounted_connection(mountpoint: &Path) -> Option<u32> {
    let table = fuse_wire::mountinfo::read().ok()?;
    let top = fuse_wire::mountinfo::top_at(&table, mountpoint)?;
    top.is_fuse().then_some(top.minor)
}

/// Whether `fd` is an open /dev/fuse (what the fd store must hold).
pub fn is_dev_fuse(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|target| target == Path::new("/dev/fuse"))
}

/// Kills the previous supervisor's generation `pid` of the mount whose
/// socket is `socket` (checked on its command line, so a reused pid is left
/// alone) and waits through a pidfd until it has exited.
pub fn stop_previous_generation(pid: u32, socket: &Path) -> Result<(), String> {
    let pidfd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ESRCH) => return Ok(()),
        Err(errno) => return Err(format!("pidfd_open({pid}): {errno}")),
    };
    // Read after pidfd_open: the pidfd pins this process, not a later one.
    if !is_generation_of(pid, socket) {
        tracing::debug!(
            pid,
            "the recorded generation pid is another process now; left alone"
        );
        return Ok(());
    }
    match rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(errno) => return Err(format!("killing generation pid {pid}: {errno}")),
    }
    let deadline = Instant::now() + Duration::from_millis(PREVIOUS_EXIT_WAIT_MS);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "generation pid {pid} did not exit within {PREVIOUS_EXIT_WAIT_MS} ms of SIGKILL"
            ));
        }
        let timeout = PollTimeout::try_from(left.as_millis() as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => return Err(format!("waiting for generation pid {pid}: {errno}")),
        }
    }
}

/// Copies the /dev/fuse fd out of the previous supervisor's generation
/// `pid` of the mount whose socket is `socket` (pidfd_getfd; the copy is
/// close-on-exec). `None` when that process is gone, is not that
/// generation, or holds no single /dev/fuse fd.
pub fn fd_from_previous_generation(pid: u32, socket: &Path) -> Result<Option<OwnedFd>, String> {
    let pidfd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ESRCH) => return Ok(None),
        Err(errno) => return Err(format!("pidfd_open({pid}): {errno}")),
    };
    if !is_generation_of(pid, socket) {
        return Ok(None);
    }
    let fuse = fuse_fds(pid)?;
    let [target] = fuse[..] else {
        tracing::warn!(pid, fds = ?fuse, "the previous generation holds no single /dev/fuse fd");
        return Ok(None);
    };
    // The copy is close-on-exec (pidfd_getfd always sets it).
    rustix::process::pidfd_getfd(&pidfd, target, rustix::process::PidfdGetfdFlags::empty())
        .map(Some)
        .map_err(|errno| format!("pidfd_getfd(generation pid {pid}, fd {target}): {errno}"))
}

/// Whether `pid` runs `fsclient serve --connect SOCKET` (read after the
/// caller opened a pidfd, so the pid cannot be reused meanwhile).
fn is_generation_of(pid: u32, socket: &Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == socket.as_os_str().as_encoded_bytes())
}

/// Kills whatever is left in the previous supervisor's cgroups of mount
/// `mount_id` (`ID-genN`: a standby never held the fd) and removes them.
fn clean_previous_cgroups(parent: &Path, mount_id: &str) {
    let prefix = format!("{mount_id}-gen");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let leftover = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix));
        if !leftover {
            continue;
        }
        let procs = dir.join("cgroup.procs");
        let pids = || -> Vec<i32> {
            std::fs::read_to_string(&procs)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        };
        for pid in pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let deadline = Instant::now() + Duration::from_millis(PREVIOUS_EXIT_WAIT_MS);
        while !pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Err(err) = std::fs::remove_dir(&dir) {
            tracing::warn!(cgroup = %dir.display(), %err, "cannot remove a previous supervisor's cgroup");
        }
    }
}

impl Daemon {
    /// Restores every mount recorded in the state directory (see the
    /// module table); `stored` are the fds systemd gave back, by mount id.
    /// Stored fds no record claims are closed and removed from the store.
    pub(super) fn restore_mounts(&mut self, mut stored: BTreeMap<String, OwnedFd>) {
        for (path, record) in self.env.state.leftover_records() {
            let record = match record {
                Ok(record) => record,
                Err(err) => {
                    tracing::warn!(record = %path.display(), err, "unreadable state record; left in place");
                    continue;
                }
            };
            let live = mounted_connection(&record.mountpoint);
            let stored_fd = match stored.remove(&record.mount_id) {
                Some(fd) if !is_dev_fuse(&fd) => {
                    tracing::error!(mount = %record.mount_id, "the fd passed under this mount's name is not /dev/fuse; closed");
                    self.systemd.remove_fd(&record.mount_id);
                    None
                }
                other => other,
            };
            let (fd, holder) = match stored_fd {
                Some(fd) => (Some(fd), Holder::Us),
                None if live == Some(record.connection_id) => self.fd_from_generation(&record),
                None => (None, Holder::Nobody),
            };
            let plan = plan(&record, holder, live);
            tracing::info!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), persistent = record.persistent, stored_fd = fd.is_some(), ?holder, ?live, ?plan, "restoring");
            if fd.is_some() && plan != Plan::Adopt {
                self.systemd.remove_fd(&record.mount_id);
            }
            match (plan, fd) {
                (Plan::Adopt, Some(fd)) => self.adopt(record, fd),
                (Plan::MountAgain, _) => self.mount_again(record),
                (Plan::DetachThenMountAgain, _) => {
                    if self.detach_dead_mount(&record) {
                        self.sweep_mount(&record.mount_id);
                        self.note(
                            &record,
                            "its connection was dead (ENOTCONN): detached and mounted again",
                        );
                        self.mount_again(record);
                    }
                }
                (Plan::DetachThenRemove(why), _) => {
                    if self.detach_dead_mount(&record) {
                        self.note(&record, why);
                        self.remove_record(&record, why);
                    }
                }
                (Plan::Keep(why), _) => {
                    tracing::error!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), "not restored: {why}");
                }
                (Plan::Remove(why), _) => self.remove_record(&record, why),
                (Plan::Adopt, None) => {}
            }
        }
        for name in stored.into_keys() {
            tracing::warn!(
                name,
                "systemd kept a fd no state record claims; closed and removed from the store"
            );
            self.systemd.remove_fd(&name);
        }
        self.sweep_orphaned_sockets();
    }

    /// What a mount that is gone left behind (its previous supervisor and
    /// generation died without unmounting it, and it was unmounted since):
    /// its generation socket, its held-locks file, and its generations'
    /// cgroups with anything still running in them.
    fn sweep_mount(&self, mount_id: &str) {
        let _ = std::fs::remove_file(self.env.state.socket_path(mount_id));
        let _ = std::fs::remove_file(self.env.state.held_locks_path(mount_id));
        if let Some(parent) = self.env.cgroups.as_ref().filter(|_| self.passed.is_empty()) {
            clean_previous_cgroups(parent.dir(), mount_id);
        }
    }

    fn remove_record(&self, record: &MountRecord, why: &str) {
        tracing::warn!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), "state record removed: {why}");
        if let Err(err) = self.env.state.remove_record(&record.mount_id) {
            tracing::warn!(mount = %record.mount_id, %err, "cannot remove the state record");
        }
        self.sweep_mount(&record.mount_id);
    }

    /// Detaches the dead mount of `record`; `false` (logged, the record
    /// left in place) if it cannot be.
    fn detach_dead_mount(&mut self, record: &MountRecord) -> bool {
        match detach_dead(&record.mountpoint, record.connection_id) {
            Ok(count) => {
                tracing::warn!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), connection_id = record.connection_id, count, "nobody held this mount's connection any more (supervisor, generations and fd store all gone): the dead mount is detached");
                true
            }
            Err(err) => {
                tracing::error!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), err, "its connection is dead, but it cannot be detached; the record stays: `umount -l` it and restart fs-supervisor");
                self.note(record, "its connection is dead, but it could not be detached: `umount -l` it and restart fs-supervisor");
                false
            }
        }
    }

    /// Keeps a line for `fsctl status` about what the start did to a mount.
    fn note(&mut self, record: &MountRecord, what: &str) {
        if self.start_notes.len() < START_NOTES_MAX {
            self.start_notes
                .push(format!("{}: {what}", record.mountpoint.display()));
        }
    }

    /// Generation sockets (`run/<16 hex digits>.sock`) of mounts this
    /// supervisor does not hold: a crash left them.
    fn sweep_orphaned_sockets(&self) {
        let Ok(entries) = std::fs::read_dir(self.env.state.run_dir()) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".sock"))
            else {
                continue;
            };
            let is_mount_id = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
            if is_mount_id && !self.mounts.iter().any(|m| m.id == id) {
                tracing::info!(socket = %path.display(), "removing a generation socket no mount uses");
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// The fd of `record`'s live connection copied from its previous
    /// generation, or who else may hold it.
    fn fd_from_generation(&self, record: &MountRecord) -> (Option<OwnedFd>, Holder) {
        let socket = self.env.state.socket_path(&record.mount_id);
        if let Some(pid) = record.pid {
            match fd_from_previous_generation(pid, &socket) {
                Ok(Some(fd)) => {
                    tracing::info!(mount = %record.mount_id, pid, "no stored fd: copied the /dev/fuse fd from the previous generation");
                    return (Some(fd), Holder::Us);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(mount = %record.mount_id, pid, err, "cannot copy the fd from the previous generation");
                    return (None, Holder::Elsewhere);
                }
            }
        }
        match generation_holds_fuse(&socket) {
            Ok(false) => (None, Holder::Nobody),
            Ok(true) => (None, Holder::Elsewhere),
            Err(err) => {
                tracing::warn!(mount = %record.mount_id, err, "cannot tell whether a generation still holds the connection");
                (None, Holder::Elsewhere)
            }
        }
    }

    fn mount_again(&mut self, record: MountRecord) {
        let (reply, _) = mpsc::channel();
        let result = self.mount(
            record.volume.clone(),
            &record.mountpoint,
            record.base_dir.clone(),
            record.options.clone(),
            reply,
            super::MountHow {
                persist: true,
                restored: Some(&record),
            },
        );
        if let Err(refusal) = result {
            tracing::error!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), ?refusal, "cannot mount a persistent mount again; the record stays: fix the cause and restart fs-supervisor");
        }
    }

    /// Holds `fd` (the live connection of `record`), stops the previous
    /// generation and starts a new one that RESENDs.
    fn adopt(&mut self, record: MountRecord, fd: OwnedFd) {
        let id = record.mount_id.clone();
        let socket_path = self.env.state.socket_path(&id);
        let passed = self.passed.contains(&id);
        if let Some(pid) = record.pid.filter(|_| !passed) {
            if let Err(err) = stop_previous_generation(pid, &socket_path) {
                tracing::error!(mount = %id, pid, err, "cannot stop the previous generation; the mount is left to it (a second generation would run its requests twice). Kill it and restart fs-supervisor");
                return;
            }
        }
        if let Some(parent) = self.env.cgroups.as_ref().filter(|_| !passed) {
            clean_previous_cgroups(parent.dir(), &id);
        }
        let _ = std::fs::remove_file(&socket_path);
        let listener = match listen_seqpacket(&socket_path, 0o600) {
            Ok(listener) => listener,
            Err(err) => {
                tracing::error!(mount = %id, socket = %socket_path.display(), %err, "cannot create the generation socket; the mount is not restored");
                return;
            }
        };
        let log = match self.env.state.open_log(&id) {
            Ok(log) => log,
            Err(err) => {
                tracing::error!(mount = %id, %err, "cannot open the generation log; the mount is not restored");
                return;
            }
        };
        let (reply, _) = mpsc::channel();
        let parts = NewMount {
            // The same identity: exactly-once records of requests the dead
            // generation committed are keyed by it.
            connection_identity: match record.connection_identity {
                0 => upgrade_protocol::connection_identity(),
                known => known,
            },
            // An upgraded mount keeps running its new binary.
            client_binary: record
                .client_binary
                .clone()
                .unwrap_or_else(|| self.env.client_binary.clone()),
            log_path: self.env.state.log_path(&id),
            id: id.clone(),
            mountpoint: record.mountpoint.clone(),
            volume: record.volume.clone(),
            base_dir: record.base_dir.clone(),
            options: record.options.clone(),
            channel: Channel::new(fd),
            init: record.init,
            connection_id: record.connection_id,
            listener,
            socket_path,
            log,
        };
        let mut mount = Mount::new(parts, reply);
        mount.persistent = record.persistent;
        self.mounts.push(mount);
        let index = self.mounts.len() - 1;
        let start_job = job_starter(self.waker.clone());
        self.mounts[index].resume(&self.env, &record, &start_job);
        if let Some(channel) = &self.mounts[index].channel {
            self.systemd.store_fd(&id, channel.fd());
        }
        tracing::info!(mount = %id, mountpoint = %record.mountpoint.display(), previous_generation = record.generation, "adopted a live mount");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use upgrade_protocol::{ClientOptions, NegotiatedInit, RECORD_FORMAT_VERSION};

    fn record(persistent: bool) -> MountRecord {
        MountRecord {
            format_version: RECORD_FORMAT_VERSION,
            mount_id: "abc".into(),
            mountpoint: "/mnt/x".into(),
            volume: "v".into(),
            base_dir: "/b".into(),
            options: ClientOptions::default(),
            connection_id: 40,
            connection_identity: 0,
            client_binary: None,
            init: NegotiatedInit {
                major: 7,
                minor: 45,
                kernel_minor: 45,
                flags: 0,
                max_readahead: 1,
                max_write: 2,
                max_pages: 3,
                max_background: 4,
                congestion_threshold: 5,
                time_gran: 1,
            },
            has_resend: true,
            supervisor_pid: 1,
            generation: 3,
            pid: Some(9),
            created_unix_ms: 0,
            persistent,
            history: None,
        }
    }

    #[test]
    fn every_record_case_has_one_plan() {
        for persistent in [false, true] {
            let r = record(persistent);
            assert_eq!(plan(&r, Holder::Us, Some(40)), Plan::Adopt);
            // A stored fd of a connection that is no longer mounted there.
            for holder in [Holder::Us, Holder::Elsewhere, Holder::Nobody] {
                let stale = plan(&r, holder, Some(41));
                assert_eq!(stale, plan(&r, holder, None));
                assert_eq!(stale, plan(&r, Holder::Nobody, None));
            }
            let gone = plan(&r, Holder::Nobody, None);
            let dead = plan(&r, Holder::Nobody, Some(40));
            let elsewhere = plan(&r, Holder::Elsewhere, Some(40));
            if persistent {
                assert_eq!(gone, Plan::MountAgain);
                assert_eq!(dead, Plan::DetachThenMountAgain);
                assert!(matches!(elsewhere, Plan::Keep(_)));
            } else {
                assert!(matches!(gone, Plan::Remove(_)));
                assert!(matches!(dead, Plan::DetachThenRemove(_)));
                assert!(matches!(elsewhere, Plan::Remove(_)));
            }
        }
    }

    #[test]
    fn a_foreign_process_or_none_holds_no_generations_fuse_fd() {
        // No process names this socket on its command line.
        assert_eq!(
            generation_holds_fuse(Path::new("/nonexistent/run/0123456789abcdef.sock")),
            Ok(false)
        );
        assert_eq!(fuse_fds(i32::MAX as u32), Ok(Vec::new()));
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(i32::MAX as u32));
    }

    #[test]
    fn detaching_where_the_connection_is_not_mounted_does_nothing() {
        assert_eq!(detach_dead(Path::new("/nonexistent/mnt"), 40), Ok(0));
    }

    #[test]
    fn a_missing_or_foreign_previous_generation_is_left_alone() {
        // No such pid.
        assert!(stop_previous_generation(i32::MAX as u32, Path::new("/x.sock")).is_ok());
        // A live process that is not a generation of this mount survives.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(stop_previous_generation(child.id(), Path::new("/x.sock")).is_ok());
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_previous_generation_is_killed_and_waited_for() {
        let socket = Path::new("/tmp/baton-restore-test.sock");
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x", "sh"])
            .arg(socket)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Until it has exec'd, its command line is ours.
        let cmdline = format!("/proc/{}/cmdline", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !String::from_utf8_lossy(&std::fs::read(&cmdline).unwrap()).contains("read x") {
            assert!(Instant::now() < deadline, "sh never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        stop_previous_generation(child.id(), socket).unwrap();
        // Exited (a zombie until reaped): the pidfd said so.
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }

    #[test]
    fn only_a_dev_fuse_fd_is_taken_as_a_mount() {
        let (a, _b) = nix::unistd::pipe().unwrap();
        assert!(!is_dev_fuse(&a));
        let fuse: OwnedFd = std::fs::File::open("/dev/fuse").unwrap().into();
        assert!(is_dev_fuse(&fuse));
    }

    #[test]
    fn mountinfo_is_read_without_touching_the_mount() {
        assert_eq!(mounted_connection(Path::new("/nonexistent/mnt")), None);
        // `/` is not FUSE here.
        assert_eq!(mounted_connection(Path::new("/")), None);
    }
}
