//! `baton-bench fs`: the filesystem workloads on every target in one
//! invocation (a plain directory, bindfs over one, `rclone mount` of a local
//! directory, the floor, and Baton mounted through fs-supervisor), repeated
//! `runs` times; then the Baton-only figures (generation and supervisor memory,
//! kill -9 stall). Prints a table of medians (min-max) with Baton's ratio to
//! each baseline, and writes the same as JSON with `--json`. A ratio above 1
//! always means Baton is better: it is Baton's figure over the baseline's,
//! except on latency rows (unit µs, `lower_is_better` in the JSON), where
//! it is the baseline's over Baton's.
//!
//! The floor (`memfs floor`) is the in-memory test filesystem served over
//! fuse-wire with Baton's INIT flags, timeouts and open flags
//! (`baton-testfs serve --like-baton`): what the kernel and the transport
//! cost Baton on each row, with no storage behind it. Baton over the floor
//! is the share of that bound Baton reaches.
//!
//! The small-file rows of issue 28 are measured as users run them: `unlink,
//! no sync before` unlinks files straight after creating them (the `unlink`
//! row syncs and waits for a quiet machine first); `untar` and `rm -rf
//! after untar` run the system `tar -xf` of a source tree (generated once per
//! invocation, the same for every target) and then `rm -rf` of it at once;
//! `fsync 4K dirty` times fsync after a 4 KiB write; `rand 4K read cold N s`
//! reads a cold file for N seconds while the cache fills.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use chaos_tests::bench::fs::{
    create_small_files, create_then_unlink, drop_page_cache, fsync_latencies, random_reads,
    random_reads_counted, read_tree, rm_rf, sequential_read, sequential_write, source_tree,
    tree_sizes, unlink_small_files, untar, write_source_tarball, write_tree,
    SEQUENTIAL_CHUNK_BYTES, SMALL_WRITE_BYTES,
};
use chaos_tests::bench::{status_kib, Spread, Target};
use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};

use super::stall;
use super::supervised::{fsctl, generation_pids};

/// Sizes and counts of one `baton-bench fs` invocation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Options {
    pub size_mib: u64,
    pub files: usize,
    pub seconds: f64,
    pub cold_reads: u64,
    /// Seconds of the sustained cold random-read run (0 skips it).
    pub cold_seconds: f64,
    /// Files of the untarred source tree (0 skips untar and rm -rf).
    pub untar_files: usize,
    /// fsyncs of the fsync-latency workload (0 skips it).
    pub fsyncs: u64,
    pub tree_files: usize,
    pub tree_min_mib: u64,
    pub tree_max_mib: u64,
    pub runs: usize,
    pub idle_mounts: usize,
    pub stall_kills: usize,
    pub targets: Vec<String>,
    /// How long to wait at most for a quiet machine before each
    /// measurement ([`quiet`]).
    #[serde(rename = "quiet_wait_s", serialize_with = "seconds")]
    pub quiet_wait: Duration,
    #[serde(skip)]
    pub dir: PathBuf,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The names the table and the JSON use.
pub(crate) const PLAIN: &str = "plain dir";
pub(crate) const BINDFS: &str = "bindfs";
const RCLONE: &str = "rclone";
const FLOOR: &str = "memfs floor";
/// The entry and attribute timeout Baton gives the kernel on a volume only
/// it serves (fsclient's `EXCLUSIVE_ATTR_TTL`), for the floor.
const BATON_EXCLUSIVE_TTL_SECS: &str = "60";
pub(crate) const BATON: &str = "baton";

/// One measured figure: which workload, in what unit, on how many threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
struct Key {
    workload: &'static str,
    unit: &'static str,
    threads: usize,
    /// A latency: the ratios are inverted so that above 1 still means
    /// Baton is better.
    lower_is_better: bool,
}

/// A rate (higher is better).
const fn key(workload: &'static str, unit: &'static str, threads: usize) -> Key {
    Key {
        workload,
        unit,
        threads,
        lower_is_better: false,
    }
}

/// A latency in microseconds on one thread (lower is better).
const fn latency_key(workload: &'static str) -> Key {
    Key {
        workload,
        unit: "µs",
        threads: 1,
        lower_is_better: true,
    }
}

