//! Orphans: inodes at nlink 0 kept until the FUSE layer has closed them,
//! then deleted by `reclaim` with everything hanging off them.

use std::collections::BTreeSet;

use super::db::{params, Connection};

use super::{blockmap, inode};
use crate::error::{MetaError, Result};
use crate::types::{ObjectRef, ROOT_INO};

/// Deletes orphan `ino` with its block map, xattrs and symlink target.
/// Returns the objects no block row references any more.
pub(crate) fn reclaim(c: &Connection, ino: u64) -> Result<Vec<ObjectRef>> {
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
        .query_row([ino], |r| r.get(0))?;
    if named {
        return Err(MetaError::corrupt(format!(
            "inode {ino} has nlink 0 but still appears in a directory entry"
        )));
    }
    let mut stmt = c.prepare_cached("DELETE FROM blocks WHERE ino = ?1 RETURNING object_key")?;
    let keys = stmt
        .query_map([ino], |r| r.get(0))?
        .collect::<super::db::RowResult<BTreeSet<String>>>()?;
    for sql in [
        "DELETE FROM xattrs WHERE ino = ?1",
        "DELETE FROM symlinks WHERE ino = ?1",
        "DELETE FROM orphans WHERE ino = ?1",
        "DELETE FROM inodes WHERE ino = ?1",
    ] {
        c.prepare_cached(sql)?.execute([ino])?;
    }
    blockmap::unreferenced(c, keys)
}

/// All orphan inode numbers, ascending.
pub(crate) fn list(c: &Connection) -> Result<Vec<u64>> {
    let mut stmt = c.prepare_cached("SELECT ino FROM orphans ORDER BY ino")?;
    let v = stmt
        .query_map(params![], |r| r.get(0))?
        .collect::<super::db::RowResult<Vec<u64>>>()?;
    Ok(v)
}
