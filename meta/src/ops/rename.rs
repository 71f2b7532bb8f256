//! `rename` with POSIX rules plus `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
//!
//! Order of checks: flags, names, both directories live, source exists,
//! same inode (no-op), exchange needs a target, no directory into its own
//! subtree (`InvalidArgument`), `noreplace`, type mismatch
//! (`NotDirectory`/`IsDirectory`), non-empty target directory (`NotEmpty`).
//! A moved directory's `..` changes: the old parent loses a link, the new
//! one gains one.

use std::ffi::OsStr;

use crate::sql::{params, Db, Stmt};

use super::inode::{self, check_name, Entry};
use super::namespace::{drop_link, existing, remove_dir_inode};
use super::quota;
use crate::error::{MetaError, Result};
use crate::limits::DIR_DEPTH_MAX;
use crate::types::{Attr, FileKind, RenameFlags, Renamed, Timespec, Unlinked, ROOT_INO};

/// Renames `from = (parent, name)` to `to = (new_parent, new_name)`.
pub(crate) fn rename<C: Db>(
    c: &C,
    from: (u64, &OsStr),
    to: (u64, &OsStr),
    flags: RenameFlags,
) -> Result<Renamed> {
    let ((parent, name), (new_parent, new_name)) = (from, to);
    if flags.noreplace && flags.exchange {
        return Err(MetaError::invalid(
            parent,
            "RENAME_NOREPLACE with RENAME_EXCHANGE",
        ));
    }
    let dst_bytes = check_name(new_parent, new_name)?;
    let (src_entry, src) = existing(c, parent, name)?;
    inode::live_dir(c, new_parent)?;
    if dst_bytes == b"." || dst_bytes == b".." {
        return Err(MetaError::invalid(
            new_parent,
            "cannot rename over '.' or '..'",
        ));
    }
    let dst_entry = inode::find_entry(c, new_parent, dst_bytes)?;
    if dst_entry.is_some_and(|d| d.ino == src.ino) {
        // POSIX: both names refer to the same inode, so nothing happens.
        return Ok(Renamed::default());
    }
    let now = Timespec::now();
    if flags.exchange {
        let dst_entry = dst_entry.ok_or_else(|| MetaError::NotFound {
            ino: new_parent,
            name: Some(new_name.to_owned()),
        })?;
        let sides = [
            (parent, src_entry, src),
            (new_parent, dst_entry, inode::attr(c, dst_entry.ino)?),
        ];
        exchange(c, sides, now)?;
        return Ok(Renamed::default());
    }
    if src.kind == FileKind::Directory && parent != new_parent {
        check_not_within(c, src.ino, new_parent)?;
    }
    let replaced = match dst_entry {
        Some(_) if flags.noreplace => {
            return Err(MetaError::Exists {
                ino: new_parent,
                name: Some(new_name.to_owned()),
            });
        }
        Some(d) => Some(replace_target(c, &src, d, (new_parent, new_name), now)?),
        None => None,
    };
    inode::delete_entry(c, src_entry.cookie)?;
    inode::insert_entry(c, new_parent, dst_bytes, src.ino)?;
    finish_move(c, src.clone(), parent, new_parent, now)?;
    if let Some(u) = replaced.filter(|u| u.nlink_after > 0) {
        quota::resync(c, &inode::attr(c, u.ino)?, false)?;
    }
    quota::after_move(c, &src, parent, new_parent)?;
    Ok(Renamed { replaced })
}

/// Removes the target entry `d` that `src` replaces, after the POSIX checks.
fn replace_target<C: Db>(
    c: &C,
    src: &Attr,
    d: Entry,
    (new_parent, new_name): (u64, &OsStr),
    now: Timespec,
) -> Result<Unlinked> {
    let mut dst = inode::attr(c, d.ino)?;
    let subject = || Some(new_name.to_owned());
    let src_dir = src.kind == FileKind::Directory;
    let dst_dir = dst.kind == FileKind::Directory;
    match (src_dir, dst_dir) {
        (true, false) => {
            return Err(MetaError::NotDirectory {
                ino: new_parent,
                name: subject(),
            })
        }
        (false, true) => {
            return Err(MetaError::IsDirectory {
                ino: new_parent,
                name: subject(),
            })
        }
        (true, true) if inode::has_entries(c, dst.ino)? => {
            return Err(MetaError::NotEmpty {
                ino: new_parent,
                name: subject(),
            })
        }
        _ => {}
    }
    inode::delete_entry(c, d.cookie)?;
    if dst_dir {
        remove_dir_inode(c, &mut dst, now)?;
        inode::adjust_dir(c, new_parent, -1, now)?;
    } else {
        drop_link(c, &mut dst, now)?;
    }
    Ok(Unlinked {
        ino: dst.ino,
        nlink_after: dst.nlink,
        kind: dst.kind,
    })
}

