//! The planned-upgrade part of a mount's lifecycle (`fsctl upgrade`). Pure,
//! like `mount.rs`, which routes `Serving + UpgradeRequested` and every
//! event in `Upgrading` here.
//!
//! Slots: the *incoming* generation (new binary) is started in the standby
//! slot; at handover the old one moves from the active slot to *retiring*
//! and the incoming one is promoted. Nothing is taken from the old
//! generation until the new one is started, connected and waiting.
//!
//! ```text
//! phase            event                     next / actions
//! ---------------  ------------------------  -------------------------------------------------
//! Serving          UpgradeRequested          ClearingStandby (KillStandby) if a standby lives,
//!                                            else Spawning (SpawnIncoming); arm UpgradeDeadline
//! ClearingStandby  StandbyExited             Spawning: SpawnIncoming
//! Spawning         StandbyConnected          Quiescing: SendHandover
//! Spawning         StandbyExited             Serving: Finish(IncomingDied)
//! Quiescing        StandbyExited             Quiescing{incoming: false}
//! Quiescing        HandedOver                incoming: Adopting (RetireActive, PromoteStandby,
//!                                              SendAdoptHandover); else Serving (SendResume)
//! Quiescing        HandoverFailed            Serving (the old one serves on; incoming killed)
//! Quiescing        ActiveExited              Finish(ServingDied), then the crash path
//! Adopting         ActiveServing             Probing: StartProbe
//! Probing          ProbeOk                   Serving: ExitRetiring, Finish(Ok)
//! Probing          ProbeFailed               KillActive (its death rolls back)
//! Adopting,
//! Probing          ActiveExited              retiring alive: Serving (ReinstateRetiring,
//!                                              SendResume{resend}); else the crash path
//! Adopting,
//! Probing          RetiringExited            retiring: false (no rollback possible any more)
//! any              UpgradeDeadline           kill the incoming generation (its death rolls back)
//! any              UmountRequested           Finish(Unmounted), KillRetiring, stop
//! ```

use super::mount::{
    active_died, plan_standby, stop, Action, Attempt, Event, Policy, Role, Standby, State, Timer,
};
use upgrade_protocol::Unanswered;

/// How far an upgrade got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The old warm standby is being killed to free the slot.
    ClearingStandby,
    /// The incoming generation is started and not yet connected.
    Spawning,
    /// `Handover` was sent to the serving generation.
    Quiescing {
        /// The incoming generation is still alive.
        incoming: bool,
    },
    /// The incoming generation got the fd and the state; not serving yet.
    Adopting,
    /// It serves; a probe request goes through the mount.
    Probing,
}

/// Why an upgrade ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The new generation serves and answered the probe.
    Upgraded,
    /// The incoming generation died before serving (bad binary, bad state).
    IncomingDied,
    /// The serving generation refused to hand over (reason in its message).
    HandoverRefused,
    /// The serving generation died during the upgrade.
    ServingDied,
    /// The probe through the mount failed.
    ProbeFailed,
    /// The mount was unmounted meanwhile.
    Unmounted,
}

/// `Serving + UpgradeRequested`.
pub fn begin(standby: Standby, failures: u32, timeout_ms: u64) -> (State, Vec<Action>) {
    let mut actions = vec![
        Action::CancelTimer(Timer::StandbySpawn),
        Action::ArmTimer {
            timer: Timer::UpgradeDeadline,
            after_ms: timeout_ms,
        },
    ];
    let phase = if standby.is_alive() {
        actions.push(Action::KillStandby);
        Phase::ClearingStandby
    } else {
        actions.push(Action::SpawnIncoming);
        Phase::Spawning
    };
    (
        State::Upgrading {
            phase,
            failures,
            retiring: false,
        },
        actions,
    )
}

/// Every event while upgrading.
pub fn step(
    phase: Phase,
    failures: u32,
    retiring: bool,
    event: Event,
    policy: &Policy,
) -> (State, Vec<Action>) {
    let (next, actions) = transition(phase, failures, retiring, event, policy);
    assert_postconditions(event, &next, &actions);
    (next, actions)
}

/// Invariant: what every upgrade transition promises. An upgrade that ends
/// answers `fsctl upgrade` exactly once and leaves `Upgrading`; one that
/// goes on answers nothing. The incoming generation gets the fd only on
/// `HandedOver`, after the serving one was moved aside (it is fenced):
/// otherwise two generations would read the connection at once. Broken,
/// the supervisor stops here; its mounts keep serving and a restarted
/// supervisor adopts them.
fn assert_postconditions(event: Event, next: &State, actions: &[Action]) {
    let finishes = actions
        .iter()
        .filter(|a| matches!(a, Action::Finish(_)))
        .count();
    let still_upgrading = matches!(next, State::Upgrading { .. });
    assert_eq!(
        finishes,
        usize::from(!still_upgrading),
        "upgrade transition on {event:?} to {next:?} answers {finishes} time(s): {actions:?}"
    );
    if let Some(adopt) = actions.iter().position(|a| *a == Action::SendAdoptHandover) {
        let retired_first = actions[..adopt].contains(&Action::RetireActive);
        assert!(
            retired_first && event == Event::HandedOver,
            "the incoming generation got the fd on {event:?} before the serving one was moved aside: {actions:?}"
        );
    }
}

