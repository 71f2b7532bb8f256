//! Running one scenario: start its supervisor (with the fault environment),
//! mount, write the large files, start the workload processes, inject the
//! schedule, stop the workloads (each verifies what it was acknowledged),
//! and fold everything into a [`ScenarioReport`]. The harness itself never
//! touches the mount: everything on it happens in child processes.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::faults::{self, FaultOutcome};
use super::report::ScenarioReport;
use super::scenario::{Fault, Scenario};
use super::stats::WorkerReport;
use super::supervisor::{binary, Supervisor, SupervisorOptions};
use super::worker::Kind;
use crate::mount_guard::ChildGuard;

/// How long workloads may take to stop and verify after the stop file.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long writing the large files may take.
pub const PREPARE_TIMEOUT: Duration = Duration::from_secs(600);

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Prepare => "prepare",
        Kind::Reader => "reader",
        Kind::Loader => "loader",
        Kind::Writer => "writer",
        Kind::Churn => "churn",
        Kind::Mmap => "mmap",
        Kind::Filler => "filler",
        Kind::Pressure => "pressure",
    }
}

struct Worker {
    name: String,
    kind: Kind,
    child: ChildGuard,
    result: PathBuf,
    log: PathBuf,
}

/// What starting a workload process needs.
struct Spawner<'a> {
    scenario: &'a Scenario,
    seed: u64,
    mnt: PathBuf,
    dir: PathBuf,
    stop_file: PathBuf,
}

impl Spawner<'_> {
    fn spawn(&self, kind: Kind, index: usize) -> anyhow::Result<Worker> {
        let name = format!("{}-{index}", kind_name(kind));
        let result = self.dir.join(format!("{name}.json"));
        let log = self.dir.join(format!("{name}.log"));
        let bytes = match kind {
            Kind::Filler | Kind::Pressure => self.scenario.bulk_bytes,
            _ => self.scenario.file_bytes,
        };
        let mut command = Command::new(binary("baton-chaos")?);
        command
            .arg("worker")
            .args(["--kind", kind_name(kind)])
            .arg("--mnt")
            .arg(&self.mnt)
            .args(["--index", &index.to_string()])
            .args(["--seed", &self.seed.to_string()])
            .arg("--stop-file")
            .arg(&self.stop_file)
            .arg("--result")
            .arg(&result)
            .args(["--big-files", &self.scenario.big_files.to_string()])
            .args(["--big-bytes", &self.scenario.big_bytes.to_string()])
            .args(["--file-bytes", &bytes.to_string()]);
        // The setup must not fail at all, whatever the scenario.
        if kind != Kind::Prepare {
            for errno in &self.scenario.expected_errors {
                command.args(["--expect", errno]);
            }
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting worker {name}"))?;
        Ok(Worker {
            name,
            kind,
            child: ChildGuard(child),
            result,
            log,
        })
    }
}

struct Run<'a> {
    spawner: Spawner<'a>,
    sup: Supervisor,
    workers: Vec<Worker>,
    failures: Vec<String>,
}

impl Run<'_> {
    fn spawn(&mut self, kind: Kind, index: usize) -> anyhow::Result<()> {
        let worker = self.spawner.spawn(kind, index)?;
        self.workers.push(worker);
        Ok(())
    }

    /// Waits for `worker` to exit and reads its report.
    fn collect(&mut self, mut worker: Worker, timeout: Duration) -> Option<WorkerReport> {
        let Some(status) = worker.child.wait_timeout(timeout) else {
            self.failures.push(format!(
                "worker {} did not finish within {timeout:?} after the stop (stalled on the mount?)",
                worker.name
            ));
            self.sup.abort_on_drop = true;
            // Its syscall may wait uninterruptibly for an answer that never
            // comes: abort the connection now, or dropping the worker (kill
            // and wait) would hang the harness.
            let _ = fuse_wire::abort_connection(&self.sup.mnt);
            return None;
        };
        match std::fs::read(&worker.result)
            .ok()
            .and_then(|b| serde_json::from_slice::<WorkerReport>(&b).ok())
        {
            Some(report) => Some(report),
            None => {
                let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
                self.failures.push(format!(
                    "worker {} ended ({status}) without a report: {}",
                    worker.name,
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                ));
                None
            }
        }
    }
}

fn point_env(fault: &Fault) -> Vec<(String, String)> {
    match fault {
        Fault::NamedPoint {
            point,
            opcode,
            nth,
            generation,
        } => {
            let mut spec = point.clone();
            if let Some(op) = opcode {
                spec.push_str(&format!("@{op}"));
            }
            spec.push_str(&format!("#{nth}"));
            vec![
                ("BATON_FAULT".to_string(), spec),
                ("BATON_FAULT_GENERATION".to_string(), generation.to_string()),
            ]
        }
        _ => Vec::new(),
    }
}

/// Runs `scenario` with `seed`; `tag` makes its cgroup name unique.
pub fn run_scenario(scenario: &Scenario, seed: u64, tag: usize) -> ScenarioReport {
    let mut report = ScenarioReport {
        name: scenario.name.to_string(),
        seed,
        fault_schedule: scenario.schedule(seed),
        ..ScenarioReport::default()
    };
    match run_inner(scenario, seed, tag, &mut report) {
        Ok(()) => {}
        Err(err) => {
            report.failures.push(format!("{err:#}"));
            report.passed = false;
        }
    }
    report
}

