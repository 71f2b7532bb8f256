//! `baton-bench upgrade-stall`: what applications see during planned
//! upgrades. A supervised Baton mount serves a reader (4 KiB O_DIRECT reads)
//! and a writer (4 KiB O_DIRECT writes), each timing every call; `fsctl
//! upgrade` swaps the generation between two copies of fsclient `upgrades`
//! times. Per upgrade:
//! - the application stall: the slowest read or write that overlapped the
//!   upgrade command (what the prototype note measured);
//! - the supervisor's stall: old generation stopped reading → new one
//!   started reading (from `fsctl upgrade --json`);
//! - the control: the slowest call in a window as long as the upgrade,
//!   just before the next one, with no upgrade running: the workload's
//!   own jitter on this machine.
//!
//! The reader and the writer run in a process of their own
//! (`crate::application`), as applications do.
//!
//! Then the same workload through `successions` supervisor handovers (a
//! DaemonSet rollout in small: a successor starts beside the supervisor,
//! which gets SIGTERM and hands the mount over; the successor's new
//! generation re-queues what was in flight): the slowest call overlapping
//! each, from the SIGTERM until the successor reports the mount serving.
//!
//! A failed read, write or upgrade fails the run: every row had 0 errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use chaos_tests::bench::percentile;
use chaos_tests::mount_guard::workspace_binary;
use upgrade_protocol::monotonic_ns;

use crate::application::{Application, ApplicationRun, READ_FILE};
use crate::supervised::{fsctl, utf8, SupervisedMount};

/// Per upgrade, in µs: the slowest application call overlapping it, and
/// the stall the supervisor measured; and the calls the application made.
pub struct UpgradeStalls {
    /// Slowest read or write overlapping each upgrade, sorted.
    pub app_us: Vec<u64>,
    /// Old generation stopped reading → new one reading, sorted.
    pub supervisor_us: Vec<u64>,
    /// Slowest call in an equally long window between two swaps (none
    /// running), sorted: the workload's own jitter.
    pub quiet_us: Vec<u64>,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
}

/// What replaces the serving generation in each event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swap {
    /// `fsctl upgrade` to the other fsclient copy.
    Upgrade,
    /// The supervisor hands the mount to a successor supervisor.
    Succession,
}

/// Runs the bench and prints its table.
pub fn run(
    dir: &Path,
    upgrades: usize,
    successions: usize,
    interval: Duration,
) -> anyhow::Result<()> {
    let stalls = measure(dir, upgrades, interval, Swap::Upgrade)?;
    let handed = measure(dir, successions, interval, Swap::Succession)?;
    println!(
        "{upgrades} planned upgrades (fsctl upgrade, alternating two fsclient copies) and {successions} supervisor handovers (successor + SIGTERM), every {} ms, under 4 KiB O_DIRECT reads and writes",
        interval.as_millis()
    );
    println!("(any failed read, write, upgrade or handover fails the run: every row had 0 errors)");
    println!(
        "{:<44} {:>10} {:>10} {:>10}",
        "stall", "p50 ms", "p99 ms", "max ms"
    );
    for (name, values) in [
        ("upgrade: slowest app call during it", &stalls.app_us),
        ("no upgrade: slowest app call, as long", &stalls.quiet_us),
        (
            "upgrade: supervisor, old stops → new reads",
            &stalls.supervisor_us,
        ),
        ("supervisor handover: slowest app call", &handed.app_us),
    ] {
        let ms = |q: f64| percentile(values, q) / 1000.0;
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>10.2}",
            name,
            ms(0.5),
            ms(0.99),
            ms(1.0)
        );
    }
    println!(
        "application calls: {} reads, {} writes, 0 errors",
        stalls.reads + handed.reads,
        stalls.writes + handed.writes
    );
    Ok(())
}

/// Measures `upgrades` swaps of kind `swap` `interval` apart (module docs).
pub fn measure(
    dir: &Path,
    upgrades: usize,
    interval: Duration,
    swap: Swap,
) -> anyhow::Result<UpgradeStalls> {
    let root = tempfile::Builder::new()
        .prefix("baton-upgrade-stall-")
        .tempdir_in(dir)?;
    let dir = root.path();
    let binaries: Vec<PathBuf> = ["fsclient-a", "fsclient-b"]
        .iter()
        .map(|name| {
            let path = dir.join(name);
            std::fs::copy(workspace_binary("fsclient"), &path).map(|_| path)
        })
        .collect::<Result<_, _>>()?;
    let mut mount = SupervisedMount::start(dir, "bench", &[])?;
    let (socket, mnt) = (mount.socket.clone(), mount.mnt.clone());
    std::fs::write(mnt.join(READ_FILE), vec![7u8; 1 << 20])?;

    let application = Application::start(&mnt, true)?;
    let mut windows = Vec::with_capacity(upgrades);
    let mut measured = Vec::with_capacity(upgrades);
    for n in 0..upgrades {
        std::thread::sleep(interval);
        let start = monotonic_ns();
        if swap == Swap::Succession {
            mount
                .hand_over_to_successor()
                .with_context(|| format!("supervisor handover {n}"))?;
            windows.push((start, monotonic_ns()));
            continue;
        }
        let binary = &binaries[n % 2];
        let out = fsctl(
            &socket,
            &["upgrade", utf8(&mnt)?, "--binary", utf8(binary)?, "--json"],
        )
        .with_context(|| format!("upgrade {n}"))?;
        windows.push((start, monotonic_ns()));
        let reports: serde_json::Value = serde_json::from_str(&out)?;
        measured.push(reports[0]["stall_us"].as_u64().unwrap_or(0));
    }
    std::thread::sleep(interval);
    let ApplicationRun {
        reads,
        writes,
        calls,
    } = application.finish()?;
    let slowest_in = |&(from, to): &(u64, u64)| {
        calls
            .iter()
            .filter(|&&(s, e)| s < to && e > from)
            .map(|&(s, e)| (e - s) / 1000)
            .max()
            .unwrap_or(0)
    };
    let mut app: Vec<u64> = windows.iter().map(slowest_in).collect();
    let mut quiet: Vec<u64> = quiet_windows(&windows, interval)
        .iter()
        .map(slowest_in)
        .collect();
    fsctl(&socket, &["umount", utf8(&mnt)?])?;
    app.sort_unstable();
    measured.sort_unstable();
    quiet.sort_unstable();
    Ok(UpgradeStalls {
        app_us: app,
        supervisor_us: measured,
        quiet_us: quiet,
        reads,
        writes,
    })
}

/// For each swap window, one as long ending [`QUIET_MARGIN`] before the
/// next swap starts (`interval` after one ends); none where it would not
/// fit. Not centred: the supervisor starts the next warm standby 100 ms
/// after a swap, and a standby's start-up alone slows calls by about 2 ms
/// on 2 cores; the control must not measure that.
fn quiet_windows(windows: &[(u64, u64)], interval: Duration) -> Vec<(u64, u64)> {
    let room = interval.saturating_sub(QUIET_MARGIN).as_nanos() as u64;
    windows
        .iter()
        .filter_map(|&(from, to)| {
            let len = to - from;
            let start = to + room.checked_sub(len)?;
            Some((start, start + len))
        })
        .collect()
}

/// Gap between a control window and the next swap.
const QUIET_MARGIN: Duration = Duration::from_millis(5);
