//! GETLK, SETLK, SETLKW (POSIX record locks and, with `FUSE_LK_FLOCK`,
//! BSD flock) and INTERRUPT, over the pure [`crate::locks::LockTable`].
//!
//! A SETLKW that conflicts parks its reply in the table and returns: no
//! worker thread ever blocks on a lock. The reply is answered OK by whoever
//! removes the conflict (unlock, close, release), or EINTR by an INTERRUPT
//! or at shutdown.
//!
//! On a volume several hosts mount (PostgreSQL), locks are shared with the
//! other mounts through the metadata store ([`VolumeLocks`]): a lock is
//! granted only if no other session holds a conflicting one. (A SQLite
//! volume has one mount at a time: its table has no registry to ask.) A
//! request blocked by another mount stays parked; [`BatonFs::retry_locks`]
//! (every [`LOCK_RETRY_INTERVAL`] while anything waits, from the session
//! timer's thread) checks it again. There is no cross-host wake-up: a lock
//! released on another host is seen here within one retry interval.
//!
//! A POSIX SETLKW that would close a cycle of waiting owners is answered
//! EDEADLK. Among this mount's owners the table sees it
//! ([`crate::locks::LockTable`]); through other hosts the volume does: on
//! a shared volume every parked POSIX request is published as a row
//! (session, unique, owner, inode, range, type; `MetaStore::park_lock`),
//! and the transaction that records it first searches the wait-for graph
//! of every session's held locks and parked requests, owners being
//! (session, lock owner): if the requester is reachable from the owners
//! of the locks blocking it, nothing is recorded and the request gets
//! EDEADLK. Two requests closing one cycle from two hosts at once cannot
//! both miss each other (SERIALIZABLE: the later one sees the earlier's
//! row, or conflicts and is retried), so one of them is refused. A row
//! goes in the transaction that grants its request, when it is
//! interrupted or cancelled, and with the session (close, expiry). Cost
//! on PostgreSQL: a request that parks takes one more write transaction
//! (the search is one recursive statement, bounded by
//! `baton_meta::limits::LOCK_WAIT_SEARCH_OWNERS_MAX` owners: past it the
//! request parks unchecked, logged); the grant of a parked POSIX request
//! one more statement in its publish; an interrupt one transaction. A
//! request granted or refused at once costs nothing more. flock and
//! non-blocking requests are never checked. If the store cannot record
//! the wait, the request is refused ENOLCK, as a lock it cannot check is.
//!
//! Across a generation's death the graph is rebuilt as the requests come
//! back: the held locks from the dead one's file, its parked requests by
//! RESEND (queued before anything new). Parking again checks again, so a
//! cycle closed in the new generation is refused as in the old; were a
//! new request to reach the table before a resent one it waits for, the
//! resent one would be refused instead (one request of the cycle is
//! refused either way, never both, never none). The session's rows follow
//! the same path: a resent request parks again under the same unique
//! (the resend bit aside), replacing its row, and the new generation
//! republishes the session's locks and waits as a whole
//! (`replace_session_locks`) once it has taken over, which drops the rows
//! of requests that did not come back. A planned upgrade's successor does
//! the same with the journaled requests, and a rolled-back one publishes
//! its own table again when it resumes.

use std::sync::Arc;
use std::time::Duration;

use baton_meta::{LockSpace, LockWait, MetaStore, Parked, RangeLock};
use fuse_wire::reply::ReplyEmpty;
use fuse_wire::{Errno, FileLock, LkFlags, LkIn, LockOwner, Request};

use super::{lock, BatonFs};
use crate::error::{Error, Result};
use crate::locks::{
    HeldLock, LockKind, LockRegistry, LockRequest, LockType, SetOutcome, OFFSET_MAX,
};

/// How often requests parked behind another mount's lock are checked again.
pub const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// The volume's shared lock rows, as this mount's session sees them.
pub struct VolumeLocks {
    meta: Arc<dyn MetaStore>,
    session: u64,
}

impl VolumeLocks {
    /// The registry of `session` (this connection's id) in `meta`.
    pub fn new(meta: Arc<dyn MetaStore>, session: u64) -> VolumeLocks {
        VolumeLocks { meta, session }
    }
}

fn space(kind: LockKind) -> LockSpace {
    match kind {
        LockKind::Posix => LockSpace::Posix,
        LockKind::Flock => LockSpace::Flock,
    }
}

