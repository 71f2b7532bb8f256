//! A volume formatted with `--compression lz4 --encryption-key-file`:
//! written through a real mount, its objects hold no plaintext and the
//! compressible file takes less room; a mount without the key or with
//! another key fails before mount(2) with a clear message and leaves
//! nothing mounted; the right key (by flag or BATON_KEY_FILE) reads the
//! data back intact; fsck and gc work without the key. A volume formatted
//! with `--passphrase-file` (Argon2id, salt recorded in the volume): a wrong
//! passphrase or a key file is refused before mount(2), the right
//! passphrase (by flag or BATON_PASSPHRASE_FILE) reads the data back.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chaos_tests::mount_guard::{wait_for_mount, workspace_binary, ChildGuard, MountGuard};

const MARKER: &[u8] = b"PLAINTEXT-MARKER-0123456789 ";

fn fsctl(args: &[&str]) -> Output {
    Command::new(workspace_binary("fsctl"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run fsctl (build the workspace first)")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn spawn_mount(base: &Path, mnt: &Path, key: Option<(&str, &Path)>) -> ChildGuard {
    let mut command = Command::new(workspace_binary("fsclient"));
    command
        .args(["mount", "vol"])
        .arg(mnt)
        .arg("--base-dir")
        .arg(base)
        .env_remove("BATON_KEY_FILE")
        .env_remove("BATON_PASSPHRASE_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match key {
        Some(("flag", path)) => {
            command.arg("--key-file").arg(path);
        }
        Some(("passphrase", path)) => {
            command.arg("--passphrase-file").arg(path);
        }
        Some(("passphrase-env", path)) => {
            command.env("BATON_PASSPHRASE_FILE", path);
        }
        Some((_, path)) => {
            command.env("BATON_KEY_FILE", path);
        }
        None => {}
    }
    ChildGuard(command.spawn().expect("spawn fsclient"))
}

/// A mount that must fail: its exit status and message.
fn refused_mount(base: &Path, mnt: &Path, key: Option<(&str, &Path)>) -> String {
    let mut child = spawn_mount(base, mnt, key);
    let started = Instant::now();
    let status = child
        .wait_timeout(Duration::from_secs(20))
        .expect("a refused mount exits");
    assert!(!status.success(), "mounted without the right key");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(fuse_wire::connection_id(mnt).is_err(), "nothing mounted");
    let mut stderr = String::new();
    if let Some(mut pipe) = child.0.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
    }
    stderr
}

fn mount(base: &Path, mnt: &Path, key: (&str, &Path)) -> (ChildGuard, MountGuard) {
    let child = spawn_mount(base, mnt, Some(key));
    assert!(
        wait_for_mount(mnt, Duration::from_secs(20)),
        "fsclient did not mount"
    );
    (child, MountGuard::new(mnt))
}

fn unmount(mnt: &Path, (mut child, guard): (ChildGuard, MountGuard)) {
    assert!(Command::new("umount").arg(mnt).status().unwrap().success());
    let status = child.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "fsclient exited with {status}");
    drop(guard);
}

fn objects(data: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in fs::read_dir(data.join("blocks")).unwrap() {
        for file in fs::read_dir(dir.unwrap().path()).unwrap() {
            out.push(file.unwrap().path());
        }
    }
    out
}

