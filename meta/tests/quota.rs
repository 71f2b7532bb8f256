//! Directory quotas: usage counted in the transaction of each change
//! (create, link, unlink, rename, size changes, reclaim), limits refused
//! with EDQUOT changing nothing, and recounts. Runs on the engine
//! BATON_META_BACKEND names.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{
    CommitBlocks, FileKind, MetaError, MetaStore, QuotaUsage, RenameFlags, SetAttr, ROOT_INO,
};
use common::*;

const PLAIN: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
};

fn used(m: &dyn MetaStore, dir: u64) -> (u64, u64) {
    let q = m.quota(dir).unwrap().unwrap();
    (q.used.bytes, q.used.inodes)
}

fn resize(m: &dyn MetaStore, ino: u64, size: u64) -> Result<(), MetaError> {
    let set = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    m.setattr(ino, &set, None).map(|_| ())
}

fn commit_size(m: &dyn MetaStore, ino: u64, size: u64) {
    let c = CommitBlocks {
        new_size: Some(size),
        mtime: None,
        ctime: None,
        blocks: Vec::new(),
        punched: Vec::new(),
    };
    m.commit_blocks(ino, &c, None).unwrap();
}

fn is_edquot(r: Result<impl std::fmt::Debug, MetaError>) -> bool {
    matches!(r, Err(ref e) if e.errno() == libc::EDQUOT)
}

#[test]
fn a_new_quota_counts_the_tree_and_every_change_after() {
    let v = fresh();
    let m = v.meta.as_ref();
    let q = dir(m, ROOT_INO, "q");
    let sub = dir(m, q.ino, "sub");
    let f = file(m, sub.ino, "f");
    resize(m, f.ino, 1000).unwrap();
    let set = m.set_quota(q.ino, Some(10_000), Some(10)).unwrap();
    assert_eq!(
        set.used,
        QuotaUsage {
            bytes: 1000,
            inodes: 2
        }
    );

    let g = file(m, q.ino, "g");
    commit_size(m, g.ino, 3000);
    assert_eq!(used(m, q.ino), (4000, 3));
    // A second name in the same quota is not counted again.
    m.link(f.ino, q.ino, n("f2"), None).unwrap();
    assert_eq!(used(m, q.ino), (4000, 3));
    m.unlink(sub.ino, n("f"), None).unwrap();
    assert_eq!(used(m, q.ino), (4000, 3));
    // Out of the quota: its usage goes with it.
    m.rename(q.ino, n("g"), ROOT_INO, n("g"), PLAIN, None)
        .unwrap();
    assert_eq!(used(m, q.ino), (1000, 2));
    // A directory moved in brings its tree.
    let d = dir(m, ROOT_INO, "d");
    let h = file(m, d.ino, "h");
    resize(m, h.ino, 500).unwrap();
    m.rename(ROOT_INO, n("d"), sub.ino, n("d"), PLAIN, None)
        .unwrap();
    assert_eq!(used(m, q.ino), (1500, 4));
    // Unlinked: counted until reclaimed.
    m.unlink(q.ino, n("f2"), None).unwrap();
    assert_eq!(used(m, q.ino), (1500, 4));
    m.reclaim(f.ino, None).unwrap();
    assert_eq!(used(m, q.ino), (500, 3));
    assert!(m.recount_quotas(false).unwrap().is_empty());
    assert_eq!(m.dir_path(sub.ino).unwrap(), std::path::Path::new("/q/sub"));
}

