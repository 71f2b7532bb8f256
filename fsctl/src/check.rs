//! `fsctl fsck` and `fsctl gc`: a volume's block map against its storage,
//! printed for people or, with `--json`, as one JSON object on stdout.
//! Progress (objects listed, block-map rows compared, deletes) goes to
//! stderr (`crate::progress`).

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use baton_volume::{
    collectable, CheckProgress, CheckReport, CheckedVolume, REPORT_PROBLEMS_LISTED_MAX,
};
use serde_json::{json, Value};

use crate::progress::{Progress, Sink, Tick};

/// How far fsck or gc got.
#[derive(Default)]
struct Counts {
    check: CheckProgress,
    /// Objects gc deletes (0 until it starts deleting).
    deleting: AtomicU64,
    /// Deletes that succeeded so far.
    deleted: AtomicU64,
}

/// What the progress display shows for `counts`. Pure.
fn tick(counts: &Counts) -> Tick {
    let listed = counts.check.listed_objects.load(Ordering::Relaxed);
    let scanned = counts.check.scanned_blocks.load(Ordering::Relaxed);
    let deleting = counts.deleting.load(Ordering::Relaxed);
    let deleted = counts.deleted.load(Ordering::Relaxed);
    if deleting > 0 {
        return Tick {
            position: deleted,
            length: Some(deleting),
            message: format!("deleted {deleted} of {deleting} unreferenced object(s)"),
        };
    }
    let message = if counts.check.recounting_quotas.load(Ordering::Relaxed) {
        format!("{listed} object(s) listed, {scanned} block(s) compared; recounting quotas")
    } else if scanned > 0 {
        format!("{listed} object(s) listed; comparing the block map: {scanned} block(s)")
    } else {
        format!("listing the storage: {listed} object(s)")
    };
    Tick {
        position: listed + scanned,
        length: None,
        message,
    }
}

fn show(command: &'static str, counts: &Arc<Counts>) -> Progress {
    let counts = counts.clone();
    Progress::start(
        command,
        Sink::Stderr {
            template: "{bar:30} {msg} ETA {eta}",
        },
        move |_| tick(&counts),
    )
}

