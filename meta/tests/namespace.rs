//! lookup, create (all kinds), link, unlink, rmdir, readlink, orphans and
//! reclaim, with their error cases and limits.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::limits::{NAME_LEN_MAX, NLINK_MAX, SYMLINK_TARGET_LEN_MAX};
use baton_meta::{CreateArgs, FileKind, MetaError, XattrFlags, ROOT_INO};
use common::*;

#[test]
fn create_every_kind_and_look_it_up() {
    let v = fresh();
    let m = v.meta.as_ref();
    let kinds = [
        FileKind::Regular,
        FileKind::Directory,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ];
    for (i, kind) in kinds.into_iter().enumerate() {
        let mut args = CreateArgs::new(kind, 0o640);
        args.uid = 1000;
        args.gid = 100;
        args.rdev = 0x0801;
        if kind == FileKind::Symlink {
            args.symlink_target = Some("some/where".into());
        }
        let name = format!("n{i}");
        let a = m.create(ROOT_INO, n(&name), &args, None).unwrap();
        assert_eq!(a.kind, kind);
        assert_eq!((a.uid, a.gid, a.generation), (1000, 100, 1));
        let expect_mode = if kind == FileKind::Symlink {
            0o777
        } else {
            0o640
        };
        assert_eq!(a.mode, expect_mode, "{kind:?}");
        let is_dev = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
        assert_eq!(a.rdev, if is_dev { 0x0801 } else { 0 });
        assert_eq!(a.nlink, if kind == FileKind::Directory { 2 } else { 1 });
        assert_eq!(m.lookup(ROOT_INO, n(&name)).unwrap(), a);
        assert_eq!(m.getattr(a.ino).unwrap(), a);
    }
    // Root gained exactly one subdirectory.
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 3);
}

#[test]
fn create_applies_umask_and_masks_type_bits() {
    let v = fresh();
    let mut args = CreateArgs::new(FileKind::Regular, 0o100777);
    args.umask = 0o022;
    let a = v.meta.create(ROOT_INO, n("f"), &args, None).unwrap();
    assert_eq!(a.mode, 0o755);
    assert_eq!(a.st_mode(), 0o100755);
}

#[test]
fn create_updates_parent_times() {
    let v = fresh();
    let before = v.meta.getattr(ROOT_INO).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    file(v.meta.as_ref(), ROOT_INO, "f");
    let after = v.meta.getattr(ROOT_INO).unwrap();
    assert!(after.mtime > before.mtime && after.ctime > before.ctime);
}

#[test]
fn create_errors() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let args = CreateArgs::new(FileKind::Regular, 0o644);
    let e = m.create(ROOT_INO, n("f"), &args, None).unwrap_err();
    assert!(
        matches!(e, MetaError::Exists { .. }) && e.errno() == libc::EEXIST,
        "{e}"
    );
    let e = m.create(999, n("x"), &args, None).unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT, "{e}");
    let e = m.create(f.ino, n("x"), &args, None).unwrap_err();
    assert_eq!(e.errno(), libc::ENOTDIR, "{e}");
    let long = "x".repeat(NAME_LEN_MAX + 1);
    let e = m.create(ROOT_INO, n(&long), &args, None).unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG, "{e}");
    m.create(ROOT_INO, n(&"y".repeat(NAME_LEN_MAX)), &args, None)
        .unwrap();
    for bad in ["", "a/b"] {
        let e = m.create(ROOT_INO, n(bad), &args, None).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{bad:?}: {e}");
    }
    for dot in [".", ".."] {
        let e = m.create(ROOT_INO, n(dot), &args, None).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST, "{dot}: {e}");
    }
}

