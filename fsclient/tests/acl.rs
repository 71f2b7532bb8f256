//! POSIX ACLs on a real mount (FUSE_POSIX_ACL, DONT_MASK): `setfacl` /
//! `getfacl` as root and as two unprivileged uids (`setpriv` to 65534 /
//! 65533, no supplementary groups), enforced by the kernel; default ACLs
//! inherited without the umask; chmod rewriting the mask; and one command
//! script whose output must match ext4's. Needs root, /dev/fuse and the
//! `acl` package (setfacl, getfacl); the ext4 side needs mkfs.ext4 and a
//! loop device, or a printed skip unless `BATON_REQUIRE_EXT4=1`.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Set by `.ci/run`: the ext4 comparison fails instead of skipping.
const REQUIRE_EXT4_ENV: &str = "BATON_REQUIRE_EXT4";

fn ok(r: (bool, String, String)) -> String {
    assert!(r.0, "command failed: {}", r.2);
    r.1
}

fn refused(r: (bool, String, String), why: &str) {
    assert!(!r.0 && r.2.contains(why), "expected {why:?}, got {r:?}");
}

fn shared_dir(m: &Mounted, name: &str) -> String {
    fs::create_dir(m.p(name)).unwrap();
    fs::set_permissions(m.p(name), fs::Permissions::from_mode(0o777)).unwrap();
    s(&m.p(name)).to_string()
}

#[test]
fn a_named_user_entry_grants_what_the_mode_refuses_and_the_mask_limits_it() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let d = shared_dir(&m, "shared");
    let f = format!("{d}/f");
    ok(sh_as_nobody(&format!(
        "umask 077 && echo secret > {f} && chmod 600 {f}"
    )));
    // The mode alone refuses uid 65533.
    refused(
        sh_as(65533, 65533, &format!("cat {f}")),
        "Permission denied",
    );
    // Only the owner may set an ACL.
    refused(
        sh_as(65533, 65533, &format!("setfacl -m u:65533:r {f}")),
        "Operation not permitted",
    );
    ok(sh_as_nobody(&format!("setfacl -m u:65533:r {f}")));
    assert_eq!(ok(sh_as(65533, 65533, &format!("cat {f}"))), "secret\n");
    refused(
        sh_as(65533, 65533, &format!("echo x >> {f}")),
        "Permission denied",
    );
    let acl = ok(sh(&format!("getfacl -n --omit-header {f}")));
    assert_eq!(
        acl,
        "user::rw-\nuser:65533:r--\ngroup::---\nmask::r--\nother::---\n\n"
    );
    // The group bits show the mask; `ls` sees the ACL.
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o640);
    assert!(ok(sh(&format!("ls -l {f}"))).starts_with("-rw-r-----+"));

    // The mask limits the named entry: rw granted, mask r-- => read only.
    ok(sh_as_nobody(&format!("setfacl -m u:65533:rw,m::r {f}")));
    refused(
        sh_as(65533, 65533, &format!("echo x >> {f}")),
        "Permission denied",
    );
    // chmod sets the mask, as getfacl shows, and takes the grant away.
    ok(sh_as_nobody(&format!("chmod 600 {f}")));
    let acl = ok(sh(&format!("getfacl -n --omit-header {f}")));
    assert!(acl.contains("user:65533:rw-\t#effective:---\n"), "{acl}");
    assert!(acl.contains("mask::---\n"), "{acl}");
    refused(
        sh_as(65533, 65533, &format!("cat {f}")),
        "Permission denied",
    );
    ok(sh_as_nobody(&format!("chmod 660 {f}")));
    ok(sh_as(65533, 65533, &format!("echo more >> {f}")));
    assert_eq!(fs::read_to_string(&f).unwrap(), "secret\nmore\n");

    // A named group entry; uid 65533 runs in group 65532 here.
    ok(sh_as_nobody(&format!(
        "setfacl -b {f} && setfacl -m g:65532:r {f}"
    )));
    assert_eq!(ok(sh_as(65533, 65532, &format!("head -1 {f}"))), "secret\n");
    refused(
        sh_as(65533, 65533, &format!("cat {f}")),
        "Permission denied",
    );

    // `setfacl -b` leaves no ACL: the mode alone again.
    ok(sh_as_nobody(&format!("setfacl -b {f}")));
    assert_eq!(ok(sh(&format!("getfattr -m - {f}"))), "");
    refused(
        sh_as(65533, 65532, &format!("cat {f}")),
        "Permission denied",
    );

    // Directory access: a named entry lets 65533 list and enter a 0700 dir.
    let private = format!("{d}/private");
    ok(sh_as_nobody(&format!(
        "mkdir -m 700 {private} && touch {private}/in"
    )));
    refused(
        sh_as(65533, 65533, &format!("ls {private}")),
        "Permission denied",
    );
    ok(sh_as_nobody(&format!("setfacl -m u:65533:rx {private}")));
    assert_eq!(ok(sh_as(65533, 65533, &format!("ls {private}"))), "in\n");
    refused(
        sh_as(65533, 65533, &format!("touch {private}/new")),
        "Permission denied",
    );

    // cp -a carries the ACL.
    ok(sh_as_nobody(&format!("setfacl -m u:65533:rw {f}")));
    ok(sh(&format!("cp -a {f} {d}/copy")));
    assert_eq!(
        ok(sh(&format!("getfacl -n --omit-header {d}/copy"))),
        ok(sh(&format!("getfacl -n --omit-header {f}")))
    );
    m.stop();
}

