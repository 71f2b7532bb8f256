//! The executor of one mount: the only code that acts on the lifecycle
//! machine's actions (spawn, adopt, signal, timers, unmount). It owns the
//! mount's /dev/fuse fd, its processes (active and standby slots), timers
//! and counters. Results of actions that fail come back as events (a spawn
//! that fails is a death), so the machine's state is the only state.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime};

use fuse_wire::Channel;
use nix::sys::signal::Signal;
use upgrade_protocol::{
    log_tail, send_message, ClientOptions, ErrorKind, Message, MountHistory, MountRecord,
    MountStatus, NegotiatedInit, Recovery, Reply, Restarts, Unanswered, UpgradeReport,
    RECORD_FORMAT_VERSION,
};

use crate::cgroup;
use crate::generation::{describe, Launch, Process};
use crate::lifecycle::mount::{self, Action, Cause, Death, Event, Policy, Role, State, Timer};
use crate::lifecycle::upgrade::Outcome;
use crate::mount_tally::{last_log_line, MountTally};
use crate::scheduling::Startup;
use crate::state_file::StateDir;

/// Events one dispatch may chain (an event and the events its actions
/// cause) at most.
pub const EVENTS_PER_DISPATCH_MAX: usize = 16;

/// What every mount's executor shares.
pub struct Env {
    /// Machine policy.
    pub policy: Policy,
    /// The state directory.
    pub state: StateDir,
    /// The Baton parent cgroup, if memory cgroups are in use.
    pub cgroups: Option<cgroup::Parent>,
    /// `--memory-max`.
    pub memory_max_bytes: Option<u64>,
    /// The fsclient binary.
    pub client_binary: PathBuf,
}

/// Work the executor starts outside the event loop; each reports back to
/// the loop as a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// Unmount (`mounting::unmount_in_background`).
    Unmount,
    /// Probe the mount with a lookup that must reach the server.
    Probe,
}

/// How the executor starts a [`Job`].
pub type StartJob<'a> = &'a dyn Fn(&Mount, Job);

/// A planned upgrade under way.
pub struct UpgradeInProgress {
    /// The new fsclient binary.
    pub binary: PathBuf,
    /// `fsctl upgrade` waiting for the outcome.
    pub waiter: Sender<Reply>,
    started: Instant,
    from_generation: u64,
    /// The old generation's handover state file.
    pub state_file: Option<PathBuf>,
    /// Requests it journaled.
    pub journaled: u32,
    /// When it stopped reading (CLOCK_MONOTONIC ns).
    pub stopped_reading_ns: u64,
    /// When the new one started reading.
    pub reading_ns: u64,
    /// Why it was refused or failed, if known.
    pub detail: Option<String>,
    /// The upgrade's deadline (`fsctl upgrade --timeout`).
    timeout_ms: u64,
    /// The deadline passed and the new generation was killed for it: its
    /// death is the deadline's doing, not its own failure.
    deadline_passed: bool,
}

/// One supervised mount.
pub struct Mount {
    /// The supervisor's id (hash of the mountpoint).
    pub id: String,
    /// The mountpoint (canonical).
    pub mountpoint: PathBuf,
    /// The volume as given.
    pub volume: String,
    /// Where named volumes live.
    pub base_dir: PathBuf,
    /// Forwarded options.
    pub options: ClientOptions,
    /// The /dev/fuse open file, held for the mount's whole life.
    pub channel: Option<Channel>,
    /// The INIT result.
    pub init: NegotiatedInit,
    /// The fusectl connection number.
    pub connection_id: u32,
    /// The connection's random identity (exactly-once keys).
    pub connection_identity: u64,
    /// Counters over the mount's life (generation reports, upgrades,
    /// incidents).
    pub tally: MountTally,
    /// Generations of this mount connect here.
    pub listener: OwnedFd,
    /// Its path.
    pub socket_path: PathBuf,
    /// The generations' log.
    pub log: File,
    /// Its path.
    pub log_path: PathBuf,
    /// The machine's state.
    pub state: State,
    state_since: Instant,
    /// The process holding (or about to hold) the fd.
    pub active: Option<Process>,
    /// The warm standby, or an upgrade's incoming generation.
    pub standby: Option<Process>,
    /// The generation that handed over and waits for `Exit` or `Resume`.
    pub retiring: Option<Process>,
    /// The fsclient binary new generations run (changed by upgrades).
    pub client_binary: PathBuf,
    /// The upgrade under way, if any.
    pub upgrade: Option<UpgradeInProgress>,
    last_upgrade: Option<UpgradeReport>,
    next_generation: u64,
    last_generation: u64,
    /// Armed timers.
    pub timers: BTreeMap<Timer, Instant>,
    restarts: Restarts,
    last_recovery: Option<Recovery>,
    recovery_started: Option<Instant>,
    promoted_warm: bool,
    created_unix_ms: u64,
    /// `fsctl mount` callers waiting for the first serve.
    pub mount_waiters: Vec<Sender<Reply>>,
    /// `fsctl umount` callers waiting for the unmount.
    pub umount_waiters: Vec<Sender<Reply>>,
    /// Why generation 1 failed, for `fsctl mount`.
    mount_failure: Option<String>,
    /// `fsctl mount --persist` (kept in the state record).
    pub persistent: bool,
    /// The state record changed and is not written yet
    /// ([`Mount::write_changed_record`]).
    record_changed: bool,
    /// When the record was last written ([`Mount::counters_changed`]).
    history_written: Instant,
    /// The unmount's warning ([`Mount::note_unclean_stop`]).
    stop_warning: Option<String>,
}

