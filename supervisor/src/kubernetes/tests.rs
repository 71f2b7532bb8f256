//! The Kubernetes objects fs-supervisor sends, built without a cluster
//! (nothing here talks to an API server).

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{HostPathVolumeSource, PodSpec, Volume};
use upgrade_protocol::{NegotiatedInit, Restarts};

use super::*;
use crate::mount_events::MountEventKind;

fn pod(name: &str, host_paths: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("apps".into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            volumes: Some(
                host_paths
                    .iter()
                    .map(|p| Volume {
                        name: "v".into(),
                        host_path: Some(HostPathVolumeSource {
                            path: (*p).into(),
                            type_: None,
                        }),
                        ..Volume::default()
                    })
                    .collect(),
            ),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn event(kind: MountEventKind) -> MountEvent {
    MountEvent {
        kind,
        mount_id: "m".into(),
        mountpoint: "/var/lib/baton/mounts/shared".into(),
        volume: "shared".into(),
        generation: 5,
        message: "generation 4 killed by signal 9".into(),
    }
}

#[test]
fn the_pod_watch_is_scoped_to_this_node() {
    assert_eq!(pod_field_selector("node-7"), "spec.nodeName=node-7");
}

#[test]
fn pods_use_a_mount_through_its_path_a_subdirectory_or_the_mount_root() {
    let mnt = Path::new("/var/lib/baton/mounts/shared");
    assert!(pod_uses_mount(
        &pod("a", &["/var/lib/baton/mounts/shared"]),
        mnt
    ));
    assert!(pod_uses_mount(
        &pod("b", &["/var/lib/baton/mounts/shared/sub/"]),
        mnt
    ));
    assert!(pod_uses_mount(&pod("c", &["/var/lib/baton/mounts"]), mnt));
    assert!(!pod_uses_mount(
        &pod("d", &["/var/lib/baton/mounts/shared2"]),
        mnt
    ));
    assert!(!pod_uses_mount(&pod("e", &["/data"]), mnt));
    assert!(!pod_uses_mount(&Pod::default(), mnt));
}

#[test]
fn events_name_the_pod_the_reason_and_the_node() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let p = pod("web-1", &["/var/lib/baton/mounts/shared"]);
    let e = event_object(&p, &event(MountEventKind::OomKilled), "node-7", now);
    assert_eq!(e.metadata.namespace.as_deref(), Some("apps"));
    assert_eq!(e.metadata.generate_name.as_deref(), Some("web-1.baton-"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(e.involved_object.name.as_deref(), Some("web-1"));
    assert_eq!(e.involved_object.uid.as_deref(), Some("uid-web-1"));
    assert_eq!(e.reason.as_deref(), Some("BatonGenerationOOMKilled"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_instance.as_deref(), Some("node-7"));
    assert_eq!(e.source.as_ref().unwrap().host.as_deref(), Some("node-7"));
    let message = e.message.unwrap();
    assert!(
        message.contains("killed by signal 9") && message.contains("generation 5"),
        "{message}"
    );
    // As sent to the API server.
    let json = serde_json::to_value(event_object(
        &p,
        &event(MountEventKind::Recovered),
        "n",
        now,
    ))
    .unwrap();
    assert_eq!(json["apiVersion"], "v1");
    assert_eq!(json["kind"], "Event");
    assert_eq!(json["type"], "Normal");
    assert_eq!(json["firstTimestamp"], "2023-11-14T22:13:20Z");
}

#[test]
fn the_status_configmap_has_one_entry_per_mount_and_applies_as_is() {
    let node = Node {
        name: "node-7".into(),
        namespace: "baton-system".into(),
    };
    let status = MountStatus {
        persistent: false,
        mount_id: "abc".into(),
        mountpoint: "/var/lib/baton/mounts/shared".into(),
        volume: "shared".into(),
        state: "serving".into(),
        generation: 3,
        pid: Some(42),
        standby_pid: None,
        restarts: Restarts {
            exit: 0,
            signal: 2,
            oom: 0,
        },
        uptime_s: 9,
        generation_uptime_s: 1,
        consecutive_failures: 0,
        gave_up: false,
        read_only_reason: None,
        last_upgrade: None,
        client_binary: "/usr/bin/fsclient".into(),
        requests_recovered: 0,
        last_recovery: None,
        connection_id: 1,
        counters: None,
        incidents: Vec::new(),
        cgroup: None,
        init: NegotiatedInit {
            major: 7,
            minor: 45,
            kernel_minor: 45,
            flags: 0,
            max_readahead: 0,
            max_write: 0,
            max_pages: 0,
            max_background: 0,
            congestion_threshold: 0,
            time_gran: 1,
        },
    };
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let cm = status_configmap(&node, &[status], now);
    assert_eq!(cm.metadata.name.as_deref(), Some("baton-status-node-7"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("baton-system"));
    let data = cm.data.as_ref().unwrap();
    let entry: serde_json::Value = serde_json::from_str(&data["abc"]).unwrap();
    assert_eq!(entry["generation"], 3);
    assert_eq!(entry["restarts"]["signal"], 2);
    assert_eq!(data["updated"], "2023-11-14T22:13:20Z");
    // Server-side apply needs apiVersion and kind in the body.
    let json = serde_json::to_value(&cm).unwrap();
    assert_eq!(json["apiVersion"], "v1");
    assert_eq!(json["kind"], "ConfigMap");
}

#[test]
fn a_status_held_back_by_the_interval_is_written_when_it_falls_due() {
    use super::client::StatusThrottle;
    use std::time::{Duration, Instant};
    let interval = Duration::from_millis(STATUS_INTERVAL_MS);
    let t0 = Instant::now();
    let mut throttle = StatusThrottle::default();
    assert_eq!(throttle.due_in(t0), None, "nothing held, nothing due");
    // The first status is written at once.
    throttle.offer(Vec::new());
    assert_eq!(throttle.due_in(t0), Some(Duration::ZERO));
    assert!(throttle.take_due(t0).is_some());
    assert_eq!(throttle.due_in(t0), None);
    // One a second later (a generation died) is held back, not dropped...
    let t1 = t0 + Duration::from_secs(1);
    throttle.offer(Vec::new());
    assert!(throttle.take_due(t1).is_none());
    assert_eq!(throttle.due_in(t1), Some(interval - Duration::from_secs(1)));
    // ...and written when the interval has passed, with no new update.
    assert!(throttle.take_due(t0 + interval).is_some());
    assert_eq!(throttle.due_in(t0 + interval), None);
}
