//! Prometheus metrics (`GET /metrics`, text format 0.0.4 by
//! `prometheus-client`, `prometheus.rs`), an HTML status page with tips
//! (`GET /`, `page.rs`), `/healthz` and `/readyz` on the address the
//! operator names (`--metrics-listen`; a non-loopback one is logged as a
//! warning). The event loop publishes a [`Snapshot`] of every mount's status
//! after each turn; the HTTP thread (`http.rs`: hyper, a task per
//! connection) answers from the latest snapshot, so a scrape never touches
//! the loop and an idle connection never delays another's scrape.

mod http;
mod page;
mod prometheus;

pub use http::{serve, CONNECTIONS_MAX, REQUEST_BYTES_MAX, REQUEST_TIMEOUT_MS};
pub use page::{
    bytes_text, chart_svg, duration_text, health, micros_text, render_page,
    render_page_with_charts, tips, Health, INCIDENTS_SHOWN_MAX, PAGE_REFRESH_S, TIP_WINDOW_MS,
};
pub use prometheus::render;

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use fuse_wire::abi::opcode;
use upgrade_protocol::MountStatus;

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
    /// Each mount's request totals about once a minute, for the page's
    /// chart, by mount id.
    charts: BTreeMap<String, VecDeque<ChartPoint>>,
}

/// Points a mount's chart keeps: an hour of one a minute, plus the start.
pub const CHART_POINTS_MAX: usize = 61;
/// Time between two chart points.
pub const CHART_INTERVAL_MS: u64 = 60_000;

/// A mount's request totals at one time (its chart plots the differences).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChartPoint {
    /// When (Unix time, ms).
    pub at_unix_ms: u64,
    /// Requests over the mount's life.
    pub request_count: u64,
    /// Sum of their handling times, µs.
    pub latency_us_sum: u64,
}

/// `m`'s request totals at `now_unix_ms`. Pure.
fn chart_point(m: &MountStatus, now_unix_ms: u64) -> ChartPoint {
    let io = m.counters.as_ref().map(|c| &c.io);
    ChartPoint {
        at_unix_ms: now_unix_ms,
        request_count: io.map_or(0, |io| io.request_count()),
        latency_us_sum: io.map_or(0, |io| io.requests.iter().map(|o| o.latency_us_sum).sum()),
    }
}

/// Adds a point for `m` to `points` when the last is at least
/// [`CHART_INTERVAL_MS`] old, keeping [`CHART_POINTS_MAX`]. Pure.
fn chart_sample(points: &mut VecDeque<ChartPoint>, m: &MountStatus, now_unix_ms: u64) {
    let due = points
        .back()
        .is_none_or(|p| now_unix_ms.saturating_sub(p.at_unix_ms) >= CHART_INTERVAL_MS);
    if !due {
        return;
    }
    points.push_back(chart_point(m, now_unix_ms));
    while points.len() > CHART_POINTS_MAX {
        points.pop_front();
    }
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
            let now_unix_ms = unix_ms_now();
            published
                .charts
                .retain(|id, _| mounts.iter().any(|m| &m.mount_id == id));
            for m in &mounts {
                let points = published.charts.entry(m.mount_id.clone()).or_default();
                chart_sample(points, m, now_unix_ms);
            }
            published.mounts = mounts;
        }
    }

    /// Each mount's chart points, oldest first, by mount id: the samples a
    /// minute apart, then its latest totals at `now_unix_ms` (when later),
    /// so the chart ends at the present and shows from a mount's first
    /// seconds. The latest totals are current: a generation reports a
    /// change within a second and every report is published.
    fn charts(&self, now_unix_ms: u64) -> BTreeMap<String, Vec<ChartPoint>> {
        self.published
            .lock()
            .map(|p| {
                p.charts
                    .iter()
                    .map(|(id, samples)| {
                        let mut points: Vec<ChartPoint> = samples.iter().copied().collect();
                        let live = p
                            .mounts
                            .iter()
                            .find(|m| &m.mount_id == id)
                            .map(|m| chart_point(m, now_unix_ms))
                            .filter(|l| points.last().is_none_or(|s| l.at_unix_ms > s.at_unix_ms));
                        points.extend(live);
                        (id.clone(), points)
                    })
                    .collect()
            })
            .unwrap_or_default()
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

/// A mount's memory at scrape time: the serving generation's resident set
/// (`/proc/PID/status`) and its memory cgroup's usage and limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// VmRSS of the serving generation.
    pub rss_bytes: Option<u64>,
    /// The cgroup's `memory.current` (v2) or `memory.usage_in_bytes` (v1).
    pub cgroup_bytes: Option<u64>,
    /// Its `memory.max` or `memory.limit_in_bytes`; `None` when unlimited.
    pub cgroup_limit_bytes: Option<u64>,
}

/// A v1 limit at or above this is "no limit" (the kernel shows
/// `PAGE_COUNTER_MAX` pages, about 2^63 bytes).
const UNLIMITED_BYTES_MIN: u64 = 1 << 62;

/// Reads `m`'s [`Memory`] now; what cannot be read is `None`.
pub fn read_memory(m: &MountStatus) -> Memory {
    let rss_bytes = m
        .pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|status| parse_vm_rss_bytes(&status));
    let cgroup_file = |names: [&str; 2]| {
        let dir = m.cgroup.as_deref()?;
        let text = names
            .iter()
            .find_map(|name| std::fs::read_to_string(dir.join(name)).ok())?;
        parse_cgroup_bytes(&text)
    };
    Memory {
        rss_bytes,
        cgroup_bytes: cgroup_file(["memory.current", "memory.usage_in_bytes"]),
        cgroup_limit_bytes: cgroup_file(["memory.max", "memory.limit_in_bytes"]),
    }
}

/// `VmRSS:   1234 kB` of a `/proc/PID/status`, in bytes. Pure.
pub fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// A cgroup memory file's byte count; `None` for `max` or a v1 "no
/// limit". Pure.
pub fn parse_cgroup_bytes(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|bytes| *bytes < UNLIMITED_BYTES_MIN)
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

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
