//! Exactly-once support: a mutation's result is recorded in its own
//! transaction, so the record and the mutation commit or roll back together.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, SystemTime};

use baton_meta::{
    BlockRef, CommitBlocks, CreateArgs, FileKind, MetaError, Recorded, RequestKey, SetAttr,
    ROOT_INO,
};
use common::*;

fn args() -> CreateArgs {
    CreateArgs::new(FileKind::Regular, 0o644)
}

#[test]
fn recorded_result_decodes_to_what_the_call_returned() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = m
        .create(
            ROOT_INO,
            n("f"),
            &args(),
            Some(RequestKey::new(7, u64::MAX)),
        )
        .unwrap();
    let bytes = m
        .completed_request(RequestKey::new(7, u64::MAX))
        .unwrap()
        .unwrap();
    assert_eq!(Recorded::decode(&bytes).unwrap(), Recorded::Attr(a.clone()));

    let commit = CommitBlocks {
        new_size: Some(10),
        blocks: vec![BlockRef {
            index: 0,
            object_key: "k".into(),
            len: 10,
            inline: None,
        }],
        ..Default::default()
    };
    let (attr, released) = m
        .commit_blocks(a.ino, &commit, Some(RequestKey::new(7, 2)))
        .unwrap();
    let bytes = m.completed_request(RequestKey::new(7, 2)).unwrap().unwrap();
    assert_eq!(
        Recorded::decode(&bytes).unwrap(),
        Recorded::Committed(attr, released)
    );

    let set = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    let (attr, t) = m.setattr(a.ino, &set, Some(RequestKey::new(7, 3))).unwrap();
    let bytes = m.completed_request(RequestKey::new(7, 3)).unwrap().unwrap();
    assert_eq!(
        Recorded::decode(&bytes).unwrap(),
        Recorded::SetAttr(attr, t)
    );

    let u = m
        .unlink(ROOT_INO, n("f"), Some(RequestKey::new(7, 4)))
        .unwrap();
    let bytes = m.completed_request(RequestKey::new(7, 4)).unwrap().unwrap();
    assert_eq!(Recorded::decode(&bytes).unwrap(), Recorded::Unlinked(u));
    assert_eq!(m.completed_request(RequestKey::new(7, 5)).unwrap(), None);
}

#[test]
fn failed_mutation_records_nothing() {
    let v = fresh();
    let m = v.meta.as_ref();
    file(m, ROOT_INO, "f");
    let e = m
        .create(ROOT_INO, n("f"), &args(), Some(RequestKey::new(7, 1)))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    assert_eq!(m.completed_request(RequestKey::new(7, 1)).unwrap(), None);
    // The key is still free for the retried request.
    m.create(ROOT_INO, n("g"), &args(), Some(RequestKey::new(7, 1)))
        .unwrap();
    assert!(m
        .completed_request(RequestKey::new(7, 1))
        .unwrap()
        .is_some());
}

