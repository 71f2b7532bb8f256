//! Tier-1 CSI conformance: every RPC baton-csi serves, driven over its unix
//! socket as kubelet and the external sidecars would, against a real
//! fs-supervisor running real fsclient generations on real FUSE mounts.
//!
//! Modeled on the CSI spec's requirements: a missing required field is
//! InvalidArgument, an unknown volume NotFound, a repeated call succeeds
//! and changes nothing, and a publication whose FUSE server is stalled
//! still unpublishes within a deadline.
//!
//! Needs root and /dev/fuse, and the workspace's binaries in target/debug
//! (`cargo test --workspace` builds them; alone: `cargo build -p supervisor
//! -p fsclient -p fsctl`). The test process never touches a mount itself:
//! file access runs in `timeout sh -c` children, and what is mounted is read
//! from /proc/self/mountinfo. On drop every mount under the fixture's
//! directory is detached, the plugin and supervisor are stopped, and every
//! generation left in the fixture's cgroups is killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use baton_csi::proto::controller_client::ControllerClient;
use baton_csi::proto::identity_client::IdentityClient;
use baton_csi::proto::node_client::NodeClient;
use baton_csi::proto::volume_capability::{AccessType, MountVolume};
use baton_csi::proto::*;
use baton_csi::registration::registration_client::RegistrationClient;
use chaos_tests::mount_guard::wait_until;
use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);

/// Stops `pid` with SIGSTOP and waits until every one of its threads has
/// stopped. The kernel wakes a single thread to begin a group stop; until
/// that thread runs (late, on a busy machine) the others go on, so a FUSE
/// worker could still answer a request sent after kill(2) returned.
fn stop(pid: Pid) {
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    assert!(
        wait_until(DEADLINE, || every_thread_stopped(pid)),
        "process {pid} did not stop within {DEADLINE:?} of SIGSTOP"
    );
}

/// Whether each thread of `pid` is in state T (stopped), from
/// /proc/PID/task/TID/stat; a thread that exits meanwhile counts as stopped.
fn every_thread_stopped(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return true;
        };
        // The state follows the command name's closing parenthesis.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T")
    })
}
static FIXTURES: AtomicU32 = AtomicU32::new(0);

