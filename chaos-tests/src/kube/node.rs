//! The node of the one-node cluster: a private containerd (its own root,
//! state, socket and runc root in the test's directory, CRI with
//! `restrict_oom_score_adj`: this machine lacks CAP_SYS_RESOURCE), the
//! pause and Baton images imported with `ctr`, kube-controller-manager and
//! kubelet 1.20.2 (own root dir, own cgroup root, no iptables chains, no
//! eviction). Everything it started is killed on drop, every mount under
//! the test's directory is detached, the cgroups are removed, the kernel
//! settings kubelet changes are put back, and the pod logs kubelet wrote
//! to /var/log/pods are removed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::apiserver::{free_port, run, s};

/// The node's name (kubelet's --hostname-override).
pub const NODE: &str = "baton-e2e-node";
/// The pause image every pod sandbox runs (made by [`pause_image`]).
pub const PAUSE_IMAGE: &str = "baton.test/pause:1";

/// The kernel settings kubelet 1.20 sets at start
/// (`--protect-kernel-defaults=false`), put back on drop.
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// A daemon in its own process group, killed (the whole group) on drop.
pub struct Daemon {
    pub child: std::process::Child,
}

impl Daemon {
    pub fn spawn(command: &mut Command, log: &Path) -> Daemon {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Daemon { child }
    }

    fn stop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pids of every process whose command line mentions `needle`.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// The v1 hierarchies (and the v2 `unified` one) under /sys/fs/cgroup.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect()
}

/// Every process in the cgroup tree `dir`.
fn procs_in_tree(dir: &Path, out: &mut Vec<i32>) {
    let text = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            procs_in_tree(&entry.path(), out);
        }
    }
}

fn rmdir_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Mount points at or under `dir` (this namespace), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().to_string();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| *p == prefix || p.starts_with(&format!("{prefix}/")))
        .map(PathBuf::from)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Writes the pause program (C, static) and packs it as the image
/// [`PAUSE_IMAGE`] in a docker-archive at `dir/pause.tar`, with umoci and
/// skopeo as deploy/image/build packs Baton's.
pub fn pause_image(dir: &Path) -> PathBuf {
    let work = dir.join("pause-image");
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::write(
        work.join("pause.c"),
        "#include <signal.h>\n#include <unistd.h>\n#include <sys/wait.h>\n\
         static void stop(int sig) { (void)sig; _exit(0); }\n\
         static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }\n\
         int main(void) { signal(SIGINT, stop); signal(SIGTERM, stop); signal(SIGCHLD, reap);\n\
         for (;;) pause(); }\n",
    )
    .unwrap();
    run(Command::new("gcc").args([
        "-static",
        "-O2",
        "-o",
        s(&rootfs.join("pause")),
        s(&work.join("pause.c")),
    ]));
    let layer = work.join("layer.tar");
    run(Command::new("tar")
        .args(["--create", "--file", s(&layer), "--directory", s(&rootfs)])
        .args(["--owner=0", "--group=0", "./pause"]));
    let layout = work.join("oci");
    let image = format!("{}:1", s(&layout));
    run(Command::new("umoci").args(["init", "--layout", s(&layout)]));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci").args(["raw", "add-layer", "--image", &image, s(&layer)]));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.entrypoint",
        "/pause",
        "--architecture",
        "amd64",
        "--os",
        "linux",
    ]));
    let archive = dir.join("pause.tar");
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        "--insecure-policy",
        &format!("oci:{image}"),
        &format!("docker-archive:{}:{PAUSE_IMAGE}", s(&archive)),
    ]));
    archive
}

/// containerd, kube-controller-manager and kubelet of the one node.
pub struct Node {
    pub dir: PathBuf,
    pub kubelet_dir: PathBuf,
    pub cgroup_root: String,
    containerd_socket: PathBuf,
    sysctls: Vec<(PathBuf, String)>,
    log_dirs_existed: (bool, bool),
    started: std::time::SystemTime,
    kubelet: Option<Daemon>,
    controller_manager: Option<Daemon>,
    containerd: Option<Daemon>,
}

