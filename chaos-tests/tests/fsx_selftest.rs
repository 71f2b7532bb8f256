//! The exerciser itself: two plain directories always agree, and a file
//! changed behind its back is caught with the seed and the operation log.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use chaos_tests::fsx::{run, FsxConfig, ShiftRanges, KIND_NAMES};

/// Every operation; two local directories both do COLLAPSE_RANGE and
/// INSERT_RANGE (or both refuse them alike).
fn config(seed: u64, ops: u64) -> FsxConfig {
    FsxConfig {
        remount_at: Some(ops / 2),
        shift_ranges: ShiftRanges::Mirrored,
        ..FsxConfig::every_op(seed, ops)
    }
}

#[test]
fn two_plain_directories_agree_over_many_operations() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stats =
        run(&config(7, 5000), a.path(), b.path(), &mut || Ok(())).unwrap_or_else(|f| panic!("{f}"));
    let acl_kinds = ["acl-set", "acl-remove", "chmod"];
    for (name, &n) in KIND_NAMES.iter().zip(&stats.by_kind) {
        let skipped = stats.acl_skipped && acl_kinds.contains(name);
        assert!(n > 0 || skipped, "{name} never ran: {stats:?}");
    }
    assert!(stats.bytes_checked > 0);
}

#[test]
fn a_corrupted_file_is_reported_with_its_seed() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let test_dir = a.path().to_path_buf();
    let mut corrupt = || {
        let path = test_dir.join("fsx-1");
        let mut data = std::fs::read(&path).map_err(|e| e.to_string())?;
        data.push(0xee);
        std::fs::write(&path, data).map_err(|e| e.to_string())
    };
    let failure = run(&config(11, 2000), a.path(), b.path(), &mut corrupt)
        .expect_err("corruption must be caught");
    assert_eq!(failure.seed, 11);
    assert_eq!(failure.op_index, 1000);
    assert!(failure.to_string().contains("rerun with seed 11"));
    assert!(failure.log.iter().any(|line| line.contains("remount")));
}
