//! The scenarios of each profile and their seeded fault schedules. A
//! scenario is data: supervisor options, workloads, a fault plan; the
//! schedule is a pure function of (scenario, seed, duration), so rerunning
//! with `--seed` reproduces it. New faults (planned upgrades, supervisor
//! kills) are a new [`Fault`] variant, its injection in `faults.rs`, and a
//! scenario here.

use std::time::Duration;

use serde::Serialize;

use super::rng::Rng;
use super::worker::Kind;

/// One fault at one time.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL of the serving generation (pid from `fsctl status --json`).
    KillGeneration,
    /// Lower the serving generation's cgroup memory limit to just above its
    /// usage and write a large file: the kernel OOM-kills it.
    OomKill,
    /// A named fault point: generation `generation` kills itself at the
    /// `nth` time it reaches `point` for `opcode` (armed through
    /// `BATON_FAULT` when the supervisor starts).
    NamedPoint {
        /// `after-read`, `after-commit`, `during-upload` or `during-clear`.
        point: String,
        /// A FUSE opcode name, or any.
        opcode: Option<String>,
        /// Which occurrence.
        nth: u64,
        /// Which generation.
        generation: u64,
    },
    /// The staging dir is a tmpfs of `tmpfs_bytes` from the start: writes
    /// past it must fail with ENOSPC, everything before must stay intact.
    FullStagingDisk {
        /// Its size.
        tmpfs_bytes: u64,
    },
    /// A planned upgrade (`fsctl upgrade`) to the other of two copies of
    /// the fsclient binary.
    Upgrade,
    /// `fsctl upgrade-supervisor` to the other of two copies of the
    /// fs-supervisor binary (re-exec in place, mounts kept).
    SupervisorUpgrade,
    /// SIGKILL of fs-supervisor, then a new one on the same state dir.
    SupervisorKill,
    /// A successor fs-supervisor starts beside the serving one, which then
    /// gets SIGTERM and hands the mount over (a DaemonSet rollout).
    SupervisorHandover,
    /// The object store is unreachable for `duration_ms`.
    StorageOutage {
        /// Outage length.
        duration_ms: u64,
    },
}

/// A fault at `at_ms` after the workloads started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scheduled {
    /// Milliseconds after the start of the workloads.
    pub at_ms: u64,
    /// What.
    #[serde(flatten)]
    pub fault: Fault,
}

/// How a scenario's faults are planned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plan {
    /// No scheduled faults (the environment injects them).
    None,
    /// A small tmpfs staging dir (armed at start).
    FullStaging,
    /// SIGKILLs `min_ms..=max_ms` apart.
    Kills { min_ms: u64, max_ms: u64 },
    /// Planned upgrades `min_ms..=max_ms` apart.
    Upgrades { min_ms: u64, max_ms: u64 },
    /// Supervisor upgrades, kills and handovers to a successor (in turn)
    /// `min_ms..=max_ms` apart.
    SupervisorUpgrades { min_ms: u64, max_ms: u64 },
    /// One OOM kill every `every_ms`.
    Ooms { every_ms: u64 },
    /// One named point in generation 1, opcode and occurrence seeded.
    Point { point: &'static str },
    /// Outages of `min_ms..=max_ms`, `gap_ms` apart on average.
    Outages {
        min_ms: u64,
        max_ms: u64,
        gap_ms: u64,
    },
}

/// One scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name (`kill-warm`).
    pub name: &'static str,
    /// How long the workloads run.
    pub duration: Duration,
    /// Extra fs-supervisor arguments.
    pub supervisor_args: Vec<String>,
    /// `BATON_STORAGE_FAULT` value (`{outage}` is replaced by the outage file).
    pub storage_fault: Option<String>,
    /// tmpfs staging dir of this size.
    pub staging_tmpfs_bytes: Option<u64>,
    /// Workloads: kind and process count.
    pub workers: Vec<(Kind, usize)>,
    /// Errno names the fault must produce (and must be seen).
    pub expected_errors: Vec<&'static str>,
    /// The fault plan.
    pub plan: Plan,
    /// Large files and their size.
    pub big_files: usize,
    /// Bytes per large file.
    pub big_bytes: u64,
    /// Bytes per writer / mmap file.
    pub file_bytes: u64,
    /// Bytes the filler or pressure worker writes per file.
    pub bulk_bytes: u64,
}

