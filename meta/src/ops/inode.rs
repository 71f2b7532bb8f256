//! Inode rows: loading and saving [`Attr`], allocation, directory-entry
//! lookups and the name checks shared by the namespace operations.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::sql::{params, Db, Dialect, OptionalExtension, Row, SqlResult, Stmt};

use crate::error::{MetaError, Result};
use crate::limits::{NAME_LEN_MAX, NLINK_MAX};
use crate::row_cache::Known;
use crate::types::{Attr, FileKind, StatFs, Timespec};

/// The `inodes` columns [`row_attr`] reads, in its order, each prefixed by
/// a table alias (`attr_columns!("i.")`) or not (`attr_columns!("")`).
macro_rules! attr_columns {
    ($p:literal) => {
        concat!(
            $p,
            "ino, ",
            $p,
            "kind, ",
            $p,
            "mode, ",
            $p,
            "nlink, ",
            $p,
            "uid, ",
            $p,
            "gid, ",
            $p,
            "rdev, ",
            $p,
            "size, ",
            $p,
            "atime_sec, ",
            $p,
            "atime_nsec, ",
            $p,
            "mtime_sec, ",
            $p,
            "mtime_nsec, ",
            $p,
            "ctime_sec, ",
            $p,
            "ctime_nsec, ",
            $p,
            "generation"
        )
    };
}

pub(crate) use attr_columns;

