//! The `/metrics` text (Prometheus exposition format 0.0.4, encoded by
//! `prometheus-client` from the latest snapshot at each scrape): per
//! supervisor (mounts, live generations, generations started, upgrades,
//! rollbacks) and per mount (labels `mount`, `mountpoint`, `volume`):
//! generation, health, restarts by cause, requests by opcode with a latency
//! histogram, bytes, block cache (evictions too), pending uploads, staged
//! bytes and the oldest staged block's age, object store requests, errors,
//! bytes and latency by operation, metadata transactions and their latency,
//! recovered and journaled requests, takeover and upgrade stalls. Every counter is a total over the
//! mount's life (summed across generations by `mount_tally`), so it never
//! goes down when a generation is replaced. Pure.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use upgrade_protocol::{GenerationCounters, MountCounters, MountStatus, OperationCounters};

use super::opcode_name;
use super::{Memory, SupervisorTotals};

type Labels = Vec<(&'static str, String)>;

fn mount_labels(m: &MountStatus) -> Labels {
    vec![
        ("mount", m.mount_id.clone()),
        ("mountpoint", m.mountpoint.to_string_lossy().into_owned()),
        ("volume", m.volume.clone()),
    ]
}

type Value = fn(&MountStatus, &MountCounters) -> Option<f64>;

/// One metric per mount: (name, type, help, value; None leaves the mount out).
const PER_MOUNT: &[(&str, Kind, &str, Value)] = &[
    ("baton_mount_generation", Kind::Gauge, "The generation serving (or starting).", |m, _| Some(m.generation as f64)),
    ("baton_mount_serving", Kind::Gauge, "1 when a generation serves the mount.", |m, _| Some(f64::from(u8::from(m.state == "serving")))),
    ("baton_mount_gave_up", Kind::Gauge, "1 once --give-up-after was reached: nothing serves the mount.", |m, _| Some(f64::from(u8::from(m.gave_up)))),
    ("baton_mount_uptime_seconds", Kind::Gauge, "Seconds since the mount was made.", |m, _| Some(m.uptime_s as f64)),
    ("baton_mount_generation_uptime_seconds", Kind::Gauge, "Seconds the current generation has served.", |m, _| Some(m.generation_uptime_s as f64)),
    ("baton_mount_consecutive_failures", Kind::Gauge, "Failed starts in a row.", |m, _| Some(f64::from(m.consecutive_failures))),
    ("baton_mount_read_bytes_total", Kind::Counter, "Bytes answered to READ requests.", |_, c| Some(c.io.read_bytes as f64)),
    ("baton_mount_written_bytes_total", Kind::Counter, "Bytes accepted by WRITE requests.", |_, c| Some(c.io.written_bytes as f64)),
    ("baton_mount_cache_hits_total", Kind::Counter, "Block reads served from the local block cache.", |_, c| Some(c.io.cache_hit_count as f64)),
    ("baton_mount_cache_misses_total", Kind::Counter, "Block reads fetched from the object store.", |_, c| Some(c.io.cache_miss_count as f64)),
    ("baton_mount_cache_hit_ratio", Kind::Gauge, "Block cache hits / (hits + misses) over the mount's life; absent before the first block read.", |_, c| {
        let total = c.io.cache_hit_count + c.io.cache_miss_count;
        (total > 0).then(|| c.io.cache_hit_count as f64 / total as f64)
    }),
    ("baton_mount_cache_used_bytes", Kind::Gauge, "Bytes in the mount's local block cache.", |_, c| Some(c.io.cache_used_bytes as f64)),
    ("baton_mount_cache_capacity_bytes", Kind::Gauge, "What the mount's local block cache may hold (0: blocks read in place from a local directory).", |_, c| Some(c.io.cache_capacity_bytes as f64)),
    ("baton_mount_uploads_pending", Kind::Gauge, "Files with staged data not yet uploaded to the object store.", |_, c| Some(c.io.uploads_pending as f64)),
    ("baton_mount_cache_evictions_total", Kind::Counter, "Blocks evicted from the local block cache to stay within its capacity.", |_, c| Some(c.io.storage.cache_eviction_count as f64)),
    ("baton_mount_staged_bytes", Kind::Gauge, "Bytes of staged blocks not yet uploaded to the object store (read when the generation reports, about once a second).", |_, c| Some(c.io.storage.staged_bytes as f64)),
    ("baton_mount_staged_oldest_age_seconds", Kind::Gauge, "Seconds since the least recently written staged block was written (0: nothing staged).", |_, c| Some(c.io.storage.staged_oldest_age_s as f64)),
    ("baton_mount_requests_recovered_total", Kind::Counter, "Resent requests answered from an exactly-once record of a dead generation.", |m, _| Some(m.requests_recovered as f64)),
    ("baton_mount_requests_journaled_total", Kind::Counter, "Requests handed from an old to a new generation in planned upgrades.", |_, c| Some(c.requests_journaled as f64)),
    ("baton_mount_generations_started_total", Kind::Counter, "Generation processes started (standbys and upgrade targets included).", |_, c| Some(c.generations_started as f64)),
    ("baton_mount_upgrades_total", Kind::Counter, "Planned upgrades that ended with the new generation serving.", |_, c| Some(c.upgrades as f64)),
    ("baton_mount_rollbacks_total", Kind::Counter, "Planned upgrades rolled back to the old generation.", |_, c| Some(c.rollbacks as f64)),
    ("baton_mount_last_takeover_seconds", Kind::Gauge, "Death to serving of the last crash recovery.", |m, _| {
        m.last_recovery.as_ref().and_then(|r| r.takeover_us).map(|us| us as f64 / 1e6)
    }),
    ("baton_mount_last_stall_seconds", Kind::Gauge, "Application-visible stall of the last planned upgrade.", |m, _| {
        m.last_upgrade.as_ref().and_then(|u| u.stall_us).map(|us| us as f64 / 1e6)
    }),
];

/// A metric's type; a counter's name ends in `_total`.
#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    Counter,
}

