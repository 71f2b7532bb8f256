//! Block map: commit, replace, punch, truncate via setattr and via
//! commit_blocks, released-object accounting and the row limits.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::limits::{
    BLOCKS_QUERY_COUNT_MAX, COMMIT_BLOCKS_ROWS_MAX, FILE_SIZE_BYTES_MAX, INLINE_STORED_BYTES_MAX,
};
use baton_meta::{
    BlockRef, CommitBlocks, MetaError, MetaStore, ObjectRef, SetAttr, ShareBlocks, TimeOrNow,
    Timespec, INLINE_KEY_PREFIX, ROOT_INO,
};
use common::*;

fn blk(index: u64, key: &str, len: u32) -> BlockRef {
    BlockRef {
        index,
        object_key: key.into(),
        len,
        inline: None,
    }
}

fn keys(v: &[&str]) -> Vec<ObjectRef> {
    v.iter().map(|k| ObjectRef { key: (*k).into() }).collect()
}

fn write(m: &dyn MetaStore, ino: u64, size: u64, blocks: Vec<BlockRef>) -> Vec<ObjectRef> {
    let c = CommitBlocks {
        new_size: Some(size),
        mtime: Some(TimeOrNow::Now),
        ctime: Some(TimeOrNow::Now),
        blocks,
        punched: vec![],
    };
    m.commit_blocks(ino, &c, None).unwrap().1
}

const B: u64 = BS as u64;

/// Under the writeback cache the kernel sets the times of written data;
/// a commit that gives none leaves both.
#[test]
fn a_commit_without_times_leaves_mtime_and_ctime() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let t = Timespec { sec: 1000, nsec: 5 };
    let set = SetAttr {
        mtime: Some(TimeOrNow::At(t)),
        ctime: Some(t),
        ..Default::default()
    };
    m.setattr(f.ino, &set, None).unwrap();
    let c = CommitBlocks {
        new_size: Some(B + 1),
        blocks: vec![blk(0, "a", BS), blk(1, "b", 1)],
        ..Default::default()
    };
    let (a, _) = m.commit_blocks(f.ino, &c, None).unwrap();
    assert_eq!((a.size, a.mtime, a.ctime), (B + 1, t, t));
}

#[test]
fn commit_sets_rows_size_and_times() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let t = Timespec { sec: 1000, nsec: 5 };
    let c = CommitBlocks {
        new_size: Some(2 * B + 1),
        mtime: Some(TimeOrNow::At(t)),
        ctime: Some(TimeOrNow::Now),
        blocks: vec![blk(0, "a", BS), blk(2, "c", 1)],
        punched: vec![],
    };
    let (a, released) = m.commit_blocks(f.ino, &c, None).unwrap();
    assert!(released.is_empty());
    assert_eq!(a.size, 2 * B + 1);
    assert_eq!(a.mtime, t);
    assert!(a.ctime > t);
    assert_eq!(m.getattr(f.ino).unwrap(), a);
    // Index 1 is a hole.
    assert_eq!(
        m.blocks(f.ino, 0, 10).unwrap(),
        vec![blk(0, "a", BS), blk(2, "c", 1)]
    );
    assert_eq!(m.blocks(f.ino, 1, 1).unwrap(), vec![]);
    assert_eq!(m.blocks(f.ino, 2, 1).unwrap(), vec![blk(2, "c", 1)]);
    assert_eq!(m.blocks(f.ino, u64::MAX, 10).unwrap(), vec![]);
}