impl Node {
    /// Starts containerd and imports `images` into its `k8s.io` namespace.
    pub fn start_runtime(dir: &Path, images: &[PathBuf]) -> Node {
        let cgroup_root = format!("baton-e2e-{}", std::process::id());
        let sysctls: Vec<(PathBuf, String)> = KUBELET_SYSCTLS
            .iter()
            .map(|name| {
                let path = Path::new("/proc/sys").join(name);
                let value = std::fs::read_to_string(&path).unwrap_or_default();
                (path, value.trim().to_string())
            })
            .collect();
        // For sweep_stale_runs, should this process die without its drop.
        let saved: String = sysctls
            .iter()
            .map(|(path, value)| format!("{}\t{value}\n", s(path)))
            .collect();
        std::fs::write(dir.join(SYSCTLS_FILE), saved).unwrap();
        let mut node = Node {
            dir: dir.to_path_buf(),
            kubelet_dir: dir.join("kubelet"),
            cgroup_root,
            containerd_socket: dir.join("containerd.sock"),
            sysctls,
            log_dirs_existed: (
                Path::new("/var/log/pods").exists(),
                Path::new("/var/log/containers").exists(),
            ),
            started: std::time::SystemTime::now(),
            kubelet: None,
            controller_manager: None,
            containerd: None,
        };
        // Bidirectional propagation needs a shared mount under the hostPaths
        // (and containerd makes the rootfs rshared for them): the test's
        // directory becomes a shared mount of its own.
        run(Command::new("mount").args(["--bind", s(dir), s(dir)]));
        run(Command::new("mount").args(["--make-rshared", s(dir)]));
        let cni = dir.join("cni");
        std::fs::create_dir_all(&cni).unwrap();
        // Every pod of the test is host-network; a valid network config is
        // what makes the runtime (and so the node) report the network ready.
        std::fs::write(
            cni.join("10-baton-e2e.conflist"),
            r#"{"cniVersion": "0.4.0", "name": "baton-e2e", "plugins": [{"type": "loopback"}]}"#,
        )
        .unwrap();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = s(&dir.join("containerd/root")),
            state = s(&dir.join("containerd/state")),
            socket = s(&node.containerd_socket),
            opt = s(&dir.join("containerd/opt")),
            pause = PAUSE_IMAGE,
            runc = s(&dir.join("runc")),
            cni = s(&cni),
        );
        let config_path = dir.join("containerd.toml");
        std::fs::write(&config_path, config).unwrap();
        node.containerd = Some(Daemon::spawn(
            Command::new("containerd").args(["--config", s(&config_path)]),
            &dir.join("containerd.log"),
        ));
        let end = Instant::now() + Duration::from_secs(60);
        while !ctr(&node.containerd_socket, &["version"]).status.success() {
            assert!(
                Instant::now() < end,
                "containerd did not answer within 60 s:\n{}",
                tail(&dir.join("containerd.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        for image in images {
            let out = ctr(&node.containerd_socket, &["images", "import", s(image)]);
            assert!(
                out.status.success(),
                "ctr images import {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        node
    }

    /// Tags the imported image whose name contains `name` (e.g.
    /// `baton/baton:`) as `to` too: a "new" image for an update.
    pub fn tag_image(&self, name: &str, to: &str) {
        let out = ctr(&self.containerd_socket, &["images", "ls", "-q"]);
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let from = listing
            .lines()
            .find(|l| l.contains(name) && !l.starts_with("sha256:"))
            .unwrap_or_else(|| panic!("no image {name} in:\n{listing}"));
        let out = ctr(&self.containerd_socket, &["images", "tag", from, to]);
        assert!(
            out.status.success(),
            "ctr images tag {from} {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// kube-controller-manager and kubelet, both with the admin kubeconfig.
    pub fn start_kubernetes(
        &mut self,
        controller_manager: &Path,
        kubelet: &Path,
        kubeconfig: &Path,
        credentials: &Path,
    ) {
        let dir = self.dir.clone();
        self.controller_manager = Some(Daemon::spawn(
            Command::new(controller_manager)
                .arg(format!("--kubeconfig={}", s(kubeconfig)))
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()))
                .arg("--port=0")
                .arg(format!("--cert-dir={}", s(&dir.join("kcm-certs"))))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    s(&credentials.join("sa.key"))
                ))
                .arg(format!("--root-ca-file={}", s(&credentials.join("ca.crt"))))
                .arg("--use-service-account-credentials=false")
                .arg("--controllers=*,-csrsigning,-csrapproving,-csrcleaner,-nodeipam,-cloud-node-lifecycle,-route,-service")
                .arg("--v=1"),
            &dir.join("kube-controller-manager.log"),
        ));
        self.make_cgroup_root();
        let kubelet_dir = self.kubelet_dir.clone();
        std::fs::create_dir_all(&kubelet_dir).unwrap();
        self.kubelet = Some(Daemon::spawn(
            Command::new(kubelet)
                .arg(format!("--kubeconfig={}", s(kubeconfig)))
                .arg(format!("--root-dir={}", s(&kubelet_dir)))
                .arg(format!("--cert-dir={}", s(&dir.join("kubelet-pki"))))
                .arg(format!(
                    "--volume-plugin-dir={}",
                    s(&dir.join("flexvolume"))
                ))
                .arg(format!("--hostname-override={NODE}"))
                .arg("--node-ip=127.0.0.1")
                .arg("--address=127.0.0.1")
                .arg(format!("--port={}", free_port()))
                .arg("--read-only-port=0")
                .arg("--healthz-port=0")
                .arg("--container-runtime=remote")
                .arg(format!(
                    "--container-runtime-endpoint=unix://{}",
                    s(&self.containerd_socket)
                ))
                .arg("--runtime-request-timeout=5m")
                .arg("--fail-swap-on=false")
                .arg("--cgroup-driver=cgroupfs")
                .arg(format!("--cgroup-root=/{}", self.cgroup_root))
                // A test machine's disk may be nearly full: no eviction and
                // no image GC for disk pressure (the images cannot be pulled
                // again). The map replaces kubelet's defaults, so the
                // nodefs and imagefs signals are off.
                .arg("--eviction-hard=memory.available<1Ki")
                .arg("--image-gc-high-threshold=100")
                .arg("--image-gc-low-threshold=99")
                .arg("--make-iptables-util-chains=false")
                .arg("--serialize-image-pulls=false")
                .arg("--v=2"),
            &dir.join("kubelet.log"),
        ));
    }

    fn make_cgroup_root(&self) {
        for hierarchy in cgroup_hierarchies() {
            let dir = hierarchy.join(&self.cgroup_root);
            let _ = std::fs::create_dir(&dir);
            // A new cpuset cgroup has no CPUs or memory nodes until given.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                    let _ = std::fs::write(dir.join(file), value.trim());
                }
            }
        }
    }

