//! The systemd side of fs-supervisor: `sd_notify` (READY=1, STATUS=,
//! WATCHDOG=1, STOPPING=1) and the file descriptor store (FDSTORE=1 with
//! each mount's /dev/fuse fd, FDSTOREREMOVE=1 on unmount), and taking the
//! stored fds back at start (`LISTEN_FDS`/`LISTEN_FDNAMES`, matched by
//! name, never by position).
//!
//! Implemented directly on the `$NOTIFY_SOCKET` datagram socket with nix:
//! the protocol is one `sendmsg` of `KEY=VALUE` lines with an optional
//! SCM_RIGHTS fd. The small crates (`sd-notify`, `libsystemd`) either lack
//! FDPOLL=0 or pull in far more than these ~200 lines; FDPOLL=0 is not
//! optional for us: systemd polls a stored fd and drops it when it reports
//! an error, and a /dev/fuse fd nobody reads polls as one.
//!
//! Everything here is a no-op without `$NOTIFY_SOCKET` (not under systemd).

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{
    sendmsg, socket, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};

/// The first fd systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;
/// Fds taken from `LISTEN_FDS` at most (more is a misconfiguration).
pub const LISTEN_FDS_MAX: usize = 1024;
/// systemd's limit on an FDNAME.
pub const FDNAME_LEN_MAX: usize = 255;

/// Why the systemd environment or a notification is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SystemdError {
    /// A `LISTEN_*` variable does not parse.
    #[error("{name}={value} is not valid ({why}); fix the unit or unset it")]
    BadVariable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// An fd name systemd would refuse.
    #[error("fd name `{name}` is not a valid FDNAME (1-255 printable characters, no `:`)")]
    BadFdName {
        /// The name.
        name: String,
    },
}

/// `READY=1` plus a status line. Pure.
pub fn ready_message(status: &str) -> String {
    format!("READY=1\nSTATUS={}", one_line(status))
}

/// `STATUS=...`. Pure.
pub fn status_message(status: &str) -> String {
    format!("STATUS={}", one_line(status))
}

/// Stores a fd under `name`, never polled by systemd. Pure.
pub fn fdstore_message(name: &str) -> Result<String, SystemdError> {
    check_fd_name(name)?;
    Ok(format!("FDSTORE=1\nFDNAME={name}\nFDPOLL=0"))
}

/// Removes the stored fds named `name`. Pure.
pub fn fdstore_remove_message(name: &str) -> Result<String, SystemdError> {
    check_fd_name(name)?;
    Ok(format!("FDSTOREREMOVE=1\nFDNAME={name}"))
}

fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

fn check_fd_name(name: &str) -> Result<(), SystemdError> {
    let ok = !name.is_empty()
        && name.len() <= FDNAME_LEN_MAX
        && name.chars().all(|c| c.is_ascii_graphic() && c != ':');
    if ok {
        Ok(())
    } else {
        Err(SystemdError::BadFdName { name: name.into() })
    }
}

/// The fds systemd passed, by name: `(name, fd number)` from the values of
/// `LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES` and our pid. `None` when
/// they are meant for another process (or absent). Pure.
pub fn parse_listen_fds(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    listen_fdnames: Option<&str>,
    own_pid: u32,
) -> Result<Option<Vec<(String, RawFd)>>, SystemdError> {
    let (Some(pid), Some(count)) = (listen_pid, listen_fds) else {
        return Ok(None);
    };
    let bad = |name, value: &str, why| SystemdError::BadVariable {
        name,
        value: value.into(),
        why,
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|_| bad("LISTEN_PID", pid, "not a pid"))?;
    if pid != own_pid {
        return Ok(None);
    }
    let n: usize = count
        .trim()
        .parse()
        .map_err(|_| bad("LISTEN_FDS", count, "not a count"))?;
    if n > LISTEN_FDS_MAX {
        return Err(bad("LISTEN_FDS", count, "more than LISTEN_FDS_MAX"));
    }
    let names: Vec<&str> = match listen_fdnames {
        Some(names) if n > 0 => names.split(':').collect(),
        _ => Vec::new(),
    };
    if !names.is_empty() && names.len() != n {
        return Err(bad(
            "LISTEN_FDNAMES",
            listen_fdnames.unwrap_or_default(),
            "its count differs from LISTEN_FDS",
        ));
    }
    Ok(Some(
        (0..n)
            .map(|i| {
                let name = names.get(i).copied().unwrap_or("unknown");
                (name.to_string(), LISTEN_FDS_START + i as RawFd)
            })
            .collect(),
    ))
}