#[test]
fn replacing_and_punching_release_only_unreferenced_objects() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let g = file(m, ROOT_INO, "g");
    write(
        m,
        f.ino,
        3 * B,
        vec![blk(0, "a", BS), blk(1, "b", BS), blk(2, "shared", BS)],
    );
    write(m, g.ino, B, vec![blk(0, "shared", BS)]);
    // Replace block 0 with a new object and block 1 with the same one.
    let released = write(m, f.ino, 3 * B, vec![blk(0, "a2", BS), blk(1, "b", BS)]);
    assert_eq!(released, keys(&["a"]));
    // Punch block 2: "shared" is still used by g, so it is not released.
    let c = CommitBlocks {
        punched: vec![2, 7],
        ..Default::default()
    };
    let (a, released) = m.commit_blocks(f.ino, &c, None).unwrap();
    assert!(released.is_empty());
    assert_eq!(a.size, 3 * B, "size unchanged without new_size");
    assert_eq!(
        m.blocks(f.ino, 0, 10).unwrap(),
        vec![blk(0, "a2", BS), blk(1, "b", BS)]
    );
    // Reclaiming g releases "shared" now that nothing uses it.
    m.unlink(ROOT_INO, n("g"), None).unwrap();
    assert_eq!(m.reclaim(g.ino, None).unwrap(), keys(&["shared"]));
}

#[test]
fn truncate_drops_whole_blocks_and_reports_the_partial_one() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    write(
        m,
        f.ino,
        3 * B,
        vec![blk(0, "a", BS), blk(1, "b", BS), blk(2, "c", BS)],
    );
    let before = m.getattr(f.ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let set = SetAttr {
        size: Some(B + 100),
        ..Default::default()
    };
    let (a, t) = m.setattr(f.ino, &set, None).unwrap();
    assert_eq!(a.size, B + 100);
    assert!(a.mtime > before.mtime && a.ctime > before.ctime);
    assert_eq!(t.released, keys(&["c"]));
    assert_eq!(t.partial_block, Some(1));
    // The partial row is clamped to the new end of file.
    assert_eq!(
        m.blocks(f.ino, 0, 10).unwrap(),
        vec![blk(0, "a", BS), blk(1, "b", 100)]
    );
    // Truncating on a block boundary leaves no partial block.
    let set = SetAttr {
        size: Some(B),
        ..Default::default()
    };
    let (_, t) = m.setattr(f.ino, &set, None).unwrap();
    assert_eq!((t.released, t.partial_block), (keys(&["b"]), None));
    // Growing changes no rows.
    let set = SetAttr {
        size: Some(10 * B),
        ..Default::default()
    };
    let (a, t) = m.setattr(f.ino, &set, None).unwrap();
    assert_eq!(a.size, 10 * B);
    assert_eq!(t, Default::default());
    assert_eq!(m.blocks(f.ino, 0, 100).unwrap(), vec![blk(0, "a", BS)]);
    // Truncating inside a hole reports nothing partial.
    let set = SetAttr {
        size: Some(5 * B + 1),
        ..Default::default()
    };
    assert_eq!(m.setattr(f.ino, &set, None).unwrap().1.partial_block, None);
    // Truncate to zero releases everything.
    let set = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(
        m.setattr(f.ino, &set, None).unwrap().1.released,
        keys(&["a"])
    );
    assert_eq!(m.statfs().unwrap().bytes_used, 0);
}

#[test]
fn commit_with_smaller_size_truncates_first() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    write(
        m,
        f.ino,
        3 * B,
        vec![blk(0, "a", BS), blk(1, "b", BS), blk(2, "c", BS)],
    );
    let released = write(m, f.ino, 50, vec![blk(0, "z", 50)]);
    assert_eq!(released, keys(&["a", "b", "c"]));
    assert_eq!(m.blocks(f.ino, 0, 10).unwrap(), vec![blk(0, "z", 50)]);
}

