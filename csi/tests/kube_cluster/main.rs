//! Tier 2 of the CSI driver: a real one-node Kubernetes cluster, started
//! by this test on this machine, runs deploy/kubernetes (the DaemonSet with
//! fs-supervisor and `baton-csi --node`, the controller, the CSIDriver and
//! StorageClass) from the Baton image, and pods consume PVCs through
//! kubelet's CSI calls.
//!
//! The cluster is `chaos_tests::kube::OneNode` (Debian's etcd, kubelet
//! 1.20.2 and friends, a private containerd, the Baton image; what the
//! cluster lacks, kube-scheduler, the harness plays). The test also plays
//! external-provisioner (CreateVolume on baton-csi's controller socket,
//! then the PV pre-bound to the PVC).
//!
//! What it proves, in order (one cluster, one test, phases in sequence):
//! 1. the node plugin registers with kubelet's plugin watcher (CSINode);
//! 2. a PVC of the StorageClass is provisioned and bound, and a pod writes
//!    and reads through it; two pods on two PVCs of one Baton volume share
//!    one mount, see only their own directory, and `df` shows each its
//!    own quota; the time from pod creation to the volume's publication
//!    (first pod of a volume, then another) is printed;
//! 3. kill -9 of the serving generation under a pod's checksummed I/O:
//!    zero errors in the pod;
//! 4. a real OOM kill of the serving generation (its memory cgroup limit
//!    lowered under a large write): zero errors in the pods;
//! 5. kill -9 of the node plugin: the running pod is untouched, and a new
//!    pod gets its volume once kubelet restarted the plugin;
//! 6. an image update the blue/green way (deploy/README.md): a second
//!    DaemonSet's supervisor waits as successor, the first is deleted, and
//!    a pod's checksummed I/O, going on a minute past the switch, sees zero
//!    errors;
//! 7. fs-supervisor, its generations and the node plugin all killed (the
//!    mount under the pod is dead): deleting the pod completes within 60 s,
//!    and a new pod gets its volume once the node pod is back.
//!
//! Built only with `--features cluster-tests` (`cargo test -p baton-csi
//! --features cluster-tests --test kube_cluster`; `cargo test --workspace`
//! leaves it out). Skips with the reason printed when a binary or tool is
//! missing, unless
//! `BATON_REQUIRE_KUBE_CLUSTER=1` (`.ci/run`), which fails instead.
//! Needs root, /dev/fuse, `target/debug/{fs-supervisor (--features
//! kubernetes),fsclient,fsctl,baton-csi}`. `BATON_KUBE_TEST_KEEP=1` keeps
//! the temp dir's logs (everything is still stopped and unmounted).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod objects;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::{Api, Client};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use chaos_tests::kube::apiserver::{free_port, s};
use chaos_tests::kube::node::{self, mounts_under};
use chaos_tests::kube::{device_of, eventually, OneNode, START_DEADLINE};
use objects::{APPS, SYSTEM};

/// A pod's life step (published, running, finished) or a recovery.
const DEADLINE: Duration = Duration::from_secs(180);
/// How long deleting a pod over a dead mount may take (the issue's bound).
const DELETE_DEADLINE: Duration = Duration::from_secs(60);
/// How long a pod's I/O goes on after the blue/green switch.
const ROLLOUT_HOLD: Duration = Duration::from_secs(60);
/// The "new" image of the update (the same image, tagged again).
const NEXT_IMAGE: &str = "docker.io/baton/baton:next";

fn required() -> bool {
    std::env::var("BATON_REQUIRE_KUBE_CLUSTER").as_deref() == Ok("1")
}

