//! The block map of regular files: reading ranges, committing writes,
//! truncating, and finding which replaced objects are no longer referenced.
//!
//! Invariant kept by every mutation: each row lies within the file, i.e.
//! `idx * block_size + len <= size`, and `1 <= len <= block_size`.

use std::collections::BTreeSet;

use crate::sql::{params, Db, Dialect, OptionalExtension, Stmt};

use super::{inode, quota, reserve};
use crate::error::{MetaError, Result};
use crate::limits::{
    BLOCKS_QUERY_COUNT_MAX, COMMIT_BLOCKS_ROWS_MAX, FILE_SIZE_BYTES_MAX, INLINE_STORED_BYTES_MAX,
};
use crate::row_cache::Known;
use crate::types::{
    is_inline_key, Attr, BlockRef, CommitBlocks, FileKind, ObjectRef, ShareBlocks, Timespec,
};

/// Rows of `ino` in `[first_index, first_index + count)`, ascending.
pub(crate) fn blocks<C: Db>(
    c: &C,
    ino: u64,
    first_index: u64,
    count: u32,
) -> Result<Vec<BlockRef>> {
    regular(&inode::attr(c, ino)?)?;
    rows(c, ino, first_index, count)
}

/// [`blocks`] without the check that `ino` is a regular file (rows of
/// anything else: none).
pub(crate) fn rows<C: Db>(c: &C, ino: u64, first_index: u64, count: u32) -> Result<Vec<BlockRef>> {
    let count = u64::from(count.min(BLOCKS_QUERY_COUNT_MAX));
    let Ok(first) = i64::try_from(first_index) else {
        return Ok(Vec::new());
    };
    let end = i64::try_from(first_index.saturating_add(count)).unwrap_or(i64::MAX);
    let mut stmt = c.prepare_cached(
        "SELECT idx, object_key, len, inline_data FROM blocks
         WHERE ino = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
    )?;
    Ok(stmt.collect_rows(params![ino, first, end], |r| {
        Ok(BlockRef {
            index: r.get(0)?,
            object_key: r.get(1)?,
            len: r.get(2)?,
            inline: r.get(3)?,
        })
    })?)
}

/// `Ok` for a regular file; `IsDirectory` or `InvalidArgument` otherwise.
pub(crate) fn regular(a: &Attr) -> Result<()> {
    match a.kind {
        FileKind::Regular => Ok(()),
        FileKind::Directory => Err(MetaError::IsDirectory {
            ino: a.ino,
            name: None,
        }),
        _ => Err(MetaError::invalid(a.ino, "not a regular file")),
    }
}

/// Applies one write: truncate (if `new_size` shrinks), punch, then write
/// rows; sets size, and mtime and ctime if given. Returns the new attributes and the
/// objects no row references any more.
pub(crate) fn commit<C: Db>(
    c: &C,
    known: Known<'_>,
    ino: u64,
    commit: &CommitBlocks,
    block_size: u32,
) -> Result<(Attr, Vec<ObjectRef>)> {
    let mut a = inode::attr_known(c, known, ino)?;
    regular(&a)?;
    check_commit(ino, commit, block_size)?;
    let mut removed = BTreeSet::new();
    // 0 without a reservation, as for almost every file: then nothing
    // below touches the reservations (a query per commit, not per row).
    let reserved_end = reserve::reserved_end(c, ino)?;
    let quota_before = a.size.max(reserved_end);
    let size = commit.new_size.unwrap_or(a.size);
    if size < a.size {
        removed.extend(truncate(c, ino, size, block_size)?.0);
    }
    for &index in &commit.punched {
        removed.extend(delete_row(c, ino, index)?);
    }
    removed.extend(replace_rows(c, known, ino, &commit.blocks)?);
    // The rows already there end within the old size (every change of the
    // map checks it), and a shrink dropped or clamped those past the new
    // one: only the new rows can end past it. Checked without a statement
    // (a round trip on PostgreSQL).
    for b in &commit.blocks {
        check_row_within(ino, b.index, b.len, size, block_size)?;
    }
    let now = Timespec::now();
    a.size = size;
    let quota_after = if reserved_end > 0 {
        // Blocks written or punched are no longer reserved.
        let mut ended: Vec<u64> = commit.blocks.iter().map(|b| b.index).collect();
        ended.extend_from_slice(&commit.punched);
        reserve::release_indices(c, ino, &ended, block_size)?;
        reserve::quota_bytes(c, &a)?
    } else {
        size
    };
    // Counted, never refused: WRITE checked the quota before it accepted
    // these bytes, and refusing them now would lose acknowledged data.
    quota::add_bytes(c, ino, quota_after as i64 - quota_before as i64, false)?;
    if let Some(m) = commit.mtime {
        a.mtime = m.resolve(now);
    }
    if let Some(c) = commit.ctime {
        a.ctime = c.resolve(now);
    }
    inode::save(c, &a)?;
    Ok((a, unreferenced(c, removed)?))
}