#[test]
fn commit_refuses_rows_past_the_size_and_bad_lengths() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let past = CommitBlocks {
        blocks: vec![blk(0, "a", 10)],
        ..Default::default()
    };
    let e = m.commit_blocks(f.ino, &past, None).unwrap_err();
    assert!(matches!(e, MetaError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("new_size"), "{e}");
    for len in [0, BS + 1] {
        let c = CommitBlocks {
            new_size: Some(10 * B),
            blocks: vec![blk(0, "a", len)],
            ..Default::default()
        };
        assert_eq!(
            m.commit_blocks(f.ino, &c, None).unwrap_err().errno(),
            libc::EINVAL
        );
    }
    let huge = CommitBlocks {
        new_size: Some(FILE_SIZE_BYTES_MAX + 1),
        ..Default::default()
    };
    assert_eq!(
        m.commit_blocks(f.ino, &huge, None).unwrap_err().errno(),
        libc::EFBIG
    );
    let far = CommitBlocks {
        new_size: Some(FILE_SIZE_BYTES_MAX),
        blocks: vec![blk(u64::MAX / B, "x", 1)],
        ..Default::default()
    };
    assert_eq!(
        m.commit_blocks(f.ino, &far, None).unwrap_err().errno(),
        libc::EFBIG
    );
    // Nothing of the failed commits stuck.
    assert_eq!(m.getattr(f.ino).unwrap().size, 0);
    assert!(m.blocks(f.ino, 0, 10).unwrap().is_empty());
}

#[test]
fn block_operations_need_a_regular_file() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let c = CommitBlocks::default();
    assert_eq!(
        m.commit_blocks(d.ino, &c, None).unwrap_err().errno(),
        libc::EISDIR
    );
    assert_eq!(m.blocks(d.ino, 0, 1).unwrap_err().errno(), libc::EISDIR);
    let s = mk(m, ROOT_INO, "s", baton_meta::FileKind::Symlink);
    assert_eq!(m.blocks(s.ino, 0, 1).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(m.blocks(999, 0, 1).unwrap_err().errno(), libc::ENOENT);
    let set = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(
        m.setattr(d.ino, &set, None).unwrap_err().errno(),
        libc::EISDIR
    );
    let f = file(m, ROOT_INO, "f");
    let set = SetAttr {
        size: Some(FILE_SIZE_BYTES_MAX + 1),
        ..Default::default()
    };
    assert_eq!(
        m.setattr(f.ino, &set, None).unwrap_err().errno(),
        libc::EFBIG
    );
}

#[test]
fn row_limits_are_enforced() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let rows = |from: u64, count: u64| -> Vec<BlockRef> {
        (from..from + count)
            .map(|i| blk(i, &format!("k{i}"), BS))
            .collect()
    };
    let too_many = CommitBlocks {
        new_size: Some((COMMIT_BLOCKS_ROWS_MAX as u64 + 1) * B),
        blocks: rows(0, COMMIT_BLOCKS_ROWS_MAX as u64 + 1),
        ..Default::default()
    };
    assert_eq!(
        m.commit_blocks(f.ino, &too_many, None).unwrap_err().errno(),
        libc::EINVAL
    );
    let max = COMMIT_BLOCKS_ROWS_MAX as u64;
    write(m, f.ino, (max + 10) * B, rows(0, max));
    write(m, f.ino, (max + 10) * B, rows(max, 10));
    let got = m.blocks(f.ino, 0, u32::MAX).unwrap();
    assert_eq!(got.len(), BLOCKS_QUERY_COUNT_MAX as usize);
    assert_eq!(m.blocks(f.ino, max, 100).unwrap().len(), 10);
}

#[test]
fn scan_blocks_pages_through_every_row_of_the_volume_in_order() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a").ino;
    let b = file(m, ROOT_INO, "b").ino;
    write(
        m,
        a,
        3 * B,
        vec![blk(0, "a0", BS), blk(1, "a1", BS), blk(2, "a2", BS)],
    );
    write(m, b, B + 1, vec![blk(0, "b0", BS), blk(1, "b1", 1)]);
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = m.scan_blocks(after, 2).unwrap();
        assert!(page.len() <= 2, "the limit holds");
        let Some((ino, last)) = page.last() else {
            break;
        };
        after = Some((*ino, last.index));
        seen.extend(
            page.into_iter()
                .map(|(ino, r)| (ino, r.index, r.object_key, r.len)),
        );
    }
    let want = vec![
        (a, 0, "a0".to_string(), BS),
        (a, 1, "a1".to_string(), BS),
        (a, 2, "a2".to_string(), BS),
        (b, 0, "b0".to_string(), BS),
        (b, 1, "b1".to_string(), 1),
    ];
    assert_eq!(seen, want);
    assert!(m.scan_blocks(Some((b, 1)), 10).unwrap().is_empty());
    assert_eq!(m.scan_blocks(None, u32::MAX).unwrap().len(), 5);
}