fn run_inner(
    scenario: &Scenario,
    seed: u64,
    tag: usize,
    report: &mut ScenarioReport,
) -> anyhow::Result<()> {
    let scratch = tempfile::Builder::new()
        .prefix("baton-chaos-outage-")
        .tempdir()?;
    let outage_file = scratch.path().join("outage");
    let mut env: Vec<(String, String)> = report
        .fault_schedule
        .iter()
        .flat_map(|s| point_env(&s.fault))
        .collect();
    if let Some(spec) = &scenario.storage_fault {
        let outage = outage_file.to_string_lossy();
        env.push((
            STORAGE_FAULT_ENV.to_string(),
            format!("{},seed={seed}", spec.replace("{outage}", &outage)),
        ));
    }
    let options = SupervisorOptions {
        args: scenario.supervisor_args.clone(),
        env,
        staging_tmpfs_bytes: scenario.staging_tmpfs_bytes,
    };
    let mut sup = Supervisor::start(&options, &format!("{tag}"))?;
    sup.mount()?;
    let spawner = Spawner {
        scenario,
        seed,
        mnt: sup.mnt.clone(),
        dir: sup.path(""),
        stop_file: sup.path("stop"),
    };
    let mut run = Run {
        spawner,
        sup,
        workers: Vec::new(),
        failures: Vec::new(),
    };
    let outcome = drive(&mut run, report, &outage_file);
    let _ = std::fs::remove_file(&outage_file);
    if let Err(err) = outcome {
        run.failures.push(format!("{err:#}"));
    }
    let _ = std::fs::write(&run.spawner.stop_file, b"");
    let mut merged = WorkerReport::default();
    let mut trees_checked = true;
    let workers = std::mem::take(&mut run.workers);
    // One deadline for all: a stalled mount must not cost it per worker.
    let deadline = Instant::now() + STOP_TIMEOUT;
    for worker in workers {
        let kind = worker.kind;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        if let Some(r) = run.collect(worker, left) {
            if matches!(kind, Kind::Writer | Kind::Churn) && !r.tree_checked {
                trees_checked = false;
            }
            merged.merge(&r);
        } else {
            trees_checked = false;
        }
    }
    report.failures.append(&mut run.failures);
    report.conclude(&merged, &scenario.expected_errors, trees_checked);
    if !report.passed {
        run.sup.abort_on_drop = report.failed_syscalls > 0 || run.sup.abort_on_drop;
        report.messages.push(run.sup.logs());
    }
    Ok(())
}

/// The variable baton-blocks reads its storage faults from.
const STORAGE_FAULT_ENV: &str = "BATON_STORAGE_FAULT";

/// Prepares the files, starts the workloads and runs the fault schedule.
fn drive(
    run: &mut Run<'_>,
    report: &mut ScenarioReport,
    outage_file: &std::path::Path,
) -> anyhow::Result<()> {
    run.spawn(Kind::Prepare, 0)?;
    let prepare = run.workers.remove(0);
    let prepared = run.collect(prepare, PREPARE_TIMEOUT);
    match prepared {
        Some(r) if r.failed_syscalls.is_empty() => {}
        Some(r) => anyhow::bail!("writing the large files failed: {:?}", r.messages),
        None => anyhow::bail!("writing the large files failed"),
    }
    let scenario = run.spawner.scenario;
    for (kind, count) in scenario.workers.clone() {
        for index in 0..count {
            run.spawn(kind, index)?;
        }
    }
    // Two copies of the fsclient binary: upgrades alternate between them.
    let binaries = faults::Binaries {
        fsclient: [binary("fsclient")?, run.spawner.dir.join("fsclient-b")],
        supervisor: [
            binary("fs-supervisor")?,
            run.spawner.dir.join("fs-supervisor-b"),
        ],
    };
    std::fs::copy(&binaries.fsclient[0], &binaries.fsclient[1]).context("copying fsclient")?;
    std::fs::copy(&binaries.supervisor[0], &binaries.supervisor[1])
        .context("copying fs-supervisor")?;
    let start = Instant::now();
    let end = start + scenario.duration;
    let mut pressure_count = 0;
    for scheduled in report.fault_schedule.clone() {
        let at = start + Duration::from_millis(scheduled.at_ms);
        if at >= end {
            break;
        }
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let at_ms = start.elapsed().as_millis() as u64;
        let mut spawned = Vec::new();
        let spawner = &run.spawner;
        let mut pressure = || -> anyhow::Result<()> {
            spawned.push(spawner.spawn(Kind::Pressure, pressure_count)?);
            pressure_count += 1;
            Ok(())
        };
        let outcome: FaultOutcome = faults::inject(
            &mut run.sup,
            &scheduled,
            at_ms,
            outage_file,
            end,
            &binaries,
            &mut pressure,
        );
        run.workers.extend(spawned);
        tracing::info!(scenario = scenario.name, at_ms, ok = outcome.ok, detail = %outcome.detail, "fault");
        report.faults.push(outcome);
    }
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    report.duration_ms = start.elapsed().as_millis() as u64;
    Ok(())
}