/// How far behind the live counters the state record's totals may fall.
pub const HISTORY_WRITE_INTERVAL: Duration = Duration::from_secs(5);

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What a new mount is made of.
pub struct NewMount {
    /// Id.
    pub id: String,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// Volume.
    pub volume: String,
    /// Base dir.
    pub base_dir: PathBuf,
    /// Options.
    pub options: ClientOptions,
    /// The initialized fd.
    pub channel: Channel,
    /// INIT result.
    pub init: NegotiatedInit,
    /// fusectl number.
    pub connection_id: u32,
    /// Random identity of the connection.
    pub connection_identity: u64,
    /// The fsclient binary.
    pub client_binary: PathBuf,
    /// Generation socket.
    pub listener: OwnedFd,
    /// Its path.
    pub socket_path: PathBuf,
    /// Log.
    pub log: File,
    /// Its path.
    pub log_path: PathBuf,
}

impl Mount {
    /// A mounted, initialized connection with no generation yet.
    pub fn new(parts: NewMount, waiter: Sender<Reply>) -> Mount {
        Mount {
            id: parts.id,
            mountpoint: parts.mountpoint,
            volume: parts.volume,
            base_dir: parts.base_dir,
            options: parts.options,
            channel: Some(parts.channel),
            init: parts.init,
            connection_id: parts.connection_id,
            connection_identity: parts.connection_identity,
            tally: MountTally::default(),
            listener: parts.listener,
            socket_path: parts.socket_path,
            log: parts.log,
            log_path: parts.log_path,
            state: State::Unmounted,
            state_since: Instant::now(),
            active: None,
            standby: None,
            retiring: None,
            client_binary: parts.client_binary,
            upgrade: None,
            last_upgrade: None,
            next_generation: 1,
            last_generation: 0,
            timers: BTreeMap::new(),
            restarts: Restarts::default(),
            last_recovery: None,
            recovery_started: None,
            promoted_warm: false,
            record_changed: false,
            history_written: Instant::now(),
            stop_warning: None,
            created_unix_ms: unix_ms(SystemTime::now()),
            mount_waiters: vec![waiter],
            umount_waiters: Vec::new(),
            mount_failure: None,
            persistent: false,
        }
    }

    /// Starts the machine on a mount adopted from a previous supervisor
    /// (restored at start): generations continue after `last_generation`,
    /// and the first one sends RESEND, since requests of the previous
    /// generation (killed and reaped before this) may be unanswered.
    pub fn resume(&mut self, env: &Env, record: &MountRecord, start_job: StartJob<'_>) {
        let last_generation = record.generation;
        self.created_unix_ms = record.created_unix_ms;
        self.persistent = record.persistent;
        if let Some(history) = &record.history {
            self.tally = MountTally::from_history(history);
            self.restarts = history.restarts;
            self.last_recovery = history.last_recovery.clone();
            self.last_upgrade = history.last_upgrade.clone();
        }
        self.last_generation = last_generation;
        self.next_generation = last_generation + 1;
        let (state, actions) = mount::resume();
        self.transition(state, "start");
        let mut queue = VecDeque::new();
        for action in actions {
            self.execute(env, action, &mut queue, start_job);
        }
        self.drain(env, queue, start_job);
    }

    /// Starts the machine.
    pub fn start(&mut self, env: &Env, start_job: StartJob<'_>) {
        let (state, actions) = mount::start();
        self.transition(state, "start");
        let mut queue = VecDeque::new();
        for action in actions {
            self.execute(env, action, &mut queue, start_job);
        }
        self.drain(env, queue, start_job);
    }