/// The column expression of the committed bytes of inode `i` (the alias)
/// below its size, as `st_blocks` counts them (rows past a shrinking size
/// wait for GC), for a block size bound at placeholder `$bs`.
macro_rules! committed_bytes_column {
    ($bs:literal) => {
        concat!(
            "(SELECT CAST(COALESCE(SUM(b.len), 0) AS BIGINT) FROM blocks b
              WHERE b.ino = i.ino AND b.idx < (i.size + ",
            $bs,
            " - 1) / ",
            $bs,
            ")"
        )
    };
}

pub(crate) use committed_bytes_column;

fn row_attr(r: &Row<'_>) -> SqlResult<Attr> {
    row_attr_at(r, 0)
}

/// The [`Attr`] of `attr_columns!` selected from column `at` on.
pub(crate) fn row_attr_at(r: &Row<'_>, at: usize) -> SqlResult<Attr> {
    Ok(Attr {
        ino: r.get(at)?,
        kind: r.get(at + 1)?,
        mode: r.get(at + 2)?,
        nlink: r.get(at + 3)?,
        uid: r.get(at + 4)?,
        gid: r.get(at + 5)?,
        rdev: r.get(at + 6)?,
        size: r.get(at + 7)?,
        atime: Timespec {
            sec: r.get(at + 8)?,
            nsec: r.get(at + 9)?,
        },
        mtime: Timespec {
            sec: r.get(at + 10)?,
            nsec: r.get(at + 11)?,
        },
        ctime: Timespec {
            sec: r.get(at + 12)?,
            nsec: r.get(at + 13)?,
        },
        generation: r.get(at + 14)?,
    })
}

/// Attributes of `ino`, or `None` if no such inode.
pub(crate) fn try_attr<C: Db>(c: &C, ino: u64) -> Result<Option<Attr>> {
    const SQL: &str = concat!("SELECT ", attr_columns!(""), " FROM inodes WHERE ino = ?1");
    Ok(c.prepare_cached(SQL)?
        .query_row(params![ino], row_attr)
        .optional()?)
}

/// Attributes of `ino` and its committed bytes (see
/// [`committed_bytes_column`]), in ONE statement; `NotFound` if no such
/// inode.
pub(crate) fn attr_plus<C: Db>(c: &C, ino: u64, block_size: u32) -> Result<(Attr, u64)> {
    const SQL: &str = concat!(
        "SELECT ",
        attr_columns!("i."),
        ", ",
        committed_bytes_column!("?2"),
        " FROM inodes i WHERE i.ino = ?1"
    );
    c.prepare_cached(SQL)?
        .query_row(params![ino, block_size], |r| Ok((row_attr(r)?, r.get(15)?)))
        .optional()?
        .ok_or(MetaError::NotFound { ino, name: None })
}

/// Attributes of `ino`; [`MetaError::NotFound`] if no such inode.
pub(crate) fn attr<C: Db>(c: &C, ino: u64) -> Result<Attr> {
    try_attr(c, ino)?.ok_or(MetaError::NotFound { ino, name: None })
}

/// [`attr`], from memory if it knows them (a write before its first change).
pub(crate) fn attr_known<C: Db>(c: &C, known: Known<'_>, ino: u64) -> Result<Attr> {
    match known.attr(ino) {
        Some(a) => Ok(a),
        None => attr(c, ino),
    }
}

/// Attributes of a live directory (nlink > 0): `NotFound`, `NotDirectory`.
pub(crate) fn live_dir<C: Db>(c: &C, ino: u64) -> Result<Attr> {
    live_dir_of(attr(c, ino)?)
}

/// [`live_dir`] of attributes already read.
pub(crate) fn live_dir_of(a: Attr) -> Result<Attr> {
    let ino = a.ino;
    if a.kind != FileKind::Directory {
        return Err(MetaError::NotDirectory { ino, name: None });
    }
    if a.nlink == 0 {
        return Err(MetaError::NotFound { ino, name: None });
    }
    Ok(a)
}

/// Writes every mutable column of `a` back to its row.
pub(crate) fn save<C: Db>(c: &C, a: &Attr) -> Result<()> {
    let n = c
        .prepare_cached(
            "UPDATE inodes SET mode = ?2, nlink = ?3, uid = ?4, gid = ?5, rdev = ?6, size = ?7,
             atime_sec = ?8, atime_nsec = ?9, mtime_sec = ?10, mtime_nsec = ?11,
             ctime_sec = ?12, ctime_nsec = ?13 WHERE ino = ?1",
        )?
        .execute(params![
            a.ino,
            a.mode,
            a.nlink,
            a.uid,
            a.gid,
            a.rdev,
            a.size,
            a.atime.sec,
            a.atime.nsec,
            a.mtime.sec,
            a.mtime.nsec,
            a.ctime.sec,
            a.ctime.nsec
        ])?;
    // Invariant: callers save only inodes they loaded in this transaction.
    debug_assert_eq!(n, 1, "saved inode {} must exist", a.ino);
    Ok(())
}

/// Inserts a new inode with a fresh number (AUTOINCREMENT: never reused).
/// `a.ino` is ignored; returns the new number.
pub(crate) fn insert<C: Db>(c: &C, a: &Attr, dir_parent: Option<u64>) -> Result<u64> {
    macro_rules! insert {
        () => {
            "INSERT INTO inodes (generation, kind, mode, nlink, uid, gid, rdev, size,
                 atime_sec, atime_nsec, mtime_sec, mtime_nsec, ctime_sec, ctime_nsec, parent)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
        };
    }
    let values = params![
        a.generation,
        a.kind,
        a.mode,
        a.nlink,
        a.uid,
        a.gid,
        a.rdev,
        a.size,
        a.atime.sec,
        a.atime.nsec,
        a.mtime.sec,
        a.mtime.nsec,
        a.ctime.sec,
        a.ctime.nsec,
        dir_parent
    ];
    let ino = match C::DIALECT {
        // Not RETURNING: SQLite builds an ephemeral table for it, +18% of
        // the instructions of a whole create.
        Dialect::Sqlite => {
            c.prepare_cached(insert!())?.execute(values)?;
            c.last_insert_rowid()?
        }
        Dialect::Postgres => c
            .prepare_cached(concat!(insert!(), " RETURNING ino"))?
            .query_row(values, |r| r.get(0))?,
    };
    u64::try_from(ino).map_err(|_| MetaError::corrupt("negative inode number allocated"))
}

/// Adds `delta` to the link count of `ino` (a directory gaining or losing a
/// subdirectory), and sets its mtime and ctime to `now`.
pub(crate) fn adjust_dir<C: Db>(c: &C, ino: u64, delta: i64, now: Timespec) -> Result<()> {
    adjust_read_dir(c, attr(c, ino)?, delta, now)
}

