//! deploy/kubernetes as baton-csi needs it (parsed, never applied): every
//! flag the manifests pass is one baton-csi knows; the node plugin serves
//! where kubelet looks (plugins/DRIVER, plugins_registry) with kubelet's
//! directory Bidirectional; its shared mounts are under fs-supervisor's
//! Bidirectional mount root; the CSIDriver, StorageClass and driver name
//! agree; and no StorageClass parameter carries a credential.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use baton_csi::DRIVER_NAME;
use serde::Deserialize;
use serde_yaml::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn objects() -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("manifest");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc).expect("YAML");
            if !value.is_null() {
                out.push(value);
            }
        }
    }
    out
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_sequence()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn arg(container: &Value, flag: &str) -> String {
    args(container)
        .iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")).map(String::from))
        .unwrap_or_else(|| panic!("no {flag}= in {:?}", args(container)))
}

/// The mountPath of `path`'s volume mount in `container`, with its propagation.
fn mount_of(container: &Value, path: &str) -> (String, String) {
    container["volumeMounts"]
        .as_sequence()
        .and_then(|m| {
            m.iter()
                .filter_map(|m| {
                    Some((
                        m["mountPath"].as_str()?,
                        m["mountPropagation"].as_str().unwrap_or("None"),
                    ))
                })
                .filter(|(at, _)| Path::new(path).starts_with(at))
                .max_by_key(|(at, _)| at.len())
        })
        .map(|(at, propagation)| (at.to_string(), propagation.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "{path} is not in a volume of {}",
                container["name"].as_str().unwrap_or("?")
            )
        })
}

#[test]
fn the_manifests_pass_only_flags_baton_csi_knows() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_baton-csi"))
        .arg("--help")
        .output()
        .expect("baton-csi --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let objects = objects();
    let node = container(find(&objects, "DaemonSet", "fs-supervisor"), "csi-node");
    let controller = container(
        find(&objects, "Deployment", "baton-csi-controller"),
        "csi-controller",
    );
    for c in [node, controller] {
        for a in args(c) {
            let flag = a.split('=').next().unwrap_or_default();
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "baton-csi has no {flag}:\n{help}"
            );
        }
    }
    assert!(args(node).contains(&"--node".to_string()));
    assert!(args(controller).contains(&"--controller".to_string()));
}

#[test]
fn the_node_plugin_serves_where_kubelet_looks_and_binds_into_its_pods() {
    let objects = objects();
    let ds = find(&objects, "DaemonSet", "fs-supervisor");
    let node = container(ds, "csi-node");
    assert_eq!(
        node["securityContext"]["privileged"], true,
        "binds need mount(2)"
    );
    let endpoint = arg(node, "--endpoint");
    assert_eq!(
        endpoint,
        format!("/var/lib/kubelet/plugins/{DRIVER_NAME}/csi.sock")
    );
    let registration = arg(node, "--registration-socket");
    assert!(
        registration.starts_with("/var/lib/kubelet/plugins_registry/"),
        "{registration}"
    );
    assert_eq!(
        mount_of(node, "/var/lib/kubelet/pods"),
        ("/var/lib/kubelet".into(), "Bidirectional".into())
    );

    // The shared mounts are made by fs-supervisor under its Bidirectional
    // root and seen by the plugin through its own mount of that root.
    let supervisor = container(ds, "fs-supervisor");
    let mounts_dir = arg(node, "--mounts-dir");
    let (root, propagation) = mount_of(supervisor, &mounts_dir);
    assert_eq!(propagation, "Bidirectional");
    assert_ne!(
        mount_of(node, &mounts_dir).1,
        "None",
        "the plugin cannot see fs-supervisor's mounts"
    );
    assert_eq!(
        arg(node, "--supervisor-socket"),
        arg(supervisor, "--socket")
    );
    assert_eq!(
        mount_of(node, &arg(node, "--supervisor-socket")).0,
        mount_of(supervisor, &arg(supervisor, "--socket")).0
    );
    assert!(mounts_dir.starts_with(&root));
    // Same volumes, same socket for the controller.
    let controller = container(
        find(&objects, "Deployment", "baton-csi-controller"),
        "csi-controller",
    );
    for flag in ["--supervisor-socket", "--base-dir", "--mounts-dir"] {
        assert_eq!(arg(controller, flag), arg(node, flag), "{flag}");
    }
    assert_ne!(mount_of(controller, &mounts_dir).1, "None");
}

#[test]
fn the_driver_storage_class_and_sidecars_agree_and_carry_no_credentials() {
    let objects = objects();
    let driver = find(&objects, "CSIDriver", DRIVER_NAME);
    assert_eq!(
        driver["spec"]["attachRequired"], false,
        "no ControllerPublish: kubelet must not wait for an attach"
    );
    let classes: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "StorageClass")
        .collect();
    assert!(!classes.is_empty());
    for class in classes {
        assert_eq!(class["provisioner"], DRIVER_NAME);
        let parameters: BTreeSet<String> = class["parameters"]
            .as_mapping()
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        assert!(parameters.contains(baton_csi::controller::VOLUME_PARAMETER));
        for name in parameters {
            let lower = name.to_ascii_lowercase();
            assert!(
                !["password", "passphrase", "secret", "key", "token"]
                    .iter()
                    .any(|w| lower.contains(w)),
                "{name}"
            );
        }
    }
    let deployment = find(&objects, "Deployment", "baton-csi-controller");
    let socket = arg(container(deployment, "csi-controller"), "--endpoint");
    for sidecar in ["csi-provisioner", "csi-resizer", "liveness-probe"] {
        let sidecar = container(deployment, sidecar);
        assert_eq!(arg(sidecar, "--csi-address"), socket);
        assert_eq!(
            mount_of(sidecar, &socket),
            mount_of(container(deployment, "csi-controller"), &socket)
        );
    }
}
