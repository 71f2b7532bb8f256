//! One request's row changes, as the operation log holds them
//! (`oplog.rs`): captured from SQLite's pre-update hook on the writer
//! connection, encoded as whole old and new rows, and applied again by a
//! replay by rowid or primary key.
//!
//! Not SQLite's session extension: a session per request, with its
//! changeset, cost about 100 µs a request (it prepares a `SELECT` per table
//! per changeset and reads each table's schema per session); the hook only
//! copies values.

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::hooks::{Action, PreUpdateCase};
use rusqlite::types::ValueRef;
use rusqlite::Connection;

use crate::error::Result;
use crate::row_cache::RowCache;

/// Collects the rows the writer connection changes, from SQLite's
/// pre-update hook, as one record's bytes. Per change: the operation
/// (`I`, `D`, `U`), the table's name, the rowid(s) (0 for a table without
/// one), the column count, then the old row (D, U) and the new row (I, U).
/// Whole rows, so a replay needs nothing but the schema.
#[derive(Clone, Debug, Default)]
pub(crate) struct Capture {
    changes: Arc<Mutex<Vec<u8>>>,
}

impl Capture {
    /// Installs the hook on `conn` (the writer); each change also reaches
    /// `cache` (`row_events.rs`).
    pub(crate) fn install(&self, conn: &mut Connection, cache: Arc<RowCache>) -> Result<()> {
        let changes = Arc::clone(&self.changes);
        conn.preupdate_hook(Some(
            move |_: Action, db: &str, table: &str, case: &PreUpdateCase| {
                if db != "main" {
                    return;
                }
                let mut out = changes.lock().unwrap_or_else(PoisonError::into_inner);
                encode_change(&mut out, table, case);
                drop(out);
                super::row_events::observe(&cache, table, case);
            },
        ))?;
        Ok(())
    }

