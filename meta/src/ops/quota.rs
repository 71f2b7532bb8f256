//! Directory quotas: a byte limit and an inode limit on a directory, and
//! the usage of everything under it, kept in the transaction of every
//! change it counts.
//!
//! `quotas` holds a row per quota directory (limits, usage);
//! `quota_charges` the inodes each quota counts, so that a hard link is
//! counted once per quota and an orphan (unlinked, still open) stays
//! counted, by the quotas that held its last name, until it is reclaimed.
//! Which quotas hold an inode is found from its names: the quota
//! directories on the way from each name's directory up to the root (a
//! directory's own quota does not count the directory itself).
//!
//! Hooks, each in the caller's transaction: `charge_new` (create, mkdir,
//! symlink, mknod), `resync` (link, unlink leaving names, rename),
//! `add_bytes` (a size change: setattr, commit), `uncharge_all` (reclaim).
//! Only changes that add usage are checked against the limits (EDQUOT,
//! and the transaction rolls back); `commit_blocks` is never refused (it
//! makes data durable that WRITE already accepted: WRITE checks instead).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use crate::sql::{params, Db, OptionalExtension, Stmt};

use super::inode;
use crate::error::{MetaError, Result};
use crate::limits::{DIR_DEPTH_MAX, QUOTA_MOVE_INODES_MAX};
use crate::types::{Attr, FileKind, Quota, QuotaDrift, QuotaUsage, ROOT_INO};

/// The quota directories holding `?1` (itself included), deepest first.
const ENCLOSING_SQL: &str = "
WITH RECURSIVE up(ino, depth) AS (
    SELECT CAST(?1 AS BIGINT), 0
    UNION ALL
    SELECT i.parent, up.depth + 1 FROM up JOIN inodes i ON i.ino = up.ino
    WHERE up.ino <> 1 AND up.depth < 65536 -- DIR_DEPTH_MAX
)
SELECT q.ino FROM up JOIN quotas q ON q.ino = up.ino ORDER BY up.depth";

/// Every inode under directory `?1` (not itself), each once.
macro_rules! subtree_cte {
    () => {
        "WITH RECURSIVE down(ino) AS (
            SELECT ino FROM dentries WHERE parent = ?1
            UNION
            SELECT d.ino FROM dentries d JOIN down ON d.parent = down.ino
        ) "
    };
}

/// Directory `?1` and every inode under it, each once.
macro_rules! subtree_and_self_cte {
    () => {
        "WITH RECURSIVE down(ino) AS (
            SELECT CAST(?1 AS BIGINT)
            UNION
            SELECT d.ino FROM dentries d JOIN down ON d.parent = down.ino
        ) "
    };
}

/// What the inode aliased `i` adds to a quota's bytes, in SQL: 0 for a
/// directory, otherwise the larger of its size and the end of its last
/// reservation (`reserve::quota_bytes`).
macro_rules! quota_bytes_sql {
    () => {
        "(CASE WHEN i.kind = 2 THEN 0 ELSE COALESCE((
             SELECT CASE WHEN MAX((r.end_idx - 1) * v.block_size_bytes + r.last_len) > i.size
                         THEN MAX((r.end_idx - 1) * v.block_size_bytes + r.last_len) END
             FROM reserved_ranges r, volume v WHERE r.ino = i.ino), i.size) END)"
    };
}

/// What `a` adds to a quota that counts it, reservations included.
fn usage_with_reserved<C: Db>(c: &C, a: &Attr) -> Result<QuotaUsage> {
    Ok(QuotaUsage {
        bytes: super::reserve::quota_bytes(c, a)?,
        inodes: 1,
    })
}

/// What `a` adds to a quota that counts it, if it has no reservation (a
/// new inode).
pub(crate) fn usage_of(a: &Attr) -> QuotaUsage {
    QuotaUsage {
        bytes: if a.kind == FileKind::Directory {
            0
        } else {
            a.size
        },
        inodes: 1,
    }
}

/// Whether the volume has any quota (the fast path of every hook).
fn any<C: Db>(c: &C) -> Result<bool> {
    Ok(
        c.query_row("SELECT EXISTS (SELECT 1 FROM quotas)", params![], |r| {
            r.get(0)
        })?,
    )
}

/// The quota directories holding entries made in directory `dir` (`dir`
/// itself included), deepest first.
fn enclosing<C: Db>(c: &C, dir: u64) -> Result<Vec<u64>> {
    Ok(c.prepare_cached(ENCLOSING_SQL)?
        .collect_rows(params![dir], |r| r.get(0))?)
}

