//! The statement layer the metadata operations in [`crate::ops`] are
//! written against, once for both engines: [`Db`] (one connection or open
//! transaction: cached prepared statements, `query_row`, `execute`) and
//! [`Stmt`] (one prepared statement), implemented for SQLite's
//! `rusqlite::Connection` (`sql/sqlite.rs`) and for the PostgreSQL engine's
//! `postgres::db::Connection`.
//!
//! Parameters are `params![a, b]` (a slice of [`Param`]: the integer,
//! text, blob, bool, [`FileKind`] and `Option` types the operations bind);
//! columns are read with [`Row::get`] as any [`Column`] type. Placeholders
//! are written `?N` (the PostgreSQL layer rewrites them to `$N`). SQL text
//! is shared wherever both dialects accept it (the bundled SQLite is newer
//! than 3.35, so `ON CONFLICT`, upserts and `RETURNING` are common ground);
//! where a statement or an algorithm really differs, the operation matches
//! on [`Db::DIALECT`] beside it, which the compiler resolves per engine.

mod sqlite;

use rusqlite::types::{FromSql, ToSqlOutput};

use crate::postgres::db::{DbError, FromColumn, ToValue, Value};
use crate::types::FileKind;

/// The SQL dialect of an engine, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// An error of one statement, from either engine.
#[derive(Debug)]
pub(crate) enum SqlError {
    Sqlite(rusqlite::Error),
    Postgres(DbError),
}

/// The result of one statement or one column read.
pub(crate) type SqlResult<T> = std::result::Result<T, SqlError>;

impl From<rusqlite::Error> for SqlError {
    fn from(e: rusqlite::Error) -> Self {
        SqlError::Sqlite(e)
    }
}

impl From<DbError> for SqlError {
    fn from(e: DbError) -> Self {
        SqlError::Postgres(e)
    }
}

impl From<SqlError> for crate::error::MetaError {
    fn from(e: SqlError) -> Self {
        match e {
            SqlError::Sqlite(e) => e.into(),
            SqlError::Postgres(e) => e.into(),
        }
    }
}

/// One connection (or open transaction) of an engine.
pub(crate) trait Db {
    /// Which dialect the statements run in.
    const DIALECT: Dialect;

    /// A prepared statement borrowed from this connection.
    type Stmt<'c>: Stmt
    where
        Self: 'c;

    /// The prepared statement for `sql` from the connection's cache
    /// (prepared on first use).
    fn prepare_cached(&self, sql: &str) -> SqlResult<Self::Stmt<'_>>;

    /// The rowid the last INSERT on this connection allocated: SQLite only
    /// (there it is free, while `RETURNING` costs an ephemeral table per
    /// statement); PostgreSQL statements say `RETURNING` instead.
    fn last_insert_rowid(&self) -> SqlResult<i64>;

    /// Now, in ms since the epoch, by the engine's clock (this host's for
    /// SQLite, whose volumes one host serves; the server's for PostgreSQL,
    /// so that hosts' clocks need not agree).
    fn now_ms(&self) -> SqlResult<i64>;