/// [`adjust_dir`] of a directory whose row `a` this transaction read and
/// has not changed since (one statement fewer).
pub(crate) fn adjust_read_dir<C: Db>(c: &C, mut a: Attr, delta: i64, now: Timespec) -> Result<()> {
    let ino = a.ino;
    let nlink = i64::from(a.nlink) + delta;
    if nlink > i64::from(NLINK_MAX) {
        return Err(MetaError::TooManyLinks {
            ino,
            max: NLINK_MAX,
        });
    }
    a.nlink = u32::try_from(nlink)
        .ok()
        .filter(|n| *n >= 2)
        .ok_or_else(|| MetaError::corrupt(format!("directory {ino} link count below 2")))?;
    a.mtime = now;
    a.ctime = now;
    save(c, &a)
}

/// The directory whose entry names directory `ino` (root: itself).
pub(crate) fn dir_parent<C: Db>(c: &C, ino: u64) -> Result<u64> {
    let parent: Option<u64> = c
        .prepare_cached("SELECT parent FROM inodes WHERE ino = ?1")?
        .query_row(params![ino], |r| r.get(0))
        .optional()?
        .ok_or(MetaError::NotFound { ino, name: None })?;
    parent.ok_or_else(|| MetaError::corrupt(format!("directory {ino} has no parent")))
}

/// Records the directory holding directory `ino`'s entry.
pub(crate) fn set_dir_parent<C: Db>(c: &C, ino: u64, parent: u64) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET parent = ?2 WHERE ino = ?1")?
        .execute(params![ino, parent])?;
    Ok(())
}

/// A directory entry: its readdir cookie and the inode it names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) cookie: i64,
    pub(crate) ino: u64,
}

/// The entry `name` in `parent`, if any.
pub(crate) fn find_entry<C: Db>(c: &C, parent: u64, name: &[u8]) -> Result<Option<Entry>> {
    Ok(
        c.prepare_cached("SELECT cookie, ino FROM dentries WHERE parent = ?1 AND name = ?2")?
            .query_row(params![parent, name], |r| {
                Ok(Entry {
                    cookie: r.get(0)?,
                    ino: r.get(1)?,
                })
            })
            .optional()?,
    )
}

/// Attributes of the inode the entry `name` in `parent` names, in ONE
/// statement (so it needs no explicit transaction for a consistent answer).
/// `None` if there is no such entry (the caller finds out why).
pub(crate) fn find_entry_attr<C: Db>(c: &C, parent: u64, name: &[u8]) -> Result<Option<Attr>> {
    const SQL: &str = concat!(
        "SELECT ",
        attr_columns!(""),
        " FROM inodes WHERE ino = (SELECT ino FROM dentries WHERE parent = ?1 AND name = ?2)"
    );
    Ok(c.prepare_cached(SQL)?
        .query_row(params![parent, name], row_attr)
        .optional()?)
}

/// [`find_entry_attr`] with the inode's committed bytes (see
/// [`committed_bytes_column`]), in ONE statement.
pub(crate) fn find_entry_attr_plus<C: Db>(
    c: &C,
    parent: u64,
    name: &[u8],
    block_size: u32,
) -> Result<Option<(Attr, u64)>> {
    const SQL: &str = concat!(
        "SELECT ",
        attr_columns!("i."),
        ", ",
        committed_bytes_column!("?3"),
        " FROM inodes i WHERE i.ino = (SELECT ino FROM dentries WHERE parent = ?1 AND name = ?2)"
    );
    Ok(c.prepare_cached(SQL)?
        .query_row(params![parent, name, block_size], |r| {
            Ok((row_attr(r)?, r.get(15)?))
        })
        .optional()?)
}

/// Adds entry `name` in `parent` for `ino` with a fresh cookie.
pub(crate) fn insert_entry<C: Db>(c: &C, parent: u64, name: &[u8], ino: u64) -> Result<()> {
    c.prepare_cached("INSERT INTO dentries (parent, name, ino) VALUES (?1, ?2, ?3)")?
        .execute(params![parent, name, ino])?;
    Ok(())
}

/// Removes the entry with this cookie.
pub(crate) fn delete_entry<C: Db>(c: &C, cookie: i64) -> Result<()> {
    c.prepare_cached("DELETE FROM dentries WHERE cookie = ?1")?
        .execute(params![cookie])?;
    Ok(())
}

