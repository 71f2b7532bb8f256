//! The chaos suite's CI profile: runs `baton-chaos --profile ci` (its own
//! supervisors, volumes and mounts; kill -9, OOM kill, named fault points,
//! storage faults, a full staging disk, planned upgrades; about 1.5 minutes) and checks the
//! verdict it writes as JSON.
//!
//! Build the binaries first (`cargo build --workspace`). Needs root,
//! /dev/fuse and a memory cgroup. `BATON_CHAOS_SEED` pins the seed.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use chaos_tests::mount_guard::{workspace_binary, ChildGuard};
use serde_json::Value;

const RUN_TIMEOUT: Duration = Duration::from_secs(900);
const CI_SCENARIOS: [&str; 11] = [
    "kill-warm",
    "oom",
    "storage-flaky",
    "storage-outage",
    "staging-full",
    "point-after-read",
    "point-after-commit",
    "point-during-upload",
    "point-during-clear",
    "upgrade",
    "supervisor",
];

#[test]
fn ci_profile_passes_with_no_failed_syscalls_and_no_lost_bytes() {
    let binary = workspace_binary("baton-chaos");
    assert!(
        binary.exists(),
        "{} is missing: run `cargo build --workspace` first",
        binary.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("verdict.json");
    let out = dir.path().join("out.txt");
    let mut command = Command::new(&binary);
    command.args(["--profile", "ci", "--json"]).arg(&json);
    if let Ok(seed) = std::env::var("BATON_CHAOS_SEED") {
        command.args(["--seed", &seed]);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let status = child.wait_timeout(RUN_TIMEOUT);
    let printed = std::fs::read_to_string(&out).unwrap_or_default();
    eprintln!("{printed}");
    let status = status.expect("baton-chaos did not finish in time");
    let verdict: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let scenarios = verdict["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, CI_SCENARIOS, "the ci profile's scenarios");
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        assert_eq!(s["failed_syscalls"], 0, "{name}: {}", s["failures"]);
        assert_eq!(s["lost_bytes"], 0, "{name}: {}", s["failures"]);
        assert_eq!(s["corrupt_bytes"], 0, "{name}: {}", s["failures"]);
        assert_eq!(s["tree_matches_model"], true, "{name}: {}", s["failures"]);
        assert!(
            s["faults_injected"].as_u64().unwrap() >= 1,
            "{name}: no fault took effect: {}",
            s["failures"]
        );
        assert!(
            s["acknowledged_bytes_verified"].as_u64().unwrap() > 0,
            "{name}"
        );
        assert_eq!(s["passed"], true, "{name}: {}", s["failures"]);
    }
    let full = &scenarios[4];
    assert!(
        full["expected_errors"]["ENOSPC"].as_u64().unwrap_or(0) > 0,
        "a full staging disk must produce ENOSPC"
    );
    assert!(status.success(), "baton-chaos failed: {printed}");
    assert_eq!(verdict["passed"], true);
}
