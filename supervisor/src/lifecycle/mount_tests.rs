//! Every (state, event) pair of the mount lifecycle: the whole table is
//! pinned by a snapshot (`snapshots/*transition_table*`), invariants are
//! checked on every pair, and the paths that matter are spelled out.

use super::*;

const POLICY: Policy = Policy {
    standby: true,
    give_up_after: Some(3),
};

fn death(cause: Cause) -> Death {
    Death {
        generation: 7,
        pid: 700,
        cause,
    }
}

fn states() -> Vec<State> {
    use Standby::*;
    let mut states = vec![
        State::Launching {
            attempt: Attempt::First,
            failures: 0,
        },
        State::Launching {
            attempt: Attempt::Restart,
            failures: 0,
        },
        State::Launching {
            attempt: Attempt::Restart,
            failures: 2,
        },
    ];
    for standby in [None, Planned, Launched, Ready] {
        states.push(State::Adopting {
            attempt: Attempt::Restart,
            standby,
            failures: 0,
        });
    }
    states.push(State::Adopting {
        attempt: Attempt::First,
        standby: None,
        failures: 0,
    });
    states.push(State::Adopting {
        attempt: Attempt::Restart,
        standby: Ready,
        failures: 2,
    });
    for standby in [None, Planned, Launched, Ready] {
        for (failures, stable) in [(0, true), (1, false), (2, false)] {
            states.push(State::Serving {
                standby,
                failures,
                stable,
            });
        }
    }
    states.extend([
        State::BackingOff { failures: 1 },
        State::GaveUp { failures: 3 },
        State::Stopping {
            active: true,
            standby: true,
        },
        State::Stopping {
            active: true,
            standby: false,
        },
        State::Stopping {
            active: false,
            standby: true,
        },
        State::Unmounted,
    ]);
    use crate::lifecycle::upgrade::Phase;
    for (phase, retiring) in [
        (Phase::ClearingStandby, false),
        (Phase::Spawning, false),
        (Phase::Quiescing { incoming: true }, false),
        (Phase::Quiescing { incoming: false }, false),
        (Phase::Adopting, true),
        (Phase::Adopting, false),
        (Phase::Probing, true),
        (Phase::Probing, false),
    ] {
        states.push(State::Upgrading {
            phase,
            failures: 0,
            retiring,
        });
    }
    states.push(State::Serving {
        standby: Discarding,
        failures: 0,
        stable: true,
    });
    states
}

fn events() -> Vec<Event> {
    vec![
        Event::ActiveConnected,
        Event::ActiveServing,
        Event::ActiveExited(death(Cause::Signal(9))),
        Event::StandbyConnected,
        Event::StandbyExited(death(Cause::Exit(2))),
        Event::Timer(Timer::Backoff),
        Event::Timer(Timer::StandbySpawn),
        Event::Timer(Timer::Stable),
        Event::Timer(Timer::StartDeadline),
        Event::Timer(Timer::StopDeadline),
        Event::UmountRequested,
        Event::UpgradeRequested { timeout_ms: 30_000 },
        Event::HandedOver,
        Event::HandoverFailed,
        Event::ProbeOk,
        Event::ProbeFailed,
        Event::RetiringExited(death(Cause::Exit(0))),
        Event::Timer(Timer::UpgradeDeadline),
    ]
}

fn all_pairs() -> Vec<(State, Event, State, Vec<Action>)> {
    let mut out = Vec::new();
    for state in states() {
        for event in events() {
            let (next, actions) = step(state, event, &POLICY);
            out.push((state, event, next, actions));
        }
    }
    out
}

#[test]
fn transition_table_is_pinned() {
    let mut table = String::new();
    for (state, event, next, actions) in all_pairs() {
        table.push_str(&format!(
            "{state:?}\n  + {event:?}\n  -> {next:?}\n     {actions:?}\n"
        ));
    }
    insta::assert_snapshot!("transition_table", table);
}

