//! `baton-bench fsclient`: the filesystem workloads on a plain directory,
//! bindfs over a plain directory, and a Baton volume, in one run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::fs::{
    drop_page_cache, random_reads, sequential_read, sequential_write, small_files,
};
use chaos_tests::bench::{rss_kib, Target};
use chaos_tests::mount_guard::workspace_binary;

#[derive(serde::Serialize, Default)]
struct Row {
    target: String,
    write_mib_s: f64,
    read_cold_mib_s: f64,
    read_warm_mib_s: f64,
    rand4k_1t_ops: f64,
    rand4k_4t_ops: f64,
    create_ops: f64,
    stat_ops: f64,
    readdir_ops: f64,
    unlink_ops: f64,
    server_rss_kib: Option<u64>,
}

/// A Baton volume formatted and mounted by the real binaries.
struct Baton {
    base: PathBuf,
    mnt: PathBuf,
    meta_url: String,
}

impl Baton {
    fn format(base: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(base)?;
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", "bench"])
            .arg("--base-dir")
            .arg(base)
            .output()?;
        if !out.status.success() {
            bail!("fsctl format: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mnt = base.join("mnt");
        std::fs::create_dir_all(&mnt)?;
        Ok(Baton {
            base: base.to_path_buf(),
            mnt,
            meta_url: format!("sqlite://{}", base.join("bench/meta.db").display()),
        })
    }

    fn mount(&self) -> anyhow::Result<Target> {
        Target::spawn(
            "baton",
            &self.mnt,
            Command::new(workspace_binary("fsclient"))
                .arg("mount")
                .arg(&self.meta_url)
                .arg(&self.mnt)
                .arg("--base-dir")
                .arg(&self.base)
                .stderr(Stdio::null()),
        )
    }

    /// Unmounts, empties the block cache, and mounts again.
    fn remount_cold(&self, mut target: Target) -> anyhow::Result<Target> {
        let status = Command::new("umount").arg(&self.mnt).status()?;
        anyhow::ensure!(status.success(), "umount {}", self.mnt.display());
        if let Some(server) = target.server.as_mut() {
            server
                .wait_timeout(Duration::from_secs(60))
                .context("fsclient did not exit after umount")?;
        }
        // Its unmount guard must go before the new mount stacks on the path.
        drop(target);
        let cache = self.base.join("bench/cache");
        if cache.exists() {
            std::fs::remove_dir_all(&cache)?;
        }
        self.mount()
    }
}

/// The whole sequence on a target whose cold read needs only a dropped page
/// cache.
fn measure(target: &Target, size_mib: u64, files: usize, seconds: Duration) -> anyhow::Result<Row> {
    let big = target.root.join("big");
    let mut row = Row {
        target: target.name.clone(),
        ..Default::default()
    };
    row.write_mib_s = sequential_write(&big, size_mib << 20, 1 << 20)
        .with_context(|| format!("{}: write", target.name))?;
    drop_page_cache()?;
    row.read_cold_mib_s =
        sequential_read(&big, 1 << 20).with_context(|| format!("{}: cold read", target.name))?;
    row.read_warm_mib_s = sequential_read(&big, 1 << 20)?;
    row.rand4k_1t_ops = random_reads(&big, 1, seconds)?;
    row.rand4k_4t_ops = random_reads(&big, 4, seconds)?;
    let [create, stat, readdir, unlink] = small_files(&target.root.join("small"), files)
        .with_context(|| format!("{}: small files", target.name))?;
    (
        row.create_ops,
        row.stat_ops,
        row.readdir_ops,
        row.unlink_ops,
    ) = (create, stat, readdir, unlink);
    row.server_rss_kib = target.server_rss_kib();
    std::fs::remove_file(&big)?;
    Ok(row)
}

pub fn run(
    dir: &Path,
    size_mib: u64,
    files: usize,
    seconds: Duration,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-bench-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a directory in {}", dir.display()))?;
    let mut rows = Vec::new();

    let plain = root.path().join("plain");
    std::fs::create_dir_all(&plain)?;
    rows.push(measure(
        &Target::plain("plain dir", &plain),
        size_mib,
        files,
        seconds,
    )?);

    match super::which("bindfs") {
        Some(bindfs) => {
            let (src, mnt) = (
                root.path().join("bindfs-src"),
                root.path().join("bindfs-mnt"),
            );
            std::fs::create_dir_all(&src)?;
            std::fs::create_dir_all(&mnt)?;
            let target = Target::spawn(
                "bindfs",
                &mnt,
                Command::new(bindfs)
                    .args(["-f", "--multithreaded"])
                    .arg(&src)
                    .arg(&mnt),
            )?;
            rows.push(measure(&target, size_mib, files, seconds)?);
        }
        None => println!("skipping bindfs: not installed (apt-get install bindfs)"),
    }

    let baton = Baton::format(&root.path().join("baton"))?;
    let mut target = Some(baton.mount()?);
    let big = baton.mnt.join("big");
    let mut row = Row {
        target: "baton".into(),
        ..Default::default()
    };
    row.write_mib_s = sequential_write(&big, size_mib << 20, 1 << 20).context("baton: write")?;
    target = Some(baton.remount_cold(target.take().context("mounted")?)?);
    drop_page_cache()?;
    row.read_cold_mib_s = sequential_read(&big, 1 << 20).context("baton: cold read")?;
    row.read_warm_mib_s = sequential_read(&big, 1 << 20)?;
    row.rand4k_1t_ops = random_reads(&big, 1, seconds)?;
    row.rand4k_4t_ops = random_reads(&big, 4, seconds)?;
    [
        row.create_ops,
        row.stat_ops,
        row.readdir_ops,
        row.unlink_ops,
    ] = small_files(&baton.mnt.join("small"), files).context("baton: small files")?;
    row.server_rss_kib = target
        .as_ref()
        .and_then(|t| t.server.as_ref())
        .and_then(|s| rss_kib(s.0.id()));
    rows.push(row);
    drop(target);

    print_table(&rows, size_mib, files);
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)?;
    }
    Ok(())
}

fn print_table(rows: &[Row], size_mib: u64, files: usize) {
    println!(
        "fsclient: {size_mib} MiB file in 1 MiB writes + fsync; {files} small files; kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "target",
        "write",
        "read cold",
        "read warm",
        "rand4k 1t",
        "rand4k 4t",
        "create",
        "stat",
        "readdir",
        "unlink",
        "rss KiB"
    );
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "", "MiB/s", "MiB/s", "MiB/s", "ops/s", "ops/s", "ops/s", "ops/s", "entries/s", "ops/s", ""
    );
    for r in rows {
        println!(
            "{:<10} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>10.0} {:>9.0} {:>9.0} {:>10.0} {:>9.0} {:>9}",
            r.target, r.write_mib_s, r.read_cold_mib_s, r.read_warm_mib_s, r.rand4k_1t_ops, r.rand4k_4t_ops, r.create_ops, r.stat_ops, r.readdir_ops, r.unlink_ops,
            r.server_rss_kib.map_or("-".into(), |k| k.to_string())
        );
    }
}
