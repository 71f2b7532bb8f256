//! `baton-bench backends`: the same Baton workload on the embedded default
//! (SQLite + local directory), on S3 (a local moto server) and on
//! PostgreSQL metadata (a server you name), one row each.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::fs::{
    drop_page_cache, random_reads, sequential_read, sequential_write, small_files,
};
use chaos_tests::bench::Target;
use chaos_tests::mount_guard::workspace_binary;
use chaos_tests::s3_server::{
    find_program, S3Server, S3_SERVER_PROGRAM, S3_TEST_ACCESS_KEY_ID, S3_TEST_SECRET_ACCESS_KEY,
};

/// One backend's results.
#[derive(serde::Serialize, Default)]
struct Row {
    backend: String,
    write_mib_s: f64,
    read_cold_mib_s: f64,
    read_warm_mib_s: f64,
    rand4k_4t_ops: f64,
    create_ops: f64,
    stat_ops: f64,
    readdir_ops: f64,
    unlink_ops: f64,
}

/// A formatted volume of one backend.
pub(crate) struct Volume {
    name: &'static str,
    base: PathBuf,
    volume: String,
}

fn with_s3_credentials(command: &mut Command) -> &mut Command {
    command
        .env("AWS_ACCESS_KEY_ID", S3_TEST_ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", S3_TEST_SECRET_ACCESS_KEY)
}

impl Volume {
    pub(crate) fn format(
        name: &'static str,
        base: &Path,
        args: &[String],
    ) -> anyhow::Result<Volume> {
        std::fs::create_dir_all(base.join("mnt"))?;
        let out = with_s3_credentials(&mut Command::new(workspace_binary("fsctl")))
            .args(["format", "bench"])
            .args(args)
            .arg("--base-dir")
            .arg(base)
            .output()?;
        if !out.status.success() {
            bail!(
                "{name}: fsctl format: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let volume = args
            .iter()
            .position(|a| a == "--meta")
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| "bench".into());
        Ok(Volume {
            name,
            base: base.to_path_buf(),
            volume,
        })
    }

    pub(crate) fn mnt(&self) -> PathBuf {
        self.base.join("mnt")
    }

    fn mount(&self) -> anyhow::Result<Target> {
        self.mount_with(&[])
    }

    /// `fsclient mount` with `extra` options (e.g. `--cache-size`).
    pub(crate) fn mount_with(&self, extra: &[&str]) -> anyhow::Result<Target> {
        Target::spawn(
            self.name,
            &self.mnt(),
            with_s3_credentials(&mut Command::new(workspace_binary("fsclient")))
                .args(["mount", &self.volume])
                .arg(self.mnt())
                .arg("--base-dir")
                .arg(&self.base)
                .args(extra)
                .stderr(Stdio::null()),
        )
    }

    fn remount_cold(&self, target: Target) -> anyhow::Result<Target> {
        self.remount_cold_with(target, &[])
    }

    /// Unmounts, empties every local block cache, and mounts again.
    pub(crate) fn remount_cold_with(
        &self,
        mut target: Target,
        extra: &[&str],
    ) -> anyhow::Result<Target> {
        let status = Command::new("umount").arg(self.mnt()).status()?;
        anyhow::ensure!(status.success(), "umount {}", self.mnt().display());
        if let Some(server) = target.server.as_mut() {
            server
                .wait_timeout(Duration::from_secs(120))
                .context("fsclient did not exit after umount")?;
        }
        drop(target);
        for entry in std::fs::read_dir(&self.base)?.flatten() {
            let cache = entry.path().join("cache");
            if cache.is_dir() {
                std::fs::remove_dir_all(&cache)?;
            }
        }
        self.mount_with(extra)
    }

    fn measure(&self, size_mib: u64, files: usize, seconds: Duration) -> anyhow::Result<Row> {
        let mut target = Some(self.mount()?);
        let big = self.mnt().join("big");
        let mut row = Row {
            backend: self.name.into(),
            ..Default::default()
        };
        let ctx = |what: &str| format!("{}: {what}", self.name);
        row.write_mib_s =
            sequential_write(&big, size_mib << 20, 1 << 20).with_context(|| ctx("write"))?;
        target = Some(self.remount_cold(target.take().context("mounted")?)?);
        drop_page_cache()?;
        row.read_cold_mib_s = sequential_read(&big, 1 << 20).with_context(|| ctx("cold read"))?;
        row.read_warm_mib_s = sequential_read(&big, 1 << 20)?;
        row.rand4k_4t_ops = random_reads(&big, 4, seconds)?;
        let rates =
            small_files(&self.mnt().join("small"), files, 1).with_context(|| ctx("small files"))?;
        row.create_ops = rates.create;
        row.stat_ops = rates.stat;
        row.readdir_ops = rates.readdir;
        row.unlink_ops = rates.unlink;
        drop(target);
        Ok(row)
    }
}

/// A local moto S3 server with a bucket, and a volume formatted on it
/// under `root/s3`.
pub(crate) fn s3_volume(root: &Path) -> anyhow::Result<(S3Server, Volume)> {
    let server = S3Server::start_or_skip("bench", root, false).context("starting moto_server")?;
    server.create_bucket("bench");
    let args = [
        "--storage".to_string(),
        "s3://bench/vol".into(),
        "--s3-endpoint".into(),
        server.endpoint(),
    ];
    let volume = Volume::format("s3 (moto)", &root.join("s3"), &args)?;
    Ok((server, volume))
}

fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = Command::new("psql")
        .args(["-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
        .output()
        .context("running psql")?;
    if !out.status.success() {
        bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub fn run(
    dir: &Path,
    size_mib: u64,
    files: usize,
    seconds: Duration,
    postgres_url: Option<&str>,
) -> anyhow::Result<()> {
    let root = tempfile::Builder::new()
        .prefix("baton-bench-backends-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a directory in {}", dir.display()))?;
    let mut rows = Vec::new();
    let embedded = Volume::format("embedded", &root.path().join("embedded"), &[])?;
    rows.push(embedded.measure(size_mib, files, seconds)?);

    let mut s3 = None;
    if find_program(S3_SERVER_PROGRAM).is_some() {
        let (server, volume) = s3_volume(root.path())?;
        rows.push(volume.measure(size_mib, files, seconds)?);
        s3 = Some(server);
    } else {
        println!("skipping S3: {S3_SERVER_PROGRAM} is not installed (pip install 'moto[server]')");
    }
    drop(s3);

    match postgres_url {
        Some(admin) => {
            let db = format!("baton_bench_{}", std::process::id());
            psql(admin, &format!("CREATE DATABASE {db}"))?;
            let url = format!(
                "{}/{db}",
                admin.rsplit_once('/').map_or(admin, |(base, _)| base)
            );
            let args = ["--meta".to_string(), url];
            let measured = Volume::format("postgres", &root.path().join("pg"), &args)
                .and_then(|v| v.measure(size_mib, files, seconds));
            let dropped = psql(admin, &format!("DROP DATABASE {db} WITH (FORCE)"));
            rows.push(measured?);
            dropped?;
        }
        None => println!("skipping PostgreSQL: give --postgres-url (or BATON_TEST_POSTGRES_URL)"),
    }
    print_table(&rows, size_mib, files);
    Ok(())
}

fn print_table(rows: &[Row], size_mib: u64, files: usize) {
    println!(
        "backends: {size_mib} MiB file in 1 MiB writes + fsync, cold read after remount with empty caches; {files} small files; kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9}",
        "backend",
        "write",
        "read cold",
        "read warm",
        "rand4k 4t",
        "create",
        "stat",
        "readdir",
        "unlink"
    );
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9}",
        "", "MiB/s", "MiB/s", "MiB/s", "ops/s", "ops/s", "ops/s", "entries/s", "ops/s"
    );
    for r in rows {
        println!(
            "{:<10} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>9.0} {:>9.0} {:>10.0} {:>9.0}",
            r.backend,
            r.write_mib_s,
            r.read_cold_mib_s,
            r.read_warm_mib_s,
            r.rand4k_4t_ops,
            r.create_ops,
            r.stat_ops,
            r.readdir_ops,
            r.unlink_ops
        );
    }
}
