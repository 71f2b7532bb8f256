//! The bytes of each regular file's committed blocks (its `st_blocks`),
//! remembered between the commits that change them, so that repeated
//! GETATTRs of a large file do not sum its block rows every time.
//!
//! A value read from the metadata is remembered only if no commit
//! invalidated any inode while it was being read ([`CommittedBytes::token`]):
//! otherwise a read from before a commit could outlive the commit's
//! invalidation.

use std::collections::HashMap;
use std::sync::Mutex;

use super::lock;

/// Inodes whose committed bytes are remembered at most (all are forgotten
/// when it is reached).
pub const COMMITTED_BYTES_ENTRIES_MAX: usize = 65536;

#[derive(Debug, Default)]
pub(super) struct CommittedBytes {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    bytes: HashMap<u64, u64>,
    /// Invalidations so far.
    forgotten_count: u64,
}

impl CommittedBytes {
    /// The remembered bytes of `ino`.
    pub(super) fn get(&self, ino: u64) -> Option<u64> {
        lock(&self.inner).bytes.get(&ino).copied()
    }

    /// Take before reading a value from the metadata; pass to `remember`.
    pub(super) fn token(&self) -> u64 {
        lock(&self.inner).forgotten_count
    }

    /// Remembers `bytes` read after `token` was taken, unless an inode was
    /// invalidated since.
    pub(super) fn remember(&self, ino: u64, bytes: u64, token: u64) {
        let mut inner = lock(&self.inner);
        if inner.forgotten_count != token {
            return;
        }
        if inner.bytes.len() >= COMMITTED_BYTES_ENTRIES_MAX {
            inner.bytes.clear();
        }
        inner.bytes.insert(ino, bytes);
    }

    /// The block map of `ino` changed (or is about to).
    pub(super) fn forget(&self, ino: u64) {
        let mut inner = lock(&self.inner);
        inner.bytes.remove(&ino);
        inner.forgotten_count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_read_across_an_invalidation_is_not_remembered() {
        let cache = CommittedBytes::default();
        let token = cache.token();
        cache.remember(1, 100, token);
        assert_eq!(cache.get(1), Some(100));
        let stale = cache.token();
        cache.forget(1);
        cache.remember(1, 100, stale);
        assert_eq!(cache.get(1), None, "read before the commit, stale after it");
        cache.remember(1, 200, cache.token());
        assert_eq!(cache.get(1), Some(200));
    }
}
