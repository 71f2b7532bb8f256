//! rename: plain moves, replacement rules, RENAME_NOREPLACE,
//! RENAME_EXCHANGE, moving a directory into its own subtree, same-inode
//! no-ops and `..` link-count fixups.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{FileKind, MetaError, MetaStore, RenameFlags, ROOT_INO};
use common::*;

const PLAIN: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
};
const NOREPLACE: RenameFlags = RenameFlags {
    noreplace: true,
    exchange: false,
};
const EXCHANGE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: true,
};

fn nlink(m: &dyn MetaStore, ino: u64) -> u32 {
    m.getattr(ino).unwrap().nlink
}

#[test]
fn rename_file_within_and_across_directories() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, ROOT_INO, "f");
    let r = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n("g"), PLAIN, None)
        .unwrap();
    assert_eq!(r.replaced, None);
    assert_eq!(m.lookup(ROOT_INO, n("g")).unwrap().ino, f.ino);
    assert_eq!(
        m.lookup(ROOT_INO, n("f")).unwrap_err().errno(),
        libc::ENOENT
    );
    m.rename(ROOT_INO, n("g"), d.ino, n("h"), PLAIN, None)
        .unwrap();
    assert_eq!(names(m, d.ino), vec!["h"]);
    assert_eq!(names(m, ROOT_INO), vec!["d"]);
    assert_eq!(
        nlink(m, d.ino),
        2,
        "moving a file changes no directory nlink"
    );
}

#[test]
fn rename_directory_fixes_dotdot_link_counts() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = dir(m, ROOT_INO, "a");
    let b = dir(m, ROOT_INO, "b");
    let c = dir(m, a.ino, "c");
    assert_eq!((nlink(m, ROOT_INO), nlink(m, a.ino)), (4, 3));
    m.rename(a.ino, n("c"), b.ino, n("c"), PLAIN, None).unwrap();
    assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (2, 3));
    assert_eq!(m.lookup(c.ino, n("..")).unwrap().ino, b.ino);
    let dots = m.readdir(c.ino, 0, 2).unwrap();
    assert_eq!(dots[1].ino, b.ino);
}

#[test]
fn rename_replaces_a_file_and_orphans_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let g = file(m, ROOT_INO, "g");
    let r = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n("g"), PLAIN, None)
        .unwrap();
    let u = r.replaced.unwrap();
    assert_eq!(
        (u.ino, u.nlink_after, u.kind),
        (g.ino, 0, FileKind::Regular)
    );
    assert_eq!(m.orphans().unwrap(), vec![g.ino]);
    assert_eq!(m.lookup(ROOT_INO, n("g")).unwrap().ino, f.ino);
    assert_eq!(names(m, ROOT_INO), vec!["g"]);
}

#[test]
fn rename_replacing_a_hard_linked_file_keeps_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    file(m, ROOT_INO, "f");
    let g = file(m, ROOT_INO, "g");
    m.link(g.ino, ROOT_INO, n("g2"), None).unwrap();
    let u = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n("g"), PLAIN, None)
        .unwrap()
        .replaced
        .unwrap();
    assert_eq!(u.nlink_after, 1);
    assert!(m.orphans().unwrap().is_empty());
}

#[test]
fn rename_directory_over_empty_directory() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = dir(m, ROOT_INO, "a");
    let b = dir(m, ROOT_INO, "b");
    let c = dir(m, a.ino, "c");
    assert_eq!(nlink(m, ROOT_INO), 4);
    let u = m
        .rename(a.ino, n("c"), ROOT_INO, n("b"), PLAIN, None)
        .unwrap()
        .replaced
        .unwrap();
    assert_eq!(
        (u.ino, u.nlink_after, u.kind),
        (b.ino, 0, FileKind::Directory)
    );
    assert_eq!(m.lookup(ROOT_INO, n("b")).unwrap().ino, c.ino);
    // Root: lost b, gained c. a: lost c.
    assert_eq!((nlink(m, ROOT_INO), nlink(m, a.ino)), (4, 2));
    assert_eq!(m.orphans().unwrap(), vec![b.ino]);
}

#[test]
fn rename_type_mismatches_and_non_empty_target() {
    let v = fresh();
    let m = v.meta.as_ref();
    dir(m, ROOT_INO, "d");
    let full = dir(m, ROOT_INO, "full");
    file(m, full.ino, "x");
    file(m, ROOT_INO, "f");
    let e = m
        .rename(ROOT_INO, n("d"), ROOT_INO, n("f"), PLAIN, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::NotDirectory { .. }), "{e}");
    let e = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n("d"), PLAIN, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::IsDirectory { .. }), "{e}");
    let e = m
        .rename(ROOT_INO, n("d"), ROOT_INO, n("full"), PLAIN, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::NotEmpty { .. }), "{e}");
    // Nothing changed.
    assert_eq!(names(m, ROOT_INO), vec!["d", "full", "f"]);
    assert_eq!(nlink(m, ROOT_INO), 4);
}

