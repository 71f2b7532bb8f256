//! `fsctl` at its edge, with no supervisor running: the volume commands
//! (format, fsck) on a real SQLite volume in a temp dir, and the mount
//! commands' answer when no fs-supervisor listens. Each case checks what a
//! user sees: the exit code from `fsctl --help` and one line naming the
//! object and the next step.
//!
//! This file also makes `cargo test --workspace` build `target/debug/fsctl`
//! (cargo builds a package's binaries only for its own integration tests);
//! the chaos-tests harness drives that binary from outside.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn fsctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsctl"))
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_formatted_volume_checks_consistent_and_a_second_format_leaves_it_alone() {
    let base = tempfile::tempdir().unwrap();
    let base_dir = s(base.path());
    let out = fsctl(&["format", "vol1", "--base-dir", base_dir]);
    assert!(out.status.success(), "format: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("formatted volume vol1"),
        "{}",
        text(&out.stdout)
    );
    // A command's result is its output; logs below warnings only when
    // asked for.
    assert_eq!(text(&out.stderr), "", "an info log by default");
    let out = Command::new(env!("CARGO_BIN_EXE_fsctl"))
        .args(["format", "vol0", "--base-dir", base_dir])
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    // Its log line goes to a pipe here: no colour codes in it.
    let log = text(&out.stderr);
    assert!(
        log.contains("volume formatted") && !log.contains('\x1b'),
        "{log:?}"
    );
    let meta_db = base.path().join("vol1/meta.db");
    let before = std::fs::read(&meta_db).unwrap();

    let again = fsctl(&["format", "vol1", "--base-dir", base_dir]);
    let err = text(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already exists") && err.contains("refusing to format over it"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&meta_db).unwrap(),
        before,
        "a refused format changed the metadata"
    );

    let other = fsctl(&["format", "vol2", "--base-dir", base_dir, "--json"]);
    assert!(other.status.success(), "format: {}", text(&other.stderr));
    let created: serde_json::Value = serde_json::from_slice(&other.stdout).unwrap();
    assert_eq!(created["volume"], "vol2");
    assert_eq!(created["block_size_bytes"], 4 << 20);
    assert!(
        created["meta_url"]
            .as_str()
            .unwrap()
            .ends_with("/vol2/meta.db"),
        "{created}"
    );

    let check = fsctl(&["fsck", "vol1", "--base-dir", base_dir]);
    assert!(check.status.success(), "fsck: {}", text(&check.stderr));
    assert!(
        text(&check.stdout).contains("volume vol1: consistent"),
        "{}",
        text(&check.stdout)
    );
}

#[test]
fn a_bad_volume_name_is_refused_with_the_rule_and_creates_nothing() {
    let base = tempfile::tempdir().unwrap();
    for name in ["bad/name", "..", ".hidden", ""] {
        let out = fsctl(&["format", name, "--base-dir", s(base.path())]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name:?}: bad usage: {err}");
        assert!(err.contains("volume name"), "{name:?}: {err}");
    }
    assert_eq!(
        std::fs::read_dir(base.path()).unwrap().count(),
        0,
        "a refused format left files behind"
    );
}

#[test]
fn checking_a_volume_that_does_not_exist_says_how_to_create_one() {
    let base = tempfile::tempdir().unwrap();
    let out = fsctl(&["fsck", "nosuch", "--base-dir", s(base.path())]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nosuch") && err.contains("fsctl format"),
        "{err}"
    );
    assert!(
        !base.path().join("nosuch").exists(),
        "fsck created the volume it was asked to check"
    );
}

#[test]
fn fsctl_without_a_supervisor_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    for command in [&["status"][..], &["umount", "/mnt/nothing"]] {
        let mut args = command.to_vec();
        args.extend(["--socket", s(&socket)]);
        let out = fsctl(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{command:?}: {err}");
        assert!(
            err.contains("cannot reach fs-supervisor")
                && err.contains("start it with `fs-supervisor`"),
            "{command:?}: {err}"
        );
    }
}

#[test]
fn a_non_root_fsctl_on_roots_socket_is_told_to_run_as_root_with_exit_code_4() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("supervisor.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fsctl"))
        .args(["status", "--socket", s(&socket)])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("is root's") && err.contains("run fsctl as root"),
        "{err}"
    );
}