/// One scrape's data, encoded by `prometheus-client` (a collector is asked
/// for its samples at encode time).
#[derive(Debug)]
struct Scrape {
    mounts: Vec<MountStatus>,
    counters: Vec<MountCounters>,
    memory: Vec<Memory>,
    totals: SupervisorTotals,
    uptime_s: u64,
}

/// The metrics text; `memory` is each mount's, in order (a mount without
/// one has no memory series). Pure.
pub fn render(
    mounts: &[MountStatus],
    memory: &[Memory],
    totals: &SupervisorTotals,
    uptime_s: u64,
) -> String {
    let scrape = Scrape {
        mounts: mounts.to_vec(),
        counters: mounts
            .iter()
            .map(|m| m.counters.clone().unwrap_or_default())
            .collect(),
        memory: memory.to_vec(),
        totals: *totals,
        uptime_s,
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug
    // in a value we pass (none is user-controlled but label values, which
    // the encoder escapes).
    if let Err(err) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::warn!(%err, "encoding /metrics failed");
    }
    out
}

/// The name `prometheus-client` is given for `name`: a counter's without
/// the `_total` the encoder appends.
fn family_name(name: &str, kind: Kind) -> &str {
    match kind {
        Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
        Kind::Gauge => name,
    }
}

fn metric_type(kind: Kind) -> MetricType {
    match kind {
        Kind::Gauge => MetricType::Gauge,
        Kind::Counter => MetricType::Counter,
    }
}

/// One sample: whole numbers as integers (`4`, not `4.0`).
fn sample(encoder: &mut MetricEncoder, kind: Kind, value: f64) -> std::fmt::Result {
    let whole = value.fract() == 0.0 && value.abs() < 9.0e15;
    match (kind, whole) {
        (Kind::Counter, true) if value >= 0.0 => {
            encoder.encode_counter::<Labels, u64, f64>(&(value as u64), None)
        }
        (Kind::Counter, _) => encoder.encode_counter::<Labels, f64, f64>(&value, None),
        (Kind::Gauge, true) => encoder.encode_gauge(&(value as i64)),
        (Kind::Gauge, false) => encoder.encode_gauge(&value),
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.supervisor(&mut encoder)?;
        for (name, kind, help, value) in PER_MOUNT {
            let mut family = encoder.encode_descriptor(
                family_name(name, *kind),
                help,
                None,
                metric_type(*kind),
            )?;
            for (m, c) in self.mounts.iter().zip(&self.counters) {
                if let Some(v) = value(m, c) {
                    let labels = mount_labels(m);
                    sample(&mut family.encode_family(&labels)?, *kind, v)?;
                }
            }
        }
        self.memory(&mut encoder)?;
        self.restarts(&mut encoder)?;
        self.requests(&mut encoder)?;
        self.storage(&mut encoder)
    }
}

