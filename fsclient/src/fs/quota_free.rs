//! The inodes no byte-limited quota counted when last asked, so that a
//! WRITE on a volume (or a file) without quotas does not ask the metadata
//! each time (on PostgreSQL that is a round trip per WRITE). A remembered
//! answer is trusted for [`QUOTA_FREE_RECHECK`]: a quota set on a
//! directory above a file being written applies to its writes within that
//! time. An inode a quota counts is never remembered (its headroom is read
//! at every growth), and a rename or link on this mount forgets everything
//! (it may have moved a file under a quota).
//!
//! Before any of that, the volume as a whole: whether any quota has a byte
//! limit, asked at most once per [`QUOTA_FREE_RECHECK`], so that on a
//! volume without byte limits (most of them) no WRITE ever asks, not even
//! a new file's first.

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
    /// When the volume was last found to have no byte-limited quota.
    volume_free_since: Mutex<Option<Instant>>,
}

impl QuotaFree {
    /// Whether the volume may hold a byte-limited quota: `ask` (a listing
    /// of the volume's quotas) runs at most once per
    /// [`QUOTA_FREE_RECHECK`] while the answer is "none".
    pub(super) fn volume_may_limit<E>(
        &self,
        ask: impl FnOnce() -> Result<bool, E>,
    ) -> Result<bool, E> {
        let mut since = super::lock(&self.volume_free_since);
        if since.is_some_and(|t| t.elapsed() < QUOTA_FREE_RECHECK) {
            return Ok(false);
        }
        let limited = ask()?;
        *since = (!limited).then(Instant::now);
        Ok(limited)
    }

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
    fn a_volume_without_byte_limits_is_asked_once_per_recheck() {
        let free = QuotaFree::default();
        let mut asked = 0;
        let mut ask = |limited: bool| {
            free.volume_may_limit(|| {
                asked += 1;
                Ok::<bool, ()>(limited)
            })
        };
        assert_eq!(ask(false), Ok(false));
        assert_eq!(ask(false), Ok(false), "trusted within the recheck");
        assert_eq!(asked, 1);
        // A volume with limits is asked every time (the per-inode path runs).
        let limited = QuotaFree::default();
        let mut count = 0;
        for _ in 0..2 {
            let answer = limited.volume_may_limit(|| {
                count += 1;
                Ok::<bool, ()>(true)
            });
            assert_eq!(answer, Ok(true));
        }
        assert_eq!(count, 2);
    }

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