const SEQ_WRITE: Key = key("seq write + fsync", "MiB/s", 1);
const SMALL_WRITES: Key = key("4K writes + fsync", "MiB/s", 1);
const SEQ_READ_COLD: Key = key("seq read cold", "MiB/s", 1);
const SEQ_READ_WARM: Key = key("seq read warm", "MiB/s", 1);
const TREE_READ_COLD: Key = key("many-file read cold", "MiB/s", 1);
const UNTAR: Key = key("untar", "files/s", 1);
const RM_AFTER_UNTAR: Key = key("rm -rf after untar", "files/s", 1);
const FSYNC_P50: Key = latency_key("fsync 4K dirty p50");
const FSYNC_P99: Key = latency_key("fsync 4K dirty p99");
/// The unlinks of files just created, with no sync or wait in between
/// (the `unlink` row has both).
const UNLINK_NO_SYNC: &str = "unlink, no sync before";

/// What one invocation prepares once for every target.
struct Prepared {
    /// The sustained cold random-read row, labelled with its seconds,
    /// unless `--cold-seconds 0`.
    cold_sustained: Option<Key>,
    /// The source tree's tarball, unless `--untar-files 0`.
    tarball: Option<PathBuf>,
}

/// The top directory in the source tarball.
const SOURCE_TOP: &str = "source";

impl Prepared {
    /// Labels the sustained cold row; writes the source tarball in `root`.
    fn new(root: &Path, o: &Options) -> anyhow::Result<Prepared> {
        // `Key` holds `&'static str`s (it is `Copy`); one label per
        // invocation is leaked.
        let cold_sustained = (o.cold_seconds > 0.0).then(|| {
            let label = format!("rand 4K read cold {} s", o.cold_seconds);
            key(Box::leak(label.into_boxed_str()), "ops/s", 1)
        });
        let tarball = if o.untar_files > 0 {
            println!(
                "== writing a source tree of {} files and its tarball",
                o.untar_files
            );
            let tarball = root.join("source.tar");
            write_source_tarball(root, SOURCE_TOP, &source_tree(o.untar_files), &tarball)
                .context("writing the source tarball")?;
            Some(tarball)
        } else {
            None
        };
        Ok(Prepared {
            cold_sustained,
            tarball,
        })
    }
}

/// Every row, in table order (without those a `0` flag skips).
fn all_keys(o: &Options, p: &Prepared) -> Vec<Key> {
    let mut keys = vec![SEQ_WRITE, SMALL_WRITES, SEQ_READ_COLD, SEQ_READ_WARM];
    for threads in [1, 4] {
        keys.push(key("rand 4K read cold", "ops/s", threads));
    }
    keys.extend(p.cold_sustained);
    for threads in [1, 4] {
        keys.push(key("rand 4K read warm", "ops/s", threads));
    }
    for (workload, unit) in [
        ("create", "ops/s"),
        ("stat", "ops/s"),
        ("readdir", "entries/s"),
        ("unlink", "ops/s"),
        (UNLINK_NO_SYNC, "ops/s"),
    ] {
        for threads in [1, 4] {
            keys.push(key(workload, unit, threads));
        }
    }
    if p.tarball.is_some() {
        keys.extend([UNTAR, RM_AFTER_UNTAR]);
    }
    if o.fsyncs > 0 {
        keys.extend([FSYNC_P50, FSYNC_P99]);
    }
    keys.push(TREE_READ_COLD);
    keys
}

/// A Baton volume mounted through its own fs-supervisor.
struct Supervised {
    socket: PathBuf,
    base: PathBuf,
    volume: String,
    mnt: PathBuf,
    guard: Option<MountGuard>,
    /// Highest VmHWM of any generation that served this mount, KiB.
    busy_hwm_kib: u64,
    _supervisor: ChildGuard,
}

