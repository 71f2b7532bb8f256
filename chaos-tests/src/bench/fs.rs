//! Filesystem workloads for `baton-bench fs`: sequential write and read of
//! one large file, a sequential write in small writes (as an application
//! writing a log or a checkpoint through a buffered stream does), random
//! 4 KiB reads (a fixed count right after caches were dropped, or for a
//! duration, cold or warm), small-file metadata churn on several threads
//! (unlinks after a sync, or straight after the creates), the system `tar
//! -xf` of a source tree and `rm -rf` of it, the latency of an fsync after
//! a 4 KiB write, and a many-file tree read in order the way a model loader
//! reads its shards. Each returns a throughput figure (or latencies);
//! targets are plain paths, so the same code measures every filesystem.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The read and write size of the sequential workloads.
pub const SEQUENTIAL_CHUNK_BYTES: usize = 1 << 20;
/// The write size of the small-writes workload.
pub const SMALL_WRITE_BYTES: usize = 4096;
/// Files per directory of the many-file tree.
pub const TREE_FILES_PER_DIR: usize = 20;
/// Files per directory of the source tree, at least (but the last
/// directory may hold fewer) and at most.
pub const SOURCE_FILES_PER_DIR_MIN: usize = 100;
/// See [`SOURCE_FILES_PER_DIR_MIN`].
pub const SOURCE_FILES_PER_DIR_MAX: usize = 1000;
/// Size of the file the fsync-latency workload writes into.
pub const FSYNC_FILE_BYTES: u64 = 1 << 20;

/// Writes `total_bytes` in `chunk_bytes` writes, then fsyncs. Returns MiB/s.
pub fn sequential_write(path: &Path, total_bytes: u64, chunk_bytes: usize) -> std::io::Result<f64> {
    let chunk: Vec<u8> = (0..chunk_bytes).map(|i| (i * 131 % 251) as u8).collect();
    let start = Instant::now();
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let mut written = 0u64;
    while written < total_bytes {
        let n = chunk_bytes.min((total_bytes - written) as usize);
        file.write_all(&chunk[..n])?;
        written += n as u64;
    }
    file.sync_all()?;
    Ok(mib_per_sec(written, start.elapsed()))
}

/// Reads the whole file in `chunk_bytes` reads. Returns MiB/s.
pub fn sequential_read(path: &Path, chunk_bytes: usize) -> std::io::Result<f64> {
    let start = Instant::now();
    let bytes = read_all(path, &mut vec![0u8; chunk_bytes])?;
    Ok(mib_per_sec(bytes, start.elapsed()))
}

fn read_all(path: &Path, buf: &mut [u8]) -> std::io::Result<u64> {
    let file = File::open(path)?;
    let mut offset = 0u64;
    loop {
        let n = file.read_at(buf, offset)?;
        if n == 0 {
            return Ok(offset);
        }
        offset += n as u64;
    }
}

/// The 4 KiB block the `i`-th read of `thread` reads, of `blocks`.
fn random_block(thread: usize, i: u64, blocks: u64) -> u64 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(thread as u64 * 0x2545_f491_4f6c_dd1d)
        >> 11)
        % blocks.max(1)
}

/// Random 4 KiB reads over the file by `threads` threads for `duration`.
/// Returns reads per second.
pub fn random_reads(path: &Path, threads: usize, duration: Duration) -> std::io::Result<f64> {
    let file = std::sync::Arc::new(File::open(path)?);
    let blocks = file.metadata()?.len() / 4096;
    let result = super::timed(threads, duration, move |thread, i| {
        let mut buf = [0u8; 4096];
        file.read_exact_at(&mut buf, random_block(thread, i, blocks) * 4096)
    });
    if result.errors > 0 {
        return Err(std::io::Error::other(format!(
            "{} random reads of {} failed",
            result.errors,
            path.display()
        )));
    }
    Ok(result.ops_per_sec)
}

