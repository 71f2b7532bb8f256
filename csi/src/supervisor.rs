//! fs-supervisor as the plugin sees it: a control-socket client that finds
//! or makes the one shared mount of a Baton volume on this node.
//!
//! The plugin never holds `/dev/fuse` and never serves a mount: it asks the
//! daemon (`Request::Mount`, `Status`, `Umount`) and bind-mounts from the
//! daemon's mount, so restarting the plugin changes nothing for pods.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use tonic::Status;
use upgrade_protocol::client::{command_timeout, request};
use upgrade_protocol::{ClientOptions, MountStatus, Reply, Request, StatusReport, VolumeSpec};

use crate::{blocking, mounts};

/// How long a probe or a stats call waits for `Status`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// The control socket and where this node's shared mounts live.
#[derive(Clone, Debug)]
pub struct Supervisor {
    /// fs-supervisor's control socket.
    pub socket: PathBuf,
    /// Where named Baton volumes live (`fsctl format --base-dir`).
    pub base_dir: PathBuf,
    /// One directory per volume, the shared mount's mountpoint.
    pub mounts_dir: PathBuf,
    /// Serializes finding-or-making shared mounts in this process, so two
    /// calls never both ask for a volume's mount.
    mount_lock: Arc<Mutex<()>>,
}

/// What a volume handle names: a Baton volume and, optionally, one
/// directory in it (`VOLUME` or `VOLUME#DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    /// A named Baton volume (under `--base-dir`).
    pub volume: String,
    /// A directory at the volume's root.
    pub dir: Option<String>,
}

impl Handle {
    /// Parses a volume handle; the message says what is wrong with it.
    pub fn parse(text: &str) -> Result<Handle, String> {
        let (volume, dir) = match text.split_once('#') {
            Some((volume, dir)) => (volume, Some(dir)),
            None => (text, None),
        };
        match VolumeSpec::parse(volume) {
            Ok(VolumeSpec::Named(name)) if valid_name(&name) => {}
            _ => {
                return Err(format!(
                    "volume handle {text:?} does not name a Baton volume: expected VOLUME or VOLUME#DIR, VOLUME a volume name made by `fsctl format`"
                ))
            }
        }
        if let Some(dir) = dir {
            if !valid_name(dir) {
                return Err(format!(
                    "volume handle {text:?}: directory {dir:?} must be one name of letters, digits, '.', '_' or '-', not starting with '.'"
                ));
            }
        }
        Ok(Handle {
            volume: volume.to_string(),
            dir: dir.map(str::to_string),
        })
    }

    /// The handle as text.
    pub fn id(&self) -> String {
        match &self.dir {
            Some(dir) => format!("{}#{dir}", self.volume),
            None => self.volume.clone(),
        }
    }
}