#[test]
fn limits_refuse_at_the_boundary_and_change_nothing() {
    let v = fresh();
    let m = v.meta.as_ref();
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, Some(4096), Some(3)).unwrap();
    let f = file(m, q.ino, "f");
    resize(m, f.ino, 4096).unwrap();
    assert!(is_edquot(resize(m, f.ino, 4097)));
    assert_eq!(m.getattr(f.ino).unwrap().size, 4096);
    dir(m, q.ino, "d");
    file(m, q.ino, "third");
    assert!(is_edquot(m.create(
        q.ino,
        n("fourth"),
        &args(FileKind::Regular),
        None
    )));
    assert_eq!(
        m.lookup(q.ino, n("fourth")).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(used(m, q.ino), (4096, 3));
    // Moving a file in past the limit is refused, and it stays out.
    let outside = file(m, ROOT_INO, "outside");
    m.set_quota(q.ino, Some(4096), None).unwrap();
    resize(m, outside.ino, 1).unwrap();
    assert!(is_edquot(m.rename(
        ROOT_INO,
        n("outside"),
        q.ino,
        n("in"),
        PLAIN,
        None
    )));
    assert_eq!(m.lookup(ROOT_INO, n("outside")).unwrap().ino, outside.ino);
    assert!(is_edquot(m.link(outside.ino, q.ino, n("l"), None)));
    assert_eq!(used(m, q.ino), (4096, 3));
    // commit_blocks counts but never refuses (its bytes were accepted).
    commit_size(m, f.ino, 5000);
    assert_eq!(used(m, q.ino), (5000, 3));
    assert_eq!(m.quota_bytes_headroom(f.ino).unwrap(), Some(-904));
    // Past the byte limit, what adds no bytes is still allowed.
    let empty = file(m, q.ino, "empty");
    let mut link_args = args(FileKind::Symlink);
    link_args.symlink_target = Some("target".into());
    assert!(is_edquot(m.create(q.ino, n("sym"), &link_args, None)));
    m.unlink(q.ino, n("empty"), None).unwrap();
    m.reclaim(empty.ino, None).unwrap();
    // Shrinking is always allowed.
    resize(m, f.ino, 10).unwrap();
    assert_eq!(used(m, q.ino), (10, 3));
}

#[test]
fn nested_quotas_and_statfs_choice() {
    let v = fresh();
    let m = v.meta.as_ref();
    let outer = dir(m, ROOT_INO, "outer");
    let inner = dir(m, outer.ino, "inner");
    m.set_quota(outer.ino, None, Some(100)).unwrap();
    m.set_quota(inner.ino, Some(1 << 20), None).unwrap();
    let f = file(m, inner.ino, "f");
    assert_eq!(used(m, outer.ino), (0, 2));
    assert_eq!(used(m, inner.ino), (0, 1));
    assert_eq!(m.nearest_quota(inner.ino).unwrap().unwrap().dir, inner.ino);
    assert_eq!(m.nearest_quota(f.ino).unwrap().unwrap().dir, inner.ino);
    assert_eq!(m.nearest_quota(outer.ino).unwrap().unwrap().dir, outer.ino);
    assert_eq!(m.nearest_quota(ROOT_INO).unwrap(), None);
    assert!(m.remove_quota(inner.ino).unwrap());
    assert!(!m.remove_quota(inner.ino).unwrap());
    assert_eq!(m.quotas().unwrap().len(), 1);
}

#[test]
fn fsck_recount_reports_and_repairs_drift() {
    let v = fresh();
    let m = v.meta.as_ref();
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, None, None).unwrap();
    let f = file(m, q.ino, "f");
    resize(m, f.ino, 77).unwrap();
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // Usage that drifted behind the store's back (an older build, a bug).
    raw_exec(
        &v,
        "UPDATE quotas SET bytes_used = 5, inodes_used = 9 WHERE ino = ?1",
        &[q.ino as i64],
    );
    let drift = m.recount_quotas(false).unwrap();
    assert_eq!(drift.len(), 1);
    assert_eq!(
        drift[0].stored,
        QuotaUsage {
            bytes: 5,
            inodes: 9
        }
    );
    assert_eq!(
        drift[0].counted,
        QuotaUsage {
            bytes: 77,
            inodes: 1
        }
    );
    assert_eq!(used(m, q.ino), (5, 9));
    assert_eq!(m.recount_quotas(true).unwrap().len(), 1);
    assert_eq!(used(m, q.ino), (77, 1));
    assert!(m.recount_quotas(false).unwrap().is_empty());
}

