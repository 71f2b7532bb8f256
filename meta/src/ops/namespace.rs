//! Name operations: lookup, create (all kinds), tmpfile (O_TMPFILE), link,
//! unlink, rmdir and readlink. Rename lives in `rename.rs`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::sql::{params, Db, OptionalExtension, Stmt};

use super::inode::{self, check_name, is_dot};
use super::quota;
use crate::acl::Acl;
use crate::error::{MetaError, Result};
use crate::limits::{NLINK_MAX, SYMLINK_TARGET_LEN_MAX};
use crate::row_cache::Known;
use crate::types::{Attr, CreateArgs, FileKind, Timespec, Unlinked, MODE_PERMISSION_MASK, S_ISGID};

/// The common case of [`lookup`] in one statement: `Some` when `name` (not
/// `.` or `..`) is an entry of `parent`; `None` means "ask [`lookup`]",
/// which tells a missing entry from a bad parent or name.
pub(crate) fn lookup_entry<C: Db>(c: &C, parent: u64, name: &OsStr) -> Result<Option<Attr>> {
    let b = name.as_bytes();
    if is_dot(b) || b.is_empty() || b.len() > crate::limits::NAME_LEN_MAX {
        return Ok(None);
    }
    inode::find_entry_attr(c, parent, b)
}

/// [`lookup_entry`] with the inode's committed bytes.
pub(crate) fn lookup_entry_plus<C: Db>(
    c: &C,
    parent: u64,
    name: &OsStr,
    block_size: u32,
) -> Result<Option<(Attr, u64)>> {
    let b = name.as_bytes();
    if is_dot(b) || b.is_empty() || b.len() > crate::limits::NAME_LEN_MAX {
        return Ok(None);
    }
    inode::find_entry_attr_plus(c, parent, b, block_size)
}

/// [`lookup`] with the inode's committed bytes in ONE statement: the
/// entry, and the parent's kind to tell a missing entry from a bad parent,
/// read together. `None` for `.` and `..` ("ask [`lookup`]"). For an
/// engine where each statement is a round trip to a server: a miss costs
/// one, not five (`BEGIN`, the entry, the parent, `ROLLBACK` after the
/// one-statement try).
pub(crate) fn lookup_one_plus<C: Db>(
    c: &C,
    parent: u64,
    name: &OsStr,
    block_size: u32,
) -> Result<Option<(Attr, u64)>> {
    const SQL: &str = concat!(
        "SELECT p.kind, i.ino, ",
        inode::attr_columns!("i."),
        ", ",
        inode::committed_bytes_column!("?3"),
        " FROM inodes p LEFT JOIN dentries d ON d.parent = p.ino AND d.name = ?2
          LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?1"
    );
    let b = check_name(parent, name)?;
    if is_dot(b) {
        return Ok(None);
    }
    let found = c
        .prepare_cached(SQL)?
        .query_row(params![parent, b, block_size], |r| {
            let parent_kind: FileKind = r.get(0)?;
            let child: Option<u64> = r.get(1)?;
            Ok(match child {
                Some(_) => (parent_kind, Some((inode::row_attr_at(r, 2)?, r.get(17)?))),
                None => (parent_kind, None),
            })
        })
        .optional()?;
    match found {
        None => Err(MetaError::NotFound {
            ino: parent,
            name: None,
        }),
        Some((kind, _)) if kind != FileKind::Directory => Err(MetaError::NotDirectory {
            ino: parent,
            name: None,
        }),
        Some((_, None)) => Err(MetaError::NotFound {
            ino: parent,
            name: Some(name.to_owned()),
        }),
        Some((_, Some(found))) => Ok(Some(found)),
    }
}

/// Resolves `name` in directory `parent`; `.` and `..` included.
pub(crate) fn lookup<C: Db>(c: &C, parent: u64, name: &OsStr) -> Result<Attr> {
    let b = check_name(parent, name)?;
    let dir = inode::attr(c, parent)?;
    if dir.kind != FileKind::Directory {
        return Err(MetaError::NotDirectory {
            ino: parent,
            name: None,
        });
    }
    match b {
        b"." => return Ok(dir),
        b".." => return inode::attr(c, inode::dir_parent(c, parent)?),
        _ => {}
    }
    let entry = inode::find_entry(c, parent, b)?.ok_or_else(|| MetaError::NotFound {
        ino: parent,
        name: Some(name.to_owned()),
    })?;
    inode::attr(c, entry.ino)
}

