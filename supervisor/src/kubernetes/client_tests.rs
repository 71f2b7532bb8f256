//! The requests `--kubernetes` sends, in order, against a mock API server
//! (`tower_test::mock::pair` behind a real `kube::Client`): the pod list
//! and watch scoped by `spec.nodeName`, Events on exactly the pods that use
//! a mount, the status ConfigMap by server-side apply, and API errors
//! (403, 409) that are logged and followed by the right next request,
//! never a panic.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;
use tower_test::mock::{Handle, SendResponse};
use upgrade_protocol::{NegotiatedInit, Restarts};

use super::*;
use crate::kubernetes::COMPONENT;
use crate::mount_events::MountEventKind;

const TEST_DEADLINE: Duration = Duration::from_secs(20);
type MockHandle = Handle<Request<Body>, Response<Body>>;

/// Runs `test` on a current-thread runtime with a deadline, with the log
/// lines it writes captured.
fn run_test<F: Future<Output = ()>>(test: impl FnOnce(Arc<Mutex<Vec<u8>>>) -> F) {
    let logs = Arc::new(Mutex::new(Vec::new()));
    let writer_logs = Arc::clone(&logs);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || LogWriter(Arc::clone(&writer_logs)))
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(TEST_DEADLINE, test(Arc::clone(&logs)))
            .await
            .expect("the test finished within its deadline");
    });
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(logs: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&logs.lock().unwrap()).into_owned()
}

fn node() -> Node {
    Node {
        name: "node-1".into(),
        namespace: "baton-system".into(),
    }
}

/// The supervisor side: `serve` on a mock client, and the handle to the
/// mock API server.
fn start(status_interval: Duration) -> (Publisher, MockHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (tx, rx) = unbounded_channel();
    tokio::spawn(serve(client, node(), rx, status_interval));
    (Publisher { tx }, handle)
}

async fn next(handle: &mut MockHandle) -> (Request<Body>, SendResponse<Response<Body>>) {
    handle
        .next_request()
        .await
        .expect("the client sent a request")
}

fn query(request: &Request<Body>) -> BTreeMap<String, String> {
    url_pairs(request.uri().query().unwrap_or(""))
}

fn url_pairs(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

async fn body_json(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn respond(send: SendResponse<Response<Body>>, status: StatusCode, body: Value) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

fn api_error(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    })
}

fn pod(name: &str, namespace: &str, host_path: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "hostPath": {"path": host_path}}]
        }
    })
}

fn mount_event(kind: MountEventKind) -> MountEvent {
    MountEvent {
        kind,
        mount_id: "m1".into(),
        mountpoint: "/var/lib/baton/mounts/shared".into(),
        volume: "shared".into(),
        generation: 5,
        message: "generation 4 killed by the OOM killer".into(),
    }
}

fn mount_status() -> MountStatus {
    MountStatus {
        persistent: false,
        mount_id: "m1".into(),
        mountpoint: "/var/lib/baton/mounts/shared".into(),
        volume: "shared".into(),
        state: "serving".into(),
        generation: 5,
        pid: Some(42),
        standby_pid: None,
        restarts: Restarts {
            exit: 0,
            signal: 0,
            oom: 1,
        },
        uptime_s: 9,
        generation_uptime_s: 1,
        consecutive_failures: 0,
        gave_up: false,
        read_only_reason: None,
        last_recovery: None,
        last_upgrade: None,
        client_binary: "/usr/local/bin/fsclient".into(),
        requests_recovered: 0,
        connection_id: 40,
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
    }
}

/// Answers the initial pod list (resourceVersion 10) after checking it is
/// scoped to this node; returns the watch request that follows, unanswered
/// (a watch that stays open), or the other request that came first.
async fn answer_pod_list(handle: &mut MockHandle, pods: Vec<Value>) {
    let (request, send) = next(handle).await;
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), "/api/v1/pods", "all namespaces");
    let q = query(&request);
    assert_eq!(
        q.get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-1"),
        "{q:?}"
    );
    assert!(!q.contains_key("watch"), "a list first: {q:?}");
    respond(
        send,
        StatusCode::OK,
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": pods}),
    );
}

