//! Counters of object store calls (count, errors, a latency histogram per
//! operation, bytes each way), kept by a [`crate::BlockStore`] for the
//! generation's metrics report. A few relaxed atomic adds per call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Upper bounds (µs, inclusive) of the latency histogram's buckets; one
/// more bucket counts the rest. The same as `upgrade_protocol`'s
/// `LATENCY_BOUNDS_US` (fsclient tests that they agree).
pub const STORE_LATENCY_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000, 5_000_000,
];
const BUCKET_COUNT: usize = STORE_LATENCY_BOUNDS_US.len() + 1;

/// An object store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// A (ranged or whole) GET.
    Get,
    /// A PUT (single or multipart).
    Put,
    /// A DELETE.
    Delete,
    /// A LIST.
    List,
}

impl StoreOp {
    /// Every operation, in name order.
    pub const ALL: [StoreOp; 4] = [StoreOp::Delete, StoreOp::Get, StoreOp::List, StoreOp::Put];

    /// Its name, a metric label value.
    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::Put => "put",
            StoreOp::Delete => "delete",
            StoreOp::List => "list",
        }
    }
}

#[derive(Default)]
struct Slot {
    count: AtomicU64,
    error_count: AtomicU64,
    latency_us_sum: AtomicU64,
    buckets: [AtomicU64; BUCKET_COUNT],
}

/// One operation's counts so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOpSnapshot {
    /// Calls.
    pub count: u64,
    /// Calls that failed.
    pub error_count: u64,
    /// Sum of their durations, µs.
    pub latency_us_sum: u64,
    /// Calls per bucket of [`STORE_LATENCY_BOUNDS_US`] (not cumulative;
    /// one more entry for the rest).
    pub latency_buckets: Vec<u64>,
}

/// What a store did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// By operation, as [`StoreOp::ALL`]; operations never called are left out.
    pub operations: Vec<(StoreOp, StoreOpSnapshot)>,
    /// Bytes received (GET bodies).
    pub received_bytes: u64,
    /// Bytes sent (PUT bodies as stored).
    pub sent_bytes: u64,
}

/// The counters of one store.
#[derive(Default)]
pub(crate) struct StoreCounters {
    slots: [Slot; 4],
    received_bytes: AtomicU64,
    sent_bytes: AtomicU64,
}

impl std::fmt::Debug for StoreCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCounters").finish_non_exhaustive()
    }
}

fn slot_index(op: StoreOp) -> usize {
    match op {
        StoreOp::Delete => 0,
        StoreOp::Get => 1,
        StoreOp::List => 2,
        StoreOp::Put => 3,
    }
}

/// The bucket of a latency: the first bound it does not exceed. Pure.
fn bucket_index(latency_us: u64) -> usize {
    STORE_LATENCY_BOUNDS_US.partition_point(|&bound| bound < latency_us)
}

impl StoreCounters {
    /// Counts one call of `op` that started at `start`.
    pub(crate) fn record(&self, op: StoreOp, start: Instant, ok: bool) {
        let latency_us = start.elapsed().as_micros() as u64;
        let slot = &self.slots[slot_index(op)];
        slot.count.fetch_add(1, Ordering::Relaxed);
        if !ok {
            slot.error_count.fetch_add(1, Ordering::Relaxed);
        }
        slot.latency_us_sum.fetch_add(latency_us, Ordering::Relaxed);
        slot.buckets[bucket_index(latency_us)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn received(&self, bytes: u64) {
        self.received_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sent(&self, bytes: u64) {
        self.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        let operations = StoreOp::ALL
            .iter()
            .map(|&op| (op, &self.slots[slot_index(op)]))
            .filter(|(_, slot)| slot.count.load(Ordering::Relaxed) > 0)
            .map(|(op, slot)| {
                let snapshot = StoreOpSnapshot {
                    count: slot.count.load(Ordering::Relaxed),
                    error_count: slot.error_count.load(Ordering::Relaxed),
                    latency_us_sum: slot.latency_us_sum.load(Ordering::Relaxed),
                    latency_buckets: slot
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                };
                (op, snapshot)
            })
            .collect();
        StoreStats {
            operations,
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_operation_with_errors_and_buckets() {
        let counters = StoreCounters::default();
        counters.record(StoreOp::Put, Instant::now(), true);
        counters.record(StoreOp::Put, Instant::now(), false);
        counters.record(StoreOp::Get, Instant::now(), true);
        counters.sent(10);
        counters.received(4);
        let stats = counters.snapshot();
        let names: Vec<_> = stats.operations.iter().map(|(op, _)| op.name()).collect();
        assert_eq!(names, ["get", "put"]);
        let put = &stats.operations[1].1;
        assert_eq!((put.count, put.error_count), (2, 1));
        assert_eq!(put.latency_buckets.len(), BUCKET_COUNT);
        assert_eq!(put.latency_buckets.iter().sum::<u64>(), 2);
        assert_eq!((stats.sent_bytes, stats.received_bytes), (10, 4));
    }
}
