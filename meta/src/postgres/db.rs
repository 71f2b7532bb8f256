//! One PostgreSQL transaction as a statement layer: the [`crate::sql`]
//! implementation the shared operations (`crate::ops`) run on, and the
//! same calls with rusqlite's shape (`prepare_cached`, `query_row`,
//! `query_map`, `execute`, `params!`, `optional`) for this engine's own
//! schema and migration code.
//!
//! Placeholders are written `?N` and rewritten to `$N`; every integer
//! column is BIGINT and every integer parameter is sent as one (u64 values
//! above `i64::MAX` are refused, as rusqlite's `fallible_uint` does).
//! Prepared statements are cached per connection.

use std::cell::RefCell;
use std::collections::HashMap;

use ::postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use ::postgres::Statement;

use crate::sql::{extend_until_error, Dialect, Param, Row as SqlRow, SqlError, SqlResult};
use crate::types::FileKind;

/// Errors of one statement.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    /// The server or the connection failed.
    #[error(transparent)]
    Postgres(#[from] ::postgres::Error),
    /// `query_row` found no row.
    #[error("query returned no rows")]
    NoRows,
    /// A value does not fit the column or the Rust type.
    #[error("value out of range: {0}")]
    Range(String),
}

/// The result of reading a row.
pub(crate) type RowResult<T> = std::result::Result<T, DbError>;

impl From<DbError> for crate::error::MetaError {
    fn from(e: DbError) -> Self {
        let (code, message) = match &e {
            DbError::Postgres(pe) => (
                pe.code().map(|c| c.code().to_string()),
                pe.as_db_error()
                    .map_or_else(|| pe.to_string(), |d| d.message().to_string()),
            ),
            other => (None, other.to_string()),
        };
        crate::error::MetaError::Postgres {
            op: "",
            code,
            message,
        }
    }
}

/// A parameter value.
#[derive(Debug)]
pub(crate) enum Value {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
    Bool(bool),
    Ints(Vec<i64>),
    Texts(Vec<String>),
    /// A BYTEA[] whose elements may be NULL.
    OptionalBytes(Vec<Option<Vec<u8>>>),
    Null,
    /// A u64 that does not fit BIGINT: refused when sent.
    TooLarge(u64),
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) if *ty == Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
            Value::Int(v) => v.to_sql(ty, out),
            Value::Text(v) => v.to_sql(ty, out),
            Value::Bytes(v) => v.to_sql(ty, out),
            Value::Bool(v) => v.to_sql(ty, out),
            Value::Ints(v) => v.to_sql(ty, out),
            Value::Texts(v) => v.to_sql(ty, out),
            Value::OptionalBytes(v) => v.to_sql(ty, out),
            Value::Null => Ok(IsNull::Yes),
            Value::TooLarge(v) => Err(format!("{v} does not fit a BIGINT column").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Something that can be a parameter.
pub(crate) trait ToValue {
    fn to_value(&self) -> Value;
}

macro_rules! int_to_value {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
int_to_value!(i64, i32, u32, u16, u8);

impl ToValue for u64 {
    fn to_value(&self) -> Value {
        i64::try_from(*self).map_or(Value::TooLarge(*self), Value::Int)
    }
}
impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Bool(*self)
    }
}
impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}
impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Bytes(self.to_vec())
    }
}
impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Bytes(self.clone())
    }
}
impl ToValue for Vec<i64> {
    fn to_value(&self) -> Value {
        Value::Ints(self.clone())
    }
}
impl ToValue for Vec<String> {
    fn to_value(&self) -> Value {
        Value::Texts(self.clone())
    }
}
impl ToValue for Vec<Option<Vec<u8>>> {
    fn to_value(&self) -> Value {
        Value::OptionalBytes(self.clone())
    }
}
impl ToValue for FileKind {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(self.code()))
    }
}
impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}
impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

