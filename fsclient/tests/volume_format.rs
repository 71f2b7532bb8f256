//! A volume's metadata format decides how its new block objects are named:
//! a volume made by this build gets fanned keys (no directory per inode in
//! a local store), and a format-1 volume, made by an older build, keeps
//! the per-inode layout so that build still reads everything. Needs root
//! and /dev/fuse.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::*;

/// Writes a small and a two-block file, reads them back after a remount,
/// and returns the object files of the small one.
fn write_and_read_back(vol: &Volume) -> Vec<std::path::PathBuf> {
    let mnt = vol.mountpoint("mnt");
    // Past the inline limit: small files of a new volume have no object.
    let small = pattern(20_000, 1);
    let large = pattern(BLOCK_SIZE as usize + 5_000, 2);
    let m = vol.mount(&mnt);
    fs::write(m.p("small"), &small).unwrap();
    fs::write(m.p("large"), &large).unwrap();
    let ino = fs::metadata(m.p("small")).unwrap().ino();
    m.stop();
    let m = vol.mount(&mnt);
    assert!(fs::read(m.p("small")).unwrap() == small);
    assert!(fs::read(m.p("large")).unwrap() == large);
    m.stop();
    object_files(vol, ino)
}

#[test]
fn a_new_volume_names_objects_in_shared_directories() {
    let vol = Volume::new();
    let objects = write_and_read_back(&vol);
    assert_eq!(objects.len(), 1, "{objects:?}");
    let dir = objects[0].parent().unwrap().file_name().unwrap();
    assert_eq!(
        dir.len(),
        2,
        "a fan directory, not the inode's: {objects:?}"
    );
    for dir in fs::read_dir(vol.data.join("blocks")).unwrap() {
        let name = dir.unwrap().file_name();
        assert_eq!(name.len(), 2, "no directory per inode: {name:?}");
    }
}

#[test]
fn a_format_1_volume_keeps_a_directory_per_inode() {
    let vol = Volume::new();
    let db = rusqlite::Connection::open(vol.meta_path()).unwrap();
    db.execute_batch("PRAGMA user_version = 1; UPDATE volume SET format_version = 1;")
        .unwrap();
    drop(db);
    let objects = write_and_read_back(&vol);
    assert_eq!(objects.len(), 1, "{objects:?}");
    let dir = objects[0].parent().unwrap().file_name().unwrap();
    assert_eq!(dir.len(), 16, "the inode's directory: {objects:?}");
    let db = rusqlite::Connection::open(vol.meta_path()).unwrap();
    let version: u32 = db
        .query_row("SELECT format_version FROM volume", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1, "serving a volume never changes its format");
}
