//! Per-request counters of a generation: requests and a latency histogram
//! per opcode, bytes read and written. Lock-free and allocation-free on the
//! request path (a few relaxed atomic adds and two clock reads); the
//! generation's stats thread turns them into
//! [`upgrade_protocol::GenerationCounters`] for the supervisor about once a
//! second. They also tell when the last request ended
//! ([`RequestCounters::idle_for`]): the session timer's thread reclaims
//! unlinked inodes in the pauses between requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use upgrade_protocol::{
    GenerationCounters, OpcodeCounters, OperationCounters, StorageCounters, LATENCY_BOUNDS_US,
};

/// Opcodes counted one by one; higher ones (none in ABI 7.45, whose last
/// is 52) share the last slot.
pub const OPCODE_SLOT_COUNT: usize = 64;
const BUCKET_COUNT: usize = LATENCY_BOUNDS_US.len() + 1;

#[derive(Default)]
struct OpcodeSlot {
    count: AtomicU64,
    latency_us_sum: AtomicU64,
    buckets: [AtomicU64; BUCKET_COUNT],
}

/// The counters (one per [`super::BatonFs`]).
pub struct RequestCounters {
    slots: [OpcodeSlot; OPCODE_SLOT_COUNT],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    /// What `last_request_end_us` counts from.
    started: Instant,
    /// When the most recent request ended, µs after `started` (0: none
    /// yet).
    last_request_end_us: AtomicU64,
}

impl Default for RequestCounters {
    fn default() -> Self {
        RequestCounters {
            slots: std::array::from_fn(|_| OpcodeSlot::default()),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            started: Instant::now(),
            last_request_end_us: AtomicU64::new(0),
        }
    }
}

/// The bucket of a latency: the first bound it does not exceed. Pure.
fn bucket_index(latency_us: u64) -> usize {
    LATENCY_BOUNDS_US.partition_point(|&bound| bound < latency_us)
}

/// Counts one request when dropped (at the end of the filesystem method,
/// after its reply was sent or parked).
pub struct RequestTimer<'a> {
    counters: &'a RequestCounters,
    opcode: u32,
    start: Instant,
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        let end = Instant::now();
        let latency_us = end.duration_since(self.start).as_micros() as u64;
        self.counters.record(self.opcode, latency_us);
        // A plain store, not a compare-and-swap loop on the request path:
        // two workers ending at once may leave the earlier end, a few µs
        // off a pause measured in ms.
        let end_us = end.duration_since(self.counters.started).as_micros() as u64;
        self.counters
            .last_request_end_us
            .store(end_us, Ordering::Relaxed);
    }
}

impl RequestCounters {
    /// Starts timing a request of `opcode`.
    pub fn timer(&self, opcode: u32) -> RequestTimer<'_> {
        RequestTimer {
            counters: self,
            opcode,
            start: Instant::now(),
        }
    }

    fn record(&self, opcode: u32, latency_us: u64) {
        let slot = &self.slots[(opcode as usize).min(OPCODE_SLOT_COUNT - 1)];
        slot.count.fetch_add(1, Ordering::Relaxed);
        slot.latency_us_sum.fetch_add(latency_us, Ordering::Relaxed);
        slot.buckets[bucket_index(latency_us)].fetch_add(1, Ordering::Relaxed);
    }

    /// How long ago the most recent request ended (since the counters
    /// were made, if none has); zero while requests end now.
    pub fn idle_for(&self) -> std::time::Duration {
        let last_end_us = self.last_request_end_us.load(Ordering::Relaxed);
        self.started
            .elapsed()
            .saturating_sub(std::time::Duration::from_micros(last_end_us))
    }

    /// Counts bytes answered to a READ.
    pub fn read(&self, bytes: usize) {
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts bytes accepted by a WRITE.
    pub fn written(&self, bytes: u32) {
        self.written_bytes
            .fetch_add(u64::from(bytes), Ordering::Relaxed);
    }

    /// The counters so far (cache and upload fields left for the caller).
    /// Relaxed reads: a request being counted may show in `count` before
    /// its bucket, which the next report settles.
    pub fn snapshot(&self) -> GenerationCounters {
        let requests = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.count.load(Ordering::Relaxed) > 0)
            .map(|(opcode, slot)| OpcodeCounters {
                opcode: opcode as u32,
                count: slot.count.load(Ordering::Relaxed),
                latency_us_sum: slot.latency_us_sum.load(Ordering::Relaxed),
                latency_buckets: slot
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect(),
            })
            .collect();
        GenerationCounters {
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            requests,
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            ..GenerationCounters::default()
        }
    }
}