fn args(kind: FileKind) -> baton_meta::CreateArgs {
    baton_meta::CreateArgs {
        kind,
        mode: 0o644,
        umask: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink_target: None,
        inherit_acl: false,
    }
}

#[test]
fn a_directory_too_large_to_move_across_quotas_is_refused_with_exdev() {
    let v = fresh();
    let m = v.meta.as_ref();
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, None, None).unwrap();
    let d = dir(m, ROOT_INO, "d");
    let count = baton_meta::limits::QUOTA_MOVE_INODES_MAX as i64 + 1;
    let numbers = "WITH RECURSIVE n(i) AS (SELECT CAST(1 AS BIGINT) UNION ALL SELECT i + 1 FROM n WHERE i < CAST(?1 AS BIGINT)) ";
    raw_exec(
        &v,
        &format!(
            "{numbers}INSERT INTO inodes (ino, generation, kind, mode, nlink, uid, gid, rdev, size,
                 atime_sec, atime_nsec, mtime_sec, mtime_nsec, ctime_sec, ctime_nsec)
             SELECT 2000000 + i, 1, 1, 420, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 FROM n"
        ),
        &[count],
    );
    raw_exec(
        &v,
        &format!(
            "{numbers}INSERT INTO dentries (parent, name, ino)
             SELECT CAST(?2 AS BIGINT), CAST(('e' || i) AS BLOB), 2000000 + i FROM n"
        )
        .replace(
            "AS BLOB",
            if v.db.is_some() {
                "AS BYTEA"
            } else {
                "AS BLOB"
            },
        ),
        &[count, d.ino as i64],
    );
    let moved = m.rename(ROOT_INO, n("d"), q.ino, n("d"), PLAIN, None);
    assert_eq!(moved.unwrap_err().errno(), libc::EXDEV);
    assert_eq!(m.lookup(ROOT_INO, n("d")).unwrap().ino, d.ino);
    assert_eq!(used(m, q.ino), (0, 0));
    // One inode fewer moves, with its whole tree.
    m.unlink(d.ino, n("e1"), None).unwrap();
    m.rename(ROOT_INO, n("d"), q.ino, n("d"), PLAIN, None)
        .unwrap();
    assert_eq!(used(m, q.ino), (0, count as u64));
}

#[test]
fn a_directory_moved_across_quotas_moves_its_tree_hard_links_and_inner_quotas_right() {
    let v = fresh();
    let m = v.meta.as_ref();
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, Some(1 << 20), Some(100)).unwrap();
    let d = dir(m, ROOT_INO, "d");
    let inner = dir(m, d.ino, "inner");
    m.set_quota(inner.ino, None, None).unwrap();
    let g = file(m, inner.ino, "g");
    resize(m, g.ino, 10).unwrap();
    let linked = file(m, d.ino, "linked");
    resize(m, linked.ino, 100).unwrap();
    // A second name outside d, and one already inside q.
    m.link(linked.ino, ROOT_INO, n("outside"), None).unwrap();
    m.link(linked.ino, q.ino, n("inside"), None).unwrap();
    assert_eq!(used(m, q.ino), (100, 1));
    m.rename(ROOT_INO, n("d"), q.ino, n("d"), PLAIN, None)
        .unwrap();
    // d, inner, g, and linked counted once.
    assert_eq!(used(m, q.ino), (110, 4));
    assert_eq!(used(m, inner.ino), (10, 1));
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // Out again: linked stays (its name "inside" is still in q).
    m.rename(q.ino, n("d"), ROOT_INO, n("d2"), PLAIN, None)
        .unwrap();
    assert_eq!(used(m, q.ino), (100, 1));
    assert_eq!(used(m, inner.ino), (10, 1));
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // Into a quota too small for the tree: refused, nothing moved.
    m.set_quota(q.ino, Some(105), None).unwrap();
    let refused = m.rename(ROOT_INO, n("d2"), q.ino, n("d"), PLAIN, None);
    assert_eq!(refused.unwrap_err().errno(), libc::EDQUOT);
    assert_eq!(m.lookup(ROOT_INO, n("d2")).unwrap().ino, d.ino);
    assert_eq!(used(m, q.ino), (100, 1));
    assert!(m.recount_quotas(false).unwrap().is_empty());
}

