//! Space reserved by fallocate (mode 0, KEEP_SIZE and ZERO_RANGE) over the
//! holes of a file: a `reserved_ranges` row per run of reserved blocks,
//! (ino, first block index, end index, `last_len`): every block of the run
//! is reserved whole but the last, which is reserved `last_len` bytes from
//! its start (as a block row's `len`). Outside the block map, so that every
//! reader of the map is unchanged (a reserved block reads as the hole it
//! is). A row per run, not per block: a reservation of any length is a few
//! rows (one per hole between data blocks of the range), so `fallocate -l
//! 100G` costs what `-l 1M` does.
//!
//! What it counts: the volume's used bytes (`statfs`: block rows plus
//! reservations) and, through [`quota_bytes`], the quotas: a regular file
//! counts `max(size, reserved end)`, so a KEEP_SIZE reservation past the
//! end of the file counts up to its end, and a later write into it grows
//! the size without growing the usage (no EDQUOT).
//!
//! Released in the transaction of the change that ends it: a commit of a
//! block row at an index (the block counts instead), a share, a punch, a
//! truncate below it, and the inode's deletion (ON DELETE CASCADE). Each
//! takes a bounded number of statements (a read of the runs it overlaps,
//! then a delete and an insert of what changed; on PostgreSQL one round
//! trip each whatever the number of rows), none per block.
//!
//! Invariants: the runs of a file are disjoint, and no index of a file has
//! both a block row and a reservation (a commit ends the reservation of
//! every index it writes). A volume of a build from before the runs had a
//! `reservations` row per block: opening it converts them (SQLite's
//! additive schema step in `sqlite/schema.rs`, PostgreSQL migration 10).

use crate::sql::{params, Db, Dialect, OptionalExtension, Stmt};

use super::{blockmap, inode, quota};
use crate::error::{MetaError, Result};
use crate::limits::FILE_SIZE_BYTES_MAX;
use crate::types::{Attr, FileKind, Timespec};

/// One row of `reserved_ranges`: blocks `first..end`, all reserved whole
/// but the last, reserved `last_len` bytes (`1..=block size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: u64,
    end: u64,
    last_len: u64,
}

/// End (in bytes) of `ino`'s last reservation; 0 without one.
pub(crate) fn reserved_end<C: Db>(c: &C, ino: u64) -> Result<u64> {
    let end: Option<u64> = c
        .prepare_cached(
            "SELECT (r.end_idx - 1) * v.block_size_bytes + r.last_len
             FROM reserved_ranges r, volume v
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

/// fallocate mode 0 (`grow`), KEEP_SIZE or ZERO_RANGE over `offset..end`:
/// reserves every block of the range that has no block row and, with
/// `grow`, sets the size to `end` if that is larger (mtime and ctime then
/// change). The quotas counting the file grow by what it adds to
/// [`quota_bytes`] (EDQUOT past a limit, nothing applied). Idempotent: a
/// repeat reserves nothing new. Statements: one read of the block rows of
/// the range (the holes between them), one of the runs it touches, then a
/// delete and an insert of the runs that change.
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
        let (first, stop) = (offset / bs, end.div_ceil(bs));
        let last_len = end - (stop - 1) * bs;
        let mut holes = holes(c, ino, first, stop, bs)?;
        if let Some(h) = holes.last_mut().filter(|h| h.end == stop) {
            h.last_len = last_len;
        }
        // The runs the range overlaps or touches (merged with it).
        let old = runs_over(c, ino, first.saturating_sub(1), stop.saturating_add(1))?;
        let new = merge(old.iter().chain(&holes).copied().collect(), bs);
        replace(c, ino, &old, &new)?;
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

/// The runs of blocks in `first..stop` without a block row, each reserved
/// whole (`bs`), from the gaps between the rows: one statement, whose
/// cost is the block rows of the range, never its length.
fn holes<C: Db>(c: &C, ino: u64, first: u64, stop: u64, bs: u64) -> Result<Vec<Run>> {
    let gaps: Vec<(u64, u64)> = c
        .prepare_cached(
            "SELECT g.idx + 1, g.nxt FROM (
                 SELECT b.idx, LEAD(b.idx, 1, CAST(?3 AS BIGINT)) OVER (ORDER BY b.idx) AS nxt
                 FROM (
                     SELECT CAST(?2 AS BIGINT) - 1 AS idx
                     UNION ALL
                     SELECT idx FROM blocks
                     WHERE ino = ?1 AND idx >= CAST(?2 AS BIGINT) AND idx < CAST(?3 AS BIGINT)
                 ) AS b
             ) AS g
             WHERE g.nxt > g.idx + 1 ORDER BY g.idx",
        )?
        .collect_rows(params![ino, first, stop], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(gaps
        .into_iter()
        .map(|(first, end)| Run {
            first,
            end,
            last_len: bs,
        })
        .collect())
}

/// The runs of `ino` that overlap blocks `first..stop`, ascending. The
/// lower bound (the last run starting at or before `first`) keeps the
/// scan to those runs.
fn runs_over<C: Db>(c: &C, ino: u64, first: u64, stop: u64) -> Result<Vec<Run>> {
    Ok(c.prepare_cached(
        "SELECT idx, end_idx, last_len FROM reserved_ranges
         WHERE ino = ?1 AND idx < ?3 AND end_idx > ?2
           AND idx >= COALESCE((SELECT MAX(idx) FROM reserved_ranges
                                WHERE ino = ?1 AND idx <= ?2), ?2)
         ORDER BY idx",
    )?
    .collect_rows(params![ino, first, stop], |r| {
        Ok(Run {
            first: r.get(0)?,
            end: r.get(1)?,
            last_len: r.get(2)?,
        })
    })?)
}

/// The union of `runs` as disjoint runs, ascending: overlapping runs
/// become one (a block reserved by two keeps the larger length); touching
/// ones join when the first ends with a whole block.
fn merge(mut runs: Vec<Run>, bs: u64) -> Vec<Run> {
    runs.sort_by_key(|r| (r.first, r.end));
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(cur) if r.first < cur.end || (r.first == cur.end && cur.last_len == bs) => {
                if r.end > cur.end {
                    cur.end = r.end;
                    cur.last_len = r.last_len;
                } else if r.end == cur.end {
                    cur.last_len = cur.last_len.max(r.last_len);
                }
                // r.end < cur.end: r's last block is a whole one of cur.
            }
            _ => out.push(r),
        }
    }
    out
}

