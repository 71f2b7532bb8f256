//! `fs-supervisor --kubernetes` (cargo feature `kubernetes`): the node it
//! runs on (downward API `NODE_NAME`), Kubernetes Events on the pods that
//! use a mount when its filesystem crashes, is OOM-killed, recovers or is
//! upgraded, and a small per-node status ConfigMap. Pods are watched only
//! on this node (field selector `spec.nodeName=NODE`), so thousands of
//! nodes never list every pod of the cluster.
//!
//! This module builds the API objects (pure, tested); `client` talks to
//! the API server from one thread with its own tokio runtime, fed by the
//! event loop through a channel, so the loop never waits on the network.

pub mod client;

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use upgrade_protocol::MountStatus;

use crate::mount_events::MountEvent;

/// The component named in Events.
pub const COMPONENT: &str = "baton.io/fs-supervisor";
/// Statuses are written to the ConfigMap at most this often.
pub const STATUS_INTERVAL_MS: u64 = 10_000;

/// Where the supervisor runs, from the downward API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// `spec.nodeName` (`NODE_NAME`).
    pub name: String,
    /// The supervisor's namespace (`POD_NAMESPACE`), for the status ConfigMap.
    pub namespace: String,
}

impl Node {
    /// From `NODE_NAME` and `POD_NAMESPACE` (default `baton-system`).
    pub fn from_env() -> Result<Node, String> {
        let name = std::env::var("NODE_NAME").map_err(|_| {
            "--kubernetes needs NODE_NAME (downward API: env valueFrom fieldRef spec.nodeName, as in deploy/kubernetes/daemonset.yaml)".to_string()
        })?;
        let namespace =
            std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "baton-system".to_string());
        Ok(Node { name, namespace })
    }
}

/// The pod watch's field selector: this node's pods only. Pure.
pub fn pod_field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// Whether `pod` uses the mount at `mountpoint`: one of its hostPath
/// volumes is the mountpoint, inside it, or a directory above it. Pure.
pub fn pod_uses_mount(pod: &Pod, mountpoint: &Path) -> bool {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| v.host_path.as_ref())
        .map(|h| Path::new(h.path.trim_end_matches('/')))
        .any(|path| path.starts_with(mountpoint) || mountpoint.starts_with(path))
}

/// The Event on `pod` for `event`. Pure.
pub fn event_object(pod: &Pod, event: &MountEvent, node: &str, now: Timestamp) -> Event {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{pod_name}.baton-")),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod_name),
            namespace: Some(namespace),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(event.kind.reason().into()),
        message: Some(format!(
            "{} (volume {}, mount {}, generation {})",
            event.message,
            event.volume,
            event.mountpoint.display(),
            event.generation
        )),
        type_: Some(
            if event.kind.is_warning() {
                "Warning"
            } else {
                "Normal"
            }
            .into(),
        ),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Event::default()
    }
}

/// The name of a node's status ConfigMap. Pure.
pub fn status_configmap_name(node: &str) -> String {
    format!("baton-status-{node}")
}

/// The node's status ConfigMap: one compact JSON line per mount. Pure.
pub fn status_configmap(node: &Node, mounts: &[MountStatus], now: Timestamp) -> ConfigMap {
    let mut data = BTreeMap::new();
    for m in mounts {
        let line = serde_json::json!({
            "mountpoint": m.mountpoint,
            "volume": m.volume,
            "state": m.state,
            "generation": m.generation,
            "pid": m.pid,
            "restarts": m.restarts,
            "uptime_s": m.uptime_s,
            "last_recovery": m.last_recovery,
        });
        data.insert(m.mount_id.clone(), line.to_string());
    }
    data.insert("updated".into(), now.to_string());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(status_configmap_name(&node.name)),
            namespace: Some(node.namespace.clone()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/part-of".into(), "baton".into()),
                ("baton.io/node".into(), node.name.clone()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