#[test]
fn an_encrypted_compressed_volume_needs_its_key_and_keeps_data_intact() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let key = base.join("volume.key");
    fs::write(&key, [0x5a; 32]).unwrap();
    let other_key = base.join("other.key");
    fs::write(&other_key, format!("{}\n", "ab".repeat(32))).unwrap();
    let out = fsctl(&[
        "format",
        "vol",
        "--block-size",
        "256K",
        "--compression",
        "lz4",
        "--encryption-key-file",
        key.to_str().unwrap(),
        "--base-dir",
        base.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("encryption=chacha20-poly1305"),
        "{}",
        text(&out)
    );
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();

    let compressible = MARKER.repeat(40_000); // ~1.1 MB
    let random: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mounted = mount(base, &mnt, ("flag", &key));
    fs::write(mnt.join("text"), &compressible).unwrap();
    fs::write(mnt.join("random"), &random).unwrap();
    // Small enough to be kept in the metadata (an inline block): sealed too.
    let small = MARKER.repeat(100);
    fs::write(mnt.join("small"), &small).unwrap();
    unmount(&mnt, mounted);
    for entry in fs::read_dir(base.join("vol")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = fs::read(&path).unwrap();
            assert!(
                !bytes.windows(MARKER.len()).any(|w| w == MARKER),
                "plaintext found in {}",
                path.display()
            );
        }
    }

    let data = base.join("vol/data");
    let stored: Vec<Vec<u8>> = objects(&data)
        .iter()
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert!(!stored.is_empty());
    for object in &stored {
        assert!(
            !object.windows(MARKER.len()).any(|w| w == MARKER),
            "plaintext found in an object"
        );
    }
    let stored_bytes: usize = stored.iter().map(Vec::len).sum();
    assert!(
        stored_bytes < compressible.len() / 2 + random.len() + 4096,
        "compressed: {stored_bytes} bytes stored"
    );

    let said = refused_mount(base, &mnt, None);
    assert!(
        said.contains("encrypted") && said.contains("--key-file"),
        "{said}"
    );
    let said = refused_mount(base, &mnt, Some(("flag", &other_key)));
    assert!(said.contains("does not match"), "{said}");

    let mounted = mount(base, &mnt, ("env", &key));
    assert!(fs::read(mnt.join("text")).unwrap() == compressible);
    assert!(fs::read(mnt.join("random")).unwrap() == random);
    assert!(fs::read(mnt.join("small")).unwrap() == small);
    unmount(&mnt, mounted);

    let base_arg = base.to_str().unwrap();
    let out = fsctl(&["fsck", "vol", "--base-dir", base_arg]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(" 0 missing or short"), "{}", text(&out));
    let out = fsctl(&["gc", "vol", "--dry-run", "--base-dir", base_arg]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_passphrase_volume_refuses_a_wrong_passphrase_before_mount_and_reads_back_with_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let pass = base.join("pass");
    fs::write(&pass, "correct horse battery staple\n").unwrap();
    let wrong = base.join("wrong");
    fs::write(&wrong, "correct horse battery stapler\n").unwrap();
    let key = base.join("volume.key");
    fs::write(&key, [0x5a; 32]).unwrap();
    let out = fsctl(&[
        "format",
        "vol",
        "--block-size",
        "256K",
        "--passphrase-file",
        pass.to_str().unwrap(),
        "--base-dir",
        base.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("kdf=argon2id") && said.contains("kdf_salt="),
        "{said}"
    );
    // Both kinds at once are refused.
    let out = fsctl(&[
        "format",
        "vol2",
        "--passphrase-file",
        pass.to_str().unwrap(),
        "--encryption-key-file",
        key.to_str().unwrap(),
        "--base-dir",
        base.to_str().unwrap(),
    ]);
    assert!(
        !out.status.success(),
        "a key file and a passphrase were both accepted"
    );

    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let body = MARKER.repeat(20_000);
    let mounted = mount(base, &mnt, ("passphrase", &pass));
    fs::write(mnt.join("secret"), &body).unwrap();
    unmount(&mnt, mounted);
    for object in objects(&base.join("vol/data")) {
        let stored = fs::read(object).unwrap();
        assert!(
            !stored.windows(MARKER.len()).any(|w| w == MARKER),
            "plaintext found in an object"
        );
    }

    let said = refused_mount(base, &mnt, Some(("passphrase", &wrong)));
    assert!(said.contains("does not match"), "{said}");
    let said = refused_mount(base, &mnt, Some(("flag", &key)));
    assert!(said.contains("--passphrase-file"), "{said}");
    let said = refused_mount(base, &mnt, None);
    assert!(said.contains("--passphrase-file"), "{said}");

    let mounted = mount(base, &mnt, ("passphrase-env", &pass));
    assert!(
        fs::read(mnt.join("secret")).unwrap() == body,
        "the data is intact"
    );
    unmount(&mnt, mounted);
}
