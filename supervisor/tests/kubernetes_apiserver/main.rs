//! `fs-supervisor --kubernetes` and `deploy/kubernetes/` against a real
//! API server: kube-apiserver 1.20.2 (built from Debian's source by
//! `.ci/build-kube-apiserver`) on Debian's etcd, both on 127.0.0.1 with
//! free ports and temp dirs, killed on every exit path.
//!
//! The test server-side-applies every manifest (the server must accept the
//! DaemonSet, RBAC, ConfigMap and example Pod and keep their fields), then
//! runs fs-supervisor with a token of the manifests' ServiceAccount (so the
//! manifests' RBAC is what it gets), a real FUSE mount, and Pods that use
//! it; after a kill -9 of the serving generation it checks the Events on
//! the pod using the mount on this node (and none on a pod of another node
//! or one not using the mount), the per-node status ConfigMap, and, in the
//! server's audit log, that every pod list and watch of the supervisor
//! carried the field selector `spec.nodeName=NODE`.
//!
//! Skips (with the reason printed) without the kube-apiserver binary, etcd,
//! openssl, root or /dev/fuse, unless `BATON_REQUIRE_KUBE_APISERVER=1`
//! (set by `.ci/run`), which turns a skip into a failure. The binary is
//! `$BATON_KUBE_APISERVER`, else /var/cache/baton-ci/kube-apiserver-1.20.2,
//! else `kube-apiserver` on PATH. Needs `target/debug/fsclient` (`cargo
//! build -p fsclient`). `BATON_KUBE_TEST_KEEP=1` keeps the temp dir (server,
//! etcd, supervisor and audit logs, kubeconfigs) and prints its path.
//!
//! What differs between the server (1.20) and k8s-openapi's v1_33 types,
//! as found here: core/v1 Events (what the supervisor writes) are accepted
//! by 1.20 as is; server-side apply is beta in 1.20 but on by default and
//! accepts the ConfigMap; 1.20 silently drops fields it does not know
//! (strict field validation came in 1.25), so the test reads the applied
//! DaemonSet back to see that the fields that matter were kept.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use chaos_tests::kube::apiserver as cluster;
use chaos_tests::kube::{eventually, on_path};
mod node;
mod objects;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, ServiceAccount};
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use kube::Api;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use cluster::{pod_requests_of, s, start_cluster, Cluster};
use node::start_supervisor;
use objects::{apply, create_pod, default_service_account, manifest_objects};

pub const NODE: &str = "baton-node-a";
pub const OTHER_NODE: &str = "baton-node-b";
pub const APPS: &str = "baton-apps";
pub const SUPERVISOR_USER: &str = "system:serviceaccount:baton-system:fs-supervisor";
/// Starting etcd and kube-apiserver on a loaded 2-core machine.
pub const SERVER_DEADLINE: Duration = Duration::from_secs(120);
/// Anything the supervisor does (the status ConfigMap is written at most
/// every 10 s).
pub const DEADLINE: Duration = Duration::from_secs(60);

fn required() -> bool {
    std::env::var("BATON_REQUIRE_KUBE_APISERVER").as_deref() == Ok("1")
}

/// `None` (and a printed reason) when this machine cannot run the test.
fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let apiserver = std::env::var_os("BATON_KUBE_APISERVER")
        .map(PathBuf::from)
        .or_else(|| {
            Some(PathBuf::from("/var/cache/baton-ci/kube-apiserver-1.20.2")).filter(|p| p.is_file())
        })
        .or_else(|| on_path("kube-apiserver"));
    let missing = if apiserver.as_ref().is_none_or(|p| !p.is_file()) {
        Some("no kube-apiserver (run .ci/build-kube-apiserver, or set BATON_KUBE_APISERVER)")
    } else if on_path("etcd").is_none() {
        Some("no etcd on PATH (apt-get install etcd-server)")
    } else if on_path("openssl").is_none() {
        Some("no openssl on PATH")
    } else if !nix::unistd::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        Some("not root with /dev/fuse (the test mounts a real volume)")
    } else {
        None
    };
    if let Some(reason) = missing {
        assert!(!required(), "BATON_REQUIRE_KUBE_APISERVER=1 but {reason}");
        eprintln!("skipping the kube-apiserver test: {reason}");
        return None;
    }
    Some((apiserver?, on_path("etcd")?))
}

