//! A fenced generation starts no staging write ([`BatonFs::staging_lock`]):
//! the next generation owns staging once it adopts, and a late change
//! from the old one (a truncate's size record after the new one's write)
//! would undo its work.

#![allow(clippy::unwrap_used)]

use std::ffi::OsStr;

use baton_meta::{CreateArgs, FileKind};
use baton_volume::{format, FormatRequest, LockMode, Volume, VolumeOptions, VolumePaths};

use super::*;

/// A filesystem on a fresh volume under `base`, with one empty file.
pub(super) fn fs_with_a_file(
    base: &std::path::Path,
) -> (BatonFs, nix::fcntl::Flock<std::fs::File>, u64) {
    let mut request = FormatRequest::new("v", base);
    request.block_size_bytes = 1 << 16;
    format(&request).unwrap();
    let paths = VolumePaths::named("v", base).unwrap();
    let volume = Volume::open(&paths, &VolumeOptions::default(), LockMode::Exclusive).unwrap();
    let (fs, lock) = BatonFs::from_volume(volume, FsConfig::default());
    fs.own_staging().unwrap();
    let args = CreateArgs {
        kind: FileKind::Regular,
        mode: 0o644,
        umask: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink_target: None,
        inherit_acl: false,
    };
    let ino = fs.meta.create(1, OsStr::new("f"), &args, None).unwrap().ino;
    (fs, lock, ino)
}

#[test]
fn a_fenced_generation_changes_nothing_in_staging() {
    let base = tempfile::tempdir().unwrap();
    let (fs, _lock, ino) = fs_with_a_file(base.path());
    fs.truncate(ino, 100).unwrap();
    assert_eq!(fs.meta.getattr(ino).unwrap().size, 100);
    assert!(fs.staging.staged_inodes().unwrap().is_empty());

    fs.fence();
    let write = fuse_wire::WriteIn {
        offset: 0,
        size: 5,
        ..Default::default()
    };
    let err = fs
        .do_write(ino, &write, b"hello", super::namespace::Caller::root())
        .unwrap_err();
    assert!(err.is_fenced(), "{err}");
    let err = fs.truncate(ino, 4096).unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert!(
        fs.staging.staged_inodes().unwrap().is_empty(),
        "a fenced generation wrote to staging"
    );
    assert_eq!(fs.staging.staged_size(ino).unwrap(), None);

    fs.unfence();
    fs.truncate(ino, 4096).unwrap();
    assert_eq!(fs.meta.getattr(ino).unwrap().size, 4096);
}
