//! The lifecycle of one supervised mount: which generation process holds
//! the fd, when a warm standby takes over, when to start cold, back off,
//! give up, and stop. Pure: [`step`] maps a state and an event to the next
//! state and the actions the executor (`daemon`) performs; nothing here does
//! IO or reads a clock.
//!
//! Roles, not pids: the *active* slot is the process that has the fd (or is
//! about to get it); the *standby* slot is a process that is started and
//! connected but has never seen the fd. The executor maps pids to slots.
//!
//! ```text
//! state        event                    next state / actions
//! ----------   ----------------------   -------------------------------------------------
//! (start)                               Launching{First}: SpawnActive, arm StartDeadline
//! (resume)                              Launching{Restart}: SpawnActive, arm StartDeadline
//! Launching    ActiveConnected          Adopting: SendAdopt{resend: attempt == Restart}
//! Launching    StartDeadline            same: KillActive (its death follows)
//! Adopting     ActiveServing            Serving: AnnounceServing, arm Stable, plan standby
//! Serving      Stable                   Serving{stable, failures 0}
//! Adopting,
//! Serving      StandbySpawn (planned)   standby Launched: SpawnStandby
//! Adopting,
//! Serving      StandbyConnected         standby Ready
//! Adopting,
//! Serving      StandbyExited            RecordDeath, failures+1, plan standby with backoff
//! Launching,
//! Adopting,
//! Serving      ActiveExited             RecordDeath; then, first attempt: FailMount, Unmount;
//!                                       give-up reached: GaveUp (KillStandby);
//!                                       standby Ready: Adopting (PromoteStandby,
//!                                         SendAdopt{resend: true}, plan next standby);
//!                                       standby Launched: Launching (PromoteStandby);
//!                                       else failures 0: Launching (SpawnActive);
//!                                       else BackingOff (arm Backoff)
//! BackingOff   Backoff                  Launching{Restart}: SpawnActive
//! any live     UmountRequested          Stopping: TerminateActive (KillActive if not
//!                                       adopted), KillStandby, arm StopDeadline;
//!                                       nothing alive: Unmounted (Unmount)
//! Stopping     StopDeadline             same: KillActive
//! Stopping     *Exited (last one)       Unmounted: Unmount
//! GaveUp       UmountRequested          Unmounted: Unmount
//! every other pair                      unchanged, no action (stale timer, duplicate)
//! ```
//!
//! Planned upgrades (`Serving + UpgradeRequested`, the `Upgrading` state)
//! have their own table in `upgrade.rs`.
//!
//! Failures: a *failed start* is a process that dies before it is stable:
//! a standby before promotion, an active generation before serving for
//! [`STABLE_MS`]. Restarts back off by the count ([`backoff_ms`]); a warm
//! standby is always promoted at once, since it costs no fork. With
//! `give_up_after`, that many consecutive failed starts stop restarting.

use super::upgrade::{self, Outcome, Phase};
use upgrade_protocol::Unanswered;

/// Delay between a takeover (or a first serve) and starting the next
/// standby: fork+exec would compete with the takeover on a small machine.
pub const STANDBY_DELAY_MS: u64 = 100;
/// A generation that dies within this long of serving counts as a failed
/// start (a crash loop on a poison request); longer ones do not.
pub const STABLE_MS: u64 = 100;
/// A generation that has not reported serving by then is killed.
pub const START_DEADLINE_MS: u64 = 30_000;
/// A generation asked to stop (SIGTERM, flush) is killed after this long.
pub const STOP_DEADLINE_MS: u64 = 20_000;
/// The first backoff step.
pub const BACKOFF_BASE_MS: u64 = 50;
/// Restarts back off at most this long.
pub const BACKOFF_MS_MAX: u64 = 2_000;

/// What the machine is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Keep a warm standby.
    pub standby: bool,
    /// Stop restarting after this many consecutive failed starts.
    pub give_up_after: Option<u32>,
}

/// The standby slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standby {
    /// None, none planned.
    None,
    /// The StandbySpawn timer is armed.
    Planned,
    /// Spawned, not yet connected.
    Launched,
    /// Connected and waiting for Adopt (has not seen the fd).
    Ready,
    /// Killed on purpose (an aborted upgrade's incoming generation): its
    /// death is not a failure, and a standby is planned after it.
    Discarding,
}

impl Standby {
    /// Whether a standby process exists.
    pub fn is_alive(self) -> bool {
        matches!(
            self,
            Standby::Launched | Standby::Ready | Standby::Discarding
        )
    }
}