fn range(l: &HeldLock) -> RangeLock {
    RangeLock {
        owner: l.owner,
        start: l.start,
        end: l.end,
        exclusive: l.typ == LockType::Write,
        pid: l.pid,
    }
}

fn wait(unique: u64, ino: u64, wanted: &HeldLock) -> LockWait {
    LockWait {
        key: unique,
        ino,
        lock: range(wanted),
    }
}

fn held(l: &RangeLock) -> HeldLock {
    HeldLock {
        owner: l.owner,
        start: l.start,
        end: l.end,
        typ: if l.exclusive {
            LockType::Write
        } else {
            LockType::Read
        },
        pid: l.pid,
    }
}

impl LockRegistry for VolumeLocks {
    fn publish(
        &mut self,
        ino: u64,
        kind: LockKind,
        wanted: Option<&HeldLock>,
        locks: &[HeldLock],
        granted: Option<u64>,
    ) -> Result<Option<HeldLock>> {
        let wanted = wanted.map(range);
        let locks: Vec<RangeLock> = locks.iter().map(range).collect();
        let blocking = self.meta.publish_locks(
            self.session,
            ino,
            space(kind),
            wanted.as_ref(),
            &locks,
            granted,
        )?;
        Ok(blocking.as_ref().map(held))
    }

    fn park(&mut self, ino: u64, unique: u64, wanted: &HeldLock) -> Result<bool> {
        let parked = self
            .meta
            .park_lock(self.session, &wait(unique, ino, wanted))?;
        Ok(parked == Parked::WouldDeadlock)
    }

    fn unpark(&mut self, uniques: &[u64]) -> Result<()> {
        self.meta.unpark_locks(self.session, uniques)?;
        Ok(())
    }

    fn conflict(
        &mut self,
        ino: u64,
        kind: LockKind,
        wanted: &HeldLock,
    ) -> Result<Option<HeldLock>> {
        let found = self
            .meta
            .conflicting_lock(self.session, ino, space(kind), &range(wanted))?;
        Ok(found.as_ref().map(held))
    }

    fn replace_all(
        &mut self,
        locks: &[(u64, LockKind, HeldLock)],
        waits: &[(u64, u64, HeldLock)],
    ) -> Result<()> {
        let rows: Vec<(u64, LockSpace, RangeLock)> = locks
            .iter()
            .map(|(ino, kind, l)| (*ino, space(*kind), range(l)))
            .collect();
        let waits: Vec<LockWait> = waits
            .iter()
            .map(|(unique, ino, l)| wait(*unique, *ino, l))
            .collect();
        self.meta
            .replace_session_locks(self.session, &rows, &waits)?;
        Ok(())
    }
}

/// A parked SETLKW: its reply, and its raw bytes so a handover can journal
/// it for the next generation (parking is rare; the copy is cheap enough).
pub struct ParkedLock {
    reply: ReplyEmpty,
    raw: Vec<u8>,
}

impl ParkedLock {
    /// Grants it.
    pub fn ok(self) {
        self.reply.ok();
    }

    /// Refuses it.
    pub fn error(self, errno: Errno) {
        self.reply.error(errno);
    }

    /// Leaves it unanswered (journaled for the next generation).
    pub fn abandon(self) {
        self.reply.abandon();
    }

    /// The request as read from /dev/fuse.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

/// Converts the kernel's lock argument.
fn request(ino: u64, arg: &LkIn) -> Result<LockRequest> {
    let typ = match arg.lk.typ as i32 {
        libc::F_RDLCK => Some(LockType::Read),
        libc::F_WRLCK => Some(LockType::Write),
        libc::F_UNLCK => None,
        _ => return Err(Error::refused(ino, "unknown lock type", Errno::EINVAL)),
    };
    let flock = arg.lk_flags.contains(LkFlags::FLOCK);
    let (start, end) = if flock {
        (0, OFFSET_MAX)
    } else {
        (arg.lk.start, arg.lk.end.min(OFFSET_MAX))
    };
    if start > end {
        return Err(Error::refused(
            ino,
            "lock range ends before it starts",
            Errno::EINVAL,
        ));
    }
    Ok(LockRequest {
        kind: if flock {
            LockKind::Flock
        } else {
            LockKind::Posix
        },
        owner: arg.owner.get(),
        start,
        end,
        typ,
        pid: arg.lk.pid,
    })
}

impl BatonFs {
    pub(super) fn do_getlk(&self, ino: u64, arg: &LkIn) -> Result<FileLock> {
        let req = request(ino, arg)?;
        let found = lock(&self.locks).conflict_anywhere(ino, &req)?;
        Ok(match found {
            Some(held) => FileLock {
                start: held.start,
                end: held.end,
                typ: match held.typ {
                    LockType::Read => libc::F_RDLCK as u32,
                    LockType::Write => libc::F_WRLCK as u32,
                },
                pid: held.pid,
            },
            None => FileLock {
                typ: libc::F_UNLCK as u32,
                ..arg.lk
            },
        })
    }

