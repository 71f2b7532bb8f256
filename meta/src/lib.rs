//! `baton-meta`: the metadata engine of a Baton volume.
//!
//! It stores everything about a POSIX file system except file contents:
//! inodes, directory entries, symlink targets, extended attributes, the
//! block map of each regular file (block index → object key and length) and
//! the volume record, in a transactional store. File contents live in object
//! storage; this crate only keeps object keys as strings.
//!
//! # Brief overview
//! - [`MetaStore`]: the engine-neutral trait the FUSE server (`fsclient`)
//!   calls from many worker threads; every mutation is one transaction.
//! - [`SqliteMeta`]: the embedded SQLite engine (WAL, `synchronous=NORMAL`
//!   plus an explicit [`MetaStore::sync`]),
//!   created by [`format`] (`fsctl format`) and opened by [`open`].
//! - [`PostgresMeta`]: the same operations on a PostgreSQL server, for
//!   volumes mounted by several hosts (`postgres://` URLs, TLS by
//!   `sslmode=`: [`postgres::tls`]).
//! - [`SessionInfo`], [`SessionRecord`]: mounts with heartbeats and the
//!   orphans they hold open.
//! - [`Quota`]: a directory's byte and inode limits and usage, counted in
//!   the transaction of every change it counts ([`MetaStore::set_quota`]).
//! - [`Attr`], [`CreateArgs`], [`SetAttr`], [`CommitBlocks`], ...: values in
//!   and out, in [`types`]. [`MetaError`] with [`MetaError::errno`].
//! - [`acl`]: POSIX ACLs in their xattr form, parsed and validated, and
//!   the kernel's rules that tie them to the mode (kept by `setxattr`,
//!   `setattr` and `create` in the same transaction).
//! - [`record::Recorded`]: the byte encoding of mutation results kept for
//!   exactly-once execution ([`MetaStore::completed_request`]).
//!
//! # Invariants
//! - Inode numbers are allocated monotonically and never reused; the root is
//!   [`ROOT_INO`] (1). [`Attr::mode`] holds permission bits only.
//! - An inode whose link count drops to 0 is not deleted: it is recorded as
//!   an orphan, held by every registered session (mount), because any of
//!   them may still have it open; it is reclaimed when the last hold is
//!   released ([`MetaStore::release_orphan`]) or by [`MetaStore::reclaim`].
//!   A session whose heartbeat is too old is deleted with its holds
//!   ([`MetaStore::expire_sessions`]).
//! - A directory's nlink is 2 + its subdirectories.
//! - Every block-map row lies within the file: `index * block_size + len <=
//!   size`.
//! - Object keys reported as released are referenced by no block-map row;
//!   callers delete those objects only after the call returned.
//! - [`MetaStore::commit_blocks`] is the durability point of a write.
//! - A committed mutation survives kill -9 of the process at any instant;
//!   it survives power loss after the next [`MetaStore::sync`].
//!
//! # Architecture invariant
//! This crate knows nothing of FUSE, generations or object storage.
//!
//! # Design choice
//! Callers hold a `dyn MetaStore` rather than a connection; engine-specific
//! code stays in [`sqlite`]- and [`postgres`]-private modules. The exactly-once record is written inside the
//! mutation's transaction (an optional [`RequestKey`] argument on each
//! mutating method), so a result is recorded if and only if its mutation
//! committed.
//!
//! # Example
//! ```
//! use std::ffi::OsStr;
//! use baton_meta::{CreateArgs, FileKind, MetaStore, VolumeConfig, ROOT_INO};
//!
//! # fn main() -> Result<(), baton_meta::MetaError> {
//! let dir = tempfile::tempdir().map_err(|source| baton_meta::MetaError::Io {
//!     path: "tempdir".into(),
//!     source,
//! })?;
//! let path = dir.path().join("meta.db");
//! let url = format!("sqlite://{}", path.display());
//! let config = VolumeConfig {
//!     name: "vol".into(),
//!     storage_url: "file:///tmp/objects".into(),
//!     block_size_bytes: 4 << 20,
//! };
//! let meta = baton_meta::format(&url, &config)?;
//! let file = meta.create(ROOT_INO, OsStr::new("a.txt"), &CreateArgs::new(FileKind::Regular, 0o644), None)?;
//! assert_eq!(meta.lookup(ROOT_INO, OsStr::new("a.txt"))?.ino, file.ino);
//! drop(meta);
//! let meta = baton_meta::open(&url)?;
//! assert_eq!(meta.volume().name, "vol");
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod acl;
mod answered;
mod engine;
mod error;
pub mod limits;
mod ops;
pub mod postgres;
mod quarantine;
pub mod record;
mod row_cache;
mod sql;
pub mod sqlite;
pub mod store;
pub mod tx_stats;
pub mod types;

