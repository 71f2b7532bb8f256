//! The CSI Controller service: dynamic provisioning of one directory per
//! PVC inside a Baton volume, expansion, capability validation.
//!
//! The controller works on the volume's shared mount on its own node (made
//! through that node's fs-supervisor, like a publication). Each volume's
//! requested capacity is recorded in `.baton-csi/NAME.json` at the Baton
//! volume's root, beside the PVC directories, and set as the directory
//! quota of its PVC directory by `fsctl quota set` (next to this
//! executable: the plugin links no storage; fsctl opens the volume's
//! metadata, and the mounted filesystem applies the new limit).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use crate::mounts;
use crate::node::{check_capability, FS_CALL_TIMEOUT};
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::{rpc::Type as Cap, Rpc, Type as CapType};
use crate::proto::*;
use crate::supervisor::{valid_name, Handle, Supervisor};
use crate::{blocking, missing};

/// The StorageClass parameter naming the Baton volume PVCs are made in.
pub const VOLUME_PARAMETER: &str = "volume";
/// Where capacity records live, at the Baton volume's root.
pub const RECORD_DIR: &str = ".baton-csi";

/// The controller plugin.
pub struct ControllerService {
    /// The daemon on the controller's node.
    pub supervisor: Supervisor,
}

/// What the controller remembers of a provisioned volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct VolumeRecord {
    capacity_bytes: i64,
}

/// Runs `work` on the root of the FUSE mount at `mountpoint`, held open
/// (`mounts::pin_fuse_root`), so nothing lands in the directory under it;
/// messages name the mountpoint, not `/proc/self/fd/N`.
fn in_volume<T>(
    mountpoint: &Path,
    work: impl FnOnce(&Path) -> Result<T, String>,
) -> Result<T, String> {
    let root = mounts::pin_fuse_root(mountpoint)?;
    let fd_path = root.path.display().to_string();
    work(&root.path).map_err(|message| message.replace(&fd_path, &mountpoint.display().to_string()))
}

fn record_path(shared: &Path, dir: &str) -> PathBuf {
    shared.join(RECORD_DIR).join(format!("{dir}.json"))
}

/// Which Baton volume a PVC directory is in, for `fsctl quota set`.
#[derive(Clone)]
struct QuotaTarget {
    /// fsctl, next to this executable.
    fsctl: PathBuf,
    /// The Baton volume's name.
    volume: String,
    /// Where named volumes live.
    base_dir: PathBuf,
}

impl QuotaTarget {
    fn new(volume: &str, base_dir: &Path) -> QuotaTarget {
        let fsctl = std::env::current_exe()
            .map(|exe| exe.with_file_name("fsctl"))
            .unwrap_or_else(|_| PathBuf::from("fsctl"));
        QuotaTarget {
            fsctl,
            volume: volume.to_string(),
            base_dir: base_dir.to_path_buf(),
        }
    }

    /// Sets the byte quota of `/dir` in the volume to `capacity_bytes` (0:
    /// no capacity asked, no limit).
    fn apply(&self, dir: &str, capacity_bytes: i64) -> Result<(), String> {
        if capacity_bytes <= 0 {
            return Ok(());
        }
        let out = std::process::Command::new(&self.fsctl)
            .args(["quota", "set", &format!("/{dir}")])
            .args(["--bytes", &capacity_bytes.to_string()])
            .args(["--volume", &self.volume, "--base-dir"])
            .arg(&self.base_dir)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|err| format!("cannot run {}: {err}", self.fsctl.display()))?;
        if !out.status.success() {
            return Err(format!(
                "setting the quota of {dir} in Baton volume {} to {capacity_bytes} bytes failed: {}",
                self.volume,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }
}

/// Makes `capacity_bytes` the directory quota of `dir` in the Baton volume
/// mounted at `shared`: recorded first (what a repeated CreateVolume
/// compares), then set as the directory's byte quota. A failure between
/// the two is retried by the caller's next call (create finds the record,
/// expand sets both again).
fn set_directory_quota(
    shared: &Path,
    quota: &QuotaTarget,
    dir: &str,
    capacity_bytes: i64,
) -> Result<(), String> {
    let path = record_path(shared, dir);
    let record = VolumeRecord { capacity_bytes };
    let bytes = serde_json::to_vec(&record).map_err(|err| err.to_string())?;
    let tmp = path.with_extension("json.tmp");
    std::fs::create_dir_all(shared.join(RECORD_DIR))
        .and_then(|()| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|err| {
            format!(
                "cannot record the capacity of {dir} in {}: {err}",
                path.display()
            )
        })?;
    quota.apply(dir, capacity_bytes)
}

/// Creates `name` in the volume at `shared` with `capacity_bytes`, or finds
/// it made by an earlier call: `Err(recorded)` if it was made with another
/// capacity.
fn create_once(
    shared: &Path,
    quota: &QuotaTarget,
    name: &str,
    capacity_bytes: i64,
) -> Result<Result<(), i64>, String> {
    let dir = shared.join(name);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            // A repeated call, or one that died before recording.
            match read_record(shared, name)? {
                // Set again: the earlier call may have died after the record.
                Some(record) if record.capacity_bytes == capacity_bytes => {
                    return quota.apply(name, capacity_bytes).map(Ok)
                }
                Some(record) => return Ok(Err(record.capacity_bytes)),
                None => {}
            }
        }
        Err(err) => return Err(format!("cannot create {}: {err}", dir.display())),
    }
    set_directory_quota(shared, quota, name, capacity_bytes).map(Ok)
}