impl Supervised {
    /// Starts fs-supervisor (warm standby on: the product's default) in
    /// `dir`; mounts nothing yet.
    fn start(dir: &Path, volume: &str) -> anyhow::Result<Supervised> {
        let socket = dir.join("supervisor.sock");
        let supervisor = ChildGuard(
            Command::new(workspace_binary("fs-supervisor"))
                .arg("--socket")
                .arg(&socket)
                .arg("--state-dir")
                .arg(dir.join("state"))
                .args(["--cgroup-parent", "baton-bench"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting fs-supervisor")?,
        );
        if !wait_until(Duration::from_secs(20), || socket.exists()) {
            bail!(
                "fs-supervisor did not open {} within 20 s",
                socket.display()
            );
        }
        let base = dir.join("base");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt)?;
        format_volume(&base, volume)?;
        Ok(Supervised {
            socket,
            base,
            volume: volume.to_string(),
            mnt,
            guard: None,
            busy_hwm_kib: 0,
            _supervisor: supervisor,
        })
    }

    /// Mounts the volume as a user would (its objects in a local directory
    /// are read in place: no block cache) after any block cache directory
    /// was removed.
    fn mount_cold(&mut self) -> anyhow::Result<()> {
        let cache = self.base.join(&self.volume).join("cache");
        if cache.exists() {
            std::fs::remove_dir_all(&cache)
                .with_context(|| format!("removing the old cache {}", cache.display()))?;
        }
        mount_volume(&self.socket, &self.base, &self.volume, &self.mnt)?;
        self.guard = Some(MountGuard::new(&self.mnt));
        Ok(())
    }

    /// Unmounts through the supervisor (the generation flushes), after
    /// noting the generation's peak RSS.
    fn umount(&mut self) -> anyhow::Result<()> {
        self.sample_busy();
        let mnt = self.mnt.to_str().context("utf-8 mountpoint")?;
        fsctl(&self.socket, &["umount", mnt])?;
        self.guard = None;
        Ok(())
    }

    fn remount_cold(&mut self) -> anyhow::Result<()> {
        self.umount()?;
        self.mount_cold()
    }

    fn generation_pid(&self) -> anyhow::Result<u32> {
        generation_pids(&self.socket)?
            .first()
            .copied()
            .context("fsctl status lists no serving generation")
    }

    fn sample_busy(&mut self) {
        if let Some(kib) = self
            .generation_pid()
            .ok()
            .and_then(|pid| status_kib(pid, "VmHWM"))
        {
            self.busy_hwm_kib = self.busy_hwm_kib.max(kib);
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.guard.is_some() {
            if let Err(err) = self.umount() {
                eprintln!("baton-bench: unmounting {}: {err:#}", self.mnt.display());
            }
        }
    }
}

fn format_volume(base: &Path, volume: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(base)?;
    let out = Command::new(workspace_binary("fsctl"))
        .args(["format", volume])
        .arg("--base-dir")
        .arg(base)
        .output()
        .context("running fsctl format")?;
    if !out.status.success() {
        bail!(
            "fsctl format {volume}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn mount_volume(socket: &Path, base: &Path, volume: &str, mnt: &Path) -> anyhow::Result<()> {
    fn utf8(p: &Path) -> anyhow::Result<&str> {
        p.to_str().context("utf-8 path")
    }
    fsctl(
        socket,
        &["mount", volume, utf8(mnt)?, "--base-dir", utf8(base)?],
    )
    .map(|_| ())
}

/// A mounted target and how to make its caches cold.
pub(crate) struct Mounted {
    name: &'static str,
    pub(crate) root: PathBuf,
    _target: Option<Target>,
    baton: Option<Supervised>,
}

impl Mounted {
    /// Drops the page cache; Baton is remounted with an empty block cache
    /// first.
    fn cold(&mut self) -> anyhow::Result<()> {
        if let Some(baton) = self.baton.as_mut() {
            baton.remount_cold().context("remounting Baton cold")?;
        }
        drop_page_cache().context("dropping the page cache (needs root)")
    }
}

/// Finds `program`, installing Debian `package` if it is missing; the
/// reason as `Err` when it cannot be had.
fn ensure_installed(program: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(path) = super::which(program) {
        return Ok(path);
    }
    println!("{program} not found: apt-get install -y {package}");
    let installed = Command::new("apt-get")
        .args(["install", "-y", "-q", package])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match installed {
        Ok(out) if out.status.success() => {
            super::which(program).ok_or_else(|| format!("{package} installed but no {program}"))
        }
        Ok(out) => Err(format!(
            "apt-get install {package} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(err) => Err(format!("cannot run apt-get: {err}")),
    }
}

/// Mounts target `name` under `dir`.
pub(crate) fn mount(name: &'static str, dir: &Path) -> anyhow::Result<Result<Mounted, String>> {
    std::fs::create_dir_all(dir)?;
    let (src, mnt) = (dir.join("src"), dir.join("mnt"));
    let fuse = |program: PathBuf, args: &[&str]| -> anyhow::Result<Mounted> {
        std::fs::create_dir_all(&src)?;
        std::fs::create_dir_all(&mnt)?;
        let target = Target::spawn(
            name,
            &mnt,
            Command::new(program)
                .args(args)
                .arg(&src)
                .arg(&mnt)
                .stderr(Stdio::null()),
        )?;
        Ok(Mounted {
            name,
            root: mnt.clone(),
            _target: Some(target),
            baton: None,
        })
    };
    Ok(Ok(match name {
        PLAIN => {
            std::fs::create_dir_all(&src)?;
            Mounted {
                name,
                root: src,
                _target: None,
                baton: None,
            }
        }
        BINDFS => match ensure_installed("bindfs", "bindfs") {
            Ok(bindfs) => fuse(bindfs, &["-f", "--multithreaded"])?,
            Err(reason) => return Ok(Err(reason)),
        },
        RCLONE => match ensure_installed("rclone", "rclone") {
            Ok(rclone) => fuse(rclone, &["mount", "--vfs-cache-mode", "off"])?,
            Err(reason) => return Ok(Err(reason)),
        },
        FLOOR => {
            let testfs = workspace_binary("baton-testfs");
            if !testfs.exists() {
                return Ok(Err(format!(
                    "{} not found: cargo build --release -p chaos-tests",
                    testfs.display()
                )));
            }
            std::fs::create_dir_all(&mnt)?;
            let target = Target::spawn(
                name,
                &mnt,
                Command::new(testfs)
                    .args(["serve", "--like-baton", "--threads", "4", "--cache-secs"])
                    .arg(BATON_EXCLUSIVE_TTL_SECS)
                    .arg("--mount")
                    .arg(&mnt)
                    .stderr(Stdio::null()),
            )?;
            Mounted {
                name,
                root: mnt.clone(),
                _target: Some(target),
                baton: None,
            }
        }
        _ => {
            let mut baton = Supervised::start(dir, "bench")?;
            baton.mount_cold()?;
            Mounted {
                name,
                root: baton.mnt.clone(),
                _target: None,
                baton: Some(baton),
            }
        }
    }))
}

/// One pass of every workload on a mounted target.
fn run_once(t: &mut Mounted, o: &Options, p: &Prepared) -> anyhow::Result<Vec<(Key, f64)>> {
    let mut out = Vec::new();
    let big = t.root.join("big");
    let seconds = crate::seconds_arg("--seconds", o.seconds)?;
    out.push((
        SEQ_WRITE,
        sequential_write(&big, o.size_mib << 20, SEQUENTIAL_CHUNK_BYTES).context("seq write")?,
    ));
    // A quarter of the big file's size: on a filesystem that makes each
    // small write a round trip this is the slowest workload.
    let small = t.root.join("small-writes");
    out.push((
        SMALL_WRITES,
        sequential_write(&small, (o.size_mib << 20) / 4, SMALL_WRITE_BYTES)
            .context("small writes")?,
    ));
    std::fs::remove_file(&small).context("removing the small-writes file")?;
    t.cold()?;
    out.push((
        SEQ_READ_COLD,
        sequential_read(&t.root.join("big"), SEQUENTIAL_CHUNK_BYTES).context("cold read")?,
    ));
    out.push((
        SEQ_READ_WARM,
        sequential_read(&big, SEQUENTIAL_CHUNK_BYTES).context("warm read")?,
    ));
    for threads in [1, 4] {
        t.cold()?;
        let ops = random_reads_counted(&big, threads, o.cold_reads).context("cold random")?;
        out.push((key("rand 4K read cold", "ops/s", threads), ops));
    }
    if let Some(cold_sustained) = p.cold_sustained {
        // Sustained: the cache fills as the run goes on.
        t.cold()?;
        let ops = random_reads(
            &big,
            1,
            crate::seconds_arg("--cold-seconds", o.cold_seconds)?,
        )
        .with_context(|| format!("sustained cold random reads of {}", big.display()))?;
        out.push((cold_sustained, ops));
    }
    // Warm the whole file again after the cold remounts.
    sequential_read(&big, SEQUENTIAL_CHUNK_BYTES).context("warming read")?;
    for threads in [1, 4] {
        let ops = random_reads(&big, threads, seconds).context("warm random")?;
        out.push((key("rand 4K read warm", "ops/s", threads), ops));
    }
    std::fs::remove_file(&big).context("removing the big file")?;
    // Every create before any unlink. Without a journal (this VM's disk),
    // ext4 avoids an inode for 60 s after its deletion (360 s while its
    // inode table block is unwritten) and each allocation scans past such
    // inodes: creates right after an unlink burst timed that scan. Before
    // each phase a quiet machine: a deferred delete (the big file's, an
    // unlink burst's) is not timed as part of the next one, and the files
    // unlinked have reached the disk, as files usually have (one unlinked
    // before writeback never had a block, and freeing nothing is fast).
    let small_dir = |threads: usize| t.root.join(format!("small-{threads}"));
    for threads in [1, 4] {
        quiet(o);
        let rates =
            create_small_files(&small_dir(threads), o.files, threads).context("small files")?;
        out.push((key("create", "ops/s", threads), rates.create));
        out.push((key("stat", "ops/s", threads), rates.stat));
        out.push((key("readdir", "entries/s", threads), rates.readdir));
    }
    for threads in [1, 4] {
        quiet(o);
        let dir = small_dir(threads);
        let rate = unlink_small_files(&dir, o.files, threads).context("unlinking small files")?;
        out.push((key("unlink", "ops/s", threads), rate));
        std::fs::remove_dir(&dir).context("removing the small-file directory")?;
    }
    out.extend(small_files_as_users_run_them(t, o, p)?);
    quiet(o);
    let sizes = tree_sizes(o.tree_files, o.tree_min_mib, o.tree_max_mib);
    let tree = t.root.join("tree");
    write_tree(&tree, &sizes).context("writing the many-file tree")?;
    t.cold()?;
    out.push((
        TREE_READ_COLD,
        read_tree(&t.root.join("tree"), &sizes).context("reading the tree")?,
    ));
    std::fs::remove_dir_all(&tree).context("removing the tree")?;
    Ok(out)
}

/// The rows of issue 28, each as users run it: unlinks straight after the
/// creates, an untar then at once `rm -rf` of it, and fsync after a small
/// write. A quiet machine before each, none inside.
fn small_files_as_users_run_them(
    t: &Mounted,
    o: &Options,
    p: &Prepared,
) -> anyhow::Result<Vec<(Key, f64)>> {
    let mut out = Vec::new();
    for threads in [1, 4] {
        quiet(o);
        let dir = t.root.join(format!("nosync-{threads}"));
        let rate = create_then_unlink(&dir, o.files, threads)
            .context("creating then unlinking small files")?;
        out.push((key(UNLINK_NO_SYNC, "ops/s", threads), rate));
        std::fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    if let Some(tarball) = p.tarball.as_deref() {
        // The tarball read from the page cache: the target's writes timed,
        // not the read of the archive.
        sequential_read(tarball, SEQUENTIAL_CHUNK_BYTES)
            .with_context(|| format!("reading {}", tarball.display()))?;
        quiet(o);
        out.push((
            UNTAR,
            untar(tarball, &t.root, o.untar_files).context("untar of the source tree")?,
        ));
        out.push((
            RM_AFTER_UNTAR,
            rm_rf(&t.root.join(SOURCE_TOP), o.untar_files).context("rm -rf of the source tree")?,
        ));
    }
    if o.fsyncs > 0 {
        quiet(o);
        let path = t.root.join("fsync-1m");
        match fsync_latencies(&path, o.fsyncs) {
            Ok(latencies_ns) => {
                let us = |q| chaos_tests::bench::percentile(&latencies_ns, q) / 1000.0;
                out.push((FSYNC_P50, us(0.5)));
                out.push((FSYNC_P99, us(0.99)));
            }
            // `rclone mount` without a VFS cache cannot write into a file
            // it has closed (EPERM): it has no fsync rows.
            Err(err) if t.name == RCLONE && err.kind() == ErrorKind::PermissionDenied => {
                println!("   {}: no fsync rows ({err})", t.name);
            }
            Err(err) => return Err(err).context("fsync latency"),
        }
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(out)
}

/// Baton-only figures.
#[derive(Debug, Default, serde::Serialize)]
struct BatonOnly {
    idle_generation_rss_kib: Option<u64>,
    idle_generation_hwm_kib: Option<u64>,
    busy_generation_hwm_kib: Option<u64>,
    idle_mounts: usize,
    supervisor_rss_kib_with_idle_mounts: Option<u64>,
    supervisor_hwm_kib_with_idle_mounts: Option<u64>,
    kill9_stall_ms: Option<StallFigures>,
    /// The planned-upgrade stall: the slowest application call that
    /// overlapped each upgrade.
    upgrade_stall_ms: Option<StallFigures>,
    /// The same upgrades as the supervisor measures them (old generation
    /// stops reading → new one reads).
    upgrade_gap_ms: Option<StallFigures>,
    /// The control: the slowest application call in an equally long window
    /// between two upgrades.
    upgrade_quiet_ms: Option<StallFigures>,
}

#[derive(Debug, serde::Serialize)]
struct StallFigures {
    events: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

/// One row of the table. The `baton_vs_*` ratios are above 1 when Baton
/// is better: Baton's median over the baseline's, or the inverse on a
/// `lower_is_better` row.
#[derive(serde::Serialize)]
struct Row {
    #[serde(flatten)]
    key: Key,
    results: BTreeMap<&'static str, Spread>,
    baton_vs_plain: Option<f64>,
    baton_vs_bindfs: Option<f64>,
    baton_vs_rclone: Option<f64>,
    baton_vs_floor: Option<f64>,
}

#[derive(serde::Serialize)]
struct Report {
    kernel: String,
    cpus: usize,
    /// The filesystem under `--dir` (`chaos_tests::bench::disk`).
    disk: String,
    options: Options,
    targets: Vec<&'static str>,
    skipped: BTreeMap<&'static str, String>,
    rows: Vec<Row>,
    baton: BatonOnly,
    errors: Vec<String>,
}

/// Measures every target, then Baton alone; prints and writes the report.
/// Fails (after printing and writing it) if any measurement failed.
pub fn run(o: &Options, json: Option<&Path>) -> anyhow::Result<()> {
    let known = ["plain", "bindfs", "rclone", "floor", "baton"];
    if let Some(bad) = o.targets.iter().find(|t| !known.contains(&t.as_str())) {
        bail!("unknown target {bad:?}: use {}", known.join(","));
    }
    let root = tempfile::Builder::new()
        .prefix("baton-bench-")
        .tempdir_in(&o.dir)
        .with_context(|| format!("creating a directory in {}", o.dir.display()))?;
    let mut report = Report {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        disk: chaos_tests::bench::disk::describe(&o.dir),
        options: o.clone(),
        targets: Vec::new(),
        skipped: BTreeMap::new(),
        rows: Vec::new(),
        baton: BatonOnly::default(),
        errors: Vec::new(),
    };
    let prepared = Prepared::new(root.path(), o)?;
    let mut figures: BTreeMap<(&'static str, Key), Vec<f64>> = BTreeMap::new();
    for (flag, name) in [
        ("plain", PLAIN),
        ("bindfs", BINDFS),
        ("rclone", RCLONE),
        ("floor", FLOOR),
        ("baton", BATON),
    ] {
        if !o.targets.iter().any(|t| t == flag) {
            continue;
        }
        println!("== {name}");
        match measure_target(
            name,
            &root.path().join(name.replace(' ', "-")),
            o,
            &prepared,
            &mut report,
        ) {
            Ok(Some(runs)) => {
                report.targets.push(name);
                for (k, v) in runs {
                    figures.entry((name, k)).or_default().push(v);
                }
            }
            Ok(None) => {}
            Err(err) => {
                println!("   {name} failed: {err:#}");
                report.errors.push(format!("{name}: {err:#}"));
            }
        }
    }
    report.rows = rows(&figures, &report.targets, o, &prepared);
    if o.targets.iter().any(|t| t == "baton") {
        baton_only(root.path(), o, &mut report);
    }
    print_report(&report);
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.errors.is_empty() {
        bail!(
            "{} measurement(s) failed (listed above)",
            report.errors.len()
        );
    }
    Ok(())
}

/// Before a measurement: waits up to `o.quiet_wait` for the machine to be
/// quiet, `o.dir` being on the disk under test
/// ([`chaos_tests::bench::settle::settle`]), and says so if it was not.
fn quiet(o: &Options) {
    let (waited, settled) = chaos_tests::bench::settle::settle(&o.dir, o.quiet_wait);
    if !settled {
        println!(
            "   the machine was still busy after {:.0} s; measuring anyway",
            waited.as_secs_f64()
        );
    }
}

/// Every run of every workload on one target; `None` if it was skipped.
fn measure_target(
    name: &'static str,
    dir: &Path,
    o: &Options,
    p: &Prepared,
    report: &mut Report,
) -> anyhow::Result<Option<Vec<(Key, f64)>>> {
    let mut target = match mount(name, dir).with_context(|| format!("mounting {name}"))? {
        Ok(t) => t,
        Err(reason) => {
            println!("   skipping {name}: {reason}");
            report.skipped.insert(name, reason);
            return Ok(None);
        }
    };
    if let Some(baton) = target.baton.as_ref() {
        std::thread::sleep(Duration::from_secs(1));
        let pid = baton.generation_pid()?;
        report.baton.idle_generation_rss_kib = status_kib(pid, "VmRSS");
        report.baton.idle_generation_hwm_kib = status_kib(pid, "VmHWM");
    }
    let mut all = Vec::new();
    for run in 0..o.runs {
        quiet(o);
        let figures = run_once(&mut target, o, p)
            .with_context(|| format!("{} run {}", target.name, run + 1))?;
        println!("   run {} done", run + 1);
        all.extend(figures);
    }
    if let Some(baton) = target.baton.as_mut() {
        baton.sample_busy();
        report.baton.busy_generation_hwm_kib = Some(baton.busy_hwm_kib);
    }
    Ok(Some(all))
}

fn rows(
    figures: &BTreeMap<(&'static str, Key), Vec<f64>>,
    targets: &[&'static str],
    o: &Options,
    p: &Prepared,
) -> Vec<Row> {
    all_keys(o, p)
        .into_iter()
        .map(|k| {
            let results: BTreeMap<&'static str, Spread> = targets
                .iter()
                .filter_map(|t| figures.get(&(*t, k)).map(|v| (*t, Spread::of(v.clone()))))
                .collect();
            let ratio = |base: &str| {
                let baton = results.get(BATON)?.median;
                let base = results.get(base)?.median;
                if k.lower_is_better {
                    (baton > 0.0).then(|| base / baton)
                } else {
                    (base > 0.0).then(|| baton / base)
                }
            };
            Row {
                key: k,
                baton_vs_plain: ratio(PLAIN),
                baton_vs_bindfs: ratio(BINDFS),
                baton_vs_rclone: ratio(RCLONE),
                baton_vs_floor: ratio(FLOOR),
                results,
            }
        })
        .collect()
}

/// Memory of idle mounts and the kill -9 stall; failures go to the report.
fn baton_only(root: &Path, o: &Options, report: &mut Report) {
    report.baton.idle_mounts = o.idle_mounts;
    if o.idle_mounts > 0 {
        println!("== baton: supervisor with {} idle mounts", o.idle_mounts);
        quiet(o);
        match idle_mounts(&root.join("idle-mounts"), o.idle_mounts) {
            Ok((rss, hwm)) => {
                report.baton.supervisor_rss_kib_with_idle_mounts = rss;
                report.baton.supervisor_hwm_kib_with_idle_mounts = hwm;
            }
            Err(err) => report.errors.push(format!("idle mounts: {err:#}")),
        }
    }
    if o.stall_kills > 0 {
        println!("== baton: kill -9 stall, {} kills", o.stall_kills);
        quiet(o);
        let dir = root.join("stall");
        let measured = std::fs::create_dir_all(&dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| stall::measure(&dir, o.stall_kills, Duration::from_millis(250), true));
        match measured {
            Ok(killed) => {
                let mut stalls = killed.stalls;
                stalls.sort_unstable();
                let ms = |q| chaos_tests::bench::percentile(&stalls, q) / 1000.0;
                report.baton.kill9_stall_ms = Some(StallFigures {
                    events: stalls.len(),
                    p50: ms(0.5),
                    p99: ms(0.99),
                    max: ms(1.0),
                });
            }
            Err(err) => report.errors.push(format!("kill -9 stall: {err:#}")),
        }
    }
    if o.stall_kills > 0 {
        println!(
            "== baton: planned-upgrade stall, {} upgrades",
            o.stall_kills
        );
        quiet(o);
        let dir = root.join("upgrade-stall");
        let measured = std::fs::create_dir_all(&dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                crate::upgrade_stall::measure(
                    &dir,
                    o.stall_kills,
                    Duration::from_millis(200),
                    crate::upgrade_stall::Swap::Upgrade,
                )
            });
        match measured {
            Ok(stalls) => {
                let figures = |values: &[u64]| {
                    let ms = |q| chaos_tests::bench::percentile(values, q) / 1000.0;
                    StallFigures {
                        events: values.len(),
                        p50: ms(0.5),
                        p99: ms(0.99),
                        max: ms(1.0),
                    }
                };
                report.baton.upgrade_stall_ms = Some(figures(&stalls.app_us));
                report.baton.upgrade_gap_ms = Some(figures(&stalls.supervisor_us));
                report.baton.upgrade_quiet_ms = Some(figures(&stalls.quiet_us));
            }
            Err(err) => report.errors.push(format!("upgrade stall: {err:#}")),
        }
    }
}

/// One supervisor serving `count` idle mounts (each its own volume); its
/// (VmRSS, VmHWM) in KiB once all serve. Unmounts everything after.
fn idle_mounts(dir: &Path, count: usize) -> anyhow::Result<(Option<u64>, Option<u64>)> {
    std::fs::create_dir_all(dir)?;
    let supervisor = Supervised::start(dir, "idle-0")?;
    let mut mounted = Vec::new();
    let result = (|| -> anyhow::Result<(Option<u64>, Option<u64>)> {
        for i in 0..count {
            let volume = format!("idle-{i}");
            if i > 0 {
                format_volume(&supervisor.base, &volume)?;
            }
            let mnt = dir.join("mnts").join(&volume);
            std::fs::create_dir_all(&mnt)?;
            mount_volume(&supervisor.socket, &supervisor.base, &volume, &mnt)?;
            mounted.push((MountGuard::new(&mnt), mnt));
        }
        std::thread::sleep(Duration::from_secs(1));
        let pid = supervisor._supervisor.0.id();
        Ok((status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")))
    })();
    for (_guard, mnt) in &mounted {
        if let Some(mnt) = mnt.to_str() {
            if let Err(err) = fsctl(&supervisor.socket, &["umount", mnt]) {
                eprintln!("baton-bench: {err:#}");
            }
        }
    }
    result
}

fn print_report(r: &Report) {
    let o = &r.options;
    println!();
    println!(
        "baton-bench fs: kernel {}, {} cpus, {} under {}; {} run(s) per figure, median (min-max)",
        r.kernel,
        r.cpus,
        r.disk,
        o.dir.display(),
        o.runs
    );
    println!(
        "  {} MiB file in 1 MiB writes + fsync, {} MiB in 4 KiB writes + fsync; {} cold random reads per thread, then {} s of them; {:.1} s warm random runs; {} small files; untar and rm -rf of {} files; {} fsyncs; tree of {} files of {}-{} MiB; up to {:.0} s wait for a quiet machine before each measurement",
        o.size_mib, o.size_mib / 4, o.cold_reads, o.cold_seconds, o.seconds, o.files, o.untar_files, o.fsyncs, o.tree_files, o.tree_min_mib, o.tree_max_mib, o.quiet_wait.as_secs_f64()
    );
    println!("  ratios above 1: Baton is better (on µs rows, the baseline's latency over Baton's)");
    for (name, reason) in &r.skipped {
        println!("  skipped {name}: {reason}");
    }
    print!("{:<22} {:>3} {:<9}", "workload", "thr", "unit");
    for t in &r.targets {
        print!(" {t:>24}");
    }
    println!(
        " {:>7} {:>7} {:>7} {:>7}",
        "/plain", "/bindfs", "/rclone", "/floor"
    );
    for row in &r.rows {
        print!(
            "{:<22} {:>3} {:<9}",
            row.key.workload, row.key.threads, row.key.unit
        );
        for t in &r.targets {
            let cell = row.results.get(t).map_or("-".to_string(), |s| {
                format!("{:.0} ({:.0}-{:.0})", s.median, s.min, s.max)
            });
            print!(" {cell:>24}");
        }
        let ratio = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}x"));
        println!(
            " {:>7} {:>7} {:>7} {:>7}",
            ratio(row.baton_vs_plain),
            ratio(row.baton_vs_bindfs),
            ratio(row.baton_vs_rclone),
            ratio(row.baton_vs_floor)
        );
    }
    let b = &r.baton;
    let kib = |x: Option<u64>| x.map_or("-".to_string(), |k| format!("{k} KiB"));
    println!();
    println!(
        "baton generation: idle VmRSS {} (VmHWM {}); busy VmHWM {}",
        kib(b.idle_generation_rss_kib),
        kib(b.idle_generation_hwm_kib),
        kib(b.busy_generation_hwm_kib)
    );
    println!(
        "fs-supervisor with {} idle mounts: VmRSS {} (VmHWM {})",
        b.idle_mounts,
        kib(b.supervisor_rss_kib_with_idle_mounts),
        kib(b.supervisor_hwm_kib_with_idle_mounts)
    );
    match &b.kill9_stall_ms {
        Some(s) => println!(
            "kill -9 stall (warm standby): {} kills, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            s.events, s.p50, s.p99, s.max
        ),
        None => println!("kill -9 stall: not measured"),
    }
    match (&b.upgrade_stall_ms, &b.upgrade_gap_ms, &b.upgrade_quiet_ms) {
        (Some(s), Some(g), Some(q)) => println!(
            "planned upgrade stall: {} upgrades, slowest app call p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; supervisor gap p50 {:.2} ms, max {:.2} ms; with no upgrade, slowest call in as long a window p50 {:.2} ms, max {:.2} ms",
            s.events, s.p50, s.p99, s.max, g.p50, g.max, q.p50, q.max
        ),
        _ => println!("planned upgrade stall: not measured"),
    }
    for e in &r.errors {
        println!("ERROR {e}");
    }
}
