//! The objects of the cluster test that are the CSI driver's: the PVCs,
//! the workload pods, and the external-provisioner's part the test plays
//! (CreateVolume on baton-csi's controller socket, then the PV pre-bound
//! to the PVC).

use std::path::Path;

use baton_csi::proto::controller_client::ControllerClient;
use baton_csi::proto::volume_capability::{AccessType, MountVolume};
use baton_csi::proto::*;
use chaos_tests::kube::apiserver::s;
pub use chaos_tests::kube::objects::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

pub async fn csi_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect to baton-csi's controller socket")
}

/// A PVC of the `baton` StorageClass asking `bytes`.
pub async fn create_pvc(client: &Client, name: &str, bytes: u64) -> PersistentVolumeClaim {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"storageClassName": "baton", "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": bytes.to_string()}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap_or_else(|e| panic!("create PVC {name}: {e}"))
}

/// What external-provisioner does for a PVC of a class whose provisioner
/// is csi.baton.dev: CreateVolume named `pvc-<uid>` with the class's
/// parameters and the PVC's request, then a PV with the returned handle,
/// pre-bound to the PVC (the PV controller completes the binding).
pub async fn provision(client: &Client, controller: Channel, pvc: &PersistentVolumeClaim) {
    let classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk(&GroupVersionKind::gvk(
            "storage.k8s.io",
            "v1",
            "StorageClass",
        )),
    );
    let class_name = pvc
        .spec
        .as_ref()
        .unwrap()
        .storage_class_name
        .clone()
        .unwrap();
    let class =
        serde_json::to_value(classes.get(&class_name).await.expect("StorageClass")).unwrap();
    assert_eq!(class["provisioner"], "csi.baton.dev");
    let parameters = class["parameters"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap();
    let name = format!("pvc-{uid}");
    let requested = pvc
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone();
    let bytes: i64 = requested.parse().expect("a PVC request in plain bytes");
    let created = ControllerClient::new(controller)
        .create_volume(CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
                }),
                access_type: Some(AccessType::Mount(MountVolume::default())),
            }],
            parameters,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name}: {e}"))
        .into_inner()
        .volume
        .expect("CreateVolume's volume");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": "csi.baton.dev"}},
        "spec": {
            "capacity": {"storage": created.capacity_bytes.to_string()},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": class["reclaimPolicy"].as_str().unwrap_or("Delete"),
            "storageClassName": class_name,
            "volumeMode": "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": APPS, "name": pvc.metadata.name, "uid": uid},
            "csi": {"driver": "csi.baton.dev", "volumeHandle": created.volume_id},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("create PV {name}: {e}"));
}

/// A host-network pod of the Baton image running `script` (bash) with
/// the PVC `claim` at /data and the host directory `ctl` at /ctl.
pub async fn create_pod(client: &Client, name: &str, claim: &str, ctl: &Path, script: &str) -> Pod {
    std::fs::create_dir_all(ctl).unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "app", "image": IMAGE, "command": ["bash", "-c", script],
                "env": [{"name": "POD_NAME", "value": name}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "ctl", "mountPath": "/ctl"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                        {"name": "ctl", "hostPath": {"path": s(ctl), "type": "Directory"}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create Pod {name}: {e}"))
}
