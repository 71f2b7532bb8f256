//! Retiring empty inode directories off the request path.
//!
//! A flush that empties an inode's staging directory leaves it in place and
//! queues it here; once [`Staging::retire_due`] says so, the caller's timer
//! thread takes the queue ([`Staging::take_emptied`]), moves each
//! directory that is still empty into `retired/` under its stripe lock
//! ([`Staging::retire_if_empty`]: a rename, no block is freed, so no
//! writer waits on a discard), then removes everything in `retired/` with
//! no lock held ([`Staging::remove_retired`]).
//! Start-up recovery and [`Staging::discard`] move directories there too,
//! so neither a takeover nor a reclaim waits on a directory removal.

use std::fs;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// How long an emptied inode directory waits before it is retired: long
/// enough that one retirement pass covers a burst of flushes, short enough
/// that a crash leaves few empty directories behind.
pub const STAGING_RETIRE_DELAY: Duration = Duration::from_millis(20);

/// Emptied inode directories waiting to be retired.
#[derive(Debug, Default)]
pub(super) struct EmptiedDirs {
    inos: Vec<u64>,
    /// When the oldest entry was queued, or when something was moved into
    /// `retired/` (which then needs a pass too).
    since: Option<Instant>,
}

/// Makes retired names unique within a process (a directory of the same
/// inode may be retired twice: written again, emptied again).
static RETIRED_SEQ: AtomicU64 = AtomicU64::new(0);

impl Staging {
    /// Time until the next retirement pass is due (zero: now), or
    /// `None` when nothing waits.
    pub fn retire_due(&self) -> Option<Duration> {
        let since = self.emptied_dirs().since?;
        Some(STAGING_RETIRE_DELAY.saturating_sub(since.elapsed()))
    }

    /// Takes the queued inode directories; pass each to
    /// [`Staging::retire_if_empty`], then call [`Staging::remove_retired`].
    pub fn take_emptied(&self) -> Vec<u64> {
        let mut emptied = self.emptied_dirs();
        emptied.since = None;
        std::mem::take(&mut emptied.inos)
    }

    /// Moves `ino`'s directory into `retired/` if it is still empty. The
    /// caller must be the process writing to this area, and must hold
    /// whatever keeps its own writers of `ino` out (the stripe lock here
    /// only covers this `Staging`).
    pub fn retire_if_empty(&self, ino: u64) -> Result<()> {
        let _stripe = self.stripe(ino);
        if self.is_empty_dir(&self.inode_dir(ino))? {
            self.move_to_retired(ino)?;
        }
        Ok(())
    }

    /// Queues `ino`'s directory (emptied by a flush) for retirement.
    pub(super) fn note_emptied(&self, ino: u64) {
        let mut emptied = self.emptied_dirs();
        emptied.inos.push(ino);
        emptied.since.get_or_insert_with(Instant::now);
    }

    /// Moves `ino`'s directory into `retired/` and has a pass remove it:
    /// for a caller outside a pass (discard, recovery), holding the stripe
    /// lock and done with what the directory holds.
    pub(super) fn retire_now(&self, ino: u64) -> Result<()> {
        self.move_to_retired(ino)?;
        self.emptied_dirs().since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Moves `ino`'s directory into `retired/` (the caller holds its
    /// stripe lock and checked it holds nothing staged).
    fn move_to_retired(&self, ino: u64) -> Result<()> {
        let retired = self.dir.join(RETIRED_DIR);
        let to = retired.join(format!(
            "{ino:016x}.{}.{}",
            std::process::id(),
            RETIRED_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let from = self.inode_dir(ino);
        let moved = match fs::rename(&from, &to) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && !retired.exists() => {
                private_fs::create_dir_all(&retired)
                    .map_err(|e| self.err("create retired dir", &retired, e))?;
                fs::rename(&from, &to)
            }
            other => other,
        };
        match moved {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("retire inode dir", &from, e)),
        }
    }

    /// Notes leftovers in `retired/` (a process died before removing
    /// them), so the first pass removes them.
    pub(super) fn note_retired_leftovers(&self) {
        let retired = self.dir.join(RETIRED_DIR);
        if retired.exists() {
            self.emptied_dirs().since.get_or_insert_with(Instant::now);
        }
    }

    /// Removes the directories in `retired/` (the slow part: it frees
    /// blocks) and returns how many. Another generation may remove the same
    /// ones at the same time: a vanished entry is fine.
    pub fn remove_retired(&self) -> Result<usize> {
        let retired = self.dir.join(RETIRED_DIR);
        let entries = match fs::read_dir(&retired) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(self.err("list retired dir", &retired, e)),
        };
        let mut removed = 0;
        for entry in entries {
            let path = entry
                .map_err(|e| self.err("list retired dir", &retired, e))?
                .path();
            match fs::remove_dir_all(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err("remove retired dir", &path, e)),
            }
        }
        Ok(removed)
    }

    /// Whether `dir` exists and has no entries.
    fn is_empty_dir(&self, dir: &Path) -> Result<bool> {
        match fs::read_dir(dir) {
            Ok(mut entries) => Ok(entries.next().is_none()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.err("list inode dir", dir, e)),
        }
    }

    fn emptied_dirs(&self) -> MutexGuard<'_, EmptiedDirs> {
        // A plain queue: a panic while holding it leaves it consistent.
        self.emptied
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