/// The quotas that hold `ino` through its names now.
fn holding<C: Db>(c: &C, ino: u64) -> Result<BTreeSet<u64>> {
    let parents: Vec<u64> = c
        .prepare_cached("SELECT parent FROM dentries WHERE ino = ?1")?
        .collect_rows(params![ino], |r| r.get(0))?;
    let mut out = BTreeSet::new();
    for parent in parents {
        out.extend(enclosing(c, parent)?);
    }
    Ok(out)
}

/// The quotas that count `ino` now.
fn charged<C: Db>(c: &C, ino: u64) -> Result<BTreeSet<u64>> {
    Ok(
        c.prepare_cached("SELECT quota FROM quota_charges WHERE ino = ?1")?
            .collect_rows(params![ino], |r| r.get(0))?,
    )
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Adds `sign * usage` to quota `q`; an addition is checked against its
/// limits.
fn apply<C: Db>(c: &C, q: u64, usage: QuotaUsage, sign: i64, check: bool) -> Result<()> {
    c.prepare_cached(
        "UPDATE quotas SET bytes_used = bytes_used + ?2, inodes_used = inodes_used + ?3
         WHERE ino = ?1",
    )?
    .execute(params![
        q,
        sign * signed(usage.bytes),
        sign * signed(usage.inodes)
    ])?;
    if check && sign > 0 {
        check_limits(c, q, usage.bytes > 0, usage.inodes > 0)?;
    }
    Ok(())
}

/// `QuotaExceeded` if quota `q` is past its byte limit (when `bytes`) or
/// its inode limit (when `inodes`): only what a change adds is checked, so
/// that a quota whose byte limit was lowered below its usage still lets
/// empty files and directories be made.
fn check_limits<C: Db>(c: &C, q: u64, check_bytes: bool, check_inodes: bool) -> Result<()> {
    let row: Option<(i64, Option<u64>, i64, Option<u64>)> = c
        .prepare_cached(
            "SELECT bytes_used, bytes_max, inodes_used, inodes_max FROM quotas WHERE ino = ?1",
        )?
        .query_row(params![q], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let Some((bytes, bytes_max, inodes, inodes_max)) = row else {
        return Ok(());
    };
    let over = |what, used: i64, max: Option<u64>| match max {
        Some(max) if used > signed(max) => Err(MetaError::QuotaExceeded {
            quota: q,
            what,
            would_be: used.max(0) as u64,
            max,
        }),
        _ => Ok(()),
    };
    if check_bytes {
        over("bytes", bytes, bytes_max)?;
    }
    if check_inodes {
        over("inodes", inodes, inodes_max)?;
    }
    Ok(())
}

/// A new inode `a` was named in `parent`: every quota holding `parent`
/// counts it (checked).
pub(crate) fn charge_new<C: Db>(c: &C, parent: u64, a: &Attr) -> Result<()> {
    if !any(c)? {
        return Ok(());
    }
    for q in enclosing(c, parent)? {
        c.prepare_cached("INSERT INTO quota_charges (quota, ino) VALUES (?1, ?2)")?
            .execute(params![q, a.ino])?;
        apply(c, q, usage_of(a), 1, true)?;
    }
    Ok(())
}

/// `ino`'s names changed (link, unlink leaving names, rename): the quotas
/// that hold it now count it, the others no longer do. Additions are
/// checked when `check`.
pub(crate) fn resync<C: Db>(c: &C, a: &Attr, check: bool) -> Result<()> {
    if !any(c)? {
        return Ok(());
    }
    resync_one(c, a, check)
}

fn resync_one<C: Db>(c: &C, a: &Attr, check: bool) -> Result<()> {
    let now = holding(c, a.ino)?;
    let before = charged(c, a.ino)?;
    let usage = usage_with_reserved(c, a)?;
    for &q in before.difference(&now) {
        c.prepare_cached("DELETE FROM quota_charges WHERE quota = ?1 AND ino = ?2")?
            .execute(params![q, a.ino])?;
        apply(c, q, usage, -1, false)?;
    }
    for &q in now.difference(&before) {
        c.prepare_cached("INSERT INTO quota_charges (quota, ino) VALUES (?1, ?2)")?
            .execute(params![q, a.ino])?;
        apply(c, q, usage, 1, check)?;
    }
    Ok(())
}

/// `moved` (already under `new_parent`) left `old_parent`: moves its
/// usage, and for a directory that of everything under it, between the
/// quotas (checked). `QuotaMoveTooLarge` for a directory holding more
/// than [`QUOTA_MOVE_INODES_MAX`] inodes when the quotas differ.
pub(crate) fn after_move<C: Db>(
    c: &C,
    moved: &Attr,
    old_parent: u64,
    new_parent: u64,
) -> Result<()> {
    if old_parent == new_parent || !any(c)? {
        return Ok(());
    }
    if moved.kind != FileKind::Directory {
        return resync_one(c, moved, true);
    }
    let before: BTreeSet<u64> = enclosing(c, old_parent)?.into_iter().collect();
    let after: BTreeSet<u64> = enclosing(c, new_parent)?.into_iter().collect();
    if before == after {
        return Ok(());
    }
    // The moved directory and its tree: each inode with a single name
    // (directories, files at nlink 1) leaves and enters exactly the same
    // quotas, set-wise in a few statements per quota; one with more names
    // is resynced from all of them.
    let tree: Vec<(u64, FileKind, u64, u32)> = c
        .prepare_cached(concat!(
            subtree_and_self_cte!(),
            "SELECT i.ino, i.kind, ",
            quota_bytes_sql!(),
            ", i.nlink FROM down JOIN inodes i ON i.ino = down.ino
             LIMIT ?2"
        ))?
        .collect_rows(params![moved.ino, QUOTA_MOVE_INODES_MAX + 2], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
    if tree.len() as u64 > QUOTA_MOVE_INODES_MAX + 1 {
        return Err(MetaError::QuotaMoveTooLarge {
            ino: moved.ino,
            max: QUOTA_MOVE_INODES_MAX,
        });
    }
    let single = |kind: FileKind, nlink: u32| kind == FileKind::Directory || nlink <= 1;
    let mut usage = QuotaUsage::default();
    let mut shared = Vec::new();
    for &(ino, kind, size, nlink) in &tree {
        if single(kind, nlink) {
            let a = QuotaUsage {
                bytes: if kind == FileKind::Directory { 0 } else { size },
                inodes: 1,
            };
            usage.bytes += a.bytes;
            usage.inodes += a.inodes;
        } else {
            shared.push(ino);
        }
    }
    for &q in before.difference(&after) {
        c.prepare_cached(concat!(
            subtree_and_self_cte!(),
            "DELETE FROM quota_charges WHERE quota = ?2 AND ino IN (
                 SELECT down.ino FROM down JOIN inodes i ON i.ino = down.ino
                 WHERE i.kind = 2 OR i.nlink <= 1)"
        ))?
        .execute(params![moved.ino, q])?;
        apply(c, q, usage, -1, false)?;
    }
    for &q in after.difference(&before) {
        c.prepare_cached(concat!(
            subtree_and_self_cte!(),
            "INSERT INTO quota_charges (quota, ino)
             SELECT ?2, down.ino FROM down JOIN inodes i ON i.ino = down.ino
             WHERE i.kind = 2 OR i.nlink <= 1
             ON CONFLICT DO NOTHING"
        ))?
        .execute(params![moved.ino, q])?;
        apply(c, q, usage, 1, true)?;
    }
    for ino in shared {
        resync_one(c, &inode::attr(c, ino)?, true)?;
    }
    Ok(())
}

/// `ino`'s size changed by `delta` bytes: every quota counting it follows;
/// a growth is checked when `check`.
pub(crate) fn add_bytes<C: Db>(c: &C, ino: u64, delta: i64, check: bool) -> Result<()> {
    if delta == 0 {
        return Ok(());
    }
    let changed = c
        .prepare_cached(
            "UPDATE quotas SET bytes_used = bytes_used + ?2
             WHERE ino IN (SELECT quota FROM quota_charges WHERE ino = ?1)",
        )?
        .execute(params![ino, delta])?;
    if check && delta > 0 && changed > 0 {
        for q in charged(c, ino)? {
            check_limits(c, q, true, false)?;
        }
    }
    Ok(())
}

/// Orphan `a` is being deleted: no quota counts it any more.
pub(crate) fn uncharge_all<C: Db>(c: &C, a: &Attr) -> Result<()> {
    // Most inodes no quota counts: one search of the index, and done.
    let counted: bool = c
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM quota_charges WHERE ino = ?1)")?
        .query_row(params![a.ino], |r| r.get(0))?;
    if !counted {
        return Ok(());
    }
    let usage = usage_with_reserved(c, a)?;
    let changed = c
        .prepare_cached(
            "UPDATE quotas SET bytes_used = bytes_used - ?2, inodes_used = inodes_used - ?3
             WHERE ino IN (SELECT quota FROM quota_charges WHERE ino = ?1)",
        )?
        .execute(params![a.ino, signed(usage.bytes), signed(usage.inodes)])?;
    if changed > 0 {
        c.prepare_cached("DELETE FROM quota_charges WHERE ino = ?1")?
            .execute(params![a.ino])?;
    }
    Ok(())
}

/// Bytes the quotas counting `ino` still allow (the least of them;
/// negative when one is past its limit); `None` if no quota with a byte
/// limit counts it.
/// The file's own reservation past its size counts as headroom: it is
/// already in the usage, and a write into it must not be refused.
pub(crate) fn bytes_headroom<C: Db>(c: &C, ino: u64) -> Result<Option<i64>> {
    let headroom: Option<i64> = c.query_row(
        "SELECT MIN(q.bytes_max - q.bytes_used) FROM quotas q
         JOIN quota_charges c ON c.quota = q.ino
         WHERE c.ino = ?1 AND q.bytes_max IS NOT NULL",
        params![ino],
        |r| r.get(0),
    )?;
    let Some(headroom) = headroom else {
        return Ok(None);
    };
    let a = inode::attr(c, ino)?;
    let reserved_past_size = super::reserve::quota_bytes(c, &a)?.saturating_sub(a.size);
    Ok(Some(headroom.saturating_add(signed(reserved_past_size))))
}

fn read<C: Db>(c: &C, dir: u64) -> Result<Option<Quota>> {
    Ok(c.prepare_cached(
        "SELECT ino, bytes_max, inodes_max, bytes_used, inodes_used FROM quotas WHERE ino = ?1",
    )?
    .query_row(params![dir], row_quota)
    .optional()?)
}

fn row_quota(r: &crate::sql::Row<'_>) -> crate::sql::SqlResult<Quota> {
    let used = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Quota {
        dir: r.get(0)?,
        bytes_max: r.get(1)?,
        inodes_max: r.get(2)?,
        used: QuotaUsage {
            bytes: used(r.get(3)?),
            inodes: used(r.get(4)?),
        },
    })
}

