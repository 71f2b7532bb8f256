//! `fs-supervisor`: one event loop per process over a closed set of inputs:
//! signals (signalfd), control commands (forwarded by the socket threads
//! through a channel + eventfd), each mount's generation socket (connects),
//! each generation's control connection (Serving) and pidfd (death), and
//! the machine's timers (the poll timeout). Every mount's decisions are the
//! lifecycle machine's; this loop only turns readiness into events and
//! hands them to the mount's executor.
//!
//! Shutdown (SIGTERM/SIGINT): every mount is unmounted as by `fsctl
//! umount`, then the loop ends; with `--keep-mounts-on-exit` (the systemd
//! unit) it exits at once and the generations keep serving; with a
//! successor waiting (`succession.rs`) every mount is handed to it. At
//! start, the
//! mounts of the state directory are restored (`restore.rs`: adopted with
//! the fds systemd kept, or mounted again if persistent), then READY=1.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{getsockopt, sockopt};
use upgrade_protocol::{
    accept_seqpacket, listen_seqpacket, recv_message, ErrorKind, Message, Reply, Request,
    StatusReport, VolumeSpec,
};

use crate::cgroup;
use crate::control;
use crate::executor::{Env, Job, Mount, NewMount};
use crate::lifecycle::mount::{Cause, Death, Event, Policy, Role};
use crate::metrics;
use crate::mount_events;
use crate::mounting::{self, invalid};
use crate::preflight;
use crate::reexec;
use crate::state_file::StateDir;
use crate::systemd::{self, Notifier};
use crate::Error;

pub mod restore;
pub mod succession;

pub use upgrade_protocol::client::DEFAULT_STATE_DIR;
/// Mounts one supervisor holds at most.
pub const MOUNTS_MAX: usize = 256;
/// Lines kept about what the start did to mounts it could not restore as
/// they were (`fsctl status`).
pub const START_NOTES_MAX: usize = MOUNTS_MAX;
/// Fds a mount costs the supervisor at most: the /dev/fuse fd, the
/// generation listener, a pidfd and a connection per process (active,
/// standby, retiring), the log.
const FDS_PER_MOUNT_MAX: u64 = 9;
/// The longest poll wait when no timer is armed.
const IDLE_POLL_MS: u64 = 60_000;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// State directory.
    pub state_dir: PathBuf,
    /// Control socket.
    pub socket: PathBuf,
    /// The fsclient binary.
    pub client_binary: PathBuf,
    /// Keep a warm standby per mount.
    pub standby: bool,
    /// Memory limit per generation.
    pub memory_max_bytes: Option<u64>,
    /// Stop restarting after this many consecutive failed starts.
    pub give_up_after: Option<u32>,
    /// Name of the Baton parent cgroup.
    pub cgroup_parent: String,
    /// Where cgroup filesystems are mounted.
    pub cgroup_root: PathBuf,
    /// Where the FUSE sysctls are.
    pub sysctl_dir: PathBuf,
    /// On SIGTERM/SIGINT, exit without unmounting: generations keep
    /// serving and the next supervisor adopts the mounts (systemd fd store).
    pub keep_mounts_on_exit: bool,
    /// If another supervisor serves the state directory, wait to take its
    /// mounts over when it stops (`succession.rs`) instead of refusing.
    pub successor: bool,
    /// Serve /metrics, the status page, /healthz and /readyz here.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Publish Kubernetes Events and a status ConfigMap (feature
    /// `kubernetes`; an error without it).
    pub kubernetes: bool,
}

/// How `Daemon::mount` makes a mount.
struct MountHow<'a> {
    /// `fsctl mount --persist`.
    persist: bool,
    /// Made again at start from this persistent record.
    restored: Option<&'a upgrade_protocol::MountRecord>,
}

/// What the socket threads and helpers send to the loop.
enum Command {
    Control {
        request: Request,
        reply: Sender<Reply>,
    },
    UnmountFinished {
        mount_id: String,
        outcome: Result<String, String>,
    },
    ProbeFinished {
        mount_id: String,
        outcome: Result<(), String>,
    },
}

/// Sends commands to the loop and wakes it.
#[derive(Clone)]
struct Waker {
    tx: Sender<Command>,
    eventfd: Arc<EventFd>,
}

impl Waker {
    fn send(&self, command: Command) -> bool {
        if self.tx.send(command).is_err() {
            return false;
        }
        if let Err(errno) = self.eventfd.write(1) {
            tracing::error!(%errno, "cannot wake the event loop");
        }
        true
    }
}

/// Which input became ready.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Signal,
    Wake,
    Listener(usize),
    Pidfd(usize, u32),
    Conn(usize, u32),
}