/// Takes the fds systemd passed this process: close-on-exec from now on,
/// by name (a name given twice keeps the last fd and closes the others).
/// Unsets the `LISTEN_*` variables so no child sees them. Call before any
/// thread exists.
pub fn take_listen_fds() -> Result<BTreeMap<String, OwnedFd>, SystemdError> {
    let var = |name| std::env::var(name).ok();
    let parsed = parse_listen_fds(
        var("LISTEN_PID").as_deref(),
        var("LISTEN_FDS").as_deref(),
        var("LISTEN_FDNAMES").as_deref(),
        std::process::id(),
    );
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let mut fds = BTreeMap::new();
    for (name, raw) in parsed?.unwrap_or_default() {
        if fcntl(unsafe_borrow(raw), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).is_err() {
            tracing::warn!(
                fd = raw,
                name,
                "LISTEN_FDS names a fd that is not open; ignored"
            );
            continue;
        }
        // SAFETY: systemd passed this fd to us (LISTEN_PID is our pid) and
        // nothing else in this process owns it; it was just checked open.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if fds.insert(name.clone(), fd).is_some() {
            tracing::warn!(
                name,
                "two stored fds share a name; the earlier one is closed"
            );
        }
    }
    Ok(fds)
}

fn unsafe_borrow(raw: RawFd) -> BorrowedFd<'static> {
    // SAFETY: only used for one fcntl on a fd number systemd said it
    // passed; F_SETFD on a closed number fails with EBADF, nothing else.
    unsafe { BorrowedFd::borrow_raw(raw) }
}