pub use answered::{ANSWERED_QUEUE_MAX, ANSWERED_RECORD_KEEP};
pub use error::{MetaError, Result};
pub use postgres::PostgresMeta;
pub use record::Recorded;
pub use sqlite::SqliteMeta;
pub use store::{Location, MetaStore};
pub use tx_stats::{TxKind, TxKindStats, TxStats, TX_LATENCY_BOUNDS_US};
pub use types::*;

/// Metadata format version written by this build and the newest it opens.
/// Opening never changes a volume's version.
/// - 1: the tables of `sqlite/schema.rs` (and their PostgreSQL twins).
/// - 2: the same tables; a block's object key may be spelled in the
///   fanned layout (`baton_blocks::KeyLayout::Fanned`, see
///   [`FANNED_KEYS_FORMAT_VERSION`]), which a format-1 build cannot parse:
///   such a build refuses the volume at open instead of failing its reads.
/// - 3: the same tables; a small file's block may be inline, its bytes in
///   its block-map row (`blocks.inline_data`, see
///   [`INLINE_BLOCKS_FORMAT_VERSION`]), which a format-2 build would try
///   to read as an object.
pub const FORMAT_VERSION: u32 = 3;

/// The first format version whose volumes keep a small file's bytes in
/// its block-map row ([`BlockRef::inline`]). Older volumes get none, so
/// the builds that made them read every block.
pub const INLINE_BLOCKS_FORMAT_VERSION: u32 = 3;

/// The first format version whose volumes give new block objects fanned
/// keys. Volumes of an older version keep the per-inode layout, so that
/// the builds which made them still read every object.
pub const FANNED_KEYS_FORMAT_VERSION: u32 = 2;

/// Creates a new volume's metadata at `url_or_path` and opens it:
/// `postgres://user@host:port/db` (an empty database) or
/// `sqlite:///abs/path/meta.db` / a plain path. See [`SqliteMeta::format`]
/// and [`PostgresMeta::format`].
pub fn format(url_or_path: &str, config: &VolumeConfig) -> Result<Box<dyn MetaStore>> {
    if postgres::is_postgres_url(url_or_path) {
        return Ok(Box::new(PostgresMeta::format(url_or_path, config)?));
    }
    Ok(Box::new(SqliteMeta::format(url_or_path, config)?))
}

/// Opens an existing volume's metadata (a `postgres://` URL, a `sqlite://`
/// URL or a path). See [`SqliteMeta::open`] and [`PostgresMeta::open`].
pub fn open(url_or_path: &str) -> Result<Box<dyn MetaStore>> {
    if postgres::is_postgres_url(url_or_path) {
        return Ok(Box::new(PostgresMeta::open(url_or_path)?));
    }
    Ok(Box::new(SqliteMeta::open(url_or_path)?))
}

/// [`open`] for a generation that opens the volume beside the one serving
/// it: see [`SqliteMeta::open_beside_writer`] (PostgreSQL: [`open`]).
pub fn open_beside_writer(url_or_path: &str) -> Result<Box<dyn MetaStore>> {
    if postgres::is_postgres_url(url_or_path) {
        return Ok(Box::new(PostgresMeta::open(url_or_path)?));
    }
    Ok(Box::new(SqliteMeta::open_beside_writer(url_or_path)?))
}
