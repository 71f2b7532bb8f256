//! The API objects of the one-node cluster: deploy/kubernetes as the node
//! runs it (paths moved into the run's directory, host network), and the
//! part of the missing kube-scheduler the harness plays (binding pending
//! pods to the one node).

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::apiserver::s;
use super::node::NODE;

pub const SYSTEM: &str = "baton-system";
pub const APPS: &str = "baton-e2e";
pub const IMAGE: &str = "baton/baton:0.1.0";

/// Every object kustomization.yaml lists.
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

/// Host paths of the manifests, moved into the test's directory `dir`
/// (the node is this machine: its real /var/lib/kubelet, /run/baton and
/// /var/lib/baton are not the test's).
pub fn host_path(dir: &Path, path: &str) -> String {
    for (from, to) in [
        ("/var/lib/kubelet", "kubelet"),
        ("/var/lib/baton", "baton"),
        ("/run/baton", "run-baton"),
    ] {
        if let Some(rest) = path.strip_prefix(from) {
            return format!("{}{rest}", s(&dir.join(to)));
        }
    }
    path.to_string()
}

/// The node DaemonSet as deploy/README.md's blue/green update makes the
/// second one: named `fs-supervisor-next`, its pods labelled apart, on
/// `image`.
pub fn next_daemonset(dir: &Path, apiserver_port: u16, metrics_port: u16, image: &str) -> Value {
    let mut next = node_objects(dir, apiserver_port, metrics_port)
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the node DaemonSet");
    next["metadata"]["name"] = json!("fs-supervisor-next");
    next["spec"]["selector"]["matchLabels"]["baton.dev/slot"] = json!("next");
    next["spec"]["template"]["metadata"]["labels"]["baton.dev/slot"] = json!("next");
    for container in next["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
    {
        container["image"] = json!(image);
    }
    next
}

/// The manifests as this node runs them. What changes, and why:
/// - hostPaths into the test's directory; kubelet's directory also inside
///   the containers (a CSI target path is the same on both sides);
/// - host network for every pod (no pod network: no kube-proxy, no CNI
///   bridge), so the in-cluster API address is 127.0.0.1 and the
///   supervisor's metrics port a free one;
/// - the DaemonSet's rollout as 1.20 accepts it (no maxSurge before 1.22);
/// - the controller without its sidecar images (none can be pulled: the
///   test plays external-provisioner), its CSI socket on a hostPath the
///   test reaches;
/// - the example pods are left out (their image, debian:12-slim, is not
///   on the node).
pub fn node_objects(dir: &Path, apiserver_port: u16, metrics_port: u16) -> Vec<Value> {
    let mut objects = manifest_objects();
    objects.retain(|o| o["kind"] != "Pod" && o["kind"] != "PersistentVolumeClaim");
    for object in objects.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
        object["spec"]["updateStrategy"]["rollingUpdate"] = json!({"maxUnavailable": 1});
    }
    for object in &mut objects {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        if kind != "DaemonSet" && kind != "Deployment" {
            continue;
        }
        let spec = &mut object["spec"]["template"]["spec"];
        spec["hostNetwork"] = json!(true);
        for volume in spec["volumes"].as_array_mut().expect("volumes") {
            if let Some(path) = volume["hostPath"]["path"].as_str() {
                volume["hostPath"]["path"] = json!(host_path(dir, path));
            }
        }
        for container in spec["containers"].as_array_mut().expect("containers") {
            for mount in container["volumeMounts"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if mount["mountPath"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/var/lib/kubelet"))
                {
                    mount["mountPath"] =
                        json!(host_path(dir, mount["mountPath"].as_str().unwrap()));
                }
            }
            for arg in container["args"].as_array_mut().into_iter().flatten() {
                let text = arg.as_str().unwrap_or_default().to_string();
                let text = text.replace("/var/lib/kubelet", s(&dir.join("kubelet")));
                let text = text.replace(
                    "--metrics-listen=127.0.0.1:9464",
                    &format!("--metrics-listen=127.0.0.1:{metrics_port}"),
                );
                *arg = json!(text);
            }
        }
        if kind == "DaemonSet" {
            let supervisor = &mut spec["containers"][0];
            assert_eq!(supervisor["name"], "fs-supervisor");
            // What kube-proxy gives a pod: the API server's address.
            let env = supervisor["env"].as_array_mut().expect("env");
            env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
            env.push(
                json!({"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port.to_string()}),
            );
        } else {
            spec["containers"]
                .as_array_mut()
                .unwrap()
                .retain(|c| c["name"] == "csi-controller");
            for volume in spec["volumes"].as_array_mut().unwrap() {
                if volume["name"] == "csi" {
                    *volume = json!({"name": "csi", "hostPath": {
                        "path": s(&dir.join("csi-controller")), "type": "DirectoryOrCreate"}});
                }
            }
        }
    }
    objects
}

/// Server-side apply of `object` (any kind), as `kubectl apply
/// --server-side` does.
pub async fn apply(client: &Client, object: &Value) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
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
            &PatchParams::apply("baton-e2e").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("server-side apply of {} {name} refused: {e}", gvk.kind));
    serde_json::to_value(applied).unwrap()
}

/// The scheduler's part (no kube-scheduler is built): binds every pod
/// without a node to the one node, as the scheduler would, until dropped.
pub fn spawn_binder(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client.clone());
        let unscheduled = ListParams::default().fields("spec.nodeName=");
        loop {
            if let Ok(list) = pods.list(&unscheduled).await {
                for pod in list {
                    let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                        continue;
                    };
                    let binding = json!({"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": name, "namespace": ns},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
                    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                    let bound: Result<Value, _> = api
                        .create_subresource("binding", &name, &PostParams::default(), &binding)
                        .await;
                    if let Err(err) = bound {
                        eprintln!("binding {ns}/{name} to {NODE}: {err}");
                    }
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })
}
