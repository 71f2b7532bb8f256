//! The API objects of the test: the manifests of deploy/kubernetes
//! (server-side applied), and the Pods and ServiceAccounts a cluster's
//! controllers or users would have made.

use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::cluster::s;
use crate::APPS;

/// Every object of the manifests kustomization.yaml lists.
pub fn manifest_objects() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let read = |name: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(dir.join(name)).expect("manifest");
        serde_yaml::Deserializer::from_str(&text)
            .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
            .filter(|v: &Value| !v.is_null())
            .collect()
    };
    let kustomization = read("kustomization.yaml").remove(0);
    kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .flat_map(|r| read(r.as_str().expect("resource name")))
        .collect()
}

/// Server-side apply of `object` (any kind), as `kubectl apply
/// --server-side` does.
pub async fn apply(client: &Client, object: &Value) -> Value {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            object["apiVersion"].as_str().unwrap().to_string(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, object["kind"].as_str().unwrap());
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the server has no {gvk:?}: {e}"));
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    let name = object["metadata"]["name"].as_str().unwrap();
    let applied = api
        .patch(
            name,
            &PatchParams::apply("baton-test").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("server-side apply of {} {name} refused: {e}", gvk.kind));
    serde_json::to_value(applied).unwrap()
}

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
