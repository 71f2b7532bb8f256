//! Workload processes of the chaos suite (`baton-chaos worker --kind K`).
//! Each runs on the mount in its own process, so the harness never blocks
//! in a FUSE call; it times every syscall, classifies failures by errno
//! (expected for this scenario or not), checks every byte it reads against
//! known content or its in-memory model, and when the stop file appears
//! verifies everything it was acknowledged and writes a
//! [`WorkerReport`](super::stats::WorkerReport) as JSON to `--result`.

mod churn;
mod files;
mod mmap;
mod writer;

use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::rng::Rng;
use super::stats::{wall_clock, WorkerReport};

/// Alignment of O_DIRECT buffers and offsets.
pub const DIRECT_ALIGN_BYTES: usize = 4096;
/// Read size of whole-file verification.
pub const VERIFY_CHUNK_BYTES: usize = 1 << 20;
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// What a workload process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Writes the large known-content files (setup, before any fault).
    Prepare,
    /// Random block reads of the large files, every block checked.
    Reader,
    /// Sequential whole-file reads of one large file (model loading).
    Loader,
    /// write + fsync into its files, model of acknowledged bytes.
    Writer,
    /// create/rename/link/unlink/mkdir/rmdir/setxattr/readdir vs a model.
    Churn,
    /// mmap writes + msync and mmap reads of a file, and of a large file.
    Mmap,
    /// Writes without fsync until the staging disk is full (ENOSPC).
    Filler,
    /// Writes one large file (memory pressure for the OOM fault), verifies.
    Pressure,
}

/// The worker command line.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// What to run.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// The mount's root.
    #[arg(long)]
    pub mnt: PathBuf,
    /// This worker's index among its kind.
    #[arg(long, default_value_t = 0)]
    pub index: usize,
    /// The scenario seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop (verify and report) when this file exists.
    #[arg(long)]
    pub stop_file: PathBuf,
    /// Where to write the JSON report.
    #[arg(long)]
    pub result: PathBuf,
    /// Number of large files.
    #[arg(long, default_value_t = 2)]
    pub big_files: usize,
    /// Size of each large file.
    #[arg(long, default_value_t = 8 << 20)]
    pub big_bytes: u64,
    /// Bytes per file this worker writes (writer, mmap, filler, pressure).
    #[arg(long, default_value_t = 1 << 20)]
    pub file_bytes: u64,
    /// Errno names (ENOSPC) this scenario's fault must produce.
    #[arg(long = "expect")]
    pub expected: Vec<String>,
}

/// One worker's running state: arguments, randomness, counters.
pub struct Ctx {
    /// The command line.
    pub args: WorkerArgs,
    /// Counters and histogram.
    pub report: WorkerReport,
    /// This worker's randomness.
    pub rng: Rng,
    last_stop_check: Instant,
    stopped: bool,
}

/// close(2) with its error visible (FUSE flush happens there).
pub(super) fn close_checked(file: File) -> std::io::Result<()> {
    let fd = file.into_raw_fd();
    // SAFETY: fd was just released by its owner and is closed exactly once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The errno name of an I/O error (`ENOSPC`), or `other`.
pub fn errno_name(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => format!("{:?}", nix::errno::Errno::from_raw(code)),
        None => "other".to_string(),
    }
}

impl Ctx {
    fn new(args: WorkerArgs) -> Ctx {
        let stream = (args.kind as u64) << 32 | args.index as u64;
        Ctx {
            rng: Rng::new(args.seed, stream),
            report: WorkerReport {
                name: format!("{:?}-{}", args.kind, args.index).to_lowercase(),
                ..WorkerReport::default()
            },
            args,
            last_stop_check: Instant::now(),
            stopped: false,
        }
    }

    /// Whether the stop file appeared (checked every 20 ms).
    pub fn should_stop(&mut self) -> bool {
        if !self.stopped && self.last_stop_check.elapsed() >= STOP_CHECK_INTERVAL {
            self.last_stop_check = Instant::now();
            self.stopped = self.args.stop_file.exists();
        }
        self.stopped
    }

