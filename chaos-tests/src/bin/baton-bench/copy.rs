//! `baton-bench copy`: `cp --reflink=auto` of one large file to a new file
//! beside it (coreutils `cp` calls copy_file_range(2)) on a plain
//! directory, bindfs over one and Baton, in one invocation. On Baton the
//! kernel sends COPY_FILE_RANGE and whole blocks are shared, not copied;
//! bindfs does not implement it, so the kernel copies through read and
//! write; the plain directory (ext4, no reflink) copies in the kernel.
//! `cp` is timed to its exit (its close commits Baton's edges), then the
//! copy's fsync apart (`sync FILE`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chaos_tests::bench::fs::{drop_page_cache, sequential_write};
use chaos_tests::bench::Spread;

use crate::compare::{mount, BATON, BINDFS, PLAIN};

/// Bytes per write of the source file.
const CHUNK_BYTES: usize = 1 << 20;

/// One target's figures: seconds per run of `cp`, and of the fsync after.
struct Row {
    name: &'static str,
    cp_s: Spread,
    fsync_s: Spread,
}

pub fn run(dir: &Path, size_mib: u64, runs: usize) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-bench-copy-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a directory in {}", dir.display()))?;
    let size_bytes = size_mib << 20;
    let mut rows = Vec::new();
    for name in [PLAIN, BINDFS, BATON] {
        let target_dir = root.path().join(name.replace(' ', "-"));
        let mounted = match mount(name, &target_dir)? {
            Ok(m) => m,
            Err(reason) => {
                println!("{name}: skipped ({reason})");
                continue;
            }
        };
        let row = measure(name, &mounted.root, size_bytes, runs.max(1))?;
        drop(mounted);
        rows.push(row);
    }
    print_table(size_mib, &rows);
    Ok(())
}

fn measure(name: &'static str, root: &Path, size_bytes: u64, runs: usize) -> anyhow::Result<Row> {
    let src = root.join("src");
    sequential_write(&src, size_bytes, CHUNK_BYTES)
        .with_context(|| format!("writing {}", src.display()))?;
    let (mut cp_s, mut fsync_s) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let dst = root.join(format!("copy-{run}"));
        drop_page_cache().context("dropping the page cache (needs root)")?;
        cp_s.push(timed("cp", |c| {
            c.args(["--reflink=auto"]).arg(&src).arg(&dst)
        })?);
        fsync_s.push(timed("sync", |c| c.arg(&dst))?);
        let copied = std::fs::metadata(&dst)?.len();
        if copied != size_bytes {
            bail!("{name}: the copy has {copied} bytes, not {size_bytes}");
        }
        std::fs::remove_file(&dst)?;
        println!(
            "{name}: run {}: cp {:.3} s, fsync {:.3} s",
            run + 1,
            cp_s[run],
            fsync_s[run]
        );
    }
    std::fs::remove_file(&src)?;
    Ok(Row {
        name,
        cp_s: Spread::of(cp_s),
        fsync_s: Spread::of(fsync_s),
    })
}

/// Seconds `program` (with the arguments `args` adds) took; it must succeed.
fn timed(program: &str, args: impl Fn(&mut Command) -> &mut Command) -> anyhow::Result<f64> {
    let mut command = Command::new(program);
    args(&mut command);
    let start = Instant::now();
    let out = command
        .output()
        .with_context(|| format!("running {program}"))?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!("{program}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(secs(elapsed))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn print_table(size_mib: u64, rows: &[Row]) {
    println!();
    println!("cp --reflink=auto of a {size_mib} MiB file (median (min-max) of the runs)");
    println!(
        "{:<10} {:>24} {:>10} {:>24} {:>10}",
        "target", "cp s", "GiB/s", "fsync of the copy s", "bindfs/x"
    );
    let bindfs = rows
        .iter()
        .find(|r| r.name == BINDFS)
        .map(|r| r.cp_s.median);
    for r in rows {
        let gib_s = (size_mib as f64 / 1024.0) / r.cp_s.median.max(f64::EPSILON);
        let speedup = bindfs.map_or("-".to_string(), |b| {
            format!("{:.0}x", b / r.cp_s.median.max(f64::EPSILON))
        });
        println!(
            "{:<10} {:>24} {:>10.1} {:>24} {:>10}",
            r.name,
            spread(&r.cp_s),
            gib_s,
            spread(&r.fsync_s),
            speedup
        );
    }
}

fn spread(s: &Spread) -> String {
    format!("{:.4} ({:.4}-{:.4})", s.median, s.min, s.max)
}
