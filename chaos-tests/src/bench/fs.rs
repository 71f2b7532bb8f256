//! Filesystem workloads for `baton-bench fs`: sequential write and read of
//! one large file, a sequential write in small writes (as an application
//! writing a log or a checkpoint through a buffered stream does), random 4 KiB reads (a fixed count right after caches were
//! dropped, or for a duration once warm), small-file metadata churn on
//! several threads, and a many-file tree read in order the way a model
//! loader reads its shards. Each returns a throughput figure; targets are
//! plain paths, so the same code measures every filesystem.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The read and write size of the sequential workloads.
pub const SEQUENTIAL_CHUNK_BYTES: usize = 1 << 20;
/// The write size of the small-writes workload.
pub const SMALL_WRITE_BYTES: usize = 4096;
/// Files per directory of the many-file tree.
pub const TREE_FILES_PER_DIR: usize = 20;

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
    }
}
