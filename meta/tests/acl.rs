//! POSIX ACLs stored as xattrs: the mode follows an access ACL, chmod
//! follows into the ACL, a default ACL is inherited at creation (umask not
//! applied), malformed values are refused, and fsck's scan finds them.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::acl::{
    Acl, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR, ID_UNDEFINED, TAG_GROUP, TAG_GROUP_OBJ, TAG_MASK,
    TAG_OTHER, TAG_USER, TAG_USER_OBJ,
};
use baton_meta::{CreateArgs, FileKind, MetaStore, SetAttr, XattrFlags, ROOT_INO, S_ISGID};
use common::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

fn access() -> &'static OsStr {
    OsStr::from_bytes(ACL_ACCESS_XATTR)
}

fn default() -> &'static OsStr {
    OsStr::from_bytes(ACL_DEFAULT_XATTR)
}

/// The xattr bytes of `entries` (tag, perm, id).
fn bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

const U: u32 = ID_UNDEFINED;

fn named_user_acl() -> Vec<u8> {
    bytes(&[
        (TAG_USER_OBJ, 6, U),
        (TAG_USER, 7, 1000),
        (TAG_GROUP_OBJ, 4, U),
        (TAG_GROUP, 2, 2000),
        (TAG_MASK, 5, U),
        (TAG_OTHER, 0, U),
    ])
}

fn set(m: &dyn MetaStore, ino: u64, name: &OsStr, value: &[u8]) -> baton_meta::Result<()> {
    m.setxattr(ino, name, value, XattrFlags::default(), None)
}

#[test]
fn access_acl_sets_the_mode_and_an_equivalent_one_is_stored_as_none() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    set(m, f.ino, access(), &named_user_acl()).unwrap();
    assert_eq!(m.getattr(f.ino).unwrap().mode, 0o650);
    assert_eq!(m.getxattr(f.ino, access()).unwrap(), named_user_acl());
    let plain = bytes(&[
        (TAG_USER_OBJ, 7, U),
        (TAG_GROUP_OBJ, 5, U),
        (TAG_OTHER, 1, U),
    ]);
    set(m, f.ino, access(), &plain).unwrap();
    assert_eq!(m.getattr(f.ino).unwrap().mode, 0o751);
    assert_eq!(
        m.getxattr(f.ino, access()).unwrap_err().errno(),
        libc::ENODATA
    );
    assert!(m.listxattr(f.ino).unwrap().is_empty());
    // Removing an ACL that is not there succeeds, as on ext4.
    m.removexattr(f.ino, access(), None).unwrap();
}

#[test]
fn chmod_rewrites_the_mask_owner_and_other_entries() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    set(m, f.ino, access(), &named_user_acl()).unwrap();
    let set_mode = SetAttr {
        mode: Some(0o705),
        ..SetAttr::default()
    };
    m.setattr(f.ino, &set_mode, None).unwrap();
    let acl = Acl::parse(&m.getxattr(f.ino, access()).unwrap()).unwrap();
    let perms: Vec<u16> = acl.entries().iter().map(|e| e.perm).collect();
    // owner 7, named user 7, owning group 4, named group 2, mask 0, other 5
    assert_eq!(perms, [7, 7, 4, 2, 0, 5]);
}

#[test]
fn malformed_acls_are_einval_and_default_on_a_file_is_eacces() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f");
    for bad in [
        vec![],
        vec![2, 0, 0],
        bytes(&[(TAG_USER_OBJ, 7, U)]),
        bytes(&[
            (TAG_USER_OBJ, 7, U),
            (TAG_USER, 7, 5),
            (TAG_GROUP_OBJ, 7, U),
            (TAG_OTHER, 0, U),
        ]),
        {
            let mut b = named_user_acl();
            b[0] = 1;
            b
        },
    ] {
        assert_eq!(
            set(m, f.ino, access(), &bad).unwrap_err().errno(),
            libc::EINVAL
        );
    }
    assert_eq!(m.getattr(f.ino).unwrap().mode, 0o644);
    assert_eq!(
        set(m, f.ino, default(), &named_user_acl())
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    let l = mk(m, ROOT_INO, "l", FileKind::Symlink);
    assert_eq!(
        set(m, l.ino, access(), &named_user_acl())
            .unwrap_err()
            .errno(),
        libc::EOPNOTSUPP
    );
}

