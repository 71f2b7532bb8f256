//! The application of the stall benches, in a process of its own
//! (`baton-bench application`, hidden): a reader looping on 4 KiB O_DIRECT
//! reads of `read` and, with `--write`, a writer looping on 4 KiB O_DIRECT
//! writes to `write`, each timing every call, until its stdin closes.
//!
//! Why a process of its own: a process that forks while it holds files of
//! a FUSE mount gives the child copies of them, which close at exec, and
//! every close is a FLUSH. While the benches ran the workload themselves,
//! each `fsctl` they started committed the writer's staged data in the
//! middle of the upgrade they timed, and the writer's next WRITE waited
//! 5-10 ms for that commit (found with `perf sched`). An operator's or a
//! DaemonSet's `fsctl` shares no files with the applications either.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use chaos_tests::bench::AlignedBuf;
use chaos_tests::mount_guard::ChildGuard;
use upgrade_protocol::monotonic_ns;

/// The file the reader reads (the bench writes it first, 1 MiB).
pub const READ_FILE: &str = "read";
/// The file the writer writes.
const WRITE_FILE: &str = "write";
/// What the application prints once its files are open.
const READY: &str = "ready";

/// The running application process. Killed on drop.
pub struct Application {
    child: ChildGuard,
    stdout: BufReader<std::process::ChildStdout>,
}

/// What the application did.
pub struct ApplicationRun {
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// (start, end) of every call, CLOCK_MONOTONIC ns (the bench's clock
    /// too), each thread's in order.
    pub calls: Vec<(u64, u64)>,
}

impl Application {
    /// Starts it on the mount at `mnt` (a writer too if `write`) and waits
    /// until it has its files open.
    pub fn start(mnt: &Path, write: bool) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding baton-bench itself")?;
        let mut command = Command::new(exe);
        command.arg("application").arg(mnt);
        if write {
            command.arg("--write");
        }
        let mut child = ChildGuard(
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting the application process")?,
        );
        let stdout = child.0.stdout.take().context("application stdout")?;
        let mut application = Application {
            child,
            stdout: BufReader::new(stdout),
        };
        let mut line = String::new();
        application.stdout.read_line(&mut line)?;
        if line.trim() != READY {
            bail!("the application process did not start (its error is above)");
        }
        Ok(application)
    }

    /// Stops it (EOF on its stdin) and returns what it did.
    pub fn finish(mut self) -> anyhow::Result<ApplicationRun> {
        drop(self.child.0.stdin.take());
        let failed = || anyhow::anyhow!("the application process failed (its error is above)");
        let mut lines = (&mut self.stdout).lines();
        let counts = lines.next().ok_or_else(failed)??;
        let (reads, writes) = parse_pair(&counts).ok_or_else(failed)?;
        let calls = lines
            .map(|line| parse_pair(&line?).ok_or_else(failed))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if !self.child.0.wait()?.success() {
            return Err(failed());
        }
        Ok(ApplicationRun {
            reads,
            writes,
            calls,
        })
    }
}

fn parse_pair(line: &str) -> Option<(u64, u64)> {
    let (a, b) = line.split_once(' ')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Start and end of each call, CLOCK_MONOTONIC ns.
type Calls = Arc<Mutex<Vec<(u64, u64)>>>;

/// Times every call of `op` until `stop`; the first error ends the loop.
fn timed_loop(
    stop: Arc<AtomicBool>,
    calls: Calls,
    mut op: impl FnMut(u64) -> std::io::Result<()> + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<u64>> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let start = monotonic_ns();
            op(i)?;
            calls
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .push((start, monotonic_ns()));
            i += 1;
        }
        Ok(i)
    })
}

/// `baton-bench application MNT [--write]` (module docs): prints
/// [`READY`], runs until stdin closes, then prints `reads writes` and one
/// `start end` line per call.
pub fn run(mnt: &Path, write: bool) -> anyhow::Result<()> {
    let open = |name: &str, write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(mnt.join(name))
            .with_context(|| format!("opening {}", mnt.join(name).display()))
    };
    let reader_file = open(READ_FILE, false)?;
    let stop = Arc::new(AtomicBool::new(false));
    let calls: Calls = Arc::default();
    let mut read_buf = AlignedBuf::new(4096);
    let reader = timed_loop(Arc::clone(&stop), Arc::clone(&calls), move |i| {
        reader_file.read_exact_at(read_buf.bytes_mut(), (i % 256) * 4096)
    });
    let writer = if write {
        let writer_file = open(WRITE_FILE, true)?;
        let mut write_buf = AlignedBuf::new(4096);
        Some(timed_loop(
            Arc::clone(&stop),
            Arc::clone(&calls),
            move |i| {
                let block = write_buf.bytes_mut();
                block.fill((i % 251) as u8);
                writer_file.write_all_at(block, (i % 256) * 4096)
            },
        ))
    } else {
        None
    };
    println!("{READY}");
    std::io::stdout().flush()?;
    std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink())?;
    stop.store(true, Ordering::Relaxed);
    let reads = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?
        .context("an application read failed")?;
    let writes = match writer {
        Some(writer) => writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))?
            .context("an application write failed")?,
        None => 0,
    };
    let calls = calls.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    writeln!(out, "{reads} {writes}")?;
    for (start, end) in calls.iter() {
        writeln!(out, "{start} {end}")?;
    }
    out.flush()?;
    Ok(())
}