/// Whether the mount has ever served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Generation 1 of a new mount: if it fails, the mount fails.
    First,
    /// A restart: another generation may have left requests (RESEND).
    Restart,
}

/// The state of one mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The active process is spawned and has not connected yet.
    Launching {
        /// First or restart.
        attempt: Attempt,
        /// Consecutive failed starts.
        failures: u32,
    },
    /// Adopt (with the fd) was sent; waiting for Serving.
    Adopting {
        /// First or restart.
        attempt: Attempt,
        /// The standby slot.
        standby: Standby,
        /// Consecutive failed starts.
        failures: u32,
    },
    /// The active generation serves.
    Serving {
        /// The standby slot.
        standby: Standby,
        /// Consecutive failed starts.
        failures: u32,
        /// It has served for [`STABLE_MS`].
        stable: bool,
    },
    /// No process is alive; a cold start when the Backoff timer fires.
    BackingOff {
        /// Consecutive failed starts.
        failures: u32,
    },
    /// `give_up_after` was reached: nothing runs, requests wait until umount.
    GaveUp {
        /// Consecutive failed starts.
        failures: u32,
    },
    /// A planned upgrade is under way (see `upgrade.rs`).
    Upgrading {
        /// How far it got.
        phase: Phase,
        /// Consecutive failed starts before it began.
        failures: u32,
        /// The old generation is alive in the retiring slot.
        retiring: bool,
    },
    /// Unmount requested: waiting for the processes to exit.
    Stopping {
        /// The active process is alive.
        active: bool,
        /// The standby process is alive.
        standby: bool,
    },
    /// Unmounted (terminal).
    Unmounted,
}

impl State {
    /// The state's name, for logs and status.
    pub fn name(&self) -> &'static str {
        match self {
            State::Launching { .. } => "launching",
            State::Adopting { .. } => "adopting",
            State::Serving { .. } => "serving",
            State::Upgrading { .. } => "upgrading",
            State::BackingOff { .. } => "backing_off",
            State::GaveUp { .. } => "gave_up",
            State::Stopping { .. } => "stopping",
            State::Unmounted => "unmounted",
        }
    }

    /// Consecutive failed starts.
    pub fn failures(&self) -> u32 {
        match *self {
            State::Launching { failures, .. }
            | State::Adopting { failures, .. }
            | State::Serving { failures, .. }
            | State::Upgrading { failures, .. }
            | State::BackingOff { failures }
            | State::GaveUp { failures } => failures,
            State::Stopping { .. } | State::Unmounted => 0,
        }
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// It exited with this code.
    Exit(i32),
    /// A signal killed it (not the OOM killer).
    Signal(i32),
    /// The OOM killer killed it in its memory cgroup.
    Oom,
    /// It could not be started.
    SpawnFailed,
}

/// A process that ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Death {
    /// Its generation number.
    pub generation: u64,
    /// Its pid.
    pub pid: u32,
    /// How it ended.
    pub cause: Cause,
}

/// Timers the executor arms for the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// End of a restart backoff.
    Backoff,
    /// Time to start the next standby.
    StandbySpawn,
    /// The active generation has served for [`STABLE_MS`].
    Stable,
    /// The active generation did not serve in time.
    StartDeadline,
    /// A stopping generation did not exit in time.
    StopDeadline,
    /// A planned upgrade did not finish in time: roll back.
    UpgradeDeadline,
}

/// Which slot an action or death concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The process holding (or about to hold) the fd.
    Active,
    /// The warm standby (or an upgrade's incoming generation).
    Standby,
    /// A generation that handed over in an upgrade and waits to exit.
    Retiring,
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The active process connected its control socket.
    ActiveConnected,
    /// The active generation reported it serves.
    ActiveServing,
    /// The active process ended (exited: every thread gone, every fd
    /// closed; reaped once the actions are done).
    ActiveExited(Death),
    /// The standby connected its control socket.
    StandbyConnected,
    /// The standby ended (exited, as for `ActiveExited`).
    StandbyExited(Death),
    /// A timer fired.
    Timer(Timer),
    /// `fsctl umount` or supervisor shutdown.
    UmountRequested,
    /// `fsctl upgrade`: replace the serving generation within `timeout_ms`.
    UpgradeRequested {
        /// The whole upgrade's deadline.
        timeout_ms: u64,
    },
    /// The serving generation handed over (state written, fenced).
    HandedOver,
    /// The serving generation refused to hand over and serves on.
    HandoverFailed,
    /// The probe through the mount was answered.
    ProbeOk,
    /// The probe through the mount failed or timed out.
    ProbeFailed,
    /// The retiring generation ended (exited, as for `ActiveExited`).
    RetiringExited(Death),
}