#[test]
fn lookup_and_getattr_plus_count_the_committed_bytes_below_the_size() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    write(m, f.ino, 3 * B + 7, vec![blk(0, "a", BS), blk(3, "d", 7)]);
    let (attr, bytes) = m.lookup_plus(ROOT_INO, n("f")).unwrap();
    assert_eq!(attr, m.getattr(f.ino).unwrap());
    assert_eq!(bytes, B + 7, "block 0 and the tail; blocks 1-2 are a hole");
    assert_eq!(m.getattr_plus(f.ino).unwrap(), (attr, bytes));
    // `.` resolves through the other path, and a directory has no blocks.
    assert_eq!(m.lookup_plus(ROOT_INO, n(".")).unwrap().1, 0);
    assert_eq!(
        m.lookup_plus(ROOT_INO, n("missing")).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(m.getattr_plus(999_999).unwrap_err().errno(), libc::ENOENT);
}

/// READ's one-snapshot read: the attributes and the rows `blocks` gives;
/// a directory has its attributes and no rows.
#[test]
fn read_plan_gives_attributes_and_the_rows_of_the_range() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    write(m, f.ino, 2 * B + 7, vec![blk(0, "a", BS), blk(2, "c", 7)]);
    let (attr, rows) = m.read_plan(f.ino, 0, 3).unwrap();
    assert_eq!(attr.size, 2 * B + 7);
    assert_eq!(rows, m.blocks(f.ino, 0, 3).unwrap());
    assert_eq!(rows, vec![blk(0, "a", BS), blk(2, "c", 7)]);
    let (_, tail) = m.read_plan(f.ino, 1, 2).unwrap();
    assert_eq!(tail, vec![blk(2, "c", 7)]);
    let (root, none) = m.read_plan(ROOT_INO, 0, 1).unwrap();
    assert_eq!(root.kind, baton_meta::FileKind::Directory);
    assert!(none.is_empty());
}

fn share(src: u64, src_first: u64, first: u64, count: u64, size_min: u64) -> ShareBlocks {
    ShareBlocks {
        source: src,
        source_first_index: src_first,
        first_index: first,
        count,
        size_min,
        copied_bytes: count * B,
    }
}

/// A shared object stays while any row names it: overwriting either side,
/// truncating the destination or reclaiming the source releases only what
/// no row names any more, and the last row to go releases it.
#[test]
fn shared_objects_are_released_only_by_their_last_row() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a");
    let b = file(m, ROOT_INO, "b");
    write(
        m,
        a.ino,
        3 * B,
        vec![blk(0, "k0", BS), blk(1, "k1", BS), blk(2, "k2", BS)],
    );
    write(m, b.ino, B + 5, vec![blk(0, "old0", BS), blk(1, "old1", 5)]);
    // a's blocks 0..3 to b's 1..4: b's old row 1 is released, row 0 kept.
    let (attr, released) = m
        .share_blocks(b.ino, &share(a.ino, 0, 1, 3, 4 * B), None)
        .unwrap();
    assert_eq!(released, keys(&["old1"]));
    assert_eq!(attr.size, 4 * B);
    let rows: Vec<String> = m
        .blocks(b.ino, 0, 8)
        .unwrap()
        .into_iter()
        .map(|r| r.object_key)
        .collect();
    assert_eq!(rows, ["old0", "k0", "k1", "k2"]);
    // Overwriting a source row: still named by b.
    assert!(write(m, a.ino, 3 * B, vec![blk(0, "n0", BS)]).is_empty());
    // Overwriting b's copy of it: the last row goes.
    assert_eq!(
        write(m, b.ino, 4 * B, vec![blk(1, "m1", BS)]),
        keys(&["k0"])
    );
    // Truncating b releases k2? No: a still names it.
    let set = SetAttr {
        size: Some(3 * B),
        ..Default::default()
    };
    let (_, t) = m.setattr(b.ino, &set, None).unwrap();
    assert!(t.released.is_empty(), "{:?}", t.released);
    // Reclaiming a releases what b does not name.
    m.unlink(ROOT_INO, n("a"), None).unwrap();
    let mut gone = m.reclaim(a.ino, None).unwrap();
    gone.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(gone, keys(&["k2", "n0"]));
    let rows: Vec<String> = m
        .blocks(b.ino, 0, 8)
        .unwrap()
        .into_iter()
        .map(|r| r.object_key)
        .collect();
    assert_eq!(rows, ["old0", "m1", "k1"]);
}