/// A block row at `index` (an object key the test never uploads).
fn block(index: u64, len: u32) -> baton_meta::BlockRef {
    baton_meta::BlockRef {
        index,
        object_key: format!("k{index}"),
        len,
        inline: None,
    }
}

#[test]
fn fallocated_holes_are_reserved_until_written_punched_truncated_or_reclaimed() {
    let v = fresh();
    let m = v.meta.as_ref();
    let bs = u64::from(BS);
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, Some(100 * bs), None).unwrap();
    let f = file(m, q.ino, "f");
    let statfs_used = || m.statfs().unwrap().bytes_used;
    let base = statfs_used();

    // Mode 0 over 10 blocks: the size grows, the holes are reserved.
    let a = m.fallocate_reserve(f.ino, 0..10 * bs, true, None).unwrap();
    assert_eq!(a.size, 10 * bs);
    assert_eq!(used(m, q.ino), (10 * bs, 1));
    assert_eq!(statfs_used() - base, 10 * bs);
    // Idempotent: a repeat reserves nothing more.
    m.fallocate_reserve(f.ino, 0..10 * bs, true, None).unwrap();
    assert_eq!(statfs_used() - base, 10 * bs);
    // KEEP_SIZE past the end: the quota counts up to its end.
    m.fallocate_reserve(f.ino, 10 * bs..15 * bs, false, None)
        .unwrap();
    assert_eq!(used(m, q.ino), (15 * bs, 1));
    assert_eq!(statfs_used() - base, 15 * bs);
    // Past the limit: refused, nothing applied.
    assert!(is_edquot(m.fallocate_reserve(
        f.ino,
        20 * bs..200 * bs,
        false,
        None
    )));
    assert_eq!(used(m, q.ino), (15 * bs, 1));

    // A written block counts instead of its reservation.
    let c = CommitBlocks {
        new_size: Some(12 * bs),
        mtime: None,
        ctime: None,
        blocks: vec![block(0, BS), block(11, BS)],
        punched: Vec::new(),
    };
    m.commit_blocks(f.ino, &c, None).unwrap();
    assert_eq!(used(m, q.ino), (15 * bs, 1));
    assert_eq!(statfs_used() - base, 15 * bs);
    // A punch releases the whole blocks it covers.
    m.release_reserved(f.ino, bs..5 * bs, None).unwrap();
    assert_eq!(statfs_used() - base, 11 * bs);
    // A truncate releases what is past the new size.
    resize(m, f.ino, 8 * bs).unwrap();
    assert_eq!(used(m, q.ino), (8 * bs, 1));
    assert_eq!(statfs_used() - base, bs + 3 * bs);
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // The last of it goes with the inode.
    m.unlink(q.ino, n("f"), None).unwrap();
    m.reclaim(f.ino, None).unwrap();
    assert_eq!(used(m, q.ino), (0, 0));
    assert_eq!(statfs_used(), base);
    assert!(m.recount_quotas(false).unwrap().is_empty());
}