#[test]
fn default_acls_are_inherited_by_files_and_subdirectories_without_the_umask() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let d = shared_dir(&m, "proj");
    ok(sh_as_nobody(&format!(
        "mkdir {d}/team && setfacl -d -m u:65533:rwx,g::r-x,o::--- {d}/team"
    )));
    let team = format!("{d}/team");
    // umask 077 would leave nothing for 65533; the default ACL wins.
    ok(sh_as_nobody(&format!(
        "umask 077 && echo a > {team}/a && mkdir {team}/sub && echo b > {team}/sub/b"
    )));
    // umask 022 and a mode of 0600: the create mode still limits the ACL.
    ok(sh_as_nobody(&format!(
        "umask 022 && python3 -c \"import os; os.close(os.open('{team}/c', os.O_CREAT | os.O_WRONLY, 0o600))\""
    )));
    let a = ok(sh(&format!("getfacl -n --omit-header {team}/a")));
    assert_eq!(
        a,
        "user::rw-\nuser:65533:rwx\t#effective:rw-\ngroup::r-x\t#effective:r--\nmask::rw-\nother::---\n\n"
    );
    assert_eq!(
        fs::metadata(format!("{team}/a")).unwrap().mode() & 0o777,
        0o660
    );
    let sub = ok(sh(&format!("getfacl -n --omit-header {team}/sub")));
    assert!(
        sub.starts_with("user::rwx\nuser:65533:rwx\ngroup::r-x\nmask::rwx\nother::---\n")
            && sub.contains("default:user:65533:rwx\n"),
        "{sub}"
    );
    assert_eq!(
        fs::metadata(format!("{team}/sub")).unwrap().mode() & 0o777,
        0o770
    );
    // Inherited again one level down.
    let b = ok(sh(&format!("getfacl -n --omit-header {team}/sub/b")));
    assert!(b.contains("user:65533:rwx\t#effective:rw-\n"), "{b}");
    let c = ok(sh(&format!("getfacl -n --omit-header {team}/c")));
    assert!(c.contains("mask::---\n"), "{c}");
    assert_eq!(
        fs::metadata(format!("{team}/c")).unwrap().mode() & 0o777,
        0o600
    );
    // 65533 reads and writes what the inherited ACL grants, and no more.
    assert_eq!(ok(sh_as(65533, 65533, &format!("cat {team}/sub/b"))), "b\n");
    ok(sh_as(65533, 65533, &format!("echo x >> {team}/a")));
    refused(
        sh_as(65533, 65533, &format!("cat {team}/c")),
        "Permission denied",
    );
    refused(
        sh_as(65532, 65532, &format!("ls {team}/sub")),
        "Permission denied",
    );

    // Without a default ACL the umask applies as before.
    ok(sh_as_nobody(&format!(
        "umask 027 && touch {d}/plain && mkdir {d}/plaindir"
    )));
    assert_eq!(
        fs::metadata(format!("{d}/plain")).unwrap().mode() & 0o777,
        0o640
    );
    assert_eq!(
        fs::metadata(format!("{d}/plaindir")).unwrap().mode() & 0o777,
        0o750
    );
    assert_eq!(ok(sh(&format!("getfattr -m - {d}/plain"))), "");

    // Only directories take a default ACL (EINVAL from the kernel, as on
    // ext4); only the owner sets one.
    refused(
        sh_as_nobody(&format!(
            "setfattr -n system.posix_acl_default -v 0x02000000010007ffffffff04000500ffffffff20000000ffffffff {team}/a"
        )),
        "Invalid argument",
    );
    refused(
        sh_as(65533, 65533, &format!("setfacl -d -m u:65533:r {team}/sub")),
        "Operation not permitted",
    );
    m.stop();
}

