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

#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

const NODE: &str = "baton-node-a";
const OTHER_NODE: &str = "baton-node-b";
const APPS: &str = "baton-apps";
const SUPERVISOR_USER: &str = "system:serviceaccount:baton-system:fs-supervisor";
/// Starting etcd and kube-apiserver on a loaded 2-core machine.
const SERVER_DEADLINE: Duration = Duration::from_secs(120);
/// Anything the supervisor does (the status ConfigMap is written at most
/// every 10 s).
const DEADLINE: Duration = Duration::from_secs(60);
const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";

fn required() -> bool {
    std::env::var("BATON_REQUIRE_KUBE_APISERVER").as_deref() == Ok("1")
}

/// `None` (and a printed reason) when this machine cannot run the test.
fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let on_path = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    };
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

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn run(command: &mut Command) {
    let out = command.output().expect("spawn");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `f` until it returns `Some`, or panics with `what` and `context()`.
async fn eventually<T, F, Fut>(
    what: &str,
    deadline: Duration,
    context: impl Fn() -> String,
    mut f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = f().await {
            return value;
        }
        assert!(
            Instant::now() < end,
            "{what}: not within {deadline:?}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child process killed (SIGKILL) and reaped when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd and kube-apiserver, with the credentials the test uses.
struct Cluster {
    dir: PathBuf,
    url: String,
    admin_token: String,
    // Dropped in this order: the API server, then etcd.
    _apiserver: Process,
    _etcd: Process,
}

impl Cluster {
    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    fn logs(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "--- kube-apiserver.log ---\n{}\n--- etcd.log ---\n{}",
            tail("kube-apiserver.log"),
            tail("etcd.log")
        )
    }

    /// A kubeconfig for `token` at `path`.
    fn write_kubeconfig(&self, path: &Path, token: &str) {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url,
                "certificate-authority": s(&self.ca()),
            }}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        });
        std::fs::write(path, serde_json::to_string_pretty(&config).unwrap()).expect("kubeconfig");
    }

    async fn client(&self, kubeconfig: &Path) -> Client {
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(kubeconfig).expect("read kubeconfig"),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig");
        Client::try_from(config).expect("kube client")
    }
}

/// Certificates (a CA, the server's for 127.0.0.1) and the service
/// account signing key, made with openssl in `dir`.
fn make_credentials(dir: &Path) {
    let p = |name: &str| dir.join(name);
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=baton-test-ca"])
        .args(["-keyout", s(&p("ca.key")), "-out", s(&p("ca.crt"))]));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
        ])
        .args(["-keyout", s(&p("server.key")), "-out", s(&p("server.csr"))]));
    std::fs::write(
        p("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in", s(&p("server.csr"))])
        .args([
            "-CA",
            s(&p("ca.crt")),
            "-CAkey",
            s(&p("ca.key")),
            "-CAcreateserial",
        ])
        .args(["-extfile", s(&p("server.ext")), "-out", s(&p("server.crt"))]));
    run(Command::new("openssl").args(["genrsa", "-out", s(&p("sa.key")), "2048"]));
    run(Command::new("openssl").args([
        "rsa",
        "-in",
        s(&p("sa.key")),
        "-pubout",
        "-out",
        s(&p("sa.pub")),
    ]));
}

fn start_cluster(dir: &Path, apiserver: &Path, etcd: &Path) -> Cluster {
    make_credentials(dir);
    let log = |name: &str| std::fs::File::create(dir.join(name)).expect("log file");

    let (client_port, peer_port) = (free_port(), free_port());
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd = Process(
        Command::new(etcd)
            .args(["--name", "baton-test", "--data-dir", s(&dir.join("etcd"))])
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("baton-test={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log("etcd.log"))
            .stderr(log("etcd.log"))
            .spawn()
            .expect("spawn etcd"),
    );

    let admin_token = format!("admin-{}-{}", std::process::id(), client_port);
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{admin_token},baton-test-admin,baton-test-admin,\"system:masters\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n",
    )
    .unwrap();
    let port = free_port();
    let p = |name: &str| s(&dir.join(name)).to_string();
    let issuer = "https://kubernetes.default.svc.cluster.local";
    let apiserver = Process(
        Command::new(apiserver)
            .arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg("--insecure-port=0")
            .arg(format!("--cert-dir={}", p("certs")))
            .arg(format!("--tls-cert-file={}", p("server.crt")))
            .arg(format!("--tls-private-key-file={}", p("server.key")))
            .arg(format!("--token-auth-file={}", p("tokens.csv")))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg(format!("--service-account-issuer={issuer}"))
            .arg(format!("--api-audiences={issuer}"))
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg("--allow-privileged=true")
            .arg(format!("--audit-policy-file={}", p("audit-policy.yaml")))
            .arg(format!("--audit-log-path={}", p("audit.log")))
            .arg("--audit-log-mode=blocking")
            .arg("--profiling=false")
            .arg("--v=1")
            .stdin(Stdio::null())
            .stdout(log("kube-apiserver.log"))
            .stderr(log("kube-apiserver.log"))
            .spawn()
            .expect("spawn kube-apiserver"),
    );
    Cluster {
        dir: dir.to_path_buf(),
        url: format!("https://127.0.0.1:{port}"),
        admin_token,
        _apiserver: apiserver,
        _etcd: etcd,
    }
}

