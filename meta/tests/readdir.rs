//! readdir: `.` and `..` first, limits, and cookies that stay valid while
//! entries are removed or added mid-listing.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::limits::READDIR_ENTRIES_MAX;
use baton_meta::{FileKind, ROOT_INO};
use common::*;

#[test]
fn dot_entries_come_first_with_offsets_one_and_two() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    let s = mk(m, d.ino, "s", FileKind::Symlink);
    let all = m.readdir(d.ino, 0, 100).unwrap();
    let summary: Vec<_> = all
        .iter()
        .map(|e| (e.name.to_str().unwrap().to_owned(), e.ino, e.kind))
        .collect();
    assert_eq!(
        summary,
        vec![
            (".".to_owned(), d.ino, FileKind::Directory),
            ("..".to_owned(), ROOT_INO, FileKind::Directory),
            ("f".to_owned(), f.ino, FileKind::Regular),
            ("s".to_owned(), s.ino, FileKind::Symlink),
        ]
    );
    assert_eq!((all[0].offset_next, all[1].offset_next), (1, 2));
    assert!(all[2].offset_next > 2 && all[3].offset_next > all[2].offset_next);
    // Root's .. is root.
    assert_eq!(m.readdir(ROOT_INO, 1, 1).unwrap()[0].ino, ROOT_INO);
    // Resuming after each entry gives the rest.
    for (i, e) in all.iter().enumerate() {
        assert_eq!(
            m.readdir(d.ino, e.offset_next, 100).unwrap(),
            all[i + 1..].to_vec()
        );
    }
    assert!(m.readdir(d.ino, 0, 0).unwrap().is_empty());
    assert_eq!(m.readdir(f.ino, 0, 10).unwrap_err().errno(), libc::ENOTDIR);
    assert_eq!(m.readdir(999, 0, 10).unwrap_err().errno(), libc::ENOENT);
}

#[test]
fn cookies_stay_valid_when_entries_are_removed_mid_listing() {
    let v = fresh();
    let m = v.meta.as_ref();
    for i in 0..10 {
        file(m, ROOT_INO, &format!("f{i}"));
    }
    let first = m.readdir(ROOT_INO, 0, 5).unwrap();
    let last_name = first[4].name.to_str().unwrap().to_owned();
    assert_eq!(last_name, "f2");
    // Remove the entry we stopped at, one before it and one after it; add one.
    m.unlink(ROOT_INO, n("f2"), None).unwrap();
    m.unlink(ROOT_INO, n("f0"), None).unwrap();
    m.unlink(ROOT_INO, n("f5"), None).unwrap();
    file(m, ROOT_INO, "new");
    let rest: Vec<_> = m
        .readdir(ROOT_INO, first[4].offset_next, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name.into_string().unwrap())
        .collect();
    assert_eq!(rest, vec!["f3", "f4", "f6", "f7", "f8", "f9", "new"]);
}

#[test]
fn rename_moves_an_entry_to_the_end_of_its_new_listing() {
    let v = fresh();
    let m = v.meta.as_ref();
    file(m, ROOT_INO, "a");
    file(m, ROOT_INO, "b");
    m.rename(ROOT_INO, n("a"), ROOT_INO, n("c"), Default::default(), None)
        .unwrap();
    assert_eq!(names(m, ROOT_INO), vec!["b", "c"]);
}

#[test]
fn limit_is_clamped_to_readdir_entries_max() {
    let v = fresh();
    // Bulk-load entries in one transaction: thousands of fsynced creates
    // would only slow the test down.
    raw_bulk_files(&v, READDIR_ENTRIES_MAX + 10);
    let got = v.meta.readdir(ROOT_INO, 0, u32::MAX).unwrap();
    assert_eq!(got.len(), READDIR_ENTRIES_MAX as usize);
    let rest = v
        .meta
        .readdir(ROOT_INO, got[got.len() - 1].offset_next, u32::MAX)
        .unwrap();
    assert_eq!(rest.len(), 12);
}

#[test]
fn readdir_plus_lists_the_same_entries_with_attributes_and_committed_bytes() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    let s = mk(m, d.ino, "s", FileKind::Symlink);
    let sub = dir(m, d.ino, "sub");
    let bs = u64::from(BS);
    let blocks = |pairs: &[(u64, u32)]| {
        pairs
            .iter()
            .map(|&(index, len)| baton_meta::BlockRef {
                index,
                object_key: format!("k{index}"),
                len,
                inline: None,
            })
            .collect()
    };
    let commit = baton_meta::CommitBlocks {
        new_size: Some(2 * bs + 10),
        mtime: Some(baton_meta::TimeOrNow::Now),
        ctime: Some(baton_meta::TimeOrNow::Now),
        blocks: blocks(&[(0, BS), (2, 10)]),
        punched: vec![],
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    let plain = m.readdir(d.ino, 0, 100).unwrap();
    let plus = m.readdir_plus(d.ino, 0, 100).unwrap();
    assert_eq!(
        plus.iter().map(|p| p.entry.clone()).collect::<Vec<_>>(),
        plain,
        "the same entries and cookies as readdir"
    );
    assert!(plus[0].attr.is_none() && plus[1].attr.is_none(), ". and ..");
    for p in &plus[2..] {
        assert_eq!(p.attr.as_ref(), Some(&m.getattr(p.entry.ino).unwrap()));
    }
    let bytes: Vec<(u64, u64)> = plus[2..]
        .iter()
        .map(|p| (p.entry.ino, p.committed_bytes))
        .collect();
    assert_eq!(
        bytes,
        vec![(f.ino, bs + 10), (s.ino, 0), (sub.ino, 0)],
        "a hole counts nothing"
    );
    // Resuming after an entry, and a limit, as readdir.
    let after_f = m.readdir_plus(d.ino, plain[2].offset_next, 1).unwrap();
    assert_eq!(after_f.len(), 1);
    assert_eq!(after_f[0].entry, plain[3]);
    assert_eq!(
        m.readdir_plus(f.ino, 0, 10).unwrap_err().errno(),
        libc::ENOTDIR
    );
}