#[test]
fn acl_kill_sgid_clears_set_group_id() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let sgid = SetAttr {
        mode: Some(0o2775),
        ..SetAttr::default()
    };
    m.setattr(d.ino, &sgid, None).unwrap();
    set(m, d.ino, access(), &named_user_acl()).unwrap();
    assert_eq!(m.getattr(d.ino).unwrap().mode, 0o2650);
    let kill = XattrFlags {
        acl_kill_sgid: true,
        ..XattrFlags::default()
    };
    m.setxattr(d.ino, access(), &named_user_acl(), kill, None)
        .unwrap();
    assert_eq!(m.getattr(d.ino).unwrap().mode & S_ISGID, 0);
}

#[test]
fn default_acl_is_inherited_without_the_umask() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let dflt = bytes(&[
        (TAG_USER_OBJ, 7, U),
        (TAG_USER, 7, 1000),
        (TAG_GROUP_OBJ, 5, U),
        (TAG_MASK, 7, U),
        (TAG_OTHER, 5, U),
    ]);
    set(m, d.ino, default(), &dflt).unwrap();
    let mut args = CreateArgs::new(FileKind::Regular, 0o666);
    args.umask = 0o077;
    args.inherit_acl = true;
    let f = m.create(d.ino, n("f"), &args, None).unwrap();
    assert_eq!(f.mode, 0o664);
    let acl = Acl::parse(&m.getxattr(f.ino, access()).unwrap()).unwrap();
    let perms: Vec<u16> = acl.entries().iter().map(|e| e.perm).collect();
    assert_eq!(perms, [6, 7, 5, 6, 4]);
    assert_eq!(
        m.getxattr(f.ino, default()).unwrap_err().errno(),
        libc::ENODATA
    );

    let mut args = CreateArgs::new(FileKind::Directory, 0o777);
    args.umask = 0o077;
    args.inherit_acl = true;
    let sub = m.create(d.ino, n("sub"), &args, None).unwrap();
    assert_eq!(sub.mode, 0o775);
    assert_eq!(m.getxattr(sub.ino, default()).unwrap(), dflt);
    assert!(m.getxattr(sub.ino, access()).is_ok());

    // Without inherit_acl (a mount that does not enforce ACLs) or without
    // a default ACL, the umask applies and nothing is inherited.
    let mut args = CreateArgs::new(FileKind::Regular, 0o666);
    args.umask = 0o027;
    let g = m.create(d.ino, n("g"), &args, None).unwrap();
    assert_eq!(g.mode, 0o640);
    assert!(m.listxattr(g.ino).unwrap().is_empty());
    args.inherit_acl = true;
    let h = m.create(ROOT_INO, n("h"), &args, None).unwrap();
    assert_eq!(h.mode, 0o640);
    assert!(m.listxattr(h.ino).unwrap().is_empty());
}

#[test]
fn scan_acls_returns_every_acl_xattr_in_order() {
    let v = fresh();
    let m = v.meta.as_ref();
    let d = dir(m, ROOT_INO, "d");
    let f = file(m, ROOT_INO, "f");
    set(m, d.ino, default(), &named_user_acl()).unwrap();
    set(m, d.ino, access(), &named_user_acl()).unwrap();
    set(m, f.ino, access(), &named_user_acl()).unwrap();
    m.setxattr(f.ino, n("user.x"), b"1", XattrFlags::default(), None)
        .unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = m.scan_acls(after.clone(), 1).unwrap();
        let Some((ino, name, _)) = page.last() else {
            break;
        };
        after = Some((*ino, name.clone()));
        seen.extend(page.into_iter().map(|(ino, name, _)| (ino, name)));
    }
    assert_eq!(
        seen,
        [
            (d.ino, access().to_owned()),
            (d.ino, default().to_owned()),
            (f.ino, access().to_owned()),
        ]
    );
}
