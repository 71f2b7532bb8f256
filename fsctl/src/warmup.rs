//! `fsctl warmup PATH...`: reads every file under PATH through its Baton
//! mount, so the serving generation fetches each block from the object
//! store into the mount's local block cache (the cache belongs to the
//! generation: warming through the mount is warming it). A volume whose
//! blocks are read in place from a local directory has no block cache: the
//! reads then warm the kernel's page cache only, and warmup says so.
//!
//! Safe during an upgrade or a kill -9 of the generation: reads through a
//! Baton mount stall and go on, so warmup simply carries on; a file that
//! cannot be read is reported (exit 1) and the others are still read.
//!
//! Before reading, the mount's cache (from fs-supervisor's status) is
//! compared with what is asked: a set larger than the cache would evict
//! its own first blocks, and is refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use upgrade_protocol::{MountStatus, Reply, Request};

/// Bytes read per `read(2)`.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Reader threads unless `--threads` says otherwise.
pub const DEFAULT_THREADS: usize = 4;
/// Reader threads at most.
const THREADS_MAX: usize = 64;
/// Files whose read failed listed in the report at most.
const FAILURES_LISTED_MAX: usize = 20;
/// `f_type` of a FUSE filesystem.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What to warm and how.
pub struct Plan<'a> {
    /// Files or directories on a Baton mount.
    pub paths: &'a [PathBuf],
    /// Reader threads.
    pub threads: usize,
    /// Print the result as JSON.
    pub json: bool,
    /// fs-supervisor's control socket (for the mount's cache size).
    pub socket: &'a Path,
}

/// The files to read: (path, bytes).
struct FileSet {
    files: Vec<(PathBuf, u64)>,
    bytes: u64,
}

/// Runs `fsctl warmup`.
pub fn run(plan: &Plan<'_>) -> anyhow::Result<ExitCode> {
    if plan.paths.is_empty() {
        bail!("give at least one file or directory on a Baton mount to warm");
    }
    let threads = plan.threads.clamp(1, THREADS_MAX);
    let mut set = FileSet {
        files: Vec::new(),
        bytes: 0,
    };
    let mut device = None;
    for path in plan.paths {
        let meta = std::fs::metadata(path).with_context(|| {
            format!(
                "{}: cannot stat it; give a path on a Baton mount",
                path.display()
            )
        })?;
        check_on_fuse(path)?;
        if device.is_some_and(|dev| dev != meta.dev()) {
            bail!(
                "{} is on another mount than the paths before it: warm one mount per call",
                path.display()
            );
        }
        device = Some(meta.dev());
        collect(path, &mut set)?;
    }
    let cache = mount_cache(plan.socket, &plan.paths[0]);
    if let Some(status) = &cache {
        let capacity = status
            .counters
            .as_ref()
            .map_or(0, |c| c.io.cache_capacity_bytes);
        if capacity > 0 && set.bytes > capacity {
            bail!(
                "{} in {} file(s) asked, but the block cache of the mount at {} holds {}: the last blocks read would evict the first; warm less, or remount with a larger --cache-size",
                human(set.bytes),
                set.files.len(),
                status.mountpoint.display(),
                human(capacity)
            );
        }
    }
    let started = Instant::now();
    let progress = Progress::new(set.files.len(), set.bytes);
    let display = progress.show();
    let failures = read_all(&set.files, threads, &progress);
    display.finish();
    let seconds = started.elapsed().as_secs_f64();
    let read_bytes = progress.bytes_done.load(Ordering::Relaxed);
    let cache_note = cache_note(cache.as_ref());
    if plan.json {
        let report = serde_json::json!({
            "files": set.files.len(),
            "bytes": set.bytes,
            "read_bytes": read_bytes,
            "seconds": seconds,
            "bytes_per_second": rate(read_bytes, seconds),
            "cache": cache.as_ref().and_then(|s| s.counters.as_ref()).map(|c| serde_json::json!({
                "capacity_bytes": c.io.cache_capacity_bytes,
                "used_bytes_before": c.io.cache_used_bytes,
            })),
            "failures": failures.iter().map(|(p, e)| serde_json::json!({"path": p.display().to_string(), "error": e})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "warmed {} file(s), {} in {:.1} s ({}/s); {cache_note}",
            set.files.len() - failures.len(),
            human(read_bytes),
            seconds,
            human(rate(read_bytes, seconds) as u64)
        );
        for (path, err) in failures.iter().take(FAILURES_LISTED_MAX) {
            eprintln!("fsctl: could not read {}: {err}", path.display());
        }
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds
    } else {
        0.0
    }
}

/// Refuses a path that is not on a FUSE mount (warming a local disk is a
/// mistake, not a no-op).
fn check_on_fuse(path: &Path) -> anyhow::Result<()> {
    let stat = nix_statfs(path)?;
    if stat != FUSE_SUPER_MAGIC {
        bail!(
            "{} is not on a Baton (FUSE) mount: warmup reads through a mount to fill its cache",
            path.display()
        );
    }
    Ok(())
}

fn nix_statfs(path: &Path) -> anyhow::Result<i64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} holds a NUL byte", path.display()))?;
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer statfs fills.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    // SAFETY: statfs returned 0, so it filled the buffer.
    let f_type = unsafe { buf.assume_init() }.f_type;
    // Its type is per architecture (i64 here, i32 or u32 elsewhere).
    #[allow(clippy::useless_conversion)]
    Ok(i64::from(f_type))
}

