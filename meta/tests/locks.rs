//! Locks shared by a volume's mounts at the trait level (SQLite by default;
//! on PostgreSQL with `BATON_META_BACKEND=postgres`): a session publishes
//! its locks only if no other session holds a conflicting one; shared locks
//! coexist; flock and POSIX locks are separate spaces; a session's locks go
//! when it closes or expires, and a taker-over replaces them as a whole.
//! Parked POSIX requests: a wait closing a cycle of (session, owner)s is
//! refused and recorded nowhere; a broken cycle parks; waits go with a
//! grant, an unpark, a replacement and the session.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use baton_meta::limits::LOCK_WAIT_SEARCH_OWNERS_MAX;
use baton_meta::{LockSpace, LockWait, MetaStore, Parked, RangeLock, SessionInfo, ROOT_INO};
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
        m.publish_locks(a, ino, LockSpace::Posix, Some(&a_lock), &[a_lock], None)
            .unwrap(),
        None
    );
    // B wants bytes 50..149 shared: A's exclusive 0..99 blocks it.
    let b_lock = lock(1, 50, 149, false);
    let refused = m
        .publish_locks(b, ino, LockSpace::Posix, Some(&b_lock), &[b_lock], None)
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
        m.publish_locks(b, ino, LockSpace::Posix, Some(&past), &[past], None)
            .unwrap(),
        None
    );
    let whole = lock(1, 0, TO_EOF, true);
    assert_eq!(
        m.publish_locks(b, ino, LockSpace::Flock, Some(&whole), &[whole], None)
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
            m.publish_locks(s, ino, LockSpace::Flock, Some(&shared), &[shared], None)
                .unwrap(),
            None
        );
    }
    let exclusive = lock(10, 0, TO_EOF, true);
    assert_eq!(
        m.publish_locks(
            2,
            ino,
            LockSpace::Flock,
            Some(&exclusive),
            &[exclusive],
            None
        )
        .unwrap(),
        Some(shared),
        "session 1 still shares it"
    );
    // Session 1 unlocks (no check, nothing held).
    assert_eq!(
        m.publish_locks(1, ino, LockSpace::Flock, None, &[], None)
            .unwrap(),
        None
    );
    assert_eq!(
        m.publish_locks(
            2,
            ino,
            LockSpace::Flock,
            Some(&exclusive),
            &[exclusive],
            None
        )
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
    m.publish_locks(1, ino, LockSpace::Posix, Some(&l), &[l], None)
        .unwrap();
    m.close_session(1).unwrap();
    assert_eq!(
        m.conflicting_lock(2, ino, LockSpace::Posix, &l).unwrap(),
        None
    );

    session(m, 3);
    m.publish_locks(3, ino, LockSpace::Posix, Some(&l), &[l], None)
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
    m.publish_locks(1, f, LockSpace::Posix, Some(&a), &[a], None)
        .unwrap();
    m.replace_session_locks(
        1,
        &[(g, LockSpace::Posix, b), (g, LockSpace::Flock, a)],
        &[],
    )
    .unwrap();
    assert_eq!(
        m.session_locks(1).unwrap(),
        vec![(g, LockSpace::Posix, b), (g, LockSpace::Flock, a)]
    );
    m.replace_session_locks(1, &[], &[]).unwrap();
    assert!(m.session_locks(1).unwrap().is_empty());
}

/// Session `s`'s owner `owner` holds byte `byte` of `ino` exclusively
/// (with what it held already: `also`).
fn hold_byte(m: &dyn MetaStore, s: u64, ino: u64, owner: u64, byte: u64, also: &[RangeLock]) {
    let l = lock(owner, byte, byte, true);
    let mut held = also.to_vec();
    held.push(l);
    assert_eq!(
        m.publish_locks(s, ino, LockSpace::Posix, Some(&l), &held, None)
            .unwrap(),
        None
    );
}

