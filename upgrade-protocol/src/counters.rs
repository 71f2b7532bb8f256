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