    pub fn logs(&self) -> String {
        [
            "kubelet.log",
            "containerd.log",
            "kube-controller-manager.log",
        ]
        .iter()
        .map(|name| format!("--- {name} ---\n{}", tail(&self.dir.join(name), 25)))
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// Host pids of the processes of pods on this node whose command
    /// line starts with `program` (its file name).
    pub fn pod_processes(&self, program: &str) -> Vec<i32> {
        let memory = Path::new("/sys/fs/cgroup/memory").join(&self.cgroup_root);
        let mut pids = Vec::new();
        procs_in_tree(&memory, &mut pids);
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                Path::new(&*String::from_utf8_lossy(argv0))
                    .file_name()
                    .is_some_and(|name| name == program)
            })
            .collect()
    }

    fn kill_everything(&mut self) {
        // kubelet first, so nothing is restarted; then every process of
        // every pod (all in the cgroup root); then the shims and containerd.
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        kill_cgroup_root(&self.cgroup_root);
        for pid in pids_mentioning(s(&self.containerd_socket)) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        if let Some(mut cm) = self.controller_manager.take() {
            cm.stop();
        }
    }

    fn remove_pod_logs(&self) {
        // A kept run keeps its pods' logs too (kubelet writes them to
        // /var/log/pods whatever its root dir).
        if std::env::var_os("BATON_KUBE_TEST_KEEP").is_some() {
            let kept = self.dir.join("pod-logs");
            let _ = std::fs::create_dir_all(&kept);
            for entry in std::fs::read_dir("/var/log/pods")
                .into_iter()
                .flatten()
                .flatten()
            {
                if is_our_pod_log(&entry.file_name().to_string_lossy()) {
                    let _ = Command::new("cp")
                        .arg("-a")
                        .arg(entry.path())
                        .arg(&kept)
                        .status();
                }
            }
        }
        for (dir, existed) in [
            ("/var/log/pods", self.log_dirs_existed.0),
            ("/var/log/containers", self.log_dirs_existed.1),
        ] {
            if !existed {
                let _ = std::fs::remove_dir_all(dir);
                continue;
            }
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let ours = is_our_pod_log(&name);
                let new = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= self.started);
                if ours && new {
                    let _ = std::fs::remove_dir_all(entry.path());
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_everything();
        // Pods' binds, the FUSE mounts, containerd's rootfs and shm mounts,
        // kubelet's own bind of its root: all under the test's directory.
        detach_mounts_under(&self.dir);
        for hierarchy in cgroup_hierarchies() {
            rmdir_tree(&hierarchy.join(&self.cgroup_root));
        }
        for (path, value) in &self.sysctls {
            if !value.is_empty() {
                let _ = std::fs::write(path, value);
            }
        }
        self.remove_pod_logs();
        let _ = std::fs::write(self.dir.join(TORN_DOWN_FILE), "");
    }
}

