//! `baton-bench warmup`: a job's first read of a file set whose blocks are
//! in S3 (the local moto server), with no warmup and after `fsctl warmup`,
//! beside the same first read from local disk (the floor), in one run.
//! Every row starts with the kernel's page cache dropped; the Baton rows
//! also with an empty block cache (a remount), so "first read" means it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chaos_tests::bench::fs::{drop_page_cache, sequential_read, sequential_write};
use chaos_tests::mount_guard::workspace_binary;
use chaos_tests::s3_server::{find_program, S3_SERVER_PROGRAM};

use crate::backends::s3_volume;

/// Bytes per write and read call.
const CHUNK_BYTES: usize = 1 << 20;

/// One row: how long the first read of the whole set took.
struct Row {
    what: &'static str,
    read: Duration,
    warmup: Option<Duration>,
}

pub fn run(dir: &Path, size_mib: u64, files: usize) -> anyhow::Result<()> {
    if find_program(S3_SERVER_PROGRAM).is_none() {
        bail!("{S3_SERVER_PROGRAM} is not installed (pip install 'moto[server]'): this bench reads from S3");
    }
    let files = files.max(1);
    let file_bytes = (size_mib << 20) / files as u64;
    let root = tempfile::Builder::new()
        .prefix("baton-bench-warmup-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a directory in {}", dir.display()))?;
    let mut rows = Vec::new();

    // The floor: the same files on the local disk under the bench.
    let local = root.path().join("local");
    std::fs::create_dir(&local)?;
    let local_files = write_set(&local, files, file_bytes)?;
    rows.push(Row {
        what: "local disk (floor)",
        read: first_read(&local_files)?,
        warmup: None,
    });

    let (server, volume) = s3_volume(root.path())?;
    // A cache that holds the whole set (warmup refuses a larger set).
    let cache_size = format!("{}", (size_mib << 20) + (size_mib << 18) + (64 << 20));
    let mount_args = ["--cache-size", cache_size.as_str()];
    let target = volume.mount_with(&mount_args)?;
    let set_dir = volume.mnt().join("set");
    std::fs::create_dir(&set_dir)?;
    let baton_files = write_set(&set_dir, files, file_bytes)?;

    let target = volume.remount_cold_with(target, &mount_args)?;
    rows.push(Row {
        what: "baton s3, no warmup",
        read: first_read(&baton_files)?,
        warmup: None,
    });

    let target = volume.remount_cold_with(target, &mount_args)?;
    drop_page_cache()?;
    let started = Instant::now();
    let out = Command::new(workspace_binary("fsctl"))
        .args(["warmup", "--json"])
        .arg(&set_dir)
        .output()
        .context("running fsctl warmup")?;
    if !out.status.success() {
        bail!("fsctl warmup: {}", String::from_utf8_lossy(&out.stderr));
    }
    let warmup = started.elapsed();
    rows.push(Row {
        what: "baton s3, after warmup",
        read: first_read(&baton_files)?,
        warmup: Some(warmup),
    });
    drop(target);
    drop(server);
    print_table(&rows, size_mib, files);
    Ok(())
}

/// Writes `files` files of `file_bytes` each in `dir` (fsync each).
fn write_set(dir: &Path, files: usize, file_bytes: u64) -> anyhow::Result<Vec<PathBuf>> {
    (0..files)
        .map(|i| {
            let path = dir.join(format!("part-{i:04}"));
            sequential_write(&path, file_bytes, CHUNK_BYTES)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// Reads every file once, the page cache dropped first.
fn first_read(files: &[PathBuf]) -> anyhow::Result<Duration> {
    drop_page_cache()?;
    let started = Instant::now();
    for path in files {
        sequential_read(path, CHUNK_BYTES)
            .with_context(|| format!("reading {}", path.display()))?;
    }
    Ok(started.elapsed())
}

fn print_table(rows: &[Row], size_mib: u64, files: usize) {
    println!(
        "warmup: first read of {size_mib} MiB in {files} files, page cache dropped; kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<24} {:>10} {:>9} {:>10}",
        "row", "read s", "MiB/s", "warmup s"
    );
    for r in rows {
        let seconds = r.read.as_secs_f64();
        println!(
            "{:<24} {:>10.2} {:>9.0} {:>10}",
            r.what,
            seconds,
            size_mib as f64 / seconds.max(f64::MIN_POSITIVE),
            r.warmup
                .map_or("-".to_string(), |w| format!("{:.2}", w.as_secs_f64()))
        );
    }
}