/// The storage part of a report: the object store's and the metadata
/// store's calls, what staging holds (bytes, and the modification time of
/// its least recently written block) and the cache's evictions. Histograms
/// keep their buckets only when their bounds are the report's. Pure but
/// for reading the clock.
pub fn storage_counters(
    store: &baton_blocks::StoreStats,
    transactions: &baton_meta::TxStats,
    (staged_bytes, staged_oldest): (u64, Option<SystemTime>),
    cache_eviction_count: u64,
) -> StorageCounters {
    let buckets = |same_bounds: bool, buckets: &[u64]| match same_bounds {
        true => buckets.to_vec(),
        false => Vec::new(),
    };
    let store_bounds = baton_blocks::STORE_LATENCY_BOUNDS_US == LATENCY_BOUNDS_US;
    let tx_bounds = baton_meta::TX_LATENCY_BOUNDS_US == LATENCY_BOUNDS_US;
    StorageCounters {
        object_store: store
            .operations
            .iter()
            .map(|(op, s)| OperationCounters {
                operation: op.name().to_string(),
                count: s.count,
                error_count: s.error_count,
                latency_us_sum: s.latency_us_sum,
                latency_buckets: buckets(store_bounds, &s.latency_buckets),
            })
            .collect(),
        object_store_received_bytes: store.received_bytes,
        object_store_sent_bytes: store.sent_bytes,
        metadata: transactions
            .iter()
            .map(|(kind, s)| OperationCounters {
                operation: kind.name().to_string(),
                count: s.count,
                error_count: s.error_count,
                latency_us_sum: s.latency_us_sum,
                latency_buckets: buckets(tx_bounds, &s.latency_buckets),
            })
            .collect(),
        staged_bytes,
        staged_oldest_age_s: staged_oldest
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map_or(0, |age| age.as_secs()),
        cache_eviction_count,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn storage_histograms_share_the_reports_bounds() {
        assert_eq!(baton_blocks::STORE_LATENCY_BOUNDS_US, LATENCY_BOUNDS_US);
        assert_eq!(baton_meta::TX_LATENCY_BOUNDS_US, LATENCY_BOUNDS_US);
    }

    #[test]
    fn storage_counters_carry_operations_staging_age_and_evictions() {
        let store = baton_blocks::StoreStats {
            operations: vec![(
                baton_blocks::StoreOp::Put,
                baton_blocks::StoreOpSnapshot {
                    count: 3,
                    error_count: 1,
                    latency_us_sum: 900,
                    latency_buckets: vec![0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                },
            )],
            received_bytes: 7,
            sent_bytes: 12,
        };
        let ten_s_ago = SystemTime::now() - std::time::Duration::from_secs(10);
        let storage = storage_counters(&store, &Vec::new(), (4096, Some(ten_s_ago)), 2);
        assert_eq!(storage.object_store.len(), 1);
        assert_eq!(storage.object_store[0].operation, "put");
        assert_eq!(storage.object_store[0].error_count, 1);
        assert_eq!(storage.object_store[0].latency_buckets.len(), 13);
        assert_eq!(storage.object_store_sent_bytes, 12);
        assert!((10..=11).contains(&storage.staged_oldest_age_s));
        assert_eq!(storage.staged_bytes, 4096);
        assert_eq!(storage.cache_eviction_count, 2);
    }

    #[test]
    fn latencies_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(50), 0);
        assert_eq!(bucket_index(51), 1);
        assert_eq!(bucket_index(5_000_000), LATENCY_BOUNDS_US.len() - 1);
        assert_eq!(bucket_index(u64::MAX), LATENCY_BOUNDS_US.len());
    }

    #[test]
    fn timed_requests_are_counted_by_opcode_with_bytes() {
        let counters = RequestCounters::default();
        drop(counters.timer(16));
        drop(counters.timer(16));
        drop(counters.timer(15));
        drop(counters.timer(9_999));
        counters.written(4096);
        counters.read(100);
        let snap = counters.snapshot();
        let count = |op| {
            snap.requests
                .iter()
                .find(|o| o.opcode == op)
                .map(|o| o.count)
        };
        assert_eq!(count(16), Some(2));
        assert_eq!(count(15), Some(1));
        assert_eq!(count(OPCODE_SLOT_COUNT as u32 - 1), Some(1));
        assert_eq!(count(1), None, "opcodes never seen are left out");
        let write = snap.requests.iter().find(|o| o.opcode == 16).unwrap();
        assert_eq!(write.latency_buckets.len(), LATENCY_BOUNDS_US.len() + 1);
        assert_eq!(write.latency_buckets.iter().sum::<u64>(), 2);
        assert_eq!((snap.written_bytes, snap.read_bytes), (4096, 100));
    }
}
