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

use super::inode;
use crate::error::Result;
use crate::limits::READDIR_ENTRIES_MAX;
use crate::types::{DirEntry, FileKind};

/// Cookie of `.`.
const DOT_COOKIE: u64 = 1;
/// Cookie of `..`; entry cookies are `dentries.cookie + DOTDOT_COOKIE`.
const DOTDOT_COOKIE: u64 = 2;

/// Up to `limit` (clamped to [`READDIR_ENTRIES_MAX`]) entries after `offset`.
/// A removed directory (nlink 0) lists as empty.
pub(crate) fn readdir<C: Db>(c: &C, ino: u64, offset: u64, limit: u32) -> Result<Vec<DirEntry>> {
    let dir = inode::attr(c, ino)?;
    if dir.kind != FileKind::Directory {
        return Err(crate::MetaError::NotDirectory { ino, name: None });
    }
    let limit = limit.min(READDIR_ENTRIES_MAX) as usize;
    let mut out = Vec::with_capacity(limit);
    if dir.nlink == 0 || limit == 0 {
        return Ok(out);
    }
    if offset < DOT_COOKIE {
        out.push(dot(ino, ".", DOT_COOKIE));
    }
    if offset < DOTDOT_COOKIE && out.len() < limit {
        out.push(dot(inode::dir_parent(c, ino)?, "..", DOTDOT_COOKIE));
    }
    let after = offset.saturating_sub(DOTDOT_COOKIE);
    let (Ok(after), Ok(left)) = (i64::try_from(after), i64::try_from(limit - out.len())) else {
        return Ok(out);
    };
    let mut stmt = c.prepare_cached(
        "SELECT d.cookie, d.name, d.ino, i.kind FROM dentries d JOIN inodes i ON i.ino = d.ino
         WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3",
    )?;
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

fn dot(ino: u64, name: &str, cookie: u64) -> DirEntry {
    DirEntry {
        ino,
        name: OsString::from(name),
        kind: FileKind::Directory,
        offset_next: cookie,
    }
}