/// Creates an inode of any kind and its entry `name` in `parent`.
pub(crate) fn create<C: Db>(
    c: &C,
    known: Known<'_>,
    parent: u64,
    name: &OsStr,
    args: &CreateArgs,
) -> Result<Attr> {
    let b = check_name(parent, name)?;
    let dir = inode::live_dir_of(inode::attr_known(c, known, parent)?)?;
    if is_dot(b) || (!known.entry_absent(parent, b) && inode::find_entry(c, parent, b)?.is_some()) {
        return Err(MetaError::Exists {
            ino: parent,
            name: Some(name.to_owned()),
        });
    }
    let target = check_target(parent, args)?;
    let now = Timespec::now();
    let default_acl = inherited_acl(c, known, parent, args)?;
    let (new, access_acl) = new_attr_with_acl(
        &dir,
        args,
        target.map_or(0, <[u8]>::len),
        now,
        default_acl.as_ref(),
    );
    let is_dir = args.kind == FileKind::Directory;
    let ino = inode::insert(c, &new, is_dir.then_some(parent))?;
    if let Some(default) = &default_acl {
        let new = Attr { ino, ..new };
        super::acl::give(c, &new, default, access_acl.as_ref())?;
    }
    inode::insert_entry(c, parent, b, ino)?;
    if let Some(t) = target {
        c.prepare_cached("INSERT INTO symlinks (ino, target) VALUES (?1, ?2)")?
            .execute(params![ino, t])?;
    }
    // Neither row changed since it was read or written above, except the
    // new inode's by an inherited ACL.
    inode::adjust_read_dir(c, dir, i64::from(is_dir), now)?;
    let attr = match default_acl {
        None => Attr { ino, ..new },
        Some(_) => inode::attr(c, ino)?,
    };
    quota::charge_new(c, parent, &attr)?;
    Ok(attr)
}

/// Creates a regular file without a name in directory `parent`
/// (O_TMPFILE): nlink 0, an orphan from birth that only `session` holds
/// (only the mount that made it can reach it, through its open handle),
/// charged to the quotas holding `parent` (as ext4 charges a tmpfile to
/// its directory's project) until a [`link`] moves it under its name's.
/// `linkable` (the open had no O_EXCL): [`link`] may give it a name, once.
/// The directory is not changed: no entry was added.
pub(crate) fn tmpfile<C: Db>(
    c: &C,
    parent: u64,
    args: &CreateArgs,
    session: u64,
    linkable: bool,
) -> Result<Attr> {
    if args.kind != FileKind::Regular || args.symlink_target.is_some() {
        return Err(MetaError::invalid(
            parent,
            "O_TMPFILE makes a regular file only",
        ));
    }
    let dir = inode::live_dir(c, parent)?;
    let now = Timespec::now();
    let default_acl = inherited_acl(c, Known::nothing(), parent, args)?;
    let (mut new, access_acl) = new_attr_with_acl(&dir, args, 0, now, default_acl.as_ref());
    new.nlink = 0;
    let ino = inode::insert(c, &new, linkable.then_some(parent))?;
    if let Some(default) = &default_acl {
        let new = Attr { ino, ..new };
        super::acl::give(c, &new, default, access_acl.as_ref())?;
    }
    inode::insert_orphan_row(c, ino, now)?;
    super::sessions::hold(c, session, ino)?;
    let attr = inode::attr(c, ino)?;
    quota::charge_new(c, parent, &attr)?;
    Ok(attr)
}

/// The symlink target bytes if `args` needs one; checks presence and length.
fn check_target(parent: u64, args: &CreateArgs) -> Result<Option<&[u8]>> {
    match (args.kind, &args.symlink_target) {
        (FileKind::Symlink, Some(t)) => {
            let t = t.as_bytes();
            if t.is_empty() || t.len() > SYMLINK_TARGET_LEN_MAX || t.contains(&0) {
                return Err(MetaError::invalid(
                    parent,
                    format!(
                        "symlink target of {} bytes: must be 1..={SYMLINK_TARGET_LEN_MAX} bytes without NUL",
                        t.len()
                    ),
                ));
            }
            Ok(Some(t))
        }
        (FileKind::Symlink, None) => Err(MetaError::invalid(parent, "symlink without a target")),
        (_, Some(_)) => Err(MetaError::invalid(
            parent,
            "a target given for a non-symlink",
        )),
        (_, None) => Ok(None),
    }
}

