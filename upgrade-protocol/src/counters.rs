//! Request counters a generation reports to its holder in
//! [`Message::Stats`](crate::Message::Stats), and the per-mount totals the
//! supervisor keeps across generations (for `/metrics` and the status page).
//!
//! Both are optional on the wire (`#[serde(default)]`): a generation that
//! predates them sends none, and a supervisor that predates them ignores
//! them (unknown fields are skipped), so protocol version 1 still holds.

use serde::{Deserialize, Serialize};

/// Upper bounds (µs, inclusive) of the request latency histogram's
/// buckets; one more bucket counts the rest (`+Inf`).
pub const LATENCY_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000, 5_000_000,
];

/// One FUSE opcode's requests in a generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpcodeCounters {
    /// The FUSE opcode (`FUSE_READ` = 15, ...).
    pub opcode: u32,
    /// Requests handled.
    pub count: u64,
    /// Sum of their handling times, µs.
    pub latency_us_sum: u64,
    /// Requests per latency bucket, NOT cumulative: entry `i` counts
    /// latencies in `(bounds[i-1], bounds[i]]`, the last one those above
    /// every bound. `latency_bounds_us.len() + 1` entries.
    pub latency_buckets: Vec<u64>,
}

/// Counters of one generation since it started (all monotonic except
/// `uploads_pending`, a gauge).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationCounters {
    /// The histogram bucket bounds the generation used
    /// ([`LATENCY_BOUNDS_US`] when it was built).
    pub latency_bounds_us: Vec<u64>,
    /// Opcodes with at least one request, by opcode.
    pub requests: Vec<OpcodeCounters>,
    /// Bytes answered to READ.
    pub read_bytes: u64,
    /// Bytes accepted by WRITE.
    pub written_bytes: u64,
    /// Block reads served from the local block cache.
    pub cache_hit_count: u64,
    /// Block reads that fetched from the object store.
    pub cache_miss_count: u64,
    /// Files with staged data not yet uploaded (gauge).
    pub uploads_pending: u64,
    /// Object store, metadata transaction, staging and eviction counters
    /// (absent from older generations' reports).
    #[serde(default, skip_serializing_if = "StorageCounters::is_empty")]
    pub storage: StorageCounters,
    /// Bytes in the local block cache now (gauge; absent from older
    /// generations' reports).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_used_bytes: u64,
    /// What the local block cache may hold (gauge; 0: no cache, a local
    /// directory's blocks are read in place).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_capacity_bytes: u64,
    /// Why the volume's metadata takes no more changes: corruption found
    /// while serving (state, not a count: never summed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_quarantined: Option<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One kind of operation's calls in a generation: an object store
/// operation (`get`, `put`, `delete`, `list`) or a metadata transaction
/// (`read`, `write`). Its histogram uses the generation's
/// `latency_bounds_us`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationCounters {
    /// The operation's name, a Prometheus label value.
    pub operation: String,
    /// Calls (retries inside one call are not counted apart).
    pub count: u64,
    /// Calls that returned an error.
    pub error_count: u64,
    /// Sum of their durations, µs.
    pub latency_us_sum: u64,
    /// Calls per latency bucket, NOT cumulative (as
    /// [`OpcodeCounters::latency_buckets`]).
    pub latency_buckets: Vec<u64>,
}

/// What a generation's storage did: object store requests and bytes,
/// metadata transactions (monotonic), what is staged and not uploaded
/// (gauges, computed when the report is made) and block cache evictions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageCounters {
    /// Object store calls by operation, sorted by name.
    #[serde(default)]
    pub object_store: Vec<OperationCounters>,
    /// Bytes received from the object store (GET bodies).
    #[serde(default)]
    pub object_store_received_bytes: u64,
    /// Bytes sent to the object store (PUT bodies, as stored).
    #[serde(default)]
    pub object_store_sent_bytes: u64,
    /// Metadata transactions by kind (`read`, `write`), sorted by name.
    #[serde(default)]
    pub metadata: Vec<OperationCounters>,
    /// Bytes of staged blocks not yet uploaded (gauge).
    #[serde(default)]
    pub staged_bytes: u64,
    /// Seconds since the least recently written staged block was written
    /// (gauge; 0 when nothing is staged).
    #[serde(default)]
    pub staged_oldest_age_s: u64,
    /// Blocks evicted from the local block cache to stay within capacity.
    #[serde(default)]
    pub cache_eviction_count: u64,
}

impl StorageCounters {
    /// Whether nothing was counted (left out of a report then).
    pub fn is_empty(&self) -> bool {
        self == &StorageCounters::default()
    }

    /// Adds `other`'s monotonic counters to these; the gauges are left
    /// alone. `same_bounds`: both histograms have the same bucket bounds
    /// (else only counts and sums are merged). Pure.
    pub fn add(&mut self, other: &StorageCounters, bucket_count: usize, same_bounds: bool) {
        add_operations(
            &mut self.object_store,
            &other.object_store,
            bucket_count,
            same_bounds,
        );
        add_operations(
            &mut self.metadata,
            &other.metadata,
            bucket_count,
            same_bounds,
        );
        self.object_store_received_bytes += other.object_store_received_bytes;
        self.object_store_sent_bytes += other.object_store_sent_bytes;
        self.cache_eviction_count += other.cache_eviction_count;
    }
}