#[test]
fn symlink_target_rules_and_readlink() {
    let v = fresh();
    let m = v.meta.as_ref();
    let mut args = CreateArgs::new(FileKind::Symlink, 0o777);
    let e = m.create(ROOT_INO, n("s"), &args, None).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    args.symlink_target = Some("t".repeat(SYMLINK_TARGET_LEN_MAX + 1).into());
    let e = m.create(ROOT_INO, n("s"), &args, None).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let target = "t".repeat(SYMLINK_TARGET_LEN_MAX);
    args.symlink_target = Some(target.clone().into());
    let s = m.create(ROOT_INO, n("s"), &args, None).unwrap();
    assert_eq!(s.size, SYMLINK_TARGET_LEN_MAX as u64);
    assert_eq!(m.readlink(s.ino).unwrap(), target.as_str());
    let f = file(m, ROOT_INO, "f");
    assert_eq!(m.readlink(f.ino).unwrap_err().errno(), libc::EINVAL);
    let mut not_link = CreateArgs::new(FileKind::Regular, 0o644);
    not_link.symlink_target = Some("x".into());
    assert_eq!(
        m.create(ROOT_INO, n("g"), &not_link, None)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
}

#[test]
fn setgid_directory_passes_its_group_and_bit_to_new_directories() {
    let v = fresh();
    let m = v.meta.as_ref();
    let mut args = CreateArgs::new(FileKind::Directory, 0o2775);
    args.gid = 50;
    let shared = m.create(ROOT_INO, n("shared"), &args, None).unwrap();
    assert_eq!(shared.mode, 0o2775);
    let mut child = CreateArgs::new(FileKind::Directory, 0o755);
    child.gid = 1000;
    let d = m.create(shared.ino, n("d"), &child, None).unwrap();
    assert_eq!((d.gid, d.mode), (50, 0o2755));
    child.kind = FileKind::Regular;
    child.mode = 0o644;
    let f = m.create(shared.ino, n("f"), &child, None).unwrap();
    assert_eq!((f.gid, f.mode), (50, 0o644));
    // Without setgid on the parent the caller's gid is used.
    let plain = m.create(ROOT_INO, n("plain"), &child, None).unwrap();
    assert_eq!(plain.gid, 1000);
}

#[test]
fn lookup_dot_dotdot_and_missing() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    assert_eq!(m.lookup(d.ino, n(".")).unwrap().ino, d.ino);
    assert_eq!(m.lookup(d.ino, n("..")).unwrap().ino, ROOT_INO);
    assert_eq!(m.lookup(ROOT_INO, n("..")).unwrap().ino, ROOT_INO);
    let e = m.lookup(d.ino, n("nope")).unwrap_err();
    assert!(
        matches!(e, MetaError::NotFound { ino, name: Some(_) } if ino == d.ino),
        "{e}"
    );
    assert!(e.to_string().contains("nope"), "{e}");
    assert_eq!(m.getattr(12345).unwrap_err().errno(), libc::ENOENT);
}

