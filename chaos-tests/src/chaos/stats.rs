//! What a workload process measured, in a form the harness merges: a
//! log-linear latency histogram (about 6% resolution) and the counters of a
//! [`WorkerReport`] (operations by kind, failed syscalls by errno,
//! verified, lost and corrupt bytes, mismatches against the model).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Failure messages kept per worker (the counters keep counting).
pub const FAILURE_MESSAGE_COUNT_MAX: usize = 40;
const SUB_BUCKET_BITS: u32 = 4;
const LINEAR_BELOW_US: u64 = 32;

/// The UTC time of day as `HH:MM:SS.mmm`, to line workload failures up
/// with faults and the supervisor's log.
pub fn wall_clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// A latency histogram in microseconds: exact below 32 µs, then 16
/// sub-buckets per power of two.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    /// Bucket index -> count.
    pub buckets: BTreeMap<u32, u64>,
    /// Samples recorded.
    pub count: u64,
    /// The largest sample (exact).
    pub max_us: u64,
}

fn bucket_of(us: u64) -> u32 {
    if us < LINEAR_BELOW_US {
        return us as u32;
    }
    let exponent = 63 - us.leading_zeros();
    let mantissa = (us >> (exponent - SUB_BUCKET_BITS)) & ((1 << SUB_BUCKET_BITS) - 1);
    LINEAR_BELOW_US as u32 + (exponent - 5) * (1 << SUB_BUCKET_BITS) + mantissa as u32
}

fn bucket_upper_us(bucket: u32) -> u64 {
    if u64::from(bucket) < LINEAR_BELOW_US {
        return u64::from(bucket);
    }
    let rest = bucket - LINEAR_BELOW_US as u32;
    let exponent = rest / (1 << SUB_BUCKET_BITS) + 5;
    let mantissa = u64::from(rest % (1 << SUB_BUCKET_BITS));
    (((1 << SUB_BUCKET_BITS) + mantissa + 1) << (exponent - SUB_BUCKET_BITS)) - 1
}

impl Histogram {
    /// Records one sample.
    pub fn record(&mut self, us: u64) {
        *self.buckets.entry(bucket_of(us)).or_default() += 1;
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (bucket, count) in &other.buckets {
            *self.buckets.entry(*bucket).or_default() += count;
        }
        self.count += other.count;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// The `per_mille`-th quantile (500 = median, 999 = p99.9), as the
    /// upper bound of its bucket, capped by the exact maximum.
    pub fn quantile_us(&self, per_mille: u64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = (self.count * per_mille).div_ceil(1000).max(1);
        let mut seen = 0;
        for (bucket, count) in &self.buckets {
            seen += count;
            if seen >= rank {
                return bucket_upper_us(*bucket).min(self.max_us);
            }
        }
        self.max_us
    }
}

/// Everything one workload process reports when it ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Worker name (`writer-0`).
    pub name: String,
    /// Successful and failed operations by kind (`write`, `fsync`, ...).
    pub ops: BTreeMap<String, u64>,
    /// Failed syscalls the scenario does not allow, by errno name.
    pub failed_syscalls: BTreeMap<String, u64>,
    /// Failed syscalls the scenario's fault must produce, by errno name.
    pub expected_errors: BTreeMap<String, u64>,
    /// Bytes of acknowledged writes read back and compared at the end.
    pub acknowledged_bytes_verified: u64,
    /// Bytes read during the run and compared with known content.
    pub read_bytes_verified: u64,
    /// Expected bytes that were missing (file gone, short, zeroed).
    pub lost_bytes: u64,
    /// Bytes that came back different.
    pub corrupt_bytes: u64,
    /// Differences between the tree on the mount and the model.
    pub tree_mismatches: u64,
    /// Whether the final tree was compared with the model.
    pub tree_checked: bool,
    /// The first failure messages.
    pub messages: Vec<String>,
    /// Latency of every timed operation.
    pub latency: Histogram,
}

impl WorkerReport {
    /// Keeps `message` if there is room.
    pub fn note(&mut self, message: String) {
        if self.messages.len() < FAILURE_MESSAGE_COUNT_MAX {
            self.messages.push(message);
        }
    }

    /// Adds another report's counters (the name stays).
    pub fn merge(&mut self, other: &WorkerReport) {
        let add = |into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>| {
            for (k, v) in from {
                *into.entry(k.clone()).or_default() += v;
            }
        };
        add(&mut self.ops, &other.ops);
        add(&mut self.failed_syscalls, &other.failed_syscalls);
        add(&mut self.expected_errors, &other.expected_errors);
        self.acknowledged_bytes_verified += other.acknowledged_bytes_verified;
        self.read_bytes_verified += other.read_bytes_verified;
        self.lost_bytes += other.lost_bytes;
        self.corrupt_bytes += other.corrupt_bytes;
        self.tree_mismatches += other.tree_mismatches;
        for m in &other.messages {
            self.note(format!("{}: {m}", other.name));
        }
        self.latency.merge(&other.latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bucket_resolution() {
        let mut h = Histogram::default();
        for us in 1..=10_000u64 {
            h.record(us);
        }
        let p50 = h.quantile_us(500);
        assert!((5_000..=5_400).contains(&p50), "{p50}");
        let p999 = h.quantile_us(999);
        assert!((9_990..=10_000).contains(&p999), "{p999}");
        assert_eq!(h.quantile_us(1000), 10_000);
        for us in [0, 5, 31, 32, 33, 100, 1_000_000, u64::from(u32::MAX)] {
            assert!(bucket_upper_us(bucket_of(us)) >= us, "{us}");
        }
    }

    #[test]
    fn merge_adds_counts() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(10);
        b.record(1_000);
        a.merge(&b);
        assert_eq!(a.count, 2);
        assert_eq!(a.max_us, 1_000);
    }
}