/// `$WATCHDOG_USEC` as the interval to ping at (half of it), if the
/// watchdog is meant for us (`$WATCHDOG_PID` absent or our pid). Pure.
pub fn watchdog_interval(
    watchdog_usec: Option<&str>,
    watchdog_pid: Option<&str>,
    own_pid: u32,
) -> Option<Duration> {
    let usec: u64 = watchdog_usec?.trim().parse().ok()?;
    if usec == 0 {
        return None;
    }
    if let Some(pid) = watchdog_pid {
        if pid.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

/// The connection to systemd's notify socket (absent when not under
/// systemd) and the watchdog schedule.
pub struct Notifier {
    socket: Option<(OwnedFd, UnixAddr)>,
    watchdog: Option<(Duration, Instant)>,
    last_status: String,
    inherited: Vec<(&'static str, std::ffi::OsString)>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET` and `$WATCHDOG_USEC`; unsets them so children
    /// (generations) never notify in our name. Call before any thread.
    pub fn from_env() -> Notifier {
        let inherited: Vec<(&'static str, std::ffi::OsString)> =
            ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"]
                .into_iter()
                .filter_map(|name| std::env::var_os(name).map(|v| (name, v)))
                .collect();
        let path = std::env::var_os("NOTIFY_SOCKET");
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
            std::env::remove_var(name);
        }
        let mut notifier = Notifier::new(path.as_ref().map(|p| p.as_bytes()), watchdog);
        notifier.inherited = inherited;
        notifier
    }

    /// The systemd variables this process was started with, for a
    /// re-executed image (`fsctl upgrade-supervisor`) to keep notifying.
    pub fn inherited_env(&self) -> &[(&'static str, std::ffi::OsString)] {
        &self.inherited
    }

    /// Towards the socket at `path` (`@name`: abstract), pinging the
    /// watchdog every `watchdog` if given. `None`: a no-op notifier.
    pub fn new(path: Option<&[u8]>, watchdog: Option<Duration>) -> Notifier {
        let socket = path.and_then(|path| match open(path) {
            Ok(socket) => Some(socket),
            Err(errno) => {
                tracing::error!(socket = %String::from_utf8_lossy(path), %errno, "cannot use $NOTIFY_SOCKET; systemd will not hear from fs-supervisor");
                None
            }
        });
        if let (Some(interval), Some(_)) = (watchdog, &socket) {
            tracing::info!(
                interval_ms = interval.as_millis() as u64,
                "systemd watchdog"
            );
        }
        Notifier {
            watchdog: watchdog
                .filter(|_| socket.is_some())
                .map(|i| (i, Instant::now())),
            socket,
            last_status: String::new(),
            inherited: Vec::new(),
        }
    }

    /// Whether systemd listens (fd store usable).
    pub fn active(&self) -> bool {
        self.socket.is_some()
    }

    fn send(&self, message: &str, fd: Option<BorrowedFd<'_>>) {
        let Some((socket, addr)) = &self.socket else {
            return;
        };
        if let Err(errno) = send_to(socket, addr, message, fd) {
            let kind = message.lines().next().unwrap_or_default();
            tracing::warn!(%errno, message = kind, "cannot notify systemd");
        }
    }

    /// READY=1 with a status line.
    pub fn ready(&mut self, status: &str) {
        self.last_status = status.to_string();
        self.send(&ready_message(status), None);
    }

    /// STATUS=..., only when it changed.
    pub fn status(&mut self, status: &str) {
        if status != self.last_status {
            self.last_status = status.to_string();
            self.send(&status_message(status), None);
        }
    }

    /// STOPPING=1.
    pub fn stopping(&self) {
        self.send("STOPPING=1", None);
    }

    /// Stores `fd` under `name` (FDPOLL=0).
    pub fn store_fd(&self, name: &str, fd: BorrowedFd<'_>) {
        match fdstore_message(name) {
            Ok(message) if self.active() => {
                self.send(&message, Some(fd));
                tracing::info!(mount = name, "fd stored with systemd");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "fd not stored"),
        }
    }

    /// Removes the fd stored under `name`.
    pub fn remove_fd(&self, name: &str) {
        match fdstore_remove_message(name) {
            Ok(message) => self.send(&message, None),
            Err(err) => tracing::warn!(%err, "fd not removed from the store"),
        }
    }

    /// When the next watchdog ping is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.watchdog.map(|(interval, last)| last + interval)
    }

    /// Pings the watchdog if due at `now`.
    pub fn tick(&mut self, now: Instant) {
        if let Some((interval, last)) = self.watchdog {
            if now >= last + interval {
                self.send("WATCHDOG=1", None);
                self.watchdog = Some((interval, now));
            }
        }
    }
}

/// A datagram socket towards `path` (`@name` is an abstract address).
fn open(path: &[u8]) -> Result<(OwnedFd, UnixAddr), nix::errno::Errno> {
    let addr = match path.strip_prefix(b"@") {
        Some(name) => UnixAddr::new_abstract(name)?,
        None => UnixAddr::new(path)?,
    };
    let socket = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    Ok((socket, addr))
}

fn send_to(
    socket: &OwnedFd,
    addr: &UnixAddr,
    message: &str,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), nix::errno::Errno> {
    let iov = [IoSlice::new(message.as_bytes())];
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    sendmsg(
        socket.as_raw_fd(),
        &iov,
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        Some(addr),
    )
    .map(|_| ())
}

#[cfg(test)]
#[path = "systemd_tests.rs"]
mod tests;
