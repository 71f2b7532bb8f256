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

#[test]
fn a_mode_changed_behind_its_back_is_caught() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let test_dir = a.path().to_path_buf();
    let mut chmod = || {
        use std::os::unix::fs::PermissionsExt;
        let path = test_dir.join("fsx-2");
        let mode = std::fs::metadata(&path)
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        std::fs::set_permissions(
            &path,
            std::fs::Permissions::from_mode((mode ^ 0o001) & 0o777),
        )
        .map_err(|e| e.to_string())
    };
    // Modes are compared with the ACLs: only where the reference has them.
    match run(&config(13, 400), a.path(), b.path(), &mut chmod) {
        Ok(stats) => assert!(stats.acl_skipped, "a changed mode must be caught"),
        Err(failure) => assert!(failure.message.contains("fsx-2: mode"), "{failure}"),
    }
}

#[test]
fn a_shift_range_that_succeeds_where_a_refusal_is_expected_is_caught() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = FsxConfig {
        shift_ranges: ShiftRanges::Refused(libc::EOPNOTSUPP),
        ..config(17, 5000)
    };
    let failure = run(&config, a.path(), b.path(), &mut || Ok(()))
        .expect_err("a local filesystem does COLLAPSE_RANGE or INSERT_RANGE");
    assert!(failure.message.contains("expected errno"), "{failure}");
}
