//! The `request_results` table: results of mutations recorded for
//! exactly-once execution, written in the mutation's own transaction and
//! keyed by (connection, unique). u64 values are stored bit-cast to i64.
//!
//! The table is additive to format v1 (it replaced the unused
//! `completed_requests` of the first v1 builds): `ensure` creates it when an
//! older v1 database is opened, and v1 builds that predate it never touch it.

use rusqlite::{params, Connection, ErrorCode, OptionalExtension};

use crate::error::{MetaError, Result};
use crate::types::{RequestKey, Timespec};

/// The table and its index; `IF NOT EXISTS` so it also upgrades in place.
pub(crate) const DDL: &str = "
CREATE TABLE IF NOT EXISTS request_results (
    connection INTEGER NOT NULL,
    unique_id INTEGER NOT NULL,
    result BLOB NOT NULL,
    recorded_sec INTEGER NOT NULL,
    PRIMARY KEY (connection, unique_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS request_results_by_time ON request_results(recorded_sec);
";

fn sql(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

/// Creates the table in a database made before it existed.
pub(crate) fn ensure(c: &Connection) -> Result<()> {
    c.execute_batch(DDL)?;
    Ok(())
}

/// Records `result` for `key`; `DuplicateRequest` if already recorded.
pub(crate) fn record(c: &Connection, key: RequestKey, result: &[u8]) -> Result<()> {
    let inserted = c
        .prepare_cached(
            "INSERT INTO request_results (connection, unique_id, result, recorded_sec)
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![
            sql(key.connection),
            sql(key.unique),
            result,
            Timespec::now().sec
        ]);
    match inserted {
        Ok(_) => Ok(()),
        Err(rusqlite::Error::SqliteFailure(f, _)) if f.code == ErrorCode::ConstraintViolation => {
            Err(MetaError::DuplicateRequest { request_key: key })
        }
        Err(e) => Err(e.into()),
    }
}

/// Deletes the records of answered requests.
pub(crate) fn forget(c: &Connection, keys: &[RequestKey]) -> Result<()> {
    let mut delete =
        c.prepare_cached("DELETE FROM request_results WHERE connection = ?1 AND unique_id = ?2")?;
    for key in keys {
        delete.execute(params![sql(key.connection), sql(key.unique)])?;
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
