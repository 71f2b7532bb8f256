//! `baton-bench kube`: on a real one-node cluster (`chaos_tests::kube`,
//! deploy/kubernetes from the Baton image of the binaries beside this
//! program), the time from a pod's creation to its Baton volume being
//! published into the pod's volume directory: for the first pod of a
//! volume (the node's shared mount made on that publish) and for a second
//! pod on the same volume (a bind of the mount already there). The floor,
//! measured in the same rounds: an emptyDir pod, from creation to kubelet
//! making its volume directory. Every pod names the node itself (no
//! scheduler in the path), and every round is one floor pod, then a new
//! Baton volume's two pods; the times are polled every 10 ms from the host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use chaos_tests::kube::node::{self, mounts_under, NODE};
use chaos_tests::kube::objects::{APPS, IMAGE};
use chaos_tests::kube::{prerequisites, OneNode};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// How long a pod may take to get its volume, or a PVC to bind.
const DEADLINE: Duration = Duration::from_secs(120);
/// How often the host looks for the publication.
const POLL: Duration = Duration::from_millis(10);

/// One row: the times of every round.
struct Row {
    what: &'static str,
    times: Vec<Duration>,
}

impl Row {
    fn sorted(&self) -> Vec<Duration> {
        let mut times = self.times.clone();
        times.sort();
        times
    }
}

pub fn run(rounds: usize, json_out: Option<&Path>, keep: bool) -> anyhow::Result<()> {
    let binaries =
        prerequisites().map_err(|reason| anyhow!("baton-bench kube needs a cluster: {reason}"))?;
    let rounds = rounds.max(1);
    let mut tmp = tempfile::Builder::new()
        .prefix(&node::run_prefix())
        .tempdir()
        .context("creating the cluster's directory")?;
    if keep {
        tmp.disable_cleanup(true);
    }
    let began = Instant::now();
    eprintln!(
        "starting a one-node cluster in {} (images, etcd, API server, containerd, kubelet)",
        tmp.path().display()
    );
    let cluster = OneNode::start(&binaries, tmp.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let rows = runtime.block_on(async {
        let client = cluster.cluster.client(&cluster.kubeconfig).await;
        cluster.deploy(&client, began).await;
        measure(&cluster, &client, rounds).await
    });
    if rows.is_err() {
        eprintln!("the cluster's logs:\n{}", cluster.logs());
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(cluster);
    let rows = rows?;
    print_table(&rows, rounds);
    if let Some(path) = json_out {
        write_json(path, &rows)?;
    }
    Ok(())
}

async fn measure(cluster: &OneNode, client: &Client, rounds: usize) -> anyhow::Result<Vec<Row>> {
    let mut floor = Row {
        what: "emptyDir pod (kubelet's floor)",
        times: Vec::new(),
    };
    let mut first = Row {
        what: "first pod of a Baton volume",
        times: Vec::new(),
    };
    let mut second = Row {
        what: "second pod, same volume",
        times: Vec::new(),
    };
    for round in 0..rounds {
        let empty_dir = json!({"name": "data", "emptyDir": {}});
        let pod = create_pod(client, &format!("floor-{round}"), empty_dir).await?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = cluster
            .pod_volumes(&uid)
            .join("kubernetes.io~empty-dir/data");
        floor
            .times
            .push(wait_for(&format!("pod floor-{round}'s emptyDir"), || dir.is_dir()).await?);

        let volume = format!("bench-{round}");
        format_volume(cluster, &volume)?;
        static_claim(client, &volume).await?;
        if !cluster.shared_mounts(&volume).is_empty() {
            bail!("Baton volume {volume} is mounted on the node before its first pod");
        }
        let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": volume}});
        for (row, name) in [
            (&mut first, format!("first-{round}")),
            (&mut second, format!("second-{round}")),
        ] {
            let pod = create_pod(client, &name, claim.clone()).await?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let dir = cluster.pod_volumes(&uid).join("kubernetes.io~csi");
            let what = format!("pod {name}'s Baton volume published");
            row.times
                .push(wait_for(&what, || !mounts_under(&dir).is_empty()).await?);
        }
        delete_pods(client).await?;
        eprintln!(
            "round {}/{rounds}: floor {:?}, first {:?}, second {:?}",
            round + 1,
            floor.times[round],
            first.times[round],
            second.times[round]
        );
    }
    Ok(vec![floor, first, second])
}

/// Polls `done` every [`POLL`] from now; the time it took.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > DEADLINE {
            bail!("{what}: not within {DEADLINE:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(started.elapsed())
}

/// `fsctl format VOLUME` in the node pod's fs-supervisor container (what
/// the DaemonSet's volumes container does for the volumes it is given):
/// the volume records its store by the path the container sees.
fn format_volume(cluster: &OneNode, volume: &str) -> anyhow::Result<()> {
    let supervisor = cluster
        .node
        .pod_processes("fs-supervisor")
        .into_iter()
        .next()
        .context("no fs-supervisor process of the node pod")?;
    let out = Command::new("nsenter")
        .args([
            "--target",
            &supervisor.to_string(),
            "--mount",
            "--root",
            "--wd",
        ])
        .args([
            "fsctl",
            "format",
            volume,
            "--base-dir",
            "/var/lib/baton/volumes",
        ])
        .output()
        .context("running nsenter (util-linux)")?;
    if !out.status.success() {
        bail!(
            "fsctl format {volume} in the node pod: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A static PV of the whole Baton volume `volume` (its volumeHandle is the
/// volume's name, deploy/README.md) and a PVC bound to it, both named
/// `volume`; waits until the claim is Bound.
async fn static_claim(client: &Client, volume: &str) -> anyhow::Result<()> {
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": APPS, "name": volume},
            "csi": {"driver": "csi.baton.dev", "volumeHandle": volume},
        },
    }))?;
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .with_context(|| format!("creating PV {volume}"))?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": volume, "namespace": APPS},
        "spec": {"storageClassName": "", "volumeName": volume,
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), APPS);
    pvcs.create(&PostParams::default(), &pvc)
        .await
        .with_context(|| format!("creating PVC {volume}"))?;
    let started = Instant::now();
    loop {
        let phase = pvcs.get(volume).await.ok().and_then(|c| c.status?.phase);
        if phase.as_deref() == Some("Bound") {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            bail!("PVC {volume} not Bound within {DEADLINE:?} (phase {phase:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A host-network pod of the Baton image on the node (no scheduling)
/// that sleeps, with `volume` at /data.
async fn create_pod(client: &Client, name: &str, volume: serde_json::Value) -> anyhow::Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": IMAGE,
                "command": ["sleep", "infinity"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [volume],
        },
    }))?;
    Api::<Pod>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {name}"))
}

