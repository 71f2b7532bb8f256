//! The API server side of `--kubernetes`: one thread with a current-thread
//! tokio runtime runs a reflector of this node's pods (field selector) and
//! publishes what the event loop sends: Events on the pods using a mount,
//! and the status ConfigMap (server-side apply, at most every
//! [`STATUS_INTERVAL_MS`]; a status held back by that limit is written when
//! it falls due, not on the next update). Failures are logged (a failed
//! status write is retried after the interval); they never reach the event
//! loop.
//!
//! Everything after building the [`Client`] is in [`serve`], which takes
//! any `kube::Client`, so the request sequence is tested against a mock
//! service (`client_tests.rs`).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use upgrade_protocol::MountStatus;

use super::{
    event_object, pod_field_selector, pod_uses_mount, status_configmap, status_configmap_name,
    Node, STATUS_INTERVAL_MS,
};
use crate::mount_events::MountEvent;

/// How long Events wait for the first pod list (Events of a mount are
/// published on the pods that use it, so they need the list).
pub const POD_LIST_WAIT_MS: u64 = 10_000;

/// What the event loop sends.
enum Update {
    Events(Vec<MountEvent>),
    Status(Vec<MountStatus>),
}

/// What wakes the Kubernetes thread.
enum Wake {
    Update(Update),
    /// A held-back status is due.
    Due,
    /// The supervisor dropped its [`Publisher`].
    Closed,
}

/// The event loop's handle: sending never blocks.
pub struct Publisher {
    tx: UnboundedSender<Update>,
}

impl Publisher {
    /// Publishes events on the pods using their mounts.
    pub fn events(&self, events: Vec<MountEvent>) {
        if !events.is_empty() {
            let _ = self.tx.send(Update::Events(events));
        }
    }

    /// The latest statuses (written at most every [`STATUS_INTERVAL_MS`]).
    pub fn status(&self, mounts: Vec<MountStatus>) {
        let _ = self.tx.send(Update::Status(mounts));
    }
}

/// Starts the Kubernetes thread for `node`.
pub fn start(node: Node) -> std::io::Result<Publisher> {
    let (tx, rx) = unbounded_channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("kubernetes".into())
        .spawn(move || runtime.block_on(run(node, rx)))?;
    Ok(Publisher { tx })
}

async fn run(node: Node, rx: UnboundedReceiver<Update>) {
    // With both of rustls's providers compiled in (fs-supervisor built in
    // one cargo invocation with fsclient, as deploy/image/build does) none
    // is the default and the first TLS connection panicked this thread.
    // An error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(%err, "--kubernetes: no API server configuration (in-cluster service account or kubeconfig); Events and the status ConfigMap are off");
            return;
        }
    };
    serve(client, node, rx, Duration::from_millis(STATUS_INTERVAL_MS)).await;
}

/// Watches this node's pods and publishes what arrives on `rx` until it
/// closes: Events at once, the status ConfigMap at most every
/// `status_interval`.
async fn serve(
    client: Client,
    node: Node,
    mut rx: UnboundedReceiver<Update>,
    status_interval: Duration,
) {
    let store = watch_pods(&client, &node);
    let mut throttle = StatusThrottle::new(status_interval);
    loop {
        // The next update, or the held-back status falling due.
        let wake = match throttle.due_in(Instant::now()) {
            Some(wait) => match tokio::time::timeout(wait, rx.recv()).await {
                Ok(Some(update)) => Wake::Update(update),
                Ok(None) => Wake::Closed,
                Err(_due) => Wake::Due,
            },
            None => rx.recv().await.map_or(Wake::Closed, Wake::Update),
        };
        match wake {
            Wake::Update(Update::Events(events)) => {
                publish_events(&client, &store, &node, &events).await;
            }
            Wake::Update(Update::Status(mounts)) => throttle.offer(mounts),
            Wake::Due => {}
            Wake::Closed => {
                // The supervisor is exiting: write what is held back.
                if let Some(mounts) = throttle.take_pending() {
                    write_status(&client, &node, &mounts).await;
                }
                return;
            }
        }
        if let Some(mounts) = throttle.take_due(Instant::now()) {
            if !write_status(&client, &node, &mounts).await {
                // Retried when the interval has passed again.
                throttle.offer(mounts);
            }
        }
    }
}