/// A /var/log/pods (NS_POD_UID) or /var/log/containers
/// (POD_NS_CONTAINER-ID.log) entry of the test's namespaces.
fn is_our_pod_log(name: &str) -> bool {
    ["baton-e2e", "baton-system"]
        .iter()
        .any(|ns| name.starts_with(&format!("{ns}_")) || name.contains(&format!("_{ns}_")))
}

/// Written once a run's drop has stopped and removed everything (a dir
/// kept with BATON_KUBE_TEST_KEEP=1 is then left alone).
const TORN_DOWN_FILE: &str = "torn-down";

/// The kernel settings as they were before kubelet, in the run's directory.
const SYSCTLS_FILE: &str = "sysctls.tsv";

/// The name prefix of a run's temp dir: `baton-e2e-PID-`.
pub fn run_prefix() -> String {
    format!("baton-e2e-{}-", std::process::id())
}

/// Kills every process in the cgroup root `root` (every hierarchy).
fn kill_cgroup_root(root: &str) {
    for _ in 0..20 {
        let mut pids = Vec::new();
        for hierarchy in cgroup_hierarchies() {
            procs_in_tree(&hierarchy.join(root), &mut pids);
        }
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn detach_mounts_under(dir: &Path) {
    for _ in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for mount in mounts {
            let _ = umount2(&mount, MntFlags::MNT_DETACH);
        }
    }
}

/// Stops and removes what a run killed outright left behind (SIGKILL, a
/// CI timeout: no drop ran): for each temp dir `baton-e2e-PID-*` whose
/// process is gone, the processes of its pods (cgroup root
/// `baton-e2e-PID`) and every process naming the dir (kubelet,
/// containerd and its shims, the API server, etcd), its mounts, cgroups,
/// kernel settings and pod logs, then the dir.
pub fn sweep_stale_runs() {
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix("baton-e2e-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        if Path::new(&format!("/proc/{pid}")).exists() || dir.join(TORN_DOWN_FILE).exists() {
            continue;
        }
        eprintln!("sweeping what the killed run {pid} left: {}", dir.display());
        let root = format!("baton-e2e-{pid}");
        kill_cgroup_root(&root);
        for stray in pids_mentioning(s(&dir)) {
            let _ = kill(Pid::from_raw(stray), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(200));
        detach_mounts_under(&dir);
        for hierarchy in cgroup_hierarchies() {
            rmdir_tree(&hierarchy.join(&root));
        }
        let saved = std::fs::read_to_string(dir.join(SYSCTLS_FILE)).unwrap_or_default();
        for (path, value) in saved.lines().filter_map(|l| l.split_once('\t')) {
            if !value.is_empty() {
                let _ = std::fs::write(path, value);
            }
        }
        for logs in ["/var/log/pods", "/var/log/containers"] {
            for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if is_our_pod_log(&name) {
                    let _ = std::fs::remove_dir_all(entry.path());
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            // kubelet made it if nothing else is in it (no other kubelet
            // runs here); a directory in use is not empty.
            let _ = std::fs::remove_dir(logs);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn ctr(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new("ctr")
        .args(["--address", s(socket), "--namespace", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ctr")
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
