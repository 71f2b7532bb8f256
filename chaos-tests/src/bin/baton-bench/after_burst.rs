//! `baton-bench kill-after-burst`: how long the kernel takes to tear down
//! a generation killed right after a burst of writes, and one killed after
//! the same burst and some idle seconds. A kill -9 takeover cannot start
//! before that teardown ends (the supervisor learns of the death from the
//! pidfd), and it grows with the anonymous memory the process holds.
//!
//! Per round: `dd` (a process of its own: the bench makes no syscall on
//! the mount) writes `mib` MiB in 1 MiB blocks with a final fsync, the
//! bench waits, reads the serving generation's `RssAnon`, kills it and
//! times SIGKILL → pidfd readable. The warm standby then takes over, and
//! the next round starts on it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::{percentile, status_kib};
use chaos_tests::mount_guard::wait_until;

use crate::stall::{generation_pid, kill_until_exited_us};
use crate::supervised::{fsctl, utf8, SupervisedMount};

/// Runs the bench and prints its table.
pub fn run(dir: &Path, mib: u64, rounds: usize, idle: Duration) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-after-burst-")
        .tempdir_in(dir)?;
    let source = root.path().join("source");
    dd("/dev/urandom", &source, mib, false).context("writing the burst's source file")?;
    let mount = SupervisedMount::start(root.path(), "burst", &[])?;
    let target = mount.mnt.join("burst");
    println!(
        "kill -9 of the serving generation after {mib} MiB written (1 MiB writes, fsync), {rounds} rounds per row"
    );
    println!(
        "{:<26} {:>16} {:>22} {:>10}",
        "killed", "RssAnon MiB p50", "kill → exit ms p50", "max ms"
    );
    let idle_row = format!("after {} s idle", idle.as_secs_f64());
    for (row, wait) in [
        ("right after the burst", Duration::ZERO),
        (idle_row.as_str(), idle),
    ] {
        let mut anon_kib = Vec::with_capacity(rounds);
        let mut exit_us = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            dd(utf8(&source)?, &target, mib, true)?;
            std::thread::sleep(wait);
            let pid = generation_pid(&mount.socket)?;
            anon_kib.extend(status_kib(pid, "RssAnon"));
            exit_us.push(kill_until_exited_us(pid)?);
            if !wait_until(Duration::from_secs(30), || {
                generation_pid(&mount.socket).is_ok_and(|p| p != pid)
            }) {
                bail!("no new generation after killing {pid}");
            }
        }
        anon_kib.sort_unstable();
        exit_us.sort_unstable();
        println!(
            "{:<26} {:>16.1} {:>22.2} {:>10.2}",
            row,
            percentile(&anon_kib, 0.5) / 1024.0,
            percentile(&exit_us, 0.5) / 1000.0,
            percentile(&exit_us, 1.0) / 1000.0
        );
    }
    fsctl(&mount.socket, &["umount", utf8(&mount.mnt)?])?;
    Ok(())
}

/// `dd` of `mib` MiB from `from` to `to` in 1 MiB blocks, with a final
/// fsync if `fsync`.
fn dd(from: &str, to: &Path, mib: u64, fsync: bool) -> anyhow::Result<()> {
    let mut command = Command::new("dd");
    command
        .arg(format!("if={from}"))
        .arg(format!("of={}", utf8(to)?))
        .arg("bs=1M")
        .arg(format!("count={mib}"))
        .arg("status=none");
    if fsync {
        command.arg("conv=fsync");
    }
    let out = command.output().context("running dd")?;
    if !out.status.success() {
        bail!(
            "dd to {}: {}",
            to.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