/// Exactly `reads_per_thread` random 4 KiB reads on each of `threads`
/// threads (run right after caches were dropped: a cold figure that does
/// not turn warm as the run goes on). Returns reads per second.
pub fn random_reads_counted(
    path: &Path,
    threads: usize,
    reads_per_thread: u64,
) -> std::io::Result<f64> {
    let file = File::open(path)?;
    let blocks = file.metadata()?.len() / 4096;
    let start = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let file = &file;
                s.spawn(move || -> std::io::Result<()> {
                    let mut buf = [0u8; 4096];
                    for i in 0..reads_per_thread {
                        file.read_exact_at(&mut buf, random_block(thread, i, blocks) * 4096)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|_| Err(panicked())))
    })?;
    Ok((threads as u64 * reads_per_thread) as f64 / start.elapsed().as_secs_f64())
}

/// Metadata rates of one small-file round, operations per second.
#[derive(Clone, Copy, Debug, Default)]
pub struct MetadataRates {
    /// Create (with 1 byte of data) and close.
    pub create: f64,
    /// stat by path.
    pub stat: f64,
    /// Directory entries listed per second.
    pub readdir: f64,
    /// unlink.
    pub unlink: f64,
}

/// Creates, stats, lists and unlinks `count` small files in `dir` with
/// `threads` threads: [`create_small_files`] then [`unlink_small_files`].
pub fn small_files(dir: &Path, count: usize, threads: usize) -> std::io::Result<MetadataRates> {
    let made = create_small_files(dir, count, threads)?;
    Ok(MetadataRates {
        unlink: unlink_small_files(dir, count, threads)?,
        ..made
    })
}

/// Creates, stats and lists `count` small files in `dir` with `threads`
/// threads (file `i` belongs to thread `i % threads`; every thread lists
/// the whole directory). Each phase is timed from the start of all threads
/// to the end of the last. The files stay (`unlink` is 0 in the result).
pub fn create_small_files(
    dir: &Path,
    count: usize,
    threads: usize,
) -> std::io::Result<MetadataRates> {
    std::fs::create_dir_all(dir)?;
    let threads = threads.max(1);
    let name = |i: usize| small_file(dir, i);
    let create = timed_phase(count, threads, &|i| File::create(name(i))?.write_all(b"x"))?;
    let stat = timed_phase(count, threads, &|i| std::fs::metadata(name(i)).map(|_| ()))?;
    let start = Instant::now();
    let listed = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| std::fs::read_dir(dir).map(Iterator::count)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(panicked())))
            .sum::<std::io::Result<usize>>()
    })?;
    if listed != count * threads {
        return Err(std::io::Error::other(format!(
            "readdir of {} listed {listed} entries, expected {}",
            dir.display(),
            count * threads
        )));
    }
    let readdir = listed as f64 / start.elapsed().as_secs_f64();
    Ok(MetadataRates {
        create,
        stat,
        readdir,
        unlink: 0.0,
    })
}

/// Unlinks the `count` files [`create_small_files`] made in `dir`, with
/// `threads` threads; files per second.
pub fn unlink_small_files(dir: &Path, count: usize, threads: usize) -> std::io::Result<f64> {
    timed_phase(count, threads.max(1), &|i| {
        std::fs::remove_file(small_file(dir, i))
    })
}

fn small_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("f{i:06}"))
}

/// Creates `count` small files in `dir` with `threads` threads (as
/// [`create_small_files`], without its stat and readdir phases) and unlinks
/// them at once, with no sync in between: an `rm -rf` straight after an
/// untar. Only the unlinks are timed; files per second.
pub fn create_then_unlink(dir: &Path, count: usize, threads: usize) -> std::io::Result<f64> {
    std::fs::create_dir_all(dir).map_err(|e| failed("mkdir", dir, e))?;
    let threads = threads.max(1);
    timed_phase(count, threads, &|i| {
        let path = small_file(dir, i);
        File::create(&path)
            .and_then(|mut f| f.write_all(b"x"))
            .map_err(|e| failed("create", &path, e))
    })?;
    timed_phase(count, threads, &|i| {
        let path = small_file(dir, i);
        std::fs::remove_file(&path).map_err(|e| failed("unlink", &path, e))
    })
}

/// An IO error that names the call and the path it failed on.
fn failed(call: &str, path: &Path, err: std::io::Error) -> std::io::Error {
    std::io::Error::new(err.kind(), format!("{call} {}: {err}", path.display()))
}

