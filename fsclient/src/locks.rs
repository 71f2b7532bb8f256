//! The lock table: POSIX byte-range locks (`fcntl` F_SETLK/F_SETLKW/F_GETLK)
//! per (inode, lock owner) with splitting and merging, BSD `flock` locks per
//! (inode, open file), and the requests parked by SETLKW.
//!
//! The kernel leaves locking to the filesystem (INIT negotiated POSIX_LOCKS
//! and FLOCK_LOCKS), so this table is the only place locks exist. It is pure
//! (no I/O, no FUSE types): a waiter is any value `W` (the FUSE layer parks
//! its `ReplyEmpty` here), and every operation returns the waiters it
//! granted or cancelled so the caller can answer them after releasing its
//! mutex. A SETLKW never blocks a worker thread.
//!
//! Invariant: the locks of one owner on one inode never overlap and no two
//! of the same type touch (they are merged); locks of different owners
//! never conflict (a conflicting request is refused or parked).
//!
//! Other mounts of the volume (other hosts) hold locks too: before a lock
//! takes effect here, the table publishes the inode's new lock list through
//! its [`LockRegistry`] (the volume's shared lock rows, `fs/lock.rs`),
//! which refuses it if another mount holds a conflicting lock. A request
//! blocked only by another mount stays parked and is retried by
//! [`LockTable::retry`] (the owner of the table polls while anything
//! waits); an unlock whose publish failed takes effect here at once and is
//! published again by the next retry.
//!
//! A POSIX SETLKW that would close a cycle of owners each waiting for a
//! lock the next holds is refused EDEADLK instead of parked, as the
//! kernel's lock manager does on a local filesystem (it leaves that to us
//! once POSIX locks are the filesystem's). flock waits are not checked
//! (nor are they on Linux). Open file description locks (F_OFD_SETLKW)
//! reach FUSE as POSIX locks owned by the open file, indistinguishable, so
//! a cycle among them is refused too (Linux leaves those deadlocked).
//! The table's search sees this mount's waits and locks; a cycle
//! through another mount is found by the registry when the request parks
//! ([`LockRegistry::park`]: the volume's published locks and waits,
//! `fs/lock.rs`), which refuses it EDEADLK too.
//!
//! Limits: at most [`WAITERS_MAX`] parked requests (ENOLCK past it) and
//! [`INTERRUPTED_MAX`] remembered early INTERRUPTs. The table lives in the
//! process: a new generation starts with no locks unless it imports its
//! predecessor's.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::error::Error;

/// The largest offset (`OFFSET_MAX`): a lock to EOF ends here.
pub const OFFSET_MAX: u64 = i64::MAX as u64;
/// Parked SETLKW requests at most; more get ENOLCK.
pub const WAITERS_MAX: usize = 1024;
/// INTERRUPTs remembered for requests not parked yet.
pub const INTERRUPTED_MAX: usize = 64;

/// Shared or exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    /// F_RDLCK / LOCK_SH.
    Read,
    /// F_WRLCK / LOCK_EX.
    Write,
}

/// POSIX record lock or BSD flock: two independent lock spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// fcntl byte-range lock, owned by a lock owner (process files table).
    Posix,
    /// flock whole-file lock, owned by an open file description.
    Flock,
}

/// One held lock; `end` is inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The owner (FUSE `lock_owner`).
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive); [`OFFSET_MAX`] for "to EOF".
    pub end: u64,
    /// Shared or exclusive.
    pub typ: LockType,
    /// The process that took it (reported by F_GETLK).
    pub pid: u32,
}

impl HeldLock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// A lock or unlock request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// POSIX or flock.
    pub kind: LockKind,
    /// The owner.
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
    /// The lock wanted; `None` unlocks.
    pub typ: Option<LockType>,
    /// The requesting process.
    pub pid: u32,
}

#[derive(Debug, Default)]
struct InodeLocks {
    posix: Vec<HeldLock>,
    flock: Vec<HeldLock>,
}

impl InodeLocks {
    fn list(&self, kind: LockKind) -> &Vec<HeldLock> {
        match kind {
            LockKind::Posix => &self.posix,
            LockKind::Flock => &self.flock,
        }
    }

    fn list_mut(&mut self, kind: LockKind) -> &mut Vec<HeldLock> {
        match kind {
            LockKind::Posix => &mut self.posix,
            LockKind::Flock => &mut self.flock,
        }
    }

    fn conflict(&self, req: &LockRequest) -> Option<HeldLock> {
        let typ = req.typ?;
        self.list(req.kind)
            .iter()
            .find(|l| {
                l.owner != req.owner
                    && l.overlaps(req.start, req.end)
                    && (l.typ == LockType::Write || typ == LockType::Write)
            })
            .copied()
    }

    /// The list of `req.kind` after applying `req`.
    fn applied(&self, req: &LockRequest) -> Vec<HeldLock> {
        let list = self.list(req.kind);
        let mut kept = Vec::with_capacity(list.len() + 2);
        for &l in list {
            if l.owner != req.owner || !l.overlaps(req.start, req.end) {
                kept.push(l);
                continue;
            }
            if l.start < req.start {
                kept.push(HeldLock {
                    end: req.start - 1,
                    ..l
                });
            }
            if l.end > req.end {
                kept.push(HeldLock {
                    start: req.end + 1,
                    ..l
                });
            }
        }
        if let Some(typ) = req.typ {
            insert_merged(
                &mut kept,
                HeldLock {
                    owner: req.owner,
                    start: req.start,
                    end: req.end,
                    typ,
                    pid: req.pid,
                },
            );
        }
        kept
    }

    /// The list of `kind` without `owner`'s locks, if it had any.
    fn without_owner(&self, kind: LockKind, owner: u64) -> Option<Vec<HeldLock>> {
        let list = self.list(kind);
        if !list.iter().any(|l| l.owner == owner) {
            return None;
        }
        Some(list.iter().filter(|l| l.owner != owner).copied().collect())
    }

