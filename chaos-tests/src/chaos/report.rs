//! The verdict: one [`ScenarioReport`] per scenario (the counters other
//! tools read from `--json`), the pass rule, and the printed table.

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::FaultOutcome;
use super::scenario::Scheduled;
use super::stats::{Histogram, WorkerReport};

/// Stall quantiles of every timed syscall, in microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stall {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Maximum.
    pub max_us: u64,
}

impl Stall {
    /// From a histogram.
    pub fn of(h: &Histogram) -> Stall {
        Stall {
            p50_us: h.quantile_us(500),
            p99_us: h.quantile_us(990),
            p999_us: h.quantile_us(999),
            max_us: h.max_us,
        }
    }
}

/// Recovery times after faults that killed a generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovery {
    /// How many.
    pub count: u64,
    /// Median, injection to next generation serving (ms).
    pub p50_ms: u64,
    /// Maximum (ms).
    pub max_ms: u64,
    /// Median of the supervisor's takeover times (µs).
    pub takeover_p50_us: u64,
    /// Maximum takeover (µs).
    pub takeover_max_us: u64,
}

fn median(mut v: Vec<u64>) -> (u64, u64) {
    v.sort_unstable();
    (
        v.get(v.len() / 2).copied().unwrap_or(0),
        v.last().copied().unwrap_or(0),
    )
}

impl Recovery {
    /// From the fault outcomes.
    pub fn of(faults: &[FaultOutcome]) -> Recovery {
        let ms: Vec<u64> = faults.iter().filter_map(|f| f.recovery_ms).collect();
        let us: Vec<u64> = faults.iter().filter_map(|f| f.takeover_us).collect();
        let (p50_ms, max_ms) = median(ms.clone());
        let (takeover_p50_us, takeover_max_us) = median(us);
        Recovery {
            count: ms.len() as u64,
            p50_ms,
            max_ms,
            takeover_p50_us,
            takeover_max_us,
        }
    }
}

/// One scenario's verdict and measurements.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScenarioReport {
    /// Scenario name.
    pub name: String,
    /// The pass rule held.
    pub passed: bool,
    /// The seed (rerun with `--seed`).
    pub seed: u64,
    /// How long the workloads ran (ms).
    pub duration_ms: u64,
    /// Faults that took effect.
    pub faults_injected: u64,
    /// Failed syscalls not allowed by the scenario (must be 0).
    pub failed_syscalls: u64,
    /// The same, by errno.
    pub failed_syscalls_by_errno: BTreeMap<String, u64>,
    /// Errors the fault must produce (e.g. ENOSPC), by errno.
    pub expected_errors: BTreeMap<String, u64>,
    /// Acknowledged or known bytes that were missing (must be 0).
    pub lost_bytes: u64,
    /// Bytes that came back wrong (must be 0).
    pub corrupt_bytes: u64,
    /// Every tree checked equals its model.
    pub tree_matches_model: bool,
    /// Differences between trees and models.
    pub tree_mismatches: u64,
    /// Acknowledged bytes read back and compared at the end.
    pub acknowledged_bytes_verified: u64,
    /// Bytes read during the run and compared with known content.
    pub read_bytes_verified: u64,
    /// Operations by kind.
    pub ops: BTreeMap<String, u64>,
    /// Latency of every timed syscall.
    pub stall: Stall,
    /// Recovery after generation deaths.
    pub recovery: Recovery,
    /// The fault schedule (a pure function of the seed).
    pub fault_schedule: Vec<Scheduled>,
    /// What each fault did.
    pub faults: Vec<FaultOutcome>,
    /// Why the scenario failed (empty when it passed).
    pub failures: Vec<String>,
    /// The first failure messages of the workloads.
    pub messages: Vec<String>,
}

