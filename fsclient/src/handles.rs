//! Open file and directory handles, and how many are open per inode.
//!
//! An unlinked inode (nlink 0, an orphan in the metadata) stays readable and
//! writable while a handle is open; the last release reclaims it. The table
//! knows which orphans wait for their last release.
//!
//! Handles are numbered from a counter that starts at `generation <<`
//! [`FH_GENERATION_SHIFT`], so no two generations of a mount issue the same
//! number. A handle number the table does not know (issued by an earlier
//! generation whose table was lost in a crash) is accepted for I/O, which
//! works by nodeid only, and its release is a no-op here. Such a table is
//! *inherited*: open counts may miss handles the kernel holds, so an orphan
//! is released by it only once the kernel has no inode for it either (see
//! `fs/orphans.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Open handles at most; OPEN beyond it gets ENFILE.
pub const HANDLES_MAX: usize = 1 << 20;
/// Handle numbers of generation g start at `g << FH_GENERATION_SHIFT`
/// (2^40 handles per generation, 2^24 generations).
pub const FH_GENERATION_SHIFT: u32 = 40;

/// One open file or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The inode.
    pub ino: u64,
    /// The open(2) flags.
    pub flags: u32,
    /// A directory handle.
    pub dir: bool,
}

#[derive(Default)]
struct Inner {
    handles: HashMap<u64, Handle>,
    open_count: HashMap<u64, u32>,
    orphans: HashSet<u64>,
}

/// The handle table, shared by every worker.
pub struct Handles {
    next_fh: AtomicU64,
    /// The kernel may hold handles this table never saw.
    inherited: AtomicBool,
    inner: Mutex<Inner>,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            next_fh: AtomicU64::new(1),
            inherited: AtomicBool::new(false),
            inner: Mutex::new(Inner::default()),
        }
    }
}

/// What a release found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The handle, if this table issued it.
    pub handle: Option<Handle>,
    /// The inode is an orphan and this was its last open handle: reclaim it.
    pub reclaim: bool,
}

impl Handles {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The maps stay consistent: every mutation is one statement.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Numbers handles from `generation`'s range; `inherited` as in the
    /// module docs. Call before the first open.
    pub fn start_generation(&self, generation: u64, inherited: bool) {
        let first = (generation << FH_GENERATION_SHIFT).max(1);
        self.next_fh.fetch_max(first, Ordering::Relaxed);
        self.inherited.store(inherited, Ordering::Relaxed);
    }