    fn is_empty(&self) -> bool {
        self.posix.is_empty() && self.flock.is_empty()
    }
}

/// Inserts `new` into `list`, merging it with the same owner's locks of the
/// same type that overlap or touch it.
fn insert_merged(list: &mut Vec<HeldLock>, mut new: HeldLock) {
    let touches = |l: &HeldLock, n: &HeldLock| {
        l.owner == n.owner
            && l.typ == n.typ
            && l.start <= n.end.saturating_add(1)
            && n.start <= l.end.saturating_add(1)
    };
    let mut index = 0;
    while index < list.len() {
        if touches(&list[index], &new) {
            let l = list.swap_remove(index);
            new.start = new.start.min(l.start);
            new.end = new.end.max(l.end);
        } else {
            index += 1;
        }
    }
    list.push(new);
    list.sort_by_key(|l| (l.owner, l.start));
}

/// The lock `req` asks for, as a held lock (`None` for an unlock).
fn wanted(req: &LockRequest) -> Option<HeldLock> {
    req.typ.map(|typ| HeldLock {
        owner: req.owner,
        start: req.start,
        end: req.end,
        typ,
        pid: req.pid,
    })
}

/// What a SETLK/SETLKW did.
#[derive(Debug)]
pub enum SetOutcome<W> {
    /// Applied (or unlocked); answer OK. Also returns waiters now granted.
    Done {
        /// Parked requests granted by this change: answer each OK.
        granted: Vec<W>,
        /// The caller's own waiter, not parked: answer it OK.
        own: Option<W>,
    },
    /// Conflict and no wait: answer EAGAIN. A failed flock conversion
    /// still dropped the old lock (Linux semantics), which may grant others.
    WouldBlock {
        /// Parked requests granted meanwhile: answer each OK.
        granted: Vec<W>,
    },
    /// Parked until the conflicting lock goes away.
    Parked {
        /// Parked requests granted meanwhile: answer each OK.
        granted: Vec<W>,
    },
    /// The lock could not be checked against the other mounts (the
    /// metadata store failed or is fenced): nothing changed.
    Failed {
        /// The caller's waiter, if it gave one.
        waiter: Option<W>,
        /// Why.
        error: Error,
    },
    /// Not parked (too many waiters, interrupted already, or a deadlock):
    /// answer with the errno.
    Refused {
        /// The waiter to answer.
        waiter: W,
        /// ENOLCK, EINTR, or EDEADLK (a POSIX wait that would close a
        /// cycle of owners waiting for each other).
        errno: i32,
        /// Parked requests granted meanwhile: answer each OK.
        granted: Vec<W>,
    },
}

struct Waiter<W> {
    ino: u64,
    unique: u64,
    req: LockRequest,
    waiter: W,
}

/// Where this mount's locks meet those of the volume's other mounts.
pub trait LockRegistry: Send {
    /// Makes `held` this mount's locks of `kind` on `ino` as the other
    /// mounts see them, unless `wanted` conflicts with a lock another mount
    /// holds: then returns that lock and changes nothing.
    /// `granted`: the parked request (by unique) this grants, whose
    /// published wait goes with it.
    fn publish(
        &mut self,
        ino: u64,
        kind: LockKind,
        wanted: Option<&HeldLock>,
        held: &[HeldLock],
        granted: Option<u64>,
    ) -> Result<Option<HeldLock>, Error>;

    /// Publishes that this mount's POSIX request `unique` waits for
    /// `wanted` on `ino`, unless waiting would close a cycle of owners
    /// through the other mounts' locks and waits: `Ok(true)`, nothing
    /// published (answer EDEADLK).
    fn park(&mut self, ino: u64, unique: u64, wanted: &HeldLock) -> Result<bool, Error>;

    /// Forgets the published waits of `uniques` (interrupted, cancelled).
    fn unpark(&mut self, uniques: &[u64]) -> Result<(), Error>;

    /// A lock another mount holds that conflicts with `wanted` (F_GETLK).
    fn conflict(
        &mut self,
        ino: u64,
        kind: LockKind,
        wanted: &HeldLock,
    ) -> Result<Option<HeldLock>, Error>;

    /// Replaces everything this mount published with `held` and the
    /// POSIX waits `(unique, ino, wanted)` (after taking over a
    /// predecessor's table).
    fn replace_all(
        &mut self,
        held: &[(u64, LockKind, HeldLock)],
        waits: &[(u64, u64, HeldLock)],
    ) -> Result<(), Error>;
}

/// The registry of a volume no other mount shares locks with (unit tests,
/// and a table before its connection is known).
pub struct NoOtherMounts;

impl LockRegistry for NoOtherMounts {
    fn publish(
        &mut self,
        _: u64,
        _: LockKind,
        _: Option<&HeldLock>,
        _: &[HeldLock],
        _: Option<u64>,
    ) -> Result<Option<HeldLock>, Error> {
        Ok(None)
    }

    fn park(&mut self, _: u64, _: u64, _: &HeldLock) -> Result<bool, Error> {
        Ok(false)
    }

    fn unpark(&mut self, _: &[u64]) -> Result<(), Error> {
        Ok(())
    }

    fn conflict(&mut self, _: u64, _: LockKind, _: &HeldLock) -> Result<Option<HeldLock>, Error> {
        Ok(None)
    }

    fn replace_all(
        &mut self,
        _: &[(u64, LockKind, HeldLock)],
        _: &[(u64, u64, HeldLock)],
    ) -> Result<(), Error> {
        Ok(())
    }
}

/// All locks of a volume and the parked SETLKW requests.
pub struct LockTable<W> {
    inodes: HashMap<u64, InodeLocks>,
    waiters: VecDeque<Waiter<W>>,
    interrupted: VecDeque<u64>,
    /// Bumped by every change of the held locks (not of the waiters).
    changes: u64,
    registry: Box<dyn LockRegistry>,
    /// Lock lists changed here whose publish failed (retried).
    unpublished: HashSet<(u64, LockKind)>,
    /// Everything must be published again (imported from a predecessor).
    republish_all: bool,
}

