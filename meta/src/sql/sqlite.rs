//! [`Db`] and [`Stmt`] for SQLite: rusqlite's connection and its cached
//! statements, with parameters bound in place (no copy of the slice) and
//! rows read while they are stepped.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{CachedStatement, Connection, ToSql};

use super::{extend_until_error, Db, Dialect, Param, Row, SqlError, SqlResult, Stmt};
use crate::types::FileKind;

impl FromSql for FileKind {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let code = value.as_i64()?;
        FileKind::from_code(code).ok_or(FromSqlError::OutOfRange(code))
    }
}

impl ToSql for FileKind {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(i64::from(self.code())))
    }
}

/// One [`Param`] as a rusqlite parameter.
struct Bind<'p>(&'p dyn Param);

impl ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        self.0.to_sqlite()
    }
}

fn bind<'p>(params: &'p [&'p dyn Param]) -> impl rusqlite::Params + 'p {
    rusqlite::params_from_iter(params.iter().map(|p| Bind(*p)))
}

impl Db for Connection {
    const DIALECT: Dialect = Dialect::Sqlite;

    type Stmt<'c> = CachedStatement<'c>;

    fn prepare_cached(&self, sql: &str) -> SqlResult<CachedStatement<'_>> {
        Ok(Connection::prepare_cached(self, sql)?)
    }

    fn last_insert_rowid(&self) -> SqlResult<i64> {
        Ok(Connection::last_insert_rowid(self))
    }

    fn now_ms(&self) -> SqlResult<i64> {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }
}

impl Stmt for CachedStatement<'_> {
    fn execute(&mut self, params: &[&dyn Param]) -> SqlResult<usize> {
        Ok(rusqlite::Statement::execute(self, bind(params))?)
    }

    fn query_row<T>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnOnce(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<T> {
        let mut rows = rusqlite::Statement::query(self, bind(params))?;
        match rows.next()? {
            Some(row) => f(&Row::Sqlite(row)),
            None => Err(SqlError::Sqlite(rusqlite::Error::QueryReturnedNoRows)),
        }
    }

    fn extend_rows<T, B: Extend<T>>(
        &mut self,
        params: &[&dyn Param],
        out: &mut B,
        mut f: impl FnMut(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<()> {
        let mut rows = rusqlite::Statement::query(self, bind(params))?;
        extend_until_error(out, std::iter::from_fn(|| step(&mut rows, &mut f)))
    }

    fn collect_rows<T, B: FromIterator<T>>(
        &mut self,
        params: &[&dyn Param],
        mut f: impl FnMut(&Row<'_>) -> SqlResult<T>,
    ) -> SqlResult<B> {
        let mut rows = rusqlite::Statement::query(self, bind(params))?;
        std::iter::from_fn(|| step(&mut rows, &mut f)).collect()
    }
}

/// The next row mapped by `f`, `None` after the last.
fn step<T>(
    rows: &mut rusqlite::Rows<'_>,
    f: &mut impl FnMut(&Row<'_>) -> SqlResult<T>,
) -> Option<SqlResult<T>> {
    match rows.next() {
        Ok(Some(row)) => Some(f(&Row::Sqlite(row))),
        Ok(None) => None,
        Err(e) => Some(Err(SqlError::Sqlite(e))),
    }
}