/// The parent's default ACL when the new inode inherits it
/// (`args.inherit_acl`: the mount enforces ACLs).
fn inherited_acl<C: Db>(
    c: &C,
    known: Known<'_>,
    parent: u64,
    args: &CreateArgs,
) -> Result<Option<Acl>> {
    if !args.inherit_acl || known.xattr_absent(parent, crate::acl::ACL_DEFAULT_XATTR) {
        return Ok(None);
    }
    super::acl::inherited(c, parent, args.kind)
}

/// [`new_attr`] under the kernel's `posix_acl_create`: with the parent's
/// `default` ACL, the umask is not applied; the create mode and a copy of
/// the ACL limit each other, and the copy is the new inode's access ACL
/// unless the mode says all of it (`None`). Without one, the umask applies.
fn new_attr_with_acl(
    dir: &Attr,
    args: &CreateArgs,
    target_len: usize,
    now: Timespec,
    default: Option<&Acl>,
) -> (Attr, Option<Acl>) {
    let Some(default) = default else {
        return (new_attr(dir, args, args.umask, target_len, now), None);
    };
    let mut new = new_attr(dir, args, 0, target_len, now);
    let mut access = default.clone();
    let (mode, equivalent) = access.create_masq(new.mode);
    new.mode = mode;
    (new, (!equivalent).then_some(access))
}

/// Attributes of a new inode created in `dir` (ino is assigned on insert).
fn new_attr(dir: &Attr, args: &CreateArgs, umask: u32, target_len: usize, now: Timespec) -> Attr {
    let mut mode = args.mode & !umask & MODE_PERMISSION_MASK;
    let mut gid = args.gid;
    if dir.mode & S_ISGID != 0 {
        gid = dir.gid;
        if args.kind == FileKind::Directory {
            mode |= S_ISGID;
        }
    }
    if args.kind == FileKind::Symlink {
        mode = 0o777;
    }
    let rdev = match args.kind {
        FileKind::CharDevice | FileKind::BlockDevice => args.rdev,
        _ => 0,
    };
    Attr {
        ino: 0,
        kind: args.kind,
        mode,
        nlink: if args.kind == FileKind::Directory {
            2
        } else {
            1
        },
        uid: args.uid,
        gid,
        rdev,
        size: target_len as u64,
        atime: now,
        mtime: now,
        ctime: now,
        generation: 1,
    }
}