/// Request `key` of session `s`'s owner `owner` for byte `byte` of `ino`.
fn wants_byte(key: u64, ino: u64, owner: u64, byte: u64) -> LockWait {
    LockWait {
        key,
        ino,
        lock: lock(owner, byte, byte, true),
    }
}

#[test]
fn a_wait_closing_a_cycle_of_three_sessions_is_refused_and_a_broken_cycle_parks() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f").ino;
    // Session s's owner 10s holds byte s.
    for s in 1..=3 {
        session(m, s);
        hold_byte(m, s, f, 10 * s, s, &[]);
    }
    let (w1, w2, w3) = (
        wants_byte(100, f, 10, 2),
        wants_byte(200, f, 20, 3),
        wants_byte(300, f, 30, 1),
    );
    assert_eq!(m.park_lock(1, &w1).unwrap(), Parked::Waiting);
    assert_eq!(m.park_lock(2, &w2).unwrap(), Parked::Waiting);
    // 3 -> 1 -> 2 -> 3: the request closing the cycle is refused, and
    // nothing of it is recorded.
    assert_eq!(m.park_lock(3, &w3).unwrap(), Parked::WouldDeadlock);
    assert!(m.session_lock_waits(3).unwrap().is_empty());
    assert_eq!(m.session_lock_waits(1).unwrap(), vec![w1]);

    // 2 gives up (interrupted): the rest is a chain, which parks.
    m.unpark_locks(2, &[200]).unwrap();
    assert!(m.session_lock_waits(2).unwrap().is_empty());
    assert_eq!(m.park_lock(3, &w3).unwrap(), Parked::Waiting);
    // 2 asking again closes the cycle from its side.
    assert_eq!(m.park_lock(2, &w2).unwrap(), Parked::WouldDeadlock);

    // 2 releases byte 2 and 1 is granted it: its wait goes with the grant,
    // and 2 may wait for 1 now (1 waits for nobody).
    assert_eq!(
        m.publish_locks(2, f, LockSpace::Posix, None, &[], None)
            .unwrap(),
        None
    );
    let (b1, b2) = (lock(10, 1, 1, true), lock(10, 2, 2, true));
    assert_eq!(
        m.publish_locks(1, f, LockSpace::Posix, Some(&b2), &[b1, b2], Some(100))
            .unwrap(),
        None
    );
    assert!(m.session_lock_waits(1).unwrap().is_empty());
    assert_eq!(
        m.park_lock(2, &wants_byte(201, f, 20, 1)).unwrap(),
        Parked::Waiting
    );
}

#[test]
fn owners_are_told_apart_by_session_and_only_conflicting_posix_locks_are_waited_for() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f").ino;
    let g = file(m, ROOT_INO, "g").ino;
    session(m, 1);
    session(m, 2);
    // (1, 7) holds byte 0 and waits for byte 1, held by (2, 8).
    hold_byte(m, 1, f, 7, 0, &[]);
    hold_byte(m, 2, f, 8, 1, &[]);
    assert_eq!(
        m.park_lock(1, &wants_byte(1, f, 7, 1)).unwrap(),
        Parked::Waiting
    );
    // (2, 7) is another owner than (1, 7): waiting for byte 0 is a chain.
    assert_eq!(
        m.park_lock(2, &wants_byte(2, f, 7, 0)).unwrap(),
        Parked::Waiting
    );
    // (2, 8) asking for byte 0 closes the cycle.
    assert_eq!(
        m.park_lock(2, &wants_byte(3, f, 8, 0)).unwrap(),
        Parked::WouldDeadlock
    );
    // A shared wait on a shared lock, and flock locks, make no edge.
    let shared = lock(8, 0, 9, false);
    m.publish_locks(2, g, LockSpace::Posix, Some(&shared), &[shared], None)
        .unwrap();
    let whole = lock(7, 0, TO_EOF, true);
    m.publish_locks(1, g, LockSpace::Flock, Some(&whole), &[whole], None)
        .unwrap();
    m.replace_session_locks(
        1,
        &[
            (f, LockSpace::Posix, lock(7, 0, 0, true)),
            (g, LockSpace::Flock, whole),
        ],
        &[
            wants_byte(1, f, 7, 1),
            LockWait {
                key: 5,
                ino: g,
                lock: lock(7, 0, 0, false),
            },
        ],
    )
    .unwrap();
    assert_eq!(m.session_lock_waits(1).unwrap().len(), 2);
    // (2, 8) asks byte 0 of f again: (1, 7)'s shared wait on g blocks on
    // nothing exclusive, but its wait on f still closes the cycle.
    assert_eq!(
        m.park_lock(2, &wants_byte(6, f, 8, 0)).unwrap(),
        Parked::WouldDeadlock
    );
    // Replaced without the wait on f: only the shared wait on g is left,
    // which (2, 8)'s shared lock does not block.
    m.replace_session_locks(
        1,
        &[
            (f, LockSpace::Posix, lock(7, 0, 0, true)),
            (g, LockSpace::Flock, whole),
        ],
        &[LockWait {
            key: 5,
            ino: g,
            lock: lock(7, 0, 0, false),
        }],
    )
    .unwrap();
    assert_eq!(
        m.park_lock(2, &wants_byte(6, f, 8, 0)).unwrap(),
        Parked::Waiting
    );
}

