//! A verifying read/write workload on any mounted filesystem, run in its
//! own process (`baton-testfs rw-workload`) so a test never blocks in a
//! FUSE call itself.
//!
//! Writers rewrite their files in place (truncate, write, fsync, close),
//! then read them back with O_DIRECT (so the bytes come from the
//! filesystem, not the page cache) and compare; each file's content is a
//! pure function of (writer, slot, version). Readers re-read published
//! files with O_DIRECT and compare; a lister checks every published file is
//! listed. Every syscall is timed.
//!
//! Output on stdout: `ops N errors E max_us M` every 20 ms; each failure as
//! `error: ...`. When the stop file appears, a final pass re-reads every
//! published file, prints `done ops=N errors=E max_us=M slow_ops=S` and the
//! process exits 0 if nothing failed, 1 otherwise.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// A syscall slower than this counts as a slow op.
pub const SLOW_OP_US: u64 = 50_000;
const CHUNK_BYTES: usize = 64 * 1024;
const ALIGN: usize = 4096;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory on the mount (created).
    pub dir: PathBuf,
    /// Writer threads.
    pub writers: usize,
    /// Reader threads.
    pub readers: usize,
    /// Files per writer.
    pub slots: usize,
    /// Bytes per file.
    pub file_bytes: usize,
    /// Stop when this file exists.
    pub stop_file: PathBuf,
}

#[derive(Default)]
struct Stats {
    ops: AtomicU64,
    errors: AtomicU64,
    max_us: AtomicU64,
    slow: AtomicU64,
}

/// The published version of one (writer, slot) file; 0 = never written.
struct Slot {
    version: RwLock<u64>,
}

struct Shared {
    config: Config,
    stats: Stats,
    slots: Vec<Vec<Slot>>,
    stop: AtomicBool,
    out: Mutex<std::io::Stdout>,
}

impl Shared {
    fn timed<T>(&self, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let start = Instant::now();
        let result = f();
        let us = start.elapsed().as_micros() as u64;
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.stats.max_us.fetch_max(us, Ordering::Relaxed);
        if us >= SLOW_OP_US {
            self.stats.slow.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn fail(&self, message: String) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(out, "error: {message}");
        let _ = out.flush();
    }

    fn path(&self, writer: usize, slot: usize) -> PathBuf {
        self.config.dir.join(format!("w{writer}-s{slot}"))
    }
}

/// The content byte stream of a file version: splitmix64 words. Pure.
pub fn content(writer: usize, slot: usize, version: u64, len: usize) -> Vec<u8> {
    let mut state = ((writer as u64) << 48) ^ ((slot as u64) << 32) ^ version;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A page-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = Layout::from_size_align(len.div_ceil(ALIGN).max(1) * ALIGN, ALIGN)
            .unwrap_or_else(|_| std::process::abort());
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::process::abort();
        }
        Aligned { ptr, layout }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes and owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Reads `path` whole with O_DIRECT and compares it with `expected`.
fn verify(shared: &Shared, path: &Path, expected: &[u8], buf: &mut Aligned) -> Result<(), String> {
    let file = shared
        .timed(|| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
        })
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let data = buf.as_mut();
    let mut got = 0;
    loop {
        let n = shared
            .timed(|| file.read_at(&mut data[got..], got as u64))
            .map_err(|e| format!("read {} at {got}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        got += n;
        if got >= data.len() {
            break;
        }
    }
    if got != expected.len() {
        return Err(format!(
            "read {}: {got} bytes, expected {}",
            path.display(),
            expected.len()
        ));
    }
    if let Some(at) = (0..got).find(|&i| data[i] != expected[i]) {
        return Err(format!("read {}: wrong byte at {at}", path.display()));
    }
    Ok(())
}

fn write_file(shared: &Shared, path: &Path, bytes: &[u8]) -> Result<(), String> {
    let file = shared
        .timed(|| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
        })
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    for (index, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        let offset = (index * CHUNK_BYTES) as u64;
        shared
            .timed(|| file.write_all_at(chunk, offset))
            .map_err(|e| format!("write {} at {offset}: {e}", path.display()))?;
    }
    shared
        .timed(|| file.sync_all())
        .map_err(|e| format!("fsync {}: {e}", path.display()))?;
    drop(file);
    Ok(())
}

fn writer(shared: &Shared, writer: usize) {
    let mut buf = Aligned::new(shared.config.file_bytes + ALIGN);
    let mut version = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        for slot in 0..shared.config.slots {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            version += 1;
            let path = shared.path(writer, slot);
            let bytes = content(writer, slot, version, shared.config.file_bytes);
            let lock = &shared.slots[writer][slot];
            let mut published = lock.version.write().unwrap_or_else(PoisonError::into_inner);
            let result = write_file(shared, &path, &bytes)
                .and_then(|()| verify(shared, &path, &bytes, &mut buf));
            match result {
                Ok(()) => *published = version,
                Err(err) => {
                    // The file's content is unknown now: stop checking it
                    // until it is rewritten.
                    *published = 0;
                    shared.fail(err);
                }
            }
        }
    }
}