/// `fsctl fsck`: exit 1 if blocks are lost, an ACL does not parse, or quota
/// usage differs (and is not repaired).
pub fn fsck(
    volume: &str,
    base_dir: &Path,
    repair_quotas: bool,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let checked = CheckedVolume::open(volume, base_dir)?;
    // Shadowed by the printable form (a URL's password is masked).
    let volume = checked.paths.display.as_str();
    let counts = Arc::new(Counts::default());
    let display = show("fsck", &counts);
    let report = checked.check_counting(&counts.check)?;
    display.finish();
    let quotas_differ = !report.quota_drifts.is_empty();
    let repaired = if quotas_differ && repair_quotas {
        Some(checked.recount_quotas(true)?.len())
    } else {
        None
    };
    if as_json {
        let mut value = summary(volume, &report);
        value["bad_blocks"] = report
            .bad_blocks
            .iter()
            .map(|bad| {
                json!({
                    "ino": bad.ino,
                    "index": bad.index,
                    "key": bad.key.to_string(),
                    "len_bytes": bad.len_bytes,
                    "stored_bytes": bad.stored_bytes,
                })
            })
            .collect();
        value["quota_drifts"] = report
            .quota_drifts
            .iter()
            .map(|(path, drift)| {
                json!({
                    "path": path.display().to_string(),
                    "stored_bytes": drift.stored.bytes,
                    "stored_inodes": drift.stored.inodes,
                    "counted_bytes": drift.counted.bytes,
                    "counted_inodes": drift.counted.inodes,
                })
            })
            .collect();
        value["bad_acls"] = report
            .bad_acls
            .iter()
            .map(|bad| json!({"ino": bad.ino, "name": bad.name, "reason": bad.reason}))
            .collect();
        value["quotas_repaired"] = json!(repaired);
        value["consistent"] = json!(
            report.is_consistent()
                && report.bad_acls.is_empty()
                && (!quotas_differ || repaired.is_some())
        );
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_summary(volume, &report);
        for bad in report.bad_blocks.iter().take(REPORT_PROBLEMS_LISTED_MAX) {
            let what = match bad.stored_bytes {
                None => "is missing".to_string(),
                Some(size) => format!("has {size} bytes, {} needed", bad.len_bytes),
            };
            println!(
                "  inode {} block {}: object {} {what}",
                bad.ino, bad.index, bad.key
            );
        }
        for (path, drift) in &report.quota_drifts {
            println!(
                "  quota on {}: stored {} bytes and {} inodes, counted {} bytes and {} inodes",
                path.display(),
                drift.stored.bytes,
                drift.stored.inodes,
                drift.counted.bytes,
                drift.counted.inodes
            );
        }
        for bad in report.bad_acls.iter().take(REPORT_PROBLEMS_LISTED_MAX) {
            println!(
                "  inode {}: {} does not parse: {}",
                bad.ino, bad.name, bad.reason
            );
        }
        if let Some(count) = repaired {
            println!("stored the recounted usage of {count} quota(s)");
        }
    }
    if !report.is_consistent() {
        eprintln!(
            "fsctl: volume {volume}: {} block(s) lost: the files above read as errors; restore the objects from a backup of the storage, or delete the files",
            report.bad_blocks.len()
        );
        Ok(ExitCode::from(1))
    } else if !report.bad_acls.is_empty() {
        eprintln!(
            "fsctl: volume {volume}: {} POSIX ACL(s) do not parse: the kernel refuses them, so access to those inodes fails; remove each (`setfattr -x NAME FILE` on a mount) and set it again",
            report.bad_acls.len()
        );
        Ok(ExitCode::from(1))
    } else if quotas_differ && !repair_quotas {
        eprintln!(
            "fsctl: volume {volume}: {} quota(s) count a usage their trees do not have; store the recount with `fsctl fsck --repair-quotas {volume}`",
            report.quota_drifts.len()
        );
        Ok(ExitCode::from(1))
    } else {
        if !as_json {
            println!("volume {volume}: consistent");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// What `fsctl gc` is asked to do.
pub struct GcPlan<'a> {
    /// The volume.
    pub volume: &'a str,
    /// Where named volumes live.
    pub base_dir: &'a Path,
    /// Only say what would be deleted.
    pub dry_run: bool,
    /// Also list the keys (deleted, or that would be).
    pub list: bool,
    /// Keep unreferenced objects younger than this.
    pub min_age: Duration,
    /// One JSON object on stdout.
    pub json: bool,
}

/// `fsctl gc`: exit 1 if some delete failed.
pub fn gc(plan: &GcPlan<'_>) -> anyhow::Result<ExitCode> {
    let checked = CheckedVolume::open(plan.volume, plan.base_dir)?;
    // Shadowed by the printable form (a URL's password is masked).
    let volume = checked.paths.display.as_str();
    // Held until gc returns: no mount of this volume starts on this host.
    let _lock = if plan.dry_run { None } else { checked.lock()? };
    let counts = Arc::new(Counts::default());
    let display = show("gc", &counts);
    let report = checked.check_counting(&counts.check)?;
    let keys = collectable(&report.unreferenced, plan.min_age, SystemTime::now());
    let young_count = report.unreferenced.len() - keys.len();
    let deleted_count = if plan.dry_run {
        None
    } else {
        counts.deleting.store(keys.len() as u64, Ordering::Relaxed);
        Some(checked.store.delete_counting(&keys, &counts.deleted))
    };
    display.finish();
    if plan.json {
        let mut value = summary(volume, &report);
        value["dry_run"] = json!(plan.dry_run);
        value["kept_younger_than_min_age"] = json!(young_count);
        value["collectable"] = json!(keys.len());
        value["deleted"] = json!(deleted_count);
        if plan.list {
            value["keys"] = keys.iter().map(|k| Value::from(k.to_string())).collect();
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_summary(volume, &report);
        if young_count > 0 {
            println!(
                "keeping {young_count} unreferenced object(s) younger than {} s (--min-age-secs)",
                plan.min_age.as_secs()
            );
        }
        if plan.list {
            let verb = if plan.dry_run {
                "would delete"
            } else {
                "deleting"
            };
            for key in &keys {
                println!("{verb} {key}");
            }
        }
        match deleted_count {
            None => println!(
                "dry run: {} object(s) would be deleted{}",
                keys.len(),
                if plan.list || keys.is_empty() {
                    ""
                } else {
                    " (--list names them)"
                }
            ),
            Some(count) => println!("deleted {count} of {} object(s)", keys.len()),
        }
    }
    if deleted_count.is_some_and(|count| count < keys.len()) {
        eprintln!("fsctl: some deletes failed (see the log above); run `fsctl gc` again");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The figures both commands report, as JSON.
fn summary(volume: &str, report: &CheckReport) -> Value {
    json!({
        "volume": volume,
        "referenced_blocks": report.referenced_count,
        "shared_objects": report.shared_count,
        "inline_blocks": report.inline_count,
        "stored_objects": report.stored_count,
        "stored_bytes": report.stored_bytes,
        "unreferenced_objects": report.unreferenced.len(),
        "unreferenced_bytes": report.unreferenced.iter().map(|o| o.size_bytes).sum::<u64>(),
        "missing_or_short_blocks": report.bad_blocks.len(),
        "orphan_inodes": report.orphan_count,
    })
}

fn print_summary(volume: &str, report: &CheckReport) {
    let garbage_bytes: u64 = report.unreferenced.iter().map(|o| o.size_bytes).sum();
    println!(
        "volume {volume}: {} referenced block(s) ({} shared object(s), {} inline), {} object(s) ({} bytes) in storage, {} unreferenced ({garbage_bytes} bytes), {} missing or short, {} orphan inode(s)",
        report.referenced_count,
        report.shared_count,
        report.inline_count,
        report.stored_count,
        report.stored_bytes,
        report.unreferenced.len(),
        report.bad_blocks.len(),
        report.orphan_count,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_names_the_phase_and_counts_deletes_against_their_total() {
        let counts = Counts::default();
        assert_eq!(tick(&counts).message, "listing the storage: 0 object(s)");
        counts.check.listed_objects.store(7, Ordering::Relaxed);
        counts.check.scanned_blocks.store(4096, Ordering::Relaxed);
        let scanning = tick(&counts);
        assert_eq!(
            scanning.message,
            "7 object(s) listed; comparing the block map: 4096 block(s)"
        );
        assert_eq!(scanning.length, None, "no total is known while checking");
        counts
            .check
            .recounting_quotas
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(tick(&counts).message.ends_with("recounting quotas"));
        counts.deleting.store(5, Ordering::Relaxed);
        counts.deleted.store(2, Ordering::Relaxed);
        let deleting = tick(&counts);
        assert_eq!(
            (deleting.position, deleting.length),
            (2, Some(5)),
            "a bar over the deletes"
        );
        assert_eq!(deleting.message, "deleted 2 of 5 unreferenced object(s)");
    }
}