#[test]
fn rename_noreplace_refuses_existing_target() {
    let v = fresh();
    let m = v.meta.as_ref();
    file(m, ROOT_INO, "f");
    file(m, ROOT_INO, "g");
    let e = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n("g"), NOREPLACE, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::Exists { .. }), "{e}");
    m.rename(ROOT_INO, n("f"), ROOT_INO, n("h"), NOREPLACE, None)
        .unwrap();
    assert_eq!(names(m, ROOT_INO), vec!["g", "h"]);
    let both = RenameFlags {
        noreplace: true,
        exchange: true,
    };
    let e = m
        .rename(ROOT_INO, n("g"), ROOT_INO, n("h"), both, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn rename_exchange_swaps_entries_and_fixes_dotdot() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = dir(m, ROOT_INO, "a");
    let b = dir(m, ROOT_INO, "b");
    let sub = dir(m, a.ino, "sub");
    let f = file(m, b.ino, "f");
    m.rename(a.ino, n("sub"), b.ino, n("f"), EXCHANGE, None)
        .unwrap();
    assert_eq!(m.lookup(a.ino, n("sub")).unwrap().ino, f.ino);
    assert_eq!(m.lookup(b.ino, n("f")).unwrap().ino, sub.ino);
    assert_eq!(m.lookup(sub.ino, n("..")).unwrap().ino, b.ino);
    assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (2, 3));
    // Two files in one directory.
    let x = file(m, ROOT_INO, "x");
    let y = file(m, ROOT_INO, "y");
    m.rename(ROOT_INO, n("x"), ROOT_INO, n("y"), EXCHANGE, None)
        .unwrap();
    assert_eq!(m.lookup(ROOT_INO, n("x")).unwrap().ino, y.ino);
    assert_eq!(m.lookup(ROOT_INO, n("y")).unwrap().ino, x.ino);
    // Exchange needs both names.
    let e = m
        .rename(ROOT_INO, n("x"), ROOT_INO, n("none"), EXCHANGE, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT);
    // Exchanging two directories keeps link counts.
    m.rename(ROOT_INO, n("a"), ROOT_INO, n("b"), EXCHANGE, None)
        .unwrap();
    assert_eq!(nlink(m, ROOT_INO), 4);
}

#[test]
fn rename_directory_into_its_own_subtree_is_invalid() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = dir(m, ROOT_INO, "a");
    let b = dir(m, a.ino, "b");
    let c = dir(m, b.ino, "c");
    for target in [a.ino, b.ino, c.ino] {
        let e = m
            .rename(ROOT_INO, n("a"), target, n("x"), PLAIN, None)
            .unwrap_err();
        assert!(matches!(e, MetaError::InvalidArgument { .. }), "{e}");
    }
    let e = m
        .rename(ROOT_INO, n("a"), c.ino, n("x"), EXCHANGE, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT, "exchange target missing: {e}");
    file(m, c.ino, "x");
    let e = m
        .rename(ROOT_INO, n("a"), c.ino, n("x"), EXCHANGE, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    // Moving a subdirectory up is fine.
    m.rename(b.ino, n("c"), ROOT_INO, n("c"), PLAIN, None)
        .unwrap();
    assert_eq!(m.lookup(c.ino, n("..")).unwrap().ino, ROOT_INO);
}

#[test]
fn rename_between_names_of_the_same_inode_does_nothing() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    m.link(f.ino, ROOT_INO, n("g"), None).unwrap();
    for flags in [PLAIN, EXCHANGE] {
        let r = m
            .rename(ROOT_INO, n("f"), ROOT_INO, n("g"), flags, None)
            .unwrap();
        assert_eq!(r.replaced, None);
        assert_eq!(names(m, ROOT_INO), vec!["f", "g"]);
        assert_eq!(nlink(m, f.ino), 2);
    }
    // Renaming a name onto itself.
    m.rename(ROOT_INO, n("f"), ROOT_INO, n("f"), PLAIN, None)
        .unwrap();
    assert_eq!(names(m, ROOT_INO), vec!["f", "g"]);
}

#[test]
fn rename_errors_for_missing_and_dot_names() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let e = m
        .rename(ROOT_INO, n("nope"), ROOT_INO, n("x"), PLAIN, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT);
    let e = m
        .rename(ROOT_INO, n("f"), 999, n("x"), PLAIN, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT);
    let e = m
        .rename(ROOT_INO, n("f"), f.ino, n("x"), PLAIN, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOTDIR);
    let e = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n(".."), PLAIN, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let long = "z".repeat(256);
    let e = m
        .rename(ROOT_INO, n("f"), ROOT_INO, n(&long), PLAIN, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG);
}

#[test]
fn corrupt_parent_cycle_is_reported_not_looped() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = dir(m, ROOT_INO, "a");
    let b = dir(m, a.ino, "b");
    let d = dir(m, ROOT_INO, "d");
    // Corrupt: a's parent is b, b's parent is a (a cycle not reaching root).
    raw_exec(
        &v,
        "UPDATE inodes SET parent = ?1 WHERE ino = ?2",
        &[b.ino as i64, a.ino as i64],
    );
    let e = m
        .rename(ROOT_INO, n("d"), b.ino, n("d"), PLAIN, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::Corrupt { .. }), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(m.lookup(ROOT_INO, n("d")).unwrap().ino, d.ino);
}