fn transition(
    phase: Phase,
    failures: u32,
    retiring: bool,
    event: Event,
    policy: &Policy,
) -> (State, Vec<Action>) {
    use Event as E;
    use Phase as P;
    let at = |phase| State::Upgrading {
        phase,
        failures,
        retiring,
    };
    match (phase, event) {
        (P::ClearingStandby, E::StandbyExited(_)) => (at(P::Spawning), vec![Action::SpawnIncoming]),
        (P::Spawning, E::StandbyConnected) => (
            at(P::Quiescing { incoming: true }),
            vec![Action::SendHandover],
        ),
        (P::Spawning, E::StandbyExited(death)) => serve_on(
            Standby::None,
            failures,
            Outcome::IncomingDied,
            policy,
            vec![Action::RecordDeath {
                role: Role::Standby,
                death,
            }],
        ),
        (P::Quiescing { .. }, E::StandbyExited(death)) => (
            at(P::Quiescing { incoming: false }),
            vec![Action::RecordDeath {
                role: Role::Standby,
                death,
            }],
        ),
        (P::Quiescing { incoming: true }, E::HandedOver) => (
            State::Upgrading {
                phase: P::Adopting,
                failures,
                retiring: true,
            },
            vec![
                Action::RetireActive,
                Action::PromoteStandby,
                Action::SendAdoptHandover,
            ],
        ),
        (P::Quiescing { incoming: false }, E::HandedOver) => serve_on(
            Standby::None,
            failures,
            Outcome::IncomingDied,
            policy,
            vec![Action::SendResume {
                unanswered: Unanswered::Leave,
            }],
        ),
        (P::Quiescing { incoming }, E::HandoverFailed) => {
            let (standby, kill) = if incoming {
                (Standby::Discarding, vec![Action::KillStandby])
            } else {
                (Standby::None, vec![])
            };
            serve_on(standby, failures, Outcome::HandoverRefused, policy, kill)
        }
        (P::ClearingStandby | P::Spawning | P::Quiescing { .. }, E::ActiveExited(death)) => {
            let standby = match phase {
                P::Quiescing { incoming: true } => Standby::Ready,
                P::Spawning => Standby::Launched,
                _ => Standby::None,
            };
            let (state, actions) =
                active_died(Attempt::Restart, standby, failures, false, death, policy);
            (state, finish_then(Outcome::ServingDied, actions))
        }
        (P::Adopting, E::ActiveServing) => (at(P::Probing), vec![Action::StartProbe]),
        (P::Probing, E::ProbeOk) => {
            let mut actions = vec![
                Action::CancelTimer(Timer::UpgradeDeadline),
                Action::ExitRetiring,
                Action::AnnounceServing,
                Action::Finish(Outcome::Upgraded),
            ];
            let standby = if policy.standby {
                actions.push(plan_standby(0));
                Standby::Planned
            } else {
                Standby::None
            };
            (
                State::Serving {
                    standby,
                    failures: 0,
                    stable: true,
                },
                actions,
            )
        }
        (P::Probing, E::ProbeFailed) => (at(P::Probing), vec![Action::KillActive]),
        (P::Adopting | P::Probing, E::ActiveExited(death)) if retiring => {
            let outcome = if phase == P::Probing {
                Outcome::ProbeFailed
            } else {
                Outcome::IncomingDied
            };
            serve_on(
                Standby::None,
                failures,
                outcome,
                policy,
                vec![
                    Action::RecordDeath {
                        role: Role::Active,
                        death,
                    },
                    Action::ReinstateRetiring,
                    Action::SendResume {
                        unanswered: Unanswered::Resend,
                    },
                ],
            )
        }
        (P::Adopting | P::Probing, E::ActiveExited(death)) => {
            let (state, actions) = active_died(
                Attempt::Restart,
                Standby::None,
                failures,
                false,
                death,
                policy,
            );
            (state, finish_then(Outcome::IncomingDied, actions))
        }
        (P::Adopting | P::Probing, E::RetiringExited(_)) => (
            State::Upgrading {
                phase,
                failures,
                retiring: false,
            },
            vec![],
        ),
        (
            P::ClearingStandby | P::Spawning | P::Quiescing { incoming: true },
            E::Timer(Timer::UpgradeDeadline),
        ) => (at(phase), vec![Action::KillStandby]),
        (P::Adopting | P::Probing, E::Timer(Timer::UpgradeDeadline)) => {
            (at(phase), vec![Action::KillActive])
        }
        (_, E::UmountRequested) => {
            let standby = match phase {
                P::ClearingStandby | P::Spawning | P::Quiescing { incoming: true } => {
                    Standby::Launched
                }
                _ => Standby::None,
            };
            let mut actions = vec![
                Action::CancelTimer(Timer::UpgradeDeadline),
                Action::Finish(Outcome::Unmounted),
            ];
            if retiring {
                actions.push(Action::KillRetiring);
            }
            // Every phase has a process with the fd in the active slot.
            let (state, more) = stop(true, standby);
            actions.extend(more);
            (state, actions)
        }
        _ => (at(phase), vec![]),
    }
}

/// The upgrade ended without a new generation: the old one serves on.
fn serve_on(
    standby: Standby,
    failures: u32,
    outcome: Outcome,
    policy: &Policy,
    first: Vec<Action>,
) -> (State, Vec<Action>) {
    let mut actions = first;
    actions.push(Action::CancelTimer(Timer::UpgradeDeadline));
    actions.push(Action::Finish(outcome));
    let standby = match standby {
        Standby::None if policy.standby => {
            actions.push(plan_standby(failures));
            Standby::Planned
        }
        other => other,
    };
    (
        State::Serving {
            standby,
            failures,
            stable: true,
        },
        actions,
    )
}

fn finish_then(outcome: Outcome, actions: Vec<Action>) -> Vec<Action> {
    let mut out = vec![
        Action::CancelTimer(Timer::UpgradeDeadline),
        Action::Finish(outcome),
    ];
    out.extend(actions);
    out
}