/// A hole in the source punches the destination; sharing the same rows
/// again releases nothing; a share within one file works off its own range.
#[test]
fn a_share_copies_holes_and_is_idempotent() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a");
    let b = file(m, ROOT_INO, "b");
    write(m, a.ino, 3 * B, vec![blk(0, "k0", BS), blk(2, "k2", 7)]);
    write(
        m,
        b.ino,
        3 * B,
        vec![blk(0, "x0", BS), blk(1, "x1", BS), blk(2, "x2", BS)],
    );
    let s = share(a.ino, 0, 0, 3, 0);
    let (attr, released) = m.share_blocks(b.ino, &s, None).unwrap();
    assert_eq!(released, keys(&["x0", "x1", "x2"]));
    assert_eq!(attr.size, 3 * B, "a share never shrinks");
    let got = m.blocks(b.ino, 0, 8).unwrap();
    assert_eq!(got, vec![blk(0, "k0", BS), blk(2, "k2", 7)]);
    assert!(m.share_blocks(b.ino, &s, None).unwrap().1.is_empty());
    // Within a: block 0 to block 5 (the file grows), never over itself.
    let (attr, released) = m
        .share_blocks(a.ino, &share(a.ino, 0, 5, 1, 6 * B), None)
        .unwrap();
    assert!(released.is_empty());
    assert_eq!(attr.size, 6 * B);
    assert_eq!(m.blocks(a.ino, 5, 1).unwrap(), vec![blk(5, "k0", BS)]);
    let err = m
        .share_blocks(a.ino, &share(a.ino, 0, 1, 2, 6 * B), None)
        .unwrap_err();
    assert!(matches!(err, MetaError::InvalidArgument { .. }), "{err}");
}

/// Refused: a source range past the source's size, a destination range
/// past the size the share sets, more blocks than one commit takes.
#[test]
fn a_share_outside_the_files_is_refused() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a");
    let b = file(m, ROOT_INO, "b");
    write(
        m,
        a.ino,
        2 * B - 1,
        vec![blk(0, "k0", BS), blk(1, "k1", BS - 1)],
    );
    for s in [
        share(a.ino, 0, 0, 2, 2 * B),
        share(a.ino, 0, 0, 1, B - 1),
        share(
            a.ino,
            0,
            0,
            COMMIT_BLOCKS_ROWS_MAX as u64 + 1,
            FILE_SIZE_BYTES_MAX,
        ),
    ] {
        let err = m.share_blocks(b.ino, &s, None).unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument { .. }),
            "{s:?}: {err}"
        );
    }
    assert_eq!(m.getattr(b.ino).unwrap().size, 0);
    assert!(m.blocks(b.ino, 0, 4).unwrap().is_empty());
}