/// Starts a reflector of the pods on `node` (list, then watch, both with
/// the field selector `spec.nodeName=NODE`) on its own task.
fn watch_pods(client: &Client, node: &Node) -> Store<Pod> {
    let selector = pod_field_selector(&node.name);
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let watch = reflector::reflector(
        writer,
        watcher(pods, watcher::Config::default().fields(&selector)),
    )
    .default_backoff()
    .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(watch);
        while let Some(item) = watch.next().await {
            if let Err(err) = item {
                tracing::warn!(%err, "pod watch (retrying)");
            }
        }
    });
    tracing::info!(
        node = node.name,
        selector,
        "kubernetes: watching this node's pods"
    );
    store
}

/// Writes the status ConfigMap (server-side apply); false if it failed.
async fn write_status(client: &Client, node: &Node, mounts: &[MountStatus]) -> bool {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &node.namespace);
    let cm = status_configmap(node, mounts, Timestamp::now());
    let params = PatchParams::apply("fs-supervisor").force();
    let name = status_configmap_name(&node.name);
    match configmaps.patch(&name, &params, &Patch::Apply(&cm)).await {
        Ok(_) => true,
        Err(err) => {
            tracing::warn!(%err, configmap = name, namespace = node.namespace, "cannot write the status ConfigMap (retrying; check the Role baton-fs-supervisor-status in deploy/kubernetes/rbac.yaml)");
            false
        }
    }
}

/// At most one status write per [`STATUS_INTERVAL_MS`], and never a lost
/// one: a status that arrives too soon is held back and written when the
/// interval has passed, even if nothing else happens on the node (a
/// quiet node must not show a stale generation).
pub struct StatusThrottle {
    interval: Duration,
    last_write: Option<Instant>,
    pending: Option<Vec<MountStatus>>,
}

impl Default for StatusThrottle {
    fn default() -> Self {
        StatusThrottle::new(Duration::from_millis(STATUS_INTERVAL_MS))
    }
}

impl StatusThrottle {
    /// At most one write per `interval`.
    pub fn new(interval: Duration) -> StatusThrottle {
        StatusThrottle {
            interval,
            last_write: None,
            pending: None,
        }
    }

    /// The latest statuses replace any held back.
    pub fn offer(&mut self, mounts: Vec<MountStatus>) {
        self.pending = Some(mounts);
    }

    /// How long until the held-back status is due (`None`: nothing held).
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        self.pending.as_ref()?;
        Some(match self.last_write {
            Some(at) => (at + self.interval).saturating_duration_since(now),
            None => Duration::ZERO,
        })
    }

    /// The statuses to write now, if any are held and due; counts as a write.
    pub fn take_due(&mut self, now: Instant) -> Option<Vec<MountStatus>> {
        if self.due_in(now)? > Duration::ZERO {
            return None;
        }
        self.last_write = Some(now);
        self.pending.take()
    }

    /// Whatever is held back, due or not.
    pub fn take_pending(&mut self) -> Option<Vec<MountStatus>> {
        self.pending.take()
    }
}

async fn publish_events(client: &Client, store: &Store<Pod>, node: &Node, events: &[MountEvent]) {
    let ready = tokio::time::timeout(
        Duration::from_millis(POD_LIST_WAIT_MS),
        store.wait_until_ready(),
    )
    .await;
    if !matches!(ready, Ok(Ok(()))) {
        tracing::warn!(
            events = events.len(),
            "no pod list yet (see the pod watch errors); these Events are dropped"
        );
        return;
    }
    let mut pods = store.state();
    // In a stable order (namespace, name), not the store's hash order.
    pods.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    for event in events {
        for pod in pods.iter().filter(|p| pod_uses_mount(p, &event.mountpoint)) {
            let object = event_object(pod, event, &node.name, Timestamp::now());
            let namespace = object.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
            if let Err(err) = api.create(&PostParams::default(), &object).await {
                tracing::warn!(%err, pod = ?pod.metadata.name, namespace, reason = event.kind.reason(), "cannot publish an Event");
            }
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