/// Runs `op(i)` for `i` in `0..count` on `threads` threads (thread `t`
/// takes `t, t + threads, ...`); operations per second over all of them.
fn timed_phase(
    count: usize,
    threads: usize,
    op: &(dyn Fn(usize) -> std::io::Result<()> + Sync),
) -> std::io::Result<f64> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (t..count).step_by(threads).try_for_each(op)))
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|_| Err(panicked())))
    })?;
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// The sizes of a many-file tree: `count` files spread evenly (by a fixed
/// stride, so every run gets the same tree) over `min_mib..=max_mib` MiB.
pub fn tree_sizes(count: usize, min_mib: u64, max_mib: u64) -> Vec<u64> {
    let span = max_mib.saturating_sub(min_mib) + 1;
    (0..count as u64)
        .map(|i| (min_mib + (i * 7919) % span) << 20)
        .collect()
}

/// Path of file `i` of a tree under `root` (20 files per directory).
pub fn tree_file(root: &Path, i: usize) -> PathBuf {
    root.join(format!("shard-{:03}", i / TREE_FILES_PER_DIR))
        .join(format!("model-{i:05}.bin"))
}

/// Writes the tree (not timed; each file closed, none fsynced).
pub fn write_tree(root: &Path, sizes: &[u64]) -> std::io::Result<()> {
    let chunk: Vec<u8> = (0..SEQUENTIAL_CHUNK_BYTES)
        .map(|i| (i * 7 % 253) as u8)
        .collect();
    for (i, size) in sizes.iter().enumerate() {
        let path = tree_file(root, i);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = File::create(&path)?;
        let mut written = 0u64;
        while written < *size {
            let n = SEQUENTIAL_CHUNK_BYTES.min((size - written) as usize);
            file.write_all(&chunk[..n])?;
            written += n as u64;
        }
    }
    Ok(())
}

/// Reads every file of the tree in order, each from start to end in 1 MiB
/// reads, as a model loader does. Returns MiB/s over the whole tree.
pub fn read_tree(root: &Path, sizes: &[u64]) -> std::io::Result<f64> {
    let mut buf = vec![0u8; SEQUENTIAL_CHUNK_BYTES];
    let start = Instant::now();
    let mut total = 0u64;
    for (i, size) in sizes.iter().enumerate() {
        let path = tree_file(root, i);
        let got = read_all(&path, &mut buf)?;
        if got != *size {
            return Err(std::io::Error::other(format!(
                "{} has {got} bytes, expected {size}",
                path.display()
            )));
        }
        total += got;
    }
    Ok(mib_per_sec(total, start.elapsed()))
}

/// One file of a source tree: its path under the tree's root and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    /// Relative to the tree's root.
    pub path: PathBuf,
    /// Bytes.
    pub bytes: u64,
}

/// A tree of `count` files shaped like a source tree, the same on every
/// call: directories of 100-1000 files ([`SOURCE_FILES_PER_DIR_MIN`]),
/// nested up to three deep (`crate-NN/src-M/part-K`), files of 0.5-16 KiB
/// (most near the small end) and one in a hundred of 32-256 KiB.
pub fn source_tree(count: usize) -> Vec<SourceFile> {
    let span = SOURCE_FILES_PER_DIR_MAX - SOURCE_FILES_PER_DIR_MIN + 1;
    let mut files = Vec::with_capacity(count);
    let mut d = 0usize;
    while files.len() < count {
        let dir = source_dir(d);
        let in_dir = (SOURCE_FILES_PER_DIR_MIN + d * 389 % span).min(count - files.len());
        for _ in 0..in_dir {
            let i = files.len();
            files.push(SourceFile {
                path: dir.join(format!("f{i:05}.rs")),
                bytes: source_file_bytes(i),
            });
        }
        d += 1;
    }
    files
}

/// Directory `d` of a source tree, in groups of nine: `crate-NN` itself,
/// then `src-0`, three `src-0/part-K`, `src-1` and three `src-1/part-K`.
fn source_dir(d: usize) -> PathBuf {
    let mut dir = PathBuf::from(format!("crate-{:02}", d / 9));
    if let Some(sub) = (d % 9).checked_sub(1) {
        dir.push(format!("src-{}", sub / 4));
        if sub % 4 > 0 {
            dir.push(format!("part-{}", sub % 4));
        }
    }
    dir
}

