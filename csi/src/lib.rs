//! baton-csi: Baton's Container Storage Interface (v1) plugin.
//!
//! Purpose: let Kubernetes pods use Baton volumes. The plugin is a client of
//! fs-supervisor's control socket and nothing more: it never opens
//! `/dev/fuse`, never links the filesystem, and keeps no state of its own
//! beside the mount table, so a restart, crash or upgrade of the plugin
//! changes nothing for running pods.
//!
//! Main types: [`identity::IdentityService`] (plugin info, and a probe
//! healthy only while fs-supervisor answers), [`node::NodeService`] (bind
//! mounts from the volume's one shared mount per node into kubelet's
//! target paths), [`controller::ControllerService`] (a directory per PVC in
//! a Baton volume), [`identity::RegistrationService`] (kubelet's plugin
//! watcher), [`supervisor::Supervisor`] (the control-socket client).
//!
//! Volume handles are `VOLUME` (static: a whole named Baton volume) or
//! `VOLUME#DIR` (one directory at its root; what CreateVolume makes).
//!
//! **Invariants:** nothing on a path that may be a FUSE mount is stat'ed or
//! resolved on the unpublish path (`/proc/self/mountinfo` says what is
//! mounted; unmounts detach); every filesystem call runs on a thread of
//! its own under a deadline; no secret is logged or written.
//!
//! ```no_run
//! # async fn f() -> Result<(), tonic::Status> {
//! let supervisor = baton_csi::supervisor::Supervisor::new(
//!     "/run/baton/supervisor.sock".into(),
//!     "/var/lib/baton/volumes".into(),
//!     "/var/lib/baton/mounts/csi".into(),
//! );
//! let shared = supervisor.ensure_mounted("data").await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use tonic::Status;

pub mod authority;
pub mod controller;
pub mod identity;
pub mod mounts;
pub mod node;
pub mod supervisor;

/// The CSI messages and services (spec v1.3.0, `proto/`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// kubelet's plugin registration API (`pluginregistration`, v1).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The driver's name (the CSIDriver object, StorageClass provisioner).
pub const DRIVER_NAME: &str = "csi.baton.dev";

/// `InvalidArgument` for a required field left empty.
pub fn missing(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is missing: the CSI spec requires it"))
}

/// Runs `work` on a blocking thread and gives up waiting after `timeout`
/// (the thread may stay blocked on a stalled mount; the caller does not).
pub async fn blocking<T, F>(what: &str, timeout: Duration, work: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::time::timeout(timeout, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(Status::internal(format!("{what} failed: {err}"))),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "{what} did not finish within {} s: the Baton mount may be stalled; see `fsctl status`",
            timeout.as_secs()
        ))),
    }
}