/// Whether directory `ino` has any entry.
pub(crate) fn has_entries<C: Db>(c: &C, ino: u64) -> Result<bool> {
    Ok(
        c.prepare_cached("SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = ?1)")?
            .query_row(params![ino], |r| r.get(0))?,
    )
}

/// Records `ino` (now at nlink 0) as an orphan awaiting reclaim, held by
/// every registered session until it says it has no handle on it.
pub(crate) fn add_orphan<C: Db>(c: &C, ino: u64, now: Timespec) -> Result<()> {
    insert_orphan_row(c, ino, now)?;
    super::sessions::hold_for_all(c, ino)?;
    Ok(())
}

/// Puts `ino` on the orphan list (no hold: the caller records those).
pub(crate) fn insert_orphan_row<C: Db>(c: &C, ino: u64, now: Timespec) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO orphans (ino, since_sec) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
    )?
    .execute(params![ino, now.sec])?;
    Ok(())
}

/// Takes orphan `ino` off the orphan list with every hold on it (it got
/// a name: an O_TMPFILE linked).
pub(crate) fn remove_orphan<C: Db>(c: &C, ino: u64) -> Result<()> {
    for sql in [
        "DELETE FROM orphan_holds WHERE ino = ?1",
        "DELETE FROM orphans WHERE ino = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![ino])?;
    }
    Ok(())
}

/// The directory an unnamed O_TMPFILE `ino` was made in, if it is one
/// that may still be given a name (the kernel's I_LINKABLE). Kept in the
/// `parent` column, which otherwise only directories use: set by
/// `namespace::tmpfile` (unless O_EXCL), cleared by its first link, so an
/// inode that once had a name never has it.
pub(crate) fn linkable_tmpfile_dir<C: Db>(c: &C, a: &Attr) -> Result<Option<u64>> {
    if a.kind != FileKind::Regular || a.nlink != 0 {
        return Ok(None);
    }
    let dir: Option<Option<u64>> = c
        .prepare_cached(
            "SELECT i.parent FROM inodes i JOIN orphans o ON o.ino = i.ino WHERE i.ino = ?1",
        )?
        .query_row(params![a.ino], |r| r.get(0))
        .optional()?;
    Ok(dir.flatten())
}

/// Forgets that regular file `ino` was an unnamed O_TMPFILE (see
/// [`linkable_tmpfile_dir`]).
pub(crate) fn clear_tmpfile_dir<C: Db>(c: &C, ino: u64) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET parent = NULL WHERE ino = ?1")?
        .execute(params![ino])?;
    Ok(())
}

/// Checks an entry name: non-empty, no `/` or NUL, at most
/// [`NAME_LEN_MAX`] bytes. Returns its bytes.
pub(crate) fn check_name(parent: u64, name: &OsStr) -> Result<&[u8]> {
    let b = name.as_bytes();
    if b.len() > NAME_LEN_MAX {
        return Err(MetaError::NameTooLong {
            parent,
            len_bytes: b.len(),
            max: NAME_LEN_MAX,
        });
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(MetaError::invalid(
            parent,
            format!("entry name {name:?} is empty or contains '/' or NUL"),
        ));
    }
    Ok(b)
}

/// Whether `name` is `.` or `..`.
pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Usage numbers of the whole volume.
pub(crate) fn statfs<C: Db>(c: &C, block_size_bytes: u32) -> Result<StatFs> {
    let inodes_used: u64 = c.query_row("SELECT COUNT(*) FROM inodes", params![], |r| r.get(0))?;
    // CAST: PostgreSQL's SUM of BIGINT is NUMERIC.
    let bytes_used: u64 = c.query_row(
        "SELECT CAST(COALESCE(SUM(len), 0) AS BIGINT) FROM blocks",
        params![],
        |r| r.get(0),
    )?;
    // Space fallocate reserved is used space (reserve.rs).
    let bytes_used = bytes_used.saturating_add(super::reserve::volume_reserved_bytes(c)?);
    Ok(StatFs {
        inodes_used,
        bytes_used,
        block_size_bytes,
    })
}