#[test]
fn setting_an_acl_clears_set_group_id_for_a_caller_outside_the_group() {
    let vol = Volume::new();
    let m = vol.mount(&vol.mountpoint("mnt"));
    let d = shared_dir(&m, "sg");
    ok(sh(&format!(
        "mkdir {d}/dir && chown 65534:65532 {d}/dir && chmod 2775 {d}/dir"
    )));
    ok(sh_as_nobody(&format!("setfacl -m u:65533:rx {d}/dir")));
    let mode = fs::metadata(format!("{d}/dir")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o775, "{mode:o}");
    // In the group: kept.
    ok(sh(&format!("chmod 2775 {d}/dir")));
    ok(sh_as(
        65534,
        65532,
        &format!("setfacl -m u:65533:r {d}/dir"),
    ));
    let mode = fs::metadata(format!("{d}/dir")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o2775, "{mode:o}");
    // New entries still take the directory's group.
    ok(sh_as(
        65533,
        65533,
        &format!("touch {d}/dir/x 2>&1 || true"),
    ));
    ok(sh(&format!("touch {d}/dir/y")));
    assert_eq!(fs::metadata(format!("{d}/dir/y")).unwrap().gid(), 65532);
    m.stop();
}

/// ACLs are metadata: they outlive the fsclient process.
#[test]
fn acls_survive_kill_9_and_a_new_mount() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let m = vol.mount(&mnt);
    let d = shared_dir(&m, "d");
    ok(sh_as_nobody(&format!(
        "umask 077 && echo s > {d}/f && setfacl -m u:65533:r {d}/f"
    )));
    ok(sh(&format!("setfacl -d -m u:65533:rx {d}")));
    let before = ok(sh(&format!("getfacl -n {d}/f {d}")));
    m.kill9();
    let m = vol.mount(&mnt);
    assert_eq!(ok(sh(&format!("getfacl -n {d}/f {d}"))), before);
    assert_eq!(ok(sh_as(65533, 65533, &format!("cat {d}/f"))), "s\n");
    m.stop();
}

