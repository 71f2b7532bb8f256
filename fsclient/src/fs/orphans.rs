//! Orphans (inodes at nlink 0) and this mount's session: when may an
//! unlinked inode be reclaimed, given that this mount, another generation
//! of it, or a mount on another host may still have it open.
//!
//! The metadata engine keeps one session per mount (FUSE connection; the
//! id is the connection identity, shared by every generation serving it)
//! and a hold `(session, ino)` for every registered session when an inode
//! loses its last name (`baton_meta::MetaStore` docs). This module decides,
//! per inode, when THIS session lets go of its hold:
//! - when no handle of this table is open on it: at the next pause in the
//!   requests after our own unlink (`orphaned`), or at the next tick for
//!   another host's unlink;
//! - at the last release of a handle on it;
//! - with an *inherited* handle table (a generation that took over after a
//!   crash: the kernel may hold handles this process never saw), only once
//!   the kernel has no inode for it any more (it answers an invalidation
//!   of the inode with ENOENT: no open file, none can come back, as the
//!   inode has no name). A kept one is settled again when the kernel
//!   FORGETs it (it evicts an unlinked inode at its last close) and at
//!   every session tick (a FORGET the dead generation read is lost). For
//!   [`RESENT_REPLIES_GRACE`] after the takeover the tick keeps even those
//!   the kernel has no inode for: a resent TMPFILE's reply may still give
//!   it one.
//!
//! Every such decision runs under the inode's stripe mutex and re-reads the
//! open count, and OPEN registers its handle BEFORE reading the inode: so a
//! decision either sees the new handle, or ran before the open's read,
//! which then finds nlink 0 and takes the hold again (or finds the inode
//! gone: ENOENT). Opens and closes of linked files write nothing here.
//!
//! An O_TMPFILE is an orphan from birth, held by this session alone (no
//! other mount can reach it) and marked in the table with its handle; the
//! tick reads this session's holds only between TMPFILEs' transactions and
//! their handles' registration (`tmpfile_births`), so it sees the handle.
//! Its first link takes it off the orphan list (`MetaStore::link`).
//!
//! The session tick (`crate::session`, every expiry/5) renews the
//! heartbeat, deletes sessions whose heartbeat expired (their holds go with
//! them), lets go of holds on inodes no handle here has open (another host
//! unlinked them), and reclaims orphans nobody holds.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use baton_meta::{MetaError, SessionInfo};

use super::BatonFs;
use crate::error::Result;

/// How long after adopting a connection after a crash the resent
/// requests count as maybe unanswered (`settle_held_orphans`). They are
/// queued at once by the RESEND; this bounds a loaded machine's delay.
pub const RESENT_REPLIES_GRACE: Duration = Duration::from_secs(10);
/// Orphans without holders reclaimed per transaction at most.
pub const UNHELD_RECLAIM_COUNT_MAX: u32 = 256;
/// Transactions of [`UNHELD_RECLAIM_COUNT_MAX`] a tick runs at most (the
/// rest wait for the next tick): thousands of orphans a dead mount left go
/// in one tick, a few seconds, while requests are served.
pub const UNHELD_RECLAIM_BATCHES_MAX: u32 = 64;
/// Orphans let go of in one metadata transaction at most.
pub const ORPHAN_RELEASE_BATCH_MAX: usize = 256;
/// How long an unlinked inode waits at least for others to be settled with
/// it in one transaction (a burst of unlinks is one release transaction per
/// batch, not one per unlink).
pub const ORPHAN_SETTLE_DELAY: Duration = Duration::from_millis(10);
/// Requests ended at least this long ago: a pause, in which the timer
/// thread settles the queued orphans. While requests keep coming, reclaiming
/// an inode (a dozen index searches under the metadata writer, about 60 µs)
/// made them wait for the writer: with the reclaim in the pauses an
/// `rm -rf` of 20,000 files went from 5,456 to 7,169 files/s
/// (docs/BENCHMARKS.md, session 26).
pub const ORPHAN_SETTLE_PAUSE: Duration = Duration::from_millis(5);
/// Longest an unlinked inode waits for a pause: past it, the queue is
/// settled while requests run, so that `df` and quotas catch up under a
/// load that never pauses.
pub const ORPHAN_SETTLE_WAIT_MAX: Duration = Duration::from_secs(10);
/// Queued orphans at most before they are settled without a pause (about
/// 4 s of reclaim; the queue holds only inode numbers).
pub const ORPHAN_QUEUE_MAX: usize = 65_536;

