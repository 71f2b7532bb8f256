//! `baton-bench upgrade-stall`: what applications see during planned
//! upgrades. A supervised Baton mount serves a reader (4 KiB O_DIRECT reads)
//! and a writer (4 KiB O_DIRECT writes), each timing every call; `fsctl
//! upgrade` swaps the generation between two copies of fsclient `upgrades`
//! times. Per upgrade:
//! - the application stall: the slowest read or write that overlapped the
//!   upgrade command (what the prototype note measured);
//! - the supervisor's stall: old generation stopped reading → new one
//!   started reading (from `fsctl upgrade --json`).
//!
//! Then the same workload through `successions` supervisor handovers (a
//! DaemonSet rollout in small: a successor starts beside the supervisor,
//! which gets SIGTERM and hands the mount over; the successor's new
//! generation re-queues what was in flight): the slowest call overlapping
//! each, from the SIGTERM until the successor reports the mount serving.
//!
//! A failed read, write or upgrade fails the run: every row had 0 errors.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chaos_tests::bench::{percentile, AlignedBuf};
use chaos_tests::mount_guard::workspace_binary;

use crate::supervised::{fsctl, utf8, SupervisedMount};

type Calls = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// Times every call of `op` until `stop`; the first error ends the loop.
fn timed_loop(
    stop: Arc<AtomicBool>,
    calls: Calls,
    mut op: impl FnMut(u64) -> std::io::Result<()> + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<u64>> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            op(i)?;
            calls
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .push((start, Instant::now()));
            i += 1;
        }
        Ok(i)
    })
}

/// Per upgrade, in µs: the slowest application call overlapping it, and
/// the stall the supervisor measured; and the calls the application made.
pub struct UpgradeStalls {
    /// Slowest read or write overlapping each upgrade, sorted.
    pub app_us: Vec<u64>,
    /// Old generation stopped reading → new one reading, sorted.
    pub supervisor_us: Vec<u64>,
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
    std::fs::write(mnt.join("read"), vec![7u8; 1 << 20])?;

    let open = |name: &str, write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(mnt.join(name))
    };
    let (reader_file, writer_file) = (open("read", false)?, open("write", true)?);
    let stop = Arc::new(AtomicBool::new(false));
    let calls: Calls = Arc::default();
    let mut read_buf = AlignedBuf::new(4096);
    let reader = timed_loop(Arc::clone(&stop), Arc::clone(&calls), move |i| {
        reader_file.read_exact_at(read_buf.bytes_mut(), (i % 256) * 4096)
    });
    let mut write_buf = AlignedBuf::new(4096);
    let writer = timed_loop(Arc::clone(&stop), Arc::clone(&calls), move |i| {
        let block = write_buf.bytes_mut();
        block.fill((i % 251) as u8);
        writer_file.write_all_at(block, (i % 256) * 4096)
    });

    let mut windows = Vec::with_capacity(upgrades);
    let mut measured = Vec::with_capacity(upgrades);
    for n in 0..upgrades {
        std::thread::sleep(interval);
        let start = Instant::now();
        if swap == Swap::Succession {
            mount
                .hand_over_to_successor()
                .with_context(|| format!("supervisor handover {n}"))?;
            windows.push((start, Instant::now()));
            continue;
        }
        let binary = &binaries[n % 2];
        let out = fsctl(
            &socket,
            &["upgrade", utf8(&mnt)?, "--binary", utf8(binary)?, "--json"],
        )
        .with_context(|| format!("upgrade {n}"))?;
        windows.push((start, Instant::now()));
        let reports: serde_json::Value = serde_json::from_str(&out)?;
        measured.push(reports[0]["stall_us"].as_u64().unwrap_or(0));
    }
    std::thread::sleep(interval);
    stop.store(true, Ordering::Relaxed);
    let reads = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?
        .context("an application read failed")?;
    let writes = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))?
        .context("an application write failed")?;
    let calls = calls.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut app: Vec<u64> = windows
        .iter()
        .map(|(from, to)| {
            calls
                .iter()
                .filter(|(s, e)| s < to && e > from)
                .map(|(s, e)| e.duration_since(*s).as_micros() as u64)
                .max()
                .unwrap_or(0)
        })
        .collect();
    fsctl(&socket, &["umount", utf8(&mnt)?])?;
    app.sort_unstable();
    measured.sort_unstable();
    Ok(UpgradeStalls {
        app_us: app,
        supervisor_us: measured,
        reads,
        writes,
    })
}