fn read_record(shared: &Path, dir: &str) -> Result<Option<VolumeRecord>, String> {
    let path = record_path(shared, dir);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|err| format!("capacity record {} is damaged: {err}", path.display())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("cannot read {}: {err}", path.display())),
    }
}

fn wanted_bytes(range: Option<&CapacityRange>) -> Result<i64, Status> {
    let Some(range) = range else { return Ok(0) };
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(Status::invalid_argument(
            "capacity_range has a negative size",
        ));
    }
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(Status::out_of_range(format!(
            "capacity_range requires {} bytes but limits to {}",
            range.required_bytes, range.limit_bytes
        )));
    }
    Ok(if range.required_bytes > 0 {
        range.required_bytes
    } else {
        range.limit_bytes
    })
}

/// Parameters that look like credentials are refused: they belong in the
/// StorageClass's secret references, which never reach a log or a file.
fn refuse_plain_secrets(
    parameters: &std::collections::HashMap<String, String>,
) -> Result<(), Status> {
    const SECRET_WORDS: [&str; 5] = ["password", "passphrase", "secret", "key", "token"];
    for name in parameters.keys() {
        let lower = name.to_ascii_lowercase();
        if !lower.starts_with("csi.storage.k8s.io/")
            && SECRET_WORDS.iter().any(|w| lower.contains(w))
        {
            return Err(Status::invalid_argument(format!(
                "StorageClass parameter {name:?} looks like a credential: put it in a Secret and reference it with csi.storage.k8s.io/provisioner-secret-name and -namespace"
            )));
        }
    }
    Ok(())
}

impl ControllerService {
    async fn existing(&self, volume_id: &str) -> Result<(Handle, PathBuf, String), Status> {
        if volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        let handle = Handle::parse(volume_id).map_err(Status::not_found)?;
        let shared = self.supervisor.ensure_mounted(&handle.volume).await?;
        let Some(dir) = handle.dir.clone() else {
            return Ok((handle, shared, String::new()));
        };
        let path = dir.clone();
        let mountpoint = shared.clone();
        let exists = blocking("lookup", FS_CALL_TIMEOUT, move || {
            in_volume(&mountpoint, |root| Ok(root.join(&path).is_dir()))
        })
        .await?
        .map_err(Status::unavailable)?;
        if !exists {
            return Err(Status::not_found(format!(
                "volume {volume_id}: no directory {dir} in Baton volume {}",
                handle.volume
            )));
        }
        Ok((handle, shared, dir))
    }