    /// Feeds one event to the machine and executes what it returns.
    pub fn handle(&mut self, env: &Env, event: Event, start_job: StartJob<'_>) {
        self.drain(env, VecDeque::from([event]), start_job);
    }

    fn drain(&mut self, env: &Env, mut queue: VecDeque<Event>, start_job: StartJob<'_>) {
        let mut handled = 0;
        while let Some(event) = queue.pop_front() {
            handled += 1;
            // Invariant: actions cause at most a death each; a longer chain
            // is a loop in the machine.
            assert!(
                handled <= EVENTS_PER_DISPATCH_MAX,
                "mount {}: event chain longer than {EVENTS_PER_DISPATCH_MAX} at {event:?}",
                self.id
            );
            if let (State::Stopping { .. }, Event::ActiveExited(death)) = (self.state, event) {
                self.note_unclean_stop(death);
            }
            if event == Event::Timer(Timer::UpgradeDeadline) {
                if let Some(upgrade) = &mut self.upgrade {
                    upgrade.deadline_passed = true;
                }
            }
            let (next, actions) = mount::step(self.state, event, &env.policy);
            if next == self.state && actions.is_empty() {
                tracing::debug!(mount = %self.id, state = self.state.name(), ?event, "event ignored");
                continue;
            }
            self.transition(next, &format!("{event:?}"));
            for action in actions {
                self.execute(env, action, &mut queue, start_job);
            }
        }
    }

    fn transition(&mut self, next: State, cause: &str) {
        let now = Instant::now();
        if next.name() != self.state.name() {
            let state_from = if cause == "start" {
                "new"
            } else {
                self.state.name()
            };
            tracing::info!(
                mount = %self.id,
                generation = self.active_generation(),
                pid = self.active.as_ref().map(|p| p.pid),
                state_from,
                state_to = next.name(),
                elapsed_us = now.duration_since(self.state_since).as_micros() as u64,
                cause,
                "mount state"
            );
            self.state_since = now;
        }
        self.state = next;
    }

    /// The highest generation number started for this mount so far.
    pub fn highest_generation(&self) -> u64 {
        self.next_generation
            .saturating_sub(1)
            .max(self.last_generation)
    }

    fn active_generation(&self) -> u64 {
        self.active
            .as_ref()
            .map(|p| p.generation)
            .unwrap_or(self.last_generation)
    }

    fn slot(&mut self, role: Role) -> &mut Option<Process> {
        match role {
            Role::Active => &mut self.active,
            Role::Standby => &mut self.standby,
            Role::Retiring => &mut self.retiring,
        }
    }

    fn execute(
        &mut self,
        env: &Env,
        action: Action,
        queue: &mut VecDeque<Event>,
        start_job: StartJob<'_>,
    ) {
        match action {
            Action::SpawnActive => self.spawn(env, Role::Active, queue),
            Action::SpawnStandby => self.spawn(env, Role::Standby, queue),
            Action::PromoteStandby => {
                // Invariant: the active slot was emptied by the reap.
                assert!(
                    self.active.is_none(),
                    "mount {}: promote over a live active",
                    self.id
                );
                self.active = self.standby.take();
                self.promoted_warm = self.active.as_ref().is_some_and(|p| p.connected);
                // Still starting: the mount waits for it now.
                if let Some(process) = self.active.as_mut() {
                    process.raise_priority();
                }
            }
            Action::SendAdopt { unanswered } => self.send_adopt(unanswered),
            Action::TerminateActive => self.signal(Role::Active, Signal::SIGTERM),
            Action::KillActive => self.signal(Role::Active, Signal::SIGKILL),
            Action::KillStandby => self.signal(Role::Standby, Signal::SIGKILL),
            Action::ArmTimer { timer, after_ms } => {
                self.timers
                    .insert(timer, Instant::now() + Duration::from_millis(after_ms));
            }
            Action::CancelTimer(timer) => {
                self.timers.remove(&timer);
            }
            Action::RecordDeath { role, death } => {
                if role == Role::Active {
                    self.tally.serving_ended();
                }
                self.record_death(role, death)
            }
            Action::AnnounceServing => self.announce_serving(),
            Action::FailMount(death) => self.fail_mount(death),
            Action::ReportGaveUp => tracing::error!(
                mount = %self.id,
                failures = self.state.failures(),
                mountpoint = %self.mountpoint.display(),
                "gave up restarting after --give-up-after consecutive failed starts; applications on the mount wait until `fsctl umount`"
            ),
            Action::Unmount => start_job(self, Job::Unmount),
            Action::SpawnIncoming => self.spawn(env, Role::Standby, queue),
            Action::SendHandover => {
                let dir = env.state.run_dir();
                if !self.send_to(Role::Active, &Message::Handover { dir }) {
                    queue.push_back(Event::HandoverFailed);
                }
            }
            Action::RetireActive => self.retiring = self.active.take(),
            Action::SendAdoptHandover => {
                let state = self.upgrade.as_ref().and_then(|u| u.state_file.clone());
                self.send_adopt_with(Unanswered::Leave, state);
            }
            Action::StartProbe => start_job(self, Job::Probe),
            Action::ExitRetiring => {
                self.send_to(Role::Retiring, &Message::Exit);
            }
            Action::ReinstateRetiring => {
                // Invariant: the incoming generation in the active slot was
                // reaped before its death reached the machine.
                assert!(
                    self.active.is_none(),
                    "mount {}: reinstating over a live active",
                    self.id
                );
                self.active = self.retiring.take();
            }
            Action::SendResume { unanswered } => {
                if !self.send_to(Role::Active, &Message::Resume { unanswered }) {
                    // It cannot hear us: kill it, the crash path recovers.
                    self.signal(Role::Active, Signal::SIGKILL);
                }
            }
            Action::KillRetiring => self.signal(Role::Retiring, Signal::SIGKILL),
            Action::Finish(outcome) => self.finish_upgrade(outcome),
        }
    }

