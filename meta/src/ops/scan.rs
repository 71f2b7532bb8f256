//! The whole volume's block map, page by page, for storage checks and
//! garbage collection (`fsctl fsck`, `fsctl gc`).

use crate::sql::{params, Db, Stmt};

use crate::error::Result;
use crate::limits::BLOCKS_QUERY_COUNT_MAX;
use crate::types::BlockRef;

/// Rows strictly after `(ino, index)` (all rows for `None`), ordered by
/// `(ino, index)`, at most `limit` (capped at [`BLOCKS_QUERY_COUNT_MAX`]).
pub(crate) fn scan_blocks<C: Db>(
    c: &C,
    after: Option<(u64, u64)>,
    limit: u32,
) -> Result<Vec<(u64, BlockRef)>> {
    let limit = limit.min(BLOCKS_QUERY_COUNT_MAX);
    // Inode numbers start at 1 and indices at 0, so (0, -1) precedes all.
    let (after_ino, after_idx) = match after {
        None => (0i64, -1i64),
        Some((ino, idx)) => (
            i64::try_from(ino).unwrap_or(i64::MAX),
            i64::try_from(idx).unwrap_or(i64::MAX),
        ),
    };
    let mut stmt = c.prepare_cached(
        "SELECT ino, idx, object_key, len, inline_data FROM blocks
         WHERE (ino, idx) > (?1, ?2) ORDER BY ino, idx LIMIT ?3",
    )?;
    Ok(
        stmt.collect_rows(params![after_ino, after_idx, limit], |r| {
            Ok((
                r.get(0)?,
                BlockRef {
                    index: r.get(1)?,
                    object_key: r.get(2)?,
                    len: r.get(3)?,
                    inline: r.get(4)?,
                },
            ))
        })?,
    )
}
