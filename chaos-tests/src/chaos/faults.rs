//! Injecting one scheduled fault into a running scenario and measuring how
//! the mount recovered: SIGKILL of the serving generation, a real kernel
//! OOM kill through its cgroup's memory limit, waiting for a named fault
//! point to fire, and a storage outage window.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use serde_json::Value;

use super::scenario::{Fault, Scheduled};
use super::supervisor::{Supervisor, SERVE_TIMEOUT};

/// How long an OOM kill may take to happen once the limit is lowered.
pub const OOM_TIMEOUT: Duration = Duration::from_secs(30);
/// Headroom above current usage when the limit is lowered.
const OOM_HEADROOM_BYTES: u64 = 8 << 20;

/// Two copies of each binary, so upgrades really switch executables.
pub struct Binaries {
    /// fsclient and a copy.
    pub fsclient: [PathBuf; 2],
    /// fs-supervisor and a copy.
    pub supervisor: [PathBuf; 2],
}

/// What happened when a fault was injected.
#[derive(Debug, Clone, Serialize)]
pub struct FaultOutcome {
    /// When it was injected (ms after the workloads started).
    pub at_ms: u64,
    /// The fault.
    #[serde(flatten)]
    pub fault: Fault,
    /// UTC time of day of the injection.
    pub wall_clock: String,
    /// It took effect and the mount recovered.
    pub ok: bool,
    /// Details or the reason it did not work.
    pub detail: String,
    /// From injection until the next generation served (harness clock).
    pub recovery_ms: Option<u64>,
    /// The supervisor's takeover time for the death (for an upgrade: the
    /// application-visible stall it measured).
    pub takeover_us: Option<u64>,
}

fn restarts(status: &Value, cause: &str) -> u64 {
    status["restarts"][cause].as_u64().unwrap_or(0)
}

fn generation(status: &Value) -> anyhow::Result<(u64, i32)> {
    let generation = status["generation"]
        .as_u64()
        .context("no generation in fsctl status")?;
    let pid = status["pid"]
        .as_i64()
        .context("no serving pid in fsctl status")? as i32;
    Ok((generation, pid))
}

/// SIGKILLs the serving generation; waits for the next one.
fn kill_generation(sup: &Supervisor) -> anyhow::Result<(String, u64, Option<u64>)> {
    let status = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, pid) = generation(&status)?;
    let start = Instant::now();
    kill(Pid::from_raw(pid), Signal::SIGKILL)
        .with_context(|| format!("kill -9 of generation {generation} (pid {pid})"))?;
    let after = sup.wait_serving(generation + 1, SERVE_TIMEOUT)?;
    let recovery_ms = start.elapsed().as_millis() as u64;
    Ok((
        format!("generation {generation} (pid {pid}) killed"),
        recovery_ms,
        after["last_recovery"]["takeover_us"].as_u64(),
    ))
}

/// The memory limit file of a cgroup (v1 or v2).
fn limit_file(cgroup: &Path) -> PathBuf {
    if cgroup.join("memory.limit_in_bytes").exists() {
        cgroup.join("memory.limit_in_bytes")
    } else {
        cgroup.join("memory.max")
    }
}

/// Anonymous memory of a cgroup (what reclaim cannot drop), from memory.stat.
fn anon_bytes(cgroup: &Path) -> anyhow::Result<u64> {
    let path = cgroup.join("memory.stat");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(' ')?;
            matches!(key, "total_rss" | "anon").then(|| value.trim().parse().ok())?
        })
        .with_context(|| format!("no total_rss or anon in {}", path.display()))
}

/// Current usage of a cgroup (v1 or v2).
fn usage_bytes(cgroup: &Path) -> anyhow::Result<u64> {
    let path = if cgroup.join("memory.usage_in_bytes").exists() {
        cgroup.join("memory.usage_in_bytes")
    } else {
        cgroup.join("memory.current")
    };
    std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .parse()
        .with_context(|| format!("parsing {}", path.display()))
}

