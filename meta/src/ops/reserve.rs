//! Space reserved by fallocate (mode 0 and KEEP_SIZE) over the holes of a
//! file: a `reservations` row per block index that has no block row,
//! `len` bytes from the block's start (as a block row's `len`), outside
//! the block map so that every reader of the map is unchanged (a reserved
//! block reads as the hole it is).
//!
//! What it counts: the volume's used bytes (`statfs`: block rows plus
//! reservations) and, through [`quota_bytes`], the quotas: a regular file
//! counts `max(size, reserved end)`, so a KEEP_SIZE reservation past the
//! end of the file counts up to its end, and a later write into it grows
//! the size without growing the usage (no EDQUOT).
//!
//! Released in the transaction of the change that ends it: a commit of a
//! block row at the index (the block counts instead), a punch, a
//! truncate below it, and the inode's deletion (ON DELETE CASCADE).
//!
//! Invariant: no index of a file has both a block row and a reservation
//! row (a commit deletes the reservation of every index it writes).

use crate::sql::{params, Db, Dialect, OptionalExtension, Stmt};

use super::{blockmap, inode, quota};
use crate::error::{MetaError, Result};
use crate::limits::{FILE_SIZE_BYTES_MAX, RESERVE_BLOCK_COUNT_MAX};
use crate::types::{Attr, FileKind, Timespec};

/// End (in bytes) of `ino`'s last reservation; 0 without one.
pub(crate) fn reserved_end<C: Db>(c: &C, ino: u64) -> Result<u64> {
    let end: Option<u64> = c
        .prepare_cached(
            "SELECT r.idx * v.block_size_bytes + r.len FROM reservations r, volume v
             WHERE r.ino = ?1 ORDER BY r.idx DESC LIMIT 1",
        )?
        .query_row(params![ino], |r| r.get(0))
        .optional()?;
    Ok(end.unwrap_or(0))
}

/// What quotas count for `a` (see the module docs).
pub(crate) fn quota_bytes<C: Db>(c: &C, a: &Attr) -> Result<u64> {
    Ok(match a.kind {
        FileKind::Directory => 0,
        FileKind::Regular => a.size.max(reserved_end(c, a.ino)?),
        _ => a.size,
    })
}

/// fallocate mode 0 (`grow`) or KEEP_SIZE over `offset..end`: reserves
/// every block of the range that has no block row and, with `grow`, sets
/// the size to `end` if that is larger (mtime and ctime then change). The
/// quotas counting the file grow by what it adds to [`quota_bytes`]
/// (EDQUOT past a limit, nothing applied). Idempotent: a repeat reserves
/// nothing new.
pub(crate) fn reserve<C: Db>(
    c: &C,
    ino: u64,
    offset: u64,
    end: u64,
    grow: bool,
    block_size: u32,
) -> Result<Attr> {
    let mut a = inode::attr(c, ino)?;
    blockmap::regular(&a)?;
    if end > FILE_SIZE_BYTES_MAX {
        return Err(MetaError::FileTooLarge {
            ino,
            size_bytes: end,
        });
    }
    let before = quota_bytes(c, &a)?;
    let bs = u64::from(block_size);
    if offset < end {
        let (first, last) = (offset / bs, (end - 1) / bs);
        if last - first >= RESERVE_BLOCK_COUNT_MAX {
            return Err(MetaError::FileTooLarge {
                ino,
                size_bytes: end,
            });
        }
        c.prepare_cached(
            "WITH RECURSIVE r(idx) AS (
                 SELECT CAST(?2 AS BIGINT)
                 UNION ALL SELECT idx + 1 FROM r WHERE idx < CAST(?3 AS BIGINT)
             )
             INSERT INTO reservations (ino, idx, len)
             SELECT ?1, r.idx,
                 CASE WHEN (r.idx + 1) * CAST(?4 AS BIGINT) > CAST(?5 AS BIGINT)
                      THEN CAST(?5 AS BIGINT) - r.idx * CAST(?4 AS BIGINT)
                      ELSE CAST(?4 AS BIGINT) END
             FROM r
             WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.ino = ?1 AND b.idx = r.idx)
             ON CONFLICT (ino, idx) DO UPDATE SET len =
                 CASE WHEN EXCLUDED.len > reservations.len THEN EXCLUDED.len
                      ELSE reservations.len END",
        )?
        .execute(params![ino, first, last, bs, end])?;
    }
    if grow && end > a.size {
        a.size = end;
        let now = Timespec::now();
        a.mtime = now;
        a.ctime = now;
        inode::save(c, &a)?;
    }
    let after = quota_bytes(c, &a)?;
    quota::add_bytes(c, ino, after as i64 - before as i64, true)?;
    Ok(a)
}

