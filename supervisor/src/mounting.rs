//! Making and removing a supervised mount: validating `fsctl mount`
//! (mountpoint, volume), mount(2) and FUSE_INIT by the supervisor itself
//! (so it is the one source of truth for the negotiated parameters), and
//! the unmount helper (normal umount, MNT_DETACH when busy, and an abort
//! through fusectl if the unmount hangs, so it never blocks the loop).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use fuse_wire::{Channel, InitConfig, MountOptions};
use nix::errno::Errno;
use nix::mount::{umount2, MntFlags};
use upgrade_protocol::{ErrorKind, NegotiatedInit, Reply, VolumeSpec};

/// How long a normal unmount may take before the connection is aborted.
pub const UNMOUNT_WAIT_MS: u64 = 5_000;

/// A refusal for the user: the message names the object and the next step.
pub fn invalid(message: String) -> Reply {
    Reply::Error {
        kind: ErrorKind::Invalid,
        message,
    }
}

/// A stable id for a mountpoint: FNV-1a of its canonical path, 16 hex
/// digits (names its state record, socket, log and cgroups). Pure.
pub fn mount_id(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let hash = mountpoint
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{hash:016x}")
}

/// Checks the mountpoint (fuse-wire's one rule: an existing empty
/// directory, not a mountpoint already), given as an absolute path.
/// Returns its canonical path.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, Reply> {
    if !path.is_absolute() {
        return Err(invalid(format!(
            "mountpoint {} is relative; fsctl sends absolute paths, so this peer is not fsctl",
            path.display()
        )));
    }
    fuse_wire::check_mountpoint(path).map_err(|err| invalid(err.to_string()))
}

/// Checks that the volume exists: `BASE/NAME/meta.db`, or the file of a
/// `sqlite://` URL. Returns the volume's identity on this host, its local
/// directory: one mount per volume.
///
/// A `postgres://` volume is checked by its first generation (which opens it
/// before serving); its identity here is this host's local state directory
/// (`BASE/pg-DB`), so it can be mounted once per base directory.
pub fn check_volume(spec: &VolumeSpec, base_dir: &Path) -> Result<PathBuf, Reply> {
    if let Some(meta) = spec.sqlite_path(base_dir) {
        if !meta.is_file() {
            return Err(invalid(format!(
                "volume `{spec}` not found: {} does not exist; create it with `fsctl format {spec} --base-dir {}`",
                meta.display(),
                base_dir.display()
            )));
        }
    }
    Ok(spec.local_dir(base_dir))
}

/// mount(2) at `mountpoint` and answer INIT. On an INIT failure the mount
/// is removed again. A volume other hosts may serve (PostgreSQL metadata)
/// gets no writeback cache: with it the kernel keeps its own size and mtime
/// of cached files and never sees other hosts' changes.
pub fn mount_and_init(
    mountpoint: &Path,
    volume: &VolumeSpec,
) -> Result<(Channel, NegotiatedInit, u32), fuse_wire::Error> {
    let shared = volume.is_shared();
    let options = MountOptions {
        // World-readable in /proc/mounts: never a URL.
        source: volume.mount_source(),
        subtype: "baton".into(),
        allow_other: true,
        default_permissions: true,
    };
    let fd = fuse_wire::mount_fuse(mountpoint, &options)?;
    // From mountinfo: stat() on the mountpoint would block until INIT.
    let connection_id = match fuse_wire::connection_id(mountpoint) {
        Ok(id) => id,
        Err(err) => {
            let _ = fuse_wire::unmount(mountpoint);
            return Err(err);
        }
    };
    let channel = Channel::new(fd);
    let mut config = InitConfig::baton();
    if shared {
        config.flags &= !fuse_wire::abi::init_flags::WRITEBACK_CACHE;
    }
    match fuse_wire::initialize(&channel, &config) {
        Ok(params) => {
            fuse_wire::raise_read_ahead(mountpoint);
            Ok((channel, NegotiatedInit::from(&params), connection_id))
        }
        Err(err) => {
            let _ = fuse_wire::unmount(mountpoint);
            Err(err)
        }
    }
}