    /// Forgets what was captured (before a request runs).
    pub(crate) fn clear(&self) {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// What was captured since [`Capture::clear`].
    pub(crate) fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn encode_change(out: &mut Vec<u8>, table: &str, case: &PreUpdateCase) {
    let name = table.as_bytes();
    let (op, old_rowid, new_rowid) = match case {
        PreUpdateCase::Insert(new) => (b'I', 0, new.get_new_row_id()),
        PreUpdateCase::Delete(old) => (b'D', old.get_old_row_id(), 0),
        PreUpdateCase::Update {
            old_value_accessor,
            new_value_accessor,
        } => (
            b'U',
            old_value_accessor.get_old_row_id(),
            new_value_accessor.get_new_row_id(),
        ),
        // Not produced by the SQLite built in; a replay would refuse the
        // record's unknown operation rather than skip a change.
        PreUpdateCase::Unknown => (b'?', 0, 0),
    };
    out.push(op);
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(&name[..name.len().min(255)]);
    out.extend_from_slice(&old_rowid.to_le_bytes());
    out.extend_from_slice(&new_rowid.to_le_bytes());
    match case {
        PreUpdateCase::Insert(new) => {
            let n = new.get_column_count();
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for i in 0..n {
                encode_value(out, new.get_new_column_value(i).ok());
            }
        }
        PreUpdateCase::Delete(old) => {
            let n = old.get_column_count();
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for i in 0..n {
                encode_value(out, old.get_old_column_value(i).ok());
            }
        }
        PreUpdateCase::Update {
            old_value_accessor: old,
            new_value_accessor: new,
        } => {
            let n = old.get_column_count();
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for i in 0..n {
                encode_value(out, old.get_old_column_value(i).ok());
            }
            for i in 0..n {
                encode_value(out, new.get_new_column_value(i).ok());
            }
        }
        PreUpdateCase::Unknown => out.extend_from_slice(&0u16.to_le_bytes()),
    }
}

/// A value: tag (0 NULL, 1 integer, 2 real, 3 text, 4 blob, 5 unreadable),
/// then 8 bytes or a u32 length and the bytes.
fn encode_value(out: &mut Vec<u8>, value: Option<ValueRef<'_>>) {
    match value {
        Some(ValueRef::Null) => out.push(0),
        Some(ValueRef::Integer(i)) => {
            out.push(1);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Some(ValueRef::Real(f)) => {
            out.push(2);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Some(ValueRef::Text(t)) => {
            out.push(3);
            out.extend_from_slice(&(t.len() as u32).to_le_bytes());
            out.extend_from_slice(t);
        }
        Some(ValueRef::Blob(b)) => {
            out.push(4);
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        None => out.push(5),
    }
}

/// A decoded value.
#[derive(Debug)]
enum Value {
    Null,
    Integer(i64),
    Real(f64),
    /// SQLite's TEXT bytes as stored (UTF-8 unchecked).
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput::Borrowed;
        Ok(match self {
            Value::Null => Borrowed(ValueRef::Null),
            Value::Integer(i) => Borrowed(ValueRef::Integer(*i)),
            Value::Real(f) => Borrowed(ValueRef::Real(*f)),
            Value::Text(t) => Borrowed(ValueRef::Text(t)),
            Value::Blob(b) => Borrowed(ValueRef::Blob(b)),
        })
    }
}

/// Reads a record's changes in order.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("a change is cut short".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> std::result::Result<i64, String> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(a))
    }

    fn value(&mut self) -> std::result::Result<Value, String> {
        Ok(match self.u8()? {
            0 => Value::Null,
            1 => Value::Integer(self.i64()?),
            2 => Value::Real(f64::from_bits(self.i64()? as u64)),
            3 => {
                let n = self.u32()? as usize;
                Value::Text(self.take(n)?.to_vec())
            }
            4 => {
                let n = self.u32()? as usize;
                Value::Blob(self.take(n)?.to_vec())
            }
            5 => return Err("a value SQLite could not read when it was logged".into()),
            t => return Err(format!("unknown value tag {t}")),
        })
    }

    fn values(&mut self, n: usize) -> std::result::Result<Vec<Value>, String> {
        (0..n).map(|_| self.value()).collect()
    }
}

/// The tables a replay met, read from the schema once per replay.
#[derive(Default)]
pub(crate) struct Tables(std::collections::HashMap<String, TableInfo>);

/// What a replay needs of a table: its columns, and how a row is found
/// (by rowid, or by the primary key's columns for a WITHOUT ROWID table).
struct TableInfo {
    columns: Vec<String>,
    /// Indexes of the primary key's columns (WITHOUT ROWID tables).
    pk: Vec<usize>,
    has_rowid: bool,
    /// The INTEGER PRIMARY KEY column (an alias of the rowid), if any.
    rowid_alias: Option<usize>,
}

fn table_info(conn: &Connection, table: &str) -> std::result::Result<TableInfo, String> {
    let mut stmt = conn
        .prepare("SELECT name, type, pk FROM pragma_table_info(?1) ORDER BY cid")
        .map_err(|e| e.to_string())?;
    let rows: Vec<(String, String, i64)> = stmt
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .and_then(|rows| rows.collect())
        .map_err(|e| e.to_string())?;
    if rows.is_empty() {
        return Err(format!("no table {table:?}"));
    }
    let has_rowid = conn
        .prepare(&format!(
            "SELECT rowid FROM \"{}\" LIMIT 0",
            table.replace('"', "\"\"")
        ))
        .is_ok();
    let mut pk: Vec<(i64, usize)> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.2 > 0)
        .map(|(i, r)| (r.2, i))
        .collect();
    pk.sort_unstable();
    let pk: Vec<usize> = pk.into_iter().map(|(_, i)| i).collect();
    let rowid_alias = match pk.as_slice() {
        [i] if has_rowid && rows[*i].1.eq_ignore_ascii_case("INTEGER") => Some(*i),
        _ => None,
    };
    Ok(TableInfo {
        columns: rows.into_iter().map(|r| r.0).collect(),
        pk,
        has_rowid,
        rowid_alias,
    })
}

/// The quoted columns a change writes and their new values: the logged
/// columns in `written`, then the rowid if the table has one.
fn new_values<'v>(
    t: &TableInfo,
    written: &[usize],
    new: &'v [Value],
    new_rowid: &'v Value,
) -> (Vec<String>, Vec<&'v dyn rusqlite::ToSql>) {
    let mut cols: Vec<String> = written.iter().map(|&i| quoted(&t.columns[i])).collect();
    let mut params: Vec<&dyn rusqlite::ToSql> = written
        .iter()
        .map(|&i| &new[i] as &dyn rusqlite::ToSql)
        .collect();
    if t.has_rowid {
        cols.push("rowid".into());
        params.push(new_rowid);
    }
    (cols, params)
}

