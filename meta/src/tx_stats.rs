//! Counters of metadata transactions (read and write), and of reads
//! answered from memory without one: calls, errors and a latency
//! histogram, kept by each engine for the generation's metrics report. A
//! few relaxed atomic adds per transaction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Upper bounds (µs, inclusive) of the latency histogram's buckets; one
/// more bucket counts the rest. The same as `upgrade_protocol`'s
/// `LATENCY_BOUNDS_US` (fsclient tests that they agree).
pub const TX_LATENCY_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000, 5_000_000,
];
const BUCKET_COUNT: usize = TX_LATENCY_BOUNDS_US.len() + 1;

/// A kind of metadata transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxKind {
    /// A read answered from memory, with no transaction (`row_cache.rs`).
    Memory,
    /// A read-only snapshot (or one read statement outside a transaction).
    Read,
    /// A write transaction (its retries after conflicts count once).
    Write,
}

impl TxKind {
    /// Every kind, in name order.
    pub const ALL: [TxKind; 3] = [TxKind::Memory, TxKind::Read, TxKind::Write];

    /// Its name, a metric label value.
    pub fn name(self) -> &'static str {
        match self {
            TxKind::Memory => "memory",
            TxKind::Read => "read",
            TxKind::Write => "write",
        }
    }

    fn index(self) -> usize {
        match self {
            TxKind::Read => 0,
            TxKind::Write => 1,
            TxKind::Memory => 2,
        }
    }
}

/// One kind's transactions so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxKindStats {
    /// Transactions.
    pub count: u64,
    /// Transactions that returned an error (refusals after a fence not
    /// counted: they never started).
    pub error_count: u64,
    /// Sum of their durations (waits for a connection or the writer
    /// included), µs.
    pub latency_us_sum: u64,
    /// Transactions per bucket of [`TX_LATENCY_BOUNDS_US`] (not
    /// cumulative; one more entry for the rest).
    pub latency_buckets: Vec<u64>,
}

/// What a metadata store's transactions were so far, by kind as
/// [`TxKind::ALL`]; kinds never run are left out.
pub type TxStats = Vec<(TxKind, TxKindStats)>;

#[derive(Default)]
struct Slot {
    count: AtomicU64,
    error_count: AtomicU64,
    latency_us_sum: AtomicU64,
    buckets: [AtomicU64; BUCKET_COUNT],
}

/// The counters of one engine.
#[derive(Default)]
pub(crate) struct TxCounters {
    slots: [Slot; 3],
}

impl std::fmt::Debug for TxCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxCounters").finish_non_exhaustive()
    }
}

impl TxCounters {
    /// Counts one transaction of `kind` that started at `start`.
    pub(crate) fn record(&self, kind: TxKind, start: Instant, ok: bool) {
        let latency_us = start.elapsed().as_micros() as u64;
        let slot = &self.slots[kind.index()];
        slot.count.fetch_add(1, Ordering::Relaxed);
        if !ok {
            slot.error_count.fetch_add(1, Ordering::Relaxed);
        }
        slot.latency_us_sum.fetch_add(latency_us, Ordering::Relaxed);
        let bucket = TX_LATENCY_BOUNDS_US.partition_point(|&bound| bound < latency_us);
        slot.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> TxStats {
        TxKind::ALL
            .iter()
            .map(|&kind| (kind, &self.slots[kind.index()]))
            .filter(|(_, slot)| slot.count.load(Ordering::Relaxed) > 0)
            .map(|(kind, slot)| {
                let stats = TxKindStats {
                    count: slot.count.load(Ordering::Relaxed),
                    error_count: slot.error_count.load(Ordering::Relaxed),
                    latency_us_sum: slot.latency_us_sum.load(Ordering::Relaxed),
                    latency_buckets: slot
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                };
                (kind, stats)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_counted_by_kind_with_errors() {
        let counters = TxCounters::default();
        counters.record(TxKind::Write, Instant::now(), true);
        counters.record(TxKind::Write, Instant::now(), false);
        let stats = counters.snapshot();
        assert_eq!(stats.len(), 1);
        let (kind, write) = &stats[0];
        assert_eq!(*kind, TxKind::Write);
        assert_eq!((write.count, write.error_count), (2, 1));
        assert_eq!(write.latency_buckets.iter().sum::<u64>(), 2);
    }
}