/// Size of file `i` of a source tree (see [`source_tree`]).
fn source_file_bytes(i: usize) -> u64 {
    let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
    if h % 100 == 0 {
        (32 << 10) + (h >> 8) % (224 << 10)
    } else {
        // u² over 0..1024: skewed to small files.
        let u = (h >> 8) % 1024;
        512 + (16_384 - 512) * u * u / (1024 * 1024)
    }
}

/// Writes `files` under `root/top` and archives them as `tarball` with the
/// system `tar` (names sorted, owner root, one fixed mtime: the same bytes
/// every time), then removes the tree. Not timed.
pub fn write_source_tarball(
    root: &Path,
    top: &str,
    files: &[SourceFile],
    tarball: &Path,
) -> std::io::Result<()> {
    let tree = root.join(top);
    let max = files.iter().map(|f| f.bytes).max().unwrap_or(0) as usize;
    let text: Vec<u8> = (0..max + 4096)
        .map(|j| {
            if j % 61 == 60 {
                b'\n'
            } else {
                b' ' + (j * 7 % 95) as u8
            }
        })
        .collect();
    for (i, file) in files.iter().enumerate() {
        let path = tree.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| failed("mkdir", dir, e))?;
        }
        let start = i % 4096;
        std::fs::write(&path, &text[start..start + file.bytes as usize])
            .map_err(|e| failed("write", &path, e))?;
    }
    run_tool(
        Command::new("tar")
            .args(["-cf"])
            .arg(tarball)
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@1767225600",
                "-C",
            ])
            .arg(root)
            .arg(top),
        tarball,
    )?;
    std::fs::remove_dir_all(&tree).map_err(|e| failed("removing", &tree, e))
}

/// `tar -xf tarball -C dir` with the system `tar`, timed from its start to
/// its exit; `files` (the archive's regular files) per second.
pub fn untar(tarball: &Path, dir: &Path, files: usize) -> std::io::Result<f64> {
    let start = Instant::now();
    run_tool(
        Command::new("tar")
            .arg("-xf")
            .arg(tarball)
            .arg("-C")
            .arg(dir),
        dir,
    )?;
    Ok(files as f64 / start.elapsed().as_secs_f64())
}

/// `rm -rf tree` with the system `rm`, timed from its start to its exit;
/// `files` per second. Fails if the tree is still there after.
pub fn rm_rf(tree: &Path, files: usize) -> std::io::Result<f64> {
    let start = Instant::now();
    run_tool(Command::new("rm").arg("-rf").arg(tree), tree)?;
    let elapsed = start.elapsed();
    match std::fs::symlink_metadata(tree) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(failed("lstat", tree, err)),
        Ok(_) => {
            return Err(std::io::Error::other(format!(
                "rm -rf {} exited 0 and left it",
                tree.display()
            )))
        }
    }
    Ok(files as f64 / elapsed.as_secs_f64())
}

/// Runs a system tool; its stderr in the error if it fails. `path` is what
/// it works on, for the message.
fn run_tool(command: &mut Command, path: &Path) -> std::io::Result<()> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| failed(&format!("running {program} on"), path, e))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "{program} on {}: {}: {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Writes a [`FSYNC_FILE_BYTES`] file at `path` (fsynced, not timed), then
/// `count` times: a 4 KiB pwrite at a random 4 KiB-aligned offset, then
/// fsync. Returns the fsync latencies alone, sorted, nanoseconds.
pub fn fsync_latencies(path: &Path, count: u64) -> std::io::Result<Vec<u64>> {
    sequential_write(path, FSYNC_FILE_BYTES, SMALL_WRITE_BYTES)
        .map_err(|e| failed("writing", path, e))?;
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| failed("open", path, e))?;
    let blocks = FSYNC_FILE_BYTES / SMALL_WRITE_BYTES as u64;
    let mut buf = [0u8; SMALL_WRITE_BYTES];
    let mut latencies_ns = Vec::with_capacity(count as usize);
    for i in 0..count {
        buf.fill(i as u8);
        let offset = random_block(0, i, blocks) * SMALL_WRITE_BYTES as u64;
        file.write_all_at(&buf, offset)
            .map_err(|e| failed("pwrite", path, e))?;
        let start = Instant::now();
        file.sync_all().map_err(|e| failed("fsync", path, e))?;
        latencies_ns.push(start.elapsed().as_nanos() as u64);
    }
    latencies_ns.sort_unstable();
    Ok(latencies_ns)
}

