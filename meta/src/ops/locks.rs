//! Locks shared by a volume's mounts, for both engines.
//!
//! Each session (mount) publishes the byte-range and flock locks it holds,
//! per inode and lock space, as rows `(session, ino, space, owner, start,
//! end, exclusive, pid)`. A mount's own lock table decides between its own
//! lock owners; these rows decide between mounts: a lock is taken only if
//! no other session's row conflicts with it, checked and published in one
//! write transaction (`BEGIN IMMEDIATE` on SQLite, SERIALIZABLE on
//! PostgreSQL), so two hosts can never both win. Rows go with their
//! session (close, expiry: `ON DELETE CASCADE`) and their inode (reclaim).
//!
//! Each session also publishes its parked POSIX requests (F_SETLKW) as
//! rows `(session, wait_key, ino, owner, start, end, exclusive, pid)` in
//! `lock_waits`, so that a wait closing a cycle through other hosts is
//! refused EDEADLK. Across sessions a lock owner is `(session, owner)`; a
//! waiter waits for every owner holding a POSIX lock that conflicts with
//! its request, and [`park`] searches that graph from the new request's
//! blockers in the transaction that records it: reaching the requester is
//! a deadlock, and nothing is recorded. Serializable (PostgreSQL) or
//! single-writer (SQLite), two requests closing one cycle from two hosts
//! cannot both miss each other: the later transaction sees the earlier
//! one's row (or conflicts and is retried). A wait row goes in the
//! transaction that grants its request ([`publish`]), when it is
//! interrupted or cancelled ([`unpark`]), when its session republishes
//! everything ([`replace_all`]), and with its session or inode as the
//! held locks do. flock waits are not recorded (nor checked, as on Linux).

use crate::sql::{params, Db, OptionalExtension, Row, Stmt};

use super::sessions::{from_sql, sql};
use crate::error::Result;
use crate::limits::LOCK_WAIT_SEARCH_OWNERS_MAX;
use crate::types::{LockSpace, LockWait, Parked, RangeLock};

fn row(r: &Row<'_>) -> crate::sql::SqlResult<RangeLock> {
    Ok(RangeLock {
        owner: from_sql(r.get(0)?),
        start: r.get(1)?,
        end: r.get(2)?,
        exclusive: r.get::<_, i64>(3)? != 0,
        pid: r.get(4)?,
    })
}

/// A lock of another session on `(ino, space)` that conflicts with `wanted`.
pub(crate) fn conflicting<C: Db>(
    c: &C,
    session: u64,
    ino: u64,
    space: LockSpace,
    wanted: &RangeLock,
) -> Result<Option<RangeLock>> {
    let found = c
        .prepare_cached(
            "SELECT owner, start_byte, end_byte, exclusive, pid FROM locks
             WHERE ino = ?1 AND space = ?2 AND session <> ?3
               AND start_byte <= ?5 AND ?4 <= end_byte AND (exclusive <> 0 OR ?6 <> 0)
             LIMIT 1",
        )?
        .query_row(
            params![
                ino,
                space.code(),
                sql(session),
                wanted.start,
                wanted.end,
                i64::from(wanted.exclusive)
            ],
            row,
        )
        .optional()?;
    Ok(found)
}

/// Replaces `session`'s rows on `(ino, space)` with `held`.
pub(crate) fn replace<C: Db>(
    c: &C,
    session: u64,
    ino: u64,
    space: LockSpace,
    held: &[RangeLock],
) -> Result<()> {
    c.prepare_cached("DELETE FROM locks WHERE session = ?1 AND ino = ?2 AND space = ?3")?
        .execute(params![sql(session), ino, space.code()])?;
    insert(c, session, ino, space, held)
}

fn insert<C: Db>(
    c: &C,
    session: u64,
    ino: u64,
    space: LockSpace,
    held: &[RangeLock],
) -> Result<()> {
    let mut stmt = c.prepare_cached(
        "INSERT INTO locks (session, ino, space, owner, start_byte, end_byte, exclusive, pid)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for l in held {
        stmt.execute(params![
            sql(session),
            ino,
            space.code(),
            sql(l.owner),
            l.start,
            l.end,
            i64::from(l.exclusive),
            l.pid
        ])?;
    }
    Ok(())
}

/// Publishes `held` unless `wanted` conflicts with another session's lock
/// (returned instead; nothing changes). `granted`: the parked request this
/// grants, whose wait row goes in the same transaction.
pub(crate) fn publish<C: Db>(
    c: &C,
    session: u64,
    ino: u64,
    space: LockSpace,
    wanted: Option<&RangeLock>,
    held: &[RangeLock],
    granted: Option<u64>,
) -> Result<Option<RangeLock>> {
    if let Some(wanted) = wanted {
        if let Some(other) = conflicting(c, session, ino, space, wanted)? {
            return Ok(Some(other));
        }
    }
    replace(c, session, ino, space, held)?;
    if let Some(key) = granted {
        unpark(c, session, &[key])?;
    }
    Ok(None)
}

/// Replaces every row of `session` with `held`, and its wait rows with
/// `waits`.
pub(crate) fn replace_all<C: Db>(
    c: &C,
    session: u64,
    held: &[(u64, LockSpace, RangeLock)],
    waits: &[LockWait],
) -> Result<()> {
    c.prepare_cached("DELETE FROM locks WHERE session = ?1")?
        .execute(params![sql(session)])?;
    for (ino, space, lock) in held {
        insert(c, session, *ino, *space, std::slice::from_ref(lock))?;
    }
    c.prepare_cached("DELETE FROM lock_waits WHERE session = ?1")?
        .execute(params![sql(session)])?;
    for wait in waits {
        insert_wait(c, session, wait)?;
    }
    Ok(())
}

