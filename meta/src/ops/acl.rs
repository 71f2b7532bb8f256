//! POSIX ACLs kept as the xattrs `system.posix_acl_access` and
//! `system.posix_acl_default`, with the kernel's rules that tie them to the
//! mode (`crate::acl`): each change here is in the transaction of the
//! xattr or mode change that causes it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use crate::sql::{params, Db, Stmt};

use super::{inode, xattr};
use crate::acl::{Acl, AclKind, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR};
use crate::error::{MetaError, Result};
use crate::limits::XATTR_COUNT_PER_INODE_MAX;
use crate::types::{Attr, FileKind, Timespec, XattrFlags, S_ISGID};

/// Sets an ACL xattr, as ext4 does through `posix_acl_update_mode`: an
/// access ACL sets the mode's owner, group (the mask if any) and other
/// bits, is stored as none when the mode says all of it, and clears
/// set-group-ID when `flags.acl_kill_sgid`; a default ACL only on a
/// directory (EACCES otherwise). Malformed bytes: EINVAL.
pub(crate) fn set<C: Db>(
    c: &C,
    ino: u64,
    kind: AclKind,
    value: &[u8],
    flags: XattrFlags,
) -> Result<()> {
    let acl = Acl::parse(value).map_err(|e| MetaError::invalid(ino, e.to_string()))?;
    let mut a = inode::attr(c, ino)?;
    if a.kind == FileKind::Symlink {
        return Err(MetaError::NotSupported {
            ino,
            reason: "a symlink has no ACL".into(),
        });
    }
    let name = name_of(kind);
    let exists = xattr::value_of(c, ino, name)?.is_some();
    if exists && flags.create {
        return Err(MetaError::Exists {
            ino,
            name: Some(OsString::from_vec(name.to_vec())),
        });
    }
    if !exists && flags.replace {
        return Err(xattr::no_xattr(ino, &OsString::from_vec(name.to_vec())));
    }
    match kind {
        AclKind::Default => {
            if a.kind != FileKind::Directory {
                return Err(MetaError::AccessDenied {
                    ino,
                    reason: "a default ACL is for directories only".into(),
                });
            }
            store(c, ino, name, &acl.to_bytes(), exists)?;
        }
        AclKind::Access => {
            let (mode, equivalent) = acl.equiv_mode(a.mode);
            a.mode = mode;
            if flags.acl_kill_sgid {
                a.mode &= !S_ISGID;
            }
            if equivalent {
                delete(c, ino, name)?;
            } else {
                store(c, ino, name, &acl.to_bytes(), exists)?;
            }
        }
    }
    a.ctime = Timespec::now();
    inode::save(c, &a)
}

/// chmod (`posix_acl_chmod`): the stored access ACL's owner, mask (else
/// owning group) and other entries follow `a.mode`, already set.
pub(crate) fn chmod<C: Db>(c: &C, a: &Attr) -> Result<()> {
    if a.kind == FileKind::Symlink {
        return Ok(());
    }
    let Some(bytes) = xattr::value_of(c, a.ino, ACL_ACCESS_XATTR)? else {
        return Ok(());
    };
    let mut acl = parse_stored(a.ino, ACL_ACCESS_XATTR, &bytes)?;
    acl.chmod(a.mode);
    store(c, a.ino, ACL_ACCESS_XATTR, &acl.to_bytes(), true)
}

/// What a new inode inherits from directory `parent` (`posix_acl_create`):
/// its default ACL, if it has one and `kind` is not a symlink.
pub(crate) fn inherited<C: Db>(c: &C, parent: u64, kind: FileKind) -> Result<Option<Acl>> {
    if kind == FileKind::Symlink {
        return Ok(None);
    }
    match xattr::value_of(c, parent, ACL_DEFAULT_XATTR)? {
        Some(bytes) => Ok(Some(parse_stored(parent, ACL_DEFAULT_XATTR, &bytes)?)),
        None => Ok(None),
    }
}

/// Gives the new inode `new` (inserted, its mode already from
/// [`Acl::create_masq`]) its ACLs: `access` unless the mode says it all,
/// and a directory the parent's `default` as its own default ACL.
pub(crate) fn give<C: Db>(c: &C, new: &Attr, default: &Acl, access: Option<&Acl>) -> Result<()> {
    if let Some(access) = access {
        store(c, new.ino, ACL_ACCESS_XATTR, &access.to_bytes(), false)?;
    }
    if new.kind == FileKind::Directory {
        store(c, new.ino, ACL_DEFAULT_XATTR, &default.to_bytes(), false)?;
    }
    Ok(())
}

/// ACL xattrs of the whole volume strictly after `(ino, name)`, ordered by
/// `(ino, name)`, at most `limit`: for `fsctl fsck`.
pub(crate) fn scan<C: Db>(
    c: &C,
    after: Option<(u64, OsString)>,
    limit: u32,
) -> Result<Vec<(u64, OsString, Vec<u8>)>> {
    let (after_ino, after_name) = match after {
        None => (0i64, Vec::new()),
        Some((ino, name)) => (i64::try_from(ino).unwrap_or(i64::MAX), name.into_vec()),
    };
    let mut stmt = c.prepare_cached(
        "SELECT ino, name, value FROM xattrs
         WHERE (ino, name) > (?1, ?2) AND name IN (?3, ?4)
         ORDER BY ino, name LIMIT ?5",
    )?;
    Ok(stmt.collect_rows(
        params![
            after_ino,
            after_name,
            ACL_ACCESS_XATTR,
            ACL_DEFAULT_XATTR,
            limit
        ],
        |r| Ok((r.get(0)?, OsString::from_vec(r.get(1)?), r.get(2)?)),
    )?)
}

fn name_of(kind: AclKind) -> &'static [u8] {
    match kind {
        AclKind::Access => ACL_ACCESS_XATTR,
        AclKind::Default => ACL_DEFAULT_XATTR,
    }
}

/// A stored ACL that does not parse is corruption (`fsctl fsck` names it).
fn parse_stored(ino: u64, name: &[u8], bytes: &[u8]) -> Result<Acl> {
    Acl::parse(bytes).map_err(|e| MetaError::Corrupt {
        what: format!("inode {ino}: {}: {e}", String::from_utf8_lossy(name)),
    })
}

fn store<C: Db>(c: &C, ino: u64, name: &[u8], value: &[u8], exists: bool) -> Result<()> {
    if !exists && xattr::count(c, ino)? >= XATTR_COUNT_PER_INODE_MAX {
        return Err(MetaError::NoSpace {
            ino,
            reason: format!("already {XATTR_COUNT_PER_INODE_MAX} extended attributes"),
        });
    }
    c.prepare_cached(
        "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (ino, name) DO UPDATE SET value = EXCLUDED.value",
    )?
    .execute(params![ino, name, value])?;
    Ok(())
}

fn delete<C: Db>(c: &C, ino: u64, name: &[u8]) -> Result<()> {
    c.prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
        .execute(params![ino, name])?;
    Ok(())
}