/// Drops the kernel's page cache (needs root) so the next read is cold.
pub fn drop_page_cache() -> std::io::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3")
}

fn panicked() -> std::io::Error {
    std::io::Error::other("a workload thread panicked")
}

fn mib_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tree_sizes_cover_the_range_and_repeat() {
        let sizes = tree_sizes(200, 1, 20);
        assert_eq!(sizes.len(), 200);
        assert_eq!(*sizes.iter().min().unwrap(), 1 << 20);
        assert_eq!(*sizes.iter().max().unwrap(), 20 << 20);
        assert_eq!(sizes, tree_sizes(200, 1, 20));
    }

    #[test]
    fn workloads_run_on_a_plain_directory() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        assert!(sequential_write(&big, 3 << 20, SEQUENTIAL_CHUNK_BYTES).unwrap() > 0.0);
        assert_eq!(std::fs::metadata(&big).unwrap().len(), 3 << 20);
        assert!(sequential_read(&big, SEQUENTIAL_CHUNK_BYTES).unwrap() > 0.0);
        assert!(random_reads_counted(&big, 4, 50).unwrap() > 0.0);
        let rates = small_files(&dir.path().join("small"), 40, 4).unwrap();
        assert!(rates.create > 0.0 && rates.unlink > 0.0);
        assert_eq!(
            std::fs::read_dir(dir.path().join("small")).unwrap().count(),
            0
        );
        let sizes = tree_sizes(3, 1, 2);
        write_tree(&dir.path().join("tree"), &sizes).unwrap();
        assert!(read_tree(&dir.path().join("tree"), &sizes).unwrap() > 0.0);
        assert!(create_then_unlink(&dir.path().join("nosync"), 40, 4).unwrap() > 0.0);
        assert_eq!(
            std::fs::read_dir(dir.path().join("nosync"))
                .unwrap()
                .count(),
            0
        );
        let fsyncs = fsync_latencies(&dir.path().join("fsync"), 20).unwrap();
        assert_eq!(fsyncs.len(), 20);
        assert!(fsyncs.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn source_tree_is_shaped_like_one_and_repeats() {
        let files = source_tree(20_000);
        assert_eq!(files.len(), 20_000);
        assert_eq!(files, source_tree(20_000));
        let mut per_dir = std::collections::BTreeMap::new();
        for f in &files {
            *per_dir.entry(f.path.parent().unwrap()).or_insert(0usize) += 1;
        }
        let (last, full) = per_dir
            .values()
            .collect::<Vec<_>>()
            .split_last()
            .map(|(l, r)| (**l, r.to_vec()))
            .unwrap();
        assert!(last <= SOURCE_FILES_PER_DIR_MAX);
        assert!(full
            .iter()
            .all(|n| (SOURCE_FILES_PER_DIR_MIN..=SOURCE_FILES_PER_DIR_MAX).contains(*n)));
        assert!(per_dir.keys().any(|d| d.components().count() == 3));
        let small = files
            .iter()
            .filter(|f| (512..=16_384).contains(&f.bytes))
            .count();
        assert!(small > 19_000 && small < 20_000, "{small} small files");
        assert!(files.iter().all(|f| f.bytes <= 256 << 10));
    }

    #[test]
    fn source_tarball_untars_and_removes() {
        let dir = tempfile::tempdir().unwrap();
        let files = source_tree(250);
        let tarball = dir.path().join("src.tar");
        write_source_tarball(dir.path(), "source", &files, &tarball).unwrap();
        assert!(!dir.path().join("source").exists());
        let into = dir.path().join("into");
        std::fs::create_dir(&into).unwrap();
        assert!(untar(&tarball, &into, files.len()).unwrap() > 0.0);
        let one = into.join("source").join(&files[7].path);
        assert_eq!(std::fs::metadata(&one).unwrap().len(), files[7].bytes);
        assert!(rm_rf(&into.join("source"), files.len()).unwrap() > 0.0);
        let err = untar(&dir.path().join("missing.tar"), &into, 1).unwrap_err();
        assert!(err.to_string().contains("tar on"), "{err}");
    }
}