struct Daemon {
    env: Env,
    mounts: Vec<Mount>,
    waker: Waker,
    rx: Receiver<Command>,
    signals: SignalFd,
    shutting_down: bool,
    /// Every mount went to a successor: its control socket is not ours to
    /// remove any more.
    handed_over: bool,
    /// Mounts a stopping supervisor passed to this one, until it released
    /// their generations: restored without touching the recorded pid or
    /// cgroups (`succession.rs`).
    passed: std::collections::BTreeSet<String>,
    systemd: Notifier,
    keep_mounts_on_exit: bool,
    metrics: metrics::Snapshot,
    previous: Vec<upgrade_protocol::MountStatus>,
    /// When this executable started (status).
    started_unix_ms: u64,
    /// What the start did to mounts it could not restore as they were (a
    /// dead mount detached; at most `START_NOTES_MAX`).
    start_notes: Vec<String>,
    #[cfg(feature = "kubernetes")]
    kubernetes: Option<crate::kubernetes::client::Publisher>,
}

/// Runs the supervisor until SIGTERM/SIGINT.
pub fn run(config: Config) -> Result<(), Error> {
    // Before any thread exists: both read and unset environment variables.
    // The passed fds first, before anything else opens an fd: if one of
    // them is missing, its number must not be taken by our own socket.
    let stored_fds = systemd::take_listen_fds().unwrap_or_else(|err| {
        tracing::error!(%err, "ignoring the fds systemd passed");
        Default::default()
    });
    let notifier = Notifier::from_env();
    // After the environment is read: this starts threads.
    reexec::reap_inherited_children();
    raise_fd_limit();
    preflight::check_request_timeouts(preflight::read_request_timeouts(&config.sysctl_dir)?)?;
    check_socket_paths(&config)?;
    let state = StateDir::create(&config.state_dir)?;
    // One supervisor per state directory, claimed before anything else is
    // set up. One that already holds mounts (a successor, an image
    // re-executed in place, a restart with stored fds) must serve them,
    // so it claims the directory once it is free, below.
    let predecessor_socket = match config.successor {
        true => succession::find_predecessor(&state, &config.socket),
        false => None,
    };
    let successor = predecessor_socket.is_some();
    let holds_mounts = successor || !stored_fds.is_empty();
    if !holds_mounts {
        if control::answers(&config.socket) {
            return Err(Error::AlreadyRunning {
                path: config.socket.clone(),
            });
        }
        crate::state_lock::claim(&state, &config.socket)?;
    }
    let cgroups = setup_cgroups(&config)?;
    let signals = shutdown_signals()?;
    if holds_mounts {
        // After the shutdown signals are blocked: this may start a
        // thread, which must not take a SIGTERM meant for the loop.
        crate::state_lock::claim_when_free(&state, &config.socket);
    }
    let mut stored_fds = stored_fds;
    let mut predecessor = None;
    if successor {
        match succession::wait_for_predecessor(&state, &signals)? {
            succession::Succession::Mounts(mut passed) => {
                stored_fds.extend(std::mem::take(&mut passed.fds));
                predecessor = Some(passed);
            }
            succession::Succession::Stopped => return Ok(()),
        }
    }
    let eventfd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(Error::sys("eventfd"))?;
    let (tx, rx) = mpsc::channel();
    let waker = Waker {
        tx,
        eventfd: Arc::new(eventfd),
    };
    let snapshot = metrics::Snapshot::default();
    if let Some(addr) = config.metrics_listen {
        metrics::serve(addr, snapshot.clone()).map_err(|source| Error::Io {
            op: "serving metrics on (--metrics-listen)",
            path: PathBuf::from(addr.to_string()),
            source,
        })?;
    }
    #[cfg(not(feature = "kubernetes"))]
    if config.kubernetes {
        return Err(Error::Kubernetes(
            "this fs-supervisor was built without the `kubernetes` feature; build it with `cargo build -p supervisor --features kubernetes`".into(),
        ));
    }
    #[cfg(feature = "kubernetes")]
    let kubernetes = match config.kubernetes {
        true => {
            let node = crate::kubernetes::Node::from_env().map_err(Error::Kubernetes)?;
            tracing::info!(node = node.name, namespace = node.namespace, "kubernetes");
            let publisher = crate::kubernetes::client::start(node)
                .map_err(|err| Error::Kubernetes(format!("cannot start its thread: {err}")))?;
            Some(publisher)
        }
        false => None,
    };
    let listener = match predecessor.is_some() {
        // The predecessor may not have exited yet: take its socket's name
        // over (its listener is closed as it exits).
        true => control::bind_replacing(&config.socket)?,
        false => control::bind(&config.socket)?,
    };
    let forward = waker.clone();
    control::serve(
        listener,
        config.socket.clone(),
        Arc::new(move |request| forward_request(&forward, request)),
    );
    tracing::info!(
        socket = %config.socket.display(),
        state_dir = %config.state_dir.display(),
        client = %config.client_binary.display(),
        standby = config.standby,
        cgroups = ?cgroups.as_ref().map(|c| c.dir().to_path_buf()),
        "fs-supervisor ready"
    );
    let mut daemon = Daemon {
        env: Env {
            policy: Policy {
                standby: config.standby,
                give_up_after: config.give_up_after,
            },
            state,
            cgroups,
            memory_max_bytes: config.memory_max_bytes,
            client_binary: config.client_binary.clone(),
        },
        mounts: Vec::new(),
        waker,
        rx,
        signals,
        shutting_down: false,
        handed_over: false,
        passed: Default::default(),
        systemd: notifier,
        keep_mounts_on_exit: config.keep_mounts_on_exit,
        metrics: snapshot,
        previous: Vec::new(),
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        start_notes: Vec::new(),
        #[cfg(feature = "kubernetes")]
        kubernetes,
    };
    let passed: Vec<String> = match predecessor {
        Some(_) => stored_fds.keys().cloned().collect(),
        None => Vec::new(),
    };
    daemon.passed = passed.iter().cloned().collect();
    daemon.restore_mounts(stored_fds);
    if let Some(predecessor) = predecessor {
        // The new generations are starting; switch now.
        predecessor.confirm(passed)?;
        daemon.passed.clear();
        if let Some(old) = predecessor_socket.filter(|old| *old != config.socket) {
            // The predecessor leaves its socket to its successor; at
            // another path it would only answer "refused" from now on.
            let _ = std::fs::remove_file(&old);
            tracing::info!(old = %old.display(), socket = %config.socket.display(), "took over from the fs-supervisor on another control socket; clients use this one now");
        }
    }
    let status = status_line(&daemon.statuses());
    daemon.systemd.ready(&status);
    let result = daemon.run_loop();
    daemon.systemd.stopping();
    if daemon.handed_over {
        // The socket and the parent cgroup are the successor's now.
        return result;
    }
    let _ = std::fs::remove_file(&config.socket);
    if let Some(parent) = &daemon.env.cgroups {
        // Best effort: another supervisor may still use it.
        let _ = std::fs::remove_dir(parent.dir());
    }
    result
}

