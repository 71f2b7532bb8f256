//! Sessions and orphan holds, for both engines (heartbeats by
//! [`Db::now_ms`]: this host's clock on SQLite, the server's on PostgreSQL,
//! so that hosts' clocks need not agree).
//!
//! A session is one mount (FUSE connection) serving the volume. When an
//! inode's link count reaches 0, the transaction that did it records a hold
//! `(session, ino)` for EVERY registered session: any of them may have the
//! inode open. Each session then drops the holds on inodes it has no handle
//! on; the transaction that drops the last hold reclaims the orphan. A
//! session whose heartbeat is older than the expiry is deleted by any other
//! session, with its holds. Opens and closes write nothing here unless the
//! inode they touch is already an orphan.

use crate::sql::{params, Db, OptionalExtension, Stmt};

use super::orphan;
use crate::error::{MetaError, Result};
use crate::types::{ObjectRef, SessionInfo, SessionRecord};

/// Ids (sessions, connections, lock owners) are u64 stored bit-cast to
/// i64.
pub(crate) fn sql(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

/// The u64 of a stored [`sql`] value.
pub(crate) fn from_sql(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

/// Called by the transaction that brought `ino` to nlink 0: every session
/// holds it until it says it has no handle on it.
pub(crate) fn hold_for_all<C: Db>(c: &C, ino: u64) -> Result<()> {
    // `WHERE true`: SQLite parses `FROM sessions ON CONFLICT` as a join
    // constraint without it.
    c.prepare_cached(
        "INSERT INTO orphan_holds (session, ino) SELECT id, ?1 FROM sessions WHERE true
         ON CONFLICT DO NOTHING",
    )?
    .execute(params![ino])?;
    Ok(())
}

/// Registers `info`, or takes over the row of the same id (a generation
/// after a crash continues its predecessor's session and holds).
pub(crate) fn open<C: Db>(c: &C, info: &SessionInfo) -> Result<()> {
    let now = c.now_ms()?;
    c.prepare_cached(
        "INSERT INTO sessions (id, host, pid, mount, started_ms, heartbeat_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)
         ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
             mount = excluded.mount, heartbeat_ms = excluded.heartbeat_ms",
    )?
    .execute(params![sql(info.id), info.host, info.pid, info.mount, now])?;
    Ok(())
}

/// Renews the heartbeat; `false` if the session is gone (expired by
/// another session: its holds were dropped).
pub(crate) fn heartbeat<C: Db>(c: &C, id: u64) -> Result<bool> {
    let now = c.now_ms()?;
    let n = c
        .prepare_cached("UPDATE sessions SET heartbeat_ms = ?2 WHERE id = ?1")?
        .execute(params![sql(id), now])?;
    Ok(n == 1)
}

/// Deletes the session and its holds; returns the inodes it held (the
/// caller offers each to [`release`] with no session).
pub(crate) fn close<C: Db>(c: &C, id: u64) -> Result<Vec<u64>> {
    let held = held_by(c, id)?;
    c.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
        .execute(params![sql(id)])?;
    Ok(held)
}

/// Deletes every session whose heartbeat is before `cutoff_ms`, with its
/// holds, its locks and its parked lock requests (`ON DELETE CASCADE`:
/// a dead host's waits must not make a living one's request EDEADLK);
/// returns their ids.
pub(crate) fn expire<C: Db>(c: &C, max_age_ms: i64) -> Result<Vec<u64>> {
    let cutoff = c.now_ms()?.saturating_sub(max_age_ms);
    let ids: Vec<i64> = c
        .prepare_cached("DELETE FROM sessions WHERE heartbeat_ms < ?1 RETURNING id")?
        .collect_rows(params![cutoff], |r| r.get(0))?;
    Ok(ids.into_iter().map(from_sql).collect())
}

/// The orphans session `id` holds, ascending.
pub(crate) fn held_by<C: Db>(c: &C, id: u64) -> Result<Vec<u64>> {
    let v: Vec<u64> = c
        .prepare_cached("SELECT ino FROM orphan_holds WHERE session = ?1 ORDER BY ino")?
        .collect_rows(params![sql(id)], |r| r.get(0))?;
    Ok(v)
}

/// Orphans no session holds (their holders died or closed), ascending, at
/// most `limit`.
pub(crate) fn unheld<C: Db>(c: &C, limit: u32) -> Result<Vec<u64>> {
    let v: Vec<u64> = c
        .prepare_cached(
            "SELECT o.ino FROM orphans o
             WHERE NOT EXISTS (SELECT 1 FROM orphan_holds h WHERE h.ino = o.ino)
             ORDER BY o.ino LIMIT ?1",
        )?
        .collect_rows(params![limit], |r| r.get(0))?;
    Ok(v)
}

/// Session `id` has `ino` open and found it at nlink 0: records the hold.
/// `NotFound` if the inode was reclaimed meanwhile.
pub(crate) fn hold<C: Db>(c: &C, id: u64, ino: u64) -> Result<()> {
    let nlink: Option<u32> = c
        .prepare_cached("SELECT nlink FROM inodes WHERE ino = ?1")?
        .query_row(params![ino], |r| r.get(0))
        .optional()?;
    match nlink {
        None => Err(MetaError::NotFound { ino, name: None }),
        Some(0) => {
            c.prepare_cached(
                "INSERT INTO orphan_holds (session, ino) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            )?
            .execute(params![sql(id), ino])?;
            Ok(())
        }
        // Linked (an O_TMPFILE given its name): nothing to hold.
        Some(_) => Ok(()),
    }
}

/// Drops `session`'s hold on `ino` (none: only checks), then reclaims the
/// inode if it is an orphan nobody holds. `Some(objects to delete)` when it
/// was reclaimed, `None` when it is still held, linked or already gone.
pub(crate) fn release<C: Db>(
    c: &C,
    session: Option<u64>,
    ino: u64,
) -> Result<Option<Vec<ObjectRef>>> {
    if let Some(id) = session {
        c.prepare_cached("DELETE FROM orphan_holds WHERE session = ?1 AND ino = ?2")?
            .execute(params![sql(id), ino])?;
    }
    let free: Option<bool> = c
        .prepare_cached(
            "SELECT NOT EXISTS (SELECT 1 FROM orphan_holds WHERE ino = ?1)
             FROM orphans WHERE ino = ?1",
        )?
        .query_row(params![ino], |r| r.get(0))
        .optional()?;
    if free != Some(true) {
        return Ok(None);
    }
    orphan::reclaim(c, ino).map(Some)
}

/// Every registered session, by id.
pub(crate) fn list<C: Db>(c: &C) -> Result<Vec<SessionRecord>> {
    let v: Vec<SessionRecord> = c
        .prepare_cached(
            "SELECT id, host, pid, mount, started_ms, heartbeat_ms FROM sessions ORDER BY id",
        )?
        .collect_rows(params![], |r| {
            Ok(SessionRecord {
                info: SessionInfo {
                    id: from_sql(r.get(0)?),
                    host: r.get(1)?,
                    pid: r.get(2)?,
                    mount: r.get(3)?,
                },
                started_ms: r.get(4)?,
                heartbeat_ms: r.get(5)?,
            })
        })?;
    Ok(v)
}
