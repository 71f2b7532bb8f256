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

use crate::sql::{params, Db, OptionalExtension, Row, Stmt};

use super::sessions::{from_sql, sql};
use crate::error::Result;
use crate::types::{LockSpace, RangeLock};

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
/// (returned instead; nothing changes).
pub(crate) fn publish<C: Db>(
    c: &C,
    session: u64,
    ino: u64,
    space: LockSpace,
    wanted: Option<&RangeLock>,
    held: &[RangeLock],
) -> Result<Option<RangeLock>> {
    if let Some(wanted) = wanted {
        if let Some(other) = conflicting(c, session, ino, space, wanted)? {
            return Ok(Some(other));
        }
    }
    replace(c, session, ino, space, held)?;
    Ok(None)
}

/// Replaces every row of `session` with `held`.
pub(crate) fn replace_all<C: Db>(
    c: &C,
    session: u64,
    held: &[(u64, LockSpace, RangeLock)],
) -> Result<()> {
    c.prepare_cached("DELETE FROM locks WHERE session = ?1")?
        .execute(params![sql(session)])?;
    for (ino, space, lock) in held {
        insert(c, session, *ino, *space, std::slice::from_ref(lock))?;
    }
    Ok(())
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