impl<W> Default for LockTable<W> {
    fn default() -> Self {
        LockTable {
            inodes: HashMap::new(),
            waiters: VecDeque::new(),
            interrupted: VecDeque::new(),
            changes: 0,
            registry: Box::new(NoOtherMounts),
            unpublished: HashSet::new(),
            republish_all: false,
        }
    }
}

impl<W> LockTable<W> {
    /// Consults `registry` about other mounts from now on.
    pub fn set_registry(&mut self, registry: Box<dyn LockRegistry>) {
        self.registry = registry;
    }

    /// The lock of this mount that blocks `req`, if any.
    pub fn conflict(&self, ino: u64, req: &LockRequest) -> Option<HeldLock> {
        self.inodes.get(&ino)?.conflict(req)
    }

    /// The lock, of this mount or another, that blocks `req` (F_GETLK);
    /// another mount's is reported with pid 0 (its pid means nothing here).
    pub fn conflict_anywhere(
        &mut self,
        ino: u64,
        req: &LockRequest,
    ) -> Result<Option<HeldLock>, Error> {
        if let Some(local) = self.conflict(ino, req) {
            return Ok(Some(local));
        }
        let Some(wanted) = wanted(req) else {
            return Ok(None);
        };
        let remote = self.registry.conflict(ino, req.kind, &wanted)?;
        Ok(remote.map(|l| HeldLock { pid: 0, ..l }))
    }

    /// Applies `req` here if the other mounts let it: `Ok(Some(lock))` when
    /// another mount's lock blocks it. An unlock always takes effect here;
    /// if its publish fails it is retried later. `granted`: the parked
    /// request `req` is (by unique), whose published wait goes with it.
    fn apply(
        &mut self,
        ino: u64,
        req: &LockRequest,
        granted: Option<u64>,
    ) -> Result<Option<HeldLock>, Error> {
        let new = self.inodes.entry(ino).or_default().applied(req);
        let wanted = wanted(req);
        match self
            .registry
            .publish(ino, req.kind, wanted.as_ref(), &new, granted)
        {
            Ok(Some(blocking)) => return Ok(Some(blocking)),
            Ok(None) => {
                self.unpublished.remove(&(ino, req.kind));
            }
            Err(err) if wanted.is_none() => {
                tracing::warn!(nodeid = ino, %err, "unlock not yet visible to the volume's other mounts; retrying");
                self.unpublished.insert((ino, req.kind));
            }
            Err(err) => return Err(err),
        }
        *self.inodes.entry(ino).or_default().list_mut(req.kind) = new;
        self.changes += 1;
        Ok(None)
    }