/// What the executor must do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a generation process in the active slot (cold).
    SpawnActive,
    /// Start a process in the standby slot.
    SpawnStandby,
    /// Move the standby process to the active slot.
    PromoteStandby,
    /// Send Adopt with the fd to the (connected) active process.
    SendAdopt {
        /// [`Unanswered::Resend`] after a death: no other generation that
        /// read requests is alive.
        unanswered: Unanswered,
    },
    /// SIGTERM the active generation (it flushes and exits).
    TerminateActive,
    /// SIGKILL the active process.
    KillActive,
    /// SIGKILL the standby process.
    KillStandby,
    /// Arm (or re-arm) a timer.
    ArmTimer {
        /// Which.
        timer: Timer,
        /// From now.
        after_ms: u64,
    },
    /// Disarm a timer.
    CancelTimer(Timer),
    /// Count and log a death.
    RecordDeath {
        /// Whose.
        role: Role,
        /// Which.
        death: Death,
    },
    /// The active generation serves: answer `fsctl mount`, note the takeover.
    AnnounceServing,
    /// Generation 1 never served: `fsctl mount` fails with this death.
    FailMount(Death),
    /// `give_up_after` was reached.
    ReportGaveUp,
    /// Unmount and close the fd (no process is alive).
    Unmount,
    /// Start the upgrade's incoming generation (new binary) in the standby
    /// slot.
    SpawnIncoming,
    /// Ask the active generation to hand over.
    SendHandover,
    /// Move the active generation to the retiring slot.
    RetireActive,
    /// Send Adopt with the fd and the handover state to the active slot.
    SendAdoptHandover,
    /// Probe the mount from outside (a lookup that must reach the server).
    StartProbe,
    /// Tell the retiring generation to exit.
    ExitRetiring,
    /// Move the retiring generation back to the active slot.
    ReinstateRetiring,
    /// Tell the (reinstated) old generation to serve again.
    SendResume {
        /// [`Unanswered::Resend`]: the incoming generation died with
        /// requests it had read.
        unanswered: Unanswered,
    },
    /// SIGKILL the retiring generation.
    KillRetiring,
    /// The upgrade ended: answer `fsctl upgrade`, record it.
    Finish(Outcome),
}

/// The delay before restart number `failures` (0 → none). Pure.
pub fn backoff_ms(failures: u32) -> u64 {
    match failures {
        0 => 0,
        n => BACKOFF_BASE_MS
            .saturating_mul(1u64 << (n - 1).min(16))
            .min(BACKOFF_MS_MAX),
    }
}

/// The first state of a new mount and its actions.
pub fn start() -> (State, Vec<Action>) {
    (
        State::Launching {
            attempt: Attempt::First,
            failures: 0,
        },
        vec![
            Action::SpawnActive,
            Action::ArmTimer {
                timer: Timer::StartDeadline,
                after_ms: START_DEADLINE_MS,
            },
        ],
    )
}

/// The first state of a mount adopted from a previous supervisor (its fd
/// came back from systemd's fd store) and its actions: a restart, so the
/// first generation sends RESEND and a failure backs off instead of failing
/// the mount.
pub fn resume() -> (State, Vec<Action>) {
    (
        State::Launching {
            attempt: Attempt::Restart,
            failures: 0,
        },
        spawn_active(),
    )
}

