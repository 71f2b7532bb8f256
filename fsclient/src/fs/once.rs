//! Exactly-once execution of non-idempotent requests across a generation's
//! death.
//!
//! A request a dead generation had read comes back with FUSE_NOTIFY_RESEND
//! (bit 63 set in its `unique`), or from an upgrade's in-flight journal. If
//! the dead generation had committed it but died before replying, running it
//! again would be wrong (a second mkdir answers EEXIST, a second rename
//! ENOENT). So every non-idempotent mutation (create, mknod, mkdir, symlink,
//! link, unlink, rmdir, rename, setattr, setxattr, removexattr) records its
//! result under its [`RequestKey`] (connection, unique) in the SAME metadata
//! transaction that applies it; a replayed request first looks its key up
//! and, if found, answers from the record without touching anything.
//!
//! Records are pruned safely: once the reply was written to /dev/fuse the
//! kernel never resends the request, so the key is queued with
//! `MetaStore::request_answered` and deleted inside a later write (no extra
//! commit); what a death loses from that queue is pruned by age
//! ([`RECORD_AGE_MAX`]), long after the next generation's RESEND has
//! brought back everything the dead one held.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use baton_meta::{Recorded, RequestKey};
use fuse_wire::Request;

use super::BatonFs;
use crate::error::{Error, Result};
use crate::fault::{self, Point};

/// Records older than this are pruned (their requests were answered or
/// recovered long ago).
pub const RECORD_AGE_MAX: Duration = Duration::from_secs(3600);

thread_local! {
    /// Set while this thread answers a request from an in-flight journal.
    static REPLAYING_JOURNAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (which handles one journaled request) with the request marked
/// as possibly run by an earlier generation.
pub fn replaying_journal<T>(f: impl FnOnce() -> T) -> T {
    REPLAYING_JOURNAL.with(|r| r.set(true));
    let out = f();
    REPLAYING_JOURNAL.with(|r| r.set(false));
    out
}

/// Whether a request may have run in an earlier generation.
fn replayed(req: &Request<'_>) -> bool {
    req.is_resend() || REPLAYING_JOURNAL.with(Cell::get)
}

impl BatonFs {
    /// The exactly-once key of `req` on this connection.
    fn request_key(&self, req: &Request<'_>) -> RequestKey {
        RequestKey::new(self.connection_identity(), req.key())
    }

    /// Runs the mutation `run` (given the key to record its result under)
    /// exactly once per request: a replayed request that an earlier
    /// generation committed is answered by `from_record` instead.
    pub(super) fn once<T>(
        &self,
        req: &Request<'_>,
        from_record: impl FnOnce(Recorded) -> Result<T>,
        run: impl Fn(Option<RequestKey>) -> Result<T>,
    ) -> Result<T> {
        fault::hit(Point::AfterRead, req.opcode());
        let key = self.request_key(req);
        if replayed(req) {
            if let Some(bytes) = self.meta.completed_request(key)? {
                let recorded = Recorded::decode(&bytes)?;
                self.recovered.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    unique = req.unique(),
                    opcode = req.opcode(),
                    key = %key,
                    "replayed request was committed by an earlier generation: answering from its record"
                );
                return from_record(recorded);
            }
        }
        let out = match run(Some(key)) {
            // Unlinked inodes still count until reclaimed, which the timer
            // thread does a few ms after the unlink: settle them now and
            // try once more, so that `rm a; touch b` in a full quota works.
            // (The refused run committed nothing, so the key is unused.)
            Err(err) if err.errno() == fuse_wire::Errno::EDQUOT && self.settle_orphans_now() => {
                run(Some(key))?
            }
            other => other?,
        };
        fault::hit(Point::AfterCommit, req.opcode());
        Ok(out)
    }

    /// The reply to `req` was written: its record may go.
    pub(super) fn answered(&self, req: &Request<'_>) {
        self.meta.request_answered(self.request_key(req));
    }

    /// Deletes records older than [`RECORD_AGE_MAX`].
    pub fn prune_request_records(&self) -> Result<u64> {
        let cutoff = SystemTime::now()
            .checked_sub(RECORD_AGE_MAX)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(self.meta.prune_completed(cutoff)?)
    }

    /// Requests answered from an earlier generation's record so far.
    pub fn requests_recovered(&self) -> u64 {
        self.recovered.load(Ordering::Relaxed)
    }
}

/// A record of the wrong kind for the replayed request: the store is
/// inconsistent with what was asked; refuse rather than guess.
pub(super) fn mismatched(ino: u64, what: &'static str) -> Error {
    Error::refused(ino, what, fuse_wire::Errno::EIO)
}