impl ScenarioReport {
    /// Folds the merged worker counters in and applies the pass rule.
    pub fn conclude(&mut self, merged: &WorkerReport, expected: &[&str], trees_checked: bool) {
        self.failed_syscalls_by_errno = merged.failed_syscalls.clone();
        self.failed_syscalls = merged.failed_syscalls.values().sum();
        self.expected_errors = merged.expected_errors.clone();
        self.lost_bytes = merged.lost_bytes;
        self.corrupt_bytes = merged.corrupt_bytes;
        self.tree_mismatches = merged.tree_mismatches;
        self.tree_matches_model = trees_checked && merged.tree_mismatches == 0;
        self.acknowledged_bytes_verified = merged.acknowledged_bytes_verified;
        self.read_bytes_verified = merged.read_bytes_verified;
        self.ops = merged.ops.clone();
        self.stall = Stall::of(&merged.latency);
        self.recovery = Recovery::of(&self.faults);
        self.faults_injected = self.faults.iter().filter(|f| f.ok).count() as u64;
        self.messages = merged.messages.clone();
        if self.failed_syscalls > 0 {
            self.failures.push(format!(
                "{} failed syscalls: {:?}",
                self.failed_syscalls, self.failed_syscalls_by_errno
            ));
        }
        if self.lost_bytes > 0 || self.corrupt_bytes > 0 {
            self.failures.push(format!(
                "{} lost and {} corrupt bytes",
                self.lost_bytes, self.corrupt_bytes
            ));
        }
        if !self.tree_matches_model {
            self.failures.push(format!(
                "the final tree differs from the model ({} differences{})",
                self.tree_mismatches,
                if trees_checked {
                    ""
                } else {
                    "; not every tree was compared"
                }
            ));
        }
        for errno in expected {
            if self.expected_errors.get(*errno).copied().unwrap_or(0) == 0 {
                self.failures
                    .push(format!("the fault never produced the expected {errno}"));
            }
        }
        for fault in self.faults.iter().filter(|f| !f.ok) {
            self.failures.push(format!(
                "fault at {} ms did not work: {}",
                fault.at_ms, fault.detail
            ));
        }
        if self.acknowledged_bytes_verified == 0 {
            self.failures.push(
                "no acknowledged bytes were verified (the workloads did nothing)".to_string(),
            );
        }
        self.passed = self.failures.is_empty();
    }
}

/// The whole run, as written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Always `baton-chaos`.
    pub tool: &'static str,
    /// The profile.
    pub profile: String,
    /// The seed.
    pub seed: u64,
    /// Every scenario passed.
    pub passed: bool,
    /// Per scenario.
    pub scenarios: Vec<ScenarioReport>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// The table printed after a run.
pub fn table(run: &RunReport) -> String {
    let mut out = format!(
        "baton-chaos --profile {} --seed {}\n{:<20} {:>4} {:>6} {:>6} {:>5} {:>7} {:>8} {:>9} {:>9} {:>8} {:>26} {:>14}\n",
        run.profile,
        run.seed,
        "scenario",
        "ok",
        "faults",
        "failed",
        "lost",
        "corrupt",
        "tree",
        "ack MiB",
        "read MiB",
        "ops",
        "stall ms p50/p99/p99.9/max",
        "recovery ms",
    );
    for s in &run.scenarios {
        let ops: u64 = s.ops.values().sum();
        out.push_str(&format!(
            "{:<20} {:>4} {:>6} {:>6} {:>5} {:>7} {:>8} {:>9} {:>9} {:>8} {:>26} {:>14}\n",
            s.name,
            if s.passed { "PASS" } else { "FAIL" },
            s.faults_injected,
            s.failed_syscalls,
            s.lost_bytes,
            s.corrupt_bytes,
            if s.tree_matches_model {
                "=model"
            } else {
                "DIFFERS"
            },
            mib(s.acknowledged_bytes_verified),
            mib(s.read_bytes_verified),
            ops,
            format!(
                "{}/{}/{}/{}",
                ms(s.stall.p50_us),
                ms(s.stall.p99_us),
                ms(s.stall.p999_us),
                ms(s.stall.max_us)
            ),
            format!(
                "{}/{} (n={})",
                s.recovery.p50_ms, s.recovery.max_ms, s.recovery.count
            ),
        ));
    }
    out
}

/// What to print for a failed scenario: seed, schedule, reasons, messages.
pub fn failure_details(s: &ScenarioReport, profile: &str) -> String {
    let mut out = format!(
        "FAILED {}: rerun with `baton-chaos --profile {profile} --seed {} --scenario {}`\n",
        s.name, s.seed, s.name
    );
    out.push_str("fault schedule:\n");
    for f in &s.faults {
        out.push_str(&format!(
            "  at {} ms ({}): {} -> {}\n",
            f.at_ms,
            f.wall_clock,
            serde_json::to_string(&f.fault).unwrap_or_default(),
            f.detail
        ));
    }
    if s.faults.is_empty() {
        for f in &s.fault_schedule {
            out.push_str(&format!(
                "  {}\n",
                serde_json::to_string(f).unwrap_or_default()
            ));
        }
    }
    for reason in &s.failures {
        out.push_str(&format!("  failure: {reason}\n"));
    }
    for m in &s.messages {
        out.push_str(&format!("  workload: {m}\n"));
    }
    if !s.expected_errors.is_empty() {
        out.push_str(&format!(
            "  expected errors seen: {:?}\n",
            s.expected_errors
        ));
    }
    out
}