#[test]
fn pvcs_of_the_csi_driver_serve_pods_on_a_real_kubelet_through_crashes() {
    let binaries = match chaos_tests::kube::prerequisites() {
        Ok(binaries) => binaries,
        Err(reason) => {
            assert!(!required(), "BATON_REQUIRE_KUBE_CLUSTER=1 but {reason}");
            eprintln!("skipping the one-node cluster test: {reason}");
            return;
        }
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(&node::run_prefix())
        .tempdir()
        .expect("temp dir");
    if std::env::var_os("BATON_KUBE_TEST_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("keeping {}", tmp.path().display());
    }
    let began = Instant::now();
    let env = OneNode::start(&binaries, tmp.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = env.cluster.client(&env.kubeconfig).await;
        env.deploy(&client, began).await;
        scenario(&env, client).await;
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(env);
    eprintln!("tier 2 took {:?} in all", began.elapsed());
}

/// The log kubelet keeps of a pod's container `app` (CRI format, the
/// message after the third field).
fn pod_log(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let path = format!(
        "/var/log/pods/{}_{}_{}/app/0.log",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    );
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The slowest iteration the CHECKED_IO pod has reported so far (ms).
fn slowest_so_far(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.starts_with("progress "))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("max_ms=")))
        .filter_map(|v| v.parse().ok())
        .max()
        .unwrap_or(0)
}

/// The supervisor's takeover time of the volume's last recovery (µs).
fn takeover_us(env: &OneNode, volume: &str) -> u64 {
    env.shared_mounts(volume)
        .first()
        .and_then(|m| m["last_recovery"]["takeover_us"].as_u64())
        .unwrap_or(0)
}

fn progress_of(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.strip_prefix("progress ops="))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// The checked workload: writes files of random bytes into its own
/// directory of the PVC (write to a temp name, rename), reads each back and
/// compares its SHA-256, re-reads an older one, until /ctl/stop exists;
/// then checks every file once more. Any failed call or wrong byte: ERROR
/// and exit 1. Reports the slowest iteration (max_ms).
const CHECKED_IO: &str = r#"
set -u
d=/data/$POD_NAME
mkdir -p "$d" || { echo "ERROR mkdir $d"; exit 1; }
fail() { echo "ERROR $*"; exit 1; }
declare -A sums
ops=0; max_ms=0; end=$(( $(date +%s) + 900 ))
while [ ! -e /ctl/stop ] && [ "$(date +%s)" -lt "$end" ]; do
  slot=$((ops % 16)); f="$d/f$slot"
  t0=$(date +%s%N)
  head -c 131072 /dev/urandom > /tmp/src || fail "urandom"
  want=$(sha256sum < /tmp/src) || fail "sum of the source"
  cp /tmp/src "$f.tmp" || fail "write $f.tmp"
  mv "$f.tmp" "$f" || fail "rename $f"
  got=$(sha256sum < "$f") || fail "read $f"
  [ "$got" = "$want" ] || fail "checksum of $f"
  sums[$slot]=$want
  other=$(( (slot + 7) % 16 ))
  if [ -n "${sums[$other]:-}" ]; then
    got=$(sha256sum < "$d/f$other") || fail "read $d/f$other"
    [ "$got" = "${sums[$other]}" ] || fail "checksum of $d/f$other"
  fi
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$ms" -gt "$max_ms" ] && max_ms=$ms
  ops=$((ops + 1))
  [ $((ops % 5)) -eq 0 ] && echo "progress ops=$ops max_ms=$max_ms"
done
for slot in "${!sums[@]}"; do
  got=$(sha256sum < "$d/f$slot") || fail "final read of f$slot"
  [ "$got" = "${sums[$slot]}" ] || fail "final checksum of f$slot"
done
echo "done ops=$ops max_ms=$max_ms"
"#;

/// Writes a file named for the pod, waits for the peer pod (`PEER`) to
/// have written its own, then lists the PVC and prints df's size.
fn pair_script(peer: &str) -> String {
    format!(
        r#"
set -eu
echo "$POD_NAME" > "/data/owner-$POD_NAME"
[ "$(cat "/data/owner-$POD_NAME")" = "$POD_NAME" ]
touch "/ctl/$POD_NAME-written"
for i in $(seq 600); do [ -e "/ctl/{peer}-written" ] && break; sleep 0.2; done
echo "listing=$(ls -A /data | tr '\n' ' ')"
echo "df_size=$(df -B1 --output=size /data | tail -1 | tr -d ' ')"
"#
    )
}

const SIMPLE_IO: &str = r#"
set -eu
head -c 1048576 /dev/urandom > /tmp/src
cp /tmp/src "/data/$POD_NAME"
cmp /tmp/src "/data/$POD_NAME"
echo "written and read back"
"#;