/// Releases the reservations of the whole blocks inside `offset..end`
/// (a punched hole); quotas follow what it takes off [`quota_bytes`].
pub(crate) fn release_range<C: Db>(
    c: &C,
    ino: u64,
    offset: u64,
    end: u64,
    block_size: u32,
) -> Result<()> {
    let a = inode::attr(c, ino)?;
    blockmap::regular(&a)?;
    let bs = u64::from(block_size);
    let (first, stop) = (offset.div_ceil(bs), end / bs);
    if first >= stop {
        return Ok(());
    }
    let before = quota_bytes(c, &a)?;
    c.prepare_cached("DELETE FROM reservations WHERE ino = ?1 AND idx >= ?2 AND idx < ?3")?
        .execute(params![ino, first, stop])?;
    let after = quota_bytes(c, &a)?;
    quota::add_bytes(c, ino, after as i64 - before as i64, false)
}

/// Blocks `indices` of `ino` got rows: their reservations end.
pub(crate) fn release_indices<C: Db>(c: &C, ino: u64, indices: &[u64]) -> Result<()> {
    if indices.is_empty() {
        return Ok(());
    }
    match C::DIALECT {
        // A statement costs no round trip: one per index.
        Dialect::Sqlite => {
            let mut stmt =
                c.prepare_cached("DELETE FROM reservations WHERE ino = ?1 AND idx = ?2")?;
            for &index in indices {
                stmt.execute(params![ino, index])?;
            }
        }
        // One statement (a round trip) whatever the number of indices.
        Dialect::Postgres => {
            let indices = indices
                .iter()
                .map(|&i| {
                    i64::try_from(i).map_err(|_| MetaError::FileTooLarge { ino, size_bytes: i })
                })
                .collect::<Result<Vec<i64>>>()?;
            c.prepare_cached("DELETE FROM reservations WHERE ino = ?1 AND idx = ANY(?2)")?
                .execute(params![ino, indices])?;
        }
    }
    Ok(())
}

/// The file is cut to `new_size`: reservations past it end (as a local
/// filesystem frees preallocated blocks past the new end), the one that
/// straddles it is clamped.
pub(crate) fn truncate<C: Db>(c: &C, ino: u64, new_size: u64, block_size: u32) -> Result<()> {
    let bs = u64::from(block_size);
    c.prepare_cached("DELETE FROM reservations WHERE ino = ?1 AND idx >= ?2")?
        .execute(params![ino, new_size.div_ceil(bs)])?;
    let within = new_size % bs;
    if within != 0 {
        c.prepare_cached(
            "UPDATE reservations SET len = ?3 WHERE ino = ?1 AND idx = ?2 AND len > ?3",
        )?
        .execute(params![ino, new_size / bs, within])?;
    }
    Ok(())
}

/// Bytes reserved in the whole volume.
pub(crate) fn volume_reserved_bytes<C: Db>(c: &C) -> Result<u64> {
    // CAST: PostgreSQL's SUM of BIGINT is NUMERIC.
    Ok(c.query_row(
        "SELECT CAST(COALESCE(SUM(len), 0) AS BIGINT) FROM reservations",
        params![],
        |r| r.get(0),
    )?)
}