    fn spawn(&mut self, env: &Env, role: Role, queue: &mut VecDeque<Event>) {
        let generation = self.next_generation;
        self.next_generation += 1;
        // An upgrade's incoming generation runs the new binary.
        let binary = match (&self.upgrade, role, self.state) {
            (Some(upgrade), Role::Standby, State::Upgrading { .. }) => upgrade.binary.clone(),
            _ => self.client_binary.clone(),
        };
        let held_locks = env.state.held_locks_path(&self.id);
        let launch = Launch {
            client_binary: &binary,
            socket: &self.socket_path,
            held_locks: &held_locks,
            mount_id: &self.id,
            volume: &self.volume,
            base_dir: &self.base_dir,
            options: &self.options,
            log: &self.log,
            generation,
            // The active slot is started cold: the mount waits for it.
            startup: Startup::choose(role == Role::Active),
        };
        let cgroup = match &env.cgroups {
            Some(parent) => parent
                .child(
                    &format!("{}-gen{generation}", self.id),
                    env.memory_max_bytes,
                )
                .map(Some),
            None => Ok(None),
        };
        match cgroup.and_then(|cgroup| Process::spawn(&launch, cgroup)) {
            Ok(process) => {
                tracing::info!(mount = %self.id, generation, pid = process.pid, ?role, "generation started");
                self.tally.generation_started();
                *self.slot(role) = Some(process);
            }
            Err(err) => {
                tracing::error!(mount = %self.id, generation, ?role, %err, "cannot start a generation");
                // The generation's log is what fsctl shows of a failed
                // mount or upgrade: the cause belongs there, not only in
                // the supervisor's own log.
                let _ = writeln!(
                    &self.log,
                    "fs-supervisor: cannot start generation {generation} from {}: {err}",
                    binary.display()
                );
                let death = Death {
                    generation,
                    pid: 0,
                    cause: Cause::SpawnFailed,
                };
                queue.push_back(match role {
                    Role::Active => Event::ActiveExited(death),
                    Role::Standby => Event::StandbyExited(death),
                    Role::Retiring => Event::RetiringExited(death),
                });
            }
        }
    }

    fn send_adopt(&mut self, unanswered: Unanswered) {
        self.send_adopt_with(unanswered, None);
    }

    fn send_adopt_with(&mut self, unanswered: Unanswered, handover: Option<PathBuf>) {
        let (Some(process), Some(channel)) = (self.active.as_mut(), self.channel.as_ref()) else {
            tracing::error!(mount = %self.id, "adopt without an active process or fd");
            return;
        };
        // Invariant: RESEND re-queues every unanswered request of the whole
        // connection; only a process that never held the fd may adopt, and
        // the standby slot never holds it.
        assert!(
            !process.adopted && !self.standby.as_ref().is_some_and(|s| s.adopted),
            "mount {}: a second adopter while a generation holds the fd",
            self.id
        );
        process.raise_priority();
        let message = Message::Adopt {
            generation: process.generation,
            connection_identity: self.connection_identity,
            init: self.init,
            unanswered,
            handover,
        };
        let sent = match &process.conn {
            Some(conn) => send_message(conn.as_fd(), &message, &[channel.fd()]),
            None => Err(upgrade_protocol::ProtocolError::Closed),
        };
        match sent {
            Ok(()) => {
                process.adopted = true;
                tracing::info!(mount = %self.id, generation = process.generation, pid = process.pid, ?unanswered, "fd handed over");
                self.last_generation = process.generation;
                self.record_changed = true;
            }
            Err(err) => {
                tracing::error!(mount = %self.id, generation = process.generation, pid = process.pid, %err, "cannot hand the fd over; killing the generation");
                process.signal(Signal::SIGKILL);
            }
        }
    }