async fn wait_finished(env: &OneNode, client: &Client, name: &str) -> (i32, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    let pod = eventually(
        &format!("pod {name} finished"),
        DEADLINE,
        || env.logs(),
        || async {
            let pod = pods.get(name).await.ok()?;
            let phase = pod.status.as_ref()?.phase.clone()?;
            (phase == "Succeeded" || phase == "Failed").then_some(pod)
        },
    )
    .await;
    let code = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    (code, pod_log(&pod))
}

/// Creates a pod and returns it with the time to its volume's publication.
async fn pod_published(
    env: &OneNode,
    client: &Client,
    name: &str,
    claim: &str,
    script: &str,
) -> (Pod, Duration) {
    let (pod, elapsed, _) = pod_published_on(env, client, name, claim, script).await;
    (pod, elapsed)
}

/// [`pod_published`], and the device of the mount it was given.
async fn pod_published_on(
    env: &OneNode,
    client: &Client,
    name: &str,
    claim: &str,
    script: &str,
) -> (Pod, Duration, String) {
    // The pair pods meet in one directory; every other pod has its own.
    let ctl = env
        .dir
        .join("ctl")
        .join(name.strip_prefix("pair-").map_or(name, |_| "pair"));
    let start = Instant::now();
    let pod = objects::create_pod(client, name, claim, &ctl, script).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let device = eventually(
        &format!("pod {name}'s volume published"),
        DEADLINE,
        || env.logs(),
        || async { env.published(&uid) },
    )
    .await;
    (pod, start.elapsed(), device)
}

async fn wait_progress(env: &OneNode, client: &Client, name: &str, ops: u64) -> u64 {
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    let pod = pods.get(name).await.expect("pod");
    eventually(
        &format!("pod {name} past {ops} checked operations"),
        DEADLINE,
        || format!("{}\n--- pod log ---\n{}", env.logs(), pod_log(&pod)),
        || async {
            let log = pod_log(&pod);
            assert!(!log.contains("ERROR"), "pod {name} saw an error:\n{log}");
            let done = progress_of(&log);
            (done >= ops).then_some(done)
        },
    )
    .await
}

/// Stops a CHECKED_IO pod and asserts it ended with no error; returns the
/// slowest iteration it saw (ms).
async fn finish_checked(env: &OneNode, client: &Client, name: &str) -> u64 {
    std::fs::write(env.dir.join("ctl").join(name).join("stop"), "").unwrap();
    let (code, log) = wait_finished(env, client, name).await;
    assert!(
        code == 0 && !log.contains("ERROR"),
        "pod {name} exited {code}:\n{log}"
    );
    let done = log
        .lines()
        .find_map(|l| l.strip_prefix("done "))
        .unwrap_or_else(|| panic!("pod {name} never finished its checks:\n{log}"));
    done.split_whitespace()
        .find_map(|f| f.strip_prefix("max_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn provision_pvc(env: &OneNode, client: &Client, name: &str, bytes: u64) {
    let pvc = objects::create_pvc(client, name, bytes).await;
    let socket = env.dir.join("csi-controller/csi.sock");
    let channel = objects::csi_channel(&socket).await;
    objects::provision(client, channel, &pvc).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), APPS);
    eventually(
        &format!("PVC {name} bound"),
        DEADLINE,
        || env.logs(),
        || async {
            let phase = pvcs.get(name).await.ok()?.status?.phase?;
            (phase == "Bound").then_some(())
        },
    )
    .await;
}

/// The serving generation of the volume's mount: (host pid, generation).
async fn serving(env: &OneNode, volume: &str, after: u64) -> (i32, u64) {
    eventually(
        &format!("a generation after {after} serving {volume}"),
        DEADLINE,
        || format!("{:?}\n{}", env.status(), env.logs()),
        || async {
            let mount = env.shared_mounts(volume).into_iter().next()?;
            let generation = mount["generation"].as_u64()?;
            (mount["state"] == "serving" && generation > after).then_some(())?;
            Some((
                env.host_pid("fsclient", mount["pid"].as_u64()?)?,
                generation,
            ))
        },
    )
    .await
}