/// Inodes that lost their last name, waiting for the timer thread.
#[derive(Debug, Default)]
pub(super) struct OrphanQueue {
    inos: BTreeSet<u64>,
    /// When the oldest of them was queued.
    since: Option<Instant>,
}

impl BatonFs {
    fn session_id(&self) -> u64 {
        self.connection_identity()
    }

    /// Registers this mount's session (or takes over the row a dead
    /// predecessor generation of the same connection left: its holds stay
    /// ours). Call after `set_connection`, before serving.
    pub fn open_session(&self, host: &str, mount: &str) -> Result<()> {
        let info = SessionInfo {
            id: self.session_id(),
            host: host.to_string(),
            pid: std::process::id(),
            mount: mount.to_string(),
        };
        match self.meta.open_session(&info) {
            Ok(()) => tracing::info!(session = info.id, "session registered"),
            // A generation starting on a full disk serves anyway (a
            // takeover's session row is already there); the session timer
            // registers it once a write fits.
            Err(err) if err.errno() == libc::ENOSPC => {
                tracing::warn!(session = info.id, %err, "session not registered now: the metadata disk is full")
            }
            Err(err) => return Err(err.into()),
        }
        *super::lock(&self.session) = Some(info);
        Ok(())
    }

    /// The mount ended: deletes the session and its holds, and reclaims
    /// what nobody else holds.
    pub fn close_session(&self) -> Result<()> {
        if super::lock(&self.session).take().is_none() {
            return Ok(());
        }
        for held in self
            .meta
            .close_session(self.session_id())?
            .chunks(ORPHAN_RELEASE_BATCH_MAX)
        {
            self.release_orphans(None, held)?;
        }
        tracing::info!(session = self.session_id(), "session closed");
        Ok(())
    }

    /// One tick of the session timer (see the module docs). `expiry`: how
    /// old another session's heartbeat may be before it counts as dead.
    ///
    /// Other sessions are expired only once this one has beaten without a
    /// failure for a whole expiry: after an outage of the store, every
    /// mount's heartbeat is old, and the first back must not delete the
    /// others before they had a chance to beat again.
    pub fn session_tick(&self, expiry: Duration) -> Result<()> {
        let ticked = self.session_tick_inner(expiry);
        if ticked.is_err() {
            *super::lock(&self.session_healthy_since) = None;
        }
        ticked
    }