    /// Runs one timed syscall of `kind` on `what`; a failure is counted by
    /// errno (expected or not) and noted. Returns the value or the errno name.
    pub fn op<T>(
        &mut self,
        kind: &str,
        what: impl Display,
        f: impl FnOnce() -> std::io::Result<T>,
    ) -> Result<T, String> {
        let start = Instant::now();
        let result = f();
        self.report
            .latency
            .record(start.elapsed().as_micros() as u64);
        *self.report.ops.entry(kind.to_string()).or_default() += 1;
        result.map_err(|err| {
            let errno = errno_name(&err);
            if self.args.expected.contains(&errno) {
                *self
                    .report
                    .expected_errors
                    .entry(errno.clone())
                    .or_default() += 1;
            } else {
                *self
                    .report
                    .failed_syscalls
                    .entry(errno.clone())
                    .or_default() += 1;
                self.report
                    .note(format!("[{}] {kind} {what}: {err}", wall_clock()));
            }
            errno
        })
    }

    /// Records a difference from the model that is not a byte count.
    pub fn mismatch(&mut self, message: String) {
        self.report.tree_mismatches += 1;
        self.report.note(message);
    }

    /// Compares bytes read at `offset` of `what` with `expected`; a short
    /// read or zeroed bytes are lost, other differences corrupt. Returns
    /// whether they matched.
    pub fn compare(&mut self, what: &Path, offset: u64, expected: &[u8], got: &[u8]) -> bool {
        let common = expected.len().min(got.len());
        let mut lost = expected.len().saturating_sub(got.len()) as u64;
        let mut corrupt = 0u64;
        let mut first = None;
        for i in 0..common {
            if expected[i] != got[i] {
                first.get_or_insert(i);
                if got[i] == 0 {
                    lost += 1;
                } else {
                    corrupt += 1;
                }
            }
        }
        if got.len() > expected.len() {
            corrupt += (got.len() - expected.len()) as u64;
            first.get_or_insert(expected.len());
        }
        if lost == 0 && corrupt == 0 {
            return true;
        }
        self.report.lost_bytes += lost;
        self.report.corrupt_bytes += corrupt;
        self.report.note(format!(
            "[{}] {} at {offset}: {} bytes expected, {} read; first difference at +{}; {lost} lost, {corrupt} corrupt",
            wall_clock(),
            what.display(),
            expected.len(),
            got.len(),
            first.unwrap_or(0)
        ));
        false
    }

    /// Reads `path` whole with O_DIRECT (bytes from the filesystem, not the
    /// page cache). None when a syscall failed (already counted).
    pub fn read_direct(&mut self, path: &Path) -> Option<Vec<u8>> {
        let file = self
            .op("open", path.display(), || {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
            })
            .ok()?;
        let mut buf = AlignedBuf::new(VERIFY_CHUNK_BYTES);
        let mut out = Vec::new();
        loop {
            let offset = out.len() as u64;
            let n = self
                .op("read", path.display(), || {
                    file.read_at(buf.window(), offset)
                })
                .ok()?;
            out.extend_from_slice(&buf.window()[..n]);
            if n == 0 {
                // Closed with its error seen: a close that writes back
                // another fd's dirty pages can fail, and must be counted.
                self.op("close", path.display(), || close_checked(file))
                    .ok()?;
                return Some(out);
            }
        }
    }
}

/// A page-aligned byte buffer for O_DIRECT, without unsafe code: a larger
/// vector and an aligned window into it.
pub struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes (rounded up to the alignment), zeroed.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(DIRECT_ALIGN_BYTES).max(1) * DIRECT_ALIGN_BYTES;
        let bytes = vec![0u8; len + DIRECT_ALIGN_BYTES];
        let start = bytes.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        AlignedBuf { bytes, start, len }
    }

    /// The aligned window.
    pub fn window(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

/// The large known-content file `index` under `mnt`.
pub fn big_file(mnt: &Path, index: usize) -> PathBuf {
    mnt.join("data").join(format!("big-{index}"))
}

/// Runs the worker; returns the process exit code (0 once the report is
/// written, whatever it says).
pub fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    let result = args.result.clone();
    let mut ctx = Ctx::new(args);
    match ctx.args.kind {
        Kind::Prepare => files::prepare(&mut ctx),
        Kind::Reader => files::reader(&mut ctx),
        Kind::Loader => files::loader(&mut ctx),
        Kind::Writer => writer::run(&mut ctx),
        Kind::Churn => churn::run(&mut ctx),
        Kind::Mmap => mmap::run(&mut ctx),
        Kind::Filler => writer::filler(&mut ctx),
        Kind::Pressure => writer::pressure(&mut ctx),
    }
    let json = serde_json::to_vec_pretty(&ctx.report)?;
    let partial = result.with_extension("partial");
    std::fs::write(&partial, json)
        .and_then(|()| std::fs::rename(&partial, &result))
        .map_err(|e| anyhow::anyhow!("writing the worker report {}: {e}", result.display()))?;
    Ok(0)
}
