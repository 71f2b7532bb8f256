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

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::percentile;
use chaos_tests::mount_guard::wait_until;
use upgrade_protocol::monotonic_ns;

use crate::application::{Application, READ_FILE};
use crate::supervised::{fsctl, SupervisedMount};

fn generation_pid(socket: &Path) -> anyhow::Result<u32> {
    let status: serde_json::Value = serde_json::from_str(&fsctl(socket, &["status", "--json"])?)?;
    status["mounts"][0]["pid"]
        .as_u64()
        .map(|p| p as u32)
        .context("no generation pid in fsctl status")
}

/// Stalls (µs) of `kills` kills, with or without a warm standby, and the
/// number of reads the application completed (a failed read fails the run).
pub(crate) fn measure(
    dir: &Path,
    kills: usize,
    interval: Duration,
    standby: bool,
) -> anyhow::Result<(Vec<u64>, usize)> {
    let args: &[&str] = if standby { &[] } else { &["--no-standby"] };
    let mount = SupervisedMount::start(dir, "stall", args)?;
    let (socket, mnt) = (mount.socket.clone(), mount.mnt.clone());
    std::fs::write(mnt.join(READ_FILE), vec![7u8; 1 << 20])?;
    let application = Application::start(&mnt, false)?;
    let mut kill_times = Vec::with_capacity(kills);
    for _ in 0..kills {
        std::thread::sleep(interval);
        let pid = generation_pid(&socket)?;
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
    Ok((stalls, reads.len()))
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
    for (name, standby) in [("warm standby", true), ("cold start", false)] {
        let dir = root.path().join(name.replace(' ', "-"));
        std::fs::create_dir_all(&dir)?;
        let (mut stalls, reads) =
            measure(&dir, kills, interval, standby).with_context(|| format!("{name} run"))?;
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
    Ok(())
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
