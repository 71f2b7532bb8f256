//! `baton-testfs`: serves the in-memory TEST filesystem over fuse-wire, in
//! the roles the fuse-wire tests and the bench need:
//!
//! - `serve`: mount, answer INIT and serve (optionally handing the fd to a
//!   process that connects to `--handoff`, then exiting);
//! - `holder`: mount, answer INIT and only hold the fd, giving a copy to
//!   every generation that connects (what the supervisor will do);
//! - `adopt`: take an initialized fd from a holder and serve it;
//! - `workload`, `rw-workload`: verifying workloads run as child processes
//!   of tests;
//! - `tmpfile-publish`: write an O_TMPFILE, link it, check it by its name
//!   (`chaos_tests::tmpfile`).
//!
//! Signals: SIGTERM/SIGINT stop (and `serve`/`holder` unmount); SIGUSR1 makes
//! `adopt` stop its workers between requests and exit 0 without unmounting.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use chaos_tests::memfs::{MemFs, MemFsOptions};
use clap::{Args, Parser, Subcommand};
use fuse_wire::{Channel, InitConfig, InitParams, Session};
use nix::sys::signal::{SigSet, Signal};
use upgrade_protocol::{
    accept_seqpacket, connect_seqpacket, listen_seqpacket, recv_message, send_message, Message,
    NegotiatedInit, Unanswered,
};

#[derive(Parser)]
#[command(about = "In-memory TEST filesystem served over fuse-wire (test code only)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount, answer INIT and serve.
    Serve {
        /// Where to mount.
        #[arg(long)]
        mount: PathBuf,
        /// Hand the fd to the first process that connects here, then exit.
        #[arg(long)]
        handoff: Option<PathBuf>,
        #[command(flatten)]
        serving: Serving,
    },
    /// Mount, answer INIT, and give a copy of the fd to each generation.
    Holder {
        /// Where to mount.
        #[arg(long)]
        mount: PathBuf,
        /// The socket generations connect to.
        #[arg(long)]
        socket: PathBuf,
        /// Do not ask generations to send FUSE_NOTIFY_RESEND.
        #[arg(long)]
        no_resend: bool,
    },
    /// Adopt an initialized connection from a holder and serve it.
    Adopt {
        /// The holder's socket.
        #[arg(long)]
        connect: PathBuf,
        /// Answer this journaled raw request before reading the device.
        #[arg(long)]
        replay: Option<PathBuf>,
        #[command(flatten)]
        serving: Serving,
    },
    /// Run a verifying read workload on a mount (for tests), printing
    /// `ops N` progress lines, until killed.
    Workload {
        /// The mount to read.
        #[arg(long)]
        mount: PathBuf,
        /// Reader threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// Run a verifying read/write/readdir workload in DIR (any filesystem)
    /// until STOP_FILE exists; exits 1 if any syscall failed or any byte
    /// was wrong (see `chaos_tests::rw_workload`).
    RwWorkload {
        /// Directory to work in (created).
        #[arg(long)]
        dir: PathBuf,
        /// Writer threads.
        #[arg(long, default_value_t = 2)]
        writers: usize,
        /// Reader threads.
        #[arg(long, default_value_t = 2)]
        readers: usize,
        /// Files per writer.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Bytes per file.
        #[arg(long, default_value_t = 256 * 1024)]
        file_bytes: usize,
        /// Stop when this file exists.
        #[arg(long)]
        stop_file: PathBuf,
    },
    /// Write BYTES into an O_TMPFILE in DIR, link it as NAME and check it
    /// through the name; exits 1 if anything failed or differed.
    TmpfilePublish {
        /// The directory to publish into.
        #[arg(long)]
        dir: PathBuf,
        /// The name to link the file at.
        #[arg(long)]
        name: String,
        /// Bytes to write.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: usize,
        /// Seed of the content.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Create this file once the data is written.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Wait for this file before linking.
        #[arg(long)]
        go_file: Option<PathBuf>,
        /// Close the file without linking it.
        #[arg(long)]
        discard: bool,
    },
}

