//! Running the server: `mount` (mount(2), INIT, serve, flush, unmount) and
//! `serve` (adopt a supervisor's initialized connection and serve it as one
//! generation: see `generation.rs`).
//!
//! Signals: SIGTERM and SIGINT are blocked in every thread (before any is
//! spawned) and taken by the main thread with `sigwait`. When the
//! connection ends by itself (unmount: ENODEV) the thread joining the
//! workers sends SIGTERM to the process so the main thread wakes. Shutdown
//! order: stop the workers between requests, answer parked lock requests
//! EINTR, flush every staged file (commit), then unmount (`mount` only).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use baton_volume::{LockMode, Volume, VolumePaths};
use fuse_wire::{Channel, ExitReason, InitConfig, InitParams, Session, Workers};
use nix::sys::signal::{SigSet, Signal};
use upgrade_protocol::{connect_seqpacket, Unanswered};

use crate::cli::{Cli, Command, VolumeArgs};
use crate::error::{Error, Result};
use crate::fs::{BatonFs, FsConfig};
use crate::generation::{receive_adopt, Generation};
use crate::session::SessionTimer;

/// Runs the command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let signals = control_signals();
    signals.thread_block().map_err(signal_error)?;
    match cli.command {
        Command::Mount {
            volume,
            mountpoint,
            options,
        } => mount(&volume, &mountpoint, &options, &signals),
        Command::Serve {
            connect,
            volume,
            options,
        } => serve(&connect, &volume, &options, &signals),
    }
}

fn control_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}

pub(crate) fn signal_error(errno: nix::errno::Errno) -> Error {
    Error::from(fuse_wire::Error::Signal(errno))
}

fn open_fs(
    volume: &str,
    options: &VolumeArgs,
    mode: LockMode,
) -> Result<(Arc<BatonFs>, ServedVolume)> {
    let paths = VolumePaths::resolve(volume, &options.base_dir)?;
    let opened = Volume::open(&paths, &options.volume_options(), mode)?;
    let name = opened.name.clone();
    let shared = opened.shared;
    let config = FsConfig {
        attr_ttl: options.attr_ttl(shared),
    };
    let (fs, lock) = BatonFs::from_volume(opened, config);
    Ok((Arc::new(fs), ServedVolume { name, shared, lock }))
}

/// What stays alive with the server besides the filesystem.
struct ServedVolume {
    name: String,
    /// Other hosts may serve the volume (their open orphans are not ours).
    shared: bool,
    /// The volume lock, held for the process's life.
    lock: nix::fcntl::Flock<std::fs::File>,
}

fn mount(
    volume: &str,
    mountpoint: &Path,
    options: &VolumeArgs,
    signals: &SigSet,
) -> Result<ExitCode> {
    let mountpoint = &fuse_wire::check_mountpoint(mountpoint)?;
    let (fs, held) = open_fs(volume, options, LockMode::Exclusive)?;
    fs.set_connection(upgrade_protocol::connection_identity(), 1, false);
    // A SQLite volume under our exclusive lock has no other live mount.
    fs.recover(!held.shared)?;
    fs.open_session(
        &crate::session::host_name(),
        &mountpoint.display().to_string(),
    )?;
    let mount_options = fuse_wire::MountOptions {
        source: held.name.clone(),
        subtype: "baton".into(),
        allow_other: true,
        default_permissions: true,
    };
    let fd = fuse_wire::mount_fuse(mountpoint, &mount_options)?;
    let channel = Arc::new(Channel::new(fd));
    let mut init = InitConfig::baton();
    if held.shared {
        // With a writeback cache the kernel owns size and mtime of cached
        // files and ignores other hosts' changes: no close-to-open.
        init.flags &= !fuse_wire::abi::init_flags::WRITEBACK_CACHE;
    }
    let params = match fuse_wire::initialize(&channel, &init) {
        Ok(params) => params,
        Err(err) => {
            let _ = fuse_wire::unmount(mountpoint);
            return Err(err.into());
        }
    };
    fuse_wire::raise_read_ahead(mountpoint);
    tracing::info!(volume = %held.name, mountpoint = %mountpoint.display(), "mounted");
    let timer = SessionTimer::start(Arc::clone(&fs), options.session_expiry());
    let (reason, flushed) = serve_until_signal(&fs, channel, params, options.threads, signals)?;
    timer.stop();
    // Unmount even when the final flush failed: the data stays staged and
    // the next mount commits it.
    if !matches!(reason, ExitReason::Ended(_)) {
        fuse_wire::unmount(mountpoint)?;
    }
    tracing::info!(volume = %held.name, "unmounted");
    // The mount is gone: so are its handles and its session.
    if let Err(err) = fs.close_session() {
        tracing::warn!(%err, "session not closed; it expires and other mounts clean up");
    }
    flushed?;
    Ok(ExitCode::SUCCESS)
}

/// The environment variable the supervisor sets to the mount's id.
pub const MOUNT_ID_ENV: &str = "BATON_MOUNT_ID";

