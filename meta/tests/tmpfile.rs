//! O_TMPFILE at the trait level (SQLite by default; on PostgreSQL with
//! `BATON_META_BACKEND=postgres`): an unnamed regular file is an orphan
//! from birth held by the session that made it; its first link takes it
//! off the orphan list; only such a file may be linked at nlink 0 (an
//! unlinked file, a tmpfile made with O_EXCL or one already linked once
//! stays unlinkable, as the kernel's I_LINKABLE says on a local
//! filesystem); quotas count it from its directory, then from its name;
//! never linked, it is reclaimed with its blocks and its charge.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::{
    BlockRef, CommitBlocks, CreateArgs, FileKind, MetaError, MetaStore, QuotaUsage, SessionInfo,
    ROOT_INO,
};
use common::*;

const SESSION: u64 = 7;
const OTHER_SESSION: u64 = u64::MAX - 1;

fn with_sessions(m: &dyn MetaStore) {
    for (id, mount) in [(SESSION, "/mnt/a"), (OTHER_SESSION, "/mnt/b")] {
        let info = SessionInfo {
            id,
            host: "testhost".into(),
            pid: std::process::id(),
            mount: mount.into(),
        };
        m.open_session(&info).unwrap();
    }
}

fn tmpfile_args() -> CreateArgs {
    let mut args = CreateArgs::new(FileKind::Regular, 0o600);
    args.uid = 1000;
    args.gid = 1000;
    args
}

/// Commits `len` bytes as one block (object `obj-INO`).
fn write_block(m: &dyn MetaStore, ino: u64, len: u32) {
    let commit = CommitBlocks {
        new_size: Some(u64::from(len)),
        blocks: vec![BlockRef {
            index: 0,
            object_key: format!("obj-{ino}"),
            len,
            inline: None,
        }],
        ..CommitBlocks::default()
    };
    m.commit_blocks(ino, &commit, None).unwrap();
}

fn is_not_found(r: Result<impl std::fmt::Debug, MetaError>) -> bool {
    matches!(r, Err(MetaError::NotFound { .. }))
}

fn used(m: &dyn MetaStore, dir: u64) -> QuotaUsage {
    m.quota(dir).unwrap().unwrap().used
}

#[test]
fn a_tmpfile_is_an_orphan_of_its_session_until_its_first_link() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    let d = dir(m, ROOT_INO, "d");
    let before = m.getattr(d.ino).unwrap();
    let t = m
        .tmpfile(d.ino, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    assert_eq!(
        (t.kind, t.nlink, t.mode, t.uid, t.gid, t.size),
        (FileKind::Regular, 0, 0o600, 1000, 1000, 0)
    );
    assert_eq!(m.orphans().unwrap(), vec![t.ino]);
    assert_eq!(m.held_orphans(SESSION).unwrap(), vec![t.ino]);
    assert!(
        m.held_orphans(OTHER_SESSION).unwrap().is_empty(),
        "no other mount can reach it"
    );
    assert!(names(m, d.ino).is_empty());
    assert_eq!(m.getattr(d.ino).unwrap(), before, "no entry, no change");
    assert!(m.is_linkable_tmpfile(t.ino).unwrap());

    write_block(m, t.ino, 100);
    let linked = m.link(t.ino, ROOT_INO, n("published"), None).unwrap();
    assert_eq!((linked.ino, linked.nlink, linked.size), (t.ino, 1, 100));
    assert_eq!(m.lookup(ROOT_INO, n("published")).unwrap().ino, t.ino);
    assert!(m.orphans().unwrap().is_empty());
    assert!(m.held_orphans(SESSION).unwrap().is_empty());
    assert!(!m.is_linkable_tmpfile(t.ino).unwrap());
    // Its last close after the link finds a named file: nothing reclaimed.
    assert_eq!(m.release_orphan(Some(SESSION), t.ino).unwrap(), None);
    assert_eq!(m.getattr(t.ino).unwrap().nlink, 1);
    assert_eq!(m.blocks(t.ino, 0, 1).unwrap().len(), 1);
}

