//! Locks shared by a volume's mounts at the trait level (SQLite by default;
//! on PostgreSQL with `BATON_META_BACKEND=postgres`): a session publishes
//! its locks only if no other session holds a conflicting one; shared locks
//! coexist; flock and POSIX locks are separate spaces; a session's locks go
//! when it closes or expires, and a taker-over replaces them as a whole.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use baton_meta::{LockSpace, MetaStore, RangeLock, SessionInfo, ROOT_INO};
use common::*;

fn session(m: &dyn MetaStore, id: u64) {
    m.open_session(&SessionInfo {
        id,
        host: "testhost".into(),
        pid: 1,
        mount: format!("/mnt/{id}"),
    })
    .unwrap();
}

fn lock(owner: u64, start: u64, end: u64, exclusive: bool) -> RangeLock {
    RangeLock {
        owner,
        start,
        end,
        exclusive,
        pid: 42,
    }
}

const TO_EOF: u64 = i64::MAX as u64;

#[test]
fn a_conflicting_lock_of_another_session_refuses_the_publish_and_changes_nothing() {
    let v = fresh();
    let m = v.meta.as_ref();
    // Ids and owners above i64::MAX (both are random u64) round-trip.
    let (a, b) = (u64::MAX - 1, 9);
    session(m, a);
    session(m, b);
    let ino = file(m, ROOT_INO, "f").ino;
    let a_lock = lock(u64::MAX - 5, 0, 99, true);
    assert_eq!(
        m.publish_locks(a, ino, LockSpace::Posix, Some(&a_lock), &[a_lock])
            .unwrap(),
        None
    );
    // B wants bytes 50..149 shared: A's exclusive 0..99 blocks it.
    let b_lock = lock(1, 50, 149, false);
    let refused = m
        .publish_locks(b, ino, LockSpace::Posix, Some(&b_lock), &[b_lock])
        .unwrap();
    assert_eq!(refused, Some(a_lock));
    assert!(m.session_locks(b).unwrap().is_empty(), "nothing published");
    assert_eq!(
        m.conflicting_lock(b, ino, LockSpace::Posix, &b_lock)
            .unwrap(),
        Some(a_lock)
    );
    // A session never conflicts with itself (its own owners are sorted out
    // by its own lock table).
    assert_eq!(
        m.conflicting_lock(a, ino, LockSpace::Posix, &b_lock)
            .unwrap(),
        None
    );
    // Past A's range, and in the other lock space, B is free.
    let past = lock(1, 100, TO_EOF, true);
    assert_eq!(
        m.publish_locks(b, ino, LockSpace::Posix, Some(&past), &[past])
            .unwrap(),
        None
    );
    let whole = lock(1, 0, TO_EOF, true);
    assert_eq!(
        m.publish_locks(b, ino, LockSpace::Flock, Some(&whole), &[whole])
            .unwrap(),
        None
    );
    assert_eq!(
        m.session_locks(b).unwrap(),
        vec![
            (ino, LockSpace::Posix, past),
            (ino, LockSpace::Flock, whole)
        ]
    );
}

#[test]
fn shared_locks_coexist_and_an_unlock_frees_the_range() {
    let v = fresh();
    let m = v.meta.as_ref();
    session(m, 1);
    session(m, 2);
    let ino = file(m, ROOT_INO, "f").ino;
    let shared = lock(10, 0, TO_EOF, false);
    for s in [1, 2] {
        assert_eq!(
            m.publish_locks(s, ino, LockSpace::Flock, Some(&shared), &[shared])
                .unwrap(),
            None
        );
    }
    let exclusive = lock(10, 0, TO_EOF, true);
    assert_eq!(
        m.publish_locks(2, ino, LockSpace::Flock, Some(&exclusive), &[exclusive])
            .unwrap(),
        Some(shared),
        "session 1 still shares it"
    );
    // Session 1 unlocks (no check, nothing held).
    assert_eq!(
        m.publish_locks(1, ino, LockSpace::Flock, None, &[])
            .unwrap(),
        None
    );
    assert_eq!(
        m.publish_locks(2, ino, LockSpace::Flock, Some(&exclusive), &[exclusive])
            .unwrap(),
        None
    );
    assert_eq!(
        m.session_locks(2).unwrap(),
        vec![(ino, LockSpace::Flock, exclusive)]
    );
}

#[test]
fn a_closed_or_expired_session_takes_its_locks_with_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    session(m, 1);
    session(m, 2);
    let ino = file(m, ROOT_INO, "f").ino;
    let l = lock(3, 0, TO_EOF, true);
    m.publish_locks(1, ino, LockSpace::Posix, Some(&l), &[l])
        .unwrap();
    m.close_session(1).unwrap();
    assert_eq!(
        m.conflicting_lock(2, ino, LockSpace::Posix, &l).unwrap(),
        None
    );

    session(m, 3);
    m.publish_locks(3, ino, LockSpace::Posix, Some(&l), &[l])
        .unwrap();
    assert!(m
        .conflicting_lock(2, ino, LockSpace::Posix, &l)
        .unwrap()
        .is_some());
    std::thread::sleep(Duration::from_millis(300));
    m.heartbeat(2).unwrap();
    assert_eq!(
        m.expire_sessions(Duration::from_millis(200)).unwrap(),
        vec![3]
    );
    assert_eq!(
        m.conflicting_lock(2, ino, LockSpace::Posix, &l).unwrap(),
        None,
        "a dead host's locks do not block the living"
    );
}

#[test]
fn replacing_a_sessions_locks_drops_what_it_no_longer_holds() {
    let v = fresh();
    let m = v.meta.as_ref();
    session(m, 1);
    let f = file(m, ROOT_INO, "f").ino;
    let g = file(m, ROOT_INO, "g").ino;
    let (a, b) = (lock(1, 0, 9, true), lock(2, 5, 5, false));
    m.publish_locks(1, f, LockSpace::Posix, Some(&a), &[a])
        .unwrap();
    m.replace_session_locks(1, &[(g, LockSpace::Posix, b), (g, LockSpace::Flock, a)])
        .unwrap();
    assert_eq!(
        m.session_locks(1).unwrap(),
        vec![(g, LockSpace::Posix, b), (g, LockSpace::Flock, a)]
    );
    m.replace_session_locks(1, &[]).unwrap();
    assert!(m.session_locks(1).unwrap().is_empty());
}