fn inline_blk(index: u64, name: &str, bytes: &[u8]) -> BlockRef {
    BlockRef {
        index,
        object_key: format!("{INLINE_KEY_PREFIX}{name}"),
        len: bytes.len() as u32,
        inline: Some(bytes.to_vec()),
    }
}

/// An inline block's bytes live in its row: read back with it, copied by a
/// share, and gone with it. Its key names no object, so replacing,
/// truncating or reclaiming one never releases anything to delete.
#[test]
fn inline_blocks_keep_their_bytes_in_the_row_and_release_no_object() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a");
    assert!(write(m, a.ino, 5, vec![inline_blk(0, "x", b"hello")]).is_empty());
    assert_eq!(
        m.blocks(a.ino, 0, 4).unwrap(),
        vec![inline_blk(0, "x", b"hello")]
    );
    let (attr, rows) = m.read_plan(a.ino, 0, 1).unwrap();
    assert_eq!(attr.size, 5);
    assert_eq!(rows[0].inline.as_deref(), Some(&b"hello"[..]));
    // Replaced by an object: the inline key is not released.
    assert!(write(m, a.ino, 10, vec![blk(0, "obj", 10)]).is_empty());
    assert_eq!(m.blocks(a.ino, 0, 1).unwrap(), vec![blk(0, "obj", 10)]);
    // Replaced by inline bytes again: the object is.
    assert_eq!(
        write(m, a.ino, 2 * B, vec![inline_blk(0, "y", b"abc")]),
        keys(&["obj"])
    );
    // A share copies the row, bytes and all.
    let b = file(m, ROOT_INO, "b");
    let (_, released) = m
        .share_blocks(b.ino, &share(a.ino, 0, 0, 1, B), None)
        .unwrap();
    assert!(released.is_empty());
    assert_eq!(
        m.blocks(b.ino, 0, 1).unwrap(),
        vec![inline_blk(0, "y", b"abc")]
    );
    // Truncating clamps the row's length; the bytes past it are not read.
    let set = SetAttr {
        size: Some(1),
        ..Default::default()
    };
    let (_, t) = m.setattr(a.ino, &set, None).unwrap();
    assert!(t.released.is_empty(), "{:?}", t.released);
    assert_eq!(m.blocks(a.ino, 0, 1).unwrap()[0].len, 1);
    // Reclaiming either file releases nothing; the other keeps its copy.
    m.unlink(ROOT_INO, n("a"), None).unwrap();
    assert!(m.reclaim(a.ino, None).unwrap().is_empty());
    assert_eq!(
        m.blocks(b.ino, 0, 1).unwrap(),
        vec![inline_blk(0, "y", b"abc")]
    );
    // The whole-volume scan (fsck) sees the bytes too.
    let scanned = m.scan_blocks(None, 10).unwrap();
    assert_eq!(scanned, vec![(b.ino, inline_blk(0, "y", b"abc"))]);
}

/// Inline bytes need an inline key and the reverse; an oversized inline
/// block is refused; nothing of a refused commit is applied.
#[test]
fn commit_refuses_inline_blocks_that_do_not_add_up() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let mut bytes_under_object_key = blk(0, "k", 3);
    bytes_under_object_key.inline = Some(b"abc".to_vec());
    let mut inline_key_without_bytes = inline_blk(0, "x", b"abc");
    inline_key_without_bytes.inline = None;
    let huge = vec![7u8; INLINE_STORED_BYTES_MAX + 1];
    let mut oversized = inline_blk(0, "big", &huge);
    oversized.len = BS.min(1000);
    for bad in [bytes_under_object_key, inline_key_without_bytes, oversized] {
        let c = CommitBlocks {
            new_size: Some(B),
            blocks: vec![bad.clone()],
            ..Default::default()
        };
        let err = m.commit_blocks(f.ino, &c, None).unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument { .. }),
            "{bad:?}: {err}"
        );
    }
    assert!(m.blocks(f.ino, 0, 1).unwrap().is_empty());
    assert_eq!(m.getattr(f.ino).unwrap().size, 0);
}