fn insert_wait<C: Db>(c: &C, session: u64, wait: &LockWait) -> Result<()> {
    let l = &wait.lock;
    c.prepare_cached(
        "INSERT INTO lock_waits
             (session, wait_key, ino, owner, start_byte, end_byte, exclusive, pid)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (session, wait_key) DO UPDATE SET ino = excluded.ino,
             owner = excluded.owner, start_byte = excluded.start_byte,
             end_byte = excluded.end_byte, exclusive = excluded.exclusive,
             pid = excluded.pid",
    )?
    .execute(params![
        sql(session),
        sql(wait.key),
        wait.ino,
        sql(l.owner),
        l.start,
        l.end,
        i64::from(l.exclusive),
        l.pid
    ])?;
    Ok(())
}

/// The owners `(session, owner)` that the POSIX request `wait` of
/// `session` waits for, and those they wait for in turn (following every
/// parked request of each), at most `limit`: one statement, evaluated only
/// as far as it is read on both engines.
fn reachable_owners<C: Db>(
    c: &C,
    session: u64,
    wait: &LockWait,
    limit: u32,
) -> Result<Vec<(u64, u64)>> {
    let l = &wait.lock;
    let v = c
        .prepare_cached(
            "WITH RECURSIVE blockers(session, owner) AS (
                 SELECT h.session, h.owner FROM locks h
                 WHERE h.ino = ?1 AND h.space = ?2
                   AND h.start_byte <= ?4 AND ?3 <= h.end_byte
                   AND (h.exclusive <> 0 OR ?5 <> 0)
                   AND NOT (h.session = ?6 AND h.owner = ?7)
                 UNION
                 SELECT h.session, h.owner FROM blockers b
                 JOIN lock_waits w ON w.session = b.session AND w.owner = b.owner
                 JOIN locks h ON h.ino = w.ino AND h.space = ?2
                   AND h.start_byte <= w.end_byte AND w.start_byte <= h.end_byte
                   AND (h.exclusive <> 0 OR w.exclusive <> 0)
                   AND NOT (h.session = w.session AND h.owner = w.owner)
             )
             SELECT session, owner FROM blockers LIMIT ?8",
        )?
        .collect_rows(
            params![
                wait.ino,
                LockSpace::Posix.code(),
                l.start,
                l.end,
                i64::from(l.exclusive),
                sql(session),
                sql(l.owner),
                limit
            ],
            |r| Ok((from_sql(r.get(0)?), from_sql(r.get(1)?))),
        )?;
    Ok(v)
}

/// Records `wait`, a POSIX request `session` parks, unless waiting would
/// close a cycle: its owner reachable from the owners of the locks that
/// block it ([`Parked::WouldDeadlock`]; nothing recorded). The search
/// visits at most [`LOCK_WAIT_SEARCH_OWNERS_MAX`] owners; past it the
/// request is recorded unchecked (logged). A row of the same key is
/// replaced (a resent request parks again).
pub(crate) fn park<C: Db>(c: &C, session: u64, wait: &LockWait) -> Result<Parked> {
    let reached = reachable_owners(c, session, wait, LOCK_WAIT_SEARCH_OWNERS_MAX)?;
    if reached.contains(&(session, wait.lock.owner)) {
        return Ok(Parked::WouldDeadlock);
    }
    if reached.len() >= LOCK_WAIT_SEARCH_OWNERS_MAX as usize {
        tracing::warn!(
            nodeid = wait.ino,
            owners = reached.len(),
            "lock wait graph too large to search; parked without a deadlock check"
        );
    }
    insert_wait(c, session, wait)?;
    Ok(Parked::Waiting)
}

/// Forgets `session`'s parked requests `keys` (granted, interrupted,
/// cancelled).
pub(crate) fn unpark<C: Db>(c: &C, session: u64, keys: &[u64]) -> Result<()> {
    let mut stmt =
        c.prepare_cached("DELETE FROM lock_waits WHERE session = ?1 AND wait_key = ?2")?;
    for key in keys {
        stmt.execute(params![sql(session), sql(*key)])?;
    }
    Ok(())
}

/// Every parked request `session` publishes, by key (tests, status).
pub(crate) fn waits_of_session<C: Db>(c: &C, session: u64) -> Result<Vec<LockWait>> {
    let v = c
        .prepare_cached(
            "SELECT owner, start_byte, end_byte, exclusive, pid, ino, wait_key FROM lock_waits
             WHERE session = ?1 ORDER BY wait_key",
        )?
        .collect_rows(params![sql(session)], |r| {
            Ok(LockWait {
                key: from_sql(r.get(6)?),
                ino: r.get(5)?,
                lock: row(r)?,
            })
        })?;
    Ok(v)
}

/// Every row of `session`, by inode, space and start.
pub(crate) fn of_session<C: Db>(c: &C, session: u64) -> Result<Vec<(u64, LockSpace, RangeLock)>> {
    let v = c
        .prepare_cached(
            "SELECT owner, start_byte, end_byte, exclusive, pid, ino, space FROM locks
             WHERE session = ?1 ORDER BY ino, space, start_byte",
        )?
        .collect_rows(params![sql(session)], |r| {
            Ok((r.get(5)?, LockSpace::from_code(r.get(6)?), row(r)?))
        })?;
    Ok(v)
}
