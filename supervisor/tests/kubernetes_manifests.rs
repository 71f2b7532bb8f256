//! The invariants of `deploy/kubernetes/` (parsed, never applied to a
//! cluster): kustomization lists every manifest; the DaemonSet is
//! privileged with /dev/fuse, hostPath state and socket dirs and a
//! Bidirectional mount root, and only passes flags fs-supervisor knows;
//! the example pod uses HostToContainer and no privilege; RBAC grants each
//! service account (fs-supervisor, the CSI controller's sidecars) only the
//! verbs it needs.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every document of one manifest file.
fn documents(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join(name)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn all_objects() -> Vec<Value> {
    let kustomization = &documents("kustomization.yaml")[0];
    kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| documents(r.as_str().unwrap()))
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(value: &Value) -> BTreeSet<String> {
    value
        .as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kustomization_lists_every_manifest_and_each_parses() {
    let listed = strings(&documents("kustomization.yaml")[0]["resources"]);
    let present: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
    for object in all_objects() {
        assert!(
            object["apiVersion"].is_string() && object["kind"].is_string(),
            "{object:?}"
        );
        assert!(object["metadata"]["name"].is_string(), "{object:?}");
    }
}

#[test]
fn the_daemonset_is_privileged_with_fuse_and_a_bidirectional_mount_root() {
    let objects = all_objects();
    let ds = find(&objects, "DaemonSet", "fs-supervisor");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "fs-supervisor");
    let containers = pod["containers"].as_sequence().unwrap();
    let supervisor = containers
        .iter()
        .find(|c| c["name"] == "fs-supervisor")
        .unwrap();
    assert_eq!(supervisor["securityContext"]["privileged"], true);
    let volumes = pod["volumes"].as_sequence().unwrap();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["hostPath"]["path"].as_str())
            .unwrap_or_else(|| panic!("volume {name} is not a hostPath"))
            .to_string()
    };
    let mounts = supervisor["volumeMounts"].as_sequence().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("nothing mounted at {path}"))
    };
    assert_eq!(
        host_path(mount("/dev/fuse")["name"].as_str().unwrap()),
        "/dev/fuse"
    );
    let args = strings(&supervisor["args"]);
    let arg = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("no {flag}= in {args:?}"))
            .to_string()
    };
    // The state dir and the socket's dir are host paths, so they outlive
    // the pod and fsctl in other containers reaches the socket.
    let state = arg("--state-dir");
    assert_eq!(host_path(mount(&state)["name"].as_str().unwrap()), state);
    let socket_dir = Path::new(&arg("--socket"))
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        host_path(mount(&socket_dir)["name"].as_str().unwrap()),
        socket_dir
    );
    let root = mounts
        .iter()
        .find(|m| m["mountPropagation"] == "Bidirectional")
        .expect("a Bidirectional mount root");
    let root_path = root["mountPath"].as_str().unwrap();
    assert_eq!(host_path(root["name"].as_str().unwrap()), root_path);
    // Only a privileged container (fs-supervisor, the CSI node plugin) may
    // use Bidirectional.
    for c in containers
        .iter()
        .filter(|c| c["securityContext"]["privileged"] != true)
    {
        for m in c["volumeMounts"].as_sequence().into_iter().flatten() {
            assert_ne!(m["mountPropagation"], "Bidirectional", "{c:?}");
        }
    }
    // The node comes from the downward API.
    let env = supervisor["env"].as_sequence().unwrap();
    let node = env.iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // Every mountpoint of the volumes ConfigMap is under the mount root.
    let config = find(&objects, "ConfigMap", "baton-volumes");
    let lines = config["data"]["mounts"].as_str().unwrap();
    assert!(lines.lines().count() > 0);
    for line in lines.lines() {
        let point = line.split_whitespace().nth(1).unwrap();
        assert!(
            point.starts_with(&format!("{root_path}/")),
            "{point} is outside {root_path}"
        );
    }
}

#[test]
fn the_daemonset_passes_only_flags_fs_supervisor_knows() {
    let objects = all_objects();
    let ds = find(&objects, "DaemonSet", "fs-supervisor");
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap();
    let supervisor = containers
        .iter()
        .find(|c| c["name"] == "fs-supervisor")
        .unwrap();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_fs-supervisor"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in strings(&supervisor["args"]) {
        let flag = arg.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} "))
                || help.contains(&format!("{flag}\n"))
                || help.contains(&format!("{flag} <")),
            "fs-supervisor has no {flag}:\n{help}"
        );
    }
}