/// The quota on `dir`, if any.
pub(crate) fn get<C: Db>(c: &C, dir: u64) -> Result<Option<Quota>> {
    read(c, dir)
}

/// Every quota, by directory inode.
pub(crate) fn list<C: Db>(c: &C) -> Result<Vec<Quota>> {
    Ok(c.prepare_cached(
        "SELECT ino, bytes_max, inodes_max, bytes_used, inodes_used FROM quotas ORDER BY ino",
    )?
    .collect_rows(params![], row_quota)?)
}

/// The quota `statfs` on `ino` reports: the deepest one holding it (for
/// a directory, its own first).
pub(crate) fn nearest<C: Db>(c: &C, ino: u64) -> Result<Option<Quota>> {
    if !any(c)? {
        return Ok(None);
    }
    let a = inode::attr(c, ino)?;
    let start = if a.kind == FileKind::Directory {
        Some(ino)
    } else {
        c.prepare_cached("SELECT parent FROM dentries WHERE ino = ?1 ORDER BY cookie LIMIT 1")?
            .query_row(params![ino], |r| r.get(0))
            .optional()?
    };
    let q = match start {
        Some(dir) => enclosing(c, dir)?.first().copied(),
        None => charged(c, ino)?.first().copied(),
    };
    match q {
        Some(q) => read(c, q),
        None => Ok(None),
    }
}

