//! `fsctl quota set|get|ls|rm`: directory quotas, through the volume's
//! metadata (no supervisor needed; works while the volume is mounted, and
//! mounts apply a new limit at their next change).
//!
//! PATH is a directory on a mounted Baton filesystem (its volume is the
//! mount's source, read from /proc/self/mountinfo: a volume name or a
//! SQLite URL), or, with `--volume`, a path from the volume's root.
//! A PostgreSQL mount shows only its database name: give `--volume URL`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use baton_volume::{QuotaEntry, QuotaVolume, DEFAULT_BASE_DIR};
use clap::Subcommand;
use upgrade_protocol::parse_size;

/// Which volume, and how PATH is read.
#[derive(clap::Args)]
pub struct Target {
    /// The volume (a name under --base-dir, sqlite:///path/meta.db or
    /// postgres://...): PATH is then a path from the volume's root, e.g.
    /// `/pvc-1`. Without it PATH is a directory on a mounted volume.
    #[arg(long)]
    volume: Option<String>,
    /// Base directory for volumes.
    #[arg(long, default_value = DEFAULT_BASE_DIR)]
    base_dir: PathBuf,
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set or change the quota on directory PATH: a byte limit, an inode
    /// limit, or both. A limit not given keeps its value (none for a new
    /// quota); `none` removes it. A new quota first counts what is
    /// already under PATH.
    Set {
        /// The directory.
        path: PathBuf,
        /// Byte limit: 4096, 64K, 512M, 10G, 2T (binary units), or none.
        #[arg(long)]
        bytes: Option<String>,
        /// Inode limit (files, directories, links... under PATH), or none.
        #[arg(long)]
        inodes: Option<String>,
        #[command(flatten)]
        target: Target,
        /// Print the quota as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the quota on directory PATH (exit 1 if it has none).
    Get {
        /// The directory.
        path: PathBuf,
        #[command(flatten)]
        target: Target,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List every quota of the volume PATH is on (or of --volume).
    Ls {
        /// A path on the mounted volume (not needed with --volume).
        path: Option<PathBuf>,
        #[command(flatten)]
        target: Target,
        /// Print JSON (`{"quotas":[...]}`).
        #[arg(long)]
        json: bool,
    },
    /// Remove the quota on directory PATH.
    Rm {
        /// The directory.
        path: PathBuf,
        #[command(flatten)]
        target: Target,
    },
}

/// Runs one `fsctl quota` command.
pub fn run(command: QuotaCommand) -> anyhow::Result<ExitCode> {
    match command {
        QuotaCommand::Set {
            path,
            bytes,
            inodes,
            target,
            json,
        } => {
            if bytes.is_none() && inodes.is_none() {
                bail!(
                    "fsctl quota set {}: give --bytes, --inodes or both (a size, a count, or none)",
                    path.display()
                );
            }
            let (volume, dir) = open(&path, &target)?;
            let current = volume.get(dir)?.map(|e| e.quota);
            let bytes_max = match bytes {
                Some(text) => parse_limit(&text, parse_size).context("--bytes")?,
                None => current.and_then(|q| q.bytes_max),
            };
            let inodes_max = match inodes {
                Some(text) => parse_limit(&text, |t| {
                    t.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{t:?} is not an inode count (e.g. 10000) or none"))
                })
                .context("--inodes")?,
                None => current.and_then(|q| q.inodes_max),
            };
            let entry = volume.set(dir, bytes_max, inodes_max)?;
            print_entries(&[entry], json, false)?;
            Ok(ExitCode::SUCCESS)
        }
        QuotaCommand::Get { path, target, json } => {
            let (volume, dir) = open(&path, &target)?;
            match volume.get(dir)? {
                Some(entry) => {
                    print_entries(&[entry], json, false)?;
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!(
                        "fsctl: no quota on {}; set one with `fsctl quota set {} --bytes SIZE`",
                        path.display(),
                        path.display()
                    );
                    Ok(ExitCode::from(1))
                }
            }
        }
        QuotaCommand::Ls { path, target, json } => {
            let volume = match (&path, &target.volume) {
                (_, Some(_)) | (None, None) => {
                    let Some(name) = &target.volume else {
                        bail!("fsctl quota ls: give a path on a mounted volume or --volume VOLUME");
                    };
                    QuotaVolume::open(name, &target.base_dir)?
                }
                (Some(path), None) => open(path, &target)?.0,
            };
            print_entries(&volume.list()?, json, true)?;
            Ok(ExitCode::SUCCESS)
        }
        QuotaCommand::Rm { path, target } => {
            let (volume, dir) = open(&path, &target)?;
            if volume.remove(dir)? {
                println!("removed the quota on {}", path.display());
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("fsctl: no quota on {}: nothing removed", path.display());
                Ok(ExitCode::from(1))
            }
        }
    }
}

/// `none` or a value.
fn parse_limit(
    text: &str,
    parse: impl Fn(&str) -> Result<u64, String>,
) -> anyhow::Result<Option<u64>> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    parse(text).map(Some).map_err(anyhow::Error::msg)
}

/// The volume PATH names a directory of, and that directory's inode.
fn open(path: &Path, target: &Target) -> anyhow::Result<(QuotaVolume, u64)> {
    if let Some(name) = &target.volume {
        let volume = QuotaVolume::open(name, &target.base_dir)?;
        let dir = volume.resolve(path).with_context(|| {
            format!(
                "{} in volume {}: give the directory's path from the volume's root",
                path.display(),
                volume.paths.display
            )
        })?;
        return Ok((volume, dir));
    }
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "{}: not found; give a directory on a mounted Baton volume, or --volume VOLUME and a path from its root",
            path.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "{} is not a directory: quotas are set on directories",
            path.display()
        );
    }
    let source = baton_mount_source(meta.dev()).with_context(|| {
        format!(
            "{} is not on a mounted Baton volume; give --volume VOLUME and a path from its root",
            path.display()
        )
    })?;
    let volume = QuotaVolume::open(&source, &target.base_dir).with_context(|| {
        format!(
            "{} is on Baton volume {source}, which cannot be opened from here: give the --base-dir it was mounted with, or --volume (a PostgreSQL mount shows only its database name: --volume URL)",
            path.display()
        )
    })?;
    Ok((volume, meta.ino()))
}