/// A binary of the workspace, next to this test's own target directory.
fn workspace_binary(name: &str) -> PathBuf {
    let path = chaos_tests::mount_guard::workspace_binary(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p supervisor -p fsclient -p fsctl` (cargo test --workspace builds it)",
        path.display()
    );
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn mounted(path: &Path) -> bool {
    let table = baton_csi::mounts::mount_table().expect("mountinfo");
    baton_csi::mounts::mounted_at(&table, path).is_some()
}

/// Runs `script` in a child shell bounded by `timeout(1)`.
fn sh(script: &str) -> Output {
    Command::new("timeout")
        .args(["20", "sh", "-c", script])
        .output()
        .expect("run sh")
}

/// One fs-supervisor with a formatted volume `vol`, and one baton-csi
/// serving node and controller on it.
struct Fixture {
    dir: tempfile::TempDir,
    cgroup_parent: String,
    unmount_grace_s: u64,
    supervisor: Option<Child>,
    csi: Option<Child>,
    rt: tokio::runtime::Runtime,
}

impl Fixture {
    fn start(unmount_grace_s: u64) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().join("base");
        let out = Command::new(workspace_binary("fsctl"))
            .args(["format", "vol", "--base-dir", s(&base)])
            .output()
            .expect("fsctl format");
        assert!(
            out.status.success(),
            "format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cgroup_parent = format!(
            "baton-csi-test-{}-{}",
            std::process::id(),
            FIXTURES.fetch_add(1, Ordering::SeqCst)
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut fx = Fixture {
            dir,
            cgroup_parent,
            unmount_grace_s,
            supervisor: None,
            csi: None,
            rt,
        };
        fx.start_supervisor();
        fx.start_csi();
        fx
    }

    /// Starts baton-csi (again) and waits for its socket.
    fn start_csi(&mut self) {
        let sock = self.path("csi.sock");
        let _ = std::fs::remove_file(&sock);
        let csi = Command::new(env!("CARGO_BIN_EXE_baton-csi"))
            .args(["--node", "--controller", "--node-id", "test-node"])
            .args(["--endpoint", s(&sock)])
            .args([
                "--registration-socket",
                s(&self.path("registry/csi.baton.dev-reg.sock")),
            ])
            .args(["--supervisor-socket", s(&self.path("supervisor.sock"))])
            .args(["--base-dir", s(&self.path("base"))])
            .args(["--mounts-dir", s(&self.path("mounts"))])
            .args(["--unmount-grace-s", &self.unmount_grace_s.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(self.log("csi.log"))
            .spawn()
            .expect("spawn baton-csi");
        self.csi = Some(csi);
        assert!(
            wait_until(DEADLINE, || sock.exists()),
            "baton-csi did not start:\n{}",
            self.logs()
        );
    }

    fn start_supervisor(&mut self) {
        let socket = self.path("supervisor.sock");
        let child = Command::new(workspace_binary("fs-supervisor"))
            .args(["--client-binary", s(&workspace_binary("fsclient"))])
            .args(["--state-dir", s(&self.path("state"))])
            .args(["--socket", s(&socket)])
            .args(["--cgroup-parent", &self.cgroup_parent])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(self.log("supervisor.log"))
            .spawn()
            .expect("spawn fs-supervisor");
        self.supervisor = Some(child);
        assert!(
            wait_until(DEADLINE, || socket.exists()),
            "fs-supervisor did not start:\n{}",
            self.logs()
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(name))
            .expect("log file")
    }

    fn logs(&self) -> String {
        let read = |name| std::fs::read_to_string(self.path(name)).unwrap_or_default();
        format!(
            "--- baton-csi\n{}--- fs-supervisor\n{}",
            read("csi.log"),
            read("supervisor.log")
        )
    }

    fn channel(&self, socket: PathBuf) -> Channel {
        self.rt.block_on(async move {
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
                .expect("connect to baton-csi")
        })
    }

    fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel(self.path("csi.sock")))
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel(self.path("csi.sock")))
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel(self.path("csi.sock")))
    }

    /// The supervisor's mounts (through its control socket, as fsctl does).
    fn supervisor_mounts(&self) -> Vec<upgrade_protocol::MountStatus> {
        let reply = upgrade_protocol::client::request(
            &self.path("supervisor.sock"),
            &upgrade_protocol::Request::Status,
            Duration::from_secs(10),
        )
        .expect("status");
        match reply {
            upgrade_protocol::Reply::Status { report } => report.mounts,
            other => panic!("status answered {other:?}"),
        }
    }

    /// The pids of the supervisor and of every generation it runs.
    fn serving_pids(&self) -> Vec<Pid> {
        let mut pids: Vec<Pid> = self
            .supervisor_mounts()
            .iter()
            .flat_map(|m| [m.pid, m.standby_pid])
            .flatten()
            .map(|pid| Pid::from_raw(pid as i32))
            .collect();
        if let Some(child) = &self.supervisor {
            pids.push(Pid::from_raw(child.id() as i32));
        }
        pids
    }

    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
            .iter()
            .map(|root| Path::new(root).join(&self.cgroup_parent))
            .filter(|dir| dir.is_dir())
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        if let Some(mut csi) = self.csi.take() {
            let _ = csi.kill();
            let _ = csi.wait();
        }
        // Detach every mount under the fixture, top first: never blocks.
        let table = baton_csi::mounts::mount_table().unwrap_or_default();
        for entry in table
            .iter()
            .rev()
            .filter(|e| e.mountpoint.starts_with(self.dir.path()))
        {
            let _ = umount2(&entry.mountpoint, MntFlags::MNT_DETACH);
        }
        if let Some(mut supervisor) = self.supervisor.take() {
            let pid = Pid::from_raw(supervisor.id() as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
            let stopped = wait_until(DEADLINE, || matches!(supervisor.try_wait(), Ok(Some(_))));
            if !stopped {
                let _ = supervisor.kill();
            }
            let _ = supervisor.wait();
        }
        for parent in self.cgroup_dirs() {
            let children = std::fs::read_dir(&parent)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_else(|_| Vec::new());
            for cgroup in children {
                let procs =
                    std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = wait_until(Duration::from_secs(5), || {
                    std::fs::remove_dir(&cgroup).is_ok()
                });
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

fn mount_capability(flags: &[&str]) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
        })),
    })
}

fn publish(volume_id: &str, target: &Path, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.to_string(),
        target_path: target.display().to_string(),
        volume_capability: mount_capability(&[]),
        readonly,
        ..Default::default()
    }
}

fn unpublish(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_string(),
        target_path: target.display().to_string(),
    }
}

fn create(name: &str, volume: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: mount_capability(&[]).into_iter().collect(),
        parameters: [("volume".to_string(), volume.to_string())].into(),
        ..Default::default()
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> Code {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(status) => status.code(),
    }
}

#[test]
fn identity_reports_the_driver_and_probe_follows_the_supervisor() {
    let mut fx = Fixture::start(300);
    let mut identity = fx.identity();
    let info = fx
        .rt
        .block_on(identity.get_plugin_info(GetPluginInfoRequest {}))
        .expect("info")
        .into_inner();
    assert_eq!(info.name, "csi.baton.dev");
    assert!(!info.vendor_version.is_empty());
    let caps = fx
        .rt
        .block_on(identity.get_plugin_capabilities(GetPluginCapabilitiesRequest {}))
        .expect("caps")
        .into_inner();
    let controller = plugin_capability::Type::Service(plugin_capability::Service {
        r#type: plugin_capability::service::Type::ControllerService as i32,
    });
    assert!(
        caps.capabilities
            .iter()
            .any(|c| c.r#type == Some(controller)),
        "{caps:?}"
    );
    let ready = fx
        .rt
        .block_on(identity.probe(ProbeRequest {}))
        .expect("probe while the supervisor answers");
    assert_eq!(ready.into_inner().ready, Some(true));

    // The node: its id, and the capabilities kubelet looks for.
    let mut node = fx.node();
    let info = fx
        .rt
        .block_on(node.node_get_info(NodeGetInfoRequest {}))
        .expect("NodeGetInfo")
        .into_inner();
    assert_eq!(info.node_id, "test-node");
    let caps = fx
        .rt
        .block_on(node.node_get_capabilities(NodeGetCapabilitiesRequest {}))
        .expect("NodeGetCapabilities")
        .into_inner();
    use node_service_capability::rpc::Type as NodeCap;
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|node_service_capability::Type::Rpc(rpc)| rpc.r#type)
        .collect();
    for wanted in [NodeCap::GetVolumeStats, NodeCap::VolumeCondition] {
        assert!(
            rpcs.contains(&(wanted as i32)),
            "{wanted:?} missing: {caps:?}"
        );
    }
    // No staging: kubelet must call NodePublishVolume directly.
    assert!(
        !rpcs.contains(&(NodeCap::StageUnstageVolume as i32)),
        "{caps:?}"
    );

    // kubelet's plugin watcher: GetInfo names the driver and its socket.
    let mut registration =
        RegistrationClient::new(fx.channel(fx.path("registry/csi.baton.dev-reg.sock")));
    let plugin = fx
        .rt
        .block_on(registration.get_info(baton_csi::registration::InfoRequest {}))
        .expect("GetInfo")
        .into_inner();
    assert_eq!(
        (plugin.r#type.as_str(), plugin.name.as_str()),
        ("CSIPlugin", "csi.baton.dev")
    );
    assert_eq!(plugin.endpoint, fx.path("csi.sock").display().to_string());
    assert!(plugin.supported_versions.contains(&"1.0.0".to_string()));
    let status = baton_csi::registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    fx.rt
        .block_on(registration.notify_registration_status(status))
        .expect("NotifyRegistrationStatus");

    // The supervisor stops: the probe fails, and recovers with it.
    let mut supervisor = fx.supervisor.take().expect("supervisor");
    kill(Pid::from_raw(supervisor.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    supervisor.wait().expect("wait for fs-supervisor");
    let probe = fx.rt.block_on(identity.probe(ProbeRequest {}));
    assert_eq!(code(probe), Code::FailedPrecondition);
    fx.start_supervisor();
    assert!(wait_until(DEADLINE, || fx
        .rt
        .block_on(identity.probe(ProbeRequest {}))
        .is_ok()));
}

#[test]
fn calls_without_required_fields_are_invalid_arguments() {
    let fx = Fixture::start(300);
    let target = fx.path("kubelet/pod-a/mount");
    let mut node = fx.node();
    let rt = &fx.rt;
    let valid = publish("vol#pvc-a", &target, false);
    let no_id = NodePublishVolumeRequest {
        volume_id: String::new(),
        ..valid.clone()
    };
    let no_target = NodePublishVolumeRequest {
        target_path: String::new(),
        ..valid.clone()
    };
    let no_cap = NodePublishVolumeRequest {
        volume_capability: None,
        ..valid.clone()
    };
    let block = NodePublishVolumeRequest {
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(volume_capability::BlockVolume {})),
            ..mount_capability(&[]).expect("capability")
        }),
        ..valid.clone()
    };
    let bad_flag = NodePublishVolumeRequest {
        volume_capability: mount_capability(&["sync"]),
        ..valid.clone()
    };
    for req in [no_id, no_target, no_cap, block, bad_flag] {
        assert_eq!(
            code(rt.block_on(node.node_publish_volume(req.clone()))),
            Code::InvalidArgument,
            "{req:?}"
        );
    }
    assert!(!target.exists(), "an invalid publish created the target");
    let unpub = [
        unpublish("", &target),
        unpublish("vol#pvc-a", Path::new("")),
    ];
    for req in unpub {
        assert_eq!(
            code(rt.block_on(node.node_unpublish_volume(req))),
            Code::InvalidArgument
        );
    }
    for (id, path) in [("", "/x"), ("vol", "")] {
        let req = NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.into(),
            staging_target_path: String::new(),
        };
        assert_eq!(
            code(rt.block_on(node.node_get_volume_stats(req))),
            Code::InvalidArgument
        );
    }

    let mut controller = fx.controller();
    let no_name = CreateVolumeRequest {
        name: String::new(),
        ..create("pvc-a", "vol", 1)
    };
    let no_caps = CreateVolumeRequest {
        volume_capabilities: Vec::new(),
        ..create("pvc-a", "vol", 1)
    };
    let no_volume = CreateVolumeRequest {
        parameters: Default::default(),
        ..create("pvc-a", "vol", 1)
    };
    let mut plain_secret = create("pvc-a", "vol", 1);
    plain_secret
        .parameters
        .insert("encryptionPassphrase".into(), "hunter2".into());
    for req in [no_name, no_caps, no_volume, plain_secret] {
        let status = rt
            .block_on(controller.create_volume(req.clone()))
            .expect_err("invalid create");
        assert_eq!(status.code(), Code::InvalidArgument, "{req:?}");
        assert!(
            !status.message().contains("hunter2"),
            "a secret reached an error: {status:?}"
        );
    }
    let delete = DeleteVolumeRequest {
        volume_id: String::new(),
        secrets: Default::default(),
    };
    assert_eq!(
        code(rt.block_on(controller.delete_volume(delete))),
        Code::InvalidArgument
    );
    let expand = ControllerExpandVolumeRequest {
        volume_id: "vol#pvc-a".into(),
        ..Default::default()
    };
    assert_eq!(
        code(rt.block_on(controller.controller_expand_volume(expand))),
        Code::InvalidArgument
    );
    let validate = ValidateVolumeCapabilitiesRequest {
        volume_id: "vol".into(),
        ..Default::default()
    };
    assert_eq!(
        code(rt.block_on(controller.validate_volume_capabilities(validate))),
        Code::InvalidArgument
    );
    assert!(!fx.logs().contains("hunter2"), "a secret reached a log");
}

#[test]
fn publish_binds_the_pvc_directory_and_repeated_calls_change_nothing() {
    let fx = Fixture::start(1);
    let rt = &fx.rt;
    let mut controller = fx.controller();
    let volume = rt
        .block_on(controller.create_volume(create("pvc-a", "vol", 1 << 30)))
        .expect("create")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(
        (volume.volume_id.as_str(), volume.capacity_bytes),
        ("vol#pvc-a", 1 << 30)
    );

    let mut node = fx.node();
    let (pod_a, pod_b, pod_ro) = (
        fx.path("kubelet/a/mount"),
        fx.path("kubelet/b/mount"),
        fx.path("kubelet/ro/mount"),
    );
    for _ in 0..2 {
        rt.block_on(node.node_publish_volume(publish("vol#pvc-a", &pod_a, false)))
            .expect("publish (again)");
    }
    rt.block_on(node.node_publish_volume(publish("vol#pvc-a", &pod_b, false)))
        .expect("publish to a second pod");
    rt.block_on(node.node_publish_volume(publish("vol#pvc-a", &pod_ro, true)))
        .expect("publish read-only");
    assert_eq!(
        fx.supervisor_mounts().len(),
        1,
        "one supervised mount per volume per node"
    );

    // Written by one pod, read by another and found in the PVC's directory
    // of the volume's shared mount.
    let shared = fx.path("mounts/vol/pvc-a");
    let out = sh(&format!(
        "echo hello > {a}/f && cat {b}/f && cat {shared}/f && cat {ro}/f",
        a = s(&pod_a),
        b = s(&pod_b),
        shared = s(&shared),
        ro = s(&pod_ro)
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n".repeat(3));
    let write_ro = sh(&format!("echo no > {}/g", s(&pod_ro)));
    assert!(
        !write_ro.status.success(),
        "a read-only publication took a write"
    );
    assert!(
        String::from_utf8_lossy(&write_ro.stderr).contains("Read-only"),
        "{write_ro:?}"
    );
    let other_mode = rt.block_on(node.node_publish_volume(publish("vol#pvc-a", &pod_ro, false)));
    assert_eq!(code(other_mode), Code::AlreadyExists);
    // Mount options (a StorageClass's mountOptions) apply, and a repeat of
    // the same publish is still a no-op.
    let pod_opts = fx.path("kubelet/opts/mount");
    let with_opts = NodePublishVolumeRequest {
        volume_capability: mount_capability(&["ro", "nosuid", "noexec"]),
        ..publish("vol#pvc-a", &pod_opts, false)
    };
    for _ in 0..2 {
        rt.block_on(node.node_publish_volume(with_opts.clone()))
            .expect("publish with mount options (again)");
    }
    let table = baton_csi::mounts::mount_table().expect("mountinfo");
    let entry = baton_csi::mounts::mounted_at(&table, &pod_opts).expect("mounted");
    for option in ["ro", "nosuid", "noexec"] {
        assert!(entry.options.iter().any(|o| o == option), "{entry:?}");
    }
    assert_eq!(table.iter().filter(|e| e.mountpoint == pod_opts).count(), 1);
    rt.block_on(node.node_unpublish_volume(unpublish("vol#pvc-a", &pod_opts)))
        .expect("unpublish");
    // A reader-only access mode (ReadOnlyMany) is read-only by itself.
    let pod_rox = fx.path("kubelet/rox/mount");
    let mut rox = publish("vol#pvc-a", &pod_rox, false);
    if let Some(mode) = rox
        .volume_capability
        .as_mut()
        .and_then(|c| c.access_mode.as_mut())
    {
        mode.mode = volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32;
    }
    rt.block_on(node.node_publish_volume(rox))
        .expect("publish ReadOnlyMany");
    let write_rox = sh(&format!("cat {t}/f && echo no > {t}/g", t = s(&pod_rox)));
    assert_eq!(String::from_utf8_lossy(&write_rox.stdout), "hello\n");
    assert!(
        !write_rox.status.success(),
        "a ReadOnlyMany publication took a write"
    );
    rt.block_on(node.node_unpublish_volume(unpublish("vol#pvc-a", &pod_rox)))
        .expect("unpublish");

    let stats = NodeGetVolumeStatsRequest {
        volume_id: "vol#pvc-a".into(),
        volume_path: s(&pod_a).into(),
        staging_target_path: String::new(),
    };
    let stats = rt
        .block_on(node.node_get_volume_stats(stats))
        .expect("stats")
        .into_inner();
    assert_eq!(
        stats.volume_condition.as_ref().map(|c| c.abnormal),
        Some(false),
        "{stats:?}"
    );
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes");
    assert!(
        bytes.total > 0 && bytes.available <= bytes.total,
        "{stats:?}"
    );
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == volume_usage::Unit::Inodes as i32),
        "{stats:?}"
    );
    let unknown = NodeGetVolumeStatsRequest {
        volume_id: "vol#pvc-a".into(),
        volume_path: s(&fx.path("kubelet/none")).into(),
        staging_target_path: String::new(),
    };
    assert_eq!(
        code(rt.block_on(node.node_get_volume_stats(unknown))),
        Code::NotFound
    );

    for target in [&pod_a, &pod_b, &pod_ro] {
        for _ in 0..2 {
            rt.block_on(node.node_unpublish_volume(unpublish("vol#pvc-a", target)))
                .expect("unpublish (again)");
        }
        assert!(!mounted(target), "{} is still mounted", target.display());
        assert!(!target.exists(), "{} was not removed", target.display());
    }
    // No publication left: after the grace period the shared mount goes.
    assert!(
        wait_until(DEADLINE, || fx.supervisor_mounts().is_empty()),
        "the idle shared mount stayed:\n{}",
        fx.logs()
    );
    assert!(!mounted(&fx.path("mounts/vol")));
}

#[test]
fn a_stalled_publication_reports_abnormal_and_still_unpublishes_within_the_deadline() {
    let fx = Fixture::start(300);
    let rt = &fx.rt;
    let mut node = fx.node();
    let target = fx.path("kubelet/a/mount");
    rt.block_on(node.node_publish_volume(publish("vol", &target, false)))
        .expect("publish the whole volume");
    let stats = NodeGetVolumeStatsRequest {
        volume_id: "vol".into(),
        volume_path: s(&target).into(),
        staging_target_path: String::new(),
    };
    let condition = |node: &mut NodeClient<Channel>| {
        let stats = rt.block_on(node.node_get_volume_stats(stats.clone()));
        stats
            .expect("stats")
            .into_inner()
            .volume_condition
            .expect("a condition")
    };
    // The generations stop; the supervisor still says "serving": a statvfs
    // through the mount would hang, and gives up at its deadline.
    let pids = fx.serving_pids();
    let (supervisor, generations) = pids.split_last().expect("the supervisor's pid");
    for pid in generations {
        stop(*pid);
    }
    let stalled = condition(&mut node);
    assert!(stalled.abnormal, "{stalled:?}");
    assert!(
        stalled.message.contains("did not finish within"),
        "{stalled:?}"
    );
    // The supervisor stops too: stats say it does not answer.
    stop(*supervisor);
    let unanswered = condition(&mut node);
    assert!(unanswered.abnormal, "{unanswered:?}");
    assert!(
        unanswered.message.contains("fs-supervisor did not answer"),
        "{unanswered:?}"
    );

    let mut req = tonic::Request::new(unpublish("vol", &target));
    req.set_timeout(Duration::from_secs(20));
    rt.block_on(node.node_unpublish_volume(req))
        .expect("unpublish of a stalled mount");
    assert!(!mounted(&target));
    for pid in &pids {
        let _ = kill(*pid, Signal::SIGCONT);
    }
}

#[test]
fn a_volume_the_supervisor_cannot_mount_fails_with_a_retryable_status_that_says_why() {
    let fx = Fixture::start(300);
    let mut node = fx.node();
    let target = fx.path("kubelet/a/mount");
    let status = fx
        .rt
        .block_on(node.node_publish_volume(publish("missing#pvc-a", &target, false)))
        .expect_err("publish of an unformatted volume");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("missing"), "{status:?}");
    assert!(!mounted(&target));
    let bad_handle =
        fx.rt
            .block_on(node.node_publish_volume(publish("vol#../etc", &target, false)));
    assert_eq!(code(bad_handle), Code::InvalidArgument);
}

#[test]
fn controller_provisions_expands_validates_and_deletes_idempotently() {
    let fx = Fixture::start(300);
    let rt = &fx.rt;
    let mut controller = fx.controller();
    let caps = rt
        .block_on(controller.controller_get_capabilities(ControllerGetCapabilitiesRequest {}))
        .expect("caps")
        .into_inner();
    assert_eq!(caps.capabilities.len(), 2, "{caps:?}");

    let first = rt
        .block_on(controller.create_volume(create("pvc-b", "vol", 1 << 20)))
        .expect("create")
        .into_inner();
    // The same call again, with a secret from a StorageClass's secret
    // reference: accepted, and never written or logged (checked below).
    let with_secret = CreateVolumeRequest {
        secrets: [("passphrase".to_string(), "s3cr3t-value".to_string())].into(),
        ..create("pvc-b", "vol", 1 << 20)
    };
    let again = rt
        .block_on(controller.create_volume(with_secret))
        .expect("create again")
        .into_inner();
    assert_eq!(first, again);
    assert_eq!(
        code(rt.block_on(controller.create_volume(create("pvc-b", "vol", 2 << 20)))),
        Code::AlreadyExists
    );
    let pvc = fx.path("mounts/vol/pvc-b");
    assert!(
        sh(&format!("test -d {}", s(&pvc))).status.success(),
        "no PVC directory in the volume"
    );
    // The capacity is the directory's quota: df inside it says so.
    let quota_bytes = || {
        let out = Command::new(workspace_binary("fsctl"))
            .args(["quota", "get", "/pvc-b", "--json", "--volume", "vol"])
            .args(["--base-dir", s(&fx.path("base"))])
            .output()
            .expect("fsctl quota get");
        let quota: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!("fsctl quota get: {}", String::from_utf8_lossy(&out.stderr))
        });
        quota["bytes_max"].as_u64()
    };
    assert_eq!(quota_bytes(), Some(1 << 20));
    let df = sh(&format!("df -B1 --output=size {} | tail -1", s(&pvc)));
    assert_eq!(
        String::from_utf8_lossy(&df.stdout).trim(),
        (1u64 << 20).to_string(),
        "df in the PVC directory shows its capacity"
    );

    let expand = |id: &str, bytes| ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = rt
        .block_on(controller.controller_expand_volume(expand("vol#pvc-b", 4 << 20)))
        .expect("expand")
        .into_inner();
    assert_eq!(
        (grown.capacity_bytes, grown.node_expansion_required),
        (4 << 20, false)
    );
    assert_eq!(quota_bytes(), Some(4 << 20), "expanded without a remount");
    // The new capacity is what a repeated create now finds recorded.
    assert_eq!(
        code(rt.block_on(controller.create_volume(create("pvc-b", "vol", 1 << 20)))),
        Code::AlreadyExists
    );
    rt.block_on(controller.create_volume(create("pvc-b", "vol", 4 << 20)))
        .expect("create at the expanded size");
    assert_eq!(
        code(rt.block_on(controller.controller_expand_volume(expand("vol#pvc-none", 1)))),
        Code::NotFound
    );

    let validate = |id: &str| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: mount_capability(&[]).into_iter().collect(),
        ..Default::default()
    };
    let confirmed = rt
        .block_on(controller.validate_volume_capabilities(validate("vol#pvc-b")))
        .expect("validate")
        .into_inner();
    assert!(confirmed.confirmed.is_some(), "{confirmed:?}");
    assert_eq!(
        code(rt.block_on(controller.validate_volume_capabilities(validate("vol#pvc-none")))),
        Code::NotFound
    );

    // Static provisioning: the whole volume mounts as is and shows the PVC.
    let mut node = fx.node();
    let target = fx.path("kubelet/static/mount");
    rt.block_on(node.node_publish_volume(publish("vol", &target, false)))
        .expect("publish a static volume");
    assert!(sh(&format!("test -d {}/pvc-b", s(&target)))
        .status
        .success());
    rt.block_on(node.node_unpublish_volume(unpublish("vol", &target)))
        .expect("unpublish");

    let grep = sh(&format!(
        "grep -r s3cr3t-value {} {} {}",
        s(&fx.path("mounts/vol")),
        s(&fx.path("state")),
        s(&fx.path("csi.log"))
    ));
    assert_eq!(
        grep.status.code(),
        Some(1),
        "a secret was written or logged: {grep:?}"
    );
    let delete = DeleteVolumeRequest {
        volume_id: "vol#pvc-b".into(),
        secrets: Default::default(),
    };
    for _ in 0..2 {
        rt.block_on(controller.delete_volume(delete.clone()))
            .expect("delete (again)");
    }
    let gone = sh(&format!("test ! -e {}", s(&pvc)));
    assert!(
        gone.status.success(),
        "the PVC directory outlived DeleteVolume"
    );
    assert_eq!(
        code(rt.block_on(controller.validate_volume_capabilities(validate("vol#pvc-b")))),
        Code::NotFound
    );
}

#[test]
fn a_volume_the_administrator_mounted_is_shared_and_never_reaped() {
    let fx = Fixture::start(1);
    let rt = &fx.rt;
    let base = fx.path("base");
    let out = Command::new(workspace_binary("fsctl"))
        .args(["format", "vol2", "--base-dir", s(&base)])
        .output()
        .expect("fsctl format");
    assert!(
        out.status.success(),
        "format: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `vol` is mounted by hand (as the DaemonSet's volumes container does).
    let admin = fx.path("admin/vol");
    std::fs::create_dir_all(&admin).expect("mountpoint");
    let mount = upgrade_protocol::Request::Mount {
        volume: "vol".into(),
        mountpoint: admin.clone(),
        base_dir: base.clone(),
        options: Default::default(),
        persist: false,
    };
    let reply = upgrade_protocol::client::request(
        &fx.path("supervisor.sock"),
        &mount,
        Duration::from_secs(90),
    )
    .expect("mount");
    assert!(
        matches!(reply, upgrade_protocol::Reply::Mounted { .. }),
        "{reply:?}"
    );

    let mut node = fx.node();
    let (a, b) = (fx.path("kubelet/a/mount"), fx.path("kubelet/b/mount"));
    rt.block_on(node.node_publish_volume(publish("vol#pvc-a", &a, false)))
        .expect("publish vol");
    rt.block_on(node.node_publish_volume(publish("vol2#pvc-b", &b, false)))
        .expect("publish vol2");
    let out = sh(&format!(
        "echo x > {}/f && cat {}/pvc-a/f",
        s(&a),
        s(&admin)
    ));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n", "{out:?}");
    let volumes = |fx: &Fixture| -> Vec<String> {
        fx.supervisor_mounts()
            .into_iter()
            .map(|m| m.volume)
            .collect()
    };
    assert_eq!(volumes(&fx).len(), 2, "vol was mounted a second time");
    for (id, target) in [("vol#pvc-a", &a), ("vol2#pvc-b", &b)] {
        rt.block_on(node.node_unpublish_volume(unpublish(id, target)))
            .expect("unpublish");
    }
    // The plugin's own mount of vol2 is reaped; the administrator's stays.
    assert!(
        wait_until(DEADLINE, || volumes(&fx) == ["vol"]),
        "{:?}\n{}",
        volumes(&fx),
        fx.logs()
    );
    assert!(mounted(&admin));
}

#[test]
fn a_crash_of_the_plugin_changes_nothing_for_running_pods() {
    let mut fx = Fixture::start(300);
    let target = fx.path("kubelet/a/mount");
    let mut node = fx.node();
    fx.rt
        .block_on(node.node_publish_volume(publish("vol#pvc-a", &target, false)))
        .expect("publish");
    let out = sh(&format!("echo before > {}/f", s(&target)));
    assert!(out.status.success(), "{out:?}");

    let mut csi = fx.csi.take().expect("baton-csi");
    csi.kill().expect("SIGKILL baton-csi");
    csi.wait().expect("reap baton-csi");
    // The pod's mount serves on without the plugin.
    let out = sh(&format!(
        "cat {t}/f && echo after >> {t}/f && cat {t}/f",
        t = s(&target)
    ));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "before\nbefore\nafter\n",
        "{out:?}"
    );

    // A new plugin finds the publication in the mount table: the same
    // publish is a no-op and the unpublish detaches it.
    fx.start_csi();
    let mut node = fx.node();
    fx.rt
        .block_on(node.node_publish_volume(publish("vol#pvc-a", &target, false)))
        .expect("the same publish after a restart");
    let table = baton_csi::mounts::mount_table().expect("mountinfo");
    let stacked = table.iter().filter(|e| e.mountpoint == target).count();
    assert_eq!(stacked, 1, "a repeated publish stacked another mount");
    fx.rt
        .block_on(node.node_unpublish_volume(unpublish("vol#pvc-a", &target)))
        .expect("unpublish after a restart");
    assert!(!mounted(&target));
    let out = sh(&format!("cat {}/pvc-a/f", s(&fx.path("mounts/vol"))));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "before\nafter\n",
        "{out:?}"
    );
}

#[test]
fn concurrent_first_uses_of_a_volume_share_one_mount() {
    let fx = Fixture::start(300);
    let node = fx.node();
    let controller = fx.controller();
    let targets: Vec<PathBuf> = (0..4)
        .map(|i| fx.path(&format!("kubelet/{i}/mount")))
        .collect();
    let results = fx.rt.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for (i, target) in targets.iter().enumerate() {
            let mut node = node.clone();
            let req = publish(&format!("vol#pvc-{i}"), target, false);
            calls.spawn(async move { node.node_publish_volume(req).await.map(|_| ()) });
            let mut controller = controller.clone();
            let req = create(&format!("pvc-c{i}"), "vol", 1);
            calls.spawn(async move { controller.create_volume(req).await.map(|_| ()) });
        }
        calls.join_all().await
    });
    for result in results {
        result.expect("a concurrent first publish or create");
    }
    assert_eq!(
        fx.supervisor_mounts().len(),
        1,
        "vol was mounted more than once"
    );
    let mut node = fx.node();
    for (i, target) in targets.iter().enumerate() {
        fx.rt
            .block_on(node.node_unpublish_volume(unpublish(&format!("vol#pvc-{i}"), target)))
            .expect("unpublish");
    }
}

#[test]
fn stats_report_a_recovering_mount_as_abnormal_until_it_serves_again() {
    let fx = Fixture::start(300);
    let target = fx.path("kubelet/a/mount");
    let mut node = fx.node();
    fx.rt
        .block_on(node.node_publish_volume(publish("vol#pvc-a", &target, false)))
        .expect("publish");
    let mut condition = || {
        let req = NodeGetVolumeStatsRequest {
            volume_id: "vol#pvc-a".into(),
            volume_path: s(&target).into(),
            staging_target_path: String::new(),
        };
        let stats = fx
            .rt
            .block_on(node.node_get_volume_stats(req))
            .expect("stats");
        stats.into_inner().volume_condition.expect("a condition")
    };
    assert!(!condition().abnormal);
    let serving = || {
        fx.supervisor_mounts()
            .into_iter()
            .next()
            .expect("the mount")
    };
    assert!(
        wait_until(DEADLINE, || serving().standby_pid.is_some()),
        "no warm standby:\n{}",
        fx.logs()
    );
    let mount = serving();
    let standby = Pid::from_raw(mount.standby_pid.expect("standby") as i32);
    let active = Pid::from_raw(mount.pid.expect("serving pid") as i32);
    // The standby cannot adopt while stopped: the mount stays recovering.
    stop(standby);
    kill(active, Signal::SIGKILL).expect("SIGKILL the serving generation");
    // Once the supervisor knows (adopting), stats say so without a statvfs.
    let recovering = wait_until(DEADLINE, || serving().state != "serving");
    let during = condition();
    let _ = kill(standby, Signal::SIGCONT);
    assert!(
        recovering,
        "the supervisor never saw the death:\n{}",
        fx.logs()
    );
    assert!(during.abnormal, "{during:?}");
    assert!(
        during.message.contains("recovering") && during.message.contains("vol"),
        "{during:?}"
    );
    assert!(
        wait_until(DEADLINE, || !condition().abnormal),
        "still abnormal once a generation serves again:\n{}",
        fx.logs()
    );
    let out = sh(&format!("echo ok > {t}/f && cat {t}/f", t = s(&target)));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{out:?}");
    fx.rt
        .block_on(node.node_unpublish_volume(unpublish("vol#pvc-a", &target)))
        .expect("unpublish");
}