    fn signal(&self, role: Role, signal: Signal) {
        let process = match role {
            Role::Active => &self.active,
            Role::Standby => &self.standby,
            Role::Retiring => &self.retiring,
        };
        if let Some(process) = process {
            process.signal(signal);
        }
    }

    /// Sends a message on the control socket of the process in `role`;
    /// false (logged) if there is none or it failed.
    fn send_to(&self, role: Role, message: &Message) -> bool {
        let process = match role {
            Role::Active => &self.active,
            Role::Standby => &self.standby,
            Role::Retiring => &self.retiring,
        };
        let sent = match process.as_ref().and_then(|p| p.conn.as_ref()) {
            Some(conn) => send_message(conn.as_fd(), message, &[]),
            None => Err(upgrade_protocol::ProtocolError::Closed),
        };
        match sent {
            Ok(()) => true,
            Err(err) => {
                tracing::error!(mount = %self.id, ?role, kind = message.kind(), %err, "cannot message the generation");
                false
            }
        }
    }

    /// Answers `fsctl upgrade` and records the outcome.
    fn finish_upgrade(&mut self, outcome: Outcome) {
        let Some(upgrade) = self.upgrade.take() else {
            return;
        };
        let ok = outcome == Outcome::Upgraded;
        if ok {
            self.client_binary = upgrade.binary.clone();
        }
        if let Some(state) = &upgrade.state_file {
            remove_handover_files(state);
        }
        let stall_us = (ok && upgrade.reading_ns > upgrade.stopped_reading_ns)
            .then(|| (upgrade.reading_ns - upgrade.stopped_reading_ns) / 1000);
        let detail = upgrade.detail.clone().or_else(|| {
            (!ok && outcome != Outcome::Unmounted).then(|| {
                format!(
                    "generation log ({}):\n{}",
                    self.log_path.display(),
                    log_tail(&self.log_path)
                )
            })
        });
        let outcome_text = match outcome {
            Outcome::IncomingDied | Outcome::ProbeFailed if upgrade.deadline_passed => format!(
                "rolled back: the new generation did not serve within the upgrade's deadline ({} ms; `fsctl upgrade --timeout`) and was stopped",
                upgrade.timeout_ms
            ),
            _ => describe_outcome(outcome).to_string(),
        };
        let report = UpgradeReport {
            mountpoint: self.mountpoint.clone(),
            ok,
            outcome: outcome_text,
            from_generation: upgrade.from_generation,
            generation: self.active_generation(),
            serving_died: outcome == Outcome::ServingDied,
            binary: self.client_binary.clone(),
            journaled: upgrade.journaled,
            stall_us,
            elapsed_ms: upgrade.started.elapsed().as_millis() as u64,
            at_unix_ms: unix_ms(SystemTime::now()),
            detail,
        };
        if ok {
            tracing::info!(mount = %self.id, generation = report.generation, from = report.from_generation, stall_us, journaled = report.journaled, binary = %report.binary.display(), "upgraded");
        } else {
            tracing::warn!(mount = %self.id, outcome = report.outcome, generation = report.generation, "upgrade rolled back");
        }
        let _ = upgrade.waiter.send(Reply::Upgraded {
            report: Box::new(report.clone()),
        });
        let rolled_back = report.outcome.starts_with("rolled back");
        self.tally.upgrade_ended(ok, rolled_back, report.journaled);
        if rolled_back {
            self.tally.incident(
                report.at_unix_ms,
                report.generation,
                "rollback",
                &format!("upgrade to {} {}", report.binary.display(), report.outcome),
            );
        }
        self.last_upgrade = Some(report);
        self.record_changed = true;
    }

    /// Starts an upgrade to `binary` if the mount serves; otherwise answers
    /// the waiter at once.
    pub fn request_upgrade(
        &mut self,
        env: &Env,
        binary: PathBuf,
        timeout_ms: u64,
        waiter: Sender<Reply>,
        start_job: StartJob<'_>,
    ) {
        if !matches!(self.state, State::Serving { .. }) || self.upgrade.is_some() {
            let _ = waiter.send(Reply::Error {
                kind: ErrorKind::Failed,
                message: format!(
                    "mount {} is {} and cannot be upgraded now; retry once `fsctl status` shows it serving",
                    self.mountpoint.display(),
                    self.state.name()
                ),
            });
            return;
        }
        self.upgrade = Some(UpgradeInProgress {
            binary,
            waiter,
            started: Instant::now(),
            from_generation: self.active_generation(),
            state_file: None,
            journaled: 0,
            stopped_reading_ns: 0,
            reading_ns: 0,
            detail: None,
            timeout_ms,
            deadline_passed: false,
        });
        self.handle(env, Event::UpgradeRequested { timeout_ms }, start_job);
    }