/// A share (copy_file_range) over reserved blocks ends their reservations,
/// as a commit does, and the quota counts the size it grows to; a recount
/// agrees.
#[test]
fn a_share_over_reserved_blocks_releases_them() {
    let v = fresh();
    let m = v.meta.as_ref();
    let bs = u64::from(BS);
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, Some(100 * bs), None).unwrap();
    let src = file(m, ROOT_INO, "src");
    let c = CommitBlocks {
        new_size: Some(4 * bs),
        blocks: (0..4).map(|i| block(i, BS)).collect(),
        ..Default::default()
    };
    m.commit_blocks(src.ino, &c, None).unwrap();
    let f = file(m, q.ino, "f");
    let statfs_used = || m.statfs().unwrap().bytes_used;
    // KEEP_SIZE over 6 blocks, then the 4 source blocks shared over 2..6.
    m.fallocate_reserve(f.ino, 0..6 * bs, false, None).unwrap();
    let base = statfs_used();
    assert_eq!(used(m, q.ino), (6 * bs, 1));
    let share = baton_meta::ShareBlocks {
        source: src.ino,
        source_first_index: 0,
        first_index: 2,
        count: 4,
        size_min: 6 * bs,
        copied_bytes: 4 * bs,
    };
    let (a, released) = m.share_blocks(f.ino, &share, None).unwrap();
    assert!(released.is_empty());
    assert_eq!(a.size, 6 * bs);
    // The quota counts the size; blocks 0 and 1 stay reserved.
    assert_eq!(used(m, q.ino), (6 * bs, 1));
    assert_eq!(statfs_used(), base);
    assert!(m.recount_quotas(false).unwrap().is_empty());
    if v.db.is_none() {
        assert_eq!(runs(&v, f.ino), [(0, 2, BS as i64)]);
    }
}