/// Ends the reservations of blocks `runs` (ascending, disjoint index
/// ranges): the runs they cut are read, then rewritten without them.
fn subtract<C: Db>(c: &C, ino: u64, cut: &[(u64, u64)], bs: u64) -> Result<()> {
    let (Some(lo), Some(hi)) = (cut.first(), cut.last()) else {
        return Ok(());
    };
    let over = runs_over(c, ino, lo.0, hi.1)?;
    let (mut old, mut new) = (Vec::new(), Vec::new());
    let mut k = 0;
    for run in over {
        // Cuts ending at or before this run cannot touch later runs.
        while k < cut.len() && cut[k].1 <= run.first {
            k += 1;
        }
        let mut cursor = run.first;
        let mut j = k;
        let mut changed = false;
        while j < cut.len() && cut[j].0 < run.end {
            let (a, b) = cut[j];
            if a > cursor {
                // Its last block is before `a`, so inside the run: whole.
                new.push(Run {
                    first: cursor,
                    end: a,
                    last_len: bs,
                });
            }
            cursor = cursor.max(b);
            changed = true;
            j += 1;
        }
        if !changed {
            continue;
        }
        if cursor < run.end {
            new.push(Run {
                first: cursor,
                ..run
            });
        }
        old.push(run);
    }
    replace(c, ino, &old, &new)
}

/// Replaces the runs `old` of `ino` by `new` (nothing when equal).
fn replace<C: Db>(c: &C, ino: u64, old: &[Run], new: &[Run]) -> Result<()> {
    if old == new {
        return Ok(());
    }
    let to_i64 =
        |v: u64| i64::try_from(v).map_err(|_| MetaError::FileTooLarge { ino, size_bytes: v });
    match C::DIALECT {
        // A statement costs no round trip: one per run.
        Dialect::Sqlite => {
            let mut delete =
                c.prepare_cached("DELETE FROM reserved_ranges WHERE ino = ?1 AND idx = ?2")?;
            for r in old {
                delete.execute(params![ino, r.first])?;
            }
            let mut insert = c.prepare_cached(
                "INSERT INTO reserved_ranges (ino, idx, end_idx, last_len)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for r in new {
                insert.execute(params![ino, r.first, r.end, r.last_len])?;
            }
        }
        // Two statements (round trips) whatever the number of runs.
        Dialect::Postgres => {
            let column = |f: fn(&Run) -> u64, runs: &[Run]| {
                runs.iter()
                    .map(|r| to_i64(f(r)))
                    .collect::<Result<Vec<i64>>>()
            };
            if !old.is_empty() {
                let firsts = column(|r| r.first, old)?;
                c.prepare_cached("DELETE FROM reserved_ranges WHERE ino = ?1 AND idx = ANY(?2)")?
                    .execute(params![ino, firsts])?;
            }
            if !new.is_empty() {
                let (firsts, ends, lens) = (
                    column(|r| r.first, new)?,
                    column(|r| r.end, new)?,
                    column(|r| r.last_len, new)?,
                );
                c.prepare_cached(
                    "INSERT INTO reserved_ranges (ino, idx, end_idx, last_len)
                     SELECT ?1, idx, end_idx, last_len
                     FROM unnest(?2::BIGINT[], ?3::BIGINT[], ?4::BIGINT[])
                         AS new(idx, end_idx, last_len)",
                )?
                .execute(params![ino, firsts, ends, lens])?;
            }
        }
    }
    Ok(())
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
    subtract(c, ino, &[(first, stop)], bs)?;
    let after = quota_bytes(c, &a)?;
    quota::add_bytes(c, ino, after as i64 - before as i64, false)
}