    /// Registers a new handle; `None` when [`HANDLES_MAX`] are open.
    pub fn open(&self, handle: Handle) -> Option<u64> {
        let mut inner = self.lock();
        if inner.handles.len() >= HANDLES_MAX {
            return None;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        inner.handles.insert(fh, handle);
        *inner.open_count.entry(handle.ino).or_insert(0) += 1;
        Some(fh)
    }

    /// The handle `fh`, if this table issued it.
    pub fn get(&self, fh: u64) -> Option<Handle> {
        self.lock().handles.get(&fh).copied()
    }

    /// Removes `fh`; says whether its inode must now be reclaimed.
    pub fn release(&self, fh: u64) -> Released {
        let mut inner = self.lock();
        let Some(handle) = inner.handles.remove(&fh) else {
            return Released {
                handle: None,
                reclaim: false,
            };
        };
        let ino = handle.ino;
        let left = match inner.open_count.get_mut(&ino) {
            Some(count) => {
                *count = count.saturating_sub(1);
                *count
            }
            None => 0,
        };
        if left == 0 {
            inner.open_count.remove(&ino);
        }
        let reclaim = left == 0 && inner.orphans.remove(&ino);
        Released {
            handle: Some(handle),
            reclaim,
        }
    }

    /// Handles open on `ino`.
    pub fn open_count(&self, ino: u64) -> u32 {
        self.lock().open_count.get(&ino).copied().unwrap_or(0)
    }

    /// Whether the kernel may hold handles this table never saw (an
    /// earlier generation's, lost in a crash).
    pub fn inherited(&self) -> bool {
        self.inherited.load(Ordering::Relaxed)
    }

    /// Marks `ino` as an orphan kept alive by this table's open handles
    /// (its last release will say `reclaim`). Returns false, marking
    /// nothing, when no handle is open on it.
    pub fn mark_orphan(&self, ino: u64) -> bool {
        let mut inner = self.lock();
        if inner.open_count.contains_key(&ino) {
            inner.orphans.insert(ino);
            true
        } else {
            inner.orphans.remove(&ino);
            false
        }
    }

    /// `ino` is no orphan any more (an O_TMPFILE was linked).
    pub fn unmark_orphan(&self, ino: u64) {
        self.lock().orphans.remove(&ino);
    }

    /// The orphans this table keeps alive.
    pub fn open_orphans(&self) -> Vec<u64> {
        self.lock().orphans.iter().copied().collect()
    }

    /// Every open handle, the next number and the open orphans (handover).
    pub fn export(&self) -> (Vec<(u64, Handle)>, u64, Vec<u64>) {
        let inner = self.lock();
        let handles = inner.handles.iter().map(|(fh, h)| (*fh, *h)).collect();
        let orphans = inner.orphans.iter().copied().collect();
        (handles, self.next_fh.load(Ordering::Relaxed), orphans)
    }

    /// Takes over a predecessor's table (handover): its handles keep their
    /// numbers, and numbering continues past both tables. The table is not
    /// inherited: it is complete.
    pub fn import(&self, handles: &[(u64, Handle)], next_fh: u64, orphans: &[u64]) {
        let mut inner = self.lock();
        for (fh, handle) in handles {
            if inner.handles.insert(*fh, *handle).is_none() {
                *inner.open_count.entry(handle.ino).or_insert(0) += 1;
            }
        }
        inner.orphans.extend(orphans.iter().copied());
        self.next_fh.fetch_max(next_fh, Ordering::Relaxed);
        self.inherited.store(false, Ordering::Relaxed);
    }

    /// Whether `ino` is an orphan kept alive by open handles.
    pub fn is_open_orphan(&self, ino: u64) -> bool {
        self.lock().orphans.contains(&ino)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(ino: u64) -> Handle {
        Handle {
            ino,
            flags: 0,
            dir: false,
        }
    }

    #[test]
    fn an_orphan_is_reclaimed_at_its_last_release_only() {
        let h = Handles::default();
        let a = h.open(file(5)).unwrap();
        let b = h.open(file(5)).unwrap();
        assert!(h.mark_orphan(5));
        assert!(!h.release(a).reclaim);
        assert!(h.release(b).reclaim);
        assert_eq!(h.open_count(5), 0);
    }

    #[test]
    fn an_unopened_orphan_is_reclaimed_at_once() {
        let h = Handles::default();
        assert!(!h.mark_orphan(9));
        assert!(!h.is_open_orphan(9));
    }

    #[test]
    fn an_inherited_table_says_so_and_numbers_past_earlier_generations() {
        let h = Handles::default();
        h.start_generation(3, true);
        assert!(h.inherited());
        let fh = h.open(file(9)).unwrap();
        assert_eq!(fh, 3 << FH_GENERATION_SHIFT);
        assert!(!h.release(fh).reclaim);
    }

    #[test]
    fn an_imported_table_keeps_numbers_counts_and_orphans() {
        let old = Handles::default();
        old.start_generation(1, false);
        let a = old.open(file(5)).unwrap();
        assert!(old.mark_orphan(5));
        let (handles, next, orphans) = old.export();
        let new = Handles::default();
        new.start_generation(2, true);
        new.import(&handles, next, &orphans);
        assert_eq!(new.get(a), Some(file(5)));
        assert!(new.is_open_orphan(5));
        assert!(new.release(a).reclaim);
        assert_eq!(new.open(file(6)).unwrap(), 2 << FH_GENERATION_SHIFT);
    }

    #[test]
    fn a_linked_tmpfile_is_no_orphan_at_its_last_release() {
        let h = Handles::default();
        let a = h.open(file(4)).unwrap();
        assert!(h.mark_orphan(4));
        h.unmark_orphan(4);
        assert!(!h.is_open_orphan(4));
        assert!(!h.release(a).reclaim, "named: nothing to reclaim");
    }

    #[test]
    fn unknown_handles_release_harmlessly() {
        let h = Handles::default();
        let r = h.release(12345);
        assert_eq!(r.handle, None);
        assert!(!r.reclaim);
    }
}