/// The next state and the actions for `event` in `state`. Pure.
pub fn step(state: State, event: Event, policy: &Policy) -> (State, Vec<Action>) {
    use Event as E;
    use State as S;
    match (state, event) {
        (S::Launching { attempt, failures }, E::ActiveConnected) => (
            S::Adopting {
                attempt,
                standby: Standby::None,
                failures,
            },
            vec![Action::SendAdopt {
                unanswered: match attempt {
                    Attempt::Restart => Unanswered::Resend,
                    Attempt::First => Unanswered::Leave,
                },
            }],
        ),
        (S::Launching { .. } | S::Adopting { .. }, E::Timer(Timer::StartDeadline)) => {
            (state, vec![Action::KillActive])
        }
        (S::Launching { attempt, failures }, E::ActiveExited(death)) => {
            active_died(attempt, Standby::None, failures, false, death, policy)
        }
        (S::Launching { .. }, E::UmountRequested) => stop(false, Standby::None),
        (
            S::Adopting {
                standby, failures, ..
            },
            E::ActiveServing,
        ) => serving(standby, failures, policy),
        (
            S::Adopting {
                attempt,
                standby,
                failures,
            },
            E::ActiveExited(death),
        ) => active_died(attempt, standby, failures, false, death, policy),
        (
            S::Serving {
                standby,
                failures,
                stable,
            },
            E::ActiveExited(death),
        ) => active_died(Attempt::Restart, standby, failures, stable, death, policy),
        (S::Serving { standby, .. }, E::Timer(Timer::Stable)) => (
            S::Serving {
                standby,
                failures: 0,
                stable: true,
            },
            vec![],
        ),
        (
            S::Adopting { standby, .. } | S::Serving { standby, .. },
            E::StandbyConnected | E::StandbyExited(_) | E::Timer(Timer::StandbySpawn),
        ) => {
            let (standby, failures, actions) =
                standby_event(standby, state.failures(), event, policy);
            (with_standby(state, standby, failures), actions)
        }
        (S::Adopting { standby, .. } | S::Serving { standby, .. }, E::UmountRequested) => {
            stop(true, standby)
        }
        (
            S::Serving {
                standby, failures, ..
            },
            E::UpgradeRequested { timeout_ms },
        ) => upgrade::begin(standby, failures, timeout_ms),
        (
            S::Upgrading {
                phase,
                failures,
                retiring,
            },
            event,
        ) => upgrade::step(phase, failures, retiring, event, policy),
        (S::BackingOff { failures }, E::Timer(Timer::Backoff)) => (
            S::Launching {
                attempt: Attempt::Restart,
                failures,
            },
            spawn_active(),
        ),
        (S::BackingOff { .. }, E::UmountRequested) => (
            S::Unmounted,
            vec![Action::CancelTimer(Timer::Backoff), Action::Unmount],
        ),
        (S::GaveUp { .. }, E::UmountRequested) => (S::Unmounted, vec![Action::Unmount]),
        (S::Stopping { active, standby }, E::ActiveExited(_)) if active => stopped(false, standby),
        (S::Stopping { active, standby }, E::StandbyExited(_)) if standby => stopped(active, false),
        (S::Stopping { active: true, .. }, E::Timer(Timer::StopDeadline)) => {
            (state, vec![Action::KillActive])
        }
        _ => (state, vec![]),
    }
}

fn spawn_active() -> Vec<Action> {
    vec![
        Action::SpawnActive,
        Action::ArmTimer {
            timer: Timer::StartDeadline,
            after_ms: START_DEADLINE_MS,
        },
    ]
}

pub(super) fn plan_standby(failures: u32) -> Action {
    Action::ArmTimer {
        timer: Timer::StandbySpawn,
        after_ms: STANDBY_DELAY_MS + backoff_ms(failures),
    }
}

fn serving(standby: Standby, failures: u32, policy: &Policy) -> (State, Vec<Action>) {
    let mut actions = vec![
        Action::CancelTimer(Timer::StartDeadline),
        Action::AnnounceServing,
        Action::ArmTimer {
            timer: Timer::Stable,
            after_ms: STABLE_MS,
        },
    ];
    let standby = if standby == Standby::None && policy.standby {
        actions.push(plan_standby(failures));
        Standby::Planned
    } else {
        standby
    };
    (
        State::Serving {
            standby,
            failures,
            stable: false,
        },
        actions,
    )
}

/// Standby slot events while a generation is adopting or serving.
fn standby_event(
    standby: Standby,
    failures: u32,
    event: Event,
    policy: &Policy,
) -> (Standby, u32, Vec<Action>) {
    match (standby, event) {
        (Standby::Planned, Event::Timer(Timer::StandbySpawn)) => {
            (Standby::Launched, failures, vec![Action::SpawnStandby])
        }
        (Standby::Launched, Event::StandbyConnected) => (Standby::Ready, failures, vec![]),
        (Standby::Discarding, Event::StandbyExited(_)) if policy.standby => {
            (Standby::Planned, failures, vec![plan_standby(failures)])
        }
        (Standby::Discarding, Event::StandbyExited(_)) => (Standby::None, failures, vec![]),
        (Standby::Launched | Standby::Ready, Event::StandbyExited(death)) => {
            let failures = failures.saturating_add(1);
            let mut actions = vec![Action::RecordDeath {
                role: Role::Standby,
                death,
            }];
            if policy.standby {
                actions.push(plan_standby(failures));
                (Standby::Planned, failures, actions)
            } else {
                (Standby::None, failures, actions)
            }
        }
        _ => (standby, failures, vec![]),
    }
}