/// Sets the limits of the quota on directory `dir`; a new quota counts
/// the tree under it first.
pub(crate) fn set<C: Db>(
    c: &C,
    dir: u64,
    bytes_max: Option<u64>,
    inodes_max: Option<u64>,
) -> Result<Quota> {
    inode::live_dir(c, dir)?;
    if read(c, dir)?.is_some() {
        c.prepare_cached("UPDATE quotas SET bytes_max = ?2, inodes_max = ?3 WHERE ino = ?1")?
            .execute(params![dir, bytes_max, inodes_max])?;
    } else {
        c.prepare_cached(
            "INSERT INTO quotas (ino, bytes_max, inodes_max, bytes_used, inodes_used)
             VALUES (?1, ?2, ?3, 0, 0)",
        )?
        .execute(params![dir, bytes_max, inodes_max])?;
        recharge(c, dir)?;
    }
    read(c, dir)?.ok_or_else(|| MetaError::corrupt(format!("quota on {dir} vanished")))
}

/// Removes the quota on `dir`; `false` if there was none.
pub(crate) fn remove<C: Db>(c: &C, dir: u64) -> Result<bool> {
    c.prepare_cached("DELETE FROM quota_charges WHERE quota = ?1")?
        .execute(params![dir])?;
    let n = c
        .prepare_cached("DELETE FROM quotas WHERE ino = ?1")?
        .execute(params![dir])?;
    Ok(n > 0)
}