    pub(super) fn do_setlk(
        &self,
        r: &Request<'_>,
        ino: u64,
        arg: &LkIn,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let req = match request(ino, arg) {
            Ok(req) => req,
            Err(err) => return reply.error(self.fail("setlk", r, ino, &err)),
        };
        let (wait, direct) = if sleep && req.typ.is_some() {
            let parked = ParkedLock {
                reply,
                raw: r.raw().to_vec(),
            };
            (Some((r.key(), parked)), None)
        } else {
            (None, Some(reply))
        };
        let outcome = {
            let mut table = lock(&self.locks);
            let outcome = table.set(ino, req, wait);
            self.save_held_locks(&table);
            outcome
        };
        let mut parked = false;
        match outcome {
            SetOutcome::Done { granted, own } => {
                granted.into_iter().chain(own).for_each(ParkedLock::ok);
                direct.into_iter().for_each(ReplyEmpty::ok);
            }
            SetOutcome::WouldBlock { granted } => {
                granted.into_iter().for_each(ParkedLock::ok);
                direct.into_iter().for_each(|d| d.error(Errno::EAGAIN));
            }
            SetOutcome::Parked { granted } => {
                parked = true;
                granted.into_iter().for_each(ParkedLock::ok);
                tracing::debug!(
                    nodeid = ino,
                    unique = r.unique(),
                    owner = req.owner,
                    "lock request parked"
                );
            }
            SetOutcome::Refused {
                waiter,
                errno,
                granted,
            } => {
                granted.into_iter().for_each(ParkedLock::ok);
                waiter.error(Errno::from_raw(errno));
            }
            SetOutcome::Failed { waiter, error } => {
                if error.is_fenced() {
                    waiter.into_iter().for_each(ParkedLock::abandon);
                    direct.into_iter().for_each(ReplyEmpty::abandon);
                    return;
                }
                // The other mounts' locks cannot be checked: no lock.
                self.fail("setlk", r, ino, &error);
                waiter.into_iter().for_each(|w| w.error(Errno::ENOLCK));
                direct.into_iter().for_each(|d| d.error(Errno::ENOLCK));
            }
        }
        if parked {
            self.wake_timer_thread();
        }
    }

    /// Publishes lock changes that failed to publish and grants parked
    /// requests no mount blocks any more. `true` while there is more to
    /// retry.
    pub fn retry_locks(&self) -> bool {
        let (granted, more) = {
            let mut table = lock(&self.locks);
            if !table.needs_retry() {
                return false;
            }
            let granted = table.retry();
            self.save_held_locks(&table);
            (granted, table.needs_retry())
        };
        granted.into_iter().for_each(ParkedLock::ok);
        more
    }

    /// Drops `owner`'s locks of `kind` on `ino` (close); returns the
    /// parked requests this grants.
    pub(super) fn release_locks(
        &self,
        ino: u64,
        kind: LockKind,
        owner: LockOwner,
    ) -> Vec<ParkedLock> {
        let mut table = lock(&self.locks);
        let granted = table.release_owner(ino, kind, owner.get());
        self.save_held_locks(&table);
        granted
    }

    pub(super) fn do_interrupt(&self, unique: u64) {
        let key = fuse_wire::unique_key(unique);
        if let Some(waiter) = lock(&self.locks).interrupt(key) {
            tracing::debug!(unique, "parked lock request interrupted");
            waiter.error(Errno::EINTR);
        }
    }

    /// Answers every parked lock request EINTR (the server is stopping).
    pub fn cancel_lock_waiters(&self) {
        let waiters = lock(&self.locks).drain_waiters();
        for waiter in waiters {
            waiter.error(Errno::EINTR);
        }
    }
}