    fn session_tick_inner(&self, expiry: Duration) -> Result<()> {
        let Some(info) = super::lock(&self.session).clone() else {
            return Ok(());
        };
        let beat = self.meta.heartbeat(info.id)?;
        let healthy_since =
            *super::lock(&self.session_healthy_since).get_or_insert_with(std::time::Instant::now);
        if !beat {
            // We were too slow (paused longer than the expiry) and another
            // mount dropped our holds; orphans we have open may be gone.
            tracing::error!(
                session = info.id,
                "session expired while serving; registering again and holding the orphans still open"
            );
            self.meta.open_session(&info)?;
            *super::lock(&self.session_healthy_since) = Some(std::time::Instant::now());
            // Its published locks went with the expired session.
            self.republish_locks();
            // TMPFILEs under way register their handles first.
            let _births = super::write_lock(&self.tmpfile_births);
            let mut held = self.handles.open_orphans();
            held.extend(super::lock(&self.kernel_held_orphans).iter().copied());
            for ino in held {
                match self.hold_open_orphan(ino) {
                    Ok(()) => {}
                    Err(crate::error::Error::Meta(e))
                        if matches!(*e, MetaError::NotFound { .. }) =>
                    {
                        tracing::error!(nodeid = ino, "an open unlinked file was reclaimed while this session was expired; its reads fail");
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        }
        if healthy_since.elapsed() >= expiry {
            let expired = self.meta.expire_sessions(expiry)?;
            if !expired.is_empty() {
                tracing::warn!(sessions = ?expired, "expired sessions of dead mounts deleted");
            }
        }
        self.settle_held_orphans(info.id, self.births_in_flight())?;
        self.reclaim_unheld_orphans()
    }

    /// A TMPFILE the dead generation committed but never answered made an
    /// orphan the kernel has no inode for yet: its RESEND, answered from
    /// the exactly-once record, gives it one. Until the resent requests
    /// are surely answered, the tick keeps an orphan the kernel does not
    /// hold (a later tick settles it). Exit does not wait: a RESEND left
    /// unread as this process stops within the grace after its own
    /// takeover is the one case left (documented).
    fn births_in_flight(&self) -> bool {
        self.handles.inherited()
            && self
                .adopted_at
                .get()
                .is_some_and(|at| at.elapsed() < RESENT_REPLIES_GRACE)
    }

    /// Settles every orphan session `id` holds (lets go of those no handle
    /// here, nor the kernel if the table is inherited, has open; with
    /// `births_in_flight`, those the kernel does not hold are kept too).
    fn settle_held_orphans(&self, id: u64, births_in_flight: bool) -> Result<()> {
        let held = {
            // An orphan a TMPFILE made is in this list only once its
            // handle is registered (`do_tmpfile`), so it is kept.
            let _births = super::write_lock(&self.tmpfile_births);
            self.meta.held_orphans(id)?
        };
        for held in held.chunks(ORPHAN_RELEASE_BATCH_MAX) {
            self.settle_orphans_with(held, births_in_flight)?;
        }
        Ok(())
    }

    /// Serving ends (SIGTERM): settles what was queued and every orphan
    /// this session holds, so that a clean unmount leaves only the orphans
    /// a handle still holds. Failures are logged: the holds stay and the
    /// next mount reclaims them once the session expires.
    pub fn settle_orphans_at_exit(&self) {
        self.settle_queued_orphans(true);
        let Some(id) = super::lock(&self.session).as_ref().map(|info| info.id) else {
            return;
        };
        let settled = self
            .settle_held_orphans(id, false)
            .and_then(|()| self.reclaim_unheld_orphans());
        if let Err(err) = settled {
            tracing::warn!(%err, "orphans not settled at exit; the next mount reclaims them");
        }
    }

    /// Reclaims orphans no session holds: batches of
    /// [`UNHELD_RECLAIM_COUNT_MAX`], one transaction each, at most
    /// [`UNHELD_RECLAIM_BATCHES_MAX`] of them.
    pub(super) fn reclaim_unheld_orphans(&self) -> Result<()> {
        self.reclaim_unheld_batches(UNHELD_RECLAIM_BATCHES_MAX)
    }

    /// [`BatonFs::reclaim_unheld_orphans`], at most `batches_max`
    /// transactions.
    pub(super) fn reclaim_unheld_batches(&self, batches_max: u32) -> Result<()> {
        let started = Instant::now();
        let mut reclaimed_count = 0usize;
        for _ in 0..batches_max {
            let unheld = self.meta.unheld_orphans(UNHELD_RECLAIM_COUNT_MAX)?;
            self.release_orphans(None, &unheld)?;
            reclaimed_count += unheld.len();
            if unheld.len() < UNHELD_RECLAIM_COUNT_MAX as usize {
                break;
            }
        }
        if reclaimed_count > 0 {
            tracing::info!(
                orphans = reclaimed_count,
                elapsed_us = started.elapsed().as_micros() as u64,
                "orphans no mount holds reclaimed"
            );
        }
        Ok(())
    }

    /// FORGET of `ino`: with an inherited table, an orphan kept because
    /// the kernel had its inode is settled again (the kernel evicts an
    /// unlinked inode, and FORGETs it, once its last file is closed).
    pub(super) fn forgotten(&self, ino: u64) {
        if !self.handles.inherited() {
            return;
        }
        if !super::lock(&self.kernel_held_orphans).remove(&ino) {
            return;
        }
        if let Err(err) = self.orphaned(ino) {
            tracing::warn!(nodeid = ino, %err, "forgotten orphan not settled; the session tick retries");
        }
    }

    /// `ino` lost its last name here (UNLINK, RMDIR, RENAME over it). With
    /// the session timer running, its thread lets go of it later, in a pause
    /// between requests, many per transaction
    /// ([`BatonFs::settle_queued_orphans`]), so that the reclaim does not
    /// hold up requests; else now. If a handle here has it open, it is
    /// marked at once, so that its last close settles it (and does not
    /// commit data nobody can reach any more) however long the queue waits.
    ///
    /// A crash before the thread ran leaves the hold to the next
    /// generation, whose session tick settles it (after a crash, once the
    /// kernel has no inode for it).
    pub(super) fn orphaned(&self, ino: u64) -> Result<()> {
        // Queued under the thread's lock, so that nothing is queued after
        // the thread's last drain (`SessionTimer::stop`).
        let timer = super::lock(&self.timer_thread);
        match timer.as_ref() {
            Some(thread) => {
                // Without the stripe mutex, which a flush of an inode on the
                // same stripe may hold through a whole upload: the mark only
                // makes the last close settle the inode, and that settlement
                // re-reads the open count under the stripe.
                self.handles.mark_orphan(ino);
                let mut queue = super::lock(&self.orphans_to_settle);
                queue.inos.insert(ino);
                if queue.since.is_none() || queue.inos.len() >= ORPHAN_QUEUE_MAX {
                    queue.since.get_or_insert_with(Instant::now);
                    thread.unpark();
                }
                Ok(())
            }
            None => {
                drop(timer);
                self.settle_orphan(ino)
            }
        }
    }

    /// Settles every queued orphan at once (a quota refused a change, or
    /// STATFS: what they still hold may be freed). `false` if none was
    /// queued.
    pub(super) fn settle_orphans_now(&self) -> bool {
        if super::lock(&self.orphans_to_settle).inos.is_empty() {
            return false;
        }
        self.settle_queued_orphans(true);
        true
    }

    /// Settles the orphans [`BatonFs::orphaned`] queued (`now`: all of
    /// them at once), one transaction per [`ORPHAN_RELEASE_BATCH_MAX`],
    /// when [`orphans_due_in`] says so; whether requests pause is asked
    /// again before each batch. Runs on the session timer's thread.
    /// Returns how long until the queue is due again, `None` when it is
    /// empty. A batch that fails (fenced for a handover, store
    /// unreachable) ends the drain and empties the queue: the holds stay,
    /// and the session tick (this generation's or the next one's) settles
    /// them.
    pub fn settle_queued_orphans(&self, now: bool) -> Option<Duration> {
        loop {
            let batch: Vec<u64> = {
                let mut queue = super::lock(&self.orphans_to_settle);
                let since = queue.since?;
                if !now {
                    let idle_for = self.counters.idle_for();
                    if let Some(due_in) =
                        orphans_due_in(since.elapsed(), queue.inos.len(), idle_for)
                    {
                        return Some(due_in);
                    }
                }
                let batch: Vec<u64> = queue
                    .inos
                    .iter()
                    .copied()
                    .take(ORPHAN_RELEASE_BATCH_MAX)
                    .collect();
                for ino in &batch {
                    queue.inos.remove(ino);
                }
                if queue.inos.is_empty() {
                    queue.since = None;
                }
                batch
            };
            if let Err(err) = self.settle_orphans(&batch) {
                let left = {
                    let mut queue = super::lock(&self.orphans_to_settle);
                    queue.since = None;
                    std::mem::take(&mut queue.inos).len()
                };
                tracing::warn!(orphans = batch.len() + left, %err, "unlinked inodes not released yet; the session tick retries");
                return None;
            }
        }
    }

    /// `ino` may be an orphan this session holds: keeps the hold while a
    /// handle here has it open (or, the table inherited, the kernel has its
    /// inode), else lets go, reclaiming it if nobody else holds it.
    pub(super) fn settle_orphan(&self, ino: u64) -> Result<()> {
        self.settle_orphans(&[ino])
    }

    /// [`BatonFs::settle_orphan`] of each of `inos`, with one metadata
    /// transaction for all, under all their stripe mutexes.
    fn settle_orphans(&self, inos: &[u64]) -> Result<()> {
        self.settle_orphans_with(inos, false)
    }

    /// [`BatonFs::settle_orphans`]; with `births_in_flight` (an inherited
    /// table), those the kernel does not hold are kept too.
    fn settle_orphans_with(&self, inos: &[u64], births_in_flight: bool) -> Result<()> {
        let mut doomed = Vec::new();
        let released = {
            let _guards = self.inode_locks_of(inos);
            // Every inode is marked (its last close here settles it again),
            // whether or not the table is inherited.
            let unopened: Vec<u64> = inos
                .iter()
                .copied()
                .filter(|&ino| !self.handles.mark_orphan(ino))
                .collect();
            let unheld = if births_in_flight {
                super::lock(&self.kernel_held_orphans).extend(unopened);
                Vec::new()
            } else if self.handles.inherited() {
                self.unheld_by_kernel(unopened)
            } else {
                unopened
            };
            self.release_locked(Some(self.session_id()), &unheld, &mut doomed)
        };
        self.delete_objects(doomed.iter().map(String::as_str));
        released
    }

    /// Those of `inos` the kernel has no inode for (an inherited table may
    /// miss its handles); the others are remembered, for their FORGET.
    /// The caller holds their stripes: an OPEN of one registers its handle
    /// first, and the kernel holds the inode while the OPEN runs.
    fn unheld_by_kernel(&self, inos: Vec<u64>) -> Vec<u64> {
        let (held, unheld): (Vec<u64>, Vec<u64>) =
            inos.into_iter().partition(|&ino| self.kernel_may_hold(ino));
        let mut kept = super::lock(&self.kernel_held_orphans);
        for ino in &unheld {
            kept.remove(ino);
        }
        kept.extend(held);
        unheld
    }

    /// The stripe mutexes of all of `inos`, taken in ascending stripe
    /// order: every other path holds at most one stripe at a time, so this
    /// cannot deadlock.
    pub(super) fn inode_locks_of(&self, inos: &[u64]) -> Vec<std::sync::MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = inos.iter().map(|&ino| self.inode_stripe(ino)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .iter()
            .map(|&stripe| super::lock(&self.inode_locks[stripe]))
            .collect()
    }

    /// Drops `session`'s holds on `inos` (`None`: none), reclaiming those
    /// nobody holds, in one transaction under their stripe mutexes.
    fn release_orphans(&self, session: Option<u64>, inos: &[u64]) -> Result<()> {
        let mut doomed = Vec::new();
        let released = {
            let _guards = self.inode_locks_of(inos);
            self.release_locked(session, inos, &mut doomed)
        };
        self.delete_objects(doomed.iter().map(String::as_str));
        released
    }

    /// [`BatonFs::release_orphans`] for a caller holding the stripes: the
    /// transaction, then the local cleanup of every inode it reclaimed
    /// (each one's, even after one failed). The keys of the reclaimed
    /// objects go to `doomed`, for the caller to delete once it has let go
    /// of the stripes: nothing can reach them any more, and deleting them
    /// (a slow unlink per block on a local store, a request each on S3)
    /// must not hold up requests on the inodes that share those stripes.
    fn release_locked(
        &self,
        session: Option<u64>,
        inos: &[u64],
        doomed: &mut Vec<String>,
    ) -> Result<()> {
        if inos.is_empty() {
            return Ok(());
        }
        let reclaimed = match self.meta.release_orphans(session, inos) {
            Ok(reclaimed) => reclaimed,
            // A replayed unlink whose orphan the earlier generation reclaimed.
            Err(MetaError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut first_err = None;
        for (ino, released) in reclaimed {
            doomed.extend(released.into_iter().map(|object| object.key));
            if let Err(err) = self.reclaimed(ino) {
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// OPEN found `ino` at nlink 0 (another host unlinked it while this
    /// host's kernel still had its entry): hold it, or fail with ENOENT if
    /// it was reclaimed meanwhile.
    pub(super) fn hold_open_orphan(&self, ino: u64) -> Result<()> {
        let _guard = self.inode_lock(ino);
        self.meta.hold_orphan(self.session_id(), ino)?;
        self.handles.mark_orphan(ino);
        Ok(())
    }

    /// `ino`, an O_TMPFILE this table keeps alive, got its first name: its
    /// last release here has nothing to settle. (If it lost that name again
    /// meanwhile, the unlink's settlement marks it again; one that ran
    /// before this is caught up by the session tick.)
    pub(super) fn named_tmpfile(&self, ino: u64) {
        let _guard = self.inode_lock(ino);
        self.handles.unmark_orphan(ino);
    }

    /// Local cleanup after the metadata reclaimed `ino`: staged data and
    /// caches (its objects are the caller's, see `release_locked`).
    fn reclaimed(&self, ino: u64) -> Result<()> {
        self.waking_retirement(|| self.staging.discard(ino))?;
        self.invalidate(ino);
        super::lock(&self.readahead).remove(&ino);
        tracing::debug!(nodeid = ino, "orphan reclaimed");
        Ok(())
    }
}

/// `None` if queued orphans are due now, else how long until they may be:
/// the oldest waited `waited` and `queued` are queued; the last request
/// ended `idle_for` ago. Due once the oldest waited [`ORPHAN_SETTLE_DELAY`]
/// and requests pause for [`ORPHAN_SETTLE_PAUSE`], or at once past
/// [`ORPHAN_SETTLE_WAIT_MAX`] or [`ORPHAN_QUEUE_MAX`].
fn orphans_due_in(waited: Duration, queued: usize, idle_for: Duration) -> Option<Duration> {
    if waited >= ORPHAN_SETTLE_WAIT_MAX || queued >= ORPHAN_QUEUE_MAX {
        return None;
    }
    let gathering = ORPHAN_SETTLE_DELAY.saturating_sub(waited);
    let pause = ORPHAN_SETTLE_PAUSE.saturating_sub(idle_for);
    let due_in = gathering.max(pause);
    (!due_in.is_zero()).then(|| due_in.min(ORPHAN_SETTLE_WAIT_MAX - waited))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn queued_orphans_wait_for_a_pause_in_requests() {
        // Requests end now: wait for a pause, however full the batch.
        assert_eq!(
            orphans_due_in(20 * MS, 300, Duration::ZERO),
            Some(ORPHAN_SETTLE_PAUSE)
        );
        assert_eq!(
            orphans_due_in(20 * MS, 300, 2 * MS),
            Some(ORPHAN_SETTLE_PAUSE - 2 * MS)
        );
        // A pause, but the first orphan was queued just now: gather more.
        assert_eq!(
            orphans_due_in(4 * MS, 1, Duration::from_secs(1)),
            Some(6 * MS)
        );
        // A pause after the gathering delay: due.
        assert_eq!(
            orphans_due_in(ORPHAN_SETTLE_DELAY, 1, ORPHAN_SETTLE_PAUSE),
            None
        );
    }

    #[test]
    fn queued_orphans_are_settled_without_a_pause_past_the_bounds() {
        assert_eq!(
            orphans_due_in(ORPHAN_SETTLE_WAIT_MAX, 1, Duration::ZERO),
            None
        );
        assert_eq!(
            orphans_due_in(20 * MS, ORPHAN_QUEUE_MAX, Duration::ZERO),
            None
        );
        // Never asked to sleep past the longest wait.
        assert_eq!(
            orphans_due_in(ORPHAN_SETTLE_WAIT_MAX - MS, 1, Duration::ZERO),
            Some(MS)
        );
    }
}
