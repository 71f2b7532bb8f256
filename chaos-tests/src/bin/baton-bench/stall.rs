//! `baton-bench stall`: what an application sees when the filesystem process
//! is killed. A supervised Baton mount serves a reader that loops on 4 KiB
//! O_DIRECT reads (each one reaches the server), in a process of its own
//! (`crate::application`); the generation is killed with SIGKILL every
//! `interval`; for each kill, the stall is the time from
//! the kill to the end of the first read that STARTED after it (or of the
//! read in flight at the kill, if that one ends later).
//!
//! Before 2026-11-25 it was the end of the first read that ENDED after the
//! kill: a read the dying generation still answered (SIGKILL is not
//! instant) counted as a stall of a few µs: the warm p50 read 0.14 ms
//! where this measure gives 1.9 ms (same code, same machine).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chaos_tests::bench::{percentile, status_kib};
use chaos_tests::mount_guard::{wait_until, ChildGuard};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use upgrade_protocol::monotonic_ns;

use crate::application::{Application, READ_FILE};
use crate::supervised::{fsctl, generation_pids, SupervisedMount};

/// The serving generation's pid.
pub(crate) fn generation_pid(socket: &Path) -> anyhow::Result<u32> {
    generation_pids(socket)?
        .first()
        .copied()
        .context("no generation pid in fsctl status")
}

/// `kills` kills, with or without a warm standby (a failed read fails the
/// run).
pub(crate) fn measure(
    dir: &Path,
    kills: usize,
    interval: Duration,
    standby: bool,
) -> anyhow::Result<Killed> {
    let args: &[&str] = if standby { &[] } else { &["--no-standby"] };
    let mount = SupervisedMount::start(dir, "stall", args)?;
    let (socket, mnt) = (mount.socket.clone(), mount.mnt.clone());
    std::fs::write(mnt.join(READ_FILE), vec![7u8; 1 << 20])?;
    let application = Application::start(&mnt, false)?;
    let mut kill_times = Vec::with_capacity(kills);
    let mut rss_kib = Vec::with_capacity(kills);
    for _ in 0..kills {
        std::thread::sleep(interval);
        let pid = generation_pid(&socket)?;
        rss_kib.extend(status_kib(pid, "VmRSS"));
        let at = monotonic_ns();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        kill_times.push(at);
        // Wait for the next generation before the next kill.
        if !wait_until(Duration::from_secs(30), || {
            generation_pid(&socket).is_ok_and(|p| p != pid)
        }) {
            bail!("no new generation after killing {pid}");
        }
    }
    std::thread::sleep(interval);
    let reads = application.finish()?.calls;
    let stalls = kill_times
        .iter()
        .filter_map(|kill| stall_after(&reads, *kill))
        .collect();
    fsctl(&socket, &["umount", mnt.to_str().context("utf-8 path")?])?;
    rss_kib.sort_unstable();
    Ok(Killed {
        stalls,
        reads: reads.len(),
        rss_kib: rss_kib.get(rss_kib.len() / 2).copied().unwrap_or(0),
    })
}

/// What one run of kills measured.
pub(crate) struct Killed {
    /// Stall of each kill, µs.
    pub stalls: Vec<u64>,
    /// Reads the application completed.
    pub reads: usize,
    /// Median VmRSS of the killed generations, KiB.
    pub rss_kib: u64,
}

/// Prints p50/p99/max of the stall with and without a warm standby.
pub fn run(dir: &Path, kills: usize, interval: Duration) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-stall-")
        .tempdir_in(dir)?;
    println!("kill -9 of the serving generation every {} ms under a 4 KiB O_DIRECT read loop; stall = kill to the end of the first read started after it", interval.as_millis());
    println!("(any failed application read fails the run, so every row below had 0 errors)");
    println!(
        "{:<14} {:>6} {:>10} {:>10} {:>10} {:>12}",
        "mode", "kills", "p50 ms", "p99 ms", "max ms", "app reads"
    );
    let mut generation_rss_kib = 0;
    for (name, standby) in [("warm standby", true), ("cold start", false)] {
        let dir = root.path().join(name.replace(' ', "-"));
        std::fs::create_dir_all(&dir)?;
        let Killed {
            mut stalls,
            reads,
            rss_kib,
        } = measure(&dir, kills, interval, standby).with_context(|| format!("{name} run"))?;
        generation_rss_kib = generation_rss_kib.max(rss_kib);
        stalls.sort_unstable();
        let ms = |q: f64| percentile(&stalls, q) / 1000.0;
        println!(
            "{:<14} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>12}",
            name,
            stalls.len(),
            ms(0.5),
            ms(0.99),
            ms(1.0),
            reads
        );
    }
    let generation_mib = generation_rss_kib.div_ceil(1024);
    for (name, mib) in [
        ("floor, sleep".to_string(), 0),
        (format!("floor, {generation_mib} MiB"), generation_mib),
    ] {
        let floors = kill_floor(kills, mib)?;
        let ms = |q: f64| percentile(&floors, q) / 1000.0;
        println!(
            "{:<14} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>12}",
            name,
            floors.len(),
            ms(0.5),
            ms(0.99),
            ms(1.0),
            "-"
        );
    }
    println!("(floor: kill -9 of an idle process until its pidfd is readable, the soonest a death can be noticed: a bare `sleep`, and one holding as much memory as the killed generations, {generation_mib} MiB median VmRSS)");
    Ok(())
}

