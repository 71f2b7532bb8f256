//! `baton-bench`: performance measured side by side with baselines in the
//! same invocation. Prints a table (and `--json`).
//!
//! `baton-bench fuse-wire`: GETATTR (fstat with attr timeout 0) and 4 KiB
//! O_DIRECT READ round trips per second through fuse-wire (the in-memory
//! test filesystem) with 1 and 4 threads, beside bindfs over a tmpfs
//! directory and the tmpfs directory itself.
//!
//! `baton-bench fs` (alias `fsclient`): sequential write (1 MiB writes,
//! final fsync), cold and warm sequential read of a large file, random 4 KiB
//! reads cold (a fixed count with 1 and 4 threads, and `--cold-seconds` on
//! one thread while the cache fills) and warm with 1 and 4 threads,
//! create/stat/readdir/unlink of small files with 1 and 4 threads (unlink
//! after a sync, and straight after the creates), the system `tar -xf` of
//! a source tree (`--untar-files`) and `rm -rf` of it right after, fsync
//! latency (p50, p99) after a 4 KiB write, and a cold read of a tree of many
//! large files, on a plain directory, bindfs, `rclone mount` of a local
//! directory and a Baton volume mounted through fs-supervisor; then Baton's
//! memory (idle and busy generation, supervisor with idle mounts) and kill
//! -9 stall. Cold reads drop the page cache, and for Baton also remount
//! with an empty block cache. Ratios above 1 mean Baton is better (on the
//! latency rows, the baseline's over Baton's). `--quick` shrinks every size
//! not given explicitly, for a smoke run.
//!
//! `baton-bench stall`: the kill -9 stall alone, warm and cold.
//! `baton-bench stall-together`: several mounts under one fs-supervisor,
//! every serving generation killed at once.
//! `baton-bench kill-after-burst`: the kernel's teardown of a generation
//! killed right after a burst of writes, and after the burst and idle
//! seconds.
//! `baton-bench upgrade-stall`: what applications see during planned
//! upgrades (`fsctl upgrade`) and supervisor handovers to a successor.
//! `baton-bench backends`: the Baton workload on each storage/metadata
//! backend (embedded, S3, PostgreSQL).
//! `baton-bench kube`: on a real one-node Kubernetes cluster, the time
//! from a pod's creation to its Baton volume's publication (first pod of a
//! volume, then a second), beside an emptyDir pod.
//! `baton-bench copy`: `cp --reflink=auto` of a large file
//! (copy_file_range) on a plain directory, bindfs and Baton.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chaos_tests::bench::{summarize, timed, AlignedBuf, Summary, Target};
use chaos_tests::memfs::PATTERN_FILE_LEN;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Baton benchmarks, measured beside baselines in the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// GETATTR and 4 KiB READ round trips: fuse-wire vs bindfs vs tmpfs.
    FuseWire {
        /// Seconds per run.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Runs per cell (the median is shown).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also write the results as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Application-visible stall of planned upgrades (`fsctl upgrade`).
    UpgradeStall {
        /// Upgrades.
        #[arg(long, default_value_t = 100)]
        upgrades: usize,
        /// Supervisor handovers to a successor (DaemonSet rollouts).
        #[arg(long, default_value_t = 50)]
        successions: usize,
        /// Milliseconds between upgrades.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
        /// Where to put the volume.
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// Application-visible stall of kill -9 recovery, warm and cold.
    Stall {
        /// Kills per mode.
        #[arg(long, default_value_t = 100)]
        kills: usize,
        /// Milliseconds between kills.
        #[arg(long, default_value_t = 250)]
        interval_ms: u64,
        /// Where to put the volume.
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// Application-visible stall when every mount's serving generation is
    /// killed at once, several mounts under one fs-supervisor.
    StallTogether {
        /// Mounts.
        #[arg(long, default_value_t = 8)]
        mounts: usize,
        /// Kills of every generation at once.
        #[arg(long, default_value_t = 20)]
        kills: usize,
        /// Milliseconds between kills.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Where to put the volumes.
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// The kernel's teardown of a generation killed right after a burst of
    /// writes, and after the burst and some idle seconds.
    KillAfterBurst {
        /// MiB written per burst.
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// Kills per row.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds idle before the kills of the second row.
        #[arg(long, default_value_t = 3.0)]
        idle_s: f64,
        /// Where to put the volume.
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// The Baton workload on each storage/metadata backend: embedded
    /// (SQLite + directory), S3 (local moto server), PostgreSQL metadata.
    Backends {
        /// Size of the large file, MiB.
        #[arg(long, default_value_t = 256)]
        size_mib: u64,
        /// Number of small files.
        #[arg(long, default_value_t = 2_000)]
        files: usize,
        /// Seconds per random-read run.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Where to put the data.
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
        /// Admin URL of a PostgreSQL server to create a scratch database on
        /// [default: $BATON_TEST_POSTGRES_URL; without it, no PostgreSQL row].
        #[arg(long)]
        postgres_url: Option<String>,
    },
    /// `cp --reflink=auto` of one large file (copy_file_range) on a plain
    /// directory, bindfs and Baton (whole blocks shared, not copied).
    Copy {
        /// Size of the file, MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        /// Copies per target (the median is shown).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where to put the data (a directory on the disk under test).
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// A job's first read of a file set in S3 (local moto server), with no
    /// warmup and after `fsctl warmup`, beside the same read from local
    /// disk.
    Warmup {
        /// Size of the set, MiB.
        #[arg(long, default_value_t = 2048)]
        size_mib: u64,
        /// Files in the set.
        #[arg(long, default_value_t = 8)]
        files: usize,
        /// Where to put the data (a directory on the disk under test).
        #[arg(long, default_value = "/var/tmp")]
        dir: std::path::PathBuf,
    },
    /// On a real one-node Kubernetes cluster: pod creation to its Baton
    /// volume published, first pod of a volume and a second one, beside an
    /// emptyDir pod (needs root, kubelet 1.20.2 from `.ci/build-kubernetes`
    /// and the binaries beside this one, fs-supervisor with `--features
    /// kubernetes`).
    Kube {
        /// Rounds (each: a floor pod, a new volume's first and second pod).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Also write the results as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Keep the cluster's directory (its logs) after the run.
        #[arg(long)]
        keep: bool,
    },
    /// Throughput, metadata rates and memory: plain directory, bindfs,
    /// rclone mount and Baton (through fs-supervisor), in one run.
    #[command(alias = "fsclient")]
    Fs(Box<FsArgs>),
    /// Holds this many MiB of touched memory until killed (the kill
    /// floor of `stall`; internal).
    #[command(hide = true)]
    HoldMemory {
        /// MiB to hold.
        mib: u64,
    },
    /// The application process of the stall benches (internal).
    #[command(hide = true)]
    Application {
        /// The mountpoint.
        mnt: std::path::PathBuf,
        /// A writer beside the reader.
        #[arg(long)]
        write: bool,
    },
}

#[derive(clap::Args)]
struct FsArgs {
    /// Size of the large file, MiB [default: 1024; 32 with --quick].
    #[arg(long)]
    size_mib: Option<u64>,
    /// Number of small files of the metadata workloads [default: 10000;
    /// 300 with --quick].
    #[arg(long)]
    files: Option<usize>,
    /// Seconds per warm random-read run [default: 3; 0.3 with --quick].
    #[arg(long)]
    seconds: Option<f64>,
    /// Random 4 KiB reads per thread right after caches were dropped
    /// [default: 2000; 200 with --quick].
    #[arg(long)]
    cold_reads: Option<u64>,
    /// Seconds of random 4 KiB reads (1 thread) right after caches were
    /// dropped, the cache filling as they go (0 skips the row) [default:
    /// 20; 2 with --quick].
    #[arg(long)]
    cold_seconds: Option<f64>,
    /// Files in the source tree untarred with `tar -xf`, then removed with
    /// `rm -rf` (0 skips both rows) [default: 20000; 2000 with --quick].
    #[arg(long)]
    untar_files: Option<usize>,
    /// fsyncs, each after a 4 KiB write into a 1 MiB file, for the fsync
    /// latency rows (0 skips them) [default: 2000; 200 with --quick].
    #[arg(long)]
    fsyncs: Option<u64>,
    /// Files in the many-file tree [default: 200; 6 with --quick].
    #[arg(long)]
    tree_files: Option<usize>,
    /// Smallest tree file, MiB [default: 1].
    #[arg(long)]
    tree_min_mib: Option<u64>,
    /// Largest tree file, MiB [default: 20; 2 with --quick].
    #[arg(long)]
    tree_max_mib: Option<u64>,
    /// Runs of every workload per target (the median is shown) [default:
    /// 3; 1 with --quick].
    #[arg(long)]
    runs: Option<usize>,
    /// Idle mounts for the supervisor memory figure (0 skips it). One
    /// fs-supervisor holds at most 256 mounts (its MOUNTS_MAX) [default:
    /// 100; 3 with --quick].
    #[arg(long)]
    idle_mounts: Option<usize>,
    /// Kills for the kill -9 stall figure, and upgrades for the planned-
    /// upgrade stall figure (0 skips both) [default: 50; 5 with --quick].
    #[arg(long)]
    stall_kills: Option<usize>,
    /// Targets to measure, comma-separated, in this order: plain, bindfs,
    /// rclone, floor (the in-memory test filesystem with Baton's protocol
    /// settings: what the kernel and the transport cost), baton.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plain,bindfs,rclone,floor,baton"
    )]
    targets: Vec<String>,
    /// Small sizes for a smoke run (under a minute): the defaults above
    /// marked "with --quick"; flags given explicitly still apply.
    #[arg(long)]
    quick: bool,
    /// Seconds to wait at most, before each measurement, for the CPUs to
    /// be 90% idle over half a second (after a syncfs of --dir); then it
    /// measures anyway and says so. Default 30, or 1 with --quick.
    #[arg(long, value_name = "SECONDS")]
    quiet_wait_s: Option<f64>,
    /// Where to put the data (a directory on the disk under test).
    #[arg(long, default_value = "/var/tmp")]
    dir: std::path::PathBuf,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

impl FsArgs {
    fn options(&self) -> anyhow::Result<compare::Options> {
        // A flag given wins; else the full run's default, or the smoke
        // run's with --quick.
        let quick = self.quick;
        fn pick<T: Copy>(given: Option<T>, quick: bool, full: T, smoke: T) -> T {
            given.unwrap_or(if quick { smoke } else { full })
        }
        let quiet_wait_s = pick(self.quiet_wait_s, quick, QUIET_WAIT_S, QUICK_QUIET_WAIT_S);
        let cold_seconds = pick(self.cold_seconds, quick, 20.0, 2.0);
        // Checked here so that a bad value fails before any measurement.
        seconds_arg("--cold-seconds", cold_seconds)?;
        Ok(compare::Options {
            size_mib: pick(self.size_mib, quick, 1024, 32),
            files: pick(self.files, quick, 10_000, 300),
            seconds: pick(self.seconds, quick, 3.0, 0.3),
            cold_reads: pick(self.cold_reads, quick, 2000, 200),
            cold_seconds,
            untar_files: pick(self.untar_files, quick, 20_000, 2000),
            fsyncs: pick(self.fsyncs, quick, 2000, 200),
            tree_files: pick(self.tree_files, quick, 200, 6),
            tree_min_mib: pick(self.tree_min_mib, quick, 1, 1),
            tree_max_mib: pick(self.tree_max_mib, quick, 20, 2),
            runs: pick(self.runs, quick, 3, 1).max(1),
            idle_mounts: pick(self.idle_mounts, quick, 100, 3),
            stall_kills: pick(self.stall_kills, quick, 50, 5),
            targets: self.targets.clone(),
            quiet_wait: seconds_arg("--quiet-wait-s", quiet_wait_s)?,
            dir: self.dir.clone(),
        })
    }
}

/// `baton-bench fs`'s wait for a quiet machine, at most, before each
/// measurement: long enough for a full run's writeback to drain.
const QUIET_WAIT_S: f64 = 30.0;
/// The same with `--quick`: two settle windows. A smoke run waits before
/// about 30 measurements (four targets), so on a busy machine the waits
/// add at most about 30 s, not 15 min.
const QUICK_QUIET_WAIT_S: f64 = 1.0;

#[derive(serde::Serialize)]
struct Row {
    target: String,
    workload: &'static str,
    threads: usize,
    summary: Summary,
    server_rss_kib: Option<u64>,
}

/// A duration given in seconds on the command line: an error, not a
/// panic, for a negative or non-finite one.
fn seconds_arg(flag: &str, seconds: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(seconds)
        .with_context(|| format!("{flag} {seconds}: give a number of seconds, 0 or more"))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!(
                "baton-bench: {}",
                upgrade_protocol::error_chain(err.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<()> {
    match Cli::parse().command {
        Bench::FuseWire {
            seconds,
            runs,
            json,
        } => fuse_wire(
            seconds_arg("--seconds", seconds)?,
            runs.max(1),
            json.as_deref(),
        ),
        Bench::Stall {
            kills,
            interval_ms,
            dir,
        } => stall::run(&dir, kills, Duration::from_millis(interval_ms)),
        Bench::StallTogether {
            mounts,
            kills,
            interval_ms,
            dir,
        } => stall::run_together(&dir, mounts, kills, Duration::from_millis(interval_ms)),
        Bench::KillAfterBurst {
            mib,
            rounds,
            idle_s,
            dir,
        } => after_burst::run(&dir, mib, rounds.max(1), seconds_arg("--idle-s", idle_s)?),
        Bench::UpgradeStall {
            upgrades,
            successions,
            interval_ms,
            dir,
        } => upgrade_stall::run(
            &dir,
            upgrades,
            successions,
            Duration::from_millis(interval_ms),
        ),
        Bench::Backends {
            size_mib,
            files,
            seconds,
            dir,
            postgres_url,
        } => backends::run(
            &dir,
            size_mib,
            files,
            seconds_arg("--seconds", seconds)?,
            postgres_url
                .or_else(|| std::env::var("BATON_TEST_POSTGRES_URL").ok())
                .as_deref(),
        ),
        Bench::Fs(args) => compare::run(&args.options()?, args.json.as_deref()),
        Bench::Copy {
            size_mib,
            runs,
            dir,
        } => copy::run(&dir, size_mib, runs),
        Bench::Warmup {
            size_mib,
            files,
            dir,
        } => warmup::run(&dir, size_mib, files),
        Bench::Kube { rounds, json, keep } => kube::run(rounds, json.as_deref(), keep),
        Bench::Application { mnt, write } => application::run(&mnt, write),
        Bench::HoldMemory { mib } => stall::hold_memory(mib),
    }
}

mod after_burst;
mod application;
mod backends;
mod compare;
mod copy;
mod kube;
mod stall;
mod supervised;
mod upgrade_stall;
mod warmup;

fn mount_tmpfs(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path)?;
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(path)
        .status()?;
    anyhow::ensure!(status.success(), "mount -t tmpfs {} failed", path.display());
    Ok(())
}

fn targets(dir: &Path) -> anyhow::Result<Vec<Target>> {
    let src = dir.join("tmpfs");
    mount_tmpfs(&src)?;
    std::fs::write(src.join("hello"), chaos_tests::memfs::HELLO)?;
    let big: Vec<u8> = (0..PATTERN_FILE_LEN as u64)
        .map(chaos_tests::memfs::pattern_byte)
        .collect();
    std::fs::write(src.join("big"), big)?;
    let mut targets = vec![Target::plain("tmpfs (kernel)", &src).with_mount(&src)];

    let bindfs_mnt = dir.join("bindfs");
    std::fs::create_dir_all(&bindfs_mnt)?;
    match which("bindfs") {
        Some(bindfs) => targets.push(Target::spawn(
            "bindfs",
            &bindfs_mnt,
            Command::new(bindfs)
                .args([
                    "-f",
                    "--multithreaded",
                    "-o",
                    "attr_timeout=0,entry_timeout=0",
                ])
                .arg(&src)
                .arg(&bindfs_mnt),
        )?),
        None => println!("skipping bindfs: not installed (apt-get install bindfs)"),
    }

    let memfs_mnt = dir.join("fuse-wire");
    std::fs::create_dir_all(&memfs_mnt)?;
    let testfs = std::env::current_exe()?.with_file_name("baton-testfs");
    targets.push(Target::spawn(
        "fuse-wire memfs",
        &memfs_mnt,
        Command::new(&testfs)
            .args(["serve", "--threads", "4", "--cache-secs", "0", "--mount"])
            .arg(&memfs_mnt),
    )?);
    Ok(targets)
}

pub(crate) fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

fn fuse_wire(duration: Duration, runs: usize, json: Option<&Path>) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating the bench directory")?;
    let targets = targets(dir.path())?;
    let mut rows = Vec::new();
    for target in &targets {
        let hello = Arc::new(
            File::open(target.root.join("hello"))
                .with_context(|| format!("{}: open hello", target.name))?,
        );
        let big = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(target.root.join("big"))
                .with_context(|| format!("{}: open big with O_DIRECT", target.name))?,
        );
        for threads in [1, 4] {
            let getattr: Vec<_> = (0..runs)
                .map(|_| {
                    let hello = Arc::clone(&hello);
                    timed(threads, duration, move |_, _| hello.metadata().map(|_| ()))
                })
                .collect();
            rows.push(Row {
                target: target.name.clone(),
                workload: "getattr",
                threads,
                summary: summarize(getattr),
                server_rss_kib: target.server_rss_kib(),
            });
            let reads: Vec<_> = (0..runs)
                .map(|_| {
                    let big = Arc::clone(&big);
                    timed(threads, duration, move |thread, i| {
                        thread_local!(static BUF: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::new(4096)));
                        let blocks = (PATTERN_FILE_LEN / 4096) as u64;
                        let offset = ((i * 7919 + thread as u64 * 131) % blocks) * 4096;
                        BUF.with(|buf| big.read_exact_at(buf.borrow_mut().bytes_mut(), offset))
                    })
                })
                .collect();
            rows.push(Row {
                target: target.name.clone(),
                workload: "read 4KiB O_DIRECT",
                threads,
                summary: summarize(reads),
                server_rss_kib: target.server_rss_kib(),
            });
        }
    }
    print_table(&rows, duration, runs);
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(targets);
    Ok(())
}

fn print_table(rows: &[Row], duration: Duration, runs: usize) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("fuse-wire round trips: {runs} runs of {:.1} s per cell, median (min-max); kernel {}, {} cpus", duration.as_secs_f64(), kernel.trim(), std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!(
        "{:<18} {:<20} {:>3} {:>12} {:>21} {:>9} {:>9} {:>7} {:>9}",
        "target", "workload", "thr", "ops/s", "(min-max)", "p50 us", "p99 us", "errors", "rss KiB"
    );
    for row in rows {
        let s = &row.summary;
        println!(
            "{:<18} {:<20} {:>3} {:>12.0} {:>21} {:>9.1} {:>9.1} {:>7} {:>9}",
            row.target,
            row.workload,
            row.threads,
            s.ops_per_sec_median,
            format!("({:.0}-{:.0})", s.ops_per_sec_min, s.ops_per_sec_max),
            s.latency_us_p50,
            s.latency_us_p99,
            s.errors,
            row.server_rss_kib
                .map_or("-".to_string(), |k| k.to_string()),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn fs_options(args: &[&str]) -> compare::Options {
        let cli = Cli::try_parse_from(["baton-bench", "fs"].iter().chain(args)).unwrap();
        match cli.command {
            Bench::Fs(fs) => fs.options().unwrap(),
            _ => panic!("not the fs bench"),
        }
    }

    #[test]
    fn quick_shrinks_only_what_is_not_given() {
        let o = fs_options(&["--quick", "--untar-files", "20000", "--runs", "3"]);
        assert_eq!(o.untar_files, 20_000, "given: kept");
        assert_eq!(o.runs, 3, "given: kept");
        assert_eq!(o.files, 300, "not given: the smoke run's");
        assert_eq!(o.quiet_wait, Duration::from_secs(1));
        let o = fs_options(&["--files", "50"]);
        assert_eq!((o.files, o.untar_files, o.runs), (50, 20_000, 3));
    }

    #[test]
    fn a_negative_duration_is_refused_before_any_measurement() {
        let cli = Cli::try_parse_from(["baton-bench", "fs", "--cold-seconds=-1"]).unwrap();
        let Bench::Fs(fs) = cli.command else {
            panic!("not the fs bench")
        };
        let err = fs.options().unwrap_err().to_string();
        assert!(err.contains("--cold-seconds"), "{err}");
    }
}