#[derive(Args, Clone)]
struct Serving {
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Never answer reads of this file (test hook).
    #[arg(long)]
    stall: Option<String>,
    /// Write the raw bytes of the stalled request here.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Create this file once a request is stalled.
    #[arg(long)]
    stall_marker: Option<PathBuf>,
    /// Open files with FOPEN_DIRECT_IO.
    #[arg(long)]
    direct_io: bool,
    /// Attribute and entry cache seconds.
    #[arg(long, default_value_t = 1)]
    cache_secs: u64,
    /// Negotiate Baton's INIT flags and answer as Baton does on a volume
    /// only it serves (`MemFsOptions::like_baton`; with `serve`): what the
    /// kernel and the transport cost Baton, without its storage.
    #[arg(long)]
    like_baton: bool,
}

impl Serving {
    fn memfs(&self) -> Arc<MemFs> {
        Arc::new(MemFs::new(MemFsOptions {
            stall_name: self.stall.clone().map(Into::into),
            journal_path: self.journal.clone(),
            stall_marker: self.stall_marker.clone(),
            direct_io: self.direct_io,
            cache_secs: self.cache_secs,
            like_baton: self.like_baton,
        }))
    }

    /// What INIT asks the kernel for.
    fn init_config(&self) -> InitConfig {
        if self.like_baton {
            InitConfig::baton()
        } else {
            InitConfig::simple()
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        // Colour only on a terminal, never in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("baton-testfs: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // Block the control signals in every thread; the main thread waits for them.
    let signals = control_signals();
    signals.thread_block().context("blocking control signals")?;
    match cli.command {
        Command::Serve {
            mount,
            handoff,
            serving,
        } => serve(&mount, handoff.as_deref(), &serving, &signals),
        Command::Holder {
            mount,
            socket,
            no_resend,
        } => {
            let unanswered = if no_resend {
                Unanswered::Leave
            } else {
                Unanswered::Resend
            };
            hold(&mount, &socket, unanswered, &signals)
        }
        Command::Adopt {
            connect,
            replay,
            serving,
        } => adopt(&connect, replay.as_deref(), &serving, &signals),
        Command::Workload { mount, threads } => chaos_tests::workload::run(mount, threads),
        Command::RwWorkload {
            dir,
            writers,
            readers,
            slots,
            file_bytes,
            stop_file,
        } => {
            let status = chaos_tests::rw_workload::run(chaos_tests::rw_workload::Config {
                dir,
                writers,
                readers,
                slots,
                file_bytes,
                stop_file,
            });
            Ok(ExitCode::from(status as u8))
        }
        Command::TmpfilePublish {
            dir,
            name,
            bytes,
            seed,
            ready_file,
            go_file,
            discard,
        } => {
            let config = chaos_tests::tmpfile::PublishConfig {
                dir,
                name,
                len: bytes,
                seed,
                ready_file,
                go_file,
                discard,
            };
            match chaos_tests::tmpfile::publish(&config) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(err) => {
                    eprintln!("baton-testfs tmpfile-publish: {err:#}");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

fn control_signals() -> SigSet {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1] {
        set.add(signal);
    }
    set
}

fn mount_and_init(mount: &Path, config: &InitConfig) -> anyhow::Result<(Arc<Channel>, InitParams)> {
    let options = fuse_wire::MountOptions {
        source: "baton-testfs".into(),
        ..Default::default()
    };
    let fd = fuse_wire::mount_fuse(mount, &options)?;
    let channel = Arc::new(Channel::new(fd));
    let params = fuse_wire::initialize(&channel, config)
        .with_context(|| format!("answering FUSE_INIT on {}", mount.display()))?;
    Ok((channel, params))
}

fn serve(
    mount: &Path,
    handoff: Option<&Path>,
    serving: &Serving,
    signals: &SigSet,
) -> anyhow::Result<ExitCode> {
    let (channel, params) = mount_and_init(mount, &serving.init_config())?;
    let session = Session::new(Arc::clone(&channel), params, serving.memfs());
    let workers = session.start(serving.threads)?;
    let stopper = workers.stopper();
    if let Some(path) = handoff {
        let listener =
            listen_seqpacket(path, 0o600).with_context(|| format!("binding {}", path.display()))?;
        let stopper = stopper.clone();
        let channel = Arc::clone(&channel);
        std::thread::spawn(move || {
            let result = hand_off(&listener, &channel, &params, &stopper);
            match result {
                Ok(()) => std::process::exit(0),
                Err(err) => {
                    eprintln!("baton-testfs: handoff failed: {err:#}");
                    std::process::exit(3)
                }
            }
        });
    }
    let waiter = spawn_waiter(workers);
    let signal = signals.wait()?;
    tracing::info!(?signal, "stopping");
    stopper.stop();
    let _ = waiter.join();
    if fuse_wire::connection_id(mount).is_ok() {
        fuse_wire::unmount(mount)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Stops serving between requests and gives the fd to the peer.
fn hand_off(
    listener: &OwnedFd,
    channel: &Channel,
    params: &InitParams,
    stopper: &fuse_wire::Stopper,
) -> anyhow::Result<()> {
    let stream = accept_seqpacket(listener.as_fd()).context("accepting the next generation")?;
    stopper.stop();
    let message = Message::Adopt {
        generation: 2,
        connection_identity: 0,
        handover: None,
        init: NegotiatedInit::from(params),
        unanswered: Unanswered::Leave,
    };
    send_message(stream.as_fd(), &message, &[channel.fd()])?;
    Ok(())
}

fn hold(
    mount: &Path,
    socket_path: &Path,
    unanswered: Unanswered,
    signals: &SigSet,
) -> anyhow::Result<ExitCode> {
    let (channel, params) = mount_and_init(mount, &InitConfig::simple())?;
    let listener = listen_seqpacket(socket_path, 0o600)
        .with_context(|| format!("binding {}", socket_path.display()))?;
    let generation = Arc::new(AtomicU64::new(1));
    std::thread::spawn(move || {
        while let Ok(stream) = accept_seqpacket(listener.as_fd()) {
            let message = Message::Adopt {
                generation: generation.fetch_add(1, Ordering::SeqCst),
                connection_identity: 0,
                handover: None,
                init: NegotiatedInit::from(&params),
                unanswered,
            };
            if let Err(err) = send_message(stream.as_fd(), &message, &[channel.fd()]) {
                tracing::error!(%err, "cannot hand the fd to a generation");
            }
        }
    });
    signals.wait()?;
    fuse_wire::unmount(mount)?;
    Ok(ExitCode::SUCCESS)
}

fn adopt(
    connect: &Path,
    replay: Option<&Path>,
    serving: &Serving,
    signals: &SigSet,
) -> anyhow::Result<ExitCode> {
    let socket = connect_seqpacket(connect)
        .with_context(|| format!("connecting to {}", connect.display()))?;
    let (message, mut fds) = recv_message(socket.as_fd())?;
    let Message::Adopt {
        generation,
        init,
        unanswered,
        ..
    } = message
    else {
        bail!(
            "expected an adopt message from {}, got {}",
            connect.display(),
            message.kind()
        );
    };
    let Some(fd) = fds.pop() else {
        bail!("adopt message without a /dev/fuse fd")
    };
    let session = Session::new(
        Arc::new(Channel::new(fd)),
        InitParams::from(&init),
        serving.memfs(),
    );
    tracing::info!(generation, ?unanswered, "adopted the FUSE connection");
    if unanswered == Unanswered::Resend {
        session.resend()?;
    }
    if let Some(path) = replay {
        let raw =
            std::fs::read(path).with_context(|| format!("reading journal {}", path.display()))?;
        session.handle(&raw);
    }
    let workers = session.start(serving.threads)?;
    let stopper = workers.stopper();
    let waiter = spawn_waiter(workers);
    let signal = signals.wait()?;
    tracing::info!(?signal, "stopping between requests");
    stopper.stop();
    let _ = waiter.join();
    Ok(ExitCode::SUCCESS)
}

/// Joins the workers; if the connection ends by itself, wakes the main
/// thread with SIGTERM.
fn spawn_waiter(workers: fuse_wire::Workers) -> std::thread::JoinHandle<fuse_wire::ExitReason> {
    std::thread::spawn(move || {
        let reason = workers.join();
        if let fuse_wire::ExitReason::Ended(errno) = reason {
            tracing::info!(%errno, "connection ended");
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
        }
        reason
    })
}