fn assert_watch(request: &Request<Body>) {
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), "/api/v1/pods");
    let q = query(request);
    assert_eq!(q.get("watch").map(String::as_str), Some("true"), "{q:?}");
    assert_eq!(
        q.get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-1"),
        "the watch is scoped to this node too: {q:?}"
    );
    assert_eq!(
        q.get("resourceVersion").map(String::as_str),
        Some("10"),
        "the watch resumes from the list: {q:?}"
    );
}

#[test]
fn events_go_to_every_pod_using_the_mount_and_a_refused_one_does_not_stop_the_next() {
    run_test(|logs| async move {
        let (publisher, mut handle) = start(Duration::from_secs(3600));
        // Sent before the pod list arrives: it waits for the list.
        publisher.events(vec![mount_event(MountEventKind::OomKilled)]);
        answer_pod_list(
            &mut handle,
            vec![
                pod("app-1", "apps", "/var/lib/baton/mounts/shared"),
                pod("other", "apps", "/data"),
                pod("web-2", "web", "/var/lib/baton/mounts/shared/site"),
            ],
        )
        .await;
        // Next: the watch and the first Event, in either order.
        let mut watch = None;
        let mut posts = Vec::new();
        while posts.is_empty() || watch.is_none() {
            let (request, send) = next(&mut handle).await;
            if request.method() == Method::GET {
                assert_watch(&request);
                watch = Some(send); // held open: no events
            } else {
                posts.push((request, send));
            }
        }
        let (first, send) = posts.remove(0);
        assert_eq!(first.method(), Method::POST);
        let ns_order: Vec<&str> = vec!["apps", "web"];
        let mut seen = Vec::new();
        let mut pending = Some((first, send));
        for (i, ns) in ns_order.iter().enumerate() {
            let (request, send) = match pending.take() {
                Some(p) => p,
                None => next(&mut handle).await,
            };
            assert_eq!(request.method(), Method::POST);
            assert_eq!(
                request.uri().path(),
                format!("/api/v1/namespaces/{ns}/events")
            );
            let event = body_json(request).await;
            assert_eq!(event["kind"], "Event");
            assert_eq!(event["metadata"]["namespace"], *ns);
            assert_eq!(event["involvedObject"]["kind"], "Pod");
            assert_eq!(event["involvedObject"]["namespace"], *ns);
            assert_eq!(event["reason"], "BatonGenerationOOMKilled");
            assert_eq!(event["type"], "Warning");
            assert_eq!(event["source"]["host"], "node-1");
            assert_eq!(event["reportingComponent"], COMPONENT);
            seen.push(
                event["involvedObject"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
            if i == 0 {
                // RBAC does not allow Events in this namespace.
                respond(
                    send,
                    StatusCode::FORBIDDEN,
                    api_error(StatusCode::FORBIDDEN, "Forbidden", "events is forbidden"),
                );
            } else {
                let mut created = event.clone();
                created["metadata"]["name"] = json!("web-2.baton-abcde");
                respond(send, StatusCode::CREATED, created);
            }
        }
        assert_eq!(
            seen,
            ["app-1", "web-2"],
            "the pod not using the mount gets none"
        );
        // Nothing else is sent for that event: the next request is the
        // status write.
        publisher.status(vec![mount_status()]);
        let (request, send) = next(&mut handle).await;
        assert_eq!(request.method(), Method::PATCH, "{}", request.uri());
        respond(
            send,
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "baton-status-node-1"}}),
        );
        let text = logged(&logs);
        assert!(
            text.contains("cannot publish an Event")
                && text.contains("app-1")
                && text.contains("events is forbidden"),
            "{text}"
        );
        drop(watch);
    });
}

