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
        assert!(!out.status.success(), "{name:?} was accepted");
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