fn with_standby(state: State, standby: Standby, failures: u32) -> State {
    match state {
        State::Adopting { attempt, .. } => State::Adopting {
            attempt,
            standby,
            failures,
        },
        State::Serving { stable, .. } => State::Serving {
            standby,
            failures,
            stable,
        },
        other => other,
    }
}

pub(super) fn active_died(
    attempt: Attempt,
    standby: Standby,
    failures: u32,
    stable: bool,
    death: Death,
    policy: &Policy,
) -> (State, Vec<Action>) {
    let mut actions = vec![
        Action::CancelTimer(Timer::StartDeadline),
        Action::CancelTimer(Timer::Stable),
        Action::RecordDeath {
            role: Role::Active,
            death,
        },
    ];
    let failures = if stable {
        failures
    } else {
        failures.saturating_add(1)
    };
    let give_up = policy.give_up_after.is_some_and(|n| failures >= n);
    let (state, more) = if attempt == Attempt::First || give_up {
        end_restarts(attempt, standby, failures, death)
    } else {
        take_over(standby, failures)
    };
    actions.extend(more);
    (state, actions)
}

/// No more restarts: generation 1 failed (the mount fails) or the give-up
/// limit was reached.
fn end_restarts(
    attempt: Attempt,
    standby: Standby,
    failures: u32,
    death: Death,
) -> (State, Vec<Action>) {
    let mut actions = vec![Action::CancelTimer(Timer::StandbySpawn)];
    if standby.is_alive() {
        actions.push(Action::KillStandby);
    }
    if attempt == Attempt::Restart {
        actions.push(Action::ReportGaveUp);
        return (State::GaveUp { failures }, actions);
    }
    actions.push(Action::FailMount(death));
    if standby.is_alive() {
        let stopping = State::Stopping {
            active: false,
            standby: true,
        };
        return (stopping, actions);
    }
    actions.push(Action::Unmount);
    (State::Unmounted, actions)
}

/// The next generation after a death: the warm standby at once, the
/// launched standby once it connects, or a cold start (after a backoff).
fn take_over(standby: Standby, failures: u32) -> (State, Vec<Action>) {
    let deadline = Action::ArmTimer {
        timer: Timer::StartDeadline,
        after_ms: START_DEADLINE_MS,
    };
    let restart = Attempt::Restart;
    match standby {
        Standby::Ready => (
            State::Adopting {
                attempt: restart,
                standby: Standby::Planned,
                failures,
            },
            vec![
                Action::PromoteStandby,
                Action::SendAdopt {
                    unanswered: Unanswered::Resend,
                },
                deadline,
                plan_standby(failures),
            ],
        ),
        Standby::Launched => (
            State::Launching {
                attempt: restart,
                failures,
            },
            vec![Action::PromoteStandby, deadline],
        ),
        Standby::Planned | Standby::None | Standby::Discarding if failures == 0 => {
            let mut actions = vec![Action::CancelTimer(Timer::StandbySpawn)];
            actions.extend(spawn_active());
            let state = State::Launching {
                attempt: restart,
                failures,
            };
            (state, actions)
        }
        Standby::Planned | Standby::None | Standby::Discarding => (
            State::BackingOff { failures },
            vec![
                Action::CancelTimer(Timer::StandbySpawn),
                Action::ArmTimer {
                    timer: Timer::Backoff,
                    after_ms: backoff_ms(failures),
                },
            ],
        ),
    }
}

/// Unmount requested while a process holds the active slot.
pub(super) fn stop(adopted: bool, standby: Standby) -> (State, Vec<Action>) {
    let mut actions = vec![
        Action::CancelTimer(Timer::StartDeadline),
        Action::CancelTimer(Timer::Stable),
        Action::CancelTimer(Timer::StandbySpawn),
        // A process that never got the fd holds nothing worth flushing.
        if adopted {
            Action::TerminateActive
        } else {
            Action::KillActive
        },
        Action::ArmTimer {
            timer: Timer::StopDeadline,
            after_ms: STOP_DEADLINE_MS,
        },
    ];
    if standby.is_alive() {
        actions.push(Action::KillStandby);
    }
    (
        State::Stopping {
            active: true,
            standby: standby.is_alive(),
        },
        actions,
    )
}

fn stopped(active: bool, standby: bool) -> (State, Vec<Action>) {
    if active || standby {
        (State::Stopping { active, standby }, vec![])
    } else {
        (
            State::Unmounted,
            vec![Action::CancelTimer(Timer::StopDeadline), Action::Unmount],
        )
    }
}

#[cfg(test)]
#[path = "mount_tests.rs"]
mod tests;
