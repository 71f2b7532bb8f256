//! The API objects of the test: the Pods and ServiceAccounts a cluster's
//! controllers or users would have made.

use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::s;
use crate::APPS;
// deploy/kubernetes's objects and their server-side apply: the cluster
// harness's (the CSI driver's one-node cluster test uses them too).
pub use chaos_tests::kube::objects::{apply, manifest_objects};

/// What kube-apiserver's admission needs before Pods can be created:
/// the `default` ServiceAccount of the namespace (made by
/// kube-controller-manager in a cluster; there is none here).
pub async fn default_service_account(client: &Client, namespace: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": namespace},
    }))
    .unwrap();
    api.patch(
        "default",
        &PatchParams::apply("baton-test").force(),
        &Patch::Apply(&sa),
    )
    .await
    .expect("default ServiceAccount");
}

/// A Pod on `node` with a hostPath volume at `host_path`.
pub async fn create_pod(client: &Client, name: &str, node: &str, host_path: &Path) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "debian:12-slim",
                "volumeMounts": [{"name": "data", "mountPath": "/data",
                    "mountPropagation": "HostToContainer"}]}],
            "volumes": [{"name": "data", "hostPath": {"path": s(host_path), "type": "Directory"}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create Pod {name}: {e}"))
}
