//! Opening /dev/fuse and mounting it with mount(2), without fusermount.
//!
//! Mounting and answering INIT are separate steps (see [`crate::init`]):
//! the supervisor mounts and keeps the fd; a generation serves it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{open, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::Mode;

use crate::{mountinfo, Error};

/// Options of a FUSE mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Shown as the source in /proc/mounts (e.g. the volume name).
    pub source: String,
    /// Filesystem subtype shown as `fuse.SUBTYPE`.
    pub subtype: String,
    /// Let users other than the mounter use the mount.
    pub allow_other: bool,
    /// Let the kernel check permissions from the file modes.
    pub default_permissions: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            source: "baton".to_string(),
            subtype: "baton".to_string(),
            allow_other: true,
            default_permissions: true,
        }
    }
}

/// Checks that `path` can take a mount: an existing, empty directory that
/// is not a mountpoint already. Returns its canonical path. The one rule
/// for every Baton program that mounts (the supervisor, `fsclient mount`).
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, Error> {
    let unusable = |problem: String, fix| Error::UnusableMountpoint {
        path: path.to_path_buf(),
        problem,
        fix,
    };
    let canonical = std::fs::canonicalize(path).map_err(|err| {
        unusable(
            format!("cannot be used: {err}"),
            "create it with `mkdir -p` or pick another path",
        )
    })?;
    if !canonical.is_dir() {
        return Err(unusable(
            "is not a directory".into(),
            "mount on an empty directory",
        ));
    }
    let mut entries = std::fs::read_dir(&canonical).map_err(|err| {
        unusable(
            format!("cannot be listed: {err}"),
            "mount on an empty directory you can read",
        )
    })?;
    if entries.next().is_some() {
        return Err(unusable(
            "is not empty".into(),
            "mount on an empty directory (or move its contents away)",
        ));
    }
    if is_mountpoint(&canonical) {
        return Err(unusable(
            "is already a mountpoint".into(),
            "unmount it first or pick another directory",
        ));
    }
    Ok(canonical)
}

/// Whether `/proc/self/mountinfo` lists a mount exactly at `path` (every
/// escape of mountinfo undone: space, tab, newline, backslash).
pub fn is_mountpoint(path: &Path) -> bool {
    mountinfo::read().is_ok_and(|table| mountinfo::top_at(&table, path).is_some())
}

/// Opens /dev/fuse (O_RDWR | O_CLOEXEC) and mounts it at `mountpoint`.
///
/// The kernel queues INIT at once; nothing on the mount answers (stat blocks)
/// until someone answers it through the returned fd.
pub fn mount_fuse(mountpoint: &Path, options: &MountOptions) -> Result<OwnedFd, Error> {
    let dev = open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|errno| Error::OpenDevice { errno })?;
    let meta = std::fs::metadata(mountpoint).map_err(|source| Error::Mountpoint {
        path: mountpoint.to_path_buf(),
        source,
    })?;
    use std::os::unix::fs::MetadataExt;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        meta.mode() & libc::S_IFMT,
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if options.allow_other {
        data.push_str(",allow_other");
    }
    if options.default_permissions {
        data.push_str(",default_permissions");
    }
    let fstype = format!("fuse.{}", options.subtype);
    mount(
        Some(options.source.as_str()),
        mountpoint,
        Some(fstype.as_str()),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|errno| Error::Mount {
        path: mountpoint.to_path_buf(),
        errno,
    })?;
    Ok(dev)
}

/// Detaches the mount at `mountpoint` (MNT_DETACH): safe on every path,
/// including when nobody serves the connection.
pub fn unmount(mountpoint: &Path) -> Result<(), Error> {
    umount2(mountpoint, MntFlags::MNT_DETACH).map_err(|errno| Error::Unmount {
        path: mountpoint.to_path_buf(),
        errno,
    })
}