#[test]
fn a_metadata_or_data_path_in_a_missing_directory_is_refused_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    let missing = dir.path().join("typo");
    let meta = format!("sqlite://{}/x/meta.db", s(&missing));
    let data = format!("file://{}/x/data", s(&missing));
    for (flag, url) in [("--meta", &meta), ("--storage", &data)] {
        let out = fsctl(&["format", "vol", flag, url, "--base-dir", s(&base)]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(
            err.contains("does not exist") && err.contains("--create-dirs"),
            "{flag}: {err}"
        );
        assert!(
            !missing.exists(),
            "{flag}: format created {}",
            missing.display()
        );
    }
    let out = fsctl(&[
        "format",
        "vol",
        "--meta",
        &meta,
        "--storage",
        &data,
        "--create-dirs",
        "--base-dir",
        s(&base),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(missing.join("x/meta.db").is_file());
    assert!(missing.join("x/data").is_dir());
}

#[test]
fn quota_set_get_ls_rm_on_a_volume_path_with_human_sizes_and_json() {
    let base = tempfile::tempdir().unwrap();
    let base_dir = s(base.path());
    let out = fsctl(&["format", "vol1", "--base-dir", base_dir]);
    assert!(out.status.success(), "format: {}", text(&out.stderr));
    let on_vol = |args: &[&str]| {
        let mut all = vec!["quota"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--volume", "vol1", "--base-dir", base_dir]);
        fsctl(&all)
    };

    let none = on_vol(&["set", "/"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none.stderr).contains("give --bytes, --inodes or both"));
    let bad = on_vol(&["set", "/", "--bytes", "lots"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("not a size"),
        "{}",
        text(&bad.stderr)
    );

    let set = on_vol(&["set", "/", "--bytes", "10G", "--inodes", "1000"]);
    assert!(set.status.success(), "set: {}", text(&set.stderr));
    let table = text(&set.stdout);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["PATH", "USED", "LIMIT", "USE%", "INODES", "ILIMIT", "IUSE%"]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row, ["/", "0", "10G", "0%", "0", "1000", "0%"]);

    // Only --inodes: the byte limit is kept.
    let changed = on_vol(&["set", "/", "--inodes", "none", "--json"]);
    assert!(changed.status.success(), "{}", text(&changed.stderr));
    let json: serde_json::Value = serde_json::from_slice(&changed.stdout).unwrap();
    assert_eq!(json["bytes_max"], 10u64 << 30);
    assert!(json["inodes_max"].is_null());
    assert_eq!(json["path"], "/");

    let listed = on_vol(&["ls", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(json["quotas"].as_array().unwrap().len(), 1);

    let missing = on_vol(&["get", "/nowhere"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("nowhere"),
        "{}",
        text(&missing.stderr)
    );

    let check = fsctl(&["fsck", "vol1", "--base-dir", base_dir]);
    assert!(check.status.success(), "fsck: {}", text(&check.stderr));

    assert!(on_vol(&["rm", "/"]).status.success());
    let gone = on_vol(&["get", "/"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        text(&gone.stderr).contains("no quota on /"),
        "{}",
        text(&gone.stderr)
    );
    let listed = on_vol(&["ls"]);
    assert_eq!(text(&listed.stdout).lines().count(), 1, "only the header");
}

#[test]
fn fsck_reports_a_quota_usage_that_drifted_and_repairs_it_on_request() {
    let base = tempfile::tempdir().unwrap();
    let base_dir = s(base.path());
    assert!(fsctl(&["format", "vol1", "--base-dir", base_dir])
        .status
        .success());
    let set = fsctl(&[
        "quota",
        "set",
        "/",
        "--inodes",
        "10",
        "--volume",
        "vol1",
        "--base-dir",
        base_dir,
    ]);
    assert!(set.status.success(), "{}", text(&set.stderr));
    let db = rusqlite::Connection::open(base.path().join("vol1/meta.db")).unwrap();
    db.execute("UPDATE quotas SET inodes_used = 7", []).unwrap();
    drop(db);

    let check = fsctl(&["fsck", "vol1", "--base-dir", base_dir]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stdout));
    assert!(
        text(&check.stdout)
            .contains("quota on /: stored 0 bytes and 7 inodes, counted 0 bytes and 0 inodes"),
        "{}",
        text(&check.stdout)
    );
    assert!(
        text(&check.stderr).contains("--repair-quotas"),
        "{}",
        text(&check.stderr)
    );

    let repair = fsctl(&["fsck", "vol1", "--repair-quotas", "--base-dir", base_dir]);
    assert!(repair.status.success(), "{}", text(&repair.stderr));
    assert!(text(&repair.stdout).contains("stored the recounted usage of 1 quota(s)"));
    let again = fsctl(&["fsck", "vol1", "--base-dir", base_dir]);
    assert!(again.status.success(), "{}", text(&again.stdout));
    assert!(text(&again.stdout).contains("volume vol1: consistent"));
}

#[test]
fn fsck_reports_an_acl_that_does_not_parse() {
    let base = tempfile::tempdir().unwrap();
    let base_dir = s(base.path());
    assert!(fsctl(&["format", "vol1", "--base-dir", base_dir])
        .status
        .success());
    let db = rusqlite::Connection::open(base.path().join("vol1/meta.db")).unwrap();
    // Version 2, one owner entry only: no owning group, no other.
    let value: &[u8] = &[2, 0, 0, 0, 1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff];
    db.execute(
        "INSERT INTO xattrs (ino, name, value) VALUES (1, ?1, ?2)",
        rusqlite::params![&b"system.posix_acl_access"[..], value],
    )
    .unwrap();
    drop(db);

    let check = fsctl(&["fsck", "vol1", "--base-dir", base_dir]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check.stdout));
    assert!(
        text(&check.stdout).contains("inode 1: system.posix_acl_access does not parse"),
        "{}",
        text(&check.stdout)
    );
    assert!(
        text(&check.stderr).contains("1 POSIX ACL(s) do not parse"),
        "{}",
        text(&check.stderr)
    );
    let json = fsctl(&["fsck", "vol1", "--json", "--base-dir", base_dir]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["bad_acls"][0]["ino"], 1);
    assert_eq!(value["consistent"], false);
}
