//! setattr (mode, owner with suid/sgid clearing, times) and extended
//! attributes with their flags and limits.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::limits::{XATTR_COUNT_PER_INODE_MAX, XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};
use baton_meta::{
    CreateArgs, FileKind, MetaError, SetAttr, TimeOrNow, Timespec, XattrFlags, ROOT_INO,
};
use common::*;

const CREATE: XattrFlags = XattrFlags {
    create: true,
    replace: false,
    acl_kill_sgid: false,
};
const REPLACE: XattrFlags = XattrFlags {
    create: false,
    replace: true,
    acl_kill_sgid: false,
};

#[test]
fn setattr_changes_mode_and_times_and_always_ctime() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let t1 = Timespec { sec: 100, nsec: 1 };
    let t2 = Timespec { sec: -100, nsec: 2 };
    let set = SetAttr {
        mode: Some(0o104700),
        atime: Some(TimeOrNow::At(t1)),
        mtime: Some(TimeOrNow::At(t2)),
        ..Default::default()
    };
    let (a, _) = m.setattr(f.ino, &set, None).unwrap();
    assert_eq!((a.mode, a.atime, a.mtime), (0o4700, t1, t2));
    assert!(a.ctime >= f.ctime);
    let set = SetAttr {
        atime: Some(TimeOrNow::Now),
        ctime: Some(Timespec { sec: 7, nsec: 0 }),
        ..Default::default()
    };
    let (b, _) = m.setattr(f.ino, &set, None).unwrap();
    assert!(b.atime.sec > 1_600_000_000);
    assert_eq!(b.ctime, Timespec { sec: 7, nsec: 0 });
    assert_eq!(m.getattr(f.ino).unwrap(), b);
    assert_eq!(
        m.setattr(999, &set, None).unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn chown_clears_setuid_and_setgid_with_group_exec() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = m
        .create(
            ROOT_INO,
            n("f"),
            &CreateArgs::new(FileKind::Regular, 0o6755),
            None,
        )
        .unwrap();
    assert_eq!(f.mode, 0o6755);
    let set = SetAttr {
        uid: Some(1000),
        ..Default::default()
    };
    let (a, _) = m.setattr(f.ino, &set, None).unwrap();
    assert_eq!((a.uid, a.mode), (1000, 0o0755));
    // setgid without group-exec (mandatory locking) survives a chgrp.
    let g = m
        .create(
            ROOT_INO,
            n("g"),
            &CreateArgs::new(FileKind::Regular, 0o6745),
            None,
        )
        .unwrap();
    let set = SetAttr {
        gid: Some(5),
        ..Default::default()
    };
    let (b, _) = m.setattr(g.ino, &set, None).unwrap();
    assert_eq!((b.gid, b.mode), (5, 0o2745));
    // Unchanged owner keeps the bits; directories keep them too.
    let h = m
        .create(
            ROOT_INO,
            n("h"),
            &CreateArgs::new(FileKind::Regular, 0o4755),
            None,
        )
        .unwrap();
    let same = SetAttr {
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    assert_eq!(m.setattr(h.ino, &same, None).unwrap().0.mode, 0o4755);
    let d = m
        .create(
            ROOT_INO,
            n("d"),
            &CreateArgs::new(FileKind::Directory, 0o2775),
            None,
        )
        .unwrap();
    assert_eq!(m.setattr(d.ino, &set, None).unwrap().0.mode, 0o2775);
    // An explicit mode in the same call wins.
    let both = SetAttr {
        uid: Some(42),
        mode: Some(0o4711),
        ..Default::default()
    };
    assert_eq!(m.setattr(h.ino, &both, None).unwrap().0.mode, 0o4711);
}

#[test]
fn xattr_set_get_list_remove() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    m.setxattr(f.ino, n("user.b"), b"2", XattrFlags::default(), None)
        .unwrap();
    m.setxattr(f.ino, n("user.a"), b"", XattrFlags::default(), None)
        .unwrap();
    assert_eq!(m.getxattr(f.ino, n("user.b")).unwrap(), b"2");
    assert_eq!(m.getxattr(f.ino, n("user.a")).unwrap(), b"");
    assert_eq!(m.listxattr(f.ino).unwrap(), vec!["user.a", "user.b"]);
    m.setxattr(f.ino, n("user.b"), b"22", XattrFlags::default(), None)
        .unwrap();
    assert_eq!(m.getxattr(f.ino, n("user.b")).unwrap(), b"22");
    m.removexattr(f.ino, n("user.b"), None).unwrap();
    let e = m.getxattr(f.ino, n("user.b")).unwrap_err();
    assert!(
        matches!(e, MetaError::NoXattr { .. }) && e.errno() == libc::ENODATA,
        "{e}"
    );
    assert_eq!(
        m.removexattr(f.ino, n("user.b"), None).unwrap_err().errno(),
        libc::ENODATA
    );
    assert_eq!(m.listxattr(f.ino).unwrap(), vec!["user.a"]);
    assert_eq!(m.listxattr(999).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(
        m.getxattr(999, n("user.a")).unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn xattr_create_and_replace_flags() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let e = m
        .setxattr(f.ino, n("user.k"), b"v", REPLACE, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENODATA, "{e}");
    m.setxattr(f.ino, n("user.k"), b"v", CREATE, None).unwrap();
    let e = m
        .setxattr(f.ino, n("user.k"), b"w", CREATE, None)
        .unwrap_err();
    assert!(matches!(e, MetaError::Exists { .. }), "{e}");
    m.setxattr(f.ino, n("user.k"), b"w", REPLACE, None).unwrap();
    assert_eq!(m.getxattr(f.ino, n("user.k")).unwrap(), b"w");
    let both = XattrFlags {
        create: true,
        replace: true,
        acl_kill_sgid: false,
    };
    assert_eq!(
        m.setxattr(f.ino, n("user.k"), b"x", both, None)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
}

#[test]
fn xattr_limits() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let flags = XattrFlags::default();
    let big = vec![7u8; XATTR_VALUE_LEN_MAX];
    m.setxattr(f.ino, n("user.big"), &big, flags, None).unwrap();
    assert_eq!(m.getxattr(f.ino, n("user.big")).unwrap(), big);
    let too_big = vec![7u8; XATTR_VALUE_LEN_MAX + 1];
    let e = m
        .setxattr(f.ino, n("user.big"), &too_big, flags, None)
        .unwrap_err();
    assert_eq!(e.errno(), libc::E2BIG, "{e}");
    let long = "n".repeat(XATTR_NAME_LEN_MAX + 1);
    assert_eq!(
        m.setxattr(f.ino, n(&long), b"", flags, None)
            .unwrap_err()
            .errno(),
        libc::ERANGE
    );
    assert_eq!(
        m.setxattr(f.ino, n(""), b"", flags, None)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    for i in 1..XATTR_COUNT_PER_INODE_MAX {
        m.setxattr(f.ino, n(&format!("user.{i}")), b"", flags, None)
            .unwrap();
    }
    let e = m
        .setxattr(f.ino, n("user.one-more"), b"", flags, None)
        .unwrap_err();
    assert!(
        matches!(e, MetaError::NoSpace { .. }) && e.errno() == libc::ENOSPC,
        "{e}"
    );
    // Replacing an existing one is still allowed at the limit.
    m.setxattr(f.ino, n("user.1"), b"x", flags, None).unwrap();
}

#[test]
fn xattr_changes_set_ctime() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    let old = Timespec { sec: 1, nsec: 0 };
    let set = SetAttr {
        ctime: Some(old),
        ..Default::default()
    };
    m.setattr(f.ino, &set, None).unwrap();
    m.setxattr(f.ino, n("user.k"), b"v", XattrFlags::default(), None)
        .unwrap();
    assert!(m.getattr(f.ino).unwrap().ctime > old);
    m.setattr(f.ino, &set, None).unwrap();
    m.removexattr(f.ino, n("user.k"), None).unwrap();
    assert!(m.getattr(f.ino).unwrap().ctime > old);
}
