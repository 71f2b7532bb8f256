//! `fsctl`: Baton's control command.
//!
//! `format` and `up` work on their own; `mount`, `status`, `upgrade` and
//! `umount` talk to `fs-supervisor` over its control socket.
//!
//! Exit codes (also in `fsctl --help`):
//! - 0: success;
//! - 1: the operation failed (the message says why and what to do);
//! - 2: bad usage, or the supervisor refused the request as given (no such
//!   mount, mountpoint not empty, volume missing, ...);
//! - 3: fs-supervisor cannot be reached or did not answer in time;
//! - 4: fs-supervisor refused this user (only root may control it).

mod check;
mod progress;
mod quota;
mod table;
mod warmup;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use baton_volume::{format, FormatRequest, VolumePaths, DEFAULT_BASE_DIR, GC_MIN_AGE_SECS_DEFAULT};
use clap::{Parser, Subcommand};
use upgrade_protocol::client::{self, command_timeout, DEFAULT_SOCKET, DEFAULT_STATE_DIR};
use upgrade_protocol::{
    parse_size, ClientOptions, ErrorKind, ProtocolError, Reply, Request, StatusReport,
};

#[derive(Parser)]
#[command(
    name = "fsctl",
    version,
    about = "Control Baton volumes and mounts",
    after_help = "Exit codes: 0 success; 1 the operation failed; 2 bad usage or a request refused as given; 3 fs-supervisor unreachable or not answering; 4 not allowed (run as root)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume (metadata and data store).
    Format {
        /// Volume name.
        name: String,
        /// Metadata URL (default sqlite:///BASE/NAME/meta.db).
        #[arg(long)]
        meta: Option<String>,
        /// Storage URL: file:///DIR (default file:///BASE/NAME/data) or
        /// s3://BUCKET/PREFIX (credentials from AWS_ACCESS_KEY_ID,
        /// AWS_SECRET_ACCESS_KEY and the other usual AWS_* variables).
        #[arg(long)]
        storage: Option<String>,
        /// S3-compatible endpoint, e.g. http://127.0.0.1:9000 (recorded in
        /// the volume; path-style requests).
        #[arg(long)]
        s3_endpoint: Option<String>,
        /// S3 region (recorded in the volume) [default: AWS_REGION or us-east-1].
        #[arg(long)]
        s3_region: Option<String>,
        /// Compress block objects at rest: none or lz4.
        #[arg(long, default_value = "none", value_parser = ["none", "lz4"])]
        compression: String,
        /// Encrypt block objects at rest (ChaCha20-Poly1305) with the key in
        /// FILE: 32 raw bytes or 64 hex digits (`head -c 32 /dev/urandom >
        /// FILE`). Mounts need the same file (--key-file or BATON_KEY_FILE).
        #[arg(long, value_name = "FILE", conflicts_with = "passphrase_file")]
        encryption_key_file: Option<PathBuf>,
        /// Encrypt block objects at rest with a key derived from the
        /// passphrase in FILE (Argon2id; a random salt is recorded in the
        /// volume, never the key). Mounts need the same passphrase
        /// (--passphrase-file or BATON_PASSPHRASE_FILE).
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
        /// Block size, e.g. 4M.
        #[arg(long, default_value = "4M", value_parser = parse_block_size)]
        block_size: u32,
        /// Base directory for defaults.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
        /// Create missing parent directories of a --meta file or a
        /// file:// --storage directory (the defaults are always created).
        #[arg(long)]
        create_dirs: bool,
        /// Print what was created as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The main job on the embedded default: format volume NAME if it does
    /// not exist, start fs-supervisor if none is running, and mount the
    /// volume at MOUNTPOINT through it.
    Up {
        /// Volume name.
        #[arg(default_value = "default")]
        name: String,
        /// Where to mount.
        #[arg(default_value = "/mnt/baton")]
        mountpoint: PathBuf,
        /// Base directory for volumes.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
        /// State directory of the fs-supervisor `up` starts (when none
        /// answers on the socket yet).
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Have the fs-supervisor `up` starts serve Prometheus metrics
        /// (/metrics), a live status page (/), /healthz and /readyz on
        /// this address, e.g. 127.0.0.1:9464.
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_listen: Option<std::net::SocketAddr>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Mount VOLUME at MOUNTPOINT through fs-supervisor, which holds the
    /// FUSE connection and restarts the filesystem when it dies. Returns
    /// once the first generation serves.
    Mount {
        /// A volume name (under --base-dir) or sqlite:///path/meta.db.
        volume: String,
        /// An existing empty directory.
        mountpoint: PathBuf,
        /// Base directory for volumes.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
        /// Block cache directory for the filesystem [default: next to the metadata].
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Write staging directory [default: next to the metadata].
        #[arg(long)]
        staging_dir: Option<PathBuf>,
        /// FUSE worker threads per generation [default: fsclient's].
        #[arg(long)]
        threads: Option<u32>,
        /// Block cache capacity, e.g. 10G [default: fsclient's, 1G; a local
        /// directory's plain blocks get a cache only when this or
        /// --cache-dir is given].
        #[arg(long, value_parser = parse_size)]
        cache_size: Option<u64>,
        /// Record the mount so fs-supervisor mounts it again after a
        /// reboot (a restarted supervisor re-adopts every live mount
        /// whose fd systemd kept, persistent or not).
        #[arg(long)]
        persist: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Check VOLUME's metadata against its storage: referenced objects
    /// missing or short (exit 1: data is lost) and objects nothing refers
    /// to (garbage; `fsctl gc` deletes it); and recount every directory
    /// quota (exit 1 if a stored usage differs, until --repair-quotas).
    Fsck {
        /// A volume name (under --base-dir) or sqlite:///path/meta.db.
        volume: String,
        /// Store the recounted usage of quotas that differ (safe while
        /// the volume is mounted: one metadata transaction).
        #[arg(long)]
        repair_quotas: bool,
        /// Base directory for volumes.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete objects of VOLUME that no metadata refers to (leftovers of
    /// crashes), if older than --min-age-secs. Refused while the volume is
    /// mounted on this host.
    Gc {
        /// A volume name (under --base-dir) or sqlite:///path/meta.db.
        volume: String,
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Name every object deleted (or, with --dry-run, to be).
        #[arg(long)]
        list: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Keep unreferenced objects younger than this (an upload may be
        /// waiting for its commit on another host).
        #[arg(long, default_value_t = GC_MIN_AGE_SECS_DEFAULT)]
        min_age_secs: u64,
        /// Base directory for volumes.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
    },
    /// Directory quotas: a byte and an inode limit on a directory, for
    /// everything under it (EDQUOT past them; df on the directory shows
    /// them). Works while the volume is mounted.
    Quota {
        #[command(subcommand)]
        command: quota::QuotaCommand,
    },
    /// Read every file under PATH through its mount, so the mount's block
    /// cache holds their blocks (a job's first read then comes from local
    /// disk). Refused if the set is larger than the cache; safe during an
    /// upgrade or a crash of the serving generation.
    Warmup {
        /// Files or directories on one Baton mount.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Files read at once.
        #[arg(long, default_value_t = warmup::DEFAULT_THREADS)]
        threads: usize,
        /// Print the result as JSON (no progress).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Show every mount of fs-supervisor: generation, pids, restarts.
    Status {
        /// Print JSON (`{"mounts":[...]}`) instead of a table.
        #[arg(long)]
        json: bool,
        /// Show each volume in full (its URL or path) instead of its name.
        #[arg(long)]
        wide: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Replace the filesystem process of mounts by one running a new
    /// fsclient binary, with no error and no lost request for applications:
    /// the new generation starts beside the old one, the old one hands over
    /// its state and in-flight requests, and success is reported only once
    /// the new one answered a probe through the mount. On any failure the
    /// old generation serves on (automatic rollback) and fsctl exits 1.
    Upgrade {
        /// Mountpoints to upgrade (or --all).
        mountpoints: Vec<PathBuf>,
        /// Every mount of the supervisor: the first alone (canary), then
        /// --batch at a time; stops at the first failure.
        #[arg(long)]
        all: bool,
        /// The new fsclient binary.
        #[arg(long)]
        binary: PathBuf,
        /// Mounts upgraded at once after the canary.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        batch: u32,
        /// Deadline per mount (e.g. 500ms, 30s, 2m); past it, roll back.
        #[arg(long, default_value = "30s", value_parser = parse_duration_ms)]
        timeout: u64,
        /// Print the reports as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Replace fs-supervisor itself by a new binary without unmounting
    /// anything: it re-executes in place, hands every mount's fd to its new
    /// image, which restores the mounts (each generation is replaced as
    /// after a crash: applications see a stall, no error). Returns once
    /// every mount serves again under the new binary.
    UpgradeSupervisor {
        /// The new fs-supervisor binary.
        #[arg(long)]
        binary: PathBuf,
        /// How long to wait for every mount to serve again (e.g. 60s).
        #[arg(long, default_value = "60s", value_parser = parse_duration_ms)]
        timeout: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Stop serving MOUNTPOINT (the filesystem flushes) and unmount it.
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Exit 0 even when the filesystem could not upload everything
        /// before it stopped (the data stays staged on this host and the
        /// next mount commits it); the warning is printed all the same.
        #[arg(long)]
        leave_staged: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
}

/// The supervisor's control socket option.
#[derive(clap::Args)]
struct SocketArg {
    /// fs-supervisor's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
}

fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000)
    } else {
        (text, 1000)
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text} is not a duration (e.g. 500ms, 30s, 2m)"))?;
    match value.checked_mul(scale) {
        Some(ms) if ms > 0 => Ok(ms),
        _ => Err(format!("{text} is not a usable duration")),
    }
}

fn parse_block_size(text: &str) -> Result<u32, String> {
    let bytes = parse_size(text)?;
    u32::try_from(bytes).map_err(|_| format!("block size {text} is too large"))
}

fn main() -> ExitCode {
    baton_volume::private_fs::set_private_umask();
    tracing_subscriber::fmt()
        // A command's result is what it prints; its logs only from
        // warnings up unless RUST_LOG asks for more.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal, never in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fsctl: {}", upgrade_protocol::error_chain(err.as_ref()));
            let code = err
                .chain()
                .find_map(|cause| {
                    // A volume named wrongly is bad usage (exit 2).
                    if let Some(
                        baton_volume::VolumeError::InvalidName { .. }
                        | baton_volume::VolumeError::BadVolume(_),
                    ) = cause.downcast_ref()
                    {
                        return Some(2);
                    }
                    match cause.downcast_ref::<ProtocolError>()? {
                        ProtocolError::Unreachable { .. } | ProtocolError::NoAnswer { .. } => {
                            Some(3)
                        }
                        ProtocolError::NotAllowed { .. } => Some(4),
                        _ => None,
                    }
                })
                .unwrap_or(1);
            ExitCode::from(code)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Format {
            name,
            meta,
            storage,
            s3_endpoint,
            s3_region,
            compression,
            encryption_key_file,
            passphrase_file,
            block_size,
            base_dir,
            create_dirs,
            json,
        } => {
            let formatted = format(&FormatRequest {
                name: name.clone(),
                base_dir,
                meta_url: meta,
                storage_url: storage,
                s3_endpoint,
                s3_region,
                block_size_bytes: block_size,
                compression: compression == "lz4",
                key_file: encryption_key_file,
                passphrase_file,
                create_dirs,
            })?;
            let meta_url = &formatted.meta_display;
            if json {
                let value = serde_json::json!({
                    "volume": name,
                    "meta_url": meta_url,
                    "storage_url": formatted.storage_url,
                    "block_size_bytes": block_size,
                });
                println!("{}", serde_json::to_string_pretty(&value)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "formatted volume {name}: metadata {meta_url}, data {}",
                formatted.storage_url
            );
            println!("mount it with: fsclient mount {meta_url} MOUNTPOINT");
            Ok(ExitCode::SUCCESS)
        }
        Command::Up {
            name,
            mountpoint,
            base_dir,
            state_dir,
            metrics_listen,
            socket,
        } => up(
            &name,
            &mountpoint,
            base_dir,
            &Supervised {
                state_dir: &state_dir,
                socket: &socket.socket,
                metrics_listen,
            },
        ),
        Command::Fsck {
            volume,
            base_dir,
            repair_quotas,
            json,
        } => check::fsck(&volume, &base_dir, repair_quotas, json),
        Command::Quota { command } => quota::run(command),
        Command::Warmup {
            paths,
            threads,
            json,
            socket,
        } => warmup::run(&warmup::Plan {
            paths: &paths,
            threads,
            json,
            socket: &socket.socket,
        }),
        Command::Gc {
            volume,
            dry_run,
            list,
            json,
            min_age_secs,
            base_dir,
        } => check::gc(&check::GcPlan {
            volume: &volume,
            base_dir: &base_dir,
            dry_run,
            list,
            min_age: Duration::from_secs(min_age_secs),
            json,
        }),
        Command::Mount {
            volume,
            mountpoint,
            base_dir,
            cache_dir,
            staging_dir,
            threads,
            cache_size,
            persist,
            socket,
        } => {
            let request = Request::Mount {
                volume,
                mountpoint: absolute(&mountpoint)?,
                base_dir: absolute(&base_dir)?,
                options: ClientOptions {
                    cache_dir: cache_dir.as_deref().map(absolute).transpose()?,
                    staging_dir: staging_dir.as_deref().map(absolute).transpose()?,
                    threads,
                    cache_size_bytes: cache_size,
                },
                persist,
            };
            mount(&socket.socket, &request)
        }
        Command::Status { json, wide, socket } => status(&socket.socket, json, wide),
        Command::Umount {
            mountpoint,
            leave_staged,
            socket,
        } => {
            let mountpoint = absolute(&mountpoint)?;
            umount(
                &socket.socket,
                &Request::Umount { mountpoint },
                leave_staged,
            )
        }
        Command::UpgradeSupervisor {
            binary,
            timeout,
            socket,
        } => upgrade_supervisor(&socket.socket, &absolute(&binary)?, timeout),
        Command::Upgrade {
            mountpoints,
            all,
            binary,
            batch,
            timeout,
            json,
            socket,
        } => upgrade(
            &socket.socket,
            UpgradePlan {
                mountpoints,
                all,
                binary: absolute(&binary)?,
                batch: batch as usize,
                timeout_ms: timeout,
                json,
            },
        ),
    }
}

/// `fsctl upgrade-supervisor`: asks for the re-exec, then waits until the
/// new image answers and every mount serves.
fn upgrade_supervisor(
    socket: &std::path::Path,
    binary: &std::path::Path,
    timeout_ms: u64,
) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let before = match call(socket, &Request::Status)? {
        Reply::Status { report } => report.supervisor,
        other => return refused(other),
    };
    let request = Request::UpgradeSupervisor {
        binary: binary.to_path_buf(),
    };
    match client::request(socket, &request, command_timeout(&request)) {
        Ok(Reply::SupervisorRestarting { pid, mounts, .. }) => {
            println!(
                "fs-supervisor (pid {pid}) re-executes as {} with {mounts} mount(s)",
                binary.display()
            );
        }
        Ok(other) => return refused(other),
        // The image may go before its answer is read: look at the result.
        Err(err) => {
            println!("fs-supervisor went away before answering ({err}); checking it came back")
        }
    }
    let deadline = started + std::time::Duration::from_millis(timeout_ms);
    let mut last = String::from("no answer yet");
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let report = match client::request(socket, &Request::Status, Duration::from_secs(5)) {
            Ok(Reply::Status { report }) => report,
            Ok(other) => {
                last = format!("{other:?}");
                continue;
            }
            Err(err) => {
                last = err.to_string();
                continue;
            }
        };
        let Some(now) = &report.supervisor else {
            last = "the supervisor does not report itself".into();
            continue;
        };
        let restarted = before
            .as_ref()
            .is_none_or(|b| now.started_unix_ms > b.started_unix_ms || now.binary != b.binary);
        let serving = report.mounts.iter().all(|m| m.state == "serving");
        if restarted && now.binary == binary && serving {
            println!(
                "fs-supervisor is {} ({}, pid {}); {} mount(s) serving again after {} ms",
                now.binary.display(),
                now.version,
                now.pid,
                report.mounts.len(),
                started.elapsed().as_millis()
            );
            return Ok(ExitCode::SUCCESS);
        }
        last = format!(
            "supervisor {} started at {}, mounts: {}",
            now.binary.display(),
            now.started_unix_ms,
            report
                .mounts
                .iter()
                .map(|m| format!("{} {}", m.mountpoint.display(), m.state))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    eprintln!(
        "fsctl: fs-supervisor did not come back as {} with every mount serving within {timeout_ms} ms (last seen: {last}); see its log",
        binary.display()
    );
    Ok(ExitCode::from(1))
}

struct UpgradePlan {
    mountpoints: Vec<PathBuf>,
    all: bool,
    binary: PathBuf,
    batch: usize,
    timeout_ms: u64,
    json: bool,
}

/// Upgrades mounts: the first alone, then `batch` at a time in parallel;
/// stops at the first batch with a failure.
fn upgrade(socket: &std::path::Path, plan: UpgradePlan) -> anyhow::Result<ExitCode> {
    let targets: Vec<PathBuf> = match (plan.all, plan.mountpoints.is_empty()) {
        (true, true) => match call(socket, &Request::Status)? {
            Reply::Status { report } => report.mounts.into_iter().map(|m| m.mountpoint).collect(),
            other => return refused(other),
        },
        (false, false) => plan
            .mountpoints
            .iter()
            .map(|m| absolute(m))
            .collect::<anyhow::Result<_>>()?,
        (true, false) => {
            eprintln!("fsctl: give mountpoints or --all, not both");
            return Ok(ExitCode::from(2));
        }
        (false, true) => {
            eprintln!("fsctl: name the mountpoints to upgrade, or pass --all");
            return Ok(ExitCode::from(2));
        }
    };
    if targets.is_empty() {
        println!("no mounts to upgrade");
        return Ok(ExitCode::SUCCESS);
    }
    let mut rest = targets.as_slice();
    let mut first = true;
    let mut reports = Vec::new();
    while !rest.is_empty() {
        let size = if first { 1 } else { plan.batch.min(rest.len()) };
        let (batch, later) = rest.split_at(size);
        rest = later;
        first = false;
        let answers: Vec<anyhow::Result<Reply>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|mountpoint| {
                    let request = Request::Upgrade {
                        mountpoint: mountpoint.clone(),
                        binary: plan.binary.clone(),
                        timeout_ms: plan.timeout_ms,
                    };
                    scope.spawn(move || call(socket, &request))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("upgrade thread panicked")))
                })
                .collect()
        });
        let mut failed = false;
        for (mountpoint, answer) in batch.iter().zip(answers) {
            match answer? {
                Reply::Upgraded { report } => {
                    failed |= !report.ok;
                    if !plan.json {
                        print_upgrade(&report);
                    }
                    reports.push(*report);
                }
                other => {
                    eprintln!("fsctl: upgrading {}:", mountpoint.display());
                    let code = refused(other)?;
                    if plan.json {
                        println!("{}", serde_json::to_string_pretty(&reports)?);
                    }
                    return Ok(code);
                }
            }
        }
        if failed {
            if !rest.is_empty() {
                eprintln!(
                    "fsctl: stopped after a failed upgrade; {} mount(s) left on the old binary",
                    rest.len()
                );
            }
            break;
        }
    }
    if plan.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(if reports.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_upgrade(report: &upgrade_protocol::UpgradeReport) {
    if report.ok {
        let stall = report
            .stall_us
            .map(|us| format!("{:.2} ms", us as f64 / 1000.0))
            .unwrap_or_else(|| "unknown".into());
        println!(
            "upgraded {}: generation {} -> {}, stall {stall}, {} request(s) journaled, {} ms in all, now {}",
            report.mountpoint.display(),
            report.from_generation,
            report.generation,
            report.journaled,
            report.elapsed_ms,
            report.binary.display()
        );
    } else if report.serving_died {
        eprintln!(
            "fsctl: {} {}: generation {} died; fs-supervisor recovers the mount as after any crash (`fsctl status` shows the generation that serves now)",
            report.mountpoint.display(),
            report.outcome,
            report.generation,
        );
    } else {
        eprintln!(
            "fsctl: {} {}; generation {} serves on with {}",
            report.mountpoint.display(),
            report.outcome,
            report.generation,
            report.binary.display()
        );
        if let Some(detail) = &report.detail {
            eprintln!("{detail}");
        }
    }
}

fn mount(socket: &std::path::Path, request: &Request) -> anyhow::Result<ExitCode> {
    match call(socket, request)? {
        Reply::Mounted {
            mountpoint,
            generation,
            pid,
        } => {
            println!(
                "mounted {} (generation {generation}, pid {pid})",
                mountpoint.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        other => refused(other),
    }
}

fn status(socket: &std::path::Path, json: bool, wide: bool) -> anyhow::Result<ExitCode> {
    match call(socket, &Request::Status)? {
        Reply::Status { report } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", table(&report, wide));
                for note in report.supervisor.iter().flat_map(|s| &s.start_notes) {
                    println!("at start: {note}");
                }
                let unprotected = report.supervisor.as_ref().is_some_and(|s| !s.fd_store);
                if unprotected && !report.mounts.is_empty() {
                    println!(
                        "note: fs-supervisor runs without systemd's fd store: while it is down, each mount lives on in its serving generation alone, and a generation that dies then takes its mount with it. Run it from deploy/systemd/fs-supervisor.service to keep the fds."
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        other => refused(other),
    }
}

fn umount(
    socket: &std::path::Path,
    request: &Request,
    leave_staged: bool,
) -> anyhow::Result<ExitCode> {
    match call(socket, request)? {
        Reply::Unmounted {
            mountpoint,
            warning: None,
        } => {
            println!("unmounted {}", mountpoint.display());
            Ok(ExitCode::SUCCESS)
        }
        Reply::Unmounted {
            mountpoint,
            warning: Some(warning),
        } => {
            println!("unmounted {}", mountpoint.display());
            eprintln!("fsctl: warning: {warning}");
            if leave_staged {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("fsctl: exit 1: data was left behind; `--leave-staged` accepts that");
            Ok(ExitCode::from(1))
        }
        other => refused(other),
    }
}

/// An absolute path (canonical if it exists), since the supervisor runs
/// elsewhere.
/// `path` made absolute for a request to fs-supervisor. The control
/// protocol carries paths as UTF-8 text, so a path that is not UTF-8 is
/// refused here, saying so, rather than failing deep in the encoder.
fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let absolute = match std::fs::canonicalize(path) {
        Ok(canonical) => canonical,
        Err(_) => std::env::current_dir()
            .context("reading the current directory")?
            .join(path),
    };
    if absolute.to_str().is_none() {
        anyhow::bail!(
            "{} is not UTF-8: fs-supervisor's control protocol carries paths as UTF-8 text; use a path whose names are UTF-8 (rename the directory, or bind-mount it at one)",
            absolute.display()
        );
    }
    Ok(absolute)
}

fn call(socket: &std::path::Path, request: &Request) -> anyhow::Result<Reply> {
    Ok(client::request(socket, request, command_timeout(request))?)
}

/// Creates `mountpoint` and any missing parent with mode 0755 (fsctl runs
/// with umask 077): users must be able to reach the mount.
fn create_mountpoint(mountpoint: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<&Path> = mountpoint
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .collect();
    for dir in missing.into_iter().rev() {
        std::fs::create_dir(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
            .with_context(|| format!("creating mountpoint directory {}", dir.display()))?;
    }
    Ok(())
}

/// Prints an error reply and picks the exit code.
fn refused(reply: Reply) -> anyhow::Result<ExitCode> {
    match reply {
        Reply::Error { kind, message } => {
            eprintln!("fsctl: {message}");
            Ok(ExitCode::from(match kind {
                ErrorKind::Invalid => 2,
                ErrorKind::Failed => 1,
                ErrorKind::PermissionDenied => 4,
            }))
        }
        other => {
            eprintln!("fsctl: unexpected answer from fs-supervisor: {other:?}");
            Ok(ExitCode::from(1))
        }
    }
}

/// The human status table.
/// A mount's volume in `fsctl status`: its short name, or with `--wide`
/// the whole volume string (a URL's password masked).
fn volume_label(volume: &str, wide: bool) -> String {
    match upgrade_protocol::VolumeSpec::parse(volume) {
        Ok(spec) if wide => spec.display(),
        Ok(spec) => spec.short_name(),
        Err(_) => volume.to_string(),
    }
}

/// `75` → `1m15s`, `7300` → `2h1m`, `200000` → `2d7h`.
fn human_duration(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

fn table(report: &StatusReport, wide: bool) -> String {
    if report.mounts.is_empty() {
        return "no mounts\n".to_string();
    }
    let header = [
        "MOUNTPOINT",
        if wide { "VOLUME (full)" } else { "VOLUME" },
        "STATE",
        "GEN",
        "PID",
        "STANDBY",
        "RESTARTS e/s/oom",
        "UPTIME",
        "LAST RECOVERY",
    ]
    .map(String::from);
    let mut rows = vec![header];
    for m in &report.mounts {
        let pid = |p: Option<u32>| p.map_or("-".to_string(), |p| p.to_string());
        let recovery = m.last_recovery.as_ref().map_or("-".to_string(), |r| {
            format!(
                "gen {} {} -> {} ({})",
                r.died_generation,
                r.cause,
                r.next_generation
                    .map_or("?".to_string(), |g| format!("gen {g}")),
                r.takeover_us.map_or("pending".to_string(), |us| format!(
                    "{:.1} ms {}",
                    us as f64 / 1000.0,
                    if r.warm { "warm" } else { "cold" }
                ))
            )
        });
        let state = if m.gave_up {
            "GAVE UP"
        } else if m.read_only_reason.is_some() {
            "READ-ONLY"
        } else {
            &m.state
        };
        rows.push([
            m.mountpoint.display().to_string(),
            volume_label(&m.volume, wide),
            state.to_string(),
            m.generation.to_string(),
            pid(m.pid),
            pid(m.standby_pid),
            format!(
                "{}/{}/{}",
                m.restarts.exit, m.restarts.signal, m.restarts.oom
            ),
            human_duration(m.uptime_s),
            recovery,
        ]);
    }
    let right = [false, false, false, true, true, true, true, true, false];
    let mut out = table::aligned(&rows, &right);
    for m in &report.mounts {
        if let Some(why) = &m.read_only_reason {
            out.push_str(&format!("{}: read-only: {why}\n", m.mountpoint.display()));
        }
    }
    out
}

/// The main job on the embedded default: formats the volume on first use,
/// starts `fs-supervisor` in the background if none answers on `socket`, and
/// mounts the volume through it.
/// The fs-supervisor `up` mounts through (started if none answers on
/// `socket`).
struct Supervised<'a> {
    state_dir: &'a Path,
    socket: &'a Path,
    metrics_listen: Option<std::net::SocketAddr>,
}

fn up(
    name: &str,
    mountpoint: &std::path::Path,
    base_dir: PathBuf,
    supervised: &Supervised<'_>,
) -> anyhow::Result<ExitCode> {
    let socket = supervised.socket;
    let paths = VolumePaths::named(name, &base_dir)?;
    create_mountpoint(mountpoint)?;
    let started = ensure_supervisor(supervised)?;
    if let (false, Some(addr)) = (started, supervised.metrics_listen) {
        eprintln!(
            "fsctl: note: fs-supervisor was already running, so --metrics-listen {addr} is not applied: it takes effect when `up` starts fs-supervisor (or start it yourself with `fs-supervisor --metrics-listen {addr}`)"
        );
    }
    let mountpoint_abs = absolute(mountpoint)?;
    // `up` is idempotent: the same volume already mounted there is success.
    if let Reply::Status { report } = call(socket, &Request::Status)? {
        if let Some(m) = report
            .mounts
            .iter()
            .find(|m| m.mountpoint == mountpoint_abs)
        {
            if m.volume != paths.meta_url {
                anyhow::bail!(
                    "{} is already a mount of {}, not of volume {name}: pick another mountpoint, or `fsctl umount {}` first",
                    mountpoint.display(),
                    m.volume,
                    mountpoint.display()
                );
            }
            println!(
                "volume {name} is already mounted at {} (generation {}, {})",
                mountpoint.display(),
                m.generation,
                m.state
            );
            print_up_hints(
                mountpoint,
                socket,
                started.then_some(supervised.metrics_listen).flatten(),
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    if !paths.sqlite_path.as_deref().is_some_and(Path::exists) {
        let formatted = format(&FormatRequest::new(name, &base_dir))?;
        println!("formatted volume {name} ({})", formatted.meta_url);
    }
    let request = Request::Mount {
        volume: paths.meta_url.clone(),
        mountpoint: mountpoint_abs,
        base_dir: absolute(&base_dir)?,
        options: ClientOptions::default(),
        persist: false,
    };
    let code = mount(socket, &request)?;
    println!(
        "volume {name} is mounted at {} and supervised by fs-supervisor ({})",
        mountpoint.display(),
        socket.display()
    );
    print_up_hints(
        mountpoint,
        socket,
        started.then_some(supervised.metrics_listen).flatten(),
    );
    Ok(code)
}

/// What to do next with a mount `up` made: commands that work as printed
/// (this fsctl's own path; `--socket` only when it is not the default).
fn print_up_hints(mountpoint: &Path, socket: &Path, metrics: Option<std::net::SocketAddr>) {
    let fsctl = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let on_path = exe.file_name().is_some_and(|name| {
                which_on_path(name).is_some_and(|found| same_file(&found, &exe))
            });
            (!on_path).then(|| exe.display().to_string())
        })
        .unwrap_or_else(|| "fsctl".to_string());
    let socket_arg = if socket == Path::new(DEFAULT_SOCKET) {
        String::new()
    } else {
        format!(" --socket {}", socket.display())
    };
    let m = mountpoint.display();
    let fsclient = std::env::current_exe()
        .map(|exe| exe.with_file_name("fsclient").display().to_string())
        .unwrap_or_else(|_| "/path/to/new/fsclient".to_string());
    println!("  status:  {fsctl} status{socket_arg}");
    println!("  upgrade: {fsctl} upgrade {m} --binary {fsclient}{socket_arg}");
    println!("  crash:   kill -9 the pid in status; the next generation takes over");
    println!("  stop:    {fsctl} umount {m}{socket_arg}");
    if let Some(addr) = metrics {
        println!("  metrics: http://{addr}/metrics (live status page: http://{addr}/)");
    }
}

/// The first `name` in a directory of `$PATH`.
fn which_on_path(name: &std::ffi::OsStr) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Starts `fs-supervisor` (next to this executable) in its own process
/// group, logging to its state directory, unless one answers on `socket`;
/// returns whether it started one.
fn ensure_supervisor(supervised: &Supervised<'_>) -> anyhow::Result<bool> {
    let (socket, state_dir) = (supervised.socket, supervised.state_dir);
    if upgrade_protocol::connect_seqpacket(socket).is_ok() {
        return Ok(false);
    }
    let binary = std::env::current_exe()?.with_file_name("fs-supervisor");
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let log_path = state_dir.join("fs-supervisor.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut child = std::process::Command::new(&binary)
        .arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(state_dir)
        .args(
            supervised
                .metrics_listen
                .map(|addr| format!("--metrics-listen={addr}")),
        )
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| {
            format!(
                "starting {}; build it with `cargo build --release`",
                binary.display()
            )
        })?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while upgrade_protocol::connect_seqpacket(socket).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = upgrade_protocol::log_tail(&log_path);
            let said = tail.lines().rev().find(|l| !l.trim().is_empty());
            anyhow::bail!(
                "fs-supervisor exited ({status}) before answering on {}: {}",
                socket.display(),
                said.unwrap_or("see its log")
            );
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "fs-supervisor did not answer on {} within 20 s; see {}",
                socket.display(),
                log_path.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!("started fs-supervisor (log: {})", log_path.display());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_the_two_largest_units() {
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(75), "1m15s");
        assert_eq!(human_duration(7_300), "2h1m");
        assert_eq!(human_duration(200_000), "2d7h");
    }
}