fn unmount_now(mountpoint: &Path) -> Result<String, String> {
    match umount2(mountpoint, MntFlags::empty()) {
        Ok(()) => Ok("unmounted".into()),
        Err(Errno::EBUSY) => umount2(mountpoint, MntFlags::MNT_DETACH)
            .map(|()| "detached (files were still open on it)".into())
            .map_err(|errno| format!("umount2(MNT_DETACH): {errno}")),
        Err(Errno::EINVAL | Errno::ENOENT) => Ok("was already unmounted".into()),
        Err(errno) => Err(format!("umount2: {errno}")),
    }
}

/// Unmounts `mountpoint` in a thread; if that takes longer than
/// [`UNMOUNT_WAIT_MS`] (the kernel waits for a server that is gone),
/// aborts connection `connection_id` so it returns. Calls `done` with the
/// outcome.
pub fn unmount_in_background(
    mountpoint: PathBuf,
    connection_id: u32,
    done: impl FnOnce(Result<String, String>) + Send + 'static,
) {
    std::thread::spawn(move || {
        let (tx, rx) = mpsc::channel();
        let path = mountpoint.clone();
        std::thread::spawn(move || {
            let _ = tx.send(unmount_now(&path));
        });
        let wait = Duration::from_millis(UNMOUNT_WAIT_MS);
        let outcome = match rx.recv_timeout(wait) {
            Ok(outcome) => outcome,
            Err(_) => {
                tracing::warn!(mountpoint = %mountpoint.display(), connection_id, "unmount hangs; aborting the FUSE connection");
                let abort = format!("/sys/fs/fuse/connections/{connection_id}/abort");
                let _ = std::fs::write(&abort, b"1");
                rx.recv_timeout(wait)
                    .unwrap_or_else(|_| Err("unmount still hangs after the abort".into()))
                    .map(|how| format!("{how} after aborting the connection"))
            }
        };
        done(outcome);
    });
}

/// Probes a mount from outside in a thread: a lookup of a name nobody
/// created (never in the dentry cache), which only the serving generation
/// can answer. ENOENT (or the name existing) is a success; any other error
/// is a failure. `done` gets the outcome. A generation that never answers
/// keeps the thread blocked until the upgrade deadline kills it and the
/// old generation answers the re-sent lookup.
pub fn probe_in_background(
    mountpoint: PathBuf,
    done: impl FnOnce(Result<(), String>) + Send + 'static,
) {
    std::thread::spawn(move || {
        let name = format!(
            ".baton-probe-{:016x}",
            upgrade_protocol::connection_identity()
        );
        let outcome = match std::fs::symlink_metadata(mountpoint.join(&name)) {
            Ok(_) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(format!(
                "lookup of {name} in {}: {err}",
                mountpoint.display()
            )),
        };
        done(outcome);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_ids_are_stable_and_distinct() {
        let a = mount_id(Path::new("/mnt/a"));
        assert_eq!(a, mount_id(Path::new("/mnt/a")));
        assert_ne!(a, mount_id(Path::new("/mnt/b")));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn mountpoints_must_be_absolute_and_usable() {
        assert!(check_mountpoint(Path::new("rel")).is_err());
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), "x").unwrap();
        let err = format!("{:?}", check_mountpoint(&full).unwrap_err());
        assert!(err.contains("not empty"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(
            check_mountpoint(&empty).unwrap(),
            empty.canonicalize().unwrap()
        );
    }

    #[test]
    fn missing_volume_says_how_to_format_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |text: &str| VolumeSpec::parse(text).unwrap();
        let err = format!("{:?}", check_volume(&spec("vol"), dir.path()).unwrap_err());
        assert!(err.contains("fsctl format vol --base-dir"), "{err}");
        std::fs::create_dir(dir.path().join("vol")).unwrap();
        std::fs::write(dir.path().join("vol/meta.db"), "").unwrap();
        assert_eq!(
            check_volume(&spec("vol"), dir.path()).unwrap(),
            dir.path().join("vol")
        );
        let url = format!("sqlite://{}/vol/meta.db", dir.path().display());
        assert!(check_volume(&spec(&url), Path::new("/nonexistent")).is_ok());
    }
}