/// The opcodes a named point is armed for, by point: fsclient hits
/// `after-read` only for LOOKUP and the exactly-once mutations (never for
/// WRITE, READ or FSYNC), so only those are drawn.
fn point_opcodes(point: &str) -> &'static [&'static str] {
    match point {
        "after-read" => &[
            "create", "mkdir", "rename", "link", "unlink", "setxattr", "tmpfile",
        ],
        "after-commit" => &[
            "create", "mkdir", "rename", "link", "unlink", "rmdir", "setxattr", "tmpfile",
        ],
        _ => &[],
    }
}

impl Scenario {
    /// The fault schedule for `seed`. Pure.
    pub fn schedule(&self, seed: u64) -> Vec<Scheduled> {
        let mut rng = Rng::new(seed, 0xFA17);
        let end_ms = self.duration.as_millis() as u64;
        let mut out = Vec::new();
        match self.plan {
            Plan::None => {}
            Plan::FullStaging => {
                if let Some(tmpfs_bytes) = self.staging_tmpfs_bytes {
                    out.push(Scheduled {
                        at_ms: 0,
                        fault: Fault::FullStagingDisk { tmpfs_bytes },
                    });
                }
            }
            Plan::Kills { min_ms, max_ms } => {
                let mut at = rng.range(min_ms / 2, max_ms);
                while at + 500 < end_ms {
                    out.push(Scheduled {
                        at_ms: at,
                        fault: Fault::KillGeneration,
                    });
                    at += rng.range(min_ms, max_ms);
                }
            }
            Plan::Upgrades { min_ms, max_ms } => {
                let mut at = rng.range(min_ms / 2, max_ms);
                while at + 1000 < end_ms {
                    out.push(Scheduled {
                        at_ms: at,
                        fault: Fault::Upgrade,
                    });
                    at += rng.range(min_ms, max_ms);
                }
            }
            Plan::SupervisorUpgrades { min_ms, max_ms } => {
                let mut at = rng.range(min_ms / 2, max_ms);
                while at + 1000 < end_ms {
                    let fault = match out.len() % 3 {
                        0 => Fault::SupervisorUpgrade,
                        1 => Fault::SupervisorKill,
                        _ => Fault::SupervisorHandover,
                    };
                    out.push(Scheduled { at_ms: at, fault });
                    at += rng.range(min_ms, max_ms);
                }
            }
            Plan::Ooms { every_ms } => {
                let mut at = rng.range(every_ms / 4, every_ms / 2);
                while at + 1000 < end_ms {
                    out.push(Scheduled {
                        at_ms: at,
                        fault: Fault::OomKill,
                    });
                    at += every_ms;
                }
            }
            Plan::Point { point } => {
                let opcodes = point_opcodes(point);
                let opcode = (!opcodes.is_empty())
                    .then(|| opcodes[rng.below(opcodes.len() as u64) as usize].to_string());
                out.push(Scheduled {
                    at_ms: 0,
                    fault: Fault::NamedPoint {
                        point: point.to_string(),
                        opcode,
                        nth: rng.range(1, 5),
                        generation: 1,
                    },
                });
            }
            Plan::Outages {
                min_ms,
                max_ms,
                gap_ms,
            } => {
                let mut at = rng.range(gap_ms / 2, gap_ms);
                while at + max_ms + 500 < end_ms {
                    let duration_ms = rng.range(min_ms, max_ms);
                    out.push(Scheduled {
                        at_ms: at,
                        fault: Fault::StorageOutage { duration_ms },
                    });
                    at += duration_ms + rng.range(gap_ms / 2, gap_ms * 3 / 2);
                }
            }
        }
        out
    }
}

const MIB: u64 = 1 << 20;

fn base(name: &'static str, seconds: u64, big: bool) -> Scenario {
    Scenario {
        name,
        duration: Duration::from_secs(seconds),
        supervisor_args: Vec::new(),
        storage_fault: None,
        staging_tmpfs_bytes: None,
        workers: vec![
            (Kind::Reader, 2),
            (Kind::Loader, 3),
            (Kind::Writer, 2),
            (Kind::Churn, 2),
            (Kind::Mmap, 1),
        ],
        expected_errors: Vec::new(),
        plan: Plan::None,
        big_files: if big { 3 } else { 2 },
        big_bytes: if big { 128 * MIB } else { 8 * MIB },
        file_bytes: if big { 4 * MIB } else { MIB },
        bulk_bytes: 128 * MIB,
    }
}

