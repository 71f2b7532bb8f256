//! Waiting for a quiet machine between measurements, so that one does not
//! pay for the background work the one before left: dirty pages still
//! being written back, a FUSE daemon's deferred deletes, a checkpoint.
//! Every target gets the same wait, so it is fair to all of them.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// The window over which the CPUs must be idle.
pub const SETTLE_WINDOW: Duration = Duration::from_millis(500);
/// Share of CPU time that must be idle over a window (iowait counts as
/// busy: the disk is still working then).
pub const SETTLED_IDLE_SHARE: f64 = 0.9;

/// CPU time counters of all CPUs, from the first line of `/proc/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every field together (user, nice, system, idle, iowait, irq, ...).
    pub total: u64,
    /// The idle field alone.
    pub idle: u64,
}

impl CpuTimes {
    /// Parses the `cpu  ...` line of `/proc/stat`. `None` if it is not one.
    pub fn parse(line: &str) -> Option<CpuTimes> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let values: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        Some(CpuTimes {
            total: values.iter().sum(),
            idle: *values.get(3)?,
        })
    }

    /// Reads them now. `None` if `/proc/stat` is unreadable.
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        CpuTimes::parse(stat.lines().next()?)
    }

    /// The idle share of the CPU time between `self` and `later`.
    pub fn idle_share_until(&self, later: &CpuTimes) -> f64 {
        let total = later.total.saturating_sub(self.total);
        let idle = later.idle.saturating_sub(self.idle);
        if total == 0 {
            return 1.0;
        }
        idle as f64 / total as f64
    }
}

/// Syncs the filesystem holding `dir` (the disk under test: `sync(2)`
/// would also wait on every other mount, a stuck FUSE mount among them),
/// then waits until the CPUs were at least [`SETTLED_IDLE_SHARE`] idle
/// over one [`SETTLE_WINDOW`], at most `max`. Returns how long it waited,
/// and whether the machine settled.
pub fn settle(dir: &Path, max: Duration) -> (Duration, bool) {
    let start = Instant::now();
    if let Ok(handle) = std::fs::File::open(dir) {
        // SAFETY: syncfs(2) on a descriptor `handle` keeps open; it
        // touches no memory of ours. Its result only says whether every
        // page made it, which a wait needs not know.
        unsafe { libc::syncfs(handle.as_raw_fd()) };
    }
    while start.elapsed() < max {
        let Some(before) = CpuTimes::now() else {
            break;
        };
        std::thread::sleep(SETTLE_WINDOW);
        let Some(after) = CpuTimes::now() else {
            break;
        };
        if before.idle_share_until(&after) >= SETTLED_IDLE_SHARE {
            return (start.elapsed(), true);
        }
    }
    (start.elapsed(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_share_counts_iowait_as_busy() {
        let before = CpuTimes::parse("cpu  100 0 100 800 0 0 0 0 0 0").unwrap();
        let later = CpuTimes::parse("cpu  110 0 110 880 100 0 0 0 0 0").unwrap();
        // 200 ticks passed, 80 of them idle; the 100 of iowait were not.
        assert_eq!(later.total - before.total, 200);
        assert!((before.idle_share_until(&later) - 0.4).abs() < 1e-9);
        assert_eq!(CpuTimes::parse("cpu0 1 2 3 4"), None);
        assert_eq!(CpuTimes::parse("cpu  1 x 3 4"), None);
        assert_eq!(before.idle_share_until(&before), 1.0);
    }
}