fn serve(connect: &Path, volume: &str, options: &VolumeArgs, signals: &SigSet) -> Result<ExitCode> {
    let (fs, held) = open_fs(volume, options, LockMode::Shared)?;
    // Everything a first request needs is readied before this process
    // tells the supervisor it is ready (connects): the metadata connections
    // and the worker threads with their read buffers. A planned upgrade
    // sends the handover as soon as the standby connects, so anything after
    // the connect is stall: faulting the buffers in after it cost about 2 ms
    // of every upgrade's stall (baton-bench upgrade-stall).
    fs.warm_up();
    let buffer_len = fuse_wire::read_buffer_len(fuse_wire::InitConfig::baton().max_write);
    let idle = fuse_wire::IdleWorkers::spawn(options.threads, buffer_len)?;
    let socket = connect_seqpacket(connect)?;
    let (adoption, fd) = receive_adopt(&socket, connect)?;
    let (generation_number, unanswered) = (adoption.generation, adoption.unanswered);
    // Every line from here on, in every thread of this generation, names
    // the mount and the generation.
    let mount = std::env::var(MOUNT_ID_ENV).unwrap_or_else(|_| held.name.clone());
    let span = tracing::info_span!("generation", mount = %mount, generation = generation_number);
    let _in_span = span.enter();
    let planned = adoption.handover.is_some();
    // A new mount's first generation: on a volume only one mount per host
    // serves (not shared), and with no other process holding its lock,
    // every session registered is a dead mount's.
    let fresh = !planned && generation_number == 1 && unanswered == Unanswered::Leave;
    let (generation, journal) = Generation::adopt(fs, socket, adoption, fd, options.threads, idle)?;
    if fresh && !held.shared {
        if others_hold_lock(&held.lock) {
            tracing::warn!(volume = %held.name, "another process holds the volume lock; earlier sessions are left to expire");
        } else {
            generation.fs().expire_earlier_sessions()?;
        }
    }
    // A planned upgrade continues the predecessor's session (same id, its
    // holds in place): renewing it can wait until this one reads, out of
    // the applications' stall. Otherwise it is registered before serving.
    if !planned {
        generation.open_session(&held.name)?;
    }
    tracing::info!(volume = %held.name, generation = generation_number, ?unanswered, journaled = journal.requests.len(), "adopted the FUSE connection");
    generation.start(&journal, unanswered)?;
    if planned {
        generation.open_session(&held.name)?;
    }
    let timer = SessionTimer::start(generation.fs(), options.session_expiry());
    let ended = generation.run(signals);
    timer.stop();
    if ended? {
        generation.close_session();
    }
    Ok(ExitCode::SUCCESS)
}

/// Serves until SIGTERM/SIGINT or the connection ends, then stops the
/// workers, cancels parked lock requests and flushes everything staged.
/// Returns why serving ended and how the final flush went.
fn serve_until_signal(
    fs: &Arc<BatonFs>,
    channel: Arc<Channel>,
    params: InitParams,
    threads: usize,
    signals: &SigSet,
) -> Result<(ExitReason, Result<()>)> {
    fs.set_init(&params);
    fs.set_kernel_channel(channel.clone());
    let session = Session::new(channel, params, Arc::clone(fs));
    let workers = session.start(threads)?;
    let stopper = workers.stopper();
    let waiter = spawn_waiter(workers);
    let signal = signals.wait().map_err(signal_error)?;
    tracing::info!(?signal, "stopping between requests");
    stopper.stop();
    let reason = waiter.join().unwrap_or(ExitReason::Stopped);
    fs.cancel_lock_waiters();
    // This process unmounts as it exits: nothing serves the mount after it.
    Ok((reason, fs.flush_all_at_exit(true)))
}

/// Joins the workers; if the connection ends by itself, wakes the main
/// thread with SIGTERM.
fn spawn_waiter(workers: Workers) -> std::thread::JoinHandle<ExitReason> {
    std::thread::spawn(move || {
        let reason = workers.join();
        if let ExitReason::Ended(errno) = reason {
            tracing::info!(%errno, "FUSE connection ended");
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
        }
        reason
    })
}

/// Whether a process other than this one holds a flock on `lock` (another
/// mount of the volume on this host, or a generation of one), as
/// /proc/locks lists them (`N: FLOCK ADVISORY READ PID MAJ:MIN:INO ...`,
/// device numbers in hex). Unreadable: `true`.
fn others_hold_lock(lock: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(meta), Ok(locks)) = (lock.metadata(), std::fs::read_to_string("/proc/locks")) else {
        return true;
    };
    let file = (
        nix::sys::stat::major(meta.dev()),
        nix::sys::stat::minor(meta.dev()),
        meta.ino(),
    );
    let me = std::process::id().to_string();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Waiters ("N: -> FLOCK ...") hold nothing yet.
        fields.get(1) == Some(&"FLOCK")
            && fields.get(4).is_some_and(|pid| *pid != me)
            && fields.get(5).and_then(|id| lock_file_id(id)) == Some(file)
    })
}

/// `MAJ:MIN:INO` of /proc/locks (hex, hex, decimal).
fn lock_file_id(id: &str) -> Option<(u64, u64, u64)> {
    let mut parts = id.split(':');
    let major = u64::from_str_radix(parts.next()?, 16).ok()?;
    let minor = u64::from_str_radix(parts.next()?, 16).ok()?;
    let ino = parts.next()?.parse().ok()?;
    Some((major, minor, ino))
}

#[cfg(test)]
mod tests {
    use super::lock_file_id;

    #[test]
    fn proc_locks_file_ids_parse_hex_devices_and_decimal_inodes() {
        assert_eq!(lock_file_id("fe:00:5308819"), Some((0xfe, 0, 5_308_819)));
        assert_eq!(lock_file_id("08:1a:12"), Some((8, 0x1a, 12)));
        assert_eq!(lock_file_id("EOF"), None);
        assert_eq!(lock_file_id("08:01"), None);
    }
}
