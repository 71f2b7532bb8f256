//! Orphans (inodes at nlink 0) and this mount's session: when may an
//! unlinked inode be reclaimed, given that this mount, another generation
//! of it, or a mount on another host may still have it open.
//!
//! The metadata engine keeps one session per mount (FUSE connection; the
//! id is the connection identity, shared by every generation serving it)
//! and a hold `(session, ino)` for every registered session when an inode
//! loses its last name (`baton_meta::MetaStore` docs). This module decides,
//! per inode, when THIS session lets go of its hold:
//! - at once, when no handle of this table is open on it (after our own
//!   unlink, or at the next tick for another host's unlink);
//! - at the last release of a handle on it;
//! - never while the handle table is *inherited* (a generation that took
//!   over after a crash: the kernel may hold handles this process never
//!   saw): the holds stay until the mount ends and the session is closed,
//!   or until the session expires when nothing serves the mount any more.
//!
//! Every such decision runs under the inode's stripe mutex and re-reads the
//! open count, and OPEN registers its handle BEFORE reading the inode: so a
//! decision either sees the new handle, or ran before the open's read,
//! which then finds nlink 0 and takes the hold again (or finds the inode
//! gone: ENOENT). Opens and closes of linked files write nothing here.
//!
//! The session tick (`crate::session`, every expiry/5) renews the
//! heartbeat, deletes sessions whose heartbeat expired (their holds go with
//! them), lets go of holds on inodes no handle here has open (another host
//! unlinked them), and reclaims orphans nobody holds.

use std::sync::atomic::Ordering;
use std::time::Duration;

use baton_meta::{MetaError, ObjectRef, SessionInfo};

use super::BatonFs;
use crate::error::Result;

/// Orphans without holders reclaimed per tick at most (the rest wait for
/// the next tick).
pub const UNHELD_RECLAIM_COUNT_MAX: u32 = 256;

impl BatonFs {
    fn session_id(&self) -> u64 {
        self.connection.load(Ordering::Relaxed)
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
        self.meta.open_session(&info)?;
        *super::lock(&self.session) = Some(info);
        tracing::info!(session = self.session_id(), "session registered");
        Ok(())
    }

    /// The mount ended: deletes the session and its holds, and reclaims
    /// what nobody else holds.
    pub fn close_session(&self) -> Result<()> {
        if super::lock(&self.session).take().is_none() {
            return Ok(());
        }
        for ino in self.meta.close_session(self.session_id())? {
            self.release_orphan(None, ino)?;
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
            for ino in self.handles.open_orphans() {
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
        for ino in self.meta.held_orphans(info.id)? {
            self.settle_orphan(ino)?;
        }
        self.reclaim_unheld_orphans()
    }

    /// Reclaims orphans no session holds (a batch of them).
    pub(super) fn reclaim_unheld_orphans(&self) -> Result<()> {
        for ino in self.meta.unheld_orphans(UNHELD_RECLAIM_COUNT_MAX)? {
            self.release_orphan(None, ino)?;
        }
        Ok(())
    }

    /// `ino` may be an orphan this session holds: keeps the hold while a
    /// handle here has it open (or the table is inherited), else lets go,
    /// reclaiming it if nobody else holds it.
    pub(super) fn settle_orphan(&self, ino: u64) -> Result<()> {
        let _guard = self.inode_lock(ino);
        if self.handles.mark_orphan(ino) || self.handles.inherited() {
            return Ok(());
        }
        self.release_locked(Some(self.session_id()), ino)
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

    fn release_orphan(&self, session: Option<u64>, ino: u64) -> Result<()> {
        let _guard = self.inode_lock(ino);
        self.release_locked(session, ino)
    }

    /// Drops the hold and reclaims the orphan if it was the last; the
    /// caller holds the inode's stripe mutex.
    fn release_locked(&self, session: Option<u64>, ino: u64) -> Result<()> {
        let released = match self.meta.release_orphan(session, ino) {
            Ok(Some(released)) => released,
            Ok(None) => return Ok(()),
            // A replayed unlink whose orphan the earlier generation reclaimed.
            Err(MetaError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        self.reclaimed(ino, &released)
    }

    /// Local cleanup after the metadata reclaimed `ino`: staged data,
    /// caches, then its objects.
    fn reclaimed(&self, ino: u64, released: &[ObjectRef]) -> Result<()> {
        self.staging.discard(ino)?;
        self.invalidate(ino);
        super::lock(&self.readahead).remove(&ino);
        self.delete_objects(released.iter().map(|o| o.key.as_str()));
        tracing::debug!(nodeid = ino, objects = released.len(), "orphan reclaimed");
        Ok(())
    }
}
