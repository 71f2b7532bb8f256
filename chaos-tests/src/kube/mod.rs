//! A real one-node Kubernetes cluster on this machine, running
//! deploy/kubernetes from the Baton image: what the CSI driver's tier-2
//! test (csi/tests/kube_cluster) and `baton-bench kube` stand on.
//!
//! The cluster: Debian's etcd, kube-apiserver, kube-controller-manager
//! and kubelet 1.20.2 (`.ci/build-kubernetes`), a private containerd and
//! runc from Debian (root, state, sockets, runc root all in the run's
//! directory), the Baton image from `deploy/image/build --binaries
//! target/debug` (or the directory of the running workspace binaries) and a
//! pause image made here from a static C program, both imported with `ctr`.
//! Every pod is host-network (no pod network, no kube-proxy). What the
//! cluster lacks, the harness plays: kube-scheduler (binding pending pods
//! to the node, [`objects::spawn_binder`]).
//!
//! - [`apiserver`]: etcd and kube-apiserver with their credentials.
//! - [`node`]: containerd, kube-controller-manager and kubelet.
//! - [`objects`]: the manifests as the node runs them.
//!
//! This is harness code: a component that does not come up within its
//! deadline panics with the last lines of every log, and everything it
//! started is stopped and unmounted on the way out (the drops of
//! [`node::Node`] and [`apiserver::Cluster`]).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod apiserver;
pub mod node;
pub mod objects;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::mount_guard::workspace_binary;
use apiserver::{free_port, s, Cluster};
use node::{mounts_under, Node, NODE};
use objects::{APPS, SYSTEM};

/// Starting etcd, the API server, containerd and kubelet, and pods (image
/// unpacking included), on a loaded 2-core machine.
pub const START_DEADLINE: Duration = Duration::from_secs(240);

/// The Kubernetes binaries the cluster runs.
pub struct Binaries {
    pub apiserver: PathBuf,
    pub controller_manager: PathBuf,
    pub kubelet: PathBuf,
    pub etcd: PathBuf,
}

/// The file `name` in a directory of `$PATH`, if any.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// What fs-supervisor built without `--features kubernetes` says (as
/// deploy/image/build checks).
const KUBERNETES_MISSING: &[u8] = b"built without the `kubernetes` feature";

/// The binaries, or why this machine cannot run the cluster (and what to
/// install or build).
pub fn prerequisites() -> Result<Binaries, String> {
    let cached = |component: &str, env: &str| {
        std::env::var_os(env).map(PathBuf::from).or_else(|| {
            Some(PathBuf::from(format!(
                "/var/cache/baton-ci/{component}-1.20.2"
            )))
            .filter(|p| p.is_file())
        })
    };
    let apiserver = cached("kube-apiserver", "BATON_KUBE_APISERVER");
    let controller_manager = cached("kube-controller-manager", "BATON_KUBE_CONTROLLER_MANAGER");
    let kubelet = cached("kubelet", "BATON_KUBELET");
    let tools = [
        "etcd",
        "openssl",
        "containerd",
        "ctr",
        "runc",
        "umoci",
        "skopeo",
        "mmdebstrap",
        "gcc",
    ];
    let missing_tool = tools.iter().find(|t| on_path(t).is_none());
    let missing_binary = ["fs-supervisor", "fsclient", "fsctl", "baton-csi"]
        .into_iter()
        .find(|b| !workspace_binary(b).is_file());
    let (Some(apiserver), Some(controller_manager), Some(kubelet)) =
        (apiserver, controller_manager, kubelet)
    else {
        return Err("no kube-apiserver, kube-controller-manager or kubelet 1.20.2 (run `.ci/build-kubernetes kube-apiserver kube-controller-manager kubelet`)".to_string());
    };
    if let Some(tool) = missing_tool {
        return Err(format!("no {tool} on PATH (apt-get install etcd-server openssl containerd runc umoci skopeo mmdebstrap containernetworking-plugins gcc)"));
    }
    if let Some(binary) = missing_binary {
        return Err(format!("no {binary} beside this program (cargo build -p supervisor --features kubernetes -p fsclient -p fsctl -p baton-csi)"));
    }
    if std::fs::read(workspace_binary("fs-supervisor"))
        .unwrap_or_default()
        .windows(KUBERNETES_MISSING.len())
        .any(|w| w == KUBERNETES_MISSING)
    {
        return Err(format!(
            "{} is built without the kubernetes feature (cargo build -p supervisor --features kubernetes)",
            workspace_binary("fs-supervisor").display()
        ));
    }
    if !Path::new("/usr/lib/cni/loopback").is_file() {
        return Err(
            "no /usr/lib/cni/loopback (apt-get install containernetworking-plugins)".to_string(),
        );
    }
    if !nix::unistd::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        return Err("not root with /dev/fuse".to_string());
    }
    let etcd = on_path("etcd").ok_or("no etcd on PATH (apt-get install etcd-server)")?;
    Ok(Binaries {
        apiserver,
        controller_manager,
        kubelet,
        etcd,
    })
}

