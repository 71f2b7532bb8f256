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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sql::{params, OptionalExtension};

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER);
             INSERT INTO t VALUES (1, 10), (2, NULL), (3, 30);",
        )
        .unwrap();
        c
    }

    #[test]
    fn rows_are_collected_and_extended_in_order_with_nulls_as_none() {
        let c = db();
        let mut stmt =
            Db::prepare_cached(&c, "SELECT k, v FROM t WHERE k >= ?1 ORDER BY k").unwrap();
        let all: Vec<(u64, Option<i64>)> = stmt
            .collect_rows(params![1u64], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!(all, vec![(1, Some(10)), (2, None), (3, Some(30))]);
        let mut keys = vec![0u64];
        stmt.extend_rows(params![2u64], &mut keys, |r| r.get::<_, u64>(0))
            .unwrap();
        assert_eq!(keys, vec![0, 2, 3]);
    }

    #[test]
    fn a_failing_row_stops_the_collection_with_its_error() {
        let c = db();
        let mut stmt = Db::prepare_cached(&c, "SELECT v FROM t ORDER BY k").unwrap();
        let got: SqlResult<Vec<i64>> = stmt.collect_rows(params![], |r| r.get(0));
        assert!(matches!(
            got,
            Err(SqlError::Sqlite(rusqlite::Error::InvalidColumnType(..)))
        ));
    }

    #[test]
    fn no_row_is_none_and_none_binds_null() {
        let c = db();
        let missing = Db::query_row(&c, "SELECT v FROM t WHERE k = ?1", params![9i64], |r| {
            r.get::<_, Option<i64>>(0)
        });
        assert_eq!(missing.optional().unwrap(), None);
        let none: Option<u32> = None;
        let n = Stmt::execute(
            &mut Db::prepare_cached(&c, "UPDATE t SET v = ?2 WHERE k = ?1").unwrap(),
            params![1i64, none],
        )
        .unwrap();
        assert_eq!(n, 1);
        let v: Option<i64> =
            Db::query_row(&c, "SELECT v FROM t WHERE k = 1", params![], |r| r.get(0)).unwrap();
        assert_eq!(v, None);
    }

    #[test]
    fn an_array_parameter_is_refused_on_sqlite_with_the_way_out() {
        let c = db();
        let keys: Vec<i64> = vec![1, 2];
        let err = Db::query_row(&c, "SELECT ?1", params![keys], |r| r.get::<_, i64>(0))
            .err()
            .unwrap();
        let SqlError::Sqlite(e) = err else {
            panic!("expected a SQLite error, got {err:?}");
        };
        assert!(e.to_string().contains("SQLite variant"), "{e}");
    }
}