/// Points rows of `ino` at the objects of `share.source`'s rows (module
/// docs of [`ShareBlocks`]); grows the size to `share.size_min`, counting
/// the growth in the quotas (WRITE-like: checked before, by the caller),
/// sets mtime and ctime. Returns the new attributes and the objects no row
/// references any more (the destination's replaced rows, unless the
/// source or another row still names them).
pub(crate) fn share<C: Db>(
    c: &C,
    ino: u64,
    share: &ShareBlocks,
    block_size: u32,
) -> Result<(Attr, Vec<ObjectRef>)> {
    let mut a = inode::attr(c, ino)?;
    regular(&a)?;
    let source = inode::attr(c, share.source)?;
    regular(&source)?;
    let (first, end) = check_share(ino, share, &source, a.size, block_size)?;
    let src_rows = rows(
        c,
        share.source,
        share.source_first_index,
        share.count as u32,
    )?;
    let shift = |index: u64| index - share.source_first_index + share.first_index;
    let mapped: Vec<BlockRef> = src_rows
        .into_iter()
        .map(|r| BlockRef {
            index: shift(r.index),
            ..r
        })
        .collect();
    let removed: BTreeSet<String> = c
        .prepare_cached(
            "DELETE FROM blocks WHERE ino = ?1 AND idx >= ?2 AND idx < ?3 RETURNING object_key",
        )?
        .collect_rows(params![ino, first, end], |r| r.get(0))?;
    replace_rows(c, Known::nothing(), ino, &mapped)?;
    let size = a.size.max(share.size_min);
    check_rows_within(c, ino, size, block_size)?;
    // As a commit: 0 without a reservation (almost every file).
    let reserved_end = reserve::reserved_end(c, ino)?;
    let quota_before = a.size.max(reserved_end);
    a.size = size;
    let quota_after = if reserved_end > 0 {
        // Every block of the range now holds the source's data or a hole
        // copied from it: none stays reserved.
        let end_index = share.first_index + share.count;
        reserve::release_blocks(c, ino, share.first_index, end_index, block_size)?;
        reserve::quota_bytes(c, &a)?
    } else {
        size
    };
    quota::add_bytes(c, ino, quota_after as i64 - quota_before as i64, false)?;
    let now = Timespec::now();
    a.mtime = now;
    a.ctime = now;
    inode::save(c, &a)?;
    Ok((a, unreferenced(c, removed)?))
}

/// The destination's index range of a share, as SQL integers; refuses a
/// share past the limits, outside the source's size or the destination's
/// new size (`size`: its current one), or over itself.
fn check_share(
    ino: u64,
    share: &ShareBlocks,
    source: &Attr,
    size: u64,
    block_size: u32,
) -> Result<(i64, i64)> {
    if share.count > COMMIT_BLOCKS_ROWS_MAX as u64 {
        return Err(MetaError::invalid(
            ino,
            format!("share of more than {COMMIT_BLOCKS_ROWS_MAX} blocks; split it"),
        ));
    }
    if share.size_min > FILE_SIZE_BYTES_MAX {
        return Err(MetaError::FileTooLarge {
            ino,
            size_bytes: share.size_min,
        });
    }
    if share.count == 0 {
        return Ok((0, 0));
    }
    let bs = u64::from(block_size);
    let source_end = share
        .source_first_index
        .checked_add(share.count)
        .and_then(|e| e.checked_mul(bs));
    if source_end.is_none_or(|e| e > source.size) {
        return Err(MetaError::invalid(
            share.source,
            "shared blocks reach past the source's size",
        ));
    }
    let end_index = share.first_index.checked_add(share.count);
    let end = end_index.and_then(|e| e.checked_mul(bs));
    if end.is_none_or(|e| e > size.max(share.size_min)) {
        return Err(MetaError::invalid(
            ino,
            "shared blocks reach past the destination's size; raise size_min",
        ));
    }
    let overlaps = share.source == ino
        && share.source_first_index < share.first_index + share.count
        && share.first_index < share.source_first_index + share.count;
    if overlaps {
        return Err(MetaError::invalid(ino, "a share over its own source range"));
    }
    let to_i64 =
        |v: u64| i64::try_from(v).map_err(|_| MetaError::FileTooLarge { ino, size_bytes: v });
    Ok((
        to_i64(share.first_index)?,
        to_i64(share.first_index + share.count)?,
    ))
}

