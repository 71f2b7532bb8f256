//! The node plugin's mount operations on real (non-FUSE) bind mounts, as
//! root: a target with more stacked mounts than `STACKED_MAX` is refused
//! rather than looped on, and the next call detaches the rest.

use std::path::{Path, PathBuf};

use baton_csi::mounts::{detach_all, mount_table, mounted_at, STACKED_MAX};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Detaches whatever is left at the path on every way out.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        for _ in 0..=STACKED_MAX + 1 {
            if umount2(&self.0, MntFlags::MNT_DETACH).is_err() {
                break;
            }
        }
    }
}

fn stacked(target: &Path) -> usize {
    let table = mount_table().expect("mountinfo");
    table.iter().filter(|e| e.mountpoint == target).count()
}

#[test]
fn more_stacked_mounts_than_the_limit_are_refused_then_detached() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (source, target) = (dir.path().join("source"), dir.path().join("target"));
    std::fs::create_dir(&source).expect("source");
    std::fs::create_dir(&target).expect("target");
    let _guard = Detach(target.clone());
    for _ in 0..=STACKED_MAX {
        mount(
            Some(&source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind");
    }
    assert_eq!(stacked(&target), STACKED_MAX as usize + 1);
    let err = detach_all(&target).expect_err("more than STACKED_MAX stacked");
    assert!(
        err.to_string()
            .contains(&format!("after {STACKED_MAX} detaches")),
        "{err}"
    );
    assert_eq!(stacked(&target), 1);
    assert_eq!(detach_all(&target).expect("the rest"), 1);
    let table = mount_table().expect("mountinfo");
    assert!(mounted_at(&table, &target).is_none());
    assert_eq!(detach_all(&target).expect("nothing left"), 0);
}