    fn record_death(&mut self, role: Role, death: Death) {
        let cause = describe(death.cause);
        let tail = log_tail(&self.log_path);
        if let Some(upgrade) = self.upgrade.as_mut() {
            if upgrade.detail.is_none() && role != Role::Retiring {
                upgrade.detail = Some(format!(
                    "generation {} (pid {}) ended: {cause}; log tail ({}):\n{tail}",
                    death.generation,
                    death.pid,
                    self.log_path.display()
                ));
            }
        }
        if role != Role::Retiring {
            let kind = match death.cause {
                Cause::Exit(_) | Cause::SpawnFailed => "exit",
                Cause::Signal(_) => "signal",
                Cause::Oom => "oom",
            };
            // What an exiting generation said last is why it exited; a
            // killed one's last line is just what it was doing.
            let said = match death.cause {
                Cause::Exit(_) | Cause::SpawnFailed => last_log_line(&tail),
                Cause::Signal(_) | Cause::Oom => "",
            };
            let detail = if said.is_empty() {
                cause.clone()
            } else {
                format!("{cause}; it logged: {said}")
            };
            self.tally
                .incident(unix_ms(SystemTime::now()), death.generation, kind, &detail);
        }
        match role {
            Role::Active => {
                match death.cause {
                    Cause::Exit(_) | Cause::SpawnFailed => self.restarts.exit += 1,
                    Cause::Signal(_) => self.restarts.signal += 1,
                    Cause::Oom => self.restarts.oom += 1,
                }
                self.last_recovery = Some(Recovery {
                    died_generation: death.generation,
                    cause: cause.clone(),
                    at_unix_ms: unix_ms(SystemTime::now()),
                    next_generation: None,
                    takeover_us: None,
                    warm: false,
                });
                self.recovery_started = Some(Instant::now());
                tracing::error!(
                    mount = %self.id,
                    generation = death.generation,
                    pid = death.pid,
                    cause,
                    "generation died\n--- log tail ---\n{tail}\n---"
                );
            }
            Role::Standby => tracing::warn!(
                mount = %self.id,
                generation = death.generation,
                pid = death.pid,
                cause,
                "standby died before taking over\n--- log tail ---\n{tail}\n---"
            ),
            Role::Retiring => tracing::info!(
                mount = %self.id,
                generation = death.generation,
                pid = death.pid,
                cause,
                "retired generation ended"
            ),
        }
    }

    fn announce_serving(&mut self) {
        let now = Instant::now();
        let Some(process) = self.active.as_mut() else {
            return;
        };
        process.serving_since = Some(now);
        let (generation, pid) = (process.generation, process.pid);
        let takeover_us = self
            .recovery_started
            .take()
            .map(|start| now.duration_since(start).as_micros() as u64);
        if let (Some(recovery), Some(us)) = (self.last_recovery.as_mut(), takeover_us) {
            recovery.next_generation = Some(generation);
            recovery.takeover_us = Some(us);
            recovery.warm = self.promoted_warm;
        }
        tracing::info!(mount = %self.id, generation, pid, elapsed_us = takeover_us, warm = self.promoted_warm, "generation serving");
        self.promoted_warm = false;
        for waiter in self.mount_waiters.drain(..) {
            let _ = waiter.send(Reply::Mounted {
                mountpoint: self.mountpoint.clone(),
                generation,
                pid,
            });
        }
        self.record_changed = true;
    }

    /// Generation 1 never served: the mount fails; `fsctl mount` gets the
    /// message once the mount is removed (see [`Mount::close`]).
    fn fail_mount(&mut self, death: Death) {
        let message = format!(
            "generation 1 serving volume {} at {} ended before serving ({}); the mount was removed. Its log ({}):\n{}",
            self.volume,
            self.mountpoint.display(),
            describe(death.cause),
            self.log_path.display(),
            log_tail(&self.log_path)
        );
        self.mount_failure = Some(message);
    }

    /// Writes the state record if a takeover, a serve or an upgrade changed
    /// it. The daemon calls this after it has handled everything that woke
    /// it: each write ends with an fsync (about 1 ms here, more on network
    /// disks), and written at once it made the next mount's takeover wait
    /// behind it when several generations died together.
    pub fn write_changed_record(&mut self, env: &Env) {
        if std::mem::take(&mut self.record_changed) {
            self.write_record(env);
        }
    }