/// Statement parameters: `params![a, b]` or an array of one type.
pub(crate) trait Params {
    fn values(self) -> Vec<Value>;
}
impl Params for &[&dyn ToValue] {
    fn values(self) -> Vec<Value> {
        self.iter().map(|v| v.to_value()).collect()
    }
}
impl<T: ToValue, const N: usize> Params for [T; N] {
    fn values(self) -> Vec<Value> {
        self.iter().map(ToValue::to_value).collect()
    }
}

/// `params![a, b, c]`, as in rusqlite.
macro_rules! params {
    ($($x:expr),* $(,)?) => {
        &[$(&$x as &dyn $crate::postgres::db::ToValue),*] as &[&dyn $crate::postgres::db::ToValue]
    };
}
pub(crate) use params;

/// A column value readable as `Self`.
pub(crate) trait FromColumn: Sized {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self>;
}

fn int(row: &::postgres::Row, idx: usize) -> RowResult<Option<i64>> {
    Ok(row.try_get::<_, Option<i64>>(idx)?)
}

macro_rules! int_from_column {
    ($($t:ty),*) => {$(
        impl FromColumn for $t {
            fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
                let v = int(row, idx)?.ok_or_else(|| DbError::Range(format!("column {idx} is NULL")))?;
                <$t>::try_from(v).map_err(|_| DbError::Range(format!("column {idx}: {v}")))
            }
        }
        impl FromColumn for Option<$t> {
            fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
                int(row, idx)?
                    .map(|v| <$t>::try_from(v).map_err(|_| DbError::Range(format!("column {idx}: {v}"))))
                    .transpose()
            }
        }
    )*};
}
int_from_column!(i64, i32, u64, u32);

impl FromColumn for bool {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
        Ok(row.try_get(idx)?)
    }
}
impl FromColumn for String {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
        Ok(row.try_get(idx)?)
    }
}
impl FromColumn for Vec<u8> {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
        Ok(row.try_get(idx)?)
    }
}
impl FromColumn for Option<Vec<u8>> {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
        Ok(row.try_get(idx)?)
    }
}
impl FromColumn for FileKind {
    fn from_column(row: &::postgres::Row, idx: usize) -> RowResult<Self> {
        let code = i64::from_column(row, idx)?;
        FileKind::from_code(code).ok_or_else(|| DbError::Range(format!("file kind {code}")))
    }
}

/// A column index (only `usize`, so integer literals infer to it).
pub(crate) trait ColumnIndex {
    fn index(self) -> usize;
}
impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One result row.
pub(crate) struct Row<'r>(&'r ::postgres::Row);

impl Row<'_> {
    /// Column `idx` as `T`.
    pub(crate) fn get<I: ColumnIndex, T: FromColumn>(&self, idx: I) -> RowResult<T> {
        T::from_column(self.0, idx.index())
    }
}

