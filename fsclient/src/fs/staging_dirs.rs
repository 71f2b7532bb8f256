//! Retiring the staging directories flushes emptied, on the timer thread
//! (`baton_blocks` `staging/retire.rs` says why not in the FLUSH itself).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::BatonFs;

impl BatonFs {
    /// Retires emptied staging directories once a pass is due. Returns the
    /// time until the next pass, or `None` when nothing waits. Does nothing
    /// once fenced: the next generation owns the staging area then, and a
    /// directory this one saw empty may already hold its writes.
    pub fn retire_staging_dirs(&self) -> Option<Duration> {
        match self.staging.retire_due() {
            Some(due) if due.is_zero() => {}
            other => return other,
        }
        for ino in self.staging.take_emptied() {
            // Keeps this process's writers of `ino` out; `fence` waits for it.
            let _guard = self.inode_lock(ino);
            if self.fenced.load(Ordering::SeqCst) {
                return None;
            }
            if let Err(err) = self.staging.retire_if_empty(ino) {
                tracing::warn!(nodeid = ino, %err, "retiring an empty staging dir failed; it stays");
            }
        }
        match self.staging.remove_retired() {
            Ok(removed) => tracing::trace!(removed, "retired staging dirs removed"),
            Err(err) => {
                tracing::warn!(%err, "removing retired staging dirs failed; the next pass retries")
            }
        }
        self.staging.retire_due()
    }

    /// Wakes the timer thread if `staged_change` queued the first staging
    /// directory to retire.
    pub(super) fn waking_retirement<T>(&self, staged_change: impl FnOnce() -> T) -> T {
        let idle = self.staging.retire_due().is_none();
        let result = staged_change();
        if idle && self.staging.retire_due().is_some() {
            self.wake_timer_thread();
        }
        result
    }
}