/// Polls `f` until it returns `Some`, or panics with `what` and `context()`.
pub async fn eventually<T, F, Fut>(
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Baton image of the workspace binaries beside this program, as a
/// docker-archive in `dir`.
fn baton_image(dir: &Path) -> PathBuf {
    let archive = dir.join("baton.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/build");
    let binaries = workspace_binary("fs-supervisor");
    let out = Command::new(script)
        .args(["--binaries", s(binaries.parent().unwrap())])
        .args(["--output", s(&dir.join("baton-oci"))])
        .args(["--docker-archive", s(&archive)])
        .output()
        .expect("run deploy/image/build");
    assert!(
        out.status.success(),
        "deploy/image/build failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir.join("baton-oci"));
    archive
}

/// The running cluster: dropped, it stops the node (kubelet, containerd,
/// every pod, every mount) and then the API server and etcd.
pub struct OneNode {
    pub node: Node,
    pub cluster: Cluster,
    /// The admin's kubeconfig.
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

impl OneNode {
    /// Builds the images and starts etcd, the API server, containerd,
    /// kube-controller-manager and kubelet, all under `dir`.
    pub fn start(binaries: &Binaries, dir: &Path) -> OneNode {
        node::sweep_stale_runs();
        let began = Instant::now();
        let images = [node::pause_image(dir), baton_image(dir)];
        eprintln!("images built in {:?}", began.elapsed());
        let credentials = dir.join("apiserver");
        std::fs::create_dir_all(&credentials).unwrap();
        let cluster = apiserver::start_cluster(&credentials, &binaries.apiserver, &binaries.etcd);
        let mut node = Node::start_runtime(dir, &images);
        for image in &images {
            let _ = std::fs::remove_file(image);
        }
        let kubeconfig = dir.join("admin.kubeconfig");
        cluster.write_kubeconfig(&kubeconfig, &cluster.admin_token);
        node.start_kubernetes(
            &binaries.controller_manager,
            &binaries.kubelet,
            &kubeconfig,
            &credentials,
        );
        OneNode {
            node,
            cluster,
            kubeconfig,
            dir: dir.to_path_buf(),
        }
    }

    /// The node's and the API server's logs, and the system pods'.
    pub fn logs(&self) -> String {
        format!(
            "{}\n{}\n{}",
            self.node.logs(),
            self.cluster.logs(),
            self.pod_logs_of_system()
        )
    }

    /// The last lines of every container log of the node's system pods.
    fn pod_logs_of_system(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir("/var/log/pods")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().to_string();
            if !name.starts_with(&format!("{SYSTEM}_")) {
                continue;
            }
            for container in std::fs::read_dir(entry.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for log in std::fs::read_dir(container.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    out += &format!(
                        "--- {name}/{}/{} ---\n{}\n",
                        container.file_name().to_string_lossy(),
                        log.file_name().to_string_lossy(),
                        node::tail(&log.path(), 15)
                    );
                }
            }
        }
        out
    }

    /// Waits for the node to be Ready, then applies deploy/kubernetes (the
    /// DaemonSet with fs-supervisor and the node plugin, the controller,
    /// the CSIDriver and StorageClass) and waits for the node plugin's
    /// registration with kubelet, the controller's socket and the volume
    /// `shared` served; binds pending pods to the node until `client`'s
    /// runtime stops.
    pub async fn deploy(&self, client: &Client, began: Instant) {
        let logs = || self.logs();
        let nodes: Api<KubeNode> = Api::all(client.clone());
        eventually("node Ready", START_DEADLINE, logs, || async {
            let node = nodes.get(NODE).await.ok()?;
            node.status?
                .conditions?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")
                .map(|_| ())
        })
        .await;
        eprintln!("node {NODE} ready after {:?}", began.elapsed());
        drop(objects::spawn_binder(client.clone()));
        for object in objects::node_objects(&self.dir, self.cluster.port(), free_port()) {
            objects::apply(client, &object).await;
        }
        objects::apply(
            client,
            &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS}}),
        )
        .await;
        // The node plugin registers itself with kubelet (no registrar).
        let csinodes: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &kube::discovery::ApiResource::from_gvk(&GroupVersionKind::gvk(
                "storage.k8s.io",
                "v1",
                "CSINode",
            )),
        );
        eventually(
            "csi.baton.dev registered in the node's CSINode",
            START_DEADLINE,
            logs,
            || async {
                let csinode = serde_json::to_value(csinodes.get(NODE).await.ok()?).ok()?;
                csinode["spec"]["drivers"]
                    .as_array()?
                    .iter()
                    .find(|d| d["name"] == "csi.baton.dev")
                    .map(|_| ())
            },
        )
        .await;
        eventually("the controller's socket", START_DEADLINE, logs, || async {
            self.dir
                .join("csi-controller/csi.sock")
                .exists()
                .then_some(())
        })
        .await;
        eventually(
            "the volume `shared` mounted by the DaemonSet",
            START_DEADLINE,
            logs,
            || async {
                (self.shared_mounts("shared").first()?["state"] == "serving").then_some(())
            },
        )
        .await;
        eprintln!(
            "driver registered and volume served after {:?}",
            began.elapsed()
        );
    }

    /// The node's fs-supervisor's control socket, from the host.
    pub fn supervisor_socket(&self) -> PathBuf {
        PathBuf::from(objects::host_path(&self.dir, "/run/baton/supervisor.sock"))
    }

    /// `fsctl status --json` of the node's fs-supervisor, from the host.
    pub fn status(&self) -> Option<Value> {
        let out = Command::new(workspace_binary("fsctl"))
            .args(["status", "--json", "--socket", s(&self.supervisor_socket())])
            .output()
            .ok()?;
        out.status.success().then_some(())?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The node's shared mounts of the Baton volume `volume` (`fsctl
    /// status`'s entries).
    pub fn shared_mounts(&self, volume: &str) -> Vec<Value> {
        self.status()
            .and_then(|s| s["mounts"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m["volume"] == volume)
            .collect()
    }

    /// The host pid of the process whose pid in the node pod's namespace
    /// is `pid` and whose program is `program`.
    pub fn host_pid(&self, program: &str, pid: u64) -> Option<i32> {
        self.node.pod_processes(program).into_iter().find(|host| {
            std::fs::read_to_string(format!("/proc/{host}/status"))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("NSpid:"))
                .and_then(|l| l.split_whitespace().last().map(str::to_string))
                .is_some_and(|inner| inner == pid.to_string())
        })
    }

    /// The pod's CSI publication: the device (major:minor) of the mount
    /// under its kubelet volume directory, once there is one.
    pub fn published(&self, pod_uid: &str) -> Option<String> {
        let dir = self.pod_volumes(pod_uid).join("kubernetes.io~csi");
        device_of(mounts_under(&dir).first()?)
    }

    /// The directory of the pod's volumes under kubelet's root.
    pub fn pod_volumes(&self, pod_uid: &str) -> PathBuf {
        self.node
            .kubelet_dir
            .join("pods")
            .join(pod_uid)
            .join("volumes")
    }
}

/// The device (major:minor) of the mount at the host path `path`.
pub fn device_of(path: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&s(path))).then(|| fields[2].to_string())
    })
}