/// ` WHERE ...` naming the row a logged change found: its old rowid, or
/// its old primary key's values.
fn key_clause<'v>(
    t: &TableInfo,
    table: &str,
    old: &'v [Value],
    old_rowid: &'v Value,
) -> std::result::Result<(String, Vec<&'v dyn rusqlite::ToSql>), String> {
    if t.has_rowid {
        return Ok((" WHERE rowid = ?".into(), vec![old_rowid]));
    }
    if t.pk.is_empty() || t.pk.iter().any(|&i| i >= old.len()) {
        return Err(format!("table {table} has no key a change can name"));
    }
    let clauses: Vec<String> =
        t.pk.iter()
            .map(|&i| format!("{} IS ?", quoted(&t.columns[i])))
            .collect();
    let params =
        t.pk.iter()
            .map(|&i| &old[i] as &dyn rusqlite::ToSql)
            .collect();
    Ok((format!(" WHERE {}", clauses.join(" AND ")), params))
}

/// Whether a change to `table` can be replayed (it has a rowid or a
/// primary key).
#[cfg(test)]
pub(crate) fn replayable(conn: &Connection, table: &str) -> bool {
    table_info(conn, table).is_ok_and(|t| t.has_rowid || !t.pk.is_empty())
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Applies one record's changes on `conn` (in a transaction, foreign keys
/// off). Each must change exactly one row: anything else means the log and
/// the database disagree.
pub(crate) fn apply(
    conn: &Connection,
    tables: &mut Tables,
    bytes: &[u8],
) -> std::result::Result<(), String> {
    let tables = &mut tables.0;
    let mut r = Reader { bytes };
    while !r.bytes.is_empty() {
        let op = r.u8()?;
        let name_len = r.u8()? as usize;
        let table = String::from_utf8(r.take(name_len)?.to_vec())
            .map_err(|_| "a table name that is not UTF-8")?;
        let old_rowid = r.i64()?;
        let new_rowid = r.i64()?;
        let n = r.u16()? as usize;
        if !tables.contains_key(&table) {
            let info = table_info(conn, &table)?;
            tables.insert(table.clone(), info);
        }
        let t = &tables[&table];
        if n > t.columns.len() {
            return Err(format!(
                "{n} columns logged for table {table}, which has {}",
                t.columns.len()
            ));
        }
        let (old, new) = match op {
            b'I' => (None, Some(r.values(n)?)),
            b'D' => (Some(r.values(n)?), None),
            b'U' => (Some(r.values(n)?), Some(r.values(n)?)),
            other => {
                return Err(format!(
                    "unknown change {:?} to table {table}",
                    other as char
                ))
            }
        };
        // Columns written: all logged ones but the rowid alias (the rowid
        // is bound by name).
        let written: Vec<usize> = (0..n).filter(|&i| Some(i) != t.rowid_alias).collect();
        let old_rowid = Value::Integer(old_rowid);
        let new_rowid = Value::Integer(new_rowid);
        let (sql, params): (String, Vec<&dyn rusqlite::ToSql>) = match (&old, &new) {
            (None, Some(new)) => {
                let (cols, params) = new_values(t, &written, new, &new_rowid);
                let sql = format!(
                    "INSERT INTO {} ({}) VALUES ({})",
                    quoted(&table),
                    cols.join(", "),
                    vec!["?"; cols.len()].join(", ")
                );
                (sql, params)
            }
            (Some(old), None) => {
                let (clause, params) = key_clause(t, &table, old, &old_rowid)?;
                (format!("DELETE FROM {}{clause}", quoted(&table)), params)
            }
            (Some(old), Some(new)) => {
                let (cols, mut params) = new_values(t, &written, new, &new_rowid);
                let sets: Vec<String> = cols.iter().map(|c| format!("{c} = ?")).collect();
                let (clause, key_params) = key_clause(t, &table, old, &old_rowid)?;
                params.extend(key_params);
                (
                    format!("UPDATE {} SET {}{clause}", quoted(&table), sets.join(", ")),
                    params,
                )
            }
            (None, None) => return Err(format!("a change to table {table} without a row")),
        };
        let changed = conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.execute(params.as_slice()))
            .map_err(|e| format!("{sql}: {e}"))?;
        if changed != 1 {
            return Err(format!("{sql} changed {changed} rows, not one"));
        }
    }
    Ok(())
}