/// Adds `path` (a file, or every regular file under a directory; symlinks
/// are not followed) to `set`.
fn collect(path: &Path, set: &mut FileSet) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if meta.is_file() {
        set.bytes += meta.len();
        set.files.push((path.to_path_buf(), meta.len()));
    } else if meta.is_dir() {
        let entries =
            std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", path.display()))?;
            collect(&entry.path(), set)?;
        }
    }
    Ok(())
}

/// The status of the supervised mount `path` is on, if fs-supervisor
/// answers and supervises it.
fn mount_cache(socket: &Path, path: &Path) -> Option<MountStatus> {
    let path = std::fs::canonicalize(path).ok()?;
    let reply = upgrade_protocol::client::request(socket, &Request::Status, Duration::from_secs(5));
    let Ok(Reply::Status { report }) = reply else {
        return None;
    };
    report
        .mounts
        .into_iter()
        .filter(|m| path.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len())
}

fn cache_note(status: Option<&MountStatus>) -> String {
    let Some(status) = status else {
        return "the mount's cache size is unknown (no fs-supervisor answers for it)".to_string();
    };
    match status.counters.as_ref().map(|c| &c.io) {
        Some(io) if io.cache_capacity_bytes > 0 => format!(
            "the block cache of {} held {} of {} before",
            status.mountpoint.display(),
            human(io.cache_used_bytes),
            human(io.cache_capacity_bytes)
        ),
        Some(_) => format!(
            "{} reads its blocks in place from a local directory (no block cache): they are in the kernel's page cache now",
            status.mountpoint.display()
        ),
        None => "the mount has not reported its cache yet".to_string(),
    }
}

/// Reads every file with `threads` readers; returns the files that failed.
fn read_all(
    files: &[(PathBuf, u64)],
    threads: usize,
    progress: &Progress,
) -> Vec<(PathBuf, String)> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(files.len().max(1)) {
            scope.spawn(|| {
                let mut buf = vec![0u8; READ_CHUNK_BYTES];
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some((path, _)) = files.get(index) else {
                        break;
                    };
                    if let Err(err) = read_file(path, &mut buf, progress) {
                        failures
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((path.clone(), err.to_string()));
                    }
                    progress.file_done();
                }
            });
        }
    });
    failures
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read_file(path: &Path, buf: &mut [u8], progress: &Progress) -> std::io::Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    loop {
        match file.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => progress.add_bytes(n as u64),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

/// Files and bytes done, shown on stderr (`crate::progress`; stdout
/// keeps the result, with `--json` too).
struct Progress {
    files_total: usize,
    bytes_total: u64,
    files_done: AtomicUsize,
    bytes_done: AtomicU64,
}

impl Progress {
    fn new(files_total: usize, bytes_total: u64) -> Arc<Progress> {
        Arc::new(Progress {
            files_total,
            bytes_total,
            files_done: AtomicUsize::new(0),
            bytes_done: AtomicU64::new(0),
        })
    }

    fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
    }

    fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Shows it until the returned display is finished.
    fn show(self: &Arc<Progress>) -> crate::progress::Progress {
        let this = self.clone();
        crate::progress::Progress::start(
            "warmup",
            crate::progress::Sink::Stderr {
                template: "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
            },
            move |elapsed| {
                let bytes = this.bytes_done.load(Ordering::Relaxed);
                let files = this.files_done.load(Ordering::Relaxed);
                crate::progress::Tick {
                    position: bytes,
                    length: Some(this.bytes_total),
                    message: format!(
                        "{files}/{} files, {} of {} ({}/s)",
                        this.files_total,
                        human(bytes),
                        human(this.bytes_total),
                        human(rate(bytes, elapsed.as_secs_f64()) as u64)
                    ),
                }
            },
        )
    }
}

/// `1536` → `1.5K` (binary units, as `fsctl quota` and `df -h` print them).
fn human(bytes: u64) -> String {
    crate::quota::human_size(bytes)
}