/// Lowers the serving generation's memory limit towards its anonymous
/// memory (page cache is reclaimed first), 30 % closer every 200 ms, while
/// `pressure` (a large write) makes it allocate; waits for the OOM kill and
/// the takeover.
fn oom_kill(
    sup: &Supervisor,
    pressure: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(String, u64, Option<u64>)> {
    let status = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, pid) = generation(&status)?;
    let ooms = restarts(&status, "oom");
    let cgroup = PathBuf::from(
        status["cgroup"]
            .as_str()
            .context("the generation has no cgroup (start the supervisor with --memory-max)")?,
    );
    let limit_file = limit_file(&cgroup);
    let anon = anon_bytes(&cgroup)?;
    let usage = usage_bytes(&cgroup)?;
    let start = Instant::now();
    pressure()?;
    let deadline = start + OOM_TIMEOUT;
    // From just above the current usage (always accepted) down towards the
    // anonymous memory, so the kernel reclaims the page cache first.
    let mut limit = usage + OOM_HEADROOM_BYTES;
    let mut lowest = u64::MAX;
    loop {
        // The kernel refuses (EBUSY, v1) a limit it cannot reclaim down to;
        // the next step tries again.
        if std::fs::write(&limit_file, limit.to_string()).is_ok() {
            lowest = lowest.min(limit);
        }
        let floor = anon / 2;
        limit = floor + (limit.saturating_sub(floor)) * 7 / 10;
        let step_end = Instant::now() + Duration::from_millis(200);
        while Instant::now() < step_end {
            let now = sup.status()?;
            if restarts(&now, "oom") > ooms {
                let after = sup.wait_serving(generation + 1, SERVE_TIMEOUT)?;
                return Ok((
                    format!("generation {generation} (pid {pid}) OOM-killed at a {lowest}-byte limit (anonymous memory {anon} B)"),
                    start.elapsed().as_millis() as u64,
                    after["last_recovery"]["takeover_us"].as_u64(),
                ));
            }
            if Instant::now() >= deadline || now["generation"].as_u64() > Some(generation) {
                let _ = std::fs::write(&limit_file, (1u64 << 40).to_string());
                bail!(
                    "generation {generation} was not OOM-killed within {OOM_TIMEOUT:?} (limit lowered to {lowest} B, anonymous memory {anon} B): {now}"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits until generation `g` died by a signal (the point fired) and the
/// next one serves, or `until` passes.
fn named_point(
    sup: &Supervisor,
    g: u64,
    until: Instant,
) -> anyhow::Result<(String, u64, Option<u64>)> {
    let start = Instant::now();
    loop {
        let status = sup.status()?;
        if restarts(&status, "signal") >= 1 {
            let after = sup.wait_serving(g + 1, SERVE_TIMEOUT)?;
            return Ok((
                format!(
                    "generation {g} killed itself at the point after {} ms",
                    start.elapsed().as_millis()
                ),
                after["last_recovery"]["takeover_us"].as_u64().unwrap_or(0) / 1000,
                after["last_recovery"]["takeover_us"].as_u64(),
            ));
        }
        if Instant::now() >= until {
            bail!("the fault point never fired (is BATON_FAULT supported by this fsclient?): {status}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A planned upgrade to the other copy of the fsclient binary.
fn upgrade(
    sup: &Supervisor,
    binaries: &[PathBuf; 2],
) -> anyhow::Result<(String, u64, Option<u64>)> {
    let status = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, _) = generation(&status)?;
    let current = status["client_binary"].as_str().map(PathBuf::from);
    let binary = if current.as_ref() == Some(&binaries[1]) {
        &binaries[0]
    } else {
        &binaries[1]
    };
    let start = Instant::now();
    let report = sup.upgrade(binary)?;
    let elapsed_ms = start.elapsed().as_millis() as u64;
    Ok((
        format!(
            "upgraded generation {generation} -> {} ({}), {} request(s) journaled, stall {} us",
            report["generation"],
            binary.display(),
            report["journaled"],
            report["stall_us"]
        ),
        elapsed_ms,
        report["stall_us"].as_u64(),
    ))
}

/// Re-executes the supervisor as the other copy of its binary; it takes its
/// mount back (replacing the generation) and serves on.
fn upgrade_supervisor(
    sup: &Supervisor,
    binaries: &[PathBuf; 2],
) -> anyhow::Result<(String, u64, Option<u64>)> {
    let before = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, pid) = generation(&before)?;
    let binary = if sup.supervisor_exe().as_ref() == Some(&binaries[1]) {
        &binaries[0]
    } else {
        &binaries[1]
    };
    let start = Instant::now();
    let printed = sup.upgrade_supervisor(binary)?;
    let after = sup.wait_serving(generation, SERVE_TIMEOUT)?;
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let (generation_after, pid_after) = self::generation(&after)?;
    Ok((
        format!(
            "supervisor re-executed as {}; generation {generation} (pid {pid}) -> {generation_after} (pid {pid_after}): {printed}",
            binary.display()
        ),
        elapsed_ms,
        None,
    ))
}

/// SIGKILLs the supervisor and starts it again on the same state dir and
/// socket; it takes the mount back from the live generation.
fn kill_supervisor(sup: &mut Supervisor) -> anyhow::Result<(String, u64, Option<u64>)> {
    let before = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, _) = generation(&before)?;
    let start = Instant::now();
    let pid = sup.kill_and_restart()?;
    let after = sup.wait_serving(generation, SERVE_TIMEOUT)?;
    let (generation_after, _) = self::generation(&after)?;
    Ok((
        format!(
            "supervisor (pid {pid}) killed and restarted; generation {generation} -> {generation_after}"
        ),
        start.elapsed().as_millis() as u64,
        None,
    ))
}

/// Starts a successor supervisor and SIGTERMs the serving one, which hands
/// the mount over (a DaemonSet rollout); the successor's generation serves.
fn hand_over_supervisor(sup: &mut Supervisor) -> anyhow::Result<(String, u64, Option<u64>)> {
    let before = sup.wait_serving(1, SERVE_TIMEOUT)?;
    let (generation, _) = generation(&before)?;
    let start = Instant::now();
    let pid = sup.hand_over_to_successor()?;
    let after = sup.wait_serving(generation + 1, SERVE_TIMEOUT)?;
    let (generation_after, _) = self::generation(&after)?;
    Ok((
        format!(
            "supervisor (pid {pid}) stopped with a successor waiting; generation {generation} -> {generation_after}"
        ),
        start.elapsed().as_millis() as u64,
        None,
    ))
}

/// Injects `scheduled` and reports what happened.
pub fn inject(
    sup: &mut Supervisor,
    scheduled: &Scheduled,
    at_ms: u64,
    outage_file: &Path,
    scenario_end: Instant,
    binaries: &Binaries,
    pressure: &mut dyn FnMut() -> anyhow::Result<()>,
) -> FaultOutcome {
    let wall_clock = super::stats::wall_clock();
    let result = match &scheduled.fault {
        Fault::KillGeneration => kill_generation(sup),
        Fault::OomKill => oom_kill(sup, pressure),
        Fault::Upgrade => upgrade(sup, &binaries.fsclient),
        Fault::SupervisorUpgrade => upgrade_supervisor(sup, &binaries.supervisor),
        Fault::SupervisorKill => kill_supervisor(sup),
        Fault::SupervisorHandover => hand_over_supervisor(sup),
        Fault::NamedPoint { generation, .. } => named_point(sup, *generation, scenario_end),
        Fault::FullStagingDisk { tmpfs_bytes } => fill_staging(sup).map(|left| {
            (
                format!(
                    "the {tmpfs_bytes}-byte tmpfs staging dir was filled by another writer ({left} bytes left); ENOSPC must follow"
                ),
                0,
                None,
            )
        }),
        Fault::StorageOutage { duration_ms } => {
            let start = Instant::now();
            std::fs::write(outage_file, b"")
                .with_context(|| format!("creating {}", outage_file.display()))
                .map(|()| {
                    std::thread::sleep(Duration::from_millis(*duration_ms));
                    let _ = std::fs::remove_file(outage_file);
                    (
                        format!("storage unreachable for {duration_ms} ms"),
                        start.elapsed().as_millis() as u64,
                        None,
                    )
                })
        }
    };
    let (ok, detail, recovery_ms, takeover_us) = match result {
        Ok((detail, recovery_ms, takeover_us)) => (true, detail, Some(recovery_ms), takeover_us),
        Err(err) => (false, format!("{err:#}"), None, None),
    };
    let recovery_ms = match scheduled.fault {
        Fault::StorageOutage { .. } | Fault::FullStagingDisk { .. } => None,
        _ => recovery_ms,
    };
    FaultOutcome {
        at_ms,
        wall_clock,
        fault: scheduled.fault.clone(),
        ok,
        detail,
        recovery_ms,
        takeover_us,
    }
}

/// Bytes a full staging disk keeps free: less than one 1 MiB write, so
/// making room by committing staged data cannot help.
const FULL_STAGING_LEFT_BYTES: u64 = 256 * 1024;

/// Fills the staging tmpfs with a ballast file the filesystem does not
/// own (another tenant of the disk), up to [`FULL_STAGING_LEFT_BYTES`]
/// free, and keeps it that full until the scenario ends. Returns the
/// bytes left after the first fill.
fn fill_staging(sup: &Supervisor) -> anyhow::Result<u64> {
    let dir = sup
        .staging_dir()
        .context("the full-staging fault needs a tmpfs staging dir")?
        .to_path_buf();
    let ballast = dir.join("ballast-not-baton");
    let mut file = std::fs::File::create(&ballast)
        .with_context(|| format!("creating {}", ballast.display()))?;
    top_up(&dir, &mut file)?;
    let left = staging_free(&dir)?;
    // The other tenant keeps the disk full: what Baton frees by committing
    // its own staged data is taken again, so the room left stays about
    // FULL_STAGING_LEFT_BYTES (else a fill at a moment with much staged
    // leaves that much room later, and ENOSPC may never come). Ends when
    // the staging dir goes away with the scenario.
    std::thread::spawn(move || {
        while top_up(&dir, &mut file).is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
    Ok(left)
}

fn staging_free(dir: &Path) -> anyhow::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).context("statvfs of the staging dir")?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Writes to `file` until the room left in `dir` is about
/// [`FULL_STAGING_LEFT_BYTES`] (a write that finds it full stops early).
fn top_up(dir: &Path, file: &mut std::fs::File) -> anyhow::Result<()> {
    use std::io::Write;
    let chunk = vec![0xa5u8; 64 * 1024];
    while staging_free(dir)? > FULL_STAGING_LEFT_BYTES + chunk.len() as u64 {
        if file.write_all(&chunk).is_err() {
            break;
        }
    }
    if !dir.join("ballast-not-baton").exists() {
        anyhow::bail!("the staging dir is gone");
    }
    Ok(())
}