type MemoryValue = fn(&Memory) -> Option<u64>;

/// Per-mount memory gauges, read at scrape time: (name, help, value).
const MEMORY: [(&str, &str, MemoryValue); 3] = [
    ("baton_mount_generation_rss_bytes", "Resident memory of the serving generation (VmRSS), read at scrape time.", |m| m.rss_bytes),
    ("baton_mount_cgroup_memory_bytes", "Memory charged to the serving generation's cgroup (page cache included), read at scrape time.", |m| m.cgroup_bytes),
    ("baton_mount_cgroup_memory_limit_bytes", "The memory limit of the serving generation's cgroup (--memory-max); absent when unlimited.", |m| m.cgroup_limit_bytes),
];

impl Scrape {
    fn memory(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        for (name, help, value) in MEMORY {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (m, memory) in self.mounts.iter().zip(&self.memory) {
                if let Some(bytes) = value(memory) {
                    sample(
                        &mut family.encode_family(&mount_labels(m))?,
                        Kind::Gauge,
                        bytes as f64,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn supervisor(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let live_generations: usize = self
            .mounts
            .iter()
            .map(|m| usize::from(m.pid.is_some()) + usize::from(m.standby_pid.is_some()))
            .sum();
        let totals = &self.totals;
        let supervisor: [(&str, Kind, &str, u64); 6] = [
            (
                "baton_supervisor_uptime_seconds",
                Kind::Gauge,
                "Seconds since fs-supervisor started.",
                self.uptime_s,
            ),
            (
                "baton_supervisor_mounts",
                Kind::Gauge,
                "Mounts held.",
                self.mounts.len() as u64,
            ),
            (
                "baton_supervisor_generations",
                Kind::Gauge,
                "Generation processes alive (serving and standby).",
                live_generations as u64,
            ),
            (
                "baton_supervisor_generations_started_total",
                Kind::Counter,
                "Generation processes started, all mounts (unmounted ones included).",
                totals.generations_started,
            ),
            (
                "baton_supervisor_upgrades_total",
                Kind::Counter,
                "Planned upgrades that succeeded, all mounts.",
                totals.upgrades,
            ),
            (
                "baton_supervisor_rollbacks_total",
                Kind::Counter,
                "Planned upgrades rolled back, all mounts.",
                totals.rollbacks,
            ),
        ];
        for (name, kind, help, value) in supervisor {
            let mut metric = encoder.encode_descriptor(
                family_name(name, kind),
                help,
                None,
                metric_type(kind),
            )?;
            sample(&mut metric, kind, value as f64)?;
        }
        Ok(())
    }

    fn restarts(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(
            "baton_mount_restarts",
            "Deaths of the serving generation by cause (exit, signal, oom).",
            None,
            MetricType::Counter,
        )?;
        for m in &self.mounts {
            for (cause, n) in [
                ("exit", m.restarts.exit),
                ("signal", m.restarts.signal),
                ("oom", m.restarts.oom),
            ] {
                let mut labels = mount_labels(m);
                labels.push(("cause", cause.to_string()));
                family
                    .encode_family(&labels)?
                    .encode_counter::<Labels, u64, f64>(&n, None)?;
            }
        }
        Ok(())
    }

    fn requests(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(
            "baton_mount_requests",
            "FUSE requests handled, by opcode.",
            None,
            MetricType::Counter,
        )?;
        for (m, c) in self.mounts.iter().zip(&self.counters) {
            for o in &c.io.requests {
                let mut labels = mount_labels(m);
                labels.push(("opcode", opcode_name(o.opcode).into_owned()));
                family
                    .encode_family(&labels)?
                    .encode_counter::<Labels, u64, f64>(&o.count, None)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "baton_mount_request_duration_seconds",
            "Time a generation took to handle a FUSE request (read to reply), by opcode.",
            None,
            MetricType::Histogram,
        )?;
        for (m, c) in self.mounts.iter().zip(&self.counters) {
            histogram(&mut family, m, &c.io)?;
        }
        Ok(())
    }
}

/// A family of per-operation series: (name, help, label, the operations).
type OperationFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&GenerationCounters) -> &[OperationCounters],
);

/// One count of an operation (calls, errors).
type OperationValue = fn(&OperationCounters) -> u64;

/// Object store calls (label `operation`) and metadata transactions
/// (label `kind`): each a counter, an error counter and a histogram.
const OPERATION_FAMILIES: [OperationFamily; 2] = [
    (
        "baton_mount_object_store_request",
        "object store requests",
        "operation",
        |io| &io.storage.object_store,
    ),
    (
        "baton_mount_metadata_transaction",
        "metadata transactions",
        "kind",
        |io| &io.storage.metadata,
    ),
];

impl Scrape {
    fn storage(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        for (prefix, what, label, operations) in OPERATION_FAMILIES {
            let counts: [(&str, String, OperationValue); 2] = [
                (
                    "s",
                    format!("{what} (a retried call counts once), by {label}."),
                    |o| o.count,
                ),
                ("_errors", format!("{what} that failed, by {label}."), |o| {
                    o.error_count
                }),
            ];
            for (suffix, help, value) in counts {
                let name = format!("{prefix}{suffix}");
                let mut family =
                    encoder.encode_descriptor(&name, &help, None, MetricType::Counter)?;
                for (m, c) in self.mounts.iter().zip(&self.counters) {
                    for o in operations(&c.io) {
                        let mut labels = mount_labels(m);
                        labels.push((label, o.operation.clone()));
                        family
                            .encode_family(&labels)?
                            .encode_counter::<Labels, u64, f64>(&value(o), None)?;
                    }
                }
            }
            let name = format!("{prefix}_duration_seconds");
            let help = format!("Duration of {what}, by {label}.");
            let mut family =
                encoder.encode_descriptor(&name, &help, None, MetricType::Histogram)?;
            for (m, c) in self.mounts.iter().zip(&self.counters) {
                for o in operations(&c.io) {
                    let mut labels = mount_labels(m);
                    labels.push((label, o.operation.clone()));
                    let (sum_us, buckets) = (o.latency_us_sum, &o.latency_buckets);
                    encode_histogram(
                        &mut family,
                        &labels,
                        &c.io.latency_bounds_us,
                        sum_us,
                        buckets,
                    )?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "baton_mount_object_store_bytes",
            "Bytes exchanged with the object store (as stored: compressed and encrypted), by direction (received: GET bodies, sent: PUT bodies).",
            None,
            MetricType::Counter,
        )?;
        for (m, c) in self.mounts.iter().zip(&self.counters) {
            let storage = &c.io.storage;
            for (direction, bytes) in [
                ("received", storage.object_store_received_bytes),
                ("sent", storage.object_store_sent_bytes),
            ] {
                let mut labels = mount_labels(m);
                labels.push(("direction", direction.to_string()));
                family
                    .encode_family(&labels)?
                    .encode_counter::<Labels, u64, f64>(&bytes, None)?;
            }
        }
        Ok(())
    }
}

/// One histogram sample set: cumulative buckets from per-bucket counts;
/// left out when the buckets do not match the bounds.
fn encode_histogram(
    family: &mut MetricEncoder,
    labels: &Labels,
    bounds_us: &[u64],
    sum_us: u64,
    per_bucket: &[u64],
) -> std::fmt::Result {
    if per_bucket.len() != bounds_us.len() + 1 {
        return Ok(());
    }
    let buckets: Vec<(f64, u64)> = bounds_us
        .iter()
        .zip(per_bucket)
        .map(|(bound_us, n)| (*bound_us as f64 / 1e6, *n))
        .collect();
    let count: u64 = per_bucket.iter().sum();
    family.encode_family(labels)?.encode_histogram::<Labels>(
        sum_us as f64 / 1e6,
        count,
        &buckets,
        None,
    )
}

/// The histogram samples of one mount, by opcode: cumulative buckets,
/// `+Inf` equal to `_count` (the encoder sums the per-bucket counts).
fn histogram(
    family: &mut MetricEncoder,
    m: &MountStatus,
    io: &GenerationCounters,
) -> std::fmt::Result {
    for o in &io.requests {
        if o.latency_buckets.len() != io.latency_bounds_us.len() + 1 {
            continue;
        }
        let buckets: Vec<(f64, u64)> = io
            .latency_bounds_us
            .iter()
            .zip(&o.latency_buckets)
            .map(|(bound_us, n)| (*bound_us as f64 / 1e6, *n))
            .collect();
        let count: u64 = o.latency_buckets.iter().sum();
        let mut labels = mount_labels(m);
        labels.push(("opcode", opcode_name(o.opcode).into_owned()));
        family.encode_family(&labels)?.encode_histogram::<Labels>(
            o.latency_us_sum as f64 / 1e6,
            count,
            &buckets,
            None,
        )?;
    }
    Ok(())
}
