//! Permission checks as non-root users (`setpriv` to uid 65534 / 65533):
//! the kernel enforces modes and the sticky bit (`default_permissions`),
//! fsclient records the caller as owner. Needs root and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

fn open_dir(m: &Mounted, name: &str, mode: u32) -> String {
    fs::create_dir(m.p(name)).unwrap();
    fs::set_permissions(m.p(name), fs::Permissions::from_mode(mode)).unwrap();
    s(&m.p(name)).to_string()
}

#[test]
fn new_files_belong_to_their_creator_and_modes_are_enforced() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let shared = open_dir(&m, "shared", 0o777);
    let (ok, _, err) = sh_as_nobody(&format!("echo mine > {shared}/n && chmod 600 {shared}/n"));
    assert!(ok, "{err}");
    let meta = fs::metadata(m.p("shared/n")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));

    // Another user can neither read nor write a 0600 file.
    let (ok, _, err) = sh_as(65533, 65533, &format!("cat {shared}/n"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let (ok, _, err) = sh_as(65533, 65533, &format!("echo x >> {shared}/n"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    // Nor change its mode or owner.
    let (ok, _, err) = sh_as(65533, 65533, &format!("chmod 666 {shared}/n"));
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    let (ok, _, err) = sh_as_nobody(&format!("chown 65533 {shared}/n"));
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    // The owner can.
    let (ok, out, err) = sh_as_nobody(&format!("cat {shared}/n"));
    assert!(ok, "{err}");
    assert_eq!(out, "mine\n");

    // A root-owned 0755 directory refuses creations by others.
    let closed = open_dir(&m, "closed", 0o755);
    let (ok, _, err) = sh_as_nobody(&format!("touch {closed}/x"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let (ok, _, err) = sh_as_nobody(&format!("mkdir {closed}/d"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    // Search permission: no x on a directory hides what is inside.
    let hidden = open_dir(&m, "hidden", 0o700);
    fs::write(m.p("hidden/f"), b"").unwrap();
    let (ok, _, err) = sh_as_nobody(&format!("stat {hidden}/f"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    // Executable bits are checked on exec of a script.
    fs::write(m.p("shared/script"), b"#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(m.p("shared/script"), fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, _, err) = sh_as_nobody(&format!("{shared}/script"));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    m.stop();
}

#[test]
fn sticky_directories_protect_other_users_entries() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let tmp = open_dir(&m, "tmp", 0o1777);
    let (ok, _, err) = sh_as_nobody(&format!("echo a > {tmp}/owned && mkdir {tmp}/dir"));
    assert!(ok, "{err}");
    let (ok, _, err) = sh_as(65533, 65533, &format!("rm -f {tmp}/owned"));
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    let (ok, _, err) = sh_as(65533, 65533, &format!("mv {tmp}/owned {tmp}/stolen"));
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    let (ok, _, err) = sh_as(65533, 65533, &format!("rmdir {tmp}/dir"));
    assert!(!ok && err.contains("Operation not permitted"), "{err}");
    // The other user may still create its own entries, and delete them.
    let (ok, _, err) = sh_as(
        65533,
        65533,
        &format!("touch {tmp}/theirs && rm {tmp}/theirs"),
    );
    assert!(ok, "{err}");
    // The owner may delete its own.
    let (ok, _, err) = sh_as_nobody(&format!("rm {tmp}/owned && rmdir {tmp}/dir"));
    assert!(ok, "{err}");
    assert!(!m.p("tmp/owned").exists());
    m.stop();
}

#[test]
fn setgid_directories_give_their_group_to_non_members() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let g = open_dir(&m, "g", 0o777);
    std::os::unix::fs::chown(m.p("g"), Some(0), Some(4242)).unwrap();
    fs::set_permissions(m.p("g"), fs::Permissions::from_mode(0o2777)).unwrap();
    let (ok, _, err) = sh_as_nobody(&format!("touch {g}/f && mkdir {g}/d"));
    assert!(ok, "{err}");
    let f = fs::metadata(m.p("g/f")).unwrap();
    let d = fs::metadata(m.p("g/d")).unwrap();
    assert_eq!((f.uid(), f.gid()), (65534, 4242));
    assert_eq!(d.gid(), 4242);
    assert_eq!(d.mode() & 0o2000, 0o2000);
    // A non-member cannot set set-group-ID for a group it is not in: the
    // kernel drops the bit.
    let (ok, _, err) = sh_as_nobody(&format!("chmod 2755 {g}/f"));
    assert!(ok, "{err}");
    assert_eq!(fs::metadata(m.p("g/f")).unwrap().mode() & 0o7777, 0o755);
    m.stop();
}

#[test]
fn writes_by_a_non_owner_clear_set_user_id() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    fs::write(m.p("suid"), b"x").unwrap();
    fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o4777)).unwrap();
    let (ok, _, err) = sh_as_nobody(&format!("echo more >> {}", s(&m.p("suid"))));
    assert!(ok, "{err}");
    assert_eq!(
        mode_now(&m, "suid"),
        "777",
        "set-user-ID cleared by the write"
    );
    assert_eq!(fs::read(m.p("suid")).unwrap(), b"xmore\n");
    m.stop();
}

/// The mode of `name` as `stat -c %a` prints it: statx(2) asking for the
/// mode alone, which the kernel answers from its attribute cache (a write
/// only marks size and times stale), as it checks exec and access. The
/// mount has the kernel drop those attributes when it clears set-ID bits,
/// so this is the new mode at once, not after the attribute TTL (60 s).
fn mode_now(m: &Mounted, name: &str) -> String {
    let out = std::process::Command::new("stat")
        .args(["-c", "%a"])
        .arg(m.p(name))
        .output()
        .unwrap();
    assert!(out.status.success(), "stat {name}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The mount clears set-ID bits itself (HANDLE_KILLPRIV_V2): on an open
/// that truncates, a truncate and a write by a non-owner, as a local
/// filesystem does (ext4 on Linux 6.18 gives these modes): set-group-ID
/// without group-execute stays only for a writer in the file's group, and
/// the owner (root, CAP_FSETID) keeps both.
#[test]
fn truncation_and_writes_by_a_non_owner_clear_set_id_bits() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    // (name, command, mode before, the file's group, mode after)
    let cases: [(&str, &str, u32, u32, u32); 5] = [
        ("o_trunc", ": > {}", 0o6777, 0, 0o0777),
        ("truncate", "truncate -s 1 {}", 0o6777, 0, 0o0777),
        ("write", "printf more >> {}", 0o6777, 0, 0o0777),
        ("locking", "truncate -s 1 {}", 0o6766, 0, 0o0766),
        (
            "locking_in_group",
            "truncate -s 1 {}",
            0o6766,
            65534,
            0o2766,
        ),
    ];
    for (name, script, before, gid, after) in cases {
        fs::write(m.p(name), b"xyz").unwrap();
        std::os::unix::fs::chown(m.p(name), Some(0), Some(gid)).unwrap();
        fs::set_permissions(m.p(name), fs::Permissions::from_mode(before)).unwrap();
        let (ok, _, err) = sh_as_nobody(&script.replace("{}", s(&m.p(name))));
        assert!(ok, "{name}: {err}");
        assert_eq!(
            mode_now(&m, name),
            format!("{after:o}"),
            "{name}: mode {before:o} after `{script}` by a non-owner"
        );
    }
    fs::write(m.p("root"), b"xyz").unwrap();
    fs::set_permissions(m.p("root"), fs::Permissions::from_mode(0o6777)).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("root"))
        .unwrap();
    assert_eq!(
        fs::metadata(m.p("root")).unwrap().mode() & 0o7777,
        0o6777,
        "root truncating keeps set-ID bits (CAP_FSETID)"
    );
    m.stop();
}