#[test]
fn every_pair_keeps_the_invariants() {
    let pairs = all_pairs();
    assert_eq!(pairs.len(), states().len() * events().len());
    for (state, event, next, actions) in pairs {
        let ctx = format!("{state:?} + {event:?} -> {next:?} {actions:?}");
        // Invariant: RESEND re-queues the whole connection, so it is only
        // asked for when the adopted generation has just exited (or
        // none was ever adopted since the last one died).
        for action in &actions {
            if let Action::SendAdopt {
                unanswered: Unanswered::Resend,
            } = action
            {
                let after_death = matches!(event, Event::ActiveExited(_));
                let cold_restart = matches!(
                    state,
                    State::Launching {
                        attempt: Attempt::Restart,
                        ..
                    }
                ) && event == Event::ActiveConnected;
                assert!(after_death || cold_restart, "{ctx}");
            }
        }
        // Upgrades: the successor gets the fd only after the serving
        // generation was moved aside (it handed over and is fenced), and
        // an upgrade that ends says so exactly once and leaves Upgrading.
        if let Some(adopt) = actions.iter().position(|a| *a == Action::SendAdoptHandover) {
            let retire = actions.iter().position(|a| *a == Action::RetireActive);
            assert!(retire.is_some_and(|r| r < adopt), "{ctx}");
            assert_eq!(event, Event::HandedOver, "{ctx}");
        }
        if actions.contains(&Action::SendResume {
            unanswered: Unanswered::Resend,
        }) {
            assert!(matches!(event, Event::ActiveExited(_)), "{ctx}");
            assert!(actions.contains(&Action::ReinstateRetiring), "{ctx}");
        }
        let finishes = actions
            .iter()
            .filter(|a| matches!(a, Action::Finish(_)))
            .count();
        assert!(finishes <= 1, "{ctx}");
        if finishes == 1 {
            assert!(matches!(state, State::Upgrading { .. }), "{ctx}");
            assert!(!matches!(next, State::Upgrading { .. }), "{ctx}");
        }
        if matches!(state, State::Upgrading { .. }) && !matches!(next, State::Upgrading { .. }) {
            assert_eq!(finishes, 1, "an upgrade ended without an answer: {ctx}");
        }
        if matches!(state, State::Adopting { .. } | State::Serving { .. })
            && !matches!(event, Event::ActiveExited(_))
        {
            assert!(
                !actions
                    .iter()
                    .any(|a| matches!(a, Action::SendAdopt { .. })),
                "a live generation must never get a second adopter: {ctx}"
            );
        }
        // Unmount exactly when entering Unmounted.
        let unmounts = actions.iter().filter(|a| **a == Action::Unmount).count();
        let entering = next == State::Unmounted && state != State::Unmounted;
        assert_eq!(unmounts, usize::from(entering), "{ctx}");
        if state == State::Unmounted {
            assert!(actions.is_empty() && next == State::Unmounted, "{ctx}");
        }
        // Every spawn has a start deadline.
        if actions.contains(&Action::SpawnActive) {
            assert!(
                actions.contains(&Action::ArmTimer {
                    timer: Timer::StartDeadline,
                    after_ms: START_DEADLINE_MS
                }),
                "{ctx}"
            );
        }
        // Promotion needs a standby process.
        if actions.contains(&Action::PromoteStandby) {
            let standby = match state {
                State::Adopting { standby, .. } | State::Serving { standby, .. } => standby,
                State::Upgrading {
                    phase: crate::lifecycle::upgrade::Phase::Quiescing { incoming: true },
                    ..
                } => Standby::Ready,
                State::Upgrading {
                    phase: crate::lifecycle::upgrade::Phase::Spawning,
                    ..
                } => Standby::Launched,
                _ => Standby::None,
            };
            assert!(standby.is_alive(), "{ctx}");
        }
        // Backoff never exceeds its bound.
        for action in &actions {
            if let Action::ArmTimer { after_ms, .. } = action {
                assert!(
                    *after_ms <= START_DEADLINE_MS.max(STOP_DEADLINE_MS),
                    "{ctx}"
                );
            }
        }
    }
}

#[test]
fn ready_standby_takes_over_with_resend_at_once() {
    let state = State::Serving {
        standby: Standby::Ready,
        failures: 0,
        stable: true,
    };
    let (next, actions) = step(state, Event::ActiveExited(death(Cause::Signal(9))), &POLICY);
    assert_eq!(
        next,
        State::Adopting {
            attempt: Attempt::Restart,
            standby: Standby::Planned,
            failures: 0
        }
    );
    let promote = actions
        .iter()
        .position(|a| *a == Action::PromoteStandby)
        .expect("promote");
    assert_eq!(
        actions[promote + 1],
        Action::SendAdopt {
            unanswered: Unanswered::Resend
        }
    );
    assert!(actions.contains(&Action::ArmTimer {
        timer: Timer::StandbySpawn,
        after_ms: STANDBY_DELAY_MS
    }));
    let (next, actions) = step(next, Event::ActiveServing, &POLICY);
    assert!(matches!(
        next,
        State::Serving {
            standby: Standby::Planned,
            ..
        }
    ));
    assert!(actions.contains(&Action::AnnounceServing));
}

#[test]
fn first_generation_is_adopted_without_resend_and_failure_fails_the_mount() {
    let (state, actions) = start();
    assert_eq!(actions[0], Action::SpawnActive);
    let (state, actions) = step(state, Event::ActiveConnected, &POLICY);
    assert_eq!(
        actions,
        vec![Action::SendAdopt {
            unanswered: Unanswered::Leave
        }]
    );
    let dead = death(Cause::Exit(2));
    let (state, actions) = step(state, Event::ActiveExited(dead), &POLICY);
    assert_eq!(state, State::Unmounted);
    assert!(actions.contains(&Action::FailMount(dead)));
    assert_eq!(actions.last(), Some(&Action::Unmount));
}