/// Deletes every pod of the bench's namespace and waits until they are
/// gone (their volumes unpublished), so that rounds do not overlap.
async fn delete_pods(client: &Client) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("deleting the round's pods")?;
    let started = Instant::now();
    loop {
        let left = pods
            .list(&ListParams::default())
            .await
            .context("listing pods")?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            bail!("{left} pod(s) not deleted within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_table(rows: &[Row], rounds: usize) {
    println!(
        "kube: pod creation to its volume published, {rounds} round(s), one-node cluster (kubelet 1.20.2); kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let floor = rows.first().map(|r| r.sorted()[r.times.len() / 2]);
    println!(
        "{:<32} {:>10} {:>10} {:>10} {:>14}",
        "row", "median ms", "min ms", "max ms", "over floor ms"
    );
    for row in rows {
        let sorted = row.sorted();
        let median = sorted[sorted.len() / 2];
        println!(
            "{:<32} {:>10.0} {:>10.0} {:>10.0} {:>14}",
            row.what,
            ms(median),
            ms(sorted[0]),
            ms(sorted[sorted.len() - 1]),
            floor.map_or("-".to_string(), |f| format!("{:.0}", ms(median) - ms(f)))
        );
    }
}

fn write_json(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let rows: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "row": r.what,
                "times_ms": r.times.iter().map(|t| ms(*t)).collect::<Vec<_>>(),
                "median_ms": ms(r.sorted()[r.times.len() / 2]),
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&json!({"bench": "kube", "rows": rows}))?;
    std::fs::write(path, text).with_context(|| format!("writing {}", PathBuf::from(path).display()))
}
