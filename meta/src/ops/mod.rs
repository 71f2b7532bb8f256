//! The metadata operations, written once for both engines against the
//! statement layer in [`crate::sql`]: each function takes `c: &C` with
//! `C: Db` (one open transaction, or for the SQLite one-statement reads a
//! bare connection) and is monomorphised per engine, so SQLite calls stay
//! static. Where a statement or an algorithm differs between the dialects,
//! the function matches on `C::DIALECT` beside it.
//!
//! Transactions, retries, pools, schema and clocks are the engines' own
//! (`sqlite/mod.rs`, `postgres/mod.rs`).

pub(crate) mod blockmap;
pub(crate) mod inode;
pub(crate) mod namespace;
pub(crate) mod orphan;
pub(crate) mod readdir;
pub(crate) mod rename;
pub(crate) mod requests;
pub(crate) mod scan;
pub(crate) mod sessions;
pub(crate) mod setattr;
pub(crate) mod xattr;
