//! Orphans: inodes at nlink 0 kept until the FUSE layer has closed them,
//! then deleted by `reclaim` with everything hanging off them.

use std::collections::BTreeSet;

use crate::sql::{params, Db, Dialect, Stmt};

use super::{blockmap, inode, quota};
use crate::error::{MetaError, Result};
use crate::types::{ObjectRef, ROOT_INO};

/// Deletes orphan `ino` with its block map, xattrs and symlink target.
/// Returns the objects no block row references any more.
pub(crate) fn reclaim<C: Db>(c: &C, ino: u64) -> Result<Vec<ObjectRef>> {
    let a = inode::attr(c, ino)?;
    if ino == ROOT_INO {
        return Err(MetaError::NotPermitted {
            ino,
            reason: "the root directory cannot be reclaimed".into(),
        });
    }
    if a.nlink > 0 {
        return Err(MetaError::StillLinked {
            ino,
            nlink: a.nlink,
        });
    }
    let named: bool = c
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM dentries WHERE ino = ?1 OR parent = ?1)")?
        .query_row(params![ino], |r| r.get(0))?;
    if named {
        return Err(MetaError::corrupt(format!(
            "inode {ino} has nlink 0 but still appears in a directory entry"
        )));
    }
    let keys: BTreeSet<String> = match C::DIALECT {
        // SQLite builds a temporary b-tree for every `RETURNING`: a search
        // of the primary key costs less, and the block rows go with the
        // inode's.
        Dialect::Sqlite => c
            .prepare_cached("SELECT object_key FROM blocks WHERE ino = ?1")?
            .collect_rows(params![ino], |r| r.get(0))?,
        // One round trip.
        Dialect::Postgres => c
            .prepare_cached("DELETE FROM blocks WHERE ino = ?1 RETURNING object_key")?
            .collect_rows(params![ino], |r| r.get(0))?,
    };
    quota::uncharge_all(c, &a)?;
    // Every table keyed by an inode but `dentries` (checked empty above)
    // deletes its rows with the inode's (`ON DELETE CASCADE`): blocks,
    // xattrs, the symlink target, the orphan row, holds, charges, locks.
    // Deleting them first, one statement each, searched each table twice
    // (on PostgreSQL, a round trip each).
    let deleted = c
        .prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
        .execute(params![ino])?;
    if deleted != 1 {
        return Err(MetaError::corrupt(format!(
            "orphan {ino} vanished while it was reclaimed"
        )));
    }
    blockmap::unreferenced(c, keys)
}

/// All orphan inode numbers, ascending.
pub(crate) fn list<C: Db>(c: &C) -> Result<Vec<u64>> {
    let mut stmt = c.prepare_cached("SELECT ino FROM orphans ORDER BY ino")?;
    let v: Vec<u64> = stmt.collect_rows(params![], |r| r.get(0))?;
    Ok(v)
}