/// Every object of the manifests kustomization.yaml lists.
fn manifest_objects() -> Vec<Value> {
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
async fn apply(client: &Client, object: &Value) -> Value {
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
async fn default_service_account(client: &Client, namespace: &str) {
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
async fn create_pod(client: &Client, name: &str, node: &str, host_path: &Path) -> Pod {
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

/// fs-supervisor --kubernetes with one mounted volume; on drop: stopped,
/// its generations killed, the mount detached.
struct Supervisor {
    dir: PathBuf,
    mnt: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    process: Option<Process>,
}

impl Supervisor {
    fn fsctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_fsctl"))
            .args(args)
            .args(["--socket", s(&self.socket)])
            .output()
            .expect("run fsctl")
    }

    fn status(&self) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        assert!(
            out.status.success(),
            "fsctl status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        report["mounts"][0].clone()
    }

    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("supervisor.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = kill(Pid::from_raw(process.0.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut process = process;
            while Instant::now() < deadline && matches!(process.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let parent = Path::new(CGROUP_V1_MEMORY).join(&self.cgroup_parent);
        for cgroup in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let procs =
                std::fs::read_to_string(cgroup.path().join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let end = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(cgroup.path()).is_err() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir(&parent);
        if std::thread::panicking() {
            let _ = fuse_wire::abort_connection(&self.mnt);
        }
        while fuse_wire::connection_id(&self.mnt).is_ok() {
            if fuse_wire::unmount(&self.mnt).is_err() {
                break;
            }
        }
    }
}

fn start_supervisor(dir: &Path, kubeconfig: &Path) -> Supervisor {
    let fsclient = {
        let mut d = PathBuf::from(env!("CARGO_BIN_EXE_fsctl"));
        d.pop();
        d.join("fsclient")
    };
    assert!(
        fsclient.exists(),
        "{} is missing: run `cargo build -p fsclient` first",
        fsclient.display()
    );
    let base = dir.join("base");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run(Command::new(env!("CARGO_BIN_EXE_fsctl")).args(["format", "vol", "--base-dir", s(&base)]));
    let socket = dir.join("supervisor.sock");
    let cgroup_parent = format!("baton-test-kube-{}", std::process::id());
    let log = std::fs::File::create(dir.join("supervisor.log")).unwrap();
    let process = Command::new(env!("CARGO_BIN_EXE_fs-supervisor"))
        .args(["--kubernetes", "--client-binary", s(&fsclient)])
        .args(["--state-dir", s(&dir.join("state"))])
        .args(["--socket", s(&socket)])
        .args(["--cgroup-parent", &cgroup_parent])
        .env("KUBECONFIG", kubeconfig)
        .env("NODE_NAME", NODE)
        .env("POD_NAMESPACE", "baton-system")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn fs-supervisor");
    let supervisor = Supervisor {
        dir: dir.to_path_buf(),
        mnt,
        socket,
        cgroup_parent,
        process: Some(Process(process)),
    };
    let end = Instant::now() + DEADLINE;
    while !supervisor.socket.exists() {
        assert!(
            Instant::now() < end,
            "fs-supervisor did not start:\n{}",
            supervisor.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = supervisor.fsctl(&["mount", "vol", s(&supervisor.mnt), "--base-dir", s(&base)]);
    assert!(
        out.status.success(),
        "fsctl mount: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        supervisor.log()
    );
    supervisor
}

/// The audit log's requests by `user` on pods: (verb, requestURI).
fn pod_requests_of(audit_log: &Path, user: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(audit_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["user"]["username"] == user && e["objectRef"]["resource"] == "pods")
        // Once per request, as it arrives: a 1.20 watch logs its next
        // stage (ResponseStarted) only with its first event.
        .filter(|e| e["stage"] == "RequestReceived")
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                e["requestURI"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn fs_supervisor_publishes_events_and_status_on_a_real_api_server() {
    let Some((apiserver, etcd)) = prerequisites() else {
        return;
    };
    supervisor::kubernetes::client::install_tls_provider();
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
    let objects = manifest_objects();
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