#[test]
fn link_adds_a_name_and_refuses_directories() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let d = dir(m, ROOT_INO, "d");
    let a = m.link(f.ino, d.ino, n("g"), None).unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(m.lookup(d.ino, n("g")).unwrap().ino, f.ino);
    let e = m.link(d.ino, ROOT_INO, n("d2"), None).unwrap_err();
    assert!(
        matches!(e, MetaError::NotPermitted { .. }) && e.errno() == libc::EPERM,
        "{e}"
    );
    assert_eq!(
        m.link(f.ino, d.ino, n("g"), None).unwrap_err().errno(),
        libc::EEXIST
    );
    assert_eq!(
        m.link(f.ino, f.ino, n("x"), None).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert_eq!(
        m.link(999, d.ino, n("x"), None).unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn link_stops_at_nlink_max() {
    let v = fresh();
    let f = file(v.meta.as_ref(), ROOT_INO, "f");
    raw_exec(
        &v,
        "UPDATE inodes SET nlink = ?1 WHERE ino = ?2",
        &[i64::from(NLINK_MAX), f.ino as i64],
    );
    let e = v.meta.link(f.ino, ROOT_INO, n("g"), None).unwrap_err();
    assert!(
        matches!(e, MetaError::TooManyLinks { .. }) && e.errno() == libc::EMLINK,
        "{e}"
    );
}

#[test]
fn unlink_last_name_makes_an_orphan_until_reclaim() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    m.link(f.ino, ROOT_INO, n("g"), None).unwrap();
    let u = m.unlink(ROOT_INO, n("f"), None).unwrap();
    assert_eq!(
        (u.ino, u.nlink_after, u.kind),
        (f.ino, 1, FileKind::Regular)
    );
    assert!(m.orphans().unwrap().is_empty());
    let e = m.reclaim(f.ino, None).unwrap_err();
    assert!(matches!(e, MetaError::StillLinked { nlink: 1, .. }), "{e}");
    let u = m.unlink(ROOT_INO, n("g"), None).unwrap();
    assert_eq!(u.nlink_after, 0);
    assert_eq!(m.orphans().unwrap(), vec![f.ino]);
    // The open file still has attributes, and can still be written.
    assert_eq!(m.getattr(f.ino).unwrap().nlink, 0);
    let commit = baton_meta::CommitBlocks {
        new_size: Some(10),
        blocks: vec![baton_meta::BlockRef {
            index: 0,
            object_key: "k".into(),
            len: 10,
            inline: None,
        }],
        ..Default::default()
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    m.setxattr(f.ino, n("user.a"), b"1", Default::default(), None)
        .unwrap();
    // Relinking an orphan is refused.
    assert_eq!(
        m.link(f.ino, ROOT_INO, n("back"), None)
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
    let released = m.reclaim(f.ino, None).unwrap();
    assert_eq!(released, vec![baton_meta::ObjectRef { key: "k".into() }]);
    assert!(m.orphans().unwrap().is_empty());
    assert_eq!(m.getattr(f.ino).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(m.reclaim(f.ino, None).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(m.statfs().unwrap().inodes_used, 1);
}

#[test]
fn unlink_errors() {
    let v = fresh();
    let m = v.meta.as_ref();
    dir(m, ROOT_INO, "d");
    let e = m.unlink(ROOT_INO, n("d"), None).unwrap_err();
    assert!(matches!(e, MetaError::IsDirectory { .. }), "{e}");
    assert_eq!(
        m.unlink(ROOT_INO, n("nope"), None).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        m.unlink(77, n("x"), None).unwrap_err().errno(),
        libc::ENOENT
    );
}

/// Every answer a lookup can give, on both paths of each engine (PostgreSQL
/// reads an entry and its parent in one statement; SQLite asks the parent
/// only after a miss), and getxattr's, which reads the inode and the value
/// in one statement.
#[test]
fn lookups_and_getxattr_tell_each_kind_of_miss_apart() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, d.ino, "f");
    for found in [
        m.lookup(d.ino, n("f")).unwrap(),
        m.lookup_plus(d.ino, n("f")).unwrap().0,
    ] {
        assert_eq!(found, m.getattr(f.ino).unwrap());
    }
    assert_eq!(m.lookup_plus(d.ino, n(".")).unwrap().0.ino, d.ino);
    assert_eq!(m.lookup_plus(d.ino, n("..")).unwrap().0.ino, ROOT_INO);
    let missing = m.lookup_plus(d.ino, n("nope")).unwrap_err();
    assert!(
        matches!(&missing, MetaError::NotFound { ino, name: Some(name) } if *ino == d.ino && name == "nope"),
        "{missing}"
    );
    for (parent, errno) in [(f.ino, libc::ENOTDIR), (999_999, libc::ENOENT)] {
        assert_eq!(
            m.lookup_plus(parent, n("x")).unwrap_err().errno(),
            errno,
            "lookup_plus in {parent}"
        );
        assert_eq!(
            m.lookup(parent, n("x")).unwrap_err().errno(),
            errno,
            "lookup in {parent}"
        );
    }
    let e = m
        .lookup_plus(d.ino, n(&"x".repeat(NAME_LEN_MAX + 1)))
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG, "{e}");

    m.setxattr(f.ino, n("user.a"), b"1", XattrFlags::default(), None)
        .unwrap();
    assert_eq!(m.getxattr(f.ino, n("user.a")).unwrap(), b"1");
    let e = m.getxattr(f.ino, n("user.b")).unwrap_err();
    assert!(matches!(e, MetaError::NoXattr { .. }), "{e}");
    let e = m.getxattr(999_999, n("user.a")).unwrap_err();
    assert!(matches!(e, MetaError::NotFound { ino: 999_999, .. }), "{e}");
}

#[test]
fn rmdir_removes_empty_directories_only() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let sub = dir(m, d.ino, "sub");
    file(m, ROOT_INO, "f");
    assert_eq!(m.getattr(d.ino).unwrap().nlink, 3);
    let e = m.rmdir(ROOT_INO, n("d"), None).unwrap_err();
    assert!(
        matches!(e, MetaError::NotEmpty { .. }) && e.errno() == libc::ENOTEMPTY,
        "{e}"
    );
    let e = m.rmdir(ROOT_INO, n("f"), None).unwrap_err();
    assert!(matches!(e, MetaError::NotDirectory { .. }), "{e}");
    assert_eq!(
        m.rmdir(ROOT_INO, n("nope"), None).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        m.rmdir(d.ino, n("."), None).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        m.rmdir(d.ino, n(".."), None).unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    let u = m.rmdir(d.ino, n("sub"), None).unwrap();
    assert_eq!(
        (u.ino, u.nlink_after, u.kind),
        (sub.ino, 0, FileKind::Directory)
    );
    assert_eq!(m.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(m.orphans().unwrap(), vec![sub.ino]);
    // A removed directory lists as empty and refuses new entries.
    assert!(m.readdir(sub.ino, 0, 100).unwrap().is_empty());
    let args = CreateArgs::new(FileKind::Regular, 0o644);
    assert_eq!(
        m.create(sub.ino, n("x"), &args, None).unwrap_err().errno(),
        libc::ENOENT
    );
    m.rmdir(ROOT_INO, n("d"), None).unwrap();
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 2);
    assert!(m.reclaim(sub.ino, None).unwrap().is_empty());
    assert!(m.reclaim(d.ino, None).unwrap().is_empty());
    assert_eq!(names(m, ROOT_INO), vec!["f"]);
}

#[test]
fn root_cannot_be_reclaimed() {
    let v = fresh();
    let e = v.meta.reclaim(ROOT_INO, None).unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
}

#[test]
fn inode_numbers_are_never_reused() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = file(m, ROOT_INO, "a");
    let b = file(m, ROOT_INO, "b");
    m.unlink(ROOT_INO, n("b"), None).unwrap();
    m.reclaim(b.ino, None).unwrap();
    let c = file(m, ROOT_INO, "c");
    assert!(a.ino < b.ino && b.ino < c.ino);
    let v = v.reopen();
    let d = file(v.meta.as_ref(), ROOT_INO, "d");
    assert!(d.ino > c.ino);
}