/// A volume or directory name the plugin accepts: one path component.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Supervisor {
    /// The daemon at `socket`, volumes under `base_dir`, shared mounts made
    /// under `mounts_dir`.
    pub fn new(socket: PathBuf, base_dir: PathBuf, mounts_dir: PathBuf) -> Supervisor {
        Supervisor {
            socket,
            base_dir,
            mounts_dir,
            mount_lock: Arc::new(Mutex::new(())),
        }
    }

    /// Sends one request from a blocking thread (the client is synchronous).
    pub async fn call(&self, req: Request, timeout: Duration) -> Result<Reply, Status> {
        let socket = self.socket.clone();
        let name = req.name();
        let joined = tokio::task::spawn_blocking(move || request(&socket, &req, timeout)).await;
        match joined {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(Status::unavailable(format!(
                "fs-supervisor did not answer {name}: {err}"
            ))),
            Err(err) => Err(Status::internal(format!(
                "the fs-supervisor {name} call failed: {err}"
            ))),
        }
    }

    /// Every mount of the supervisor.
    pub async fn status(&self) -> Result<StatusReport, Status> {
        match self.call(Request::Status, STATUS_TIMEOUT).await? {
            Reply::Status { report } => Ok(report),
            other => Err(unexpected("status", &other)),
        }
    }

    /// Where `volume`'s shared mount is (or would be) on this node.
    pub fn shared_mountpoint(&self, volume: &str) -> PathBuf {
        self.mounts_dir.join(volume)
    }

    /// The supervisor's entry for `volume`'s shared mount, if it has one:
    /// the mount the plugin made, or any other mount of the volume on this
    /// node (an administrator's `fsctl mount`), since a volume is mounted
    /// at most once per node.
    pub async fn shared_mount(&self, volume: &str) -> Result<Option<MountStatus>, Status> {
        let mountpoint = self.shared_mountpoint(volume);
        let report = self.status().await?;
        let mut mounts = report.mounts.into_iter();
        Ok(mounts.find(|m| m.mountpoint == mountpoint || m.volume == volume))
    }

    /// Returns `volume`'s shared mount, asking the supervisor to make it
    /// first if it has none. Fails with `Unavailable` (kubelet retries)
    /// carrying the supervisor's reason when it cannot mount the volume.
    pub async fn ensure_mounted(&self, volume: &str) -> Result<PathBuf, Status> {
        let _guard = self.mount_lock.lock().await;
        let mountpoint = self.shared_mountpoint(volume);
        if let Some(mount) = self.shared_mount(volume).await? {
            if mount.gave_up {
                return Err(Status::unavailable(format!(
                    "Baton volume {volume}: fs-supervisor gave up restarting its mount at {} (see `fsctl status`); unmount it with `fsctl umount {}` to let the driver mount it again",
                    mount.mountpoint.display(),
                    mount.mountpoint.display()
                )));
            }
            return self.checked(volume, mount.mountpoint);
        }
        // On a thread with a deadline: a dead mount left at the path by a
        // crashed supervisor must not block the plugin.
        let dir = mountpoint.clone();
        blocking("creating a mountpoint", STATUS_TIMEOUT, move || {
            std::fs::create_dir_all(&dir)
        })
        .await?
        .map_err(|err| {
            Status::unavailable(format!(
                "cannot create the mountpoint {} for Baton volume {volume}: {err}; if a dead mount is left there, `umount -l` it",
                mountpoint.display()
            ))
        })?;
        let req = Request::Mount {
            volume: volume.to_string(),
            mountpoint: mountpoint.clone(),
            base_dir: self.base_dir.clone(),
            options: ClientOptions::default(),
            persist: false,
        };
        let timeout = command_timeout(&req);
        match self.call(req, timeout).await? {
            Reply::Mounted { generation, .. } => {
                tracing::info!(volume, mountpoint = %mountpoint.display(), generation, "shared mount made");
                self.checked(volume, mountpoint)
            }
            Reply::Error { message, .. } => Err(Status::unavailable(format!(
                "fs-supervisor could not mount Baton volume {volume} at {}: {message}",
                mountpoint.display()
            ))),
            other => Err(unexpected("mount", &other)),
        }
    }

    /// Confirms the shared mountpoint really is a FUSE mount in this
    /// process's namespace, so nothing is ever written to the directory
    /// under it.
    fn checked(&self, volume: &str, mountpoint: PathBuf) -> Result<PathBuf, Status> {
        let table = mounts::mount_table()
            .map_err(|err| Status::internal(format!("cannot read /proc/self/mountinfo: {err}")))?;
        match mounts::mounted_at(&table, &mountpoint) {
            Some(entry) if entry.fstype.starts_with("fuse") => Ok(mountpoint),
            _ => Err(Status::unavailable(format!(
                "Baton volume {volume} is mounted by fs-supervisor at {} but that mount is not visible to baton-csi: give both containers the directory with mount propagation (Bidirectional / HostToContainer)",
                mountpoint.display()
            ))),
        }
    }

    /// Asks the supervisor to unmount a shared mount.
    pub async fn unmount(&self, mountpoint: &Path) -> Result<(), Status> {
        let req = Request::Umount {
            mountpoint: mountpoint.to_path_buf(),
        };
        let timeout = command_timeout(&req);
        match self.call(req, timeout).await? {
            Reply::Unmounted { .. } => Ok(()),
            Reply::Error { message, .. } => Err(Status::unavailable(format!(
                "fs-supervisor could not unmount {}: {message}",
                mountpoint.display()
            ))),
            other => Err(unexpected("umount", &other)),
        }
    }
}

fn unexpected(command: &str, reply: &Reply) -> Status {
    Status::internal(format!(
        "fs-supervisor answered {command} with an unexpected reply ({reply:?}); is it the same Baton version as baton-csi?"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_a_volume_and_maybe_a_directory() {
        let plain = Handle::parse("data").unwrap();
        assert_eq!(plain.dir, None);
        let pvc = Handle::parse("data#pvc-1").unwrap();
        assert_eq!(
            (pvc.volume.as_str(), pvc.dir.as_deref()),
            ("data", Some("pvc-1"))
        );
        assert_eq!(pvc.id(), "data#pvc-1");
        for bad in [
            "",
            "#x",
            "data#",
            "data#../x",
            "data#.hidden",
            "a/b",
            "sqlite:///x/meta.db",
        ] {
            assert!(Handle::parse(bad).is_err(), "{bad}");
        }
    }
}