/// The fusectl connection number of the FUSE mount at `mountpoint`, read
/// from /proc/self/mountinfo (it is the minor device number; `stat` on the
/// mountpoint would block until INIT is answered).
pub fn connection_id(mountpoint: &Path) -> Result<u32, Error> {
    Ok(top_mount(mountpoint)?.minor)
}

/// Baton's readahead window, KiB: 1 MiB, INIT's `max_pages`, so that a
/// sequential read arrives as READs of the largest size. Not larger: the
/// kernel also reads a whole window around each page fault of a mapping
/// (for its first hundred misses), and Baton reads further ahead itself,
/// a block at a time.
pub const READ_AHEAD_KIB: u32 = 1024;

/// Sets the kernel's readahead window on the FUSE mount at `mountpoint`
/// to [`READ_AHEAD_KIB`]; call it after INIT (INIT caps the window). The
/// kernel starts every FUSE mount at 128 KiB and INIT can only lower it,
/// so a sequential read arrives as 128 KiB requests, one or two at a time;
/// with a larger window it arrives as requests of up to `max_pages`,
/// several at a time. A failure (not root, no sysfs) is logged, not
/// returned: the mount works as it is.
pub fn raise_read_ahead(mountpoint: &Path) {
    if let Err(err) = set_read_ahead(mountpoint, READ_AHEAD_KIB) {
        tracing::warn!(
            mountpoint = %mountpoint.display(),
            %err,
            "kernel readahead left at its default: sequential reads will arrive in 128 KiB requests"
        );
    }
}

/// Writes `kib` to `/sys/class/bdi/{device}/read_ahead_kb` of the mount.
fn set_read_ahead(mountpoint: &Path, kib: u32) -> Result<(), Error> {
    let path = PathBuf::from(format!(
        "/sys/class/bdi/{}/read_ahead_kb",
        top_mount(mountpoint)?.device()
    ));
    std::fs::write(&path, kib.to_string()).map_err(|source| Error::Mountpoint { path, source })
}

/// The mount at `mountpoint` from /proc/self/mountinfo (the top of the
/// stack when mounts are stacked).
fn top_mount(mountpoint: &Path) -> Result<mountinfo::MountInfo, Error> {
    let wanted = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let table = mountinfo::read().map_err(|source| Error::Mountpoint {
        path: PathBuf::from(mountinfo::MOUNTINFO_PATH),
        source,
    })?;
    mountinfo::top_at(&table, &wanted)
        .cloned()
        .ok_or_else(|| Error::NotMounted {
            path: mountpoint.to_path_buf(),
        })
}

/// Aborts the connection of the mount at `mountpoint` through fusectl: every
/// waiting caller gets ECONNABORTED and the mount is dead. Last resort only.
pub fn abort_connection(mountpoint: &Path) -> Result<(), Error> {
    let id = connection_id(mountpoint)?;
    let connections = Path::new(FUSECTL_DIR);
    if !connections.join(id.to_string()).exists() {
        // fusectl is not mounted on every machine; it is a single instance,
        // so mounting it here shows every connection.
        let _ = mount(
            Some("fusectl"),
            connections,
            Some("fusectl"),
            MsFlags::empty(),
            None::<&str>,
        );
    }
    let path = connections.join(id.to_string()).join("abort");
    std::fs::write(&path, b"1").map_err(|source| Error::Mountpoint { path, source })
}

/// Where the fusectl filesystem lists FUSE connections.
pub const FUSECTL_DIR: &str = "/sys/fs/fuse/connections";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mountpoints_must_exist_be_empty_directories_and_not_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_mountpoint(&dir.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("mkdir -p"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = check_mountpoint(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let full = dir.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), "x").unwrap();
        let err = check_mountpoint(&full).unwrap_err();
        assert!(err.to_string().contains("is not empty"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(
            check_mountpoint(&empty).unwrap(),
            empty.canonicalize().unwrap()
        );
        assert!(is_mountpoint(Path::new("/proc")));
        assert!(!is_mountpoint(&empty));
    }
}