/// `.optional()` on a `query_row` result, as in rusqlite.
pub(crate) trait OptionalExtension<T> {
    fn optional(self) -> RowResult<Option<T>>;
}
impl<T> OptionalExtension<T> for RowResult<T> {
    fn optional(self) -> RowResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Prepared statements of one client, by SQL text.
pub(crate) type StatementCache = HashMap<String, Statement>;

/// Where a [`Connection`]'s statements run.
enum Session<'t> {
    /// One open transaction: every write, and every read of several
    /// statements.
    Transaction(::postgres::Transaction<'t>),
    /// The client outside any transaction: each statement is its own
    /// snapshot, one round trip instead of three (`BEGIN`, the statement,
    /// `COMMIT`). Only for reads of one statement (`Engine::read_one`).
    OneStatement(&'t mut ::postgres::Client),
}

/// Each call on the transaction or on the client.
impl Session<'_> {
    fn batch_execute(&mut self, sql: &str) -> Result<(), ::postgres::Error> {
        match self {
            Session::Transaction(tx) => tx.batch_execute(sql),
            Session::OneStatement(client) => client.batch_execute(sql),
        }
    }

    fn prepare(&mut self, sql: &str) -> Result<Statement, ::postgres::Error> {
        match self {
            Session::Transaction(tx) => tx.prepare(sql),
            Session::OneStatement(client) => client.prepare(sql),
        }
    }

    fn query(
        &mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<::postgres::Row>, ::postgres::Error> {
        match self {
            Session::Transaction(tx) => tx.query(statement, params),
            Session::OneStatement(client) => client.query(statement, params),
        }
    }

    fn execute(
        &mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, ::postgres::Error> {
        match self {
            Session::Transaction(tx) => tx.execute(statement, params),
            Session::OneStatement(client) => client.execute(statement, params),
        }
    }
}

/// One open transaction, or one statement outside any, shared by the
/// operation code (`&Connection`).
pub(crate) struct Connection<'t> {
    session: RefCell<Session<'t>>,
    cache: RefCell<&'t mut StatementCache>,
}

impl<'t> Connection<'t> {
    pub(crate) fn new(tx: ::postgres::Transaction<'t>, cache: &'t mut StatementCache) -> Self {
        Connection {
            session: RefCell::new(Session::Transaction(tx)),
            cache: RefCell::new(cache),
        }
    }

    /// Statements on `client` outside any transaction (each its own
    /// snapshot): for a read of ONE statement.
    pub(crate) fn one_statement(
        client: &'t mut ::postgres::Client,
        cache: &'t mut StatementCache,
    ) -> Self {
        Connection {
            session: RefCell::new(Session::OneStatement(client)),
            cache: RefCell::new(cache),
        }
    }

    /// Commits the transaction (nothing to commit outside one).
    pub(crate) fn commit(self) -> RowResult<()> {
        match self.session.into_inner() {
            Session::Transaction(tx) => Ok(tx.commit()?),
            Session::OneStatement(_) => Ok(()),
        }
    }

    /// Runs statements without parameters (DDL, locks).
    pub(crate) fn batch_execute(&self, sql: &str) -> RowResult<()> {
        Ok(self.session.borrow_mut().batch_execute(sql)?)
    }

    /// A cached prepared statement for `sql` (`?N` placeholders).
    pub(crate) fn prepare_cached(&self, sql: &str) -> RowResult<Stmt<'_, 't>> {
        if let Some(statement) = self.cache.borrow().get(sql) {
            return Ok(Stmt {
                conn: self,
                statement: statement.clone(),
            });
        }
        let statement = self
            .session
            .borrow_mut()
            .prepare(&dollar_placeholders(sql))?;
        self.cache
            .borrow_mut()
            .insert(sql.to_string(), statement.clone());
        Ok(Stmt {
            conn: self,
            statement,
        })
    }

    /// `prepare_cached(sql)?.query_row(params, f)`.
    pub(crate) fn query_row<P: Params, T>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&Row<'_>) -> RowResult<T>,
    ) -> RowResult<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// `prepare_cached(sql)?.execute(params)`.
    pub(crate) fn execute<P: Params>(&self, sql: &str, params: P) -> RowResult<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn rows(&self, statement: &Statement, values: &[Value]) -> RowResult<Vec<::postgres::Row>> {
        let refs: Vec<&(dyn ToSql + Sync)> =
            values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        Ok(self.session.borrow_mut().query(statement, &refs)?)
    }
}

/// A prepared statement bound to its transaction.
pub(crate) struct Stmt<'c, 't> {
    conn: &'c Connection<'t>,
    statement: Statement,
}

impl Stmt<'_, '_> {
    /// The first row mapped by `f`; [`DbError::NoRows`] if there is none.
    pub(crate) fn query_row<P: Params, T>(
        &mut self,
        params: P,
        f: impl FnOnce(&Row<'_>) -> RowResult<T>,
    ) -> RowResult<T> {
        let rows = self.conn.rows(&self.statement, &params.values())?;
        rows.first().map_or(Err(DbError::NoRows), |r| f(&Row(r)))
    }

    /// Every row mapped by `f`.
    pub(crate) fn query_map<P: Params, T>(
        &mut self,
        params: P,
        mut f: impl FnMut(&Row<'_>) -> RowResult<T>,
    ) -> RowResult<std::vec::IntoIter<RowResult<T>>> {
        let rows = self.conn.rows(&self.statement, &params.values())?;
        Ok(rows
            .iter()
            .map(|r| f(&Row(r)))
            .collect::<Vec<_>>()
            .into_iter())
    }

    /// Runs the statement; returns the number of rows changed.
    pub(crate) fn execute<P: Params>(&mut self, params: P) -> RowResult<usize> {
        self.execute_values(&params.values())
    }

    fn execute_values(&mut self, values: &[Value]) -> RowResult<usize> {
        let refs: Vec<&(dyn ToSql + Sync)> =
            values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        let n = self
            .conn
            .session
            .borrow_mut()
            .execute(&self.statement, &refs)?;
        usize::try_from(n).map_err(|_| DbError::Range(format!("{n} rows")))
    }
}

/// The shared operations ([`crate::ops`]) on one PostgreSQL transaction.
impl<'t> crate::sql::Db for Connection<'t> {
    const DIALECT: Dialect = Dialect::Postgres;

    type Stmt<'c>
        = Stmt<'c, 't>
    where
        Self: 'c;

    fn prepare_cached(&self, sql: &str) -> SqlResult<Stmt<'_, 't>> {
        Ok(Connection::prepare_cached(self, sql)?)
    }

    fn last_insert_rowid(&self) -> SqlResult<i64> {
        Err(SqlError::Postgres(DbError::Range(
            "last_insert_rowid is SQLite's; a PostgreSQL INSERT says RETURNING".into(),
        )))
    }

    fn now_ms(&self) -> SqlResult<i64> {
        Ok(Connection::query_row(
            self,
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
            params![],
            |r| r.get(0),
        )?)
    }
}

fn values(params: &[&dyn Param]) -> Vec<Value> {
    params.iter().map(|p| p.to_postgres()).collect()
}

impl crate::sql::Stmt for Stmt<'_, '_> {
    fn execute(&mut self, params: &[&dyn Param]) -> SqlResult<usize> {
        Ok(self.execute_values(&values(params))?)
    }

    fn query_row<T>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnOnce(&SqlRow<'_>) -> SqlResult<T>,
    ) -> SqlResult<T> {
        let rows = self.conn.rows(&self.statement, &values(params))?;
        rows.first()
            .map_or(Err(SqlError::Postgres(DbError::NoRows)), |r| {
                f(&SqlRow::Postgres(r))
            })
    }

    fn extend_rows<T, B: Extend<T>>(
        &mut self,
        params: &[&dyn Param],
        out: &mut B,
        mut f: impl FnMut(&SqlRow<'_>) -> SqlResult<T>,
    ) -> SqlResult<()> {
        let rows = self.conn.rows(&self.statement, &values(params))?;
        extend_until_error(out, rows.iter().map(|r| f(&SqlRow::Postgres(r))))
    }

    fn collect_rows<T, B: FromIterator<T>>(
        &mut self,
        params: &[&dyn Param],
        mut f: impl FnMut(&SqlRow<'_>) -> SqlResult<T>,
    ) -> SqlResult<B> {
        let rows = self.conn.rows(&self.statement, &values(params))?;
        rows.iter().map(|r| f(&SqlRow::Postgres(r))).collect()
    }
}

/// `?1` → `$1` outside string literals. Pure.
pub(crate) fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_literal = false;
    for ch in sql.chars() {
        match ch {
            '\'' => {
                in_literal = !in_literal;
                out.push(ch);
            }
            '?' if !in_literal => out.push('$'),
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_literals() {
        assert_eq!(
            dollar_placeholders("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND d > ?10"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND d > $10"
        );
    }
}
