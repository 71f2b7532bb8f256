//! A full staging filesystem: ENOSPC surfaces as `StagingFull` and earlier
//! staged data stays intact. Needs root to mount a 1 MiB tmpfs; skipped with
//! a printed reason otherwise.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use baton_blocks::{BlocksError, Staging};
use bytes::Bytes;

const BS: u64 = 64 << 10;

/// Unmounts the tmpfs when dropped.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tiny_tmpfs(dir: &Path) -> Option<MountGuard> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(MountGuard(dir.to_path_buf())),
        Ok(o) => {
            eprintln!(
                "skipping: mount tmpfs failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("skipping: cannot run mount: {e}");
            None
        }
    }
}

fn no_base(_: u64) -> baton_blocks::Result<Option<Bytes>> {
    Ok(None)
}

fn block_bytes(index: u64) -> Vec<u8> {
    vec![(index as u8).wrapping_add(1); BS as usize]
}

/// A `Staging` in a fresh 1 MiB tmpfs (`None`, with a printed reason,
/// without root), and how many blocks of inode 1 fitted before it was
/// full, with the error of the one that did not.
fn full_staging(tmp: &Path) -> Option<(MountGuard, Staging, u64, BlocksError)> {
    let guard = mount_tiny_tmpfs(tmp)?;
    let staging = Staging::open(&guard.0.join("staging"), BS).unwrap();
    let mut written = 0u64;
    let err = loop {
        assert!(written < 64, "1 MiB tmpfs never filled");
        match staging.write(1, written * BS, &block_bytes(written), &no_base) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    Some((guard, staging, written, err))
}

#[test]
fn full_staging_fs_reports_staging_full_and_keeps_earlier_data() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((guard, staging, written, err)) = full_staging(tmp.path()) else {
        return;
    };
    let dir = guard.0.join("staging");
    assert!(written > 0, "nothing fitted");
    eprintln!("staged {written} blocks of {BS} bytes before ENOSPC");
    assert!(matches!(err, BlocksError::StagingFull { .. }), "{err}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(
        err.to_string().contains(&dir.display().to_string()),
        "{err}"
    );
    // No partial block file for the failed write, earlier blocks intact.
    let dirty = staging.dirty_blocks(1).unwrap();
    assert_eq!(dirty, (0..written).collect::<Vec<_>>());
    for index in 0..written {
        let overlay = staging.read_overlay(1, index * BS, BS).unwrap();
        assert_eq!(overlay.segments.len(), 1);
        assert_eq!(&overlay.segments[0].data[..], &block_bytes(index)[..]);
    }
    // Overwriting already staged (allocated) bytes still works when full.
    staging.write(1, 0, b"rewrite", &no_base).unwrap();
    // A reopen on the full filesystem still recovers everything.
    drop(staging);
    let staging = Staging::open(&dir, BS).unwrap();
    assert_eq!(staging.recover().unwrap(), vec![1]);
    assert_eq!(staging.dirty_blocks(1).unwrap().len() as u64, written);
    drop(staging);
    drop(guard);
}

/// The first size record of an inode, written when its block fitted but
/// the record did not, leaves no record rather than an empty one (which
/// would make every later read and flush of the inode fail).
#[test]
fn a_record_that_does_not_fit_leaves_no_unreadable_record() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((guard, staging, written, _)) = full_staging(tmp.path()) else {
        return;
    };
    // Fill the last pages one by one, then free exactly one page: cutting
    // the last staged block by 4 KiB.
    let mut ino = 100;
    while staging.write(ino, 0, &[7u8; 4096], &no_base).is_ok() {
        ino += 1;
    }
    staging.set_size(1, written * BS - 4096).unwrap();
    // One page free: the new inode's block takes it, its record cannot.
    let err = staging.write(500, 0, b"x", &no_base).unwrap_err();
    assert!(matches!(err, BlocksError::StagingFull { .. }), "{err}");
    assert!(
        staging.staged_size(500).is_ok(),
        "an unreadable size record was left: {:?}",
        staging.staged_size(500)
    );
    for i in 100..ino {
        assert!(staging.staged_size(i).unwrap().is_some());
    }
    drop(staging);
    drop(guard);
}
