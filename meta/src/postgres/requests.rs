//! The `completed_requests` table: results of mutations recorded for
//! exactly-once execution, written in the mutation's own transaction.
//! Keys are u64 stored bit-cast to i64.

use super::db::{params, Connection, OptionalExtension};

use crate::error::{MetaError, Result};
use crate::types::{RequestKey, Timespec};

fn sql_key(key: RequestKey) -> i64 {
    i64::from_ne_bytes(key.0.to_ne_bytes())
}

/// Records `result` for `key`; `DuplicateRequest` if already recorded.
pub(crate) fn record(c: &Connection, key: RequestKey, result: &[u8]) -> Result<()> {
    // ON CONFLICT instead of a failed insert: an error aborts the whole
    // PostgreSQL transaction.
    let inserted = c
        .prepare_cached(
            "INSERT INTO completed_requests (request_key, result, recorded_sec) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![sql_key(key), result, Timespec::now().sec])?;
    if inserted == 0 {
        return Err(MetaError::DuplicateRequest { request_key: key.0 });
    }
    Ok(())
}

/// The recorded result for `key`, if any.
pub(crate) fn get(c: &Connection, key: RequestKey) -> Result<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT result FROM completed_requests WHERE request_key = ?1")?
            .query_row([sql_key(key)], |r| r.get(0))
            .optional()?,
    )
}

/// Deletes records made before `before` (second resolution).
pub(crate) fn prune(c: &Connection, before: Timespec) -> Result<u64> {
    let n = c
        .prepare_cached("DELETE FROM completed_requests WHERE recorded_sec < ?1")?
        .execute([before.sec])?;
    Ok(n as u64)
}