fn check_commit(ino: u64, commit: &CommitBlocks, block_size: u32) -> Result<()> {
    if commit.blocks.len() + commit.punched.len() > COMMIT_BLOCKS_ROWS_MAX {
        return Err(MetaError::invalid(
            ino,
            format!("commit changes more than {COMMIT_BLOCKS_ROWS_MAX} block rows; split it"),
        ));
    }
    if let Some(size) = commit.new_size.filter(|s| *s > FILE_SIZE_BYTES_MAX) {
        return Err(MetaError::FileTooLarge {
            ino,
            size_bytes: size,
        });
    }
    for b in &commit.blocks {
        if b.len == 0 || b.len > block_size {
            return Err(MetaError::invalid(
                ino,
                format!(
                    "block {} length {} outside 1..={block_size}",
                    b.index, b.len
                ),
            ));
        }
        block_end(ino, b.index, b.len, block_size)?;
        match &b.inline {
            Some(data) if !b.is_inline() || data.len() > INLINE_STORED_BYTES_MAX => {
                return Err(MetaError::invalid(
                    ino,
                    format!(
                        "inline block {} of {} bytes under key {:?}: inline blocks need an \
                         inline key and at most {INLINE_STORED_BYTES_MAX} bytes",
                        b.index,
                        data.len(),
                        b.object_key
                    ),
                ));
            }
            None if b.is_inline() => {
                return Err(MetaError::invalid(
                    ino,
                    format!("block {} has an inline key but no bytes", b.index),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// End offset of a block row; `FileTooLarge` past [`FILE_SIZE_BYTES_MAX`].
fn block_end(ino: u64, index: u64, len: u32, block_size: u32) -> Result<u64> {
    index
        .checked_mul(u64::from(block_size))
        .and_then(|s| s.checked_add(u64::from(len)))
        .filter(|e| *e <= FILE_SIZE_BYTES_MAX)
        .ok_or(MetaError::FileTooLarge {
            ino,
            size_bytes: u64::MAX,
        })
}

/// `InvalidArgument` if the last row of `ino` ends past `size`.
fn check_rows_within<C: Db>(c: &C, ino: u64, size: u64, block_size: u32) -> Result<()> {
    let last: Option<(u64, u32)> = c
        .prepare_cached("SELECT idx, len FROM blocks WHERE ino = ?1 ORDER BY idx DESC LIMIT 1")?
        .query_row(params![ino], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match last {
        Some((index, len)) => check_row_within(ino, index, len, size, block_size),
        None => Ok(()),
    }
}

/// `InvalidArgument` if row `index` of `len` bytes ends past `size`.
fn check_row_within(ino: u64, index: u64, len: u32, size: u64, block_size: u32) -> Result<()> {
    let end = block_end(ino, index, len, block_size)?;
    if end > size {
        return Err(MetaError::invalid(
            ino,
            format!("block {index} ends at byte {end}, past the file size {size}; pass new_size"),
        ));
    }
    Ok(())
}

/// Deletes row `index` of `ino`; returns its object key if it existed.
fn delete_row<C: Db>(c: &C, ino: u64, index: u64) -> Result<Option<String>> {
    Ok(
        c.prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx = ?2 RETURNING object_key")?
            .query_row(params![ino, index], |r| r.get(0))
            .optional()?,
    )
}

/// Drops the rows wholly at or past `new_size` and clamps the row that
/// straddles it, and the reservations likewise (the caller counts the
/// quota change). Returns the dropped rows' keys and the straddling index.
pub(crate) fn truncate<C: Db>(
    c: &C,
    ino: u64,
    new_size: u64,
    block_size: u32,
) -> Result<(BTreeSet<String>, Option<u64>)> {
    let bs = u64::from(block_size);
    let first_dropped =
        i64::try_from(new_size.div_ceil(bs)).map_err(|_| MetaError::FileTooLarge {
            ino,
            size_bytes: new_size,
        })?;
    let mut stmt =
        c.prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx >= ?2 RETURNING object_key")?;
    let keys: BTreeSet<String> = stmt.collect_rows(params![ino, first_dropped], |r| r.get(0))?;
    reserve::truncate(c, ino, new_size, block_size)?;
    let within = new_size % bs;
    if within == 0 {
        return Ok((keys, None));
    }
    let index = new_size / bs;
    let n = c
        .prepare_cached("UPDATE blocks SET len = ?3 WHERE ino = ?1 AND idx = ?2 AND len > ?3")?
        .execute(params![ino, index, within])?;
    Ok((keys, (n > 0).then_some(index)))
}

/// Writes `rows` of `ino` over whatever rows had their indices (a later
/// row wins over an earlier one with the same index). Returns the replaced
/// rows' object keys.
fn replace_rows<C: Db>(
    c: &C,
    known: Known<'_>,
    ino: u64,
    rows: &[BlockRef],
) -> Result<BTreeSet<String>> {
    match C::DIALECT {
        // A statement costs no round trip: one pair per row (one if memory
        // knows there is no row to replace).
        Dialect::Sqlite => {
            let mut replaced = BTreeSet::new();
            for b in rows {
                let old = if known.block_row_absent(ino, b.index) {
                    None
                } else {
                    delete_row(c, ino, b.index)?
                };
                c.prepare_cached(
                    "INSERT INTO blocks (ino, idx, object_key, len, inline_data)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![ino, b.index, b.object_key, b.len, b.inline])?;
                replaced.extend(old);
            }
            Ok(replaced)
        }
        // Two statements whatever the number of rows (a round trip each).
        Dialect::Postgres => replace_rows_batched(c, ino, rows),
    }
}

fn replace_rows_batched<C: Db>(c: &C, ino: u64, rows: &[BlockRef]) -> Result<BTreeSet<String>> {
    let mut last = std::collections::BTreeMap::new();
    for b in rows {
        last.insert(b.index, b);
    }
    if last.is_empty() {
        return Ok(BTreeSet::new());
    }
    let to_i64 =
        |v: u64| i64::try_from(v).map_err(|_| MetaError::FileTooLarge { ino, size_bytes: v });
    let indices = last
        .keys()
        .map(|&i| to_i64(i))
        .collect::<Result<Vec<i64>>>()?;
    let keys: Vec<String> = last.values().map(|b| b.object_key.clone()).collect();
    let lens: Vec<i64> = last.values().map(|b| i64::from(b.len)).collect();
    let inline: Vec<Option<Vec<u8>>> = last.values().map(|b| b.inline.clone()).collect();
    let replaced = c
        .prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx = ANY(?2) RETURNING object_key")?
        .collect_rows(params![ino, indices], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO blocks (ino, idx, object_key, len, inline_data)
         SELECT ?1, idx, object_key, len, inline_data
         FROM unnest(?2::BIGINT[], ?3::TEXT[], ?4::BIGINT[], ?5::BYTEA[])
             AS new(idx, object_key, len, inline_data)",
    )?
    .execute(params![ino, indices, keys, lens, inline])?;
    Ok(replaced)
}

/// Those of `candidates` that no block row references, sorted. An inline
/// key is never one: its bytes went with its row.
pub(crate) fn unreferenced<C: Db>(
    c: &C,
    mut candidates: BTreeSet<String>,
) -> Result<Vec<ObjectRef>> {
    candidates.retain(|key| !is_inline_key(key));
    match C::DIALECT {
        // One cached statement per candidate (no round trips).
        Dialect::Sqlite => {
            let mut stmt =
                c.prepare_cached("SELECT EXISTS (SELECT 1 FROM blocks WHERE object_key = ?1)")?;
            let mut out = Vec::with_capacity(candidates.len());
            for key in candidates {
                let used: bool = stmt.query_row(params![key], |r| r.get(0))?;
                if !used {
                    out.push(ObjectRef { key });
                }
            }
            Ok(out)
        }
        // One statement for all of them.
        Dialect::Postgres => {
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let all: Vec<String> = candidates.iter().cloned().collect();
            let used: BTreeSet<String> = c
                .prepare_cached(
                    "SELECT DISTINCT object_key FROM blocks WHERE object_key = ANY(?1)",
                )?
                .collect_rows(params![all], |r| r.get(0))?;
            Ok(candidates
                .into_iter()
                .filter(|key| !used.contains(key))
                .map(|key| ObjectRef { key })
                .collect())
        }
    }
}
