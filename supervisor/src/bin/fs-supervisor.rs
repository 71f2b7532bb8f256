//! `fs-supervisor`: holds the /dev/fuse fd of every Baton mount and keeps a
//! generation (`fsclient serve`) serving each one (see the `daemon` module).
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT: every mount is
//! unmounted first, unless `--keep-mounts-on-exit` or a successor took
//! them over), 1 when it cannot start or its loop fails (the message
//! says why), 2 bad usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use supervisor::control::DEFAULT_SOCKET;
use supervisor::daemon::{default_client_binary, Config, DEFAULT_STATE_DIR};
use upgrade_protocol::parse_size;

#[derive(Parser)]
#[command(
    name = "fs-supervisor",
    version,
    about = "Hold Baton mounts' /dev/fuse fds and keep a generation serving each"
)]
struct Cli {
    /// State directory (mount records, generation sockets, logs).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Control socket fsctl talks to.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The fsclient binary [default: `fsclient` next to this executable].
    #[arg(long)]
    client_binary: Option<PathBuf>,
    /// Keep a warm standby generation per mount (the default).
    #[arg(long, overrides_with = "no_standby")]
    standby: bool,
    /// Start a new generation only after a death (cold).
    #[arg(long, overrides_with = "standby")]
    no_standby: bool,
    /// Memory limit of each generation's cgroup, e.g. 512M.
    #[arg(long, value_parser = parse_size)]
    memory_max: Option<u64>,
    /// Stop restarting a mount after N consecutive failed starts.
    #[arg(long)]
    give_up_after: Option<u32>,
    /// Name of the parent cgroup generations' cgroups are created in.
    #[arg(long, default_value = "baton")]
    cgroup_parent: String,
    /// On SIGTERM/SIGINT, exit without unmounting: generations keep
    /// serving and the next fs-supervisor adopts the mounts through
    /// systemd's fd store (the systemd unit sets this).
    #[arg(long)]
    keep_mounts_on_exit: bool,
    /// If another fs-supervisor already serves this state directory, wait
    /// beside it and take its mounts over when it is stopped (SIGTERM),
    /// instead of refusing to start: a DaemonSet rollout with maxSurge.
    /// A stopping supervisor hands over to a waiting successor whether or
    /// not it was started with this flag.
    #[arg(long)]
    successor: bool,
    /// Serve Prometheus metrics (/metrics), a status page (/), /healthz and
    /// /readyz on this address, e.g. 127.0.0.1:9464 (a non-loopback address
    /// is logged as a warning: the page names mount paths and volumes).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Publish Kubernetes Events on pods using a mount and a per-node
    /// status ConfigMap; needs NODE_NAME (downward API) and the
    /// `kubernetes` cargo feature.
    #[arg(long)]
    kubernetes: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal, never in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // On a full disk a failed log write is dropped: tracing-subscriber
        // would report it with eprintln!, which panics when stderr is that
        // same full log file, and a log must never end the process.
        .log_internal_errors(false)
        .init();
    match run() {
        Ok(code) => code,
        Err(err) => {
            // Not eprintln!, which panics when stderr cannot be written
            // (a full disk under the log file).
            let _ = writeln!(
                std::io::stderr(),
                "fs-supervisor: {}",
                upgrade_protocol::error_chain(err.as_ref())
            );
            ExitCode::from(1)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // Absolute once, here: the daemon may change directory, and a
    // re-executed image passes it on (`reexec.rs`).
    let client_binary = match cli.client_binary {
        Some(path) => std::path::absolute(&path)
            .with_context(|| format!("resolving --client-binary {}", path.display()))?,
        None => default_client_binary(),
    };
    let config = Config {
        state_dir: cli.state_dir,
        socket: cli.socket,
        client_binary,
        standby: cli.standby || !cli.no_standby,
        memory_max_bytes: cli.memory_max,
        give_up_after: cli.give_up_after,
        cgroup_parent: cli.cgroup_parent,
        cgroup_root: PathBuf::from(supervisor::cgroup::CGROUP_FS_ROOT),
        sysctl_dir: PathBuf::from(supervisor::preflight::FUSE_SYSCTL_DIR),
        keep_mounts_on_exit: cli.keep_mounts_on_exit,
        successor: cli.successor,
        metrics_listen: cli.metrics_listen,
        kubernetes: cli.kubernetes,
    };
    supervisor::daemon::run(config)?;
    Ok(ExitCode::SUCCESS)
}
