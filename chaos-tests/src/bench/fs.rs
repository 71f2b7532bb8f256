//! Filesystem workloads for `baton-bench fsclient`: sequential write and
//! read of one large file, random 4 KiB reads, and small-file metadata
//! churn. Each returns a throughput figure; targets are plain paths.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

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
        file.write_all(&chunk)?;
        written += chunk_bytes as u64;
    }
    file.sync_all()?;
    Ok(mib_per_sec(written, start.elapsed()))
}

/// Reads the whole file in `chunk_bytes` reads. Returns MiB/s.
pub fn sequential_read(path: &Path, chunk_bytes: usize) -> std::io::Result<f64> {
    let file = File::open(path)?;
    let mut buf = vec![0u8; chunk_bytes];
    let start = Instant::now();
    let mut offset = 0u64;
    loop {
        let n = file.read_at(&mut buf, offset)?;
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    Ok(mib_per_sec(offset, start.elapsed()))
}

/// Random 4 KiB reads over the file by `threads` threads for `duration`.
/// Returns reads per second.
pub fn random_reads(path: &Path, threads: usize, duration: Duration) -> std::io::Result<f64> {
    let file = std::sync::Arc::new(File::open(path)?);
    let blocks = file.metadata()?.len() / 4096;
    let result = super::timed(threads, duration, move |thread, i| {
        let mut buf = [0u8; 4096];
        let block = (i
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(thread as u64 * 7919))
            % blocks.max(1);
        file.read_exact_at(&mut buf, block * 4096)
    });
    Ok(result.ops_per_sec)
}

/// Metadata rates over `count` small files: (create, stat, readdir, unlink)
/// operations per second.
pub fn small_files(dir: &Path, count: usize) -> std::io::Result<[f64; 4]> {
    std::fs::create_dir_all(dir)?;
    let name = |i: usize| dir.join(format!("f{i:06}"));
    let start = Instant::now();
    for i in 0..count {
        File::create(name(i))?.write_all(b"x")?;
    }
    let create = count as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for i in 0..count {
        std::fs::metadata(name(i))?;
    }
    let stat = count as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let listed = std::fs::read_dir(dir)?.count();
    let readdir = listed as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for i in 0..count {
        std::fs::remove_file(name(i))?;
    }
    let unlink = count as f64 / start.elapsed().as_secs_f64();
    Ok([create, stat, readdir, unlink])
}

/// Drops the kernel's page cache (needs root) so the next read is cold.
pub fn drop_page_cache() -> std::io::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3")
}

fn mib_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
}