#[test]
fn the_status_configmap_is_applied_server_side_and_a_conflict_is_logged_then_retried() {
    run_test(|logs| async move {
        let (publisher, mut handle) = start(Duration::ZERO);
        publisher.status(vec![mount_status()]);
        let mut watch = None;
        let mut list_done = false;
        let mut patches = 0;
        while patches < 2 {
            let (request, send) = next(&mut handle).await;
            match (request.method().clone(), list_done) {
                (Method::GET, false) => {
                    assert!(!query(&request).contains_key("watch"));
                    respond(
                        send,
                        StatusCode::OK,
                        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": []}),
                    );
                    list_done = true;
                }
                (Method::GET, true) => {
                    assert_watch(&request);
                    watch = Some(send);
                }
                (Method::PATCH, _) => {
                    patches += 1;
                    assert_eq!(
                        request.uri().path(),
                        "/api/v1/namespaces/baton-system/configmaps/baton-status-node-1"
                    );
                    let q = query(&request);
                    assert_eq!(
                        q.get("fieldManager").map(String::as_str),
                        Some("fs-supervisor")
                    );
                    assert_eq!(q.get("force").map(String::as_str), Some("true"));
                    assert_eq!(
                        request.headers()["content-type"],
                        "application/apply-patch+yaml",
                        "server-side apply"
                    );
                    let cm = body_json(request).await;
                    assert_eq!(cm["apiVersion"], "v1");
                    assert_eq!(cm["kind"], "ConfigMap");
                    assert_eq!(cm["metadata"]["namespace"], "baton-system");
                    assert_eq!(cm["metadata"]["labels"]["baton.io/node"], "node-1");
                    let line: Value =
                        serde_json::from_str(cm["data"]["m1"].as_str().unwrap()).unwrap();
                    assert_eq!(line["generation"], 5);
                    assert_eq!(line["restarts"]["oom"], 1);
                    if patches == 1 {
                        respond(
                            send,
                            StatusCode::CONFLICT,
                            api_error(
                                StatusCode::CONFLICT,
                                "Conflict",
                                "Apply failed with 1 conflict",
                            ),
                        );
                        // The next update tries again.
                        publisher.status(vec![mount_status()]);
                    } else {
                        respond(send, StatusCode::OK, cm);
                    }
                }
                (other, _) => panic!("unexpected {other} {}", request.uri()),
            }
        }
        let text = logged(&logs);
        assert!(
            text.contains("cannot write the status ConfigMap")
                && text.contains("Apply failed with 1 conflict"),
            "{text}"
        );
        drop(watch);
    });
}

#[test]
fn status_writes_are_rate_limited_and_events_are_not() {
    run_test(|_logs| async move {
        let (publisher, mut handle) = start(Duration::from_secs(3600));
        publisher.status(vec![mount_status()]);
        publisher.status(vec![mount_status()]);
        publisher.status(vec![mount_status()]);
        publisher.events(vec![mount_event(MountEventKind::Recovered)]);
        let mut order = Vec::new();
        let mut watch = None;
        while !order.iter().any(|m: &String| m.starts_with("POST")) {
            let (request, send) = next(&mut handle).await;
            order.push(format!("{} {}", request.method(), request.uri().path()));
            match *request.method() {
                Method::GET if !query(&request).contains_key("watch") => respond(
                    send,
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                           "items": [pod("app-1", "apps", "/var/lib/baton/mounts/shared")]}),
                ),
                Method::GET => watch = Some(send),
                Method::PATCH => respond(
                    send,
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
                ),
                _ => respond(
                    send,
                    StatusCode::CREATED,
                    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {}}),
                ),
            }
        }
        let patches = order.iter().filter(|m| m.starts_with("PATCH")).count();
        assert_eq!(
            patches, 1,
            "three updates within the interval, one write: {order:?}"
        );
        assert!(
            order.contains(&"POST /api/v1/namespaces/apps/events".to_string()),
            "{order:?}"
        );
        drop(watch);
    });
}
