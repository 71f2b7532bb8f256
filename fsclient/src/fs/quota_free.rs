//! The inodes no byte-limited quota counted when last asked, so that a
//! WRITE on a volume (or a file) without quotas does not ask the metadata
//! each time (on PostgreSQL that is a round trip per WRITE). A remembered
//! answer is trusted for [`QUOTA_FREE_RECHECK`]: a quota set on a
//! directory above a file being written applies to its writes within that
//! time. An inode a quota counts is never remembered (its headroom is read
//! at every growth), and a rename or link on this mount forgets everything
//! (it may have moved a file under a quota).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Inodes remembered at most; past it the map starts over.
pub const QUOTA_FREE_ENTRIES_MAX: usize = 4096;
/// How long "no byte limit counts this inode" is trusted.
pub const QUOTA_FREE_RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(super) struct QuotaFree {
    since: Mutex<HashMap<u64, Instant>>,
}

impl QuotaFree {
    /// `ino` was found free of byte limits less than
    /// [`QUOTA_FREE_RECHECK`] ago.
    pub(super) fn is_free(&self, ino: u64) -> bool {
        super::lock(&self.since)
            .get(&ino)
            .is_some_and(|t| t.elapsed() < QUOTA_FREE_RECHECK)
    }

    /// No byte-limited quota counts `ino` now.
    pub(super) fn remember(&self, ino: u64) {
        let mut map = super::lock(&self.since);
        if map.len() >= QUOTA_FREE_ENTRIES_MAX && !map.contains_key(&ino) {
            map.clear();
        }
        map.insert(ino, Instant::now());
    }

    /// A rename or link may have put files under a quota.
    pub(super) fn forget_all(&self) {
        super::lock(&self.since).clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        super::lock(&self.since).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_full_then_starts_over_and_forgets_on_demand() {
        let free = QuotaFree::default();
        assert!(!free.is_free(1));
        for ino in 0..QUOTA_FREE_ENTRIES_MAX as u64 {
            free.remember(ino);
        }
        assert_eq!(free.len(), QUOTA_FREE_ENTRIES_MAX);
        assert!(free.is_free(1));
        free.remember(u64::MAX);
        assert_eq!(free.len(), 1);
        assert!(!free.is_free(1) && free.is_free(u64::MAX));
        free.forget_all();
        assert!(!free.is_free(u64::MAX));
    }
}
