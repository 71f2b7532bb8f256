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
//! EDEADLK ([`crate::locks::LockTable`]), but only cycles among this
//! mount's owners are seen: the volume's lock rows record held locks, not
//! waits, so a cycle through another host (A here waits for B's lock
//! there, B waits for A's) is not detected, and both wait until one is
//! interrupted. Detecting it would need every session's parked requests
//! published as rows too (owner, session, inode, range, type), removed when
//! granted, interrupted or expired with the session, and the cycle search
//! run over them in the transaction that parks.
//!
//! Across a generation's death the graph is rebuilt as the requests come
//! back: the held locks from the dead one's file, its parked requests by
//! RESEND (queued before anything new). Parking again checks again, so a
//! cycle closed in the new generation is refused as in the old; were a
//! new request to reach the table before a resent one it waits for, the
//! resent one would be refused instead (one request of the cycle is
//! refused either way, never both, never none).

use std::sync::Arc;
use std::time::Duration;

use baton_meta::{LockSpace, MetaStore, RangeLock};
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
    ) -> Result<Option<HeldLock>> {
        let wanted = wanted.map(range);
        let locks: Vec<RangeLock> = locks.iter().map(range).collect();
        let blocking =
            self.meta
                .publish_locks(self.session, ino, space(kind), wanted.as_ref(), &locks)?;
        Ok(blocking.as_ref().map(held))
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

    fn replace_all(&mut self, locks: &[(u64, LockKind, HeldLock)]) -> Result<()> {
        let rows: Vec<(u64, LockSpace, RangeLock)> = locks
            .iter()
            .map(|(ino, kind, l)| (*ino, space(*kind), range(l)))
            .collect();
        self.meta.replace_session_locks(self.session, &rows)?;
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
