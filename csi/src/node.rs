//! The CSI Node service: bind mounts from the volume's shared mount into
//! kubelet's target paths, volume stats, and the reaper that unmounts a
//! shared mount once no publication has used it for a grace period.
//!
//! Every publication is a bind mount, so the mount table is the state: a
//! restarted plugin finds what it published in `/proc/self/mountinfo`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::mounts;
use crate::proto::node_server::Node;
use crate::proto::node_service_capability::{rpc::Type as NodeCap, Rpc, Type as CapType};
use crate::proto::volume_capability::AccessType;
use crate::proto::volume_usage::Unit;
use crate::proto::*;
use crate::supervisor::{Handle, Supervisor};
use crate::{blocking, missing};

/// How long an unpublish, a directory creation or a statvfs may take before
/// the call gives up (each runs on a thread of its own).
pub const FS_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The node plugin.
pub struct NodeService {
    /// The daemon.
    pub supervisor: Supervisor,
    /// This node's id (NodeGetInfo).
    pub node_id: String,
    /// Serializes publishing with the reaper, so a shared mount is never
    /// unmounted between being found and being bound.
    pub lock: Arc<Mutex<()>>,
}

fn mount_flags(flags: &[String], read_only: bool) -> Result<MsFlags, Status> {
    let mut out = if read_only {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    for flag in flags {
        out |= match flag.as_str() {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            other => {
                return Err(Status::invalid_argument(format!(
                    "mount flag {other:?} is not supported by Baton volumes: use ro, nosuid, nodev or noexec"
                )))
            }
        };
    }
    Ok(out)
}

/// The volume capability a publication or a volume needs: a filesystem
/// (not a block device), in any access mode.
pub fn check_capability(cap: Option<&VolumeCapability>) -> Result<&[String], Status> {
    let cap = cap.ok_or_else(|| missing("volume_capability"))?;
    match &cap.access_type {
        Some(AccessType::Mount(mount)) => Ok(&mount.mount_flags),
        Some(AccessType::Block(_)) => Err(Status::invalid_argument(
            "Baton volumes are filesystems: block access is not supported (use volumeMode: Filesystem)",
        )),
        None => Err(Status::invalid_argument(
            "volume_capability has no access_type: give mount {}",
        )),
    }
}

/// True for the reader-only access modes (ReadOnlyMany and the like): such
/// a publication is read-only whatever `readonly` says.
fn reader_only(cap: Option<&VolumeCapability>) -> bool {
    use crate::proto::volume_capability::access_mode::Mode;
    let mode = cap.and_then(|c| c.access_mode.as_ref()).map(|m| m.mode);
    matches!(
        mode.and_then(|m| Mode::try_from(m).ok()),
        Some(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    )
}

fn table() -> Result<Vec<mounts::MountEntry>, Status> {
    mounts::mount_table()
        .map_err(|err| Status::internal(format!("cannot read /proc/self/mountinfo: {err}")))
}

impl NodeService {
    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.target_path.is_empty() {
            return Err(missing("target_path"));
        }
        let target = PathBuf::from(&req.target_path);
        if !target.is_absolute() {
            return Err(Status::invalid_argument(format!(
                "target_path {} is not absolute",
                target.display()
            )));
        }
        let read_only = req.readonly || reader_only(req.volume_capability.as_ref());
        let flags = mount_flags(check_capability(req.volume_capability.as_ref())?, read_only)?;
        let handle = Handle::parse(&req.volume_id).map_err(Status::invalid_argument)?;
        let _guard = self.lock.lock().await;
        let shared = self.supervisor.ensure_mounted(&handle.volume).await?;
        if already_published(
            &table()?,
            &target,
            &shared,
            handle.dir.as_deref(),
            flags.contains(MsFlags::MS_RDONLY),
        )? {
            return Ok(());
        }
        let tgt = target.clone();
        blocking("publish", FS_CALL_TIMEOUT, move || {
            bind_into(&shared, handle.dir.as_deref(), &tgt, flags)
        })
        .await?
        .map_err(Status::internal)?;
        tracing::info!(volume_id = req.volume_id, target = %target.display(), read_only, "published");
        Ok(())
    }

    async fn stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.volume_path.is_empty() {
            return Err(missing("volume_path"));
        }
        let handle = Handle::parse(&req.volume_id).map_err(Status::not_found)?;
        let path = PathBuf::from(&req.volume_path);
        if mounts::mounted_at(&table()?, &path).is_none() {
            return Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id,
                path.display()
            )));
        }
        if let Some(message) = self.recovering(&handle.volume).await {
            return Ok(abnormal(message));
        }
        let stat = blocking("statvfs", FS_CALL_TIMEOUT, move || {
            nix::sys::statvfs::statvfs(&path)
        })
        .await;
        match stat {
            Ok(Ok(stat)) => Ok(usage(&stat)),
            Ok(Err(errno)) => Ok(abnormal(format!(
                "statvfs of {} failed: {errno}",
                req.volume_path
            ))),
            Err(status) => Ok(abnormal(status.message().to_string())),
        }
    }

    /// Why `volume`'s shared mount cannot answer now (the supervisor's view),
    /// or None if it serves.
    async fn recovering(&self, volume: &str) -> Option<String> {
        let mount = match self.supervisor.shared_mount(volume).await {
            Ok(Some(mount)) => mount,
            Ok(None) => {
                return Some(format!(
                    "Baton volume {volume} has no mount on this node: its pods must be restarted"
                ))
            }
            Err(status) => return Some(status.message().to_string()),
        };
        if !mount.gave_up && mount.state == "serving" {
            return None;
        }
        let why = if mount.gave_up {
            ": fs-supervisor gave up restarting it"
        } else {
            ", recovering"
        };
        Some(format!(
            "Baton volume {volume} is {}{why} (generation {}); see `fsctl status`",
            mount.state, mount.generation
        ))
    }
}

