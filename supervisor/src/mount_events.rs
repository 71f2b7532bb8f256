//! What operators are told about a mount (logged, and published as
//! Kubernetes Events with `--kubernetes`): a generation crashed or was
//! OOM-killed, the mount recovered, a planned upgrade succeeded or rolled
//! back, or restarts were given up. Derived by comparing
//! two successive status snapshots, so it needs no hook in the lifecycle
//! machine. Pure.

use std::path::PathBuf;

use upgrade_protocol::MountStatus;

/// The kinds of mount events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountEventKind {
    /// A generation died (exit or signal).
    Crashed,
    /// A generation was killed by the OOM killer.
    OomKilled,
    /// A new generation serves after a death.
    Recovered,
    /// A planned upgrade (`fsctl upgrade`) replaced the generation.
    Upgraded,
    /// A planned upgrade failed and was rolled back.
    UpgradeRolledBack,
    /// Restarts stopped (`--give-up-after`).
    GaveUp,
}

impl MountEventKind {
    /// A short CamelCase reason (Kubernetes `reason`).
    pub fn reason(self) -> &'static str {
        match self {
            MountEventKind::Crashed => "BatonGenerationCrashed",
            MountEventKind::OomKilled => "BatonGenerationOOMKilled",
            MountEventKind::Recovered => "BatonMountRecovered",
            MountEventKind::Upgraded => "BatonGenerationUpgraded",
            MountEventKind::UpgradeRolledBack => "BatonUpgradeRolledBack",
            MountEventKind::GaveUp => "BatonMountGaveUp",
        }
    }

    /// Whether operators should look (Kubernetes `Warning` vs `Normal`).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            MountEventKind::Crashed
                | MountEventKind::OomKilled
                | MountEventKind::GaveUp
                | MountEventKind::UpgradeRolledBack
        )
    }
}

/// One event on one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEvent {
    /// What happened.
    pub kind: MountEventKind,
    /// The mount's id.
    pub mount_id: String,
    /// Its mountpoint.
    pub mountpoint: PathBuf,
    /// Its volume.
    pub volume: String,
    /// The generation serving (or starting) after it.
    pub generation: u64,
    /// A sentence for people.
    pub message: String,
}