/// Raises the soft limit of open fds towards the hard one, so that
/// MOUNTS_MAX mounts fit (the usual soft limit, 1024, does not).
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let wanted = MOUNTS_MAX as u64 * FDS_PER_MOUNT_MAX + 256;
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < wanted => {
            let raised = wanted.min(hard);
            if let Err(errno) = setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
                tracing::warn!(%errno, soft, hard, "cannot raise the open-file limit; fewer mounts fit");
            } else if raised < wanted {
                tracing::warn!(limit = raised, wanted, "the open-file hard limit is low; fewer than MOUNTS_MAX mounts fit (raise LimitNOFILE)");
            }
        }
        Ok(_) => {}
        Err(errno) => tracing::warn!(%errno, "cannot read the open-file limit"),
    }
}

/// One line for systemd's STATUS=: mounts by state and restarts. Pure.
fn status_line(statuses: &[upgrade_protocol::MountStatus]) -> String {
    let serving = statuses.iter().filter(|m| m.state == "serving").count();
    let gave_up = statuses.iter().filter(|m| m.gave_up).count();
    let restarts: u64 = statuses
        .iter()
        .map(|m| m.restarts.exit + m.restarts.signal + m.restarts.oom)
        .sum();
    format!(
        "{} mounts: {serving} serving, {} recovering or starting, {gave_up} gave up; {restarts} generation restarts",
        statuses.len(),
        statuses.len() - serving - gave_up
    )
}