/// Adds the name `new_name` in `new_parent` for the non-directory `ino`;
/// at nlink 0 only a linkable unnamed O_TMPFILE, whose first name takes it
/// off the orphan list (its holds go: it is an ordinary file now).
pub(crate) fn link<C: Db>(c: &C, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<Attr> {
    let b = check_name(new_parent, new_name)?;
    let mut a = inode::attr(c, ino)?;
    if a.kind == FileKind::Directory {
        return Err(MetaError::NotPermitted {
            ino,
            reason: "hard links to directories are not allowed".into(),
        });
    }
    // At nlink 0 only an unnamed O_TMPFILE may get a name (the kernel's
    // I_LINKABLE, kept across hosts and generations); a file that lost its
    // last name stays gone, as on a local filesystem.
    let first_name = a.nlink == 0;
    if first_name && inode::linkable_tmpfile_dir(c, &a)?.is_none() {
        return Err(MetaError::NotFound { ino, name: None });
    }
    inode::live_dir(c, new_parent)?;
    if is_dot(b) || inode::find_entry(c, new_parent, b)?.is_some() {
        return Err(MetaError::Exists {
            ino: new_parent,
            name: Some(new_name.to_owned()),
        });
    }
    if a.nlink >= NLINK_MAX {
        return Err(MetaError::TooManyLinks {
            ino,
            max: NLINK_MAX,
        });
    }
    let now = Timespec::now();
    inode::insert_entry(c, new_parent, b, ino)?;
    a.nlink += 1;
    a.ctime = now;
    inode::save(c, &a)?;
    if first_name {
        inode::clear_tmpfile_dir(c, ino)?;
        inode::remove_orphan(c, ino)?;
    }
    inode::adjust_dir(c, new_parent, 0, now)?;
    quota::resync(c, &a, true)?;
    Ok(a)
}

/// Removes the non-directory entry `name` from `parent`.
pub(crate) fn unlink<C: Db>(c: &C, parent: u64, name: &OsStr) -> Result<Unlinked> {
    let (entry, mut a) = existing(c, parent, name)?;
    if a.kind == FileKind::Directory {
        return Err(MetaError::IsDirectory {
            ino: parent,
            name: Some(name.to_owned()),
        });
    }
    let now = Timespec::now();
    inode::delete_entry(c, entry.cookie)?;
    drop_link(c, &mut a, now)?;
    inode::adjust_dir(c, parent, 0, now)?;
    if a.nlink > 0 {
        // Still named elsewhere: a quota that held only this name lets go.
        // At nlink 0 the orphan stays counted until reclaimed.
        quota::resync(c, &a, false)?;
    }
    Ok(Unlinked {
        ino: a.ino,
        nlink_after: a.nlink,
        kind: a.kind,
    })
}

/// Removes the empty directory entry `name` from `parent`.
pub(crate) fn rmdir<C: Db>(c: &C, parent: u64, name: &OsStr) -> Result<Unlinked> {
    let b = check_name(parent, name)?;
    if b == b"." {
        return Err(MetaError::invalid(parent, "cannot remove '.'"));
    }
    let (entry, mut a) = existing(c, parent, name)?;
    if a.kind != FileKind::Directory {
        return Err(MetaError::NotDirectory {
            ino: parent,
            name: Some(name.to_owned()),
        });
    }
    if inode::has_entries(c, a.ino)? {
        return Err(MetaError::NotEmpty {
            ino: parent,
            name: Some(name.to_owned()),
        });
    }
    let now = Timespec::now();
    inode::delete_entry(c, entry.cookie)?;
    remove_dir_inode(c, &mut a, now)?;
    inode::adjust_dir(c, parent, -1, now)?;
    Ok(Unlinked {
        ino: a.ino,
        nlink_after: 0,
        kind: a.kind,
    })
}

/// The entry `name` in the live directory `parent` and its inode.
/// `..` is refused with `NotEmpty` (its directory holds the caller's).
pub(crate) fn existing<C: Db>(c: &C, parent: u64, name: &OsStr) -> Result<(inode::Entry, Attr)> {
    let b = check_name(parent, name)?;
    inode::live_dir(c, parent)?;
    if b == b".." {
        return Err(MetaError::NotEmpty {
            ino: parent,
            name: Some(name.to_owned()),
        });
    }
    if b == b"." {
        return Err(MetaError::invalid(
            parent,
            "'.' cannot be removed or renamed",
        ));
    }
    let entry = inode::find_entry(c, parent, b)?.ok_or_else(|| MetaError::NotFound {
        ino: parent,
        name: Some(name.to_owned()),
    })?;
    Ok((entry, inode::attr(c, entry.ino)?))
}

/// Drops one link of a non-directory whose entry was removed; at nlink 0
/// it becomes an orphan.
pub(crate) fn drop_link<C: Db>(c: &C, a: &mut Attr, now: Timespec) -> Result<()> {
    a.nlink = a
        .nlink
        .checked_sub(1)
        .ok_or_else(|| MetaError::corrupt(format!("inode {} has an entry but nlink 0", a.ino)))?;
    a.ctime = now;
    inode::save(c, a)?;
    if a.nlink == 0 {
        inode::add_orphan(c, a.ino, now)?;
    }
    Ok(())
}

/// Marks a directory whose entry was removed as an orphan (nlink 0).
pub(crate) fn remove_dir_inode<C: Db>(c: &C, a: &mut Attr, now: Timespec) -> Result<()> {
    a.nlink = 0;
    a.ctime = now;
    inode::save(c, a)?;
    inode::add_orphan(c, a.ino, now)
}

/// Target of the symlink `ino`.
pub(crate) fn readlink<C: Db>(c: &C, ino: u64) -> Result<OsString> {
    let a = inode::attr(c, ino)?;
    if a.kind != FileKind::Symlink {
        return Err(MetaError::invalid(ino, "not a symlink"));
    }
    let target: Vec<u8> = c
        .prepare_cached("SELECT target FROM symlinks WHERE ino = ?1")?
        .query_row(params![ino], |r| r.get(0))
        .optional()?
        .ok_or_else(|| MetaError::corrupt(format!("symlink {ino} has no target row")))?;
    Ok(OsString::from_vec(target))
}
