//! This process's view of the mount table and the two mount operations the
//! node plugin makes: a bind mount and a detaching unmount.
//!
//! Nothing here stats, opens or canonicalizes a path that may be a FUSE
//! mount: whether a path is mounted is read from `/proc/self/mountinfo`,
//! and unmounting uses `MNT_DETACH`, so a dead or stalled FUSE server never
//! blocks an unpublish.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statfs::{fstatfs, FUSE_SUPER_MAGIC};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The `major:minor` of the mounted filesystem.
    pub device: String,
    /// The directory of that filesystem mounted here (`/` or a bind's subdirectory).
    pub root: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, ...).
    pub options: Vec<String>,
    /// The filesystem type (`fuse.baton`, `ext4`, ...).
    pub fstype: String,
}

impl MountEntry {
    /// True if mounted read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Every mount this process sees, in mount order (later entries sit on top).
pub fn mount_table() -> std::io::Result<Vec<MountEntry>> {
    Ok(fuse_wire::mountinfo::read()?
        .into_iter()
        .map(MountEntry::from)
        .collect())
}

/// The topmost mount at `path` (compared as given: never resolved).
pub fn mounted_at<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    table.iter().rev().find(|entry| entry.mountpoint == path)
}

/// Mounts other than the one at `mountpoint` that show the same filesystem
/// (the bind mounts made from it).
pub fn binds_of(table: &[MountEntry], mountpoint: &Path) -> usize {
    let Some(shared) = mounted_at(table, mountpoint) else {
        return 0;
    };
    table
        .iter()
        .filter(|e| e.device == shared.device && e.mountpoint != mountpoint)
        .count()
}

impl From<fuse_wire::mountinfo::MountInfo> for MountEntry {
    fn from(m: fuse_wire::mountinfo::MountInfo) -> MountEntry {
        MountEntry {
            device: m.device(),
            root: m.root.to_string_lossy().into_owned(),
            options: m.options.split(',').map(str::to_string).collect(),
            mountpoint: m.mountpoint,
            fstype: m.fstype,
        }
    }
}

/// A shared mount's root, held open.
pub struct PinnedRoot {
    // Keeps the filesystem reachable through `path` (never read directly).
    _root: File,
    /// `/proc/self/fd/N`: paths under it resolve in the FUSE mount opened,
    /// even if its mountpoint was unmounted since, never in the directory
    /// under the mountpoint.
    pub path: PathBuf,
}

/// Opens `mountpoint` (O_CLOEXEC, as std always does) and checks that what
/// it opened is a FUSE filesystem, so the directories the plugin creates,
/// binds or deletes are always the Baton volume's.
pub fn pin_fuse_root(mountpoint: &Path) -> Result<PinnedRoot, String> {
    let root = File::open(mountpoint).map_err(|err| {
        format!(
            "cannot open the shared mount {}: {err}",
            mountpoint.display()
        )
    })?;
    let fs = fstatfs(&root).map_err(|errno| {
        format!(
            "cannot statfs the shared mount {}: {errno}",
            mountpoint.display()
        )
    })?;
    if fs.filesystem_type() != FUSE_SUPER_MAGIC {
        return Err(format!(
            "{} is not a FUSE mount any more (unmounted meanwhile?); retry, and see `fsctl status`",
            mountpoint.display()
        ));
    }
    let path = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
    Ok(PinnedRoot { _root: root, path })
}

/// Bind-mounts `source` at `target`, then makes the bind read-only and/or
/// `nosuid`/`nodev`/`noexec` as asked (a bind takes flags only on remount).
pub fn bind(source: &Path, target: &Path, extra: MsFlags) -> nix::Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    if !extra.is_empty() {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | extra;
        if let Err(errno) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
            let _ = umount2(target, MntFlags::MNT_DETACH);
            return Err(errno);
        }
    }
    Ok(())
}

/// At most this many mounts stacked at one target are detached by one
/// call; more is refused, not looped on.
pub const STACKED_MAX: u32 = 16;

/// Detaches every mount stacked at `target` (`MNT_DETACH`: never waits for
/// the filesystem). Returns how many were detached.
pub fn detach_all(target: &Path) -> std::io::Result<u32> {
    let mut detached = 0;
    while mounted_at(&mount_table()?, target).is_some() {
        if detached == STACKED_MAX {
            return Err(std::io::Error::other(format!(
                "{} still has mounts after {STACKED_MAX} detaches",
                target.display()
            )));
        }
        umount2(target, MntFlags::MNT_DETACH).map_err(std::io::Error::from)?;
        detached += 1;
    }
    Ok(detached)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse_line(line: &str) -> Option<MountEntry> {
        fuse_wire::mountinfo::MountInfo::parse(line.as_bytes()).map(MountEntry::from)
    }

    #[test]
    fn a_mountinfo_line_with_escapes_and_optional_fields_parses() {
        let line = "36 35 0:52 /pvc\\040a /var/lib/k\\040t rw,nosuid shared:1 master:2 - fuse.baton vol rw,user_id=0";
        let entry = parse_line(line).unwrap();
        assert_eq!(entry.options, ["rw", "nosuid"]);
        assert_eq!(entry.device, "0:52");
        assert_eq!(entry.root, "/pvc a");
        assert_eq!(entry.mountpoint, PathBuf::from("/var/lib/k t"));
        assert_eq!(entry.fstype, "fuse.baton");
        assert!(!entry.read_only());
    }

    #[test]
    fn binds_are_counted_by_device_without_the_shared_mount() {
        let table: Vec<MountEntry> = [
            "1 0 0:52 / /m rw - fuse.baton v rw",
            "2 0 0:52 /a /t1 ro - fuse.baton v rw",
            "3 0 0:53 / /other rw - fuse.baton w rw",
        ]
        .iter()
        .filter_map(|l| parse_line(l))
        .collect();
        assert_eq!(binds_of(&table, Path::new("/m")), 1);
        assert_eq!(binds_of(&table, Path::new("/none")), 0);
        assert!(mounted_at(&table, Path::new("/t1")).unwrap().read_only());
    }

    #[test]
    fn a_directory_that_is_not_a_fuse_mount_is_never_used_as_a_volume() {
        let dir = tempfile::tempdir().unwrap();
        let err = pin_fuse_root(dir.path()).err().unwrap();
        assert!(err.contains("is not a FUSE mount"), "{err}");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }
}