/// The events between two snapshots (mounts matched by id; a mount that
/// appears or disappears has no event). Pure.
pub fn diff(before: &[MountStatus], after: &[MountStatus]) -> Vec<MountEvent> {
    let mut events = Vec::new();
    for now in after {
        let Some(was) = before.iter().find(|b| b.mount_id == now.mount_id) else {
            continue;
        };
        let event = |kind, message: String| MountEvent {
            kind,
            mount_id: now.mount_id.clone(),
            mountpoint: now.mountpoint.clone(),
            volume: now.volume.clone(),
            generation: now.generation,
            message,
        };
        let cause = now
            .last_recovery
            .as_ref()
            .map(|r| format!("generation {} {}", r.died_generation, r.cause))
            .unwrap_or_else(|| "a generation died".into());
        let died =
            now.restarts.exit + now.restarts.signal > was.restarts.exit + was.restarts.signal;
        if died {
            events.push(event(MountEventKind::Crashed, cause.clone()));
        }
        if now.restarts.oom > was.restarts.oom {
            events.push(event(MountEventKind::OomKilled, cause.clone()));
        }
        let recovered = now
            .last_recovery
            .as_ref()
            .filter(|r| r.next_generation.is_some());
        let recovered_before = was
            .last_recovery
            .as_ref()
            .filter(|r| r.next_generation.is_some());
        if let Some(r) = recovered.filter(|r| Some(r) != recovered_before.as_ref()) {
            events.push(event(
                MountEventKind::Recovered,
                format!(
                    "generation {} serves {} after generation {} {} ({} µs, {})",
                    r.next_generation.unwrap_or(now.generation),
                    now.mountpoint.display(),
                    r.died_generation,
                    r.cause,
                    r.takeover_us.unwrap_or(0),
                    if r.warm { "warm standby" } else { "cold start" }
                ),
            ));
        }
        // Each upgrade ends with a new `last_upgrade` report.
        if let Some(report) = now
            .last_upgrade
            .as_ref()
            .filter(|r| Some(*r) != was.last_upgrade.as_ref())
        {
            let kind = if report.ok {
                MountEventKind::Upgraded
            } else {
                MountEventKind::UpgradeRolledBack
            };
            events.push(event(
                kind,
                format!(
                    "{}: generation {} -> {} on {} ({})",
                    report.outcome,
                    report.from_generation,
                    report.generation,
                    now.mountpoint.display(),
                    report.binary.display()
                ),
            ));
        }
        if now.gave_up && !was.gave_up {
            events.push(event(
                MountEventKind::GaveUp,
                format!(
                    "gave up restarting after {} failed starts; applications on {} wait until `fsctl umount`",
                    now.consecutive_failures,
                    now.mountpoint.display()
                ),
            ));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use upgrade_protocol::{NegotiatedInit, Recovery, Restarts};

    fn serving(generation: u64) -> MountStatus {
        MountStatus {
            persistent: false,
            mount_id: "m".into(),
            mountpoint: "/mnt/m".into(),
            volume: "v".into(),
            state: "serving".into(),
            generation,
            pid: Some(1),
            standby_pid: None,
            restarts: Restarts::default(),
            uptime_s: 0,
            generation_uptime_s: 0,
            consecutive_failures: 0,
            gave_up: false,
            read_only_reason: None,
            last_upgrade: None,
            client_binary: "/usr/bin/fsclient".into(),
            requests_recovered: 0,
            last_recovery: None,
            connection_id: 1,
            counters: None,
            incidents: Vec::new(),
            cgroup: None,
            init: NegotiatedInit {
                major: 7,
                minor: 45,
                kernel_minor: 45,
                flags: 0,
                max_readahead: 0,
                max_write: 0,
                max_pages: 0,
                max_background: 0,
                congestion_threshold: 0,
                time_gran: 1,
            },
        }
    }

    fn kinds(events: &[MountEvent]) -> Vec<MountEventKind> {
        events.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn a_crash_then_a_recovery_are_two_events_and_nothing_repeats() {
        let a = serving(1);
        let mut b = serving(1);
        b.state = "launching".into();
        b.restarts.signal = 1;
        b.last_recovery = Some(Recovery {
            died_generation: 1,
            cause: "killed by signal 9".into(),
            at_unix_ms: 0,
            next_generation: None,
            takeover_us: None,
            warm: false,
        });
        let crashed = diff(&[a], std::slice::from_ref(&b));
        assert_eq!(kinds(&crashed), vec![MountEventKind::Crashed]);
        assert!(crashed[0].message.contains("killed by signal 9"));
        let mut c = b.clone();
        c.state = "serving".into();
        c.generation = 2;
        if let Some(r) = c.last_recovery.as_mut() {
            r.next_generation = Some(2);
            r.takeover_us = Some(900);
        }
        let recovered = diff(std::slice::from_ref(&b), std::slice::from_ref(&c));
        assert_eq!(kinds(&recovered), vec![MountEventKind::Recovered]);
        assert!(
            recovered[0].message.contains("900 µs"),
            "{}",
            recovered[0].message
        );
        assert!(diff(std::slice::from_ref(&c), std::slice::from_ref(&c)).is_empty());
    }

    #[test]
    fn oom_upgrade_and_give_up_are_told_apart() {
        let a = serving(3);
        let mut oom = serving(3);
        oom.restarts.oom = 1;
        assert_eq!(
            kinds(&diff(std::slice::from_ref(&a), &[oom])),
            vec![MountEventKind::OomKilled]
        );
        let mut upgraded = serving(4);
        upgraded.last_upgrade = Some(upgrade_protocol::UpgradeReport {
            mountpoint: "/mnt/m".into(),
            ok: true,
            outcome: "upgraded".into(),
            from_generation: 3,
            serving_died: false,
            generation: 4,
            binary: "/usr/bin/fsclient-2".into(),
            journaled: 0,
            stall_us: Some(900),
            elapsed_ms: 50,
            at_unix_ms: 1,
            detail: None,
        });
        assert_eq!(
            kinds(&diff(
                std::slice::from_ref(&a),
                std::slice::from_ref(&upgraded)
            )),
            vec![MountEventKind::Upgraded]
        );
        let mut rolled_back = upgraded.clone();
        rolled_back.last_upgrade = rolled_back.last_upgrade.map(|mut r| {
            r.ok = false;
            r.at_unix_ms = 2;
            r
        });
        assert_eq!(
            kinds(&diff(&[upgraded], &[rolled_back])),
            vec![MountEventKind::UpgradeRolledBack]
        );
        // A generation change alone (no report) is not an upgrade.
        assert!(diff(std::slice::from_ref(&a), &[serving(4)]).is_empty());
        let mut gave_up = serving(3);
        gave_up.state = "gave_up".into();
        gave_up.gave_up = true;
        gave_up.restarts.exit = 3;
        assert_eq!(
            kinds(&diff(std::slice::from_ref(&a), &[gave_up])),
            vec![MountEventKind::Crashed, MountEventKind::GaveUp]
        );
        // A new mount has no event.
        assert!(diff(&[], &[serving(1)]).is_empty());
        assert!(MountEventKind::OomKilled.is_warning() && !MountEventKind::Recovered.is_warning());
    }
}