/// The reserved runs of `ino` in a SQLite volume: (first, end, last_len).
fn runs(v: &Vol, ino: u64) -> Vec<(i64, i64, i64)> {
    raw(v)
        .prepare("SELECT idx, end_idx, last_len FROM reserved_ranges WHERE ino = ?1 ORDER BY idx")
        .unwrap()
        .query_map([ino as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A reservation of any length (here 2^40 blocks, 4 PiB) is a few rows,
/// made and released in well under a second: reserved around data
/// blocks, written into at scattered blocks, punched, truncated and
/// reclaimed, with statfs and the quota exact at every step.
#[test]
fn a_reservation_of_any_length_is_a_few_runs_and_every_change_releases_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    let bs = u64::from(BS);
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, None, None).unwrap();
    let f = file(m, q.ino, "f");
    let data = |indices: &[u64], size: u64| CommitBlocks {
        new_size: Some(size),
        blocks: indices.iter().map(|&i| block(i, BS)).collect(),
        ..Default::default()
    };
    m.commit_blocks(f.ino, &data(&[3, 7], 8 * bs), None)
        .unwrap();
    let base = m.statfs().unwrap().bytes_used;
    let blocks_n: u64 = 1 << 40;
    let end = blocks_n * bs + 100;
    // What is reserved: statfs less the data blocks (2 at first).
    let reserved =
        |data_blocks: u64| m.statfs().unwrap().bytes_used - base - (data_blocks - 2) * bs;

    let started = std::time::Instant::now();
    m.fallocate_reserve(f.ino, 0..end, false, None).unwrap();
    let took = started.elapsed();
    assert!(took.as_millis() < 500, "a 4 PiB reservation took {took:?}");
    eprintln!("reserve of 2^40 blocks: {took:?}");
    assert_eq!(reserved(2), (blocks_n - 2) * bs + 100);
    assert_eq!(used(m, q.ino), (end, 1));
    if v.db.is_none() {
        let last = (blocks_n + 1) as i64;
        assert_eq!(
            runs(&v, f.ino),
            [(0, 3, BS as i64), (4, 7, BS as i64), (8, last, 100)]
        );
    }
    // Idempotent, and a range touching a run joins it.
    m.fallocate_reserve(f.ino, 0..end, false, None).unwrap();
    assert_eq!(reserved(2), (blocks_n - 2) * bs + 100);

    // Written at scattered blocks: each ends its reservation.
    let started = std::time::Instant::now();
    m.commit_blocks(f.ino, &data(&[1, 5, 100, 101, 5000], 5001 * bs), None)
        .unwrap();
    eprintln!("commit of 5 blocks into it: {:?}", started.elapsed());
    assert_eq!(reserved(7), (blocks_n - 7) * bs + 100);
    assert_eq!(used(m, q.ino), (end, 1));
    // A punch releases the whole blocks of its range.
    m.release_reserved(f.ino, 50 * bs + 1..200 * bs, None)
        .unwrap();
    assert_eq!(reserved(7), (blocks_n - 7 - 147) * bs + 100);
    // A truncate what is past the new size, clamping the last block.
    let started = std::time::Instant::now();
    resize(m, f.ino, 1000 * bs + 10).unwrap();
    eprintln!("truncate below it: {:?}", started.elapsed());
    // Reserved: 0, 2, 4, 6, 8..51, 200..1000 whole, 10 bytes of 1000;
    // block 5000 went with the truncate.
    assert_eq!(reserved(6), (4 + 43 + 800) * bs + 10);
    assert_eq!(used(m, q.ino), (1000 * bs + 10, 1));
    if v.db.is_none() {
        let whole = BS as i64;
        assert_eq!(
            runs(&v, f.ino),
            [
                (0, 1, whole),
                (2, 3, whole),
                (4, 5, whole),
                (6, 7, whole),
                (8, 51, whole),
                (200, 1001, 10)
            ]
        );
    }
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // Reserved again past the end (KEEP_SIZE), then gone with the inode.
    m.fallocate_reserve(f.ino, 0..end, false, None).unwrap();
    assert_eq!(used(m, q.ino), (end, 1));
    assert!(m.recount_quotas(false).unwrap().is_empty());
    m.unlink(q.ino, n("f"), None).unwrap();
    m.reclaim(f.ino, None).unwrap();
    assert_eq!(used(m, q.ino), (0, 0));
    assert_eq!(m.statfs().unwrap().bytes_used, base - 2 * bs);
}

/// A SQLite volume of a build that kept a row per reserved block (the
/// `reservations` table): opening converts them into runs, which count and
/// end as before.
#[test]
fn per_block_reservations_of_an_earlier_build_are_read_after_open() {
    let v = fresh_sqlite();
    let bs = u64::from(BS);
    let f = file(v.meta.as_ref(), ROOT_INO, "f");
    let base = v.meta.statfs().unwrap().bytes_used;
    raw(&v)
        .execute_batch(
            "CREATE TABLE reservations (
                 ino INTEGER NOT NULL REFERENCES inodes(ino) ON DELETE CASCADE,
                 idx INTEGER NOT NULL,
                 len INTEGER NOT NULL,
                 PRIMARY KEY (ino, idx)
             ) WITHOUT ROWID;",
        )
        .unwrap();
    raw_exec(
        &v,
        "INSERT INTO reservations (ino, idx, len) VALUES (?1, 0, 4096), (?1, 1, 4096), (?1, 2, 100)",
        &[f.ino as i64],
    );
    let v = v.reopen();
    let m = v.meta.as_ref();
    assert_eq!(m.statfs().unwrap().bytes_used - base, 2 * bs + 100);
    let whole = BS as i64;
    assert_eq!(runs(&v, f.ino), [(0, 1, whole), (1, 2, whole), (2, 3, 100)]);
    // KEEP_SIZE's quota: up to the last one's end.
    let q = m.set_quota(ROOT_INO, None, None).unwrap();
    assert_eq!(q.used.bytes, 2 * bs + 100);
    // A write ends the reservation of its block.
    let c = CommitBlocks {
        new_size: Some(2 * bs),
        blocks: vec![block(1, BS)],
        ..Default::default()
    };
    m.commit_blocks(f.ino, &c, None).unwrap();
    assert_eq!(m.statfs().unwrap().bytes_used - base, 2 * bs + 100);
    assert_eq!(runs(&v, f.ino), [(0, 1, whole), (2, 3, 100)]);
    let count: i64 = raw(&v)
        .query_row("SELECT COUNT(*) FROM reservations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 0, "converted rows leave the old table");
}