fn add_operations(
    ours: &mut Vec<OperationCounters>,
    theirs: &[OperationCounters],
    bucket_count: usize,
    same_bounds: bool,
) {
    for t in theirs {
        let index = match ours.binary_search_by(|o| o.operation.cmp(&t.operation)) {
            Ok(index) => index,
            Err(index) => {
                ours.insert(
                    index,
                    OperationCounters {
                        operation: t.operation.clone(),
                        latency_buckets: vec![0; bucket_count],
                        ..OperationCounters::default()
                    },
                );
                index
            }
        };
        let o = &mut ours[index];
        o.count += t.count;
        o.error_count += t.error_count;
        o.latency_us_sum += t.latency_us_sum;
        if same_bounds && o.latency_buckets.len() == t.latency_buckets.len() {
            for (a, b) in o.latency_buckets.iter_mut().zip(&t.latency_buckets) {
                *a += b;
            }
        }
    }
}

impl GenerationCounters {
    /// Adds `other`'s monotonic counters to these (a finished generation's
    /// counts into a mount's total). Histograms with other bounds than
    /// ours are not merged (their counts and sums still are). Pure.
    pub fn add(&mut self, other: &GenerationCounters) {
        if self.latency_bounds_us.is_empty() {
            self.latency_bounds_us = other.latency_bounds_us.clone();
        }
        let same_bounds = self.latency_bounds_us == other.latency_bounds_us;
        for theirs in &other.requests {
            let index = match self
                .requests
                .binary_search_by_key(&theirs.opcode, |o| o.opcode)
            {
                Ok(index) => index,
                Err(index) => {
                    self.requests.insert(
                        index,
                        OpcodeCounters {
                            opcode: theirs.opcode,
                            latency_buckets: vec![0; self.latency_bounds_us.len() + 1],
                            ..OpcodeCounters::default()
                        },
                    );
                    index
                }
            };
            let ours = &mut self.requests[index];
            ours.count += theirs.count;
            ours.latency_us_sum += theirs.latency_us_sum;
            if same_bounds {
                for (a, b) in ours.latency_buckets.iter_mut().zip(&theirs.latency_buckets) {
                    *a += b;
                }
            }
        }
        self.read_bytes += other.read_bytes;
        self.written_bytes += other.written_bytes;
        self.cache_hit_count += other.cache_hit_count;
        self.cache_miss_count += other.cache_miss_count;
        let bucket_count = self.latency_bounds_us.len() + 1;
        self.storage.add(&other.storage, bucket_count, same_bounds);
    }

    /// Requests of every opcode.
    pub fn request_count(&self) -> u64 {
        self.requests.iter().map(|o| o.count).sum()
    }
}

/// A mount's counters over its whole life, kept by the supervisor: the
/// sum of every generation's last report plus the serving one's latest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountCounters {
    /// Request, byte and cache counters of all generations (monotonic);
    /// `uploads_pending` is the serving generation's.
    pub io: GenerationCounters,
    /// Generations started (standbys and upgrade targets included).
    pub generations_started: u64,
    /// Planned upgrades that ended with the new generation serving.
    pub upgrades: u64,
    /// Planned upgrades rolled back to the old generation.
    pub rollbacks: u64,
    /// Requests journaled from an old generation to a new one in upgrades.
    pub requests_journaled: u64,
}

/// Something that went wrong with a mount, for the status page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incident {
    /// When the supervisor saw it (Unix time, ms).
    pub at_unix_ms: u64,
    /// The generation concerned.
    pub generation: u64,
    /// `oom`, `signal`, `exit` (deaths of the serving generation or of one
    /// starting), `rollback`.
    pub kind: String,
    /// In words: the cause, and the last line the generation logged.
    pub detail: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_report_without_storage_counters_still_parses_and_none_are_sent_empty() {
        let old = r#"{"latency_bounds_us":[],"requests":[],"read_bytes":1,"written_bytes":2,
            "cache_hit_count":0,"cache_miss_count":0,"uploads_pending":0}"#;
        let parsed: GenerationCounters = serde_json::from_str(old).unwrap();
        assert!(parsed.storage.is_empty());
        let sent = serde_json::to_string(&parsed).unwrap();
        assert!(!sent.contains("storage"), "{sent}");
    }

    #[test]
    fn storage_counters_sum_across_generations_by_operation() {
        let one = |operation: &str, count| GenerationCounters {
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            storage: StorageCounters {
                object_store: vec![OperationCounters {
                    operation: operation.to_string(),
                    count,
                    error_count: 1,
                    latency_us_sum: 10,
                    latency_buckets: vec![count; LATENCY_BOUNDS_US.len() + 1],
                }],
                object_store_sent_bytes: 100,
                staged_bytes: 7,
                cache_eviction_count: 2,
                ..StorageCounters::default()
            },
            ..GenerationCounters::default()
        };
        let mut total = GenerationCounters::default();
        total.add(&one("put", 2));
        total.add(&one("get", 3));
        total.add(&one("put", 4));
        let ops = &total.storage.object_store;
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].operation.as_str(), ops[0].count), ("get", 3));
        assert_eq!(
            (ops[1].operation.as_str(), ops[1].count, ops[1].error_count),
            ("put", 6, 2)
        );
        assert_eq!(ops[1].latency_buckets[0], 6);
        assert_eq!(total.storage.object_store_sent_bytes, 300);
        assert_eq!(total.storage.cache_eviction_count, 6);
        // A gauge is never summed.
        assert_eq!(total.storage.staged_bytes, 0);
    }
}
