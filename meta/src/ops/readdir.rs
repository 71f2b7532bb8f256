//! `readdir` with stable cookies.
//!
//! Cookie (the `offset` passed back by the kernel): 0 starts the listing,
//! 1 is `.`, 2 is `..`, and an entry's cookie is its `dentries.cookie` + 2.
//! `dentries.cookie` is an AUTOINCREMENT rowid, never reused, so a listing
//! continues correctly when entries before or after the position are added
//! or removed: removed entries simply stop appearing, new ones appear if
//! their cookie is past the position.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use crate::sql::{params, Db, Stmt};

use super::inode::{self, attr_columns, committed_bytes_column};
use crate::error::Result;
use crate::limits::READDIR_ENTRIES_MAX;
use crate::types::{DirEntry, DirEntryPlus, FileKind};

/// Cookie of `.`.
const DOT_COOKIE: u64 = 1;
/// Cookie of `..`; entry cookies are `dentries.cookie + DOTDOT_COOKIE`.
const DOTDOT_COOKIE: u64 = 2;

/// A batch of entries after a cookie (?2), in cookie order: a range scan
/// of the (parent, cookie) index, never a sort of the whole directory.
pub(crate) const READDIR_SQL: &str =
    "SELECT d.cookie, d.name, d.ino, i.kind FROM dentries d JOIN inodes i ON i.ino = d.ino
     WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3";

/// [`READDIR_SQL`] with the attributes and committed bytes (?4: the block
/// size).
pub(crate) const READDIR_PLUS_SQL: &str = concat!(
    "SELECT d.cookie, d.name, ",
    attr_columns!("i."),
    ", ",
    committed_bytes_column!("?4"),
    " FROM dentries d JOIN inodes i ON i.ino = d.ino
     WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3"
);

/// Up to `limit` (clamped to [`READDIR_ENTRIES_MAX`]) entries after `offset`.
/// A removed directory (nlink 0) lists as empty.
pub(crate) fn readdir<C: Db>(c: &C, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let Some((after, left)) = dots(c, ino, offset, limit, &mut out)? else {
        return Ok(out);
    };
    let mut stmt = c.prepare_cached(READDIR_SQL)?;
    stmt.extend_rows(params![ino, after, left], &mut out, |r| {
        Ok(DirEntry {
            offset_next: r.get::<_, u64>(0)? + DOTDOT_COOKIE,
            name: OsString::from_vec(r.get(1)?),
            ino: r.get(2)?,
            kind: r.get(3)?,
        })
    })?;
    Ok(out)
}

/// [`readdir`] with, for each entry but `.` and `..`, its inode's
/// attributes and committed bytes, in the same snapshot (READDIRPLUS
/// without a read per entry). `block_size`: the volume's.
pub(crate) fn readdir_plus<C: Db>(
    c: &C,
    ino: u64,
    offset: u64,
    limit: u32,
    block_size: u32,
) -> Result<Vec<DirEntryPlus>> {
    let mut entries = Vec::new();
    let after_dots = dots(c, ino, offset, limit, &mut entries)?;
    let mut out: Vec<DirEntryPlus> = entries
        .into_iter()
        .map(|entry| DirEntryPlus {
            entry,
            attr: None,
            committed_bytes: 0,
        })
        .collect();
    let Some((after, left)) = after_dots else {
        return Ok(out);
    };
    c.prepare_cached(READDIR_PLUS_SQL)?.extend_rows(
        params![ino, after, left, block_size],
        &mut out,
        |r| {
            let attr = inode::row_attr_at(r, 2)?;
            Ok(DirEntryPlus {
                entry: DirEntry {
                    offset_next: r.get::<_, u64>(0)? + DOTDOT_COOKIE,
                    name: OsString::from_vec(r.get(1)?),
                    ino: attr.ino,
                    kind: attr.kind,
                },
                committed_bytes: r.get(17)?,
                attr: Some(attr),
            })
        },
    )?;
    Ok(out)
}

/// Checks that `ino` is a directory and pushes `.` and `..` if `offset` is
/// before them. Returns the cookie after which, and how many, entries are
/// still wanted, or `None` when nothing more is.
fn dots<C: Db>(
    c: &C,
    ino: u64,
    offset: u64,
    limit: u32,
    out: &mut Vec<DirEntry>,
) -> Result<Option<(i64, i64)>> {
    let dir = inode::attr(c, ino)?;
    if dir.kind != FileKind::Directory {
        return Err(crate::MetaError::NotDirectory { ino, name: None });
    }
    let limit = limit.min(READDIR_ENTRIES_MAX) as usize;
    out.reserve(limit);
    if dir.nlink == 0 || limit == 0 {
        return Ok(None);
    }
    if offset < DOT_COOKIE {
        out.push(dot(ino, ".", DOT_COOKIE));
    }
    if offset < DOTDOT_COOKIE && out.len() < limit {
        out.push(dot(inode::dir_parent(c, ino)?, "..", DOTDOT_COOKIE));
    }
    let after = offset.saturating_sub(DOTDOT_COOKIE);
    match (i64::try_from(after), i64::try_from(limit - out.len())) {
        (Ok(after), Ok(left)) if left > 0 => Ok(Some((after, left))),
        _ => Ok(None),
    }
}

fn dot(ino: u64, name: &str, cookie: u64) -> DirEntry {
    DirEntry {
        ino,
        name: OsString::from(name),
        kind: FileKind::Directory,
        offset_next: cookie,
    }
}