#[test]
fn a_closed_or_expired_session_takes_its_waits_with_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f").ino;
    for s in 1..=3 {
        session(m, s);
        hold_byte(m, s, f, s, s, &[]);
    }
    assert_eq!(
        m.park_lock(1, &wants_byte(1, f, 1, 2)).unwrap(),
        Parked::Waiting
    );
    assert_eq!(
        m.park_lock(3, &wants_byte(3, f, 3, 2)).unwrap(),
        Parked::Waiting
    );
    m.close_session(1).unwrap();
    assert!(m.session_lock_waits(1).unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(300));
    m.heartbeat(2).unwrap();
    assert_eq!(
        m.expire_sessions(Duration::from_millis(200)).unwrap(),
        vec![3]
    );
    assert!(m.session_lock_waits(3).unwrap().is_empty());
    // Nobody waits for 2 any more: whatever it asks for parks.
    session(m, 4);
    hold_byte(m, 4, f, 4, 4, &[]);
    assert_eq!(
        m.park_lock(2, &wants_byte(2, f, 2, 4)).unwrap(),
        Parked::Waiting
    );
}

/// Session 1's owners 0..=n: owner i holds byte i and waits for byte i + 1;
/// owner n waits for byte n + 1, held by session 2's owner 5, which then
/// asks for byte 0: a cycle of n + 2 owners.
fn chain_then_close(m: &dyn MetaStore, f: u64, n: u64) -> Parked {
    let held: Vec<_> = (0..=n)
        .map(|i| (f, LockSpace::Posix, lock(i, i, i, true)))
        .collect();
    let waits: Vec<_> = (0..=n).map(|i| wants_byte(i, f, i, i + 1)).collect();
    m.replace_session_locks(1, &held, &waits).unwrap();
    m.replace_session_locks(
        2,
        &[(f, LockSpace::Posix, lock(5, n + 1, n + 1, true))],
        &[],
    )
    .unwrap();
    m.park_lock(2, &wants_byte(1, f, 5, 0)).unwrap()
}

#[test]
fn the_cycle_search_stops_at_its_owner_limit_and_then_parks_unchecked() {
    let v = fresh();
    let m = v.meta.as_ref();
    let f = file(m, ROOT_INO, "f").ino;
    session(m, 1);
    session(m, 2);
    assert_eq!(chain_then_close(m, f, 100), Parked::WouldDeadlock);
    let past = u64::from(LOCK_WAIT_SEARCH_OWNERS_MAX) + 10;
    assert_eq!(chain_then_close(m, f, past), Parked::Waiting);
}