    /// Writes the state record (logged on failure: the mount keeps running).
    pub fn write_record(&mut self, env: &Env) {
        self.history_written = Instant::now();
        if let Err(err) = env.state.write_record(&self.record()) {
            tracing::warn!(mount = %self.id, %err, "cannot write the mount's state record");
        }
    }

    /// The state record: what a later supervisor needs to adopt the mount.
    pub fn record(&self) -> MountRecord {
        MountRecord {
            format_version: RECORD_FORMAT_VERSION,
            mount_id: self.id.clone(),
            mountpoint: self.mountpoint.clone(),
            volume: self.volume.clone(),
            base_dir: self.base_dir.clone(),
            options: self.options.clone(),
            connection_id: self.connection_id,
            connection_identity: self.connection_identity,
            client_binary: Some(self.client_binary.clone()),
            init: self.init,
            has_resend: self.init.flags & fuse_wire::abi::init_flags::HAS_RESEND != 0,
            supervisor_pid: std::process::id(),
            generation: self.active_generation(),
            pid: self.active.as_ref().filter(|p| p.adopted).map(|p| p.pid),
            created_unix_ms: self.created_unix_ms,
            persistent: self.persistent,
            history: Some(Box::new(MountHistory {
                last_recovery: self.last_recovery.clone(),
                last_upgrade: self.last_upgrade.clone(),
                ..self.tally.to_history(self.restarts)
            })),
        }
    }

    /// A generation reported its counters: the record (which keeps the
    /// totals) is written again once [`HISTORY_WRITE_INTERVAL`] passed since
    /// it last was, so a supervisor killed without warning loses at most
    /// that much of them.
    pub fn counters_changed(&mut self) {
        if self.history_written.elapsed() >= HISTORY_WRITE_INTERVAL {
            self.record_changed = true;
        }
    }

    /// The status entry.
    pub fn status(&self) -> MountStatus {
        let now = Instant::now();
        let active = self.active.as_ref();
        MountStatus {
            persistent: self.persistent,
            mount_id: self.id.clone(),
            mountpoint: self.mountpoint.clone(),
            volume: self.volume.clone(),
            state: self.state.name().to_string(),
            generation: self.active_generation(),
            pid: active.map(|p| p.pid),
            standby_pid: self.standby.as_ref().map(|p| p.pid),
            restarts: self.restarts,
            // From the record's creation time: the mount's life, across
            // supervisor restarts (the monotonic clock is per boot, and
            // this process may be younger than the mount).
            uptime_s: unix_ms(SystemTime::now()).saturating_sub(self.created_unix_ms) / 1000,
            generation_uptime_s: active
                .and_then(|p| p.serving_since)
                .map(|t| now.duration_since(t).as_secs())
                .unwrap_or(0),
            consecutive_failures: self.state.failures(),
            gave_up: matches!(self.state, State::GaveUp { .. }),
            read_only_reason: self.tally.read_only_reason(),
            last_recovery: self.last_recovery.clone(),
            last_upgrade: self.last_upgrade.clone(),
            client_binary: self.client_binary.clone(),
            requests_recovered: self.tally.requests_recovered(),
            connection_id: self.connection_id,
            counters: Some(self.tally.counters()),
            incidents: self.tally.incidents(),
            cgroup: active
                .and_then(|p| p.cgroup.as_ref())
                .map(|c| c.dir().to_path_buf()),
            init: self.init,
        }
    }

    /// The process with `pid`, and its slot.
    pub fn process_mut(&mut self, pid: u32) -> Option<(Role, &mut Process)> {
        if let Some(p) = self.active.as_mut().filter(|p| p.pid == pid) {
            return Some((Role::Active, p));
        }
        if let Some(p) = self.retiring.as_mut().filter(|p| p.pid == pid) {
            return Some((Role::Retiring, p));
        }
        self.standby
            .as_mut()
            .filter(|p| p.pid == pid)
            .map(|p| (Role::Standby, p))
    }