/// deploy/README.md's blue/green DaemonSet update under a pod's checked
/// I/O: zero errors, a new supervisor and generation serving after it.
async fn blue_green_update(env: &OneNode, client: &Client, apiserver_port: u16) {
    let logs = || env.logs();
    let client = client.clone();
    // An image update on 1.20 (no maxSurge for DaemonSets): blue/green.
    // A second DaemonSet with the new image starts beside the first; its
    // supervisor (--successor) waits on the shared state directory. Deleting
    // the first sends SIGTERM: every mount is handed over, the pod's I/O
    // goes on.
    pod_published(env, &client, "io-rollout", "data-a", CHECKED_IO).await;
    let ops = wait_progress(env, &client, "io-rollout", 10).await;
    let before = env.status().expect("status");
    let (_, generation) = serving(env, "shared", 0).await;
    let io_rollout = Api::<Pod>::namespaced(client.clone(), APPS)
        .get("io-rollout")
        .await
        .expect("pod io-rollout");
    let before_ms = slowest_so_far(&pod_log(&io_rollout));
    env.node.tag_image("baton/baton:", NEXT_IMAGE);
    let next = objects::next_daemonset(&env.dir, apiserver_port, free_port(), NEXT_IMAGE);
    objects::apply(&client, &next).await;
    let successor = PathBuf::from(objects::host_path(
        &env.dir,
        "/var/lib/baton/supervisor/run/successor.sock",
    ));
    eventually(
        "the new DaemonSet's supervisor waiting as successor",
        START_DEADLINE,
        logs,
        || async { successor.exists().then_some(()) },
    )
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM);
    let switching = Instant::now();
    daemonsets
        .delete("fs-supervisor", &DeleteParams::background())
        .await
        .expect("delete the old DaemonSet");
    let started = before["supervisor"]["started_unix_ms"].clone();
    eventually(
        "the successor serving the mount",
        DEADLINE,
        logs,
        || async {
            let status = env.status()?;
            (status["supervisor"]["started_unix_ms"] != started).then_some(())?;
            let mount = env.shared_mounts("shared").into_iter().next()?;
            (mount["state"] == "serving" && mount["generation"].as_u64()? > generation)
                .then_some(())
        },
    )
    .await;
    let switched = switching.elapsed();
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM);
    eventually("the old node pod gone", DEADLINE, logs, || async {
        let list = pods.list(&Default::default()).await.ok()?;
        let old = |name: &str| {
            name.starts_with("fs-supervisor-") && !name.starts_with("fs-supervisor-next-")
        };
        list.items
            .iter()
            .all(|p| !p.metadata.name.as_deref().is_some_and(old))
            .then_some(())
    })
    .await;
    wait_progress(env, &client, "io-rollout", ops + 20).await;
    // The I/O goes on a minute past the switch: a late effect of the old
    // pod's end (its teardown, kubelet's cleanup of it) reaches the pod.
    let hold = ROLLOUT_HOLD.saturating_sub(switching.elapsed());
    tokio::time::sleep(hold).await;
    wait_progress(env, &client, "io-rollout", ops + 21).await;
    let stall_ms = finish_checked(env, &client, "io-rollout").await;
    let (_, after_rollout) =
        pod_published(env, &client, "after-rollout", "data-b", SIMPLE_IO).await;
    let (code, log) = wait_finished(env, &client, "after-rollout").await;
    assert_eq!(code, 0, "a new pod after the update:\n{log}");
    eprintln!(
        "blue/green update: old DaemonSet deleted, successor serving after {switched:?} (generation {generation} -> {}); slowest pod iteration {stall_ms} ms ({before_ms} ms before), zero errors; a new pod published in {after_rollout:?}",
        env.shared_mounts("shared")[0]["generation"]
    );
}