#[test]
fn only_an_unnamed_linkable_tmpfile_can_be_linked_at_nlink_zero() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    // An ordinary file that lost its last name.
    let f = file(m, ROOT_INO, "f");
    m.unlink(ROOT_INO, n("f"), None).unwrap();
    assert!(!m.is_linkable_tmpfile(f.ino).unwrap());
    assert!(is_not_found(m.link(f.ino, ROOT_INO, n("again"), None)));
    // A tmpfile opened with O_EXCL.
    let excl = m
        .tmpfile(ROOT_INO, &tmpfile_args(), SESSION, false, None)
        .unwrap();
    assert!(!m.is_linkable_tmpfile(excl.ino).unwrap());
    assert!(is_not_found(m.link(excl.ino, ROOT_INO, n("excl"), None)));
    assert_eq!(m.held_orphans(SESSION).unwrap(), vec![f.ino, excl.ino]);
    // A tmpfile linked once, then unlinked.
    let t = m
        .tmpfile(ROOT_INO, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    m.link(t.ino, ROOT_INO, n("t"), None).unwrap();
    assert_eq!(m.unlink(ROOT_INO, n("t"), None).unwrap().nlink_after, 0);
    assert!(is_not_found(m.link(t.ino, ROOT_INO, n("t2"), None)));
    // Every session holds it now, as any unlinked file.
    assert!(m.held_orphans(OTHER_SESSION).unwrap().contains(&t.ino));
    // A linked tmpfile links like any file.
    let u = m
        .tmpfile(ROOT_INO, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    m.link(u.ino, ROOT_INO, n("u"), None).unwrap();
    assert_eq!(m.link(u.ino, ROOT_INO, n("u2"), None).unwrap().nlink, 2);
    assert!(m.lookup(ROOT_INO, n("t2")).is_err());
    assert_eq!(names(m, ROOT_INO), vec!["u", "u2"]);
}

#[test]
fn a_tmpfile_never_linked_is_reclaimed_with_its_blocks_and_its_quota_charge() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    let q = dir(m, ROOT_INO, "q");
    m.set_quota(q.ino, Some(1 << 20), Some(10)).unwrap();
    let t = m
        .tmpfile(q.ino, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    write_block(m, t.ino, 3000);
    assert_eq!(
        used(m, q.ino),
        QuotaUsage {
            bytes: 3000,
            inodes: 1
        }
    );
    assert!(m.recount_quotas(false).unwrap().is_empty(), "fsck agrees");
    let objects = m.release_orphan(Some(SESSION), t.ino).unwrap().unwrap();
    assert_eq!(objects.len(), 1, "its block is released");
    assert!(m.getattr(t.ino).is_err());
    assert!(m.orphans().unwrap().is_empty());
    assert_eq!(used(m, q.ino), QuotaUsage::default());
    assert!(m.recount_quotas(false).unwrap().is_empty());
}

#[test]
fn a_linked_tmpfile_is_counted_by_the_quotas_of_its_name() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    let (a, b) = (dir(m, ROOT_INO, "a"), dir(m, ROOT_INO, "b"));
    m.set_quota(a.ino, Some(1 << 20), Some(10)).unwrap();
    m.set_quota(b.ino, Some(1 << 20), Some(1)).unwrap();
    let t = m
        .tmpfile(a.ino, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    write_block(m, t.ino, 500);
    m.link(t.ino, b.ino, n("t"), None).unwrap();
    assert_eq!(used(m, a.ino), QuotaUsage::default());
    assert_eq!(
        used(m, b.ino),
        QuotaUsage {
            bytes: 500,
            inodes: 1
        }
    );
    assert!(m.recount_quotas(false).unwrap().is_empty());
    // b is full: a second tmpfile's link there is refused and changes
    // nothing (still an unnamed orphan, still counted by a).
    let u = m
        .tmpfile(a.ino, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    let refused = m.link(u.ino, b.ino, n("u"), None).unwrap_err();
    assert_eq!(refused.errno(), libc::EDQUOT, "{refused}");
    assert_eq!(m.getattr(u.ino).unwrap().nlink, 0);
    assert_eq!(m.orphans().unwrap(), vec![u.ino]);
    assert_eq!(used(m, a.ino).inodes, 1);
    m.link(u.ino, a.ino, n("u"), None).unwrap();
    assert!(m.recount_quotas(false).unwrap().is_empty());
}

#[test]
fn a_tmpfile_in_a_set_group_id_directory_takes_its_group() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    let mut shared = CreateArgs::new(FileKind::Directory, 0o2775);
    shared.gid = 50;
    let shared = m.create(ROOT_INO, n("shared"), &shared, None).unwrap();
    let t = m
        .tmpfile(shared.ino, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    assert_eq!((t.gid, t.mode), (50, 0o600));
    let plain = m
        .tmpfile(ROOT_INO, &tmpfile_args(), SESSION, true, None)
        .unwrap();
    assert_eq!(plain.gid, 1000);
}

#[test]
fn a_tmpfile_needs_a_live_directory_and_a_regular_kind() {
    let v = fresh();
    let m = v.meta.as_ref();
    with_sessions(m);
    let f = file(m, ROOT_INO, "f");
    let e = m.tmpfile(f.ino, &tmpfile_args(), SESSION, true, None);
    assert!(matches!(e, Err(MetaError::NotDirectory { .. })), "{e:?}");
    let gone = dir(m, ROOT_INO, "gone");
    m.rmdir(ROOT_INO, n("gone"), None).unwrap();
    assert!(is_not_found(m.tmpfile(
        gone.ino,
        &tmpfile_args(),
        SESSION,
        true,
        None
    )));
    let e = m.tmpfile(
        ROOT_INO,
        &CreateArgs::new(FileKind::Directory, 0o700),
        SESSION,
        true,
        None,
    );
    assert_eq!(e.unwrap_err().errno(), libc::EINVAL);
}