/// Blocks SIGTERM/SIGINT (before any thread exists, so every thread
/// inherits the mask) and returns a signalfd that receives them.
fn shutdown_signals() -> Result<SignalFd, Error> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block()
        .map_err(Error::sys("blocking SIGTERM/SIGINT"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(Error::sys("signalfd"))
}

fn setup_cgroups(config: &Config) -> Result<Option<cgroup::Parent>, Error> {
    match cgroup::detect(&config.cgroup_root) {
        Some(layout) => {
            tracing::info!(?layout, "memory cgroups");
            cgroup::Parent::create(layout, &config.cgroup_parent).map(Some)
        }
        None if config.memory_max_bytes.is_some() => Err(Error::NoMemoryCgroup {
            root: config.cgroup_root.clone(),
        }),
        None => {
            tracing::warn!(root = %config.cgroup_root.display(), "no memory cgroup controller: generations share the supervisor's cgroup and OOM kills are reported as SIGKILL");
            Ok(None)
        }
    }
}

/// Runs in a socket thread: hands the request to the loop and waits.
fn forward_request(waker: &Waker, request: Request) -> Reply {
    let (reply, answer) = mpsc::channel();
    if !waker.send(Command::Control { request, reply }) {
        return shutting_down_reply();
    }
    answer.recv().unwrap_or_else(|_| shutting_down_reply())
}

fn shutting_down_reply() -> Reply {
    Reply::Error {
        kind: ErrorKind::Failed,
        message: "fs-supervisor is shutting down".into(),
    }
}

/// Starts a mount's background jobs; they report back through `waker`.
fn job_starter(waker: Waker) -> impl Fn(&Mount, Job) {
    move |mount: &Mount, job: Job| {
        let (waker, mount_id) = (waker.clone(), mount.id.clone());
        match job {
            Job::Unmount => mounting::unmount_in_background(
                mount.mountpoint.clone(),
                mount.connection_id,
                move |outcome| {
                    waker.send(Command::UnmountFinished { mount_id, outcome });
                },
            ),
            Job::Probe => mounting::probe_in_background(mount.mountpoint.clone(), move |outcome| {
                waker.send(Command::ProbeFinished { mount_id, outcome });
            }),
        }
    }
}

fn readable(fd: BorrowedFd<'_>) -> PollFd<'_> {
    PollFd::new(fd, PollFlags::POLLIN)
}

impl Daemon {
    fn run_loop(&mut self) -> Result<(), Error> {
        loop {
            if self.shutting_down && self.mounts.is_empty() {
                tracing::info!("every mount is unmounted; exiting");
                return Ok(());
            }
            if self.shutting_down && self.keep_mounts_on_exit {
                tracing::info!(
                    mounts = self.mounts.len(),
                    "exiting without unmounting (--keep-mounts-on-exit): generations keep serving until the next fs-supervisor adopts them"
                );
                return Ok(());
            }
            let ready = self.wait()?;
            for token in ready {
                self.on_ready(token);
            }
            self.fire_timers();
            // After every takeover this wake-up brought: see
            // `Mount::write_changed_record`.
            for mount in &mut self.mounts {
                mount.write_changed_record(&self.env);
            }
            self.publish();
        }
    }

    /// Polls every input until one is ready or the next timer is due.
    fn wait(&self) -> Result<Vec<Token>, Error> {
        let mut tokens = vec![Token::Signal, Token::Wake];
        let mut fds = vec![
            readable(self.signals.as_fd()),
            readable(self.waker.eventfd.as_fd()),
        ];
        for (index, mount) in self.mounts.iter().enumerate() {
            tokens.push(Token::Listener(index));
            fds.push(readable(mount.listener.as_fd()));
            for process in mount.processes() {
                tokens.push(Token::Pidfd(index, process.pid));
                fds.push(readable(process.pidfd()));
                if let Some(conn) = &process.conn {
                    tokens.push(Token::Conn(index, process.pid));
                    fds.push(readable(conn.as_fd()));
                }
            }
        }
        let now = Instant::now();
        let timeout_ms = self
            .mounts
            .iter()
            .filter_map(Mount::next_deadline)
            .chain(self.systemd.next_deadline())
            .min()
            .map(|at| at.saturating_duration_since(now).as_millis() as u64 + 1)
            .unwrap_or(IDLE_POLL_MS)
            .min(IDLE_POLL_MS);
        let timeout = PollTimeout::try_from(timeout_ms as i32).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => return Err(Error::sys("poll")(errno)),
        }
        let ready = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let mut out: Vec<Token> = fds
            .iter()
            .zip(tokens)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| r.intersects(ready)))
            .map(|(_, token)| token)
            .collect();
        // Deaths first: a takeover must not wait behind anything else.
        out.sort_by_key(|t| !matches!(t, Token::Pidfd(..)));
        Ok(out)
    }

    fn on_ready(&mut self, token: Token) {
        match token {
            Token::Signal => self.on_signal(),
            Token::Wake => {
                let _ = self.waker.eventfd.read();
                while let Ok(command) = self.rx.try_recv() {
                    self.on_command(command);
                }
            }
            Token::Listener(index) => self.on_connect(index),
            Token::Pidfd(index, pid) => self.on_pidfd(index, pid),
            Token::Conn(index, pid) => self.on_conn(index, pid),
        }
    }

    fn with_mount(&mut self, index: usize, event: Event) {
        let start_job = job_starter(self.waker.clone());
        if let Some(mount) = self.mounts.get_mut(index) {
            mount.handle(&self.env, event, &start_job);
        }
    }

    fn on_signal(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            tracing::info!(
                signal = info.ssi_signo,
                "shutting down: unmounting every mount"
            );
            self.shutting_down = true;
        }
        if self.shutting_down && !self.handed_over && self.hand_to_successor() {
            self.handed_over = true;
            return;
        }
        if self.shutting_down && !self.keep_mounts_on_exit {
            for index in 0..self.mounts.len() {
                self.with_mount(index, Event::UmountRequested);
            }
        }
    }

    fn on_pidfd(&mut self, index: usize, pid: u32) {
        let Some(mount) = self.mounts.get_mut(index) else {
            return;
        };
        let Some((_, process)) = mount.process_mut(pid) else {
            return;
        };
        let cause = match process.exit_cause() {
            Ok(Some(cause)) => cause,
            Ok(None) => return,
            Err(err) => {
                tracing::error!(mount = %mount.id, pid, %err, "cannot reap a generation");
                return;
            }
        };
        let Some((role, process)) = mount.take_process(pid) else {
            return;
        };
        let death = Death {
            generation: process.generation,
            pid,
            cause,
        };
        // Unmounted behind our back (umount by hand): the generation saw
        // ENODEV and exited by itself; no generation can serve it again.
        // Only checked for exits, so a kill's takeover never waits on it.
        let gone = role == Role::Active
            && process.adopted
            && matches!(cause, Cause::Exit(_))
            && fuse_wire::connection_id(&mount.mountpoint).ok() != Some(mount.connection_id);
        if gone {
            tracing::warn!(mount = %mount.id, mountpoint = %mount.mountpoint.display(), "the mount was removed outside fs-supervisor; cleaning up");
            self.with_mount(index, Event::UmountRequested);
        }
        self.with_mount(
            index,
            match role {
                Role::Active => Event::ActiveExited(death),
                Role::Standby => Event::StandbyExited(death),
                Role::Retiring => Event::RetiringExited(death),
            },
        );
        // After the takeover's `Adopt` went out (`Process::exit_cause`).
        process.reap();
    }

    fn on_connect(&mut self, index: usize) {
        let Some(mount) = self.mounts.get_mut(index) else {
            return;
        };
        let conn = match accept_seqpacket(mount.listener.as_fd()) {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(mount = %mount.id, %err, "accepting a generation failed");
                return;
            }
        };
        let pid = match getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(peer) => peer.pid() as u32,
            Err(errno) => {
                tracing::warn!(mount = %mount.id, %errno, "no peer credentials on a generation socket");
                return;
            }
        };
        let event = match mount.process_mut(pid) {
            Some((role, process)) if process.conn.is_none() && !process.connected => {
                process.conn = Some(conn);
                process.connected = true;
                // It connects once it is ready, and waits idle for the fd:
                // normal priority now keeps the walk over its threads out
                // of the takeover's stall (about 0.15 ms there).
                process.raise_priority();
                match role {
                    Role::Active => Event::ActiveConnected,
                    Role::Standby => Event::StandbyConnected,
                    // Retiring processes connected long ago.
                    Role::Retiring => return,
                }
            }
            _ => {
                tracing::warn!(mount = %mount.id, pid, socket = %mount.socket_path.display(), "refused a connection from a process that is not this mount's generation");
                return;
            }
        };
        self.with_mount(index, event);
    }

    fn on_conn(&mut self, index: usize, pid: u32) {
        let Some(mount) = self.mounts.get_mut(index) else {
            return;
        };
        let mount_id = mount.id.clone();
        let Some((role, process)) = mount.process_mut(pid) else {
            return;
        };
        let Some(conn) = &process.conn else {
            return;
        };
        match recv_message(conn.as_fd()) {
            Ok((
                Message::Serving {
                    generation,
                    reading_ns,
                    ..
                },
                _,
            )) if role == Role::Active => {
                tracing::debug!(mount = %mount_id, generation, pid, "serving reported");
                if let Some(upgrade) = mount.upgrade.as_mut() {
                    upgrade.reading_ns = reading_ns;
                }
                self.with_mount(index, Event::ActiveServing);
            }
            Ok((
                Message::HandedOver {
                    state,
                    journaled,
                    stopped_reading_ns,
                },
                _,
            )) if role == Role::Active => {
                tracing::info!(mount = %mount_id, pid, journaled, state = %state.display(), "handed over");
                if let Some(upgrade) = mount.upgrade.as_mut() {
                    upgrade.state_file = Some(state);
                    upgrade.journaled = journaled;
                    upgrade.stopped_reading_ns = stopped_reading_ns;
                }
                self.with_mount(index, Event::HandedOver);
            }
            Ok((Message::HandoverFailed { reason }, _)) if role == Role::Active => {
                tracing::warn!(mount = %mount_id, pid, reason, "the serving generation refused to hand over");
                if let Some(upgrade) = mount.upgrade.as_mut() {
                    upgrade.detail = Some(reason);
                }
                self.with_mount(index, Event::HandoverFailed);
            }
            Ok((
                Message::Stats {
                    generation,
                    requests_recovered,
                    counters,
                },
                _,
            )) if role == Role::Active => {
                let before = mount.tally.requests_recovered();
                mount.tally.report(
                    generation,
                    requests_recovered,
                    counters.map(|c| *c).unwrap_or_default(),
                );
                mount.counters_changed();
                if mount.tally.requests_recovered() != before {
                    tracing::info!(mount = %mount_id, generation, requests_recovered, "requests recovered by exactly-once records");
                }
            }
            Ok((other, _)) => {
                tracing::warn!(mount = %mount_id, pid, kind = other.kind(), ?role, "unexpected message from a generation");
            }
            Err(_) => {
                // A closed socket: a death is seen through the pidfd, never
                // here.
                process.conn = None;
            }
        }
    }

    fn statuses(&self) -> Vec<upgrade_protocol::MountStatus> {
        self.mounts.iter().map(Mount::status).collect()
    }

    /// After each turn: systemd's STATUS= line, the metrics snapshot, and
    /// the mount events since the last turn (logged; Kubernetes Events).
    fn publish(&mut self) {
        let statuses = self.statuses();
        self.systemd.status(&status_line(&statuses));
        let events = mount_events::diff(&self.previous, &statuses);
        for event in &events {
            tracing::info!(mount = %event.mount_id, generation = event.generation, reason = event.kind.reason(), "{}", event.message);
        }
        #[cfg(feature = "kubernetes")]
        if let Some(kubernetes) = &self.kubernetes {
            kubernetes.events(events);
            kubernetes.status(statuses.clone());
        }
        #[cfg(not(feature = "kubernetes"))]
        drop(events);
        self.metrics.publish(statuses.clone());
        self.previous = statuses;
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        self.systemd.tick(now);
        for index in 0..self.mounts.len() {
            self.mounts[index].lift_starved_startups(now);
            while let Some(timer) = self.mounts[index].take_due_timer(now) {
                self.with_mount(index, Event::Timer(timer));
            }
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Control { request, reply } => self.on_request(request, reply),
            Command::ProbeFinished { mount_id, outcome } => {
                if let Some(index) = self.mounts.iter().position(|m| m.id == mount_id) {
                    let event = match outcome {
                        Ok(()) => Event::ProbeOk,
                        Err(err) => {
                            tracing::warn!(mount = %mount_id, err, "probe through the mount failed");
                            if let Some(upgrade) = self.mounts[index].upgrade.as_mut() {
                                upgrade.detail = Some(format!("probe failed: {err}"));
                            }
                            Event::ProbeFailed
                        }
                    };
                    self.with_mount(index, event);
                }
            }
            Command::UnmountFinished { mount_id, outcome } => {
                if let Some(index) = self.mounts.iter().position(|m| m.id == mount_id) {
                    let mut mount = self.mounts.remove(index);
                    mount.close(&self.env, outcome);
                    self.systemd.remove_fd(&mount_id);
                }
            }
        }
    }

    fn on_request(&mut self, request: Request, reply: Sender<Reply>) {
        tracing::info!(command = request.name(), "fsctl request");
        match request {
            Request::Status => {
                let report = StatusReport {
                    supervisor: Some(upgrade_protocol::SupervisorInfo {
                        pid: std::process::id(),
                        binary: std::env::current_exe().unwrap_or_default(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                        started_unix_ms: self.started_unix_ms,
                        fd_store: self.systemd.active(),
                        start_notes: self.start_notes.clone(),
                    }),
                    mounts: self.mounts.iter().map(Mount::status).collect(),
                };
                let _ = reply.send(Reply::Status { report });
            }
            Request::Umount { mountpoint } => {
                let canonical = std::fs::canonicalize(&mountpoint).unwrap_or(mountpoint.clone());
                let Some(index) = self
                    .mounts
                    .iter()
                    .position(|m| m.mountpoint == canonical || m.mountpoint == mountpoint)
                else {
                    let _ = reply.send(invalid(format!(
                        "no mount of this fs-supervisor at {}; `fsctl status` lists them",
                        mountpoint.display()
                    )));
                    return;
                };
                self.mounts[index].umount_waiters.push(reply);
                self.with_mount(index, Event::UmountRequested);
            }
            Request::Upgrade {
                mountpoint,
                binary,
                timeout_ms,
            } => self.upgrade(&mountpoint, binary, timeout_ms, reply),
            Request::UpgradeSupervisor { binary } => self.upgrade_supervisor(&binary, reply),
            Request::Mount {
                volume,
                mountpoint,
                base_dir,
                options,
                persist,
            } => {
                if self.shutting_down {
                    let _ = reply.send(shutting_down_reply());
                    return;
                }
                let how = MountHow {
                    persist,
                    restored: None,
                };
                match self.mount(volume, &mountpoint, base_dir, options, reply.clone(), how) {
                    Ok(()) => {}
                    Err(refusal) => {
                        let _ = reply.send(refusal);
                    }
                }
            }
        }
    }

    /// `fsctl upgrade-supervisor` (see `reexec.rs`): returns only if it was
    /// refused; otherwise this image is replaced.
    fn upgrade_supervisor(&mut self, binary: &Path, reply: Sender<Reply>) {
        if self.shutting_down {
            let _ = reply.send(shutting_down_reply());
            return;
        }
        if let Some(busy) = self.mounts.iter().find(|m| m.upgrade.is_some()) {
            let _ = reply.send(Reply::Error {
                kind: ErrorKind::Failed,
                message: format!(
                    "mount {} is being upgraded; retry fsctl upgrade-supervisor when it is done",
                    busy.mountpoint.display()
                ),
            });
            return;
        }
        let version = match reexec::preflight(binary) {
            Ok(version) => version,
            Err(problem) => {
                let _ = reply.send(invalid(problem));
                return;
            }
        };
        for mount in &mut self.mounts {
            mount.write_record(&self.env);
        }
        let fds: Vec<(String, BorrowedFd<'_>)> = self
            .mounts
            .iter()
            .filter_map(|m| m.channel.as_ref().map(|c| (m.id.clone(), c.fd())))
            .collect();
        let _ = reply.send(Reply::SupervisorRestarting {
            pid: std::process::id(),
            binary: binary.to_path_buf(),
            mounts: fds.len() as u32,
        });
        // Let the control thread write that answer before the image goes.
        std::thread::sleep(Duration::from_millis(100));
        tracing::info!(binary = %binary.display(), version, mounts = fds.len(), "re-executing as a new fs-supervisor");
        let err = reexec::exec(
            binary,
            &self.env.client_binary,
            &fds,
            self.systemd.inherited_env(),
        );
        tracing::error!(binary = %binary.display(), %err, "re-executing failed after the fds were moved; exiting so a restart restores the mounts from the generations");
        std::process::exit(1);
    }

    fn upgrade(
        &mut self,
        mountpoint: &Path,
        binary: PathBuf,
        timeout_ms: u64,
        reply: Sender<Reply>,
    ) {
        if self.shutting_down {
            let _ = reply.send(shutting_down_reply());
            return;
        }
        let canonical = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
        let Some(index) = self
            .mounts
            .iter()
            .position(|m| m.mountpoint == canonical || m.mountpoint == mountpoint)
        else {
            let _ = reply.send(invalid(format!(
                "no mount of this fs-supervisor at {}; `fsctl status` lists them",
                mountpoint.display()
            )));
            return;
        };
        if let Err(problem) = preflight::check_client_binary(&binary) {
            let _ = reply.send(invalid(problem));
            return;
        }
        let start_job = job_starter(self.waker.clone());
        self.mounts[index].request_upgrade(&self.env, binary, timeout_ms, reply, &start_job);
    }

    fn mount(
        &mut self,
        volume: String,
        mountpoint: &Path,
        base_dir: PathBuf,
        options: upgrade_protocol::ClientOptions,
        reply: Sender<Reply>,
        how: MountHow<'_>,
    ) -> Result<(), Reply> {
        let (mountpoint, spec) = self.validate(&volume, mountpoint, &base_dir)?;
        let id = mounting::mount_id(&mountpoint);
        let failed = |message: String| Reply::Error {
            kind: ErrorKind::Failed,
            message,
        };
        let socket_path = self.env.state.socket_path(&id);
        let _ = std::fs::remove_file(&socket_path);
        let listener = listen_seqpacket(&socket_path, 0o600).map_err(|err| {
            failed(format!(
                "cannot create the generation socket {}: {err}",
                socket_path.display()
            ))
        })?;
        let log = self
            .env
            .state
            .open_log(&id)
            .map_err(|err| failed(err.to_string()))?;
        let (channel, init, connection_id) =
            mounting::mount_and_init(&mountpoint, &spec).map_err(|err| {
                let _ = std::fs::remove_file(&socket_path);
                failed(format!(
                    "mounting volume {spec} at {}: {err}",
                    mountpoint.display()
                ))
            })?;
        tracing::info!(
            mount = %id,
            mountpoint = %mountpoint.display(),
            volume,
            connection_id,
            minor = init.minor,
            flags = format_args!("{:#x}", init.flags),
            max_write = init.max_write,
            max_pages = init.max_pages,
            fd = channel.fd().as_raw_fd(),
            "mounted and initialized"
        );
        let parts = NewMount {
            connection_identity: upgrade_protocol::connection_identity(),
            client_binary: self.env.client_binary.clone(),
            log_path: self.env.state.log_path(&id),
            id,
            mountpoint,
            volume,
            base_dir,
            options,
            channel,
            init,
            connection_id,
            listener,
            socket_path,
            log,
        };
        let mut mount = Mount::new(parts, reply);
        mount.persistent = how.persist;
        mount.write_record(&self.env);
        if let Some(channel) = &mount.channel {
            self.systemd.store_fd(&mount.id, channel.fd());
        }
        self.mounts.push(mount);
        let index = self.mounts.len() - 1;
        let start_job = job_starter(self.waker.clone());
        match how.restored {
            // A persistent mount made again at start: a failing generation
            // backs off and retries instead of removing mount and record.
            Some(record) => self.mounts[index].resume(&self.env, record, &start_job),
            None => self.mounts[index].start(&self.env, &start_job),
        }
        Ok(())
    }

    /// Checks a mount request; returns the canonical mountpoint.
    /// Checks a mount request: returns the canonical mountpoint and the
    /// parsed volume.
    fn validate(
        &self,
        volume: &str,
        mountpoint: &Path,
        base_dir: &Path,
    ) -> Result<(PathBuf, VolumeSpec), Reply> {
        if self.mounts.len() >= MOUNTS_MAX {
            return Err(invalid(format!(
                "this fs-supervisor holds {MOUNTS_MAX} mounts already; unmount one first"
            )));
        }
        let canonical = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
        if let Some(m) = self.mounts.iter().find(|m| m.mountpoint == canonical) {
            return Err(invalid(format!(
                "{} is already mounted by this fs-supervisor (volume {}, generation {}); `fsctl umount {}` first",
                canonical.display(),
                m.volume,
                m.status().generation,
                canonical.display()
            )));
        }
        let spec = VolumeSpec::parse(volume).map_err(|err| invalid(err.to_string()))?;
        let identity = mounting::check_volume(&spec, base_dir)?;
        let held = |m: &&Mount| {
            let other = VolumeSpec::parse(&m.volume).ok();
            other.is_some_and(|other| other.local_dir(&m.base_dir) == identity)
        };
        if let Some(m) = self.mounts.iter().find(held) {
            return Err(invalid(format!(
                "volume {spec} is already mounted at {}; a volume is served by one mount at a time",
                m.mountpoint.display()
            )));
        }
        Ok((mounting::check_mountpoint(mountpoint)?, spec))
    }
}

/// Bytes of a unix socket path, without the NUL (`sun_path` is 108).
const SOCKET_PATH_BYTES_MAX: usize = 107;

/// Refuses a control socket or state directory whose socket paths would
/// not fit in `sun_path`: otherwise the supervisor starts, and every mount
/// fails later with ENAMETOOLONG.
fn check_socket_paths(config: &Config) -> Result<(), Error> {
    // A mount's socket: STATE/run/<16 hex digits>.sock.
    let longest_mount_socket = StateDir::socket_path_in(&config.state_dir, &"f".repeat(16));
    for (what, path, flag) in [
        ("the control socket", config.socket.clone(), "--socket"),
        (
            "a mount's generation socket, in the state directory:",
            longest_mount_socket,
            "--state-dir",
        ),
    ] {
        let len = path.as_os_str().len();
        if len > SOCKET_PATH_BYTES_MAX {
            return Err(Error::SocketPathTooLong {
                what,
                path,
                len,
                max: SOCKET_PATH_BYTES_MAX,
                flag,
            });
        }
    }
    Ok(())
}

/// The default `fsclient`: next to this executable.
pub fn default_client_binary() -> PathBuf {
    std::env::current_exe()
        .map(|exe| exe.with_file_name("fsclient"))
        .unwrap_or_else(|_| PathBuf::from("fsclient"))
}
