//! The `request_results` table: results of mutations recorded for
//! exactly-once execution, written in the mutation's own transaction and
//! keyed by (connection, unique). u64 values are stored bit-cast to i64.
//! Its DDL is engine-specific (`sqlite/schema.rs`, `postgres/schema.rs`).

use super::sessions::sql;
use crate::sql::{params, Db, OptionalExtension, Stmt};

use crate::error::{MetaError, Result};
use crate::types::{RequestKey, Timespec};

/// Records `result` for `key`; `DuplicateRequest` if already recorded.
pub(crate) fn record<C: Db>(c: &C, key: RequestKey, result: &[u8]) -> Result<()> {
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
pub(crate) fn forget<C: Db>(c: &C, keys: &[RequestKey]) -> Result<()> {
    let mut delete =
        c.prepare_cached("DELETE FROM request_results WHERE connection = ?1 AND unique_id = ?2")?;
    for key in keys {
        delete.execute(params![sql(key.connection), sql(key.unique)])?;
    }
    Ok(())
}

/// The recorded result for `key`, if any.
pub(crate) fn get<C: Db>(c: &C, key: RequestKey) -> Result<Option<Vec<u8>>> {
    Ok(c.prepare_cached(
        "SELECT result FROM request_results WHERE connection = ?1 AND unique_id = ?2",
    )?
    .query_row(params![sql(key.connection), sql(key.unique)], |r| r.get(0))
    .optional()?)
}

/// Deletes records made before `before` (second resolution).
pub(crate) fn prune<C: Db>(c: &C, before: Timespec) -> Result<u64> {
    let n = c
        .prepare_cached("DELETE FROM request_results WHERE recorded_sec < ?1")?
        .execute(params![before.sec])?;
    Ok(n as u64)
}