    /// Every live process of the mount.
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.active
            .iter()
            .chain(self.standby.iter())
            .chain(self.retiring.iter())
    }

    /// Removes the process with `pid` from its slot (after it was reaped).
    pub fn take_process(&mut self, pid: u32) -> Option<(Role, Process)> {
        if self.active.as_ref().is_some_and(|p| p.pid == pid) {
            return self.active.take().map(|p| (Role::Active, p));
        }
        if self.standby.as_ref().is_some_and(|p| p.pid == pid) {
            return self.standby.take().map(|p| (Role::Standby, p));
        }
        if self.retiring.as_ref().is_some_and(|p| p.pid == pid) {
            return self.retiring.take().map(|p| (Role::Retiring, p));
        }
        None
    }

    /// The earliest armed timer, or background start-up to lift.
    pub fn next_deadline(&self) -> Option<Instant> {
        let startups = self.processes().filter_map(Process::startup_deadline);
        self.timers.values().copied().chain(startups).min()
    }

    /// Lifts background start-ups that are starving
    /// ([`Process::lift_if_starved`]).
    pub fn lift_starved_startups(&mut self, now: Instant) {
        for process in [&mut self.active, &mut self.standby, &mut self.retiring]
            .into_iter()
            .flatten()
        {
            process.lift_if_starved(now);
        }
    }

    /// Removes and returns a timer that is due at `now`.
    pub fn take_due_timer(&mut self, now: Instant) -> Option<Timer> {
        let due = self
            .timers
            .iter()
            .filter(|(_, at)| **at <= now)
            .min_by_key(|(_, at)| **at)
            .map(|(timer, _)| *timer)?;
        self.timers.remove(&due);
        Some(due)
    }

    /// The serving generation ended while stopping for an unmount: if not
    /// cleanly (its final flush failed and it exited non-zero, or the stop
    /// deadline killed it), what it said last is the unmount's warning.
    fn note_unclean_stop(&mut self, death: Death) {
        if death.cause == Cause::Exit(0) {
            return;
        }
        let tail = log_tail(&self.log_path);
        let said = last_log_line(&tail);
        self.stop_warning = Some(format!(
            "generation {} ended {} while stopping{}",
            death.generation,
            describe(death.cause),
            if said.is_empty() {
                format!(
                    "; acknowledged data may still be staged (see {})",
                    self.log_path.display()
                )
            } else {
                format!(": {said}")
            }
        ));
    }

    /// Closes the fd and removes the socket and record: the last step of an
    /// unmount. Answers every waiter.
    pub fn close(&mut self, env: &Env, outcome: Result<String, String>) {
        self.channel = None;
        let _ = std::fs::remove_file(&self.socket_path);
        let _ = std::fs::remove_file(env.state.held_locks_path(&self.id));
        if let Err(err) = env.state.remove_record(&self.id) {
            tracing::warn!(mount = %self.id, %err, "cannot remove the state record");
        }
        let reply = match &outcome {
            Ok(how) => {
                tracing::info!(mount = %self.id, mountpoint = %self.mountpoint.display(), how, warning = self.stop_warning.as_deref(), "unmounted");
                Reply::Unmounted {
                    mountpoint: self.mountpoint.clone(),
                    warning: self.stop_warning.take(),
                }
            }
            Err(err) => {
                tracing::error!(mount = %self.id, mountpoint = %self.mountpoint.display(), err, "unmount failed; the fd is closed, so the connection is gone");
                Reply::Error {
                    kind: ErrorKind::Failed,
                    message: format!(
                        "unmounting {} failed: {err}; the FUSE connection is closed; run `umount -l {}`",
                        self.mountpoint.display(),
                        self.mountpoint.display()
                    ),
                }
            }
        };
        for waiter in self.umount_waiters.drain(..) {
            let _ = waiter.send(reply.clone());
        }
        let failure = self.mount_failure.take().unwrap_or_else(|| {
            format!(
                "the mount at {} was removed before it served",
                self.mountpoint.display()
            )
        });
        for waiter in self.mount_waiters.drain(..) {
            let _ = waiter.send(Reply::Error {
                kind: ErrorKind::Failed,
                message: failure.clone(),
            });
        }
    }
}

fn describe_outcome(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Upgraded => "upgraded",
        Outcome::IncomingDied => "rolled back: the new generation ended before serving",
        Outcome::HandoverRefused => "rolled back: the serving generation refused to hand over",
        Outcome::ServingDied => {
            "the serving generation died during the upgrade; crash recovery took over"
        }
        Outcome::ProbeFailed => {
            "rolled back: the new generation did not answer a probe through the mount"
        }
        Outcome::Unmounted => "the mount was unmounted during the upgrade",
    }
}

/// Deletes a handover state file and its journal (they are single-use).
fn remove_handover_files(state: &Path) {
    if let Ok(bytes) = std::fs::read(state) {
        if let Ok(decoded) = upgrade_protocol::decode_state(&bytes) {
            if let Some(journal) = decoded.journal {
                let _ = std::fs::remove_file(journal);
            }
        }
    }
    let _ = std::fs::remove_file(state);
}