    /// SETLK (`wait == None`) or SETLKW (`wait == Some((unique, waiter))`).
    pub fn set(&mut self, ino: u64, req: LockRequest, wait: Option<(u64, W)>) -> SetOutcome<W> {
        if self.conflict(ino, &req).is_none() {
            match self.apply(ino, &req, None) {
                Ok(None) => {
                    return SetOutcome::Done {
                        granted: self.wake(ino),
                        own: wait.map(|(_, w)| w),
                    }
                }
                // Blocked by another mount: as by a local conflict.
                Ok(Some(_)) => {}
                Err(error) => {
                    return SetOutcome::Failed {
                        waiter: wait.map(|(_, w)| w),
                        error,
                    }
                }
            }
        }
        // A flock conversion releases the old lock before waiting for the
        // new one, so two shared holders upgrading cannot deadlock.
        let granted = if req.kind == LockKind::Flock {
            self.release_owner(ino, LockKind::Flock, req.owner)
        } else {
            Vec::new()
        };
        let Some((unique, waiter)) = wait else {
            return SetOutcome::WouldBlock { granted };
        };
        if let Some(pos) = self.interrupted.iter().position(|u| *u == unique) {
            self.interrupted.remove(pos);
            return SetOutcome::Refused {
                waiter,
                errno: libc::EINTR,
                granted,
            };
        }
        if req.kind == LockKind::Posix && self.closes_a_cycle(ino, &req) {
            tracing::debug!(
                nodeid = ino,
                unique,
                owner = req.owner,
                "lock request would deadlock"
            );
            return SetOutcome::Refused {
                waiter,
                errno: libc::EDEADLK,
                granted,
            };
        }
        if self.waiters.len() >= WAITERS_MAX {
            return SetOutcome::Refused {
                waiter,
                errno: libc::ENOLCK,
                granted,
            };
        }
        if let (LockKind::Posix, Some(wanted)) = (req.kind, wanted(&req)) {
            match self.registry.park(ino, unique, &wanted) {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(
                        nodeid = ino,
                        unique,
                        owner = req.owner,
                        "lock request would deadlock through another mount"
                    );
                    return SetOutcome::Refused {
                        waiter,
                        errno: libc::EDEADLK,
                        granted,
                    };
                }
                // Parked unpublished, a cycle through it could go unseen:
                // refused as a lock the other mounts cannot check is.
                Err(error) => {
                    return SetOutcome::Failed {
                        waiter: Some(waiter),
                        error,
                    }
                }
            }
        }
        self.waiters.push_back(Waiter {
            ino,
            unique,
            req,
            waiter,
        });
        SetOutcome::Parked { granted }
    }

    /// Owners of this mount's POSIX locks on `ino` that block `req`.
    fn blocking_owners(&self, ino: u64, req: &LockRequest) -> Vec<u64> {
        let Some(typ) = req.typ else {
            return Vec::new();
        };
        let Some(locks) = self.inodes.get(&ino) else {
            return Vec::new();
        };
        locks
            .posix
            .iter()
            .filter(|l| {
                l.owner != req.owner
                    && l.overlaps(req.start, req.end)
                    && (l.typ == LockType::Write || typ == LockType::Write)
            })
            .map(|l| l.owner)
            .collect()
    }

    /// Whether parking `req` would close a cycle of POSIX lock owners each
    /// waiting for a lock the next one holds (F_SETLKW answers EDEADLK,
    /// as the kernel's lock manager does for a local filesystem).
    ///
    /// A parked request waits until no lock conflicts with it, so it waits
    /// for every owner holding a conflicting lock, and any cycle in that
    /// wait-for graph is a deadlock. The search follows every edge (the
    /// kernel follows only the first blocker of each waiter), so it finds
    /// every cycle this mount can see; an owner blocked only by another
    /// mount's lock has no edge here (the registry's search, at park,
    /// follows those: see `fs/lock.rs`).
    ///
    /// Bounded: each owner is visited once, and at most [`WAITERS_MAX`]
    /// parked requests can lead anywhere.
    fn closes_a_cycle(&self, ino: u64, req: &LockRequest) -> bool {
        let mut visited: HashSet<u64> = HashSet::new();
        let mut frontier = self.blocking_owners(ino, req);
        while let Some(owner) = frontier.pop() {
            if owner == req.owner {
                return true;
            }
            if !visited.insert(owner) {
                continue;
            }
            for w in &self.waiters {
                if w.req.kind == LockKind::Posix && w.req.owner == owner {
                    frontier.extend(self.blocking_owners(w.ino, &w.req));
                }
            }
        }
        false
    }

    /// Drops every lock of `kind` held by `owner` on `ino` (close); returns
    /// the waiters granted as a result.
    pub fn release_owner(&mut self, ino: u64, kind: LockKind, owner: u64) -> Vec<W> {
        let Some(new) = self
            .inodes
            .get(&ino)
            .and_then(|l| l.without_owner(kind, owner))
        else {
            return Vec::new();
        };
        match self.registry.publish(ino, kind, None, &new, None) {
            Ok(_) => {
                self.unpublished.remove(&(ino, kind));
            }
            Err(err) => {
                tracing::warn!(nodeid = ino, %err, "released locks not yet visible to the volume's other mounts; retrying");
                self.unpublished.insert((ino, kind));
            }
        }
        if let Some(locks) = self.inodes.get_mut(&ino) {
            *locks.list_mut(kind) = new;
        }
        self.changes += 1;
        self.wake(ino)
    }

    /// Whether [`LockTable::retry`] has work: requests parked (possibly
    /// blocked by another mount) or changes not yet published.
    pub fn needs_retry(&self) -> bool {
        !self.waiters.is_empty() || !self.unpublished.is_empty() || self.republish_all
    }

    /// Publishes what failed to publish, then grants the parked requests
    /// that no mount blocks any more; returns them.
    pub fn retry(&mut self) -> Vec<W> {
        if self.republish_all {
            let held = self.held_locks();
            let waits = self.posix_waits();
            match self.registry.replace_all(&held, &waits) {
                Ok(()) => {
                    self.republish_all = false;
                    self.unpublished.clear();
                }
                Err(err) => {
                    tracing::warn!(%err, "held locks not yet published to the volume's other mounts; retrying");
                }
            }
        }
        let unpublished: Vec<(u64, LockKind)> = self.unpublished.iter().copied().collect();
        for (ino, kind) in unpublished {
            let held = self.held(ino, kind);
            if self.registry.publish(ino, kind, None, &held, None).is_ok() {
                self.unpublished.remove(&(ino, kind));
            }
        }
        let mut inodes: Vec<u64> = self.waiters.iter().map(|w| w.ino).collect();
        inodes.sort_unstable();
        inodes.dedup();
        inodes.into_iter().flat_map(|ino| self.wake(ino)).collect()
    }

    /// Everything held and waiting must be published again (this mount's
    /// entry in the volume may have been lost, e.g. its session expired,
    /// or hold what another generation published).
    pub fn republish_all(&mut self) {
        self.republish_all = true;
    }

    /// The parked POSIX requests as published: `(unique, ino, wanted)`.
    fn posix_waits(&self) -> Vec<(u64, u64, HeldLock)> {
        self.waiters
            .iter()
            .filter(|w| w.req.kind == LockKind::Posix)
            .filter_map(|w| wanted(&w.req).map(|l| (w.unique, w.ino, l)))
            .collect()
    }

    /// Withdraws the published waits of parked requests leaving the table
    /// without a grant; if that fails, the next retry republishes
    /// everything (a stale wait could make a later request EDEADLK).
    fn unpark(&mut self, uniques: &[u64]) {
        if uniques.is_empty() {
            return;
        }
        if let Err(err) = self.registry.unpark(uniques) {
            tracing::warn!(%err, "lock waits not yet withdrawn from the volume's other mounts; retrying");
            self.republish_all = true;
        }
    }

    /// INTERRUPT of `unique`: the parked request, to answer EINTR. If it is
    /// not parked (yet), remember the unique so a later park is refused.
    pub fn interrupt(&mut self, unique: u64) -> Option<W> {
        if let Some(pos) = self.waiters.iter().position(|w| w.unique == unique) {
            let w = self.waiters.remove(pos)?;
            if w.req.kind == LockKind::Posix {
                self.unpark(&[w.unique]);
            }
            return Some(w.waiter);
        }
        if self.interrupted.len() >= INTERRUPTED_MAX {
            self.interrupted.pop_front();
        }
        self.interrupted.push_back(unique);
        None
    }

    /// Takes every parked request (shutdown: answer them EINTR), and
    /// withdraws their published waits (fenced, nothing is withdrawn: a
    /// handover's successor owns them).
    pub fn drain_waiters(&mut self) -> Vec<W> {
        let uniques: Vec<u64> = self.posix_waits().iter().map(|w| w.0).collect();
        self.unpark(&uniques);
        self.waiters.drain(..).map(|w| w.waiter).collect()
    }

    /// Every held lock, by inode and kind (handover).
    pub fn held_locks(&self) -> Vec<(u64, LockKind, HeldLock)> {
        let mut out = Vec::new();
        for (ino, locks) in &self.inodes {
            for kind in [LockKind::Posix, LockKind::Flock] {
                out.extend(locks.list(kind).iter().map(|l| (*ino, kind, *l)));
            }
        }
        out
    }

    /// Takes over a predecessor's held locks (handover, before serving).
    /// What the predecessor published may differ (an unlock it could not
    /// publish), so the whole set is published again by the next retry.
    pub fn import_held(&mut self, held: &[(u64, LockKind, HeldLock)]) {
        if !held.is_empty() {
            self.changes += 1;
        }
        self.republish_all = true;
        for (ino, kind, lock) in held {
            let list = self.inodes.entry(*ino).or_default().list_mut(*kind);
            list.push(*lock);
            list.sort_by_key(|l| (l.owner, l.start));
        }
    }

    /// The parked requests, oldest first, left in place (handover).
    pub fn parked(&self) -> impl Iterator<Item = &W> {
        self.waiters.iter().map(|w| &w.waiter)
    }

    /// A number that changes whenever the held locks do (so a copy of
    /// them is rewritten only when needed).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Number of parked requests.
    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    /// The locks of `kind` held on `ino` (tests, status).
    pub fn held(&self, ino: u64, kind: LockKind) -> Vec<HeldLock> {
        self.inodes
            .get(&ino)
            .map(|l| l.list(kind).clone())
            .unwrap_or_default()
    }

    /// Grants parked requests on `ino` that no longer conflict, in arrival
    /// order (an earlier grant may block a later waiter).
    /// A waiter blocked by another mount (or whose check failed) stays
    /// parked for the next [`LockTable::retry`].
    fn wake(&mut self, ino: u64) -> Vec<W> {
        let mut granted = Vec::new();
        let mut blocked_elsewhere = HashSet::new();
        let mut index = 0;
        while index < self.waiters.len() {
            let w = &self.waiters[index];
            if w.ino == ino
                && !blocked_elsewhere.contains(&w.unique)
                && self.conflict(ino, &w.req).is_none()
            {
                let (unique, req) = (w.unique, w.req);
                let key = (req.kind == LockKind::Posix).then_some(unique);
                match self.apply(ino, &req, key) {
                    Ok(None) => {
                        if let Some(w) = self.waiters.remove(index) {
                            granted.push(w.waiter);
                        }
                        index = 0;
                    }
                    Ok(Some(_)) => {
                        blocked_elsewhere.insert(unique);
                        index += 1;
                    }
                    Err(err) => {
                        tracing::debug!(nodeid = ino, %err, "parked lock request not checked against other mounts; retrying");
                        blocked_elsewhere.insert(unique);
                        index += 1;
                    }
                }
                continue;
            }
            index += 1;
        }
        if self.inodes.get(&ino).is_some_and(InodeLocks::is_empty) {
            self.inodes.remove(&ino);
        }
        granted
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn posix(owner: u64, start: u64, end: u64, typ: Option<LockType>) -> LockRequest {
        LockRequest {
            kind: LockKind::Posix,
            owner,
            start,
            end,
            typ,
            pid: owner as u32,
        }
    }

    fn flock(owner: u64, typ: Option<LockType>) -> LockRequest {
        LockRequest {
            kind: LockKind::Flock,
            owner,
            start: 0,
            end: OFFSET_MAX,
            typ,
            pid: owner as u32,
        }
    }

    fn ranges(t: &LockTable<u32>, kind: LockKind) -> Vec<(u64, u64, u64, LockType)> {
        t.held(7, kind)
            .iter()
            .map(|l| (l.owner, l.start, l.end, l.typ))
            .collect()
    }

    fn done(outcome: SetOutcome<u32>) -> Vec<u32> {
        match outcome {
            SetOutcome::Done { granted, .. } => granted,
            _ => panic!("expected the lock to be applied"),
        }
    }

    use LockType::{Read, Write};

    #[test]
    fn held_locks_round_trip_into_a_new_table() {
        let mut old: LockTable<u32> = LockTable::default();
        let write = |owner, start, end| LockRequest {
            kind: LockKind::Posix,
            owner,
            start,
            end,
            typ: Some(LockType::Write),
            pid: 7,
        };
        assert!(matches!(
            old.set(3, write(1, 0, 9), None),
            SetOutcome::Done { .. }
        ));
        assert!(matches!(
            old.set(3, write(2, 5, 5), Some((40, 9))),
            SetOutcome::Parked { .. }
        ));
        assert_eq!(old.parked().copied().collect::<Vec<_>>(), vec![9]);
        let mut new: LockTable<u32> = LockTable::default();
        new.import_held(&old.held_locks());
        assert_eq!(new.held(3, LockKind::Posix), old.held(3, LockKind::Posix));
        // The successor re-parks the journaled request, and the holder's
        // unlock grants it there.
        assert!(matches!(
            new.set(3, write(2, 5, 5), Some((40, 9))),
            SetOutcome::Parked { .. }
        ));
        assert_eq!(new.release_owner(3, LockKind::Posix, 1), vec![9]);
    }

    #[test]
    fn adjacent_locks_of_one_owner_and_type_merge() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 9, Some(Write)), None));
        done(t.set(7, posix(1, 10, 19, Some(Write)), None));
        done(t.set(7, posix(1, 5, 14, Some(Write)), None));
        assert_eq!(ranges(&t, LockKind::Posix), vec![(1, 0, 19, Write)]);
    }

    #[test]
    fn unlocking_the_middle_splits_a_lock() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 99, Some(Write)), None));
        done(t.set(7, posix(1, 40, 59, None), None));
        assert_eq!(
            ranges(&t, LockKind::Posix),
            vec![(1, 0, 39, Write), (1, 60, 99, Write)]
        );
    }

    #[test]
    fn changing_the_type_of_a_subrange_splits_into_three() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 99, Some(Write)), None));
        done(t.set(7, posix(1, 10, 19, Some(Read)), None));
        assert_eq!(
            ranges(&t, LockKind::Posix),
            vec![(1, 0, 9, Write), (1, 10, 19, Read), (1, 20, 99, Write)]
        );
    }

    #[test]
    fn readers_share_and_writers_conflict_across_owners() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 9, Some(Read)), None));
        done(t.set(7, posix(2, 5, 14, Some(Read)), None));
        assert!(matches!(
            t.set(7, posix(3, 9, 9, Some(Write)), None),
            SetOutcome::WouldBlock { .. }
        ));
        let c = t.conflict(7, &posix(3, 12, 20, Some(Write))).unwrap();
        assert_eq!((c.owner, c.start, c.end), (2, 5, 14));
        assert!(t.conflict(7, &posix(3, 15, 20, Some(Write))).is_none());
        // An owner's own locks never conflict with its requests.
        assert!(t.conflict(7, &posix(1, 0, 4, Some(Write))).is_none());
    }

    #[test]
    fn a_parked_waiter_is_granted_when_the_conflict_goes_away() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, OFFSET_MAX, Some(Write)), None));
        assert!(matches!(
            t.set(7, posix(2, 0, 0, Some(Write)), Some((0x10, 42))),
            SetOutcome::Parked { .. }
        ));
        assert_eq!(t.waiter_count(), 1);
        let granted = done(t.set(7, posix(1, 0, OFFSET_MAX, None), None));
        assert_eq!(granted, vec![42]);
        assert_eq!(ranges(&t, LockKind::Posix), vec![(2, 0, 0, Write)]);
    }

    #[test]
    fn releasing_an_owner_wakes_waiters_in_order() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 9, Some(Write)), None));
        t.set(7, posix(2, 0, 9, Some(Write)), Some((2, 20)));
        t.set(7, posix(3, 0, 9, Some(Write)), Some((3, 30)));
        assert_eq!(t.release_owner(7, LockKind::Posix, 1), vec![20]);
        assert_eq!(t.release_owner(7, LockKind::Posix, 2), vec![30]);
        assert_eq!(t.waiter_count(), 0);
    }

    #[test]
    fn flock_and_posix_locks_are_independent() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, flock(1, Some(Write)), None));
        done(t.set(7, posix(2, 0, 9, Some(Write)), None));
        assert!(matches!(
            t.set(7, flock(2, Some(Read)), None),
            SetOutcome::WouldBlock { .. }
        ));
        // Conversion by the owner replaces its lock.
        done(t.set(7, flock(1, Some(Read)), None));
        done(t.set(7, flock(2, Some(Read)), None));
        assert_eq!(
            ranges(&t, LockKind::Flock),
            vec![(1, 0, OFFSET_MAX, Read), (2, 0, OFFSET_MAX, Read)]
        );
    }

    #[test]
    fn a_flock_upgrade_drops_the_shared_lock_before_waiting() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, flock(1, Some(Read)), None));
        done(t.set(7, flock(2, Some(Read)), None));
        // Owner 1 waits to upgrade; its shared lock is gone meanwhile.
        assert!(matches!(
            t.set(7, flock(1, Some(Write)), Some((1, 10))),
            SetOutcome::Parked { .. }
        ));
        assert_eq!(ranges(&t, LockKind::Flock), vec![(2, 0, OFFSET_MAX, Read)]);
        // Owner 2 is alone now: its upgrade is granted at once, and its
        // release grants owner 1.
        assert!(done(t.set(7, flock(2, Some(Write)), None)).is_empty());
        assert_eq!(t.release_owner(7, LockKind::Flock, 2), vec![10]);
        assert_eq!(ranges(&t, LockKind::Flock), vec![(1, 0, OFFSET_MAX, Write)]);
        // A failed non-blocking conversion loses the old lock, as on Linux.
        t.release_owner(7, LockKind::Flock, 1);
        done(t.set(7, flock(3, Some(Read)), None));
        done(t.set(7, flock(4, Some(Read)), None));
        assert!(matches!(
            t.set(7, flock(3, Some(Write)), None),
            SetOutcome::WouldBlock { .. }
        ));
        assert_eq!(ranges(&t, LockKind::Flock), vec![(4, 0, OFFSET_MAX, Read)]);
    }

    #[test]
    fn interrupt_cancels_a_parked_request_or_one_not_parked_yet() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, flock(1, Some(Write)), None));
        t.set(7, flock(2, Some(Write)), Some((0x20, 2)));
        assert_eq!(t.interrupt(0x20), Some(2));
        assert_eq!(t.interrupt(0x30), None);
        match t.set(7, flock(3, Some(Write)), Some((0x30, 3))) {
            SetOutcome::Refused { waiter, errno, .. } => {
                assert_eq!((waiter, errno), (3, libc::EINTR))
            }
            _ => panic!("an interrupted request must not park"),
        }
    }

    #[test]
    fn waiters_are_bounded() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, flock(1, Some(Write)), None));
        for i in 0..WAITERS_MAX as u64 {
            assert!(matches!(
                t.set(7, flock(100 + i, Some(Write)), Some((i, 0))),
                SetOutcome::Parked { .. }
            ));
        }
        match t.set(7, flock(5, Some(Write)), Some((1 << 40, 9))) {
            SetOutcome::Refused { errno, .. } => assert_eq!(errno, libc::ENOLCK),
            _ => panic!("the waiter list is full"),
        }
        assert_eq!(t.drain_waiters().len(), WAITERS_MAX);
    }

    /// Another mount's locks (one list for every inode), and whether the
    /// store answers; shared with the test through the `Arc`.
    #[derive(Clone, Default)]
    struct OtherMount {
        locks: std::sync::Arc<std::sync::Mutex<Vec<HeldLock>>>,
        down: std::sync::Arc<std::sync::atomic::AtomicBool>,
        published: std::sync::Arc<std::sync::Mutex<Vec<HeldLock>>>,
        /// This mount's published waits: (unique, ino, wanted).
        waits: std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, HeldLock)>>>,
        /// Every park closes a cycle through the other mounts.
        deadlock: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl OtherMount {
        fn check(&self) -> Result<(), Error> {
            if self.down.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::refused(7, "store down", fuse_wire::Errno::EIO));
            }
            Ok(())
        }
    }

    impl LockRegistry for OtherMount {
        fn publish(
            &mut self,
            _: u64,
            _: LockKind,
            wanted: Option<&HeldLock>,
            held: &[HeldLock],
            granted: Option<u64>,
        ) -> Result<Option<HeldLock>, Error> {
            self.check()?;
            if let Some(w) = wanted {
                let blocking = self.locks.lock().unwrap().iter().copied().find(|l| {
                    l.overlaps(w.start, w.end)
                        && (l.typ == LockType::Write || w.typ == LockType::Write)
                });
                if blocking.is_some() {
                    return Ok(blocking);
                }
            }
            *self.published.lock().unwrap() = held.to_vec();
            if let Some(unique) = granted {
                self.waits.lock().unwrap().retain(|w| w.0 != unique);
            }
            Ok(None)
        }

        fn park(&mut self, ino: u64, unique: u64, wanted: &HeldLock) -> Result<bool, Error> {
            self.check()?;
            if self.deadlock.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(true);
            }
            self.waits.lock().unwrap().push((unique, ino, *wanted));
            Ok(false)
        }

        fn unpark(&mut self, uniques: &[u64]) -> Result<(), Error> {
            self.check()?;
            self.waits
                .lock()
                .unwrap()
                .retain(|w| !uniques.contains(&w.0));
            Ok(())
        }

        fn conflict(
            &mut self,
            ino: u64,
            kind: LockKind,
            w: &HeldLock,
        ) -> Result<Option<HeldLock>, Error> {
            let mut probe = self.clone();
            probe.published = Default::default();
            probe.publish(ino, kind, Some(w), &[], None)
        }

        fn replace_all(
            &mut self,
            held: &[(u64, LockKind, HeldLock)],
            waits: &[(u64, u64, HeldLock)],
        ) -> Result<(), Error> {
            self.check()?;
            *self.published.lock().unwrap() = held.iter().map(|h| h.2).collect();
            *self.waits.lock().unwrap() = waits.to_vec();
            Ok(())
        }
    }

    #[test]
    fn a_request_blocked_by_another_mount_parks_until_a_retry_finds_it_free() {
        let other = OtherMount::default();
        let mut t = LockTable::<u32>::default();
        t.set_registry(Box::new(other.clone()));
        other.locks.lock().unwrap().push(HeldLock {
            owner: 99,
            start: 0,
            end: OFFSET_MAX,
            typ: Write,
            pid: 1234,
        });
        assert!(matches!(
            t.set(7, posix(1, 0, 9, Some(Read)), None),
            SetOutcome::WouldBlock { .. }
        ));
        let seen = t
            .conflict_anywhere(7, &posix(1, 0, 9, Some(Read)))
            .unwrap()
            .unwrap();
        assert_eq!(
            (seen.owner, seen.pid),
            (99, 0),
            "another mount's pid is not ours to report"
        );
        assert!(matches!(
            t.set(7, posix(1, 0, 9, Some(Read)), Some((5, 50))),
            SetOutcome::Parked { .. }
        ));
        assert!(t.needs_retry());
        assert!(t.retry().is_empty(), "still held elsewhere");
        other.locks.lock().unwrap().clear();
        assert_eq!(t.retry(), vec![50]);
        assert_eq!(ranges(&t, LockKind::Posix), vec![(1, 0, 9, Read)]);
        assert_eq!(
            other.published.lock().unwrap().len(),
            1,
            "granted and published"
        );
        assert!(!t.needs_retry());
    }

    #[test]
    fn a_lock_the_store_cannot_check_is_refused_but_an_unlock_still_happens_and_is_published_later()
    {
        let other = OtherMount::default();
        let mut t = LockTable::<u32>::default();
        t.set_registry(Box::new(other.clone()));
        done(t.set(7, posix(1, 0, 9, Some(Write)), None));
        other.down.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(
            t.set(7, posix(2, 20, 29, Some(Write)), Some((3, 30))),
            SetOutcome::Failed {
                waiter: Some(30),
                ..
            }
        ));
        assert_eq!(t.held(7, LockKind::Posix).len(), 1, "nothing taken");
        // The holder closes while the store is down: unlocked here at once.
        assert!(t.release_owner(7, LockKind::Posix, 1).is_empty());
        assert!(t.held(7, LockKind::Posix).is_empty());
        assert_eq!(
            other.published.lock().unwrap().len(),
            1,
            "the others still see it"
        );
        assert!(t.needs_retry());
        other
            .down
            .store(false, std::sync::atomic::Ordering::Relaxed);
        t.retry();
        assert!(
            other.published.lock().unwrap().is_empty(),
            "published on retry"
        );
        assert!(!t.needs_retry());
    }

    #[test]
    fn imported_locks_are_published_again_as_a_whole() {
        let other = OtherMount::default();
        let mut t = LockTable::<u32>::default();
        t.set_registry(Box::new(other.clone()));
        let lock = HeldLock {
            owner: 1,
            start: 0,
            end: 9,
            typ: Write,
            pid: 1,
        };
        t.import_held(&[(7, LockKind::Posix, lock)]);
        assert!(t.needs_retry());
        t.retry();
        assert_eq!(*other.published.lock().unwrap(), vec![lock]);
        assert!(!t.needs_retry());
    }

    /// An exclusive lock of another mount on all of every inode.
    fn held_elsewhere(other: &OtherMount) {
        other.locks.lock().unwrap().push(HeldLock {
            owner: 99,
            start: 0,
            end: OFFSET_MAX,
            typ: Write,
            pid: 1234,
        });
    }

    #[test]
    fn a_posix_wait_closing_a_cycle_through_other_mounts_is_edeadlk_and_publishes_no_wait() {
        let other = OtherMount::default();
        let mut t = LockTable::<u32>::default();
        t.set_registry(Box::new(other.clone()));
        held_elsewhere(&other);
        other
            .deadlock
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            errno(t.set(7, posix(1, 0, 0, Some(Write)), Some((10, 1)))),
            libc::EDEADLK
        );
        // Non-blocking: EAGAIN, never EDEADLK; flock waits are not checked.
        assert!(matches!(
            t.set(7, posix(1, 0, 0, Some(Write)), None),
            SetOutcome::WouldBlock { .. }
        ));
        parks(t.set(7, flock(1, Some(Write)), Some((11, 2))));
        assert!(other.waits.lock().unwrap().is_empty());
        assert_eq!(t.waiter_count(), 1);
    }

    #[test]
    fn published_waits_follow_the_parked_posix_requests() {
        let other = OtherMount::default();
        let mut t = LockTable::<u32>::default();
        t.set_registry(Box::new(other.clone()));
        held_elsewhere(&other);
        parks(t.set(7, posix(1, 0, 0, Some(Write)), Some((10, 1))));
        parks(t.set(7, posix(2, 5, 5, Some(Read)), Some((20, 2))));
        parks(t.set(8, posix(3, 0, 0, Some(Write)), Some((30, 3))));
        let keys = |o: &OtherMount| -> Vec<u64> {
            let mut k: Vec<u64> = o.waits.lock().unwrap().iter().map(|w| w.0).collect();
            k.sort_unstable();
            k
        };
        assert_eq!(keys(&other), vec![10, 20, 30]);
        assert_eq!(t.interrupt(20), Some(2));
        assert_eq!(keys(&other), vec![10, 30]);
        // A grant withdraws the wait in its publish.
        other.locks.lock().unwrap().clear();
        assert_eq!(t.retry(), vec![1, 3]);
        assert!(keys(&other).is_empty());
        // Republished as a whole (a takeover): the parked ones again.
        held_elsewhere(&other);
        parks(t.set(7, posix(4, 0, 0, Some(Write)), Some((40, 4))));
        other.waits.lock().unwrap().clear();
        t.republish_all();
        t.retry();
        assert_eq!(keys(&other), vec![40]);
        // A withdrawal that fails is made by the next republish.
        other.down.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(t.drain_waiters(), vec![4]);
        other
            .down
            .store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(t.needs_retry());
        t.retry();
        assert!(keys(&other).is_empty());
    }

    fn errno(outcome: SetOutcome<u32>) -> i32 {
        match outcome {
            SetOutcome::Refused { errno, .. } => errno,
            _ => panic!("expected the request to be refused"),
        }
    }

    fn parks(outcome: SetOutcome<u32>) {
        assert!(matches!(outcome, SetOutcome::Parked { .. }), "{outcome:?}");
    }

    #[test]
    fn a_wait_closing_a_cycle_of_two_owners_is_edeadlk_and_the_other_is_granted_later() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 0, Some(Write)), None));
        done(t.set(7, posix(2, 1, 1, Some(Write)), None));
        parks(t.set(7, posix(1, 1, 1, Some(Write)), Some((10, 1))));
        assert_eq!(
            errno(t.set(7, posix(2, 0, 0, Some(Write)), Some((20, 2)))),
            libc::EDEADLK
        );
        // A non-blocking request is EAGAIN, never EDEADLK.
        assert!(matches!(
            t.set(7, posix(2, 0, 0, Some(Write)), None),
            SetOutcome::WouldBlock { .. }
        ));
        assert_eq!(t.release_owner(7, LockKind::Posix, 2), vec![1]);
    }

    #[test]
    fn a_cycle_of_three_owners_across_inodes_is_edeadlk() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 9, Some(Write)), None));
        done(t.set(8, posix(2, 0, 9, Some(Read)), None));
        done(t.set(9, posix(3, 0, 9, Some(Write)), None));
        parks(t.set(8, posix(1, 5, 5, Some(Write)), Some((1, 1))));
        parks(t.set(9, posix(2, 0, 0, Some(Read)), Some((2, 2))));
        assert_eq!(
            errno(t.set(7, posix(3, 9, 20, Some(Read)), Some((3, 3)))),
            libc::EDEADLK
        );
        // Owner 3 may still wait for what is not in the cycle.
        done(t.set(10, posix(4, 0, 0, Some(Write)), None));
        parks(t.set(10, posix(3, 0, 0, Some(Write)), Some((4, 4))));
    }

    #[test]
    fn waits_without_a_cycle_still_park() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, posix(1, 0, 0, Some(Write)), None));
        done(t.set(7, posix(2, 1, 1, Some(Write)), None));
        // 1 waits for 2, 3 waits for 1: a chain, no cycle.
        parks(t.set(7, posix(1, 1, 1, Some(Write)), Some((1, 1))));
        parks(t.set(7, posix(3, 0, 0, Some(Write)), Some((2, 3))));
        // Shared locks do not block shared requests: no edge.
        done(t.set(8, posix(2, 0, 0, Some(Read)), None));
        done(t.set(8, posix(1, 0, 0, Some(Read)), None));
        assert_eq!(t.release_owner(7, LockKind::Posix, 2), vec![1]);
        assert_eq!(t.release_owner(7, LockKind::Posix, 1), vec![3]);
    }

    #[test]
    fn flock_waits_are_not_checked_for_deadlock() {
        let mut t = LockTable::<u32>::default();
        done(t.set(7, flock(1, Some(Write)), None));
        done(t.set(8, flock(2, Some(Write)), None));
        parks(t.set(8, flock(1, Some(Write)), Some((1, 1))));
        parks(t.set(7, flock(2, Some(Write)), Some((2, 2))));
    }

    #[test]
    fn interrupted_memory_is_bounded() {
        let mut t = LockTable::<u32>::default();
        for u in 0..(INTERRUPTED_MAX as u64 + 10) {
            assert_eq!(t.interrupt(u), None);
        }
        assert_eq!(t.interrupted.len(), INTERRUPTED_MAX);
    }
}