/// The source of the Baton mount whose device is `dev`, from
/// /proc/self/mountinfo (bind mounts of a volume share its device).
fn baton_mount_source(dev: u64) -> anyhow::Result<String> {
    let table = fuse_wire::mountinfo::read().context("reading /proc/self/mountinfo")?;
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    table
        .iter()
        .find(|m| m.major == major && m.minor == minor && m.fstype == "fuse.baton")
        .map(|m| m.source.to_string_lossy().into_owned())
        .with_context(|| format!("no Baton mount has device {major}:{minor}"))
}

/// `1536` → `1.5K`: binary units, one decimal, as `df -h` prints them.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        return bytes.to_string();
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{}", UNITS[unit])
}

fn percent(used: u64, max: Option<u64>) -> String {
    match max {
        Some(0) => "-".into(),
        Some(max) => format!("{}%", (u128::from(used) * 100).div_ceil(u128::from(max))),
        None => "-".into(),
    }
}

fn print_entries(entries: &[QuotaEntry], json: bool, list: bool) -> anyhow::Result<()> {
    let rows: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "path": e.path.display().to_string(),
                "dir_inode": e.quota.dir,
                "bytes_used": e.quota.used.bytes,
                "bytes_max": e.quota.bytes_max,
                "inodes_used": e.quota.used.inodes,
                "inodes_max": e.quota.inodes_max,
            })
        })
        .collect();
    if json {
        let value = match (list, rows.first()) {
            (false, Some(row)) => row.clone(),
            _ => serde_json::json!({ "quotas": rows }),
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    print!("{}", table(entries));
    Ok(())
}

/// The human table of `fsctl quota get|ls|set`.
fn table(entries: &[QuotaEntry]) -> String {
    let header = ["PATH", "USED", "LIMIT", "USE%", "INODES", "ILIMIT", "IUSE%"];
    let mut rows: Vec<[String; 7]> = vec![header.map(String::from)];
    for e in entries {
        let q = &e.quota;
        rows.push([
            e.path.display().to_string(),
            human_size(q.used.bytes),
            q.bytes_max.map_or("none".into(), human_size),
            percent(q.used.bytes, q.bytes_max),
            q.used.inodes.to_string(),
            q.inodes_max.map_or("none".into(), |n| n.to_string()),
            percent(q.used.inodes, q.inodes_max),
        ]);
    }
    let right = [false, true, true, true, true, true, true];
    crate::table::aligned(&rows, &right)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human_size(0), "0");
        assert_eq!(human_size(1023), "1023");
        assert_eq!(human_size(1024), "1K");
        assert_eq!(human_size(1536), "1.5K");
        assert_eq!(human_size(10 << 30), "10G");
    }

    #[test]
    fn limits_parse_with_none() {
        assert_eq!(parse_limit("none", parse_size).unwrap(), None);
        assert_eq!(parse_limit("1G", parse_size).unwrap(), Some(1 << 30));
        assert!(parse_limit("lots", parse_size).is_err());
    }
}