/// After the entry moved: `..` link counts, ctime of the inode, mtime/ctime
/// of both directories.
fn finish_move<C: Db>(
    c: &C,
    mut src: Attr,
    parent: u64,
    new_parent: u64,
    now: Timespec,
) -> Result<()> {
    src.ctime = now;
    inode::save(c, &src)?;
    let moved_dir = src.kind == FileKind::Directory && parent != new_parent;
    if moved_dir {
        inode::set_dir_parent(c, src.ino, new_parent)?;
    }
    let delta = i64::from(moved_dir);
    inode::adjust_dir(c, parent, -delta, now)?;
    inode::adjust_dir(c, new_parent, delta, now)
}

/// Swaps the inodes named by two entries (`RENAME_EXCHANGE`).
fn exchange<C: Db>(c: &C, sides: [(u64, Entry, Attr); 2], now: Timespec) -> Result<()> {
    let [(pa, ea, a), (pb, eb, b)] = sides;
    let a_dir = a.kind == FileKind::Directory;
    let b_dir = b.kind == FileKind::Directory;
    if pa != pb {
        if a_dir {
            check_not_within(c, a.ino, pb)?;
        }
        if b_dir {
            check_not_within(c, b.ino, pa)?;
        }
    }
    c.prepare_cached("UPDATE dentries SET ino = ?2 WHERE cookie = ?1")?
        .execute(params![ea.cookie, b.ino])?;
    c.prepare_cached("UPDATE dentries SET ino = ?2 WHERE cookie = ?1")?
        .execute(params![eb.cookie, a.ino])?;
    if pa != pb {
        if a_dir {
            inode::set_dir_parent(c, a.ino, pb)?;
        }
        if b_dir {
            inode::set_dir_parent(c, b.ino, pa)?;
        }
    }
    // pa loses a's subdirectory link and gains b's; pb the reverse.
    let delta = i64::from(b_dir) - i64::from(a_dir);
    let delta = if pa == pb { 0 } else { delta };
    inode::adjust_dir(c, pa, delta, now)?;
    inode::adjust_dir(c, pb, -delta, now)?;
    for mut x in [a.clone(), b.clone()] {
        x.ctime = now;
        inode::save(c, &x)?;
    }
    quota::after_move(c, &a, pa, pb)?;
    quota::after_move(c, &b, pb, pa)
}

/// `InvalidArgument` if directory `dir` is `start` or one of its ancestors,
/// i.e. if moving `dir` into `start` would detach a cycle. Parents that
/// form a cycle are `Corrupt`; a tree deeper than [`DIR_DEPTH_MAX`] is not
/// (a user can nest directories that deep, and corruption puts the whole
/// volume in quarantine: quarantine.rs), so it is `InvalidArgument`.
fn check_not_within<C: Db>(c: &C, dir: u64, start: u64) -> Result<()> {
    let mut cur = start;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..DIR_DEPTH_MAX {
        if cur == dir {
            return Err(MetaError::invalid(
                dir,
                format!("cannot move directory {dir} into its own subtree (directory {start})"),
            ));
        }
        if cur == ROOT_INO {
            return Ok(());
        }
        if !seen.insert(cur) {
            return Err(MetaError::corrupt(format!(
                "the parents of directory {start} form a cycle through directory {cur}"
            )));
        }
        cur = inode::dir_parent(c, cur)?;
    }
    Err(MetaError::invalid(
        start,
        format!(
            "directory {start} is deeper than {DIR_DEPTH_MAX} levels: Baton does not move directories that deep"
        ),
    ))
}