    async fn create(&self, req: CreateVolumeRequest) -> Result<Volume, Status> {
        if req.name.is_empty() {
            return Err(missing("name"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(missing("volume_capabilities"));
        }
        for cap in &req.volume_capabilities {
            check_capability(Some(cap))?;
        }
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "baton-csi cannot create a volume from a snapshot or another volume",
            ));
        }
        refuse_plain_secrets(&req.parameters)?;
        let volume = req.parameters.get(VOLUME_PARAMETER).ok_or_else(|| {
            Status::invalid_argument(format!("StorageClass parameter {VOLUME_PARAMETER:?} (the Baton volume to make PVC directories in) is missing"))
        })?;
        if !valid_name(&req.name) {
            return Err(Status::invalid_argument(format!(
                "volume name {:?} is not a single directory name",
                req.name
            )));
        }
        let capacity = wanted_bytes(req.capacity_range.as_ref())?;
        let handle = Handle {
            volume: volume.clone(),
            dir: Some(req.name.clone()),
        };
        Handle::parse(&handle.id()).map_err(Status::invalid_argument)?;
        let shared = self.supervisor.ensure_mounted(volume).await?;
        let name = req.name.clone();
        let quota = QuotaTarget::new(volume, &self.supervisor.base_dir);
        let outcome = blocking("create", FS_CALL_TIMEOUT, move || {
            in_volume(&shared, |shared| {
                create_once(shared, &quota, &name, capacity)
            })
        })
        .await?
        .map_err(Status::internal)?;
        if let Err(recorded) = outcome {
            return Err(Status::already_exists(format!(
                "volume {} exists with a capacity of {recorded} bytes, not {capacity}",
                req.name
            )));
        }
        tracing::info!(
            volume_id = handle.id(),
            capacity_bytes = capacity,
            "volume created"
        );
        Ok(Volume {
            capacity_bytes: capacity,
            volume_id: handle.id(),
            ..Default::default()
        })
    }

    async fn delete(&self, volume_id: &str) -> Result<(), Status> {
        if volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        let Ok(handle) = Handle::parse(volume_id) else {
            // Not a handle this driver made: nothing of it exists to delete.
            return Ok(());
        };
        let Some(dir) = handle.dir.clone() else {
            return Err(Status::failed_precondition(format!(
                "volume {volume_id} is a whole Baton volume (static provisioning): baton-csi never deletes one; set persistentVolumeReclaimPolicy: Retain"
            )));
        };
        let shared = self.supervisor.ensure_mounted(&handle.volume).await?;
        blocking("delete", FS_CALL_TIMEOUT * 6, move || {
            in_volume(&shared, |shared| {
                let path = shared.join(&dir);
                match std::fs::remove_dir_all(&path) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                        return Err(format!("cannot delete {}: {err}", path.display()))
                    }
                    _ => {}
                }
                match std::fs::remove_file(record_path(shared, &dir)) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                        Err(format!("cannot delete the capacity record of {dir}: {err}"))
                    }
                    _ => Ok(()),
                }
            })
        })
        .await?
        .map_err(Status::internal)?;
        tracing::info!(volume_id, "volume deleted");
        Ok(())
    }

    async fn expand(&self, req: ControllerExpandVolumeRequest) -> Result<i64, Status> {
        if req.capacity_range.is_none() {
            return Err(missing("capacity_range"));
        }
        let capacity = wanted_bytes(req.capacity_range.as_ref())?;
        let (handle, shared, dir) = self.existing(&req.volume_id).await?;
        if dir.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is a whole Baton volume (static provisioning): it has no capacity to expand",
                req.volume_id
            )));
        }
        let quota = QuotaTarget::new(&handle.volume, &self.supervisor.base_dir);
        blocking("expand", FS_CALL_TIMEOUT, move || {
            in_volume(&shared, |shared| {
                set_directory_quota(shared, &quota, &dir, capacity)
            })
        })
        .await?
        .map_err(Status::internal)?;
        tracing::info!(
            volume_id = req.volume_id,
            capacity_bytes = capacity,
            "volume expanded"
        );
        Ok(capacity)
    }
}

fn unsupported(what: &str) -> Status {
    Status::unimplemented(format!("baton-csi does not implement {what}"))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = self.create(req.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete(&req.into_inner().volume_id).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(unsupported(
            "ControllerPublishVolume (no PUBLISH_UNPUBLISH_VOLUME capability)",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(unsupported(
            "ControllerUnpublishVolume (no PUBLISH_UNPUBLISH_VOLUME capability)",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        if req.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(missing("volume_capabilities"));
        }
        self.existing(&req.volume_id).await?;
        let unsupported = req
            .volume_capabilities
            .iter()
            .find_map(|cap| check_capability(Some(cap)).err());
        let response = match unsupported {
            Some(status) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: status.message().to_string(),
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                }),
                message: String::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Err(unsupported("ListVolumes (no LIST_VOLUMES capability)"))
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Err(unsupported("GetCapacity: a Baton volume's size is bounded by its object store, not by the driver (no GET_CAPACITY capability)"))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let cap = |t: Cap| ControllerServiceCapability {
            r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![cap(Cap::CreateDeleteVolume), cap(Cap::ExpandVolume)],
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(unsupported("snapshots"))
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(unsupported("snapshots"))
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(unsupported("snapshots"))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let capacity_bytes = self.expand(req.into_inner()).await?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes,
            node_expansion_required: false,
        }))
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(unsupported(
            "ControllerGetVolume (no GET_VOLUME capability)",
        ))
    }
}