#[test]
fn crash_loop_backs_off_and_gives_up_after_the_limit() {
    let policy = Policy {
        standby: false,
        give_up_after: Some(4),
    };
    let mut state = State::Serving {
        standby: Standby::None,
        failures: 0,
        stable: false,
    };
    let mut delays = Vec::new();
    for _ in 0..4 {
        let (next, actions) = step(state, Event::ActiveExited(death(Cause::Exit(1))), &policy);
        state = next;
        if let State::GaveUp { failures } = state {
            assert_eq!(failures, 4);
            assert!(actions.contains(&Action::ReportGaveUp));
            break;
        }
        let Some(Action::ArmTimer { after_ms, .. }) = actions.iter().find(|a| {
            matches!(
                a,
                Action::ArmTimer {
                    timer: Timer::Backoff,
                    ..
                }
            )
        }) else {
            panic!("no backoff in {actions:?}");
        };
        delays.push(*after_ms);
        let (next, actions) = step(state, Event::Timer(Timer::Backoff), &policy);
        assert!(actions.contains(&Action::SpawnActive));
        let (next, _) = step(next, Event::ActiveConnected, &policy);
        state = next;
    }
    assert_eq!(delays, vec![50, 100, 200]);
    assert!(matches!(state, State::GaveUp { .. }));
    let (state, actions) = step(state, Event::UmountRequested, &policy);
    assert_eq!((state, actions), (State::Unmounted, vec![Action::Unmount]));
}

#[test]
fn backoff_is_bounded() {
    assert_eq!(backoff_ms(0), 0);
    assert_eq!(backoff_ms(1), BACKOFF_BASE_MS);
    assert_eq!(backoff_ms(6), 1_600);
    assert_eq!(backoff_ms(7), BACKOFF_MS_MAX);
    assert_eq!(backoff_ms(u32::MAX), BACKOFF_MS_MAX);
}

#[test]
fn stable_generation_death_restarts_cold_at_once_without_standby() {
    let policy = Policy {
        standby: false,
        give_up_after: None,
    };
    let state = State::Serving {
        standby: Standby::None,
        failures: 0,
        stable: true,
    };
    let (next, actions) = step(state, Event::ActiveExited(death(Cause::Oom)), &policy);
    assert_eq!(
        next,
        State::Launching {
            attempt: Attempt::Restart,
            failures: 0
        }
    );
    assert!(actions.contains(&Action::SpawnActive));
    let (_, actions) = step(next, Event::ActiveConnected, &policy);
    assert_eq!(
        actions,
        vec![Action::SendAdopt {
            unanswered: Unanswered::Resend
        }]
    );
}

#[test]
fn launched_standby_becomes_the_cold_start() {
    let state = State::Serving {
        standby: Standby::Launched,
        failures: 0,
        stable: true,
    };
    let (next, actions) = step(state, Event::ActiveExited(death(Cause::Signal(9))), &POLICY);
    assert_eq!(
        next,
        State::Launching {
            attempt: Attempt::Restart,
            failures: 0
        }
    );
    assert!(actions.contains(&Action::PromoteStandby));
    assert!(!actions.contains(&Action::SpawnActive));
}

#[test]
fn umount_terminates_the_generation_kills_the_standby_and_unmounts_last() {
    let state = State::Serving {
        standby: Standby::Ready,
        failures: 0,
        stable: true,
    };
    let (state, actions) = step(state, Event::UmountRequested, &POLICY);
    assert!(actions.contains(&Action::TerminateActive));
    assert!(actions.contains(&Action::KillStandby));
    let (state, actions) = step(state, Event::Timer(Timer::StopDeadline), &POLICY);
    assert_eq!(actions, vec![Action::KillActive]);
    let (state, actions) = step(
        state,
        Event::StandbyExited(death(Cause::Signal(9))),
        &POLICY,
    );
    assert!(actions.is_empty());
    let (state, actions) = step(state, Event::ActiveExited(death(Cause::Exit(0))), &POLICY);
    assert_eq!(state, State::Unmounted);
    assert_eq!(actions.last(), Some(&Action::Unmount));
}

#[test]
fn a_resumed_mount_resends_and_backs_off_instead_of_failing() {
    let (state, actions) = resume();
    assert_eq!(
        state,
        State::Launching {
            attempt: Attempt::Restart,
            failures: 0
        }
    );
    assert_eq!(actions[0], Action::SpawnActive);
    let (_, actions) = step(state, Event::ActiveConnected, &POLICY);
    assert_eq!(
        actions,
        vec![Action::SendAdopt {
            unanswered: Unanswered::Resend
        }]
    );
    let (next, actions) = step(state, Event::ActiveExited(death(Cause::Exit(1))), &POLICY);
    assert!(
        matches!(next, State::BackingOff { failures: 1 }),
        "{next:?}"
    );
    assert!(!actions.iter().any(|a| matches!(a, Action::FailMount(_))));
}