/// The kernel's share of every takeover on this machine, µs, sorted: from
/// SIGKILL of an idle process until its pidfd is readable, which is when a
/// supervisor learns of a death. The kernel frees the dead process's
/// memory first, so this grows with it: the process holds `mib` MiB
/// (`baton-bench hold-memory`; 0: a bare `sleep`).
fn kill_floor(kills: usize, mib: u64) -> anyhow::Result<Vec<u64>> {
    let mut floors = Vec::with_capacity(kills);
    for _ in 0..kills {
        let mut command = if mib == 0 {
            let mut sleep = Command::new("sleep");
            sleep.arg("600");
            sleep
        } else {
            let mut hold = Command::new(std::env::current_exe()?);
            hold.arg("hold-memory").arg(mib.to_string());
            hold
        };
        let mut child = ChildGuard(
            command
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a process for the kill floor")?,
        );
        if mib > 0 {
            let mut line = String::new();
            let stdout = child.0.stdout.take().context("hold-memory stdout")?;
            BufReader::new(stdout).read_line(&mut line)?;
        }
        // Let it reach its sleep, as a generation waits in read().
        std::thread::sleep(Duration::from_millis(20));
        floors.push(kill_until_exited_us(child.0.id())?);
    }
    floors.sort_unstable();
    Ok(floors)
}

/// `baton-bench hold-memory MIB` (hidden): touches `mib` MiB of memory,
/// says `ready`, and sleeps until killed.
pub fn hold_memory(mib: u64) -> anyhow::Result<()> {
    let mut held = vec![0u8; (mib as usize) << 20];
    for page in held.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&held);
    println!("ready");
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs(600));
    Ok(())
}

/// Sends SIGKILL to `pid` and waits until its pidfd is readable (it has
/// exited, its memory freed): µs. The caller reaps it, if it is a child.
pub(crate) fn kill_until_exited_us(pid: u32) -> anyhow::Result<u64> {
    let pidfd = pidfd_open(pid)?;
    let start = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let mut ready = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut ready, PollTimeout::from(10_000u16)).context("polling a pidfd")?;
    Ok(start.elapsed().as_micros() as u64)
}

/// pidfd_open(2), through rustix (nix has no wrapper).
fn pidfd_open(pid: u32) -> anyhow::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .context("pidfd_open: no such pid")?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).context("pidfd_open")
}

/// The stall of one kill at `kill`, µs, from the reads (start, end, ns)
/// in order: until the first read started after the kill completed, or the
/// read in flight at the kill, whichever ended later. None if no read
/// started after it.
fn stall_after(reads: &[(u64, u64)], kill: u64) -> Option<u64> {
    let next = reads.iter().find(|(start, _)| *start >= kill)?.1;
    let in_flight = reads
        .iter()
        .filter(|(start, end)| *start < kill && *end > kill)
        .map(|(_, end)| *end)
        .max();
    let end = in_flight.map_or(next, |e| e.max(next));
    Some((end - kill) / 1000)
}

/// `baton-bench stall-together`: `mounts` mounts under one fs-supervisor,
/// each read by its own application, and every serving generation killed
/// at once, `kills` times (one node's memory pressure, or one bug hitting
/// every generation). Prints the stall of the worst mount of each kill and
/// of every mount.
pub fn run_together(
    dir: &Path,
    mounts: usize,
    kills: usize,
    interval: Duration,
) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-stall-together-")
        .tempdir_in(dir)?;
    let mut supervised = SupervisedMount::start(root.path(), "stall0", &[])?;
    let mut mnts = vec![supervised.mnt.clone()];
    for i in 1..mounts.max(1) {
        mnts.push(supervised.mount_another(&format!("stall{i}"))?);
    }
    let socket = supervised.socket.clone();
    let mut applications = Vec::with_capacity(mnts.len());
    for mnt in &mnts {
        std::fs::write(mnt.join(READ_FILE), vec![7u8; 1 << 20])?;
        applications.push(Application::start(mnt, false)?);
    }
    let mut kill_times = Vec::with_capacity(kills);
    for _ in 0..kills {
        std::thread::sleep(interval);
        let pids = generation_pids(&socket)?;
        let at = monotonic_ns();
        for pid in &pids {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )?;
        }
        kill_times.push(at);
        let replaced = wait_until(Duration::from_secs(60), || {
            generation_pids(&socket).is_ok_and(|now| {
                now.len() == pids.len() && now.iter().all(|pid| !pids.contains(pid))
            })
        });
        if !replaced {
            bail!("not every mount got a new generation after killing {pids:?}");
        }
    }
    std::thread::sleep(interval);
    let mut worst = Vec::with_capacity(kills);
    let mut every = Vec::with_capacity(kills * mnts.len());
    let runs: Vec<_> = applications
        .into_iter()
        .map(Application::finish)
        .collect::<anyhow::Result<_>>()?;
    for kill in &kill_times {
        let stalls: Vec<u64> = runs
            .iter()
            .filter_map(|run| stall_after(&run.calls, *kill))
            .collect();
        worst.extend(stalls.iter().max());
        every.extend(stalls);
    }
    drop(supervised);
    worst.sort_unstable();
    every.sort_unstable();
    println!("{} mounts under one fs-supervisor, every serving generation killed at once {} times, {} ms apart; a 4 KiB O_DIRECT read loop on each mount in a process of its own", mnts.len(), kill_times.len(), interval.as_millis());
    println!("(any failed application read fails the run, so every row below had 0 errors)");
    println!(
        "{:<22} {:>8} {:>10} {:>10} {:>10}",
        "stall", "samples", "p50 ms", "p99 ms", "max ms"
    );
    for (name, stalls) in [("worst mount per kill", &worst), ("every mount", &every)] {
        let ms = |q: f64| percentile(stalls, q) / 1000.0;
        println!(
            "{:<22} {:>8} {:>10.2} {:>10.2} {:>10.2}",
            name,
            stalls.len(),
            ms(0.5),
            ms(0.99),
            ms(1.0)
        );
    }
    Ok(())
}