/// The scenarios of `profile`, each given a share of `total` (the soak's
/// `--duration`); None for an unknown profile.
pub fn profile(name: &str, total: Option<Duration>) -> Option<Vec<Scenario>> {
    // kill-warm, kill-cold (soak only), oom, storage-flaky, storage-outage,
    // staging-full, the four named points, upgrades, supervisor upgrades.
    let (big, seconds): (bool, [u64; 12]) = match name {
        "ci" => (false, [16, 0, 8, 10, 10, 10, 6, 6, 6, 6, 10, 12]),
        "soak" => (true, [25, 15, 10, 10, 10, 10, 5, 5, 5, 5, 15, 10]),
        _ => return None,
    };
    let weights_sum: u64 = seconds.iter().sum();
    let share = |i: usize| match total {
        Some(total) => (total.as_secs() * seconds[i] / weights_sum).max(5),
        None => seconds[i],
    };
    let mut kill_warm = base("kill-warm", share(0), big);
    kill_warm.plan = Plan::Kills {
        min_ms: 800,
        max_ms: 2500,
    };
    let mut kill_cold = base("kill-cold", share(1), big);
    kill_cold.supervisor_args = vec!["--no-standby".into()];
    kill_cold.plan = Plan::Kills {
        min_ms: 1000,
        max_ms: 3000,
    };
    let mut oom = base("oom", share(2), big);
    oom.supervisor_args = vec!["--no-standby".into(), "--memory-max".into(), "1G".into()];
    oom.plan = Plan::Ooms { every_ms: 8_000 };
    let mut flaky = base("storage-flaky", share(3), big);
    flaky.storage_fault = Some("delay_ms=10,error_rate=0.05".into());
    flaky.plan = Plan::Kills {
        min_ms: 2500,
        max_ms: 4000,
    };
    let mut outage = base("storage-outage", share(4), big);
    outage.storage_fault = Some("delay_ms=2,unreachable_file={outage}".into());
    outage.plan = Plan::Outages {
        min_ms: 100,
        max_ms: 250,
        gap_ms: 1500,
    };
    let mut full = base("staging-full", share(5), big);
    full.staging_tmpfs_bytes = Some(if big { 64 * MIB } else { 24 * MIB });
    full.workers = vec![
        (Kind::Reader, 1),
        (Kind::Loader, 1),
        (Kind::Writer, 2),
        (Kind::Filler, 1),
    ];
    full.expected_errors = vec!["ENOSPC"];
    full.plan = Plan::FullStaging;
    let points = [
        "after-read",
        "after-commit",
        "during-upload",
        "during-clear",
    ];
    let names = [
        "point-after-read",
        "point-after-commit",
        "point-during-upload",
        "point-during-clear",
    ];
    let mut scenarios = vec![kill_warm];
    if name == "soak" {
        scenarios.push(kill_cold);
    }
    scenarios.extend([oom, flaky, outage, full]);
    for (i, (point, scenario_name)) in points.iter().zip(names).enumerate() {
        let mut s = base(scenario_name, share(6 + i), big);
        s.plan = Plan::Point { point };
        scenarios.push(s);
    }
    let mut upgrade = base("upgrade", share(10), big);
    upgrade.plan = Plan::Upgrades {
        min_ms: 1500,
        max_ms: 3000,
    };
    scenarios.push(upgrade);
    let mut supervisor = base("supervisor", share(11), big);
    supervisor.plan = Plan::SupervisorUpgrades {
        min_ms: 1500,
        max_ms: 3000,
    };
    scenarios.push(supervisor);
    Some(scenarios)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        for scenario in profile("ci", None).unwrap_or_default() {
            assert_eq!(
                scenario.schedule(42),
                scenario.schedule(42),
                "{}",
                scenario.name
            );
        }
        let kills = profile("ci", None).unwrap_or_default().remove(0);
        assert_ne!(kills.schedule(1), kills.schedule(2));
        assert!(!kills.schedule(1).is_empty());
    }

    #[test]
    fn soak_shares_the_duration() {
        let scenarios = profile("soak", Some(Duration::from_secs(1800))).unwrap_or_default();
        let total: u64 = scenarios.iter().map(|s| s.duration.as_secs()).sum();
        assert!((1700..=1800).contains(&total), "{total}");
        assert!(profile("nope", None).is_none());
    }
}