fn reader(shared: &Shared, index: usize) {
    let mut buf = Aligned::new(shared.config.file_bytes + ALIGN);
    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ (index as u64 + 1);
    while !shared.stop.load(Ordering::Relaxed) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let writer = (rng as usize) % shared.config.writers.max(1);
        let slot = ((rng >> 20) as usize) % shared.config.slots.max(1);
        let Some(lock) = shared.slots.get(writer).and_then(|s| s.get(slot)) else {
            continue;
        };
        let guard = lock.version.read().unwrap_or_else(PoisonError::into_inner);
        if *guard == 0 {
            drop(guard);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let bytes = content(writer, slot, *guard, shared.config.file_bytes);
        if let Err(err) = verify(shared, &shared.path(writer, slot), &bytes, &mut buf) {
            shared.fail(err);
        }
        drop(guard);
    }
}

fn lister(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let published: Vec<String> = (0..shared.config.writers)
            .flat_map(|w| (0..shared.config.slots).map(move |s| (w, s)))
            .filter(|(w, s)| {
                *shared.slots[*w][*s]
                    .version
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    != 0
            })
            .map(|(w, s)| format!("w{w}-s{s}"))
            .collect();
        match shared.timed(|| std::fs::read_dir(&shared.config.dir)?.collect::<Result<Vec<_>, _>>())
        {
            Ok(entries) => {
                let names: Vec<String> = entries
                    .iter()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                if let Some(missing) = published.iter().find(|p| !names.contains(p)) {
                    shared.fail(format!(
                        "readdir {}: {missing} missing",
                        shared.config.dir.display()
                    ));
                }
            }
            Err(e) => shared.fail(format!("readdir {}: {e}", shared.config.dir.display())),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs the workload until the stop file appears; returns the exit status.
pub fn run(config: Config) -> i32 {
    if let Err(err) = std::fs::create_dir_all(&config.dir) {
        println!("error: mkdir {}: {err}", config.dir.display());
        return 1;
    }
    let slots = (0..config.writers)
        .map(|_| {
            (0..config.slots)
                .map(|_| Slot {
                    version: RwLock::new(0),
                })
                .collect()
        })
        .collect();
    let shared = Arc::new(Shared {
        config,
        stats: Stats::default(),
        slots,
        stop: AtomicBool::new(false),
        out: Mutex::new(std::io::stdout()),
    });
    let mut threads = Vec::new();
    for w in 0..shared.config.writers {
        let shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || writer(&shared, w)));
    }
    for r in 0..shared.config.readers {
        let shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || reader(&shared, r)));
    }
    {
        let shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || lister(&shared)));
    }
    while !shared.config.stop_file.exists() {
        std::thread::sleep(Duration::from_millis(20));
        report(&shared, "ops ");
    }
    shared.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    final_pass(&shared);
    report(&shared, "done ");
    i32::from(shared.stats.errors.load(Ordering::Relaxed) != 0)
}

fn final_pass(shared: &Shared) {
    let mut buf = Aligned::new(shared.config.file_bytes + ALIGN);
    for w in 0..shared.config.writers {
        for s in 0..shared.config.slots {
            let version = *shared.slots[w][s]
                .version
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if version != 0 {
                let bytes = content(w, s, version, shared.config.file_bytes);
                if let Err(err) = verify(shared, &shared.path(w, s), &bytes, &mut buf) {
                    shared.fail(format!("final pass: {err}"));
                }
            }
        }
    }
}

fn report(shared: &Shared, prefix: &str) {
    let s = &shared.stats;
    let mut out = shared.out.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = writeln!(
        out,
        "{prefix}ops={} errors={} max_us={} slow_ops={}",
        s.ops.load(Ordering::Relaxed),
        s.errors.load(Ordering::Relaxed),
        s.max_us.load(Ordering::Relaxed),
        s.slow.load(Ordering::Relaxed)
    );
    let _ = out.flush();
}
