//! The `request_results` table: results of mutations recorded for
//! exactly-once execution, written in the mutation's own transaction and
//! keyed by (connection, unique). u64 values are stored bit-cast to i64.
//! (Schema 1 had `completed_requests` keyed by a single u64; no build ever
//! wrote to it. Migration 3 adds this table.)

use super::db::{params, Connection, OptionalExtension};

use crate::error::{MetaError, Result};
use crate::types::{RequestKey, Timespec};

fn sql(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

/// Records `result` for `key`; `DuplicateRequest` if already recorded.
pub(crate) fn record(c: &Connection, key: RequestKey, result: &[u8]) -> Result<()> {
    // ON CONFLICT instead of a failed insert: an error aborts the whole
    // PostgreSQL transaction.
    let inserted = c
        .prepare_cached(
            "INSERT INTO request_results (connection, unique_id, result, recorded_sec)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
        )?
        .execute(params![
            sql(key.connection),
            sql(key.unique),
            result,
            Timespec::now().sec
        ])?;
    if inserted == 0 {
        return Err(MetaError::DuplicateRequest { request_key: key });
    }
    Ok(())
}

/// Deletes the records of answered requests.
pub(crate) fn forget(c: &Connection, keys: &[RequestKey]) -> Result<()> {
    for key in keys {
        c.prepare_cached("DELETE FROM request_results WHERE connection = ?1 AND unique_id = ?2")?
            .execute(params![sql(key.connection), sql(key.unique)])?;
    }
    Ok(())
}

/// The recorded result for `key`, if any.
pub(crate) fn get(c: &Connection, key: RequestKey) -> Result<Option<Vec<u8>>> {
    Ok(c.prepare_cached(
        "SELECT result FROM request_results WHERE connection = ?1 AND unique_id = ?2",
    )?
    .query_row(params![sql(key.connection), sql(key.unique)], |r| r.get(0))
    .optional()?)
}

/// Deletes records made before `before` (second resolution).
pub(crate) fn prune(c: &Connection, before: Timespec) -> Result<u64> {
    let n = c
        .prepare_cached("DELETE FROM request_results WHERE recorded_sec < ?1")?
        .execute([before.sec])?;
    Ok(n as u64)
}