#[test]
fn the_example_pod_uses_host_to_container_without_privilege() {
    let objects = all_objects();
    let pod = find(&objects, "Pod", "baton-example");
    let ds = find(&objects, "DaemonSet", "fs-supervisor");
    let ds_pod = &ds["spec"]["template"]["spec"];
    let root = ds_pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPropagation"] == "Bidirectional")
        .unwrap()["mountPath"]
        .as_str()
        .unwrap()
        .to_string();
    for c in pod["spec"]["containers"].as_sequence().unwrap() {
        assert_ne!(c["securityContext"]["privileged"], true);
        for m in c["volumeMounts"].as_sequence().unwrap() {
            assert_eq!(m["mountPropagation"], "HostToContainer", "{m:?}");
            let volume = pod["spec"]["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap();
            let path = volume["hostPath"]["path"].as_str().unwrap();
            assert!(
                path.starts_with(&format!("{root}/")),
                "{path} is not a Baton mount"
            );
        }
    }
}

#[test]
fn rbac_grants_each_service_account_only_what_it_uses() {
    let objects = all_objects();
    // (service account, apiGroup, resource) -> the verbs allowed at most.
    let allowed = |account: &str, group: &str, resource: &str| -> BTreeSet<&'static str> {
        match (account, group, resource) {
            ("fs-supervisor", "", "pods") => ["get", "list", "watch"].into(),
            ("fs-supervisor", "" | "events.k8s.io", "events") => ["create", "patch"].into(),
            ("fs-supervisor", "", "configmaps") => ["get", "create", "update", "patch"].into(),
            // external-provisioner and external-resizer.
            ("baton-csi-controller", "", "persistentvolumes") => {
                ["get", "list", "watch", "create", "delete", "patch"].into()
            }
            ("baton-csi-controller", "", "persistentvolumeclaims") => {
                ["get", "list", "watch", "update"].into()
            }
            ("baton-csi-controller", "", "persistentvolumeclaims/status") => ["patch"].into(),
            ("baton-csi-controller", "storage.k8s.io", "storageclasses" | "csinodes")
            | ("baton-csi-controller", "", "nodes") => ["get", "list", "watch"].into(),
            ("baton-csi-controller", "", "events") => {
                ["list", "watch", "create", "update", "patch"].into()
            }
            ("baton-csi-controller", "coordination.k8s.io", "leases") => {
                ["get", "watch", "list", "create", "update", "delete"].into()
            }
            _ => BTreeSet::new(),
        }
    };
    let mut roles = 0;
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let subjects = binding["subjects"].as_sequence().unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0]["kind"], "ServiceAccount");
        assert_eq!(subjects[0]["namespace"], "baton-system");
        let account = subjects[0]["name"].as_str().unwrap();
        let name = binding["roleRef"]["name"].as_str().unwrap();
        let kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role = find(&objects, kind, name);
        roles += 1;
        for rule in role["rules"].as_sequence().unwrap() {
            assert!(rule["resourceNames"].is_null() || rule["resourceNames"].is_sequence());
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let verbs = strings(&rule["verbs"]);
                    let ok = allowed(account, &group, &resource);
                    assert!(
                        verbs.iter().all(|v| ok.contains(v.as_str())),
                        "{name} grants {account} {verbs:?} on {group}/{resource}"
                    );
                }
            }
        }
        // ConfigMaps (status) only in the supervisor's namespace; Secrets
        // nowhere.
        let text = serde_yaml::to_string(role).unwrap();
        assert!(!text.contains("secrets"), "{text}");
        if kind == "ClusterRole" {
            assert!(!text.contains("configmaps"), "{text}");
        }
    }
    let defined = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        .count();
    assert_eq!(roles, defined, "every role is bound once");
    assert_eq!(roles, 4);
}

#[test]
fn a_rolling_update_starts_the_successor_before_stopping_the_old_pod() {
    let objects = all_objects();
    let ds = find(&objects, "DaemonSet", "fs-supervisor");
    let rolling = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    // The new pod must run beside the old one, or there is nobody to hand
    // the mounts to when the old one gets SIGTERM.
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(rolling["maxSurge"].as_u64(), Some(1), "{rolling:?}");
    assert_eq!(rolling["maxUnavailable"].as_u64(), Some(0), "{rolling:?}");
    let supervisor = ds["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "fs-supervisor")
        .unwrap();
    assert!(
        strings(&supervisor["args"])
            .iter()
            .any(|a| a == "--successor"),
        "the new pod's supervisor must wait as a successor, not refuse to start"
    );
}
