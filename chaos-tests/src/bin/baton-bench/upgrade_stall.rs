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
//! The reader and the writer run in their own process (`baton-bench
//! upgrade-stall-load`, hidden), as applications do. A process that forks
//! while it holds files of a FUSE mount gives the child copies of them,
//! which close at exec, and every close is a FLUSH: while the bench ran
//! the workload itself, each `fsctl` it started committed the writer's
//! staged data in the middle of the upgrade it timed, and the writer's next
//! WRITE waited 5-10 ms for that commit (found with `perf sched`).
//!
//! Then the same workload through `successions` supervisor handovers (a
//! DaemonSet rollout in small: a successor starts beside the supervisor,
//! which gets SIGTERM and hands the mount over; the successor's new
//! generation re-queues what was in flight): the slowest call overlapping
//! each, from the SIGTERM until the successor reports the mount serving.
//!
//! A failed read, write or upgrade fails the run: every row had 0 errors.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::{percentile, AlignedBuf};
use chaos_tests::mount_guard::{workspace_binary, ChildGuard};
use upgrade_protocol::monotonic_ns;

use crate::supervised::{fsctl, utf8, SupervisedMount};

/// Start and end of each call, CLOCK_MONOTONIC ns (shared by the
/// application process and the bench).
type Calls = Arc<Mutex<Vec<(u64, u64)>>>;

/// Times every call of `op` until `stop`; the first error ends the loop.
fn timed_loop(
    stop: Arc<AtomicBool>,
    calls: Calls,
    mut op: impl FnMut(u64) -> std::io::Result<()> + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<u64>> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let start = monotonic_ns();
            op(i)?;
            calls
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .push((start, monotonic_ns()));
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
    std::fs::write(mnt.join("read"), vec![7u8; 1 << 20])?;

    let application = Application::start(&mnt)?;
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

/// The application: `baton-bench upgrade-stall-load` in its own process,
/// the only one holding the mount's files (module docs). Killed on drop.
struct Application {
    child: ChildGuard,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Application {
    /// Starts it and waits until it has its files open.
    fn start(mnt: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding baton-bench itself")?;
        let mut child = ChildGuard(
            Command::new(exe)
                .arg("upgrade-stall-load")
                .arg(mnt)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting the application process")?,
        );
        let stdout = child.0.stdout.take().context("application stdout")?;
        let mut application = Application {
            child,
            stdout: BufReader::new(stdout),
        };
        let mut line = String::new();
        application.stdout.read_line(&mut line)?;
        if line.trim() != LOAD_READY {
            bail!("the application process did not start (its error is above)");
        }
        Ok(application)
    }

    /// Stops it (EOF on its stdin) and returns what it did.
    fn finish(mut self) -> anyhow::Result<ApplicationRun> {
        drop(self.child.0.stdin.take());
        let failed = || anyhow::anyhow!("the application process failed (its error is above)");
        let mut lines = (&mut self.stdout).lines();
        let counts = lines.next().ok_or_else(failed)??;
        let (reads, writes) = parse_pair(&counts).ok_or_else(failed)?;
        let calls = lines
            .map(|line| parse_pair(&line?).ok_or_else(failed))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if !self.child.0.wait()?.success() {
            return Err(failed());
        }
        Ok(ApplicationRun {
            reads,
            writes,
            calls,
        })
    }
}

/// What the application did: reads and writes completed, and every call.
struct ApplicationRun {
    reads: u64,
    writes: u64,
    /// (start, end), CLOCK_MONOTONIC ns, in no particular order.
    calls: Vec<(u64, u64)>,
}

fn parse_pair(line: &str) -> Option<(u64, u64)> {
    let (a, b) = line.split_once(' ')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// What the application prints once its files are open.
const LOAD_READY: &str = "ready";

/// `baton-bench upgrade-stall-load MNT`: a reader (4 KiB O_DIRECT reads of
/// `read`) and a writer (4 KiB O_DIRECT writes to `write`), each timing
/// every call, until stdin closes; then prints `reads writes` and one
/// `start end` line per call (CLOCK_MONOTONIC ns).
pub fn load(mnt: &Path) -> anyhow::Result<()> {
    let open = |name: &str, write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(mnt.join(name))
            .with_context(|| format!("opening {}", mnt.join(name).display()))
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
    println!("{LOAD_READY}");
    std::io::stdout().flush()?;
    std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink())?;
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
    let mut out = BufWriter::new(std::io::stdout().lock());
    writeln!(out, "{reads} {writes}")?;
    for (start, end) in calls.iter() {
        writeln!(out, "{start} {end}")?;
    }
    out.flush()?;
    Ok(())
}