/// Blocks `first..stop` of `ino` got rows (a share): their reservations
/// end.
pub(crate) fn release_blocks<C: Db>(
    c: &C,
    ino: u64,
    first: u64,
    stop: u64,
    block_size: u32,
) -> Result<()> {
    if first >= stop {
        return Ok(());
    }
    subtract(c, ino, &[(first, stop)], u64::from(block_size))
}

/// Blocks `indices` of `ino` got rows or were punched (a commit): their
/// reservations end. The indices, in any order, are cut as runs of
/// consecutive ones.
pub(crate) fn release_indices<C: Db>(
    c: &C,
    ino: u64,
    indices: &[u64],
    block_size: u32,
) -> Result<()> {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut cut: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        match cut.last_mut() {
            Some(last) if last.1 == i => last.1 = i + 1,
            _ => cut.push((i, i + 1)),
        }
    }
    subtract(c, ino, &cut, u64::from(block_size))
}

/// The file is cut to `new_size`: reservations past it end (as a local
/// filesystem frees preallocated blocks past the new end), the one that
/// straddles it is clamped. Three statements whatever the runs.
pub(crate) fn truncate<C: Db>(c: &C, ino: u64, new_size: u64, block_size: u32) -> Result<()> {
    let bs = u64::from(block_size);
    let stop = new_size.div_ceil(bs);
    c.prepare_cached("DELETE FROM reserved_ranges WHERE ino = ?1 AND idx >= ?2")?
        .execute(params![ino, stop])?;
    // The run that reaches past the new end (at most one: the last).
    c.prepare_cached(
        "UPDATE reserved_ranges SET end_idx = ?2, last_len = ?3
         WHERE ino = ?1 AND end_idx > ?2
           AND idx = (SELECT MAX(idx) FROM reserved_ranges WHERE ino = ?1)",
    )?
    .execute(params![ino, stop, bs])?;
    let within = new_size % bs;
    if within != 0 {
        c.prepare_cached(
            "UPDATE reserved_ranges SET last_len = ?3
             WHERE ino = ?1 AND end_idx = ?2 AND last_len > ?3
               AND idx = (SELECT MAX(idx) FROM reserved_ranges WHERE ino = ?1)",
        )?
        .execute(params![ino, stop, within])?;
    }
    Ok(())
}

/// Bytes reserved in the whole volume (saturating; on SQLite exact up to
/// 2^53 bytes, summed as a double so that no sum overflows).
pub(crate) fn volume_reserved_bytes<C: Db>(c: &C) -> Result<u64> {
    let sql = match C::DIALECT {
        Dialect::Sqlite => {
            "SELECT CAST(MIN(TOTAL((r.end_idx - r.idx - 1) * v.block_size_bytes + r.last_len),
                             9.0e18) AS INTEGER)
             FROM reserved_ranges r, volume v"
        }
        // CAST: PostgreSQL's SUM of BIGINT is NUMERIC.
        Dialect::Postgres => {
            "SELECT CAST(LEAST(COALESCE(SUM((r.end_idx - r.idx - 1) * v.block_size_bytes
                                            + r.last_len), 0),
                               9000000000000000000) AS BIGINT)
             FROM reserved_ranges r, volume v"
        }
    };
    Ok(c.query_row(sql, params![], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::{merge, Run};

    fn run(first: u64, end: u64, last_len: u64) -> Run {
        Run {
            first,
            end,
            last_len,
        }
    }

    #[test]
    fn merge_joins_overlapping_and_whole_touching_runs_only() {
        let bs = 10;
        // Overlap: the later end wins; the same end keeps the larger length.
        assert_eq!(merge(vec![run(0, 5, 10), run(3, 8, 4)], bs), [run(0, 8, 4)]);
        assert_eq!(merge(vec![run(0, 5, 3), run(2, 5, 7)], bs), [run(0, 5, 7)]);
        assert_eq!(merge(vec![run(0, 9, 2), run(2, 5, 7)], bs), [run(0, 9, 2)]);
        // Touching: joined after a whole last block, not after a partial one.
        assert_eq!(merge(vec![run(4, 6, 1), run(0, 4, 10)], bs), [run(0, 6, 1)]);
        assert_eq!(
            merge(vec![run(0, 4, 9), run(4, 6, 10)], bs),
            [run(0, 4, 9), run(4, 6, 10)]
        );
    }
}
