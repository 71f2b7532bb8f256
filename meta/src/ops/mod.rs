//! The metadata operations, written once for both engines against the
//! statement layer in [`crate::sql`]: each function takes `c: &C` with
//! `C: Db` (one open transaction, or for the SQLite one-statement reads a
//! bare connection) and is monomorphised per engine, so SQLite calls stay
//! static. Where a statement or an algorithm differs between the dialects,
//! the function matches on `C::DIALECT` beside it.
//!
//! Transactions, retries, pools, schema and clocks are the engines' own
//! (`sqlite/mod.rs`, `postgres/mod.rs`, each an `Engine`); the one
//! `MetaStore` impl that runs these operations inside them is in
//! `engine.rs`.
//!
//! # Writing an operation module
//! - `use crate::sql::{params, Db, OptionalExtension, Stmt};` and write each
//!   function as `pub(crate) fn op<C: Db>(c: &C, ...) -> Result<T>`.
//! - Statements: `c.prepare_cached(SQL)?.execute(params![a, b])?`,
//!   `.query_row(params![a], |r| r.get(0))` (`.optional()` for "maybe no
//!   row"), `.collect_rows(params![..], |r| ..)?` into a `Vec`/`BTreeSet`
//!   (or `.extend_rows` into one you have). Placeholders `?1`, `?2`; every
//!   integer column is read and bound as the Rust type you name (`u64`,
//!   `i64`, `u32`, `i32`, `bool`, `String`, `Vec<u8>`, `FileKind`,
//!   `Option<_>` of those); a type missing from `sql::Param` /
//!   `sql::Column` is added there for both engines at once.
//! - Write the SQL once, in the common dialect: `INSERT ... ON CONFLICT DO
//!   NOTHING` / `DO UPDATE SET x = EXCLUDED.x` (not `INSERT OR IGNORE/REPLACE`),
//!   `CAST(x AS BIGINT)` (not `::`), an `INSERT ... SELECT ... WHERE true ON
//!   CONFLICT` (SQLite needs the `WHERE`), `RETURNING` on DELETE/UPDATE. If
//!   a statement or an algorithm must differ, `match C::DIALECT` right there
//!   with one arm per dialect (see `inode::insert`, `blockmap::replace_rows`).
//! - Engine-specific values go through `Db` methods (`now_ms`, the server's
//!   clock on PostgreSQL); tables go in each engine's schema (SQLite:
//!   `sqlite/schema.rs`, PostgreSQL: a numbered migration in
//!   `postgres/schema.rs`).
//! - Register the module below and call it once, from the generic
//!   `MetaStore` impl in `engine.rs`, inside `self.read`/`self.write`,
//!   always through a closure (`|c| locks::list(c)`: a bare generic `fn`
//!   item cannot take PostgreSQL's transaction of any lifetime).

pub(crate) mod acl;
pub(crate) mod blockmap;
pub(crate) mod inode;
pub(crate) mod locks;
pub(crate) mod namespace;
pub(crate) mod orphan;
pub(crate) mod quota;
pub(crate) mod readdir;
pub(crate) mod rename;
pub(crate) mod requests;
pub(crate) mod reserve;
pub(crate) mod scan;
pub(crate) mod sessions;
pub(crate) mod setattr;
pub(crate) mod xattr;
