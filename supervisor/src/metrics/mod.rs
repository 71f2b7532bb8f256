//! Prometheus metrics (`GET /metrics`, text format 0.0.4, `prometheus.rs`)
//! and an HTML status page with tips (`GET /`, `page.rs`) on a loopback
//! address (`--metrics-listen`). The event loop publishes a [`Snapshot`] of
//! every mount's status after each turn; one thread answers HTTP from the
//! latest snapshot, so a scrape never touches the loop. Plain std HTTP/1.0:
//! one request per connection, a bounded request size and a read timeout.

mod page;
mod prometheus;

pub use page::{health, render_page, tips, Health, INCIDENTS_SHOWN_MAX, TIP_WINDOW_MS};
pub use prometheus::{escape_label, render};

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuse_wire::abi::opcode;
use upgrade_protocol::MountStatus;

/// Bytes of an HTTP request read at most.
pub const REQUEST_BYTES_MAX: usize = 8192;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT_MS: u64 = 2_000;

/// Supervisor-wide counters: every mount's, the unmounted ones included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SupervisorTotals {
    /// Generation processes started.
    pub generations_started: u64,
    /// Planned upgrades that succeeded.
    pub upgrades: u64,
    /// Planned upgrades rolled back.
    pub rollbacks: u64,
}

impl SupervisorTotals {
    fn of(m: &MountStatus) -> SupervisorTotals {
        let c = m.counters.clone().unwrap_or_default();
        SupervisorTotals {
            generations_started: c.generations_started,
            upgrades: c.upgrades,
            rollbacks: c.rollbacks,
        }
    }

    fn add(&mut self, other: SupervisorTotals) {
        self.generations_started += other.generations_started;
        self.upgrades += other.upgrades;
        self.rollbacks += other.rollbacks;
    }
}

#[derive(Default)]
struct Published {
    mounts: Vec<MountStatus>,
    /// The last totals of each mount, by mount id.
    last: BTreeMap<String, SupervisorTotals>,
    /// Totals of mounts that are gone.
    gone: SupervisorTotals,
}

/// The latest statuses, shared between the loop and the HTTP thread.
#[derive(Clone)]
pub struct Snapshot {
    published: Arc<Mutex<Published>>,
    started: Instant,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            published: Arc::default(),
            started: Instant::now(),
        }
    }
}

impl Snapshot {
    /// Replaces the statuses (called by the loop). A mount that is gone
    /// keeps counting in the supervisor-wide totals.
    pub fn publish(&self, mounts: Vec<MountStatus>) {
        if let Ok(mut guard) = self.published.lock() {
            let published = &mut *guard;
            let mut last = BTreeMap::new();
            for m in &mounts {
                last.insert(m.mount_id.clone(), SupervisorTotals::of(m));
            }
            for (id, totals) in &published.last {
                if !last.contains_key(id) {
                    published.gone.add(*totals);
                }
            }
            published.last = last;
            published.mounts = mounts;
        }
    }

    fn read(&self) -> (Vec<MountStatus>, SupervisorTotals) {
        self.published
            .lock()
            .map(|p| {
                let mut totals = p.gone;
                p.last.values().for_each(|t| totals.add(*t));
                (p.mounts.clone(), totals)
            })
            .unwrap_or_default()
    }
}