/// What quota `dir` should count: the tree under it, and the orphans it
/// counts (they keep their charge until reclaimed).
fn count<C: Db>(c: &C, dir: u64) -> Result<QuotaUsage> {
    let (inodes, bytes): (u64, u64) = c.query_row(
        concat!(
            subtree_cte!(),
            "SELECT COUNT(*), CAST(COALESCE(SUM(",
            quota_bytes_sql!(),
            "), 0) AS BIGINT)
             FROM inodes i WHERE i.ino IN (
                 SELECT ino FROM down
                 UNION SELECT q.ino FROM quota_charges q JOIN orphans o ON o.ino = q.ino
                 WHERE q.quota = ?1)"
        ),
        params![dir],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(QuotaUsage { bytes, inodes })
}

/// Charges quota `dir` with exactly the tree under it (and its orphans),
/// and stores that usage.
fn recharge<C: Db>(c: &C, dir: u64) -> Result<QuotaUsage> {
    c.prepare_cached(
        "DELETE FROM quota_charges WHERE quota = ?1
         AND ino NOT IN (SELECT ino FROM orphans)",
    )?
    .execute(params![dir])?;
    c.prepare_cached(concat!(
        subtree_cte!(),
        "INSERT INTO quota_charges (quota, ino) SELECT ?1, ino FROM down WHERE true
         ON CONFLICT DO NOTHING"
    ))?
    .execute(params![dir])?;
    let usage = count(c, dir)?;
    c.prepare_cached("UPDATE quotas SET bytes_used = ?2, inodes_used = ?3 WHERE ino = ?1")?
        .execute(params![dir, usage.bytes, usage.inodes])?;
    Ok(usage)
}

/// Recounts every quota; returns those whose stored usage differed. With
/// `repair`, stores the recounted usage (and rebuilds what each counts).
pub(crate) fn recount<C: Db>(c: &C, repair: bool) -> Result<Vec<QuotaDrift>> {
    let mut drifts = Vec::new();
    for q in list(c)? {
        let counted = count(c, q.dir)?;
        if repair {
            recharge(c, q.dir)?;
        }
        if counted != q.used {
            drifts.push(QuotaDrift {
                dir: q.dir,
                stored: q.used,
                counted,
            });
        }
    }
    Ok(drifts)
}

/// The path of directory `dir` from the root (`/` for the root); a
/// directory that lost its name says so.
pub(crate) fn dir_path<C: Db>(c: &C, dir: u64) -> Result<PathBuf> {
    let mut names: Vec<OsString> = Vec::new();
    let mut cur = dir;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..DIR_DEPTH_MAX {
        if cur == ROOT_INO {
            let mut path = PathBuf::from("/");
            path.extend(names.iter().rev());
            return Ok(path);
        }
        if !seen.insert(cur) {
            return Err(MetaError::corrupt(format!(
                "the parents of directory {dir} form a cycle through directory {cur}"
            )));
        }
        let entry: Option<(u64, Vec<u8>)> = c
            .prepare_cached("SELECT parent, name FROM dentries WHERE ino = ?1 LIMIT 1")?
            .query_row(params![cur], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((parent, name)) = entry else {
            return Ok(PathBuf::from(format!("(removed directory, inode {dir})")));
        };
        names.push(OsString::from_vec(name));
        cur = parent;
    }
    // Not `Corrupt`: a user can nest directories this deep (quarantine.rs).
    Err(MetaError::invalid(
        dir,
        format!("directory {dir} is deeper than {DIR_DEPTH_MAX} levels: its path is not shown"),
    ))
}
