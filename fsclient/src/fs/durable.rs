//! An fsync's part of the object store: which committed objects may not
//! be on the disk yet.
//!
//! A local-directory store writes its object files without syncing them (a
//! close need not reach the disk), so FSYNC must sync the file's objects
//! before it syncs the metadata that names them: otherwise a power loss
//! after an acknowledged fsync leaves a block map pointing at objects the
//! disk never got (a file that reads short, or EIO).
//!
//! Each commit of this generation records its new objects per inode; FSYNC
//! syncs those. An inode this generation has not synced whole yet (its
//! objects may come from a dead predecessor, which left them in the page
//! cache) has every object of its block map synced at its first FSYNC, and
//! is tracked from then on. The record is bounded: past
//! [`UNSYNCED_KEYS_MAX`] objects or [`TRACKED_INODES_MAX`] inodes it is
//! dropped, and every inode starts again from
//! its whole block map. SYNCFS syncs the store's filesystem in one call.

use std::collections::{HashMap, HashSet};

use baton_blocks::ObjectKey;

/// Recorded objects at most before the record is dropped.
pub const UNSYNCED_KEYS_MAX: usize = 1 << 16;
/// Tracked inodes at most before the record is dropped.
pub const TRACKED_INODES_MAX: usize = 1 << 20;

/// Objects committed since their inode was last synced (module docs).
#[derive(Debug, Default)]
pub(super) struct Unsynced {
    /// Inodes synced whole by this generation: their objects since are in
    /// `keys`.
    tracked: HashSet<u64>,
    keys: HashMap<u64, Vec<ObjectKey>>,
    key_count: usize,
}

/// What an FSYNC must sync for one inode.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ToSync {
    /// These objects (possibly none).
    Keys(Vec<ObjectKey>),
    /// Every object of the inode's block map.
    Whole,
}

impl Unsynced {
    /// A commit of `ino` made `keys`.
    pub(super) fn committed(&mut self, ino: u64, keys: &[ObjectKey]) {
        if keys.is_empty() || !self.tracked.contains(&ino) {
            return;
        }
        if self.key_count + keys.len() > UNSYNCED_KEYS_MAX {
            tracing::debug!(
                keys = self.key_count,
                "unsynced object record full; fsyncs sync whole block maps again"
            );
            *self = Self::default();
            return;
        }
        self.key_count += keys.len();
        self.keys.entry(ino).or_default().extend_from_slice(keys);
    }

    /// What FSYNC of `ino` syncs; the caller holds the inode's mutex and
    /// reports the outcome with [`Unsynced::synced`].
    pub(super) fn take(&mut self, ino: u64) -> ToSync {
        if !self.tracked.contains(&ino) {
            return ToSync::Whole;
        }
        let keys = self.keys.remove(&ino).unwrap_or_default();
        self.key_count -= keys.len();
        ToSync::Keys(keys)
    }

    /// The sync [`Unsynced::take`] asked for succeeded (`true`): `ino` is
    /// tracked from now on; or failed: its whole block map next time.
    pub(super) fn synced(&mut self, ino: u64, ok: bool) {
        if ok {
            if self.tracked.len() >= TRACKED_INODES_MAX {
                *self = Self::default();
            }
            self.tracked.insert(ino);
        } else {
            self.tracked.remove(&ino);
            if let Some(keys) = self.keys.remove(&ino) {
                self.key_count -= keys.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(ino: u64, index: u64) -> ObjectKey {
        ObjectKey::generate(ino, index, baton_blocks::KeyLayout::default())
    }

    #[test]
    fn an_inode_is_synced_whole_first_then_only_its_new_objects() {
        let mut u = Unsynced::default();
        let early = key(7, 0);
        // Committed before the first fsync: not recorded.
        u.committed(7, std::slice::from_ref(&early));
        assert_eq!(u.take(7), ToSync::Whole);
        u.synced(7, true);
        assert_eq!(u.take(7), ToSync::Keys(vec![]));
        let (a, b) = (key(7, 1), key(7, 2));
        u.committed(7, std::slice::from_ref(&a));
        u.committed(7, std::slice::from_ref(&b));
        assert_eq!(u.take(7), ToSync::Keys(vec![a, b]));
        u.synced(7, true);
        assert_eq!(u.take(7), ToSync::Keys(vec![]));
    }

    #[test]
    fn a_failed_sync_or_a_full_record_goes_back_to_the_whole_map() {
        let mut u = Unsynced::default();
        u.synced(1, true);
        u.committed(1, &[key(1, 0)]);
        let ToSync::Keys(keys) = u.take(1) else {
            panic!("tracked")
        };
        assert_eq!(keys.len(), 1);
        u.synced(1, false);
        assert_eq!(u.take(1), ToSync::Whole);

        u.synced(2, true);
        let many: Vec<ObjectKey> = (0..UNSYNCED_KEYS_MAX as u64).map(|i| key(2, i)).collect();
        u.committed(2, &many);
        u.committed(2, &[key(2, u64::MAX)]);
        assert_eq!(u.take(2), ToSync::Whole);
        assert_eq!(u.key_count, 0);
    }
}