/// The lower-case name of a FUSE opcode (`read`, `write`, ...), or its
/// number for one this supervisor does not know. Pure.
pub fn opcode_name(op: u32) -> Cow<'static, str> {
    let name = match op {
        opcode::LOOKUP => "lookup",
        opcode::FORGET => "forget",
        opcode::GETATTR => "getattr",
        opcode::SETATTR => "setattr",
        opcode::READLINK => "readlink",
        opcode::SYMLINK => "symlink",
        opcode::MKNOD => "mknod",
        opcode::MKDIR => "mkdir",
        opcode::UNLINK => "unlink",
        opcode::RMDIR => "rmdir",
        opcode::RENAME => "rename",
        opcode::LINK => "link",
        opcode::OPEN => "open",
        opcode::READ => "read",
        opcode::WRITE => "write",
        opcode::STATFS => "statfs",
        opcode::RELEASE => "release",
        opcode::FSYNC => "fsync",
        opcode::SETXATTR => "setxattr",
        opcode::GETXATTR => "getxattr",
        opcode::LISTXATTR => "listxattr",
        opcode::REMOVEXATTR => "removexattr",
        opcode::FLUSH => "flush",
        opcode::INIT => "init",
        opcode::OPENDIR => "opendir",
        opcode::READDIR => "readdir",
        opcode::RELEASEDIR => "releasedir",
        opcode::FSYNCDIR => "fsyncdir",
        opcode::GETLK => "getlk",
        opcode::SETLK => "setlk",
        opcode::SETLKW => "setlkw",
        opcode::ACCESS => "access",
        opcode::CREATE => "create",
        opcode::INTERRUPT => "interrupt",
        opcode::BMAP => "bmap",
        opcode::DESTROY => "destroy",
        opcode::IOCTL => "ioctl",
        opcode::POLL => "poll",
        opcode::BATCH_FORGET => "batch_forget",
        opcode::FALLOCATE => "fallocate",
        opcode::READDIRPLUS => "readdirplus",
        opcode::RENAME2 => "rename2",
        opcode::LSEEK => "lseek",
        opcode::COPY_FILE_RANGE => "copy_file_range",
        opcode::SYNCFS => "syncfs",
        opcode::TMPFILE => "tmpfile",
        opcode::STATX => "statx",
        opcode::COPY_FILE_RANGE_64 => "copy_file_range_64",
        other => return Cow::Owned(format!("opcode_{other}")),
    };
    Cow::Borrowed(name)
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Binds `addr` (refusing non-loopback addresses: the page names paths
/// and pids) and answers in a thread.
pub fn serve(addr: SocketAddr, snapshot: Snapshot) -> std::io::Result<SocketAddr> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--metrics-listen {addr} is not a loopback address; use 127.0.0.1:PORT or [::1]:PORT"),
        ));
    }
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, "metrics and status page");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(err) = answer(stream, &snapshot) {
                    tracing::debug!(%err, "metrics request failed");
                }
            }
        })?;
    Ok(local)
}

/// Why the supervisor is not ready: the persistent mounts (`--persist`,
/// the ones a node must have) that do not serve. Pure.
fn not_ready(mounts: &[MountStatus]) -> Option<String> {
    let waiting: Vec<String> = mounts
        .iter()
        .filter(|m| m.persistent && m.state != "serving")
        .map(|m| format!("{} is {}\n", m.mountpoint.display(), m.state))
        .collect();
    (!waiting.is_empty()).then(|| {
        format!(
            "not ready: persistent mounts not serving:\n{}",
            waiting.concat()
        )
    })
}

fn answer(mut stream: TcpStream, snapshot: &Snapshot) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < REQUEST_BYTES_MAX {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (mounts, totals) = snapshot.read();
    let uptime_s = snapshot.started.elapsed().as_secs();
    let (status, kind, body) = match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            render(&mounts, &totals, uptime_s),
        ),
        "/" => (
            "200 OK",
            "text/html; charset=utf-8",
            render_page(&mounts, &totals, uptime_s, unix_ms_now()),
        ),
        // The loop published a snapshot: the process answers.
        "/healthz" => ("200 OK", "text/plain", "ok\n".into()),
        "/readyz" => match not_ready(&mounts) {
            None => ("200 OK", "text/plain", "ready\n".into()),
            Some(why) => ("503 Service Unavailable", "text/plain", why),
        },
        _ => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics, /, /healthz or /readyz\n".into(),
        ),
    };
    write!(
        stream,
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