/// The script both sides run, in the directory they are given (relative
/// names only, so the outputs can be compared).
const SIDE_BY_SIDE_SCRIPT: &str = r#"
run() { "$@" 2>&1 | sed 's/^[a-z]*: //'; echo "rc=${PIPESTATUS[0]}"; }
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
umask 022
touch f; chmod 640 f
run setfacl -m u:65533:rw,g:65532:r f
run getfacl -n f; stat -c '%A %a' f
chmod 750 f; run getfacl -n f; stat -c '%A %a' f
run setfacl -m m::r f; run getfacl -n f; stat -c '%A' f
run setfacl -m u::rwx,g::r-x,o::r-- f; run getfacl -n f
run setfacl -b f; run getfacl -n f; stat -c '%A' f
run setfacl -m u::rwx,g::r-x,o::r-- f; run getfattr -m - f; stat -c '%A' f
run setfattr -x system.posix_acl_access f
run setfattr -n system.posix_acl_access -v 0x01000000010007ffffffff04000700ffffffff20000500ffffffff f
run setfattr -n system.posix_acl_access -v 0x02000000010007ffffffff f
run setfattr -n system.posix_acl_default -v 0x02000000010007ffffffff04000500ffffffff20000000ffffffff f
run setfacl -d -m u:1:r f
mkdir d
run setfacl -d -m u:65533:rwx,g::r-x,o::--- d
run setfacl -m d:m::rwx d
run getfacl -n d
umask 077; touch d/a; mkdir d/sub; mknod d/fifo p
umask 022; touch d/b; mkdir d/sub/deeper; ln -s a d/link
run getfacl -n d/a d/b d/fifo d/sub d/sub/deeper
stat -c '%n %A' d/a d/b d/fifo d/sub d/sub/deeper
run getfacl -n -P d/link
run getfattr -h -m - d/link
chmod 700 d/sub; run getfacl -n d/sub
run setfacl -k d; run getfacl -n d
run setfacl -x u:65533 d/a; run getfacl -n d/a; stat -c '%A' d/a
run getfattr -e hex -n system.posix_acl_access d/b
mkdir sg; chown 65534:65532 sg; chmod 2775 sg
run nobody setfacl -m u:65533:rx sg; stat -c '%A' sg
chmod 2775 sg; run setpriv --reuid=65534 --regid=65532 --clear-groups setfacl -m u:65533:r sg; stat -c '%A' sg
run nobody setfacl -m u:65534:r f
cp -a d/b copied; run getfacl -n copied
tar --acls -cf t.tar d/b d/sub; mkdir x; tar --acls -xpf t.tar -C x; run getfacl -n x/d/b x/d/sub
"#;

/// An ext4 filesystem on a loop device; unmounted and detached on drop.
struct Ext4Disk {
    device: String,
    at: PathBuf,
}

impl Ext4Disk {
    /// `None` (with the reason) when mkfs.ext4 or a loop device is missing.
    fn mount(image: &Path, at: &Path) -> Result<Ext4Disk, String> {
        let file = fs::File::create(image).map_err(|e| e.to_string())?;
        file.set_len(64 << 20).map_err(|e| e.to_string())?;
        let run = |cmd: &mut Command| -> Result<String, String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image))?;
        let device = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image))?;
        fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let disk = Ext4Disk {
            device,
            at: at.to_path_buf(),
        };
        run(Command::new("mount").arg(&disk.device).arg(at))?;
        Ok(disk)
    }
}

impl Drop for Ext4Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

fn run_script_in(dir: &Path) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(SIDE_BY_SIDE_SCRIPT)
        .current_dir(dir)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn acl_commands_print_what_they_print_on_ext4() {
    let vol = Volume::new();
    let ext4 = match Ext4Disk::mount(&vol.path("ext4.img"), &vol.path("ext4")) {
        Ok(disk) => disk,
        Err(reason) => {
            assert!(
                std::env::var(REQUIRE_EXT4_ENV).as_deref() != Ok("1"),
                "{REQUIRE_EXT4_ENV}=1 but no ext4 to compare with: {reason}"
            );
            println!("SKIP acl_commands_print_what_they_print_on_ext4: no ext4: {reason}");
            return;
        }
    };
    let on_ext4 = ext4.at.join("t");
    fs::create_dir(&on_ext4).unwrap();
    fs::set_permissions(&on_ext4, fs::Permissions::from_mode(0o777)).unwrap();
    let expected = run_script_in(&on_ext4);

    let m = vol.mount(&vol.mountpoint("mnt"));
    let on_baton = m.p("t");
    fs::create_dir(&on_baton).unwrap();
    fs::set_permissions(&on_baton, fs::Permissions::from_mode(0o777)).unwrap();
    let got = run_script_in(&on_baton);
    m.stop();
    drop(ext4);
    if got != expected {
        for (i, (a, b)) in expected.lines().zip(got.lines()).enumerate() {
            if a != b {
                panic!(
                    "line {}: ext4 {a:?}, baton {b:?}\n--- ext4:\n{expected}\n--- baton:\n{got}",
                    i + 1
                );
            }
        }
        panic!("lengths differ\n--- ext4:\n{expected}\n--- baton:\n{got}");
    }
    // The script did what it is meant to (not two identical failures).
    assert!(expected.contains("user:65533:rw-"), "{expected}");
    assert!(expected.contains("default:user:65533:rwx"), "{expected}");
}
