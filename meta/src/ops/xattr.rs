//! Extended attributes: set (with create/replace flags), get, list, remove.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::sql::{params, Db, OptionalExtension, Stmt};

use super::inode;
use crate::acl::AclKind;
use crate::error::{MetaError, Result};
use crate::limits::{XATTR_COUNT_PER_INODE_MAX, XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};
use crate::types::{Timespec, XattrFlags};

/// Sets `name` on `ino` to `value`; sets ctime.
pub(crate) fn set<C: Db>(
    c: &C,
    ino: u64,
    name: &OsStr,
    value: &[u8],
    flags: XattrFlags,
) -> Result<()> {
    let b = check_name(ino, name)?;
    if let Some(kind) = AclKind::of_name(b) {
        return super::acl::set(c, ino, kind, value, flags);
    }
    if value.len() > XATTR_VALUE_LEN_MAX {
        return Err(MetaError::XattrTooLarge {
            ino,
            what: "value",
            len_bytes: value.len(),
            max: XATTR_VALUE_LEN_MAX,
        });
    }
    if flags.create && flags.replace {
        return Err(MetaError::invalid(ino, "XATTR_CREATE with XATTR_REPLACE"));
    }
    let mut a = inode::attr(c, ino)?;
    let exists = value_of(c, ino, b)?.is_some();
    match (exists, flags.create, flags.replace) {
        (true, true, _) => {
            return Err(MetaError::Exists {
                ino,
                name: Some(name.to_owned()),
            })
        }
        (false, _, true) => return Err(no_xattr(ino, name)),
        (false, _, _) if count(c, ino)? >= XATTR_COUNT_PER_INODE_MAX => {
            return Err(MetaError::NoSpace {
                ino,
                reason: format!("already {XATTR_COUNT_PER_INODE_MAX} extended attributes"),
            })
        }
        _ => {}
    }
    c.prepare_cached(
        "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (ino, name) DO UPDATE SET value = EXCLUDED.value",
    )?
    .execute(params![ino, b, value])?;
    a.ctime = Timespec::now();
    inode::save(c, &a)
}

/// Value of `name` on `ino`.
pub(crate) fn get<C: Db>(c: &C, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
    let b = check_name(ino, name)?;
    // ONE statement (`Engine::read_one`): the inode, and its value if any.
    let value: Option<Vec<u8>> = c
        .prepare_cached(
            "SELECT x.value FROM inodes i LEFT JOIN xattrs x ON x.ino = i.ino AND x.name = ?2
             WHERE i.ino = ?1",
        )?
        .query_row(params![ino, b], |r| r.get(0))
        .optional()?
        .ok_or(MetaError::NotFound { ino, name: None })?;
    value.ok_or_else(|| no_xattr(ino, name))
}

/// Names on `ino`, sorted bytewise.
pub(crate) fn list<C: Db>(c: &C, ino: u64) -> Result<Vec<OsString>> {
    inode::attr(c, ino)?;
    let mut stmt = c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
    let names = stmt.collect_rows(params![ino], |r| Ok(OsString::from_vec(r.get(0)?)))?;
    Ok(names)
}

/// Removes `name` from `ino`; sets ctime. Removing an ACL that is not
/// there succeeds, as on ext4 (the mode is left as it is).
pub(crate) fn remove<C: Db>(c: &C, ino: u64, name: &OsStr) -> Result<()> {
    let b = check_name(ino, name)?;
    let mut a = inode::attr(c, ino)?;
    let n = c
        .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
        .execute(params![ino, b])?;
    if n == 0 && AclKind::of_name(b).is_none() {
        return Err(no_xattr(ino, name));
    }
    a.ctime = Timespec::now();
    inode::save(c, &a)
}

pub(super) fn value_of<C: Db>(c: &C, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![ino, name], |r| r.get(0))
            .optional()?,
    )
}

pub(super) fn count<C: Db>(c: &C, ino: u64) -> Result<u64> {
    Ok(
        c.prepare_cached("SELECT COUNT(*) FROM xattrs WHERE ino = ?1")?
            .query_row(params![ino], |r| r.get(0))?,
    )
}

pub(crate) fn no_xattr(ino: u64, name: &OsStr) -> MetaError {
    MetaError::NoXattr {
        ino,
        name: name.to_owned(),
    }
}

pub(crate) fn check_name(ino: u64, name: &OsStr) -> Result<&[u8]> {
    let b = name.as_bytes();
    if b.len() > XATTR_NAME_LEN_MAX {
        return Err(MetaError::XattrTooLarge {
            ino,
            what: "name",
            len_bytes: b.len(),
            max: XATTR_NAME_LEN_MAX,
        });
    }
    if b.is_empty() || b.contains(&0) {
        return Err(MetaError::invalid(
            ino,
            "xattr name is empty or contains NUL",
        ));
    }
    Ok(b)
}
