//! Measurement helpers for `baton-bench`: timed loops of one syscall on
//! several threads, latency percentiles, medians over runs, and the mounts
//! being compared (started and torn down by guards). [`fs`] holds the
//! filesystem workloads, [`settle`] the wait for a quiet machine between
//! them, [`disk`] what the disk under test is.

pub mod disk;
pub mod fs;
pub mod settle;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mount_guard::{wait_for_mount, ChildGuard, MountGuard};

/// Latencies and throughput of one timed run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunResult {
    /// Operations per second, all threads together.
    pub ops_per_sec: f64,
    /// Median latency, microseconds.
    pub latency_us_p50: f64,
    /// 99th percentile latency, microseconds.
    pub latency_us_p99: f64,
    /// Failed operations.
    pub errors: u64,
}

/// Runs `op` on `threads` threads for `duration`; `op(thread, iteration)`.
pub fn timed<F>(threads: usize, duration: Duration, op: F) -> RunResult
where
    F: Fn(usize, u64) -> std::io::Result<()> + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let (op, stop) = (Arc::clone(&op), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut latencies_ns = Vec::with_capacity(1 << 16);
                let mut errors = 0u64;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if op(thread, i).is_err() {
                        errors += 1;
                    }
                    latencies_ns.push(t.elapsed().as_nanos() as u64);
                    i += 1;
                }
                (latencies_ns, errors)
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for handle in handles {
        if let Ok((latencies, e)) = handle.join() {
            all.extend(latencies);
            errors += e;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    RunResult {
        ops_per_sec: all.len() as f64 / elapsed,
        latency_us_p50: percentile(&all, 0.50) / 1000.0,
        latency_us_p99: percentile(&all, 0.99) / 1000.0,
        errors,
    }
}

/// The `q` quantile of sorted values (0.0 when empty).
pub fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)] as f64
}

/// Median, minimum and maximum of repeated runs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Median of the runs' ops/s.
    pub ops_per_sec_median: f64,
    /// Slowest run.
    pub ops_per_sec_min: f64,
    /// Fastest run.
    pub ops_per_sec_max: f64,
    /// p50 latency of the median run, microseconds.
    pub latency_us_p50: f64,
    /// p99 latency of the median run, microseconds.
    pub latency_us_p99: f64,
    /// Errors over all runs.
    pub errors: u64,
}

/// Summarizes runs by their ops/s.
pub fn summarize(mut runs: Vec<RunResult>) -> Summary {
    runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    let median = runs.get(runs.len() / 2).cloned().unwrap_or_default();
    Summary {
        ops_per_sec_median: median.ops_per_sec,
        ops_per_sec_min: runs.first().map_or(0.0, |r| r.ops_per_sec),
        ops_per_sec_max: runs.last().map_or(0.0, |r| r.ops_per_sec),
        latency_us_p50: median.latency_us_p50,
        latency_us_p99: median.latency_us_p99,
        errors: runs.iter().map(|r| r.errors).sum(),
    }
}

/// A mounted target under measurement; unmounts and stops its server on drop.
pub struct Target {
    /// Name shown in the table.
    pub name: String,
    /// Where to run the workload.
    pub root: PathBuf,
    /// The serving process, if any (for its RSS).
    pub server: Option<ChildGuard>,
    _guards: Vec<MountGuard>,
}

impl Target {
    /// A plain directory: the kernel's own speed.
    pub fn plain(name: &str, root: &Path) -> Self {
        Target {
            name: name.to_string(),
            root: root.to_path_buf(),
            server: None,
            _guards: Vec::new(),
        }
    }

    /// Starts `command` that mounts at `mnt`, and waits for the mount.
    pub fn spawn(name: &str, mnt: &Path, command: &mut Command) -> anyhow::Result<Self> {
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).spawn()?;
        let server = ChildGuard(child);
        if !wait_for_mount(mnt, Duration::from_secs(20)) {
            anyhow::bail!("{name} did not mount at {} within 20 s", mnt.display());
        }
        Ok(Target {
            name: name.to_string(),
            root: mnt.to_path_buf(),
            server: Some(server),
            _guards: vec![MountGuard::new(mnt)],
        })
    }

    /// Keeps an extra mount (e.g. a tmpfs source) alive with the target.
    pub fn with_mount(mut self, mnt: &Path) -> Self {
        self._guards.push(MountGuard::new(mnt));
        self
    }

    /// Resident memory of the server, KiB.
    pub fn server_rss_kib(&self) -> Option<u64> {
        let pid = self.server.as_ref()?.0.id();
        rss_kib(pid)
    }
}

/// VmRSS of a process, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS")
}

/// A KiB field of `/proc/PID/status` (`VmRSS`, `VmHWM` = peak RSS, ...).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Median, minimum and maximum of one figure over repeated runs.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Spread {
    /// The median run (the upper middle one for an even count).
    pub median: f64,
    /// The lowest run.
    pub min: f64,
    /// The highest run.
    pub max: f64,
    /// Every run, in the order measured.
    pub runs: Vec<f64>,
}

impl Spread {
    /// The spread of `runs` (all zero when empty).
    pub fn of(runs: Vec<f64>) -> Spread {
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        Spread {
            median: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            runs,
        }
    }
}

/// A 4096-aligned buffer for O_DIRECT reads.
pub struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes aligned to 4096.
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 4096];
        let offset = storage.as_ptr().align_offset(4096);
        AlignedBuf {
            storage,
            offset,
            len,
        }
    }

    /// The aligned bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}