#[test]
fn duplicate_record_rolls_back_its_mutation() {
    let v = fresh();
    let m = v.meta.as_ref();
    let a = m
        .create(ROOT_INO, n("f"), &args(), Some(RequestKey::new(7, 7)))
        .unwrap();
    let before = m.completed_request(RequestKey::new(7, 7)).unwrap();
    let e = m
        .create(ROOT_INO, n("g"), &args(), Some(RequestKey::new(7, 7)))
        .unwrap_err();
    assert!(
        matches!(e, MetaError::DuplicateRequest { request_key } if request_key == RequestKey::new(7, 7)),
        "{e}"
    );
    // The create of g ran inside the transaction but was rolled back with
    // the failed record: no entry, no inode, no parent change.
    assert_eq!(
        m.lookup(ROOT_INO, n("g")).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(names(m, ROOT_INO), vec!["f"]);
    assert_eq!(m.statfs().unwrap().inodes_used, 2);
    assert_eq!(m.completed_request(RequestKey::new(7, 7)).unwrap(), before);
    // The same for an unlink.
    let e = m
        .unlink(ROOT_INO, n("f"), Some(RequestKey::new(7, 7)))
        .unwrap_err();
    assert!(matches!(e, MetaError::DuplicateRequest { .. }), "{e}");
    assert_eq!(m.getattr(a.ino).unwrap().nlink, 1);
    assert!(m.orphans().unwrap().is_empty());
}

#[test]
fn records_survive_reopen_and_prune_by_age() {
    let v = fresh();
    v.meta
        .create(ROOT_INO, n("f"), &args(), Some(RequestKey::new(7, 9)))
        .unwrap();
    let v = v.reopen();
    assert!(v
        .meta
        .completed_request(RequestKey::new(7, 9))
        .unwrap()
        .is_some());
    let past = SystemTime::now() - Duration::from_secs(3600);
    assert_eq!(v.meta.prune_completed(past).unwrap(), 0);
    let future = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(v.meta.prune_completed(future).unwrap(), 1);
    assert_eq!(
        v.meta.completed_request(RequestKey::new(7, 9)).unwrap(),
        None
    );
}

#[test]
fn the_same_unique_on_another_connection_is_another_request() {
    let v = fresh();
    let m = &v.meta;
    m.create(ROOT_INO, n("a"), &args(), Some(RequestKey::new(1, 8)))
        .unwrap();
    m.create(ROOT_INO, n("b"), &args(), Some(RequestKey::new(2, 8)))
        .unwrap();
    let a = Recorded::decode(&m.completed_request(RequestKey::new(1, 8)).unwrap().unwrap());
    let b = Recorded::decode(&m.completed_request(RequestKey::new(2, 8)).unwrap().unwrap());
    assert_ne!(a.unwrap(), b.unwrap());
}

#[test]
fn answered_records_go_with_the_next_recorded_write() {
    let v = fresh();
    let m = &v.meta;
    // Several answered keys, one of another connection.
    let answered = [
        RequestKey::new(1, 2),
        RequestKey::new(1, 6),
        RequestKey::new(9, 2),
    ];
    for (i, key) in answered.into_iter().enumerate() {
        m.create(ROOT_INO, n(&format!("a{i}")), &args(), Some(key))
            .unwrap();
        m.request_answered(key);
    }
    // Kept a while (a handover may still replay it), then deleted by a
    // later recorded write.
    m.create(ROOT_INO, n("b"), &args(), Some(RequestKey::new(1, 4)))
        .unwrap();
    assert!(m
        .completed_request(RequestKey::new(1, 2))
        .unwrap()
        .is_some());
    std::thread::sleep(baton_meta::ANSWERED_RECORD_KEEP);
    m.request_answered(RequestKey::new(1, 4));
    // A replay of a recorded request is refused as one, with keys to forget
    // riding along; the refusal rolls back and puts them back, due before
    // the key answered since (they used to wait behind it).
    let e = m
        .create(ROOT_INO, n("b1"), &args(), Some(RequestKey::new(9, 2)))
        .unwrap_err();
    assert!(matches!(e, MetaError::DuplicateRequest { .. }), "{e}");
    m.create(ROOT_INO, n("b2"), &args(), Some(RequestKey::new(1, 8)))
        .unwrap();
    for key in answered {
        assert_eq!(m.completed_request(key).unwrap(), None, "{key:?}");
    }
    assert!(m
        .completed_request(RequestKey::new(1, 4))
        .unwrap()
        .is_some());
    assert!(m
        .completed_request(RequestKey::new(1, 8))
        .unwrap()
        .is_some());
}

#[test]
fn answered_keys_survive_a_failed_write() {
    let v = fresh();
    let m = &v.meta;
    m.create(ROOT_INO, n("a"), &args(), Some(RequestKey::new(1, 2)))
        .unwrap();
    m.request_answered(RequestKey::new(1, 2));
    std::thread::sleep(baton_meta::ANSWERED_RECORD_KEEP);
    let e = m
        .create(ROOT_INO, n("a"), &args(), Some(RequestKey::new(1, 4)))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    m.create(ROOT_INO, n("c"), &args(), Some(RequestKey::new(1, 6)))
        .unwrap();
    assert_eq!(m.completed_request(RequestKey::new(1, 2)).unwrap(), None);
}

#[test]
fn a_fenced_store_refuses_every_mutation_until_unfenced() {
    let v = fresh();
    let m = &v.meta;
    m.fence();
    let e = m
        .create(ROOT_INO, n("a"), &args(), Some(RequestKey::new(1, 2)))
        .unwrap_err();
    assert!(matches!(e, MetaError::Fenced { .. }), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(m.completed_request(RequestKey::new(1, 2)).unwrap(), None);
    assert_eq!(
        m.lookup(ROOT_INO, n("a")).unwrap_err().errno(),
        libc::ENOENT
    );
    m.unfence();
    m.create(ROOT_INO, n("a"), &args(), Some(RequestKey::new(1, 2)))
        .unwrap();
}
