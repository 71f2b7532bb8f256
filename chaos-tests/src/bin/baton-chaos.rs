//! `baton-chaos`: runs the fault-injection scenarios of a profile, prints a
//! table and writes the verdict as JSON. Exit status 0 when every scenario
//! passed, 1 when one failed, 2 on a usage error.
//!
//! `baton-chaos --profile ci --json chaos.json`
//! `baton-chaos --profile soak --duration 30m --seed 7`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::chaos::report::{failure_details, table, RunReport};
use chaos_tests::chaos::runner::run_scenario;
use chaos_tests::chaos::scenario::profile;
use chaos_tests::chaos::worker::{self, WorkerArgs};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton-chaos",
    about = "Fault-injection scenarios on real Baton mounts: kill -9, OOM, fault points, storage faults, a full staging disk",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// `ci` (about two minutes) or `soak` (use with --duration).
    #[arg(long, default_value = "ci")]
    profile: String,
    /// The seed of workloads and fault schedules [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// Total run time, shared by the scenarios (e.g. 30m, 600s).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Write the verdict as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only these scenarios (repeatable).
    #[arg(long)]
    scenario: Vec<String>,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Subcommand)]
enum Sub {
    /// (internal) one workload process on a mount.
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// `30m`, `600s`, `2h` or plain seconds. Pure.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: use e.g. 30m, 600s or 2h"))?;
    let seconds = match unit {
        "" | "s" => value,
        "m" => value * 60,
        "h" => value * 3600,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use s, m or h)")),
    };
    Ok(Duration::from_secs(seconds))
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if let Some(Sub::Worker(args)) = cli.command {
        return Ok(ExitCode::from(worker::run(args)? as u8));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal, never in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_000)
            .unwrap_or(1)
    });
    let Some(mut scenarios) = profile(&cli.profile, cli.duration) else {
        bail!("unknown profile {:?}: use ci or soak", cli.profile);
    };
    if !cli.scenario.is_empty() {
        let known: Vec<&str> = scenarios.iter().map(|s| s.name).collect();
        if let Some(bad) = cli.scenario.iter().find(|n| !known.contains(&n.as_str())) {
            bail!("unknown scenario {bad:?}: the profile has {known:?}");
        }
        scenarios.retain(|s| cli.scenario.iter().any(|n| n == s.name));
    }
    println!(
        "baton-chaos: profile {} seed {seed}: {} scenarios ({} s of workload)",
        cli.profile,
        scenarios.len(),
        scenarios.iter().map(|s| s.duration.as_secs()).sum::<u64>()
    );
    let mut reports = Vec::new();
    for (tag, scenario) in scenarios.iter().enumerate() {
        let report = run_scenario(scenario, seed, tag);
        println!(
            "  {:<20} {} ({} faults, {} failed syscalls, {} lost, {} corrupt bytes)",
            report.name,
            if report.passed { "pass" } else { "FAIL" },
            report.faults_injected,
            report.failed_syscalls,
            report.lost_bytes,
            report.corrupt_bytes
        );
        reports.push(report);
    }
    let run = RunReport {
        tool: "baton-chaos",
        profile: cli.profile.clone(),
        seed,
        passed: reports.iter().all(|r| r.passed),
        scenarios: reports,
    };
    print!("{}", table(&run));
    for s in run.scenarios.iter().filter(|s| !s.passed) {
        print!("{}", failure_details(s, &run.profile));
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_vec_pretty(&run)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if run.passed {
        ExitCode::SUCCESS
    } else {
        println!("baton-chaos: FAILED (seed {seed})");
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("baton-chaos: {err:#}");
            ExitCode::from(2)
        }
    }
}