    /// `prepare_cached(sql)?.query_row(params, f)`.
    fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn Param],
        f: impl FnOnce(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// One prepared statement.
pub(crate) trait Stmt {
    /// Runs it; returns the number of rows changed.
    fn execute(&mut self, params: &[&dyn Param]) -> SqlResult<usize>;

    /// The first row mapped by `f`; a "no rows" error (see
    /// [`OptionalExtension::optional`]) if there is none.
    fn query_row<T>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnOnce(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<T>;

    /// Every row mapped by `f`, appended to `out`; stops at the first
    /// error (`out` may then hold some rows).
    fn extend_rows<T, B: Extend<T>>(
        &mut self,
        params: &[&dyn Param],
        out: &mut B,
        f: impl FnMut(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<()>;

    /// Every row mapped by `f`, collected; stops at the first error.
    fn collect_rows<T, B: FromIterator<T>>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnMut(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<B>;
}

/// Appends the values of `rows` to `out` up to the first error, which it
/// returns.
pub(crate) fn extend_until_error<T, B: Extend<T>>(
    out: &mut B,
    rows: impl Iterator<Item = SqlResult<T>>,
) -> SqlResult<()> {
    let mut failed = None;
    out.extend(rows.map_while(|r| r.map_err(|e| failed = Some(e)).ok()));
    failed.map_or(Ok(()), Err)
}

/// One result row of either engine.
pub(crate) enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r ::postgres::Row),
}

impl Row<'_> {
    /// Column `idx` as `T`. Inlined: a row's reader reads it through the
    /// variant its engine just built, so the match folds away.
    #[inline(always)]
    pub(crate) fn get<I: ColumnIndex, T: Column>(&self, idx: I) -> SqlResult<T> {
        let idx = idx.index();
        match self {
            Row::Sqlite(r) => r.get(idx).map_err(SqlError::Sqlite),
            Row::Postgres(r) => T::from_column(r, idx).map_err(SqlError::Postgres),
        }
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

/// A column value either engine can read as `Self`.
pub(crate) trait Column: FromSql + FromColumn {}

impl<T: FromSql + FromColumn> Column for T {}

/// `.optional()` on a `query_row` result: `None` for "no rows".
pub(crate) trait OptionalExtension<T> {
    fn optional(self) -> SqlResult<Option<T>>;
}

impl<T> OptionalExtension<T> for SqlResult<T> {
    fn optional(self) -> SqlResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(SqlError::Sqlite(rusqlite::Error::QueryReturnedNoRows))
            | Err(SqlError::Postgres(DbError::NoRows)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A statement parameter either engine can bind.
pub(crate) trait Param {
    /// The value for SQLite (borrowed where it can be).
    fn to_sqlite(&self) -> rusqlite::Result<ToSqlOutput<'_>>;
    /// The value for PostgreSQL.
    fn to_postgres(&self) -> Value;
}

macro_rules! param_both {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn to_sqlite(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                rusqlite::ToSql::to_sql(self)
            }
            fn to_postgres(&self) -> Value {
                ToValue::to_value(self)
            }
        }
    )*};
}
param_both!(
    i64,
    i32,
    u64,
    u32,
    u16,
    u8,
    bool,
    str,
    String,
    [u8],
    Vec<u8>,
    FileKind
);

/// Arrays (`= ANY(?1)`, `unnest`) exist only in PostgreSQL statements.
macro_rules! param_postgres_only {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn to_sqlite(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Err(rusqlite::Error::ToSqlConversionFailure(
                    "an array parameter is only bound in PostgreSQL statements; use the SQLite variant of the statement".into(),
                ))
            }
            fn to_postgres(&self) -> Value {
                ToValue::to_value(self)
            }
        }
    )*};
}
param_postgres_only!(Vec<i64>, Vec<String>, Vec<Option<Vec<u8>>>);

impl<T: Param> Param for Option<T> {
    fn to_sqlite(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Some(v) => v.to_sqlite(),
            None => Ok(ToSqlOutput::Owned(rusqlite::types::Value::Null)),
        }
    }
    fn to_postgres(&self) -> Value {
        self.as_ref().map_or(Value::Null, Param::to_postgres)
    }
}

impl<T: Param + ?Sized> Param for &T {
    fn to_sqlite(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        (**self).to_sqlite()
    }
    fn to_postgres(&self) -> Value {
        (**self).to_postgres()
    }
}

/// `params![a, b, c]`: the parameters of one statement, for either engine.
macro_rules! params {
    ($($x:expr),* $(,)?) => {
        &[$(&$x as &dyn $crate::sql::Param),*] as &[&dyn $crate::sql::Param]
    };
}
pub(crate) use params;