async fn scenario(env: &OneNode, client: Client) {
    let logs = || env.logs();
    // 1. The node plugin registered itself with kubelet (no registrar):
    //    OneNode::deploy waited for csi.baton.dev in the node's CSINode.

    // 2. PVCs, one shared mount, two isolated directories, each its quota.
    const A_BYTES: u64 = 64 << 20;
    const B_BYTES: u64 = 96 << 20;
    provision_pvc(env, &client, "data-a", A_BYTES).await;
    provision_pvc(env, &client, "data-b", B_BYTES).await;
    let (_, first, device_a) =
        pod_published_on(env, &client, "pair-a", "data-a", &pair_script("pair-b")).await;
    let (_, second, device_b) =
        pod_published_on(env, &client, "pair-b", "data-b", &pair_script("pair-a")).await;
    let shared = PathBuf::from(objects::host_path(&env.dir, "/var/lib/baton/mounts/shared"));
    let shared_device = device_of(&shared).expect("the volume's mount on the host");
    assert_eq!(
        (device_a.as_str(), device_b.as_str()),
        (shared_device.as_str(), shared_device.as_str()),
        "both PVCs' publications are binds of the volume's one FUSE mount"
    );
    for (name, bytes) in [("pair-a", A_BYTES), ("pair-b", B_BYTES)] {
        let (code, log) = wait_finished(env, &client, name).await;
        assert_eq!(code, 0, "pod {name}:\n{log}");
        let listing = log
            .lines()
            .find_map(|l| l.strip_prefix("listing="))
            .unwrap_or_default();
        assert_eq!(
            listing.trim(),
            format!("owner-{name}"),
            "pod {name} sees another PVC's files:\n{log}"
        );
        let df: u64 = log
            .lines()
            .find_map(|l| l.strip_prefix("df_size="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert_eq!(
            df, bytes,
            "df in pod {name} does not show its PVC's quota:\n{log}"
        );
    }
    assert_eq!(
        env.shared_mounts("shared").len(),
        1,
        "one mount of the volume on the node: {:?}",
        env.status()
    );
    eprintln!("publish: first pod of the volume {first:?}, second pod {second:?}");

    // 3. kill -9 of the serving generation under checked I/O.
    let (io_kill, _) = pod_published(env, &client, "io-kill", "data-a", CHECKED_IO).await;
    let ops = wait_progress(env, &client, "io-kill", 20).await;
    let (pid, generation) = serving(env, "shared", 0).await;
    let before_ms = slowest_so_far(&pod_log(&io_kill));
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    serving(env, "shared", generation).await;
    wait_progress(env, &client, "io-kill", ops + 20).await;
    let stall_ms = finish_checked(env, &client, "io-kill").await;
    eprintln!(
        "kill -9: generation {generation} killed, served again after {:?} (takeover {} us); slowest pod iteration {stall_ms} ms ({before_ms} ms before the kill), zero errors",
        killed_at.elapsed(),
        takeover_us(env, "shared")
    );

    // 4. A real OOM kill of the serving generation under pod I/O.
    const C_BYTES: u64 = 1 << 30;
    provision_pvc(env, &client, "data-c", C_BYTES).await;
    let (io_oom, _) = pod_published(env, &client, "io-oom", "data-c", CHECKED_IO).await;
    let ops = wait_progress(env, &client, "io-oom", 10).await;
    let (pid, generation) = serving(env, "shared", 0).await;
    let before_ms = slowest_so_far(&pod_log(&io_oom));
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let memory = cgroup
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
        .expect("memory cgroup");
    let memory = Path::new("/sys/fs/cgroup/memory").join(memory.trim_start_matches('/'));
    let usage: u64 = std::fs::read_to_string(memory.join("memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let oom_before = env.shared_mounts("shared")[0]["restarts"]["oom"]
        .as_u64()
        .unwrap_or(0);
    std::fs::write(
        memory.join("memory.limit_in_bytes"),
        (usage + (8 << 20)).to_string(),
    )
    .expect("lower the generation's memory limit");
    let oom_at = Instant::now();
    pod_published(env, &client, "big-write", "data-c", "set -eu; dd if=/dev/zero of=/data/big bs=1M count=256 conv=fsync 2>&1; cmp -n 268435456 /data/big /dev/zero; echo big-ok").await;
    serving(env, "shared", generation).await;
    let oom_after = env.shared_mounts("shared")[0]["restarts"]["oom"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        oom_after > oom_before,
        "the generation was not OOM-killed: {:?}",
        env.status()
    );
    let (code, log) = wait_finished(env, &client, "big-write").await;
    assert!(
        code == 0 && log.contains("big-ok"),
        "the large write failed across the OOM kill:\n{log}"
    );
    wait_progress(env, &client, "io-oom", ops + 10).await;
    let stall_ms = finish_checked(env, &client, "io-oom").await;
    eprintln!(
        "OOM: limit {} B, served again after {:?} (takeover {} us, the 256 MiB write's pod included); slowest pod iteration {stall_ms} ms ({before_ms} ms before), zero errors",
        usage + (8 << 20),
        oom_at.elapsed(),
        takeover_us(env, "shared")
    );

    // 5. A crash of the node plugin.
    pod_published(env, &client, "io-plugin", "data-b", CHECKED_IO).await;
    let ops = wait_progress(env, &client, "io-plugin", 10).await;
    let plugins = env.node.pod_processes("baton-csi");
    let node_plugins: Vec<i32> = plugins
        .into_iter()
        .filter(|p| {
            String::from_utf8_lossy(
                &std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default(),
            )
            .contains("--node")
        })
        .collect();
    assert_eq!(node_plugins.len(), 1, "one node plugin");
    kill(Pid::from_raw(node_plugins[0]), Signal::SIGKILL).unwrap();
    eventually(
        "the node plugin restarted by kubelet",
        DEADLINE,
        logs,
        || async {
            env.node
                .pod_processes("baton-csi")
                .into_iter()
                .any(|p| {
                    p != node_plugins[0]
                        && String::from_utf8_lossy(
                            &std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default(),
                        )
                        .contains("--node")
                })
                .then_some(())
        },
    )
    .await;
    let (_, after_plugin) = pod_published(env, &client, "after-plugin", "data-a", SIMPLE_IO).await;
    let (code, log) = wait_finished(env, &client, "after-plugin").await;
    assert_eq!(code, 0, "a new pod after the plugin's crash:\n{log}");
    wait_progress(env, &client, "io-plugin", ops + 10).await;
    finish_checked(env, &client, "io-plugin").await;
    eprintln!("plugin crash: running pod untouched, a new pod published in {after_plugin:?}");

    // 6. An image update on 1.20 (no maxSurge for DaemonSets): blue/green,
    // deploy/README.md.
    blue_green_update(env, &client, env.cluster.port()).await;

    // 7. Everything of the node pod killed: the mount under the pod is dead.
    pod_published(
        env,
        &client,
        "victim",
        "data-b",
        "while true; do ls /data > /dev/null 2>&1; sleep 0.2; done",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    eventually("pod victim running", DEADLINE, logs, || async {
        (pods.get("victim").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    let victim = pods.get("victim").await.expect("pod victim");
    let victim_uid = victim.metadata.uid.clone().unwrap();
    let victim_dir = env
        .node
        .kubelet_dir
        .join("pods")
        .join(&victim_uid)
        .join("volumes/kubernetes.io~csi");
    let target = mounts_under(&victim_dir)
        .first()
        .cloned()
        .expect("the victim's publication");
    for program in ["fs-supervisor", "fsclient", "baton-csi"] {
        for pid in env.node.pod_processes(program) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    // The pod's mount is dead (its FUSE connection went with its last
    // holder): seen from a child process, never from this one.
    eventually("the victim's mount dead", DEADLINE, logs, || async {
        let out = Command::new("timeout")
            .args(["10", "stat", s(&target)])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stderr)
            .contains("Transport endpoint is not connected")
            .then_some(())
    })
    .await;
    let deleting = Instant::now();
    pods.delete("victim", &DeleteParams::default())
        .await
        .expect("delete victim");
    eventually("pod victim gone", DELETE_DEADLINE, logs, || async {
        pods.get_opt("victim").await.ok()?.is_none().then_some(())
    })
    .await;
    let deleted = deleting.elapsed();
    let (_, back) = pod_published(env, &client, "after-all", "data-b", SIMPLE_IO).await;
    let (code, log) = wait_finished(env, &client, "after-all").await;
    assert_eq!(code, 0, "a new pod after the node pod's crash:\n{log}");
    eprintln!("all killed: pod over the dead mount deleted in {deleted:?}; a new pod published {back:?} after its creation");
}