fn abnormal(message: String) -> NodeGetVolumeStatsResponse {
    NodeGetVolumeStatsResponse {
        usage: Vec::new(),
        volume_condition: Some(VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}

/// Bytes and inodes, total, available and used, from a statvfs of the
/// PVC's directory (its directory quota once quotas land).
fn usage(stat: &nix::sys::statvfs::Statvfs) -> NodeGetVolumeStatsResponse {
    let block = stat.fragment_size() as i64;
    let usage = |unit: Unit, total: i64, free: i64| VolumeUsage {
        available: free,
        total,
        used: total.saturating_sub(free),
        unit: unit as i32,
    };
    NodeGetVolumeStatsResponse {
        usage: vec![
            usage(
                Unit::Bytes,
                stat.blocks() as i64 * block,
                stat.blocks_available() as i64 * block,
            ),
            usage(
                Unit::Inodes,
                stat.files() as i64,
                stat.files_available() as i64,
            ),
        ],
        volume_condition: Some(VolumeCondition {
            abnormal: false,
            message: String::new(),
        }),
    }
}

/// True if `target` already shows `dir` of the shared mount the same way
/// (a repeated publish); AlreadyExists if it shows anything else.
fn already_published(
    table: &[mounts::MountEntry],
    target: &Path,
    shared: &Path,
    dir: Option<&str>,
    read_only: bool,
) -> Result<bool, Status> {
    let Some(existing) = mounts::mounted_at(table, target) else {
        return Ok(false);
    };
    let root = format!("/{}", dir.unwrap_or(""));
    let same_fs = mounts::mounted_at(table, shared).map(|e| &e.device) == Some(&existing.device);
    if same_fs && existing.root == root && existing.read_only() == read_only {
        return Ok(true);
    }
    Err(Status::already_exists(format!(
        "target_path {} already has a different mount ({} {}{}); unpublish it first",
        target.display(),
        existing.fstype,
        existing.root,
        if existing.read_only() {
            ", read-only"
        } else {
            ""
        }
    )))
}

/// Creates `dir` in the shared mount if needed and bind-mounts it (or the
/// whole volume) at `target`, through the mount's root held open.
fn bind_into(
    shared: &Path,
    dir: Option<&str>,
    target: &Path,
    flags: MsFlags,
) -> Result<(), String> {
    let root = mounts::pin_fuse_root(shared)?;
    let source = match dir {
        Some(dir) => root.path.join(dir),
        None => root.path.clone(),
    };
    if let Some(dir) = dir {
        match std::fs::create_dir(&source) {
            Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(format!(
                    "cannot create {dir} in {}: {err}",
                    shared.display()
                ))
            }
            _ => {}
        }
    }
    std::fs::create_dir_all(target)
        .map_err(|err| format!("cannot create target_path {}: {err}", target.display()))?;
    mounts::bind(&source, target, flags).map_err(|errno| {
        format!(
            "cannot bind-mount {}/{} at {}: {errno}",
            shared.display(),
            dir.unwrap_or(""),
            target.display()
        )
    })
}

/// Detaches everything at `target` and removes the directory, without
/// ever looking through it. Bounded by [`FS_CALL_TIMEOUT`].
pub async fn unpublish(target: PathBuf) -> Result<u32, Status> {
    blocking("unpublish", FS_CALL_TIMEOUT, move || {
        let detached = mounts::detach_all(&target)
            .map_err(|err| format!("cannot unmount {}: {err}", target.display()))?;
        match std::fs::remove_dir(&target) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "{} is unmounted but cannot be removed: {err}",
                    target.display()
                ))
            }
            _ => {}
        }
        Ok(detached)
    })
    .await?
    .map_err(Status::internal)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "baton-csi has no STAGE_UNSTAGE_VOLUME capability",
        ))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "baton-csi has no STAGE_UNSTAGE_VOLUME capability",
        ))
    }

    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.publish(req.into_inner()).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.target_path.is_empty() {
            return Err(missing("target_path"));
        }
        let detached = unpublish(PathBuf::from(&req.target_path)).await?;
        tracing::info!(
            volume_id = req.volume_id,
            target = req.target_path,
            detached,
            "unpublished"
        );
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Ok(Response::new(self.stats(req.into_inner()).await?))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "baton-csi has no EXPAND_VOLUME node capability: the controller expands a volume",
        ))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: NodeCap| NodeServiceCapability {
            r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![cap(NodeCap::GetVolumeStats), cap(NodeCap::VolumeCondition)],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

/// Unmounts, through the supervisor, each shared mount under the mounts
/// directory that has had no publication for `grace`. Runs until the
/// process ends.
pub async fn reap_idle(supervisor: Supervisor, lock: Arc<Mutex<()>>, grace: Duration) {
    let tick = (grace / 2).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let mut idle_since: HashMap<PathBuf, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(tick).await;
        let _guard = lock.lock().await;
        if let Err(status) = reap_once(&supervisor, &mut idle_since, grace).await {
            tracing::warn!(error = status.message(), "idle shared mounts not checked");
        }
    }
}

async fn reap_once(
    supervisor: &Supervisor,
    idle_since: &mut HashMap<PathBuf, Instant>,
    grace: Duration,
) -> Result<(), Status> {
    let report = supervisor.status().await?;
    let table = table()?;
    let ours: Vec<PathBuf> = report
        .mounts
        .into_iter()
        .map(|m| m.mountpoint)
        .filter(|mp| mp.parent() == Some(supervisor.mounts_dir.as_path()))
        .collect();
    idle_since.retain(|mp, _| ours.contains(mp));
    for mountpoint in ours {
        if mounts::binds_of(&table, &mountpoint) > 0 {
            idle_since.remove(&mountpoint);
            continue;
        }
        let since = *idle_since
            .entry(mountpoint.clone())
            .or_insert_with(Instant::now);
        if since.elapsed() >= grace {
            idle_since.remove(&mountpoint);
            match supervisor.unmount(&mountpoint).await {
                Ok(()) => {
                    tracing::info!(mountpoint = %mountpoint.display(), "idle shared mount unmounted")
                }
                Err(status) => {
                    tracing::warn!(mountpoint = %mountpoint.display(), error = status.message(), "idle shared mount not unmounted")
                }
            }
        }
    }
    Ok(())
}