#[test]
fn fs_supervisor_publishes_events_and_status_on_a_real_api_server() {
    let Some((apiserver, etcd)) = prerequisites() else {
        return;
    };
    let mut tmp = tempfile::tempdir().expect("temp dir");
    // Logs, the audit log and kubeconfigs, for a look by hand.
    if std::env::var_os("BATON_KUBE_TEST_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("keeping {}", tmp.path().display());
    }
    let cluster = start_cluster(tmp.path(), &apiserver, &etcd);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(scenario(&cluster, tmp.path()));
}

async fn scenario(cluster: &Cluster, dir: &Path) {
    let admin_config = dir.join("admin.kubeconfig");
    cluster.write_kubeconfig(&admin_config, &cluster.admin_token);
    let admin = cluster.client(&admin_config).await;
    let logs = || cluster.logs();

    // Up, with its bootstrap objects (the default namespace, the system
    // priority classes the DaemonSet names).
    eventually("kube-apiserver ready", SERVER_DEADLINE, logs, || async {
        let ns: Api<Namespace> = Api::all(admin.clone());
        ns.get("default").await.ok()?;
        let pcs: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &kube::discovery::ApiResource::from_gvk(&GroupVersionKind::gvk(
                "scheduling.k8s.io",
                "v1",
                "PriorityClass",
            )),
        );
        pcs.get("system-node-critical").await.ok()
    })
    .await;
    let version = admin.apiserver_version().await.expect("version");
    eprintln!("kube-apiserver {}", version.git_version);

    // deploy/kubernetes, server-side applied in kustomization order.
    default_service_account(&admin, "default").await;
    let mut objects = manifest_objects();
    // The DaemonSet's rollingUpdate.maxSurge came in 1.22; 1.20's
    // server-side apply refuses it ("field not declared in schema"), and
    // without it maxUnavailable may not be 0. On such a cluster the
    // rollout is the old one (deploy/README.md: it unmounts); everything
    // else is applied as written.
    for object in objects.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
        let rolling = &mut object["spec"]["updateStrategy"]["rollingUpdate"];
        assert_eq!(
            *rolling,
            json!({"maxSurge": 1, "maxUnavailable": 0}),
            "the DaemonSet's rollout changed: update this test"
        );
        *rolling = json!({"maxUnavailable": 1});
    }
    for object in &objects {
        if object["kind"] == "Pod" || object["kind"] == "ServiceAccount" {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            default_service_account(&admin, ns).await;
        }
        apply(&admin, object).await;
    }
    let daemonset = apply(
        &admin,
        objects
            .iter()
            .find(|o| o["kind"] == "DaemonSet")
            .expect("a DaemonSet"),
    )
    .await;
    let pod_spec = &daemonset["spec"]["template"]["spec"];
    let supervisor_container = &pod_spec["containers"][0];
    assert_eq!(supervisor_container["securityContext"]["privileged"], true);
    let mounts = supervisor_container["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPropagation"] == "Bidirectional"),
        "the server dropped mountPropagation: {supervisor_container}"
    );
    assert_eq!(
        supervisor_container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(pod_spec["priorityClassName"], "system-node-critical");

    // This node, the apps' namespace, and the supervisor's credentials: a
    // token of the manifests' ServiceAccount (TokenRequest), so it has the
    // manifests' RBAC and nothing more.
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
    }))
    .unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create Node");
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS},
    }))
    .unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create Namespace");
    default_service_account(&admin, APPS).await;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token: TokenRequest = Api::<ServiceAccount>::namespaced(admin.clone(), "baton-system")
        .create_subresource("token", "fs-supervisor", &PostParams::default(), &request)
        .await
        .expect("TokenRequest for baton-system/fs-supervisor");
    let token = token.status.expect("a token").token;
    let supervisor_config = dir.join("supervisor.kubeconfig");
    cluster.write_kubeconfig(&supervisor_config, &token);

    let supervisor = start_supervisor(&dir.join("node"), &supervisor_config);
    let slogs = || {
        format!(
            "{}\n--- supervisor ---\n{}",
            cluster.logs(),
            supervisor.log()
        )
    };
    let first = supervisor.status();
    let mount_id = first["mount_id"].as_str().expect("mount id").to_string();

    // Pods: one on this node using the mount, one on this node not using
    // it, one on another node with the same hostPath.
    let user = create_pod(&admin, "uses-the-mount", NODE, &supervisor.mnt).await;
    create_pod(&admin, "other-volume", NODE, Path::new("/srv")).await;
    create_pod(&admin, "other-node", OTHER_NODE, &supervisor.mnt).await;

    // The status ConfigMap appears (server-side apply under the Role), and
    // the pod watch is running: its list saw the pods, so a watch follows.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), "baton-system");
    let status_name = format!("baton-status-{NODE}");
    eventually("the status ConfigMap", DEADLINE, slogs, || async {
        configmaps
            .get(&status_name)
            .await
            .ok()?
            .data?
            .get(&mount_id)
            .cloned()
    })
    .await;
    eventually("the supervisor's pod watch", DEADLINE, slogs, || async {
        pod_requests_of(&cluster.audit_log(), SUPERVISOR_USER)
            .iter()
            .any(|(verb, _)| verb == "watch")
            .then_some(())
    })
    .await;

    // kill -9 of the serving generation; the next one takes over.
    let pid = first["pid"].as_i64().expect("a serving pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 the generation");
    let end = Instant::now() + DEADLINE;
    loop {
        let status = supervisor.status();
        if status["state"] == "serving"
            && status["generation"].as_u64() > first["generation"].as_u64()
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "no new generation: {status}\n{}",
            slogs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Events on the pod using the mount: the crash, then the recovery.
    let events: Api<Event> = Api::namespaced(admin.clone(), APPS);
    let on_user = eventually(
        "Events on the pod using the mount",
        DEADLINE,
        slogs,
        || async {
            let list = events.list(&Default::default()).await.ok()?.items;
            let mine: Vec<Event> = list
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("uses-the-mount"))
                .collect();
            let reasons: Vec<&str> = mine.iter().filter_map(|e| e.reason.as_deref()).collect();
            (reasons.contains(&"BatonGenerationCrashed")
                && reasons.contains(&"BatonMountRecovered"))
            .then_some(mine)
        },
    )
    .await;
    let crashed = on_user
        .iter()
        .find(|e| e.reason.as_deref() == Some("BatonGenerationCrashed"))
        .unwrap();
    assert_eq!(crashed.type_.as_deref(), Some("Warning"));
    assert_eq!(crashed.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(crashed.involved_object.uid, user.metadata.uid);
    assert_eq!(
        crashed.source.as_ref().and_then(|s| s.host.as_deref()),
        Some(NODE)
    );
    assert_eq!(crashed.reporting_instance.as_deref(), Some(NODE));
    let message = crashed.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("signal 9")
            && message.contains("volume vol")
            && message.contains(s(&supervisor.mnt)),
        "crash Event message: {message}"
    );
    let recovered = on_user
        .iter()
        .find(|e| e.reason.as_deref() == Some("BatonMountRecovered"))
        .unwrap();
    assert_eq!(recovered.type_.as_deref(), Some("Normal"));

    // No Event on the pod of another node (not in the supervisor's watch)
    // nor on the pod not using the mount.
    let all = events
        .list(&Default::default())
        .await
        .expect("list Events")
        .items;
    let others: Vec<_> = all
        .iter()
        .filter(|e| e.involved_object.name.as_deref() != Some("uses-the-mount"))
        .map(|e| (e.involved_object.name.clone(), e.reason.clone()))
        .collect();
    assert!(
        others.is_empty(),
        "Events on pods not using this node's mount: {others:?}"
    );

    // The status ConfigMap catches up: the new generation, one kill.
    let generation = supervisor.status()["generation"].as_u64().unwrap();
    let entry = eventually(
        "the status ConfigMap after the kill",
        DEADLINE,
        slogs,
        || async {
            let data = configmaps.get(&status_name).await.ok()?.data?;
            let entry: Value = serde_json::from_str(data.get(&mount_id)?).ok()?;
            (entry["generation"].as_u64() == Some(generation) && entry["state"] == "serving")
                .then_some(entry)
        },
    )
    .await;
    assert_eq!(entry["restarts"]["signal"], 1, "{entry}");
    assert_eq!(entry["volume"], "vol");
    assert_eq!(entry["mountpoint"], s(&supervisor.mnt));
    let cm = configmaps.get(&status_name).await.unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get("baton.io/node")
            .map(String::as_str),
        Some(NODE)
    );

    // Every pod list and watch of the supervisor was this node's only.
    let requests = pod_requests_of(&cluster.audit_log(), SUPERVISOR_USER);
    let selector = format!("fieldSelector=spec.nodeName%3D{NODE}");
    assert!(
        requests.iter().any(|(verb, _)| verb == "list"),
        "{requests:?}"
    );
    let unscoped: Vec<_> = requests
        .iter()
        .filter(|(verb, uri)| (verb == "list" || verb == "watch") && !uri.contains(&selector))
        .collect();
    assert!(
        unscoped.is_empty(),
        "pod requests without {selector}: {unscoped:?}"
    );
}
