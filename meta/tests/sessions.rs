//! Sessions and orphan holds at the trait level (SQLite by default; on
//! PostgreSQL with `BATON_META_BACKEND=postgres`): an inode brought to
//! nlink 0 is held by every registered session and reclaimed only when the
//! last hold is dropped; a session whose heartbeat is older than the expiry
//! is deleted by another with its holds; a generation re-registering the
//! same session keeps its holds; a volume made before sessions opens.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use baton_meta::{BlockRef, CommitBlocks, MetaError, MetaStore, SessionInfo, ROOT_INO};
use common::*;

fn session(id: u64, mount: &str) -> SessionInfo {
    SessionInfo {
        id,
        host: "testhost".into(),
        pid: std::process::id(),
        mount: mount.into(),
    }
}

/// A file `name` with one committed block (object `obj-NAME`).
fn file_with_block(m: &dyn MetaStore, name: &str) -> u64 {
    let f = file(m, ROOT_INO, name);
    let commit = CommitBlocks {
        new_size: Some(100),
        blocks: vec![BlockRef {
            index: 0,
            object_key: format!("obj-{name}"),
            len: 100,
            inline: None,
        }],
        ..CommitBlocks::default()
    };
    m.commit_blocks(f.ino, &commit, None).unwrap();
    f.ino
}

#[test]
fn an_orphan_is_reclaimed_only_when_every_session_released_it() {
    let v = fresh();
    let m = v.meta.as_ref();
    // Ids above i64::MAX (connection identities are random u64) round-trip.
    let (a, b) = (7, u64::MAX - 3);
    m.open_session(&session(a, "/mnt/a")).unwrap();
    m.open_session(&session(b, "/mnt/b")).unwrap();
    let ino = file_with_block(m, "f");
    let gone = m.unlink(ROOT_INO, n("f"), None).unwrap();
    assert_eq!(gone.nlink_after, 0);
    assert_eq!(m.held_orphans(a).unwrap(), vec![ino]);
    assert_eq!(m.held_orphans(b).unwrap(), vec![ino]);
    assert!(m.unheld_orphans(100).unwrap().is_empty());

    // A (the unlinker, no handle) lets go: B still holds it.
    assert_eq!(m.release_orphan(Some(a), ino).unwrap(), None);
    assert_eq!(m.getattr(ino).unwrap().nlink, 0, "still there for B");
    assert_eq!(m.blocks(ino, 0, 1).unwrap().len(), 1);
    // B closes its last handle: reclaimed, its object released.
    let released = m.release_orphan(Some(b), ino).unwrap().unwrap();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].key, "obj-f");
    assert!(matches!(m.getattr(ino), Err(MetaError::NotFound { .. })));
    assert!(m.orphans().unwrap().is_empty());
    // A second release finds nothing.
    assert_eq!(m.release_orphan(Some(b), ino).unwrap(), None);
}

#[test]
fn an_expired_session_is_deleted_with_its_holds_and_a_live_one_is_kept() {
    let v = fresh();
    let m = v.meta.as_ref();
    let (live, dead) = (11, 12);
    m.open_session(&session(live, "/mnt/live")).unwrap();
    m.open_session(&session(dead, "/mnt/dead")).unwrap();
    let ino = file_with_block(m, "held");
    m.unlink(ROOT_INO, n("held"), None).unwrap();
    m.release_orphan(Some(live), ino).unwrap();
    assert_eq!(m.held_orphans(dead).unwrap(), vec![ino]);

    std::thread::sleep(Duration::from_millis(400));
    assert!(m.heartbeat(live).unwrap());
    // The live session's heartbeat is fresh, the dead one's is 400 ms old.
    let expired = m.expire_sessions(Duration::from_millis(300)).unwrap();
    assert_eq!(expired, vec![dead]);
    let ids: Vec<u64> = m.sessions().unwrap().iter().map(|s| s.info.id).collect();
    assert_eq!(ids, vec![live]);
    assert!(
        !m.heartbeat(dead).unwrap(),
        "the dead session learns it is gone"
    );
    assert_eq!(m.unheld_orphans(100).unwrap(), vec![ino]);
    let released = m.release_orphan(None, ino).unwrap().unwrap();
    assert_eq!(released[0].key, "obj-held");
    assert!(m.unheld_orphans(100).unwrap().is_empty());
    // Nothing is younger than a minute: nothing else expires.
    assert!(m
        .expire_sessions(Duration::from_secs(60))
        .unwrap()
        .is_empty());
}

#[test]
fn a_session_registered_again_keeps_its_holds_and_closing_it_frees_them() {
    let v = fresh();
    let m = v.meta.as_ref();
    m.open_session(&session(21, "/mnt/x")).unwrap();
    let ino = file_with_block(m, "kept");
    m.unlink(ROOT_INO, n("kept"), None).unwrap();
    // The next generation of the same connection (after a kill -9).
    let mut again = session(21, "/mnt/x");
    again.pid = 999_999;
    m.open_session(&again).unwrap();
    let sessions = m.sessions().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].info.pid, 999_999);
    assert_eq!(m.held_orphans(21).unwrap(), vec![ino]);
    assert!(m.unheld_orphans(100).unwrap().is_empty());
    // The mount ends.
    assert_eq!(m.close_session(21).unwrap(), vec![ino]);
    assert!(m.sessions().unwrap().is_empty());
    assert!(m.release_orphan(None, ino).unwrap().is_some());
}

#[test]
fn a_hold_taken_at_open_survives_the_unlinkers_release_and_a_gone_inode_is_not_found() {
    let v = fresh();
    let m = v.meta.as_ref();
    let ino = file_with_block(m, "late");
    m.unlink(ROOT_INO, n("late"), None).unwrap();
    // No session was registered at unlink: nobody holds it.
    assert_eq!(m.unheld_orphans(100).unwrap(), vec![ino]);
    // A session opens it (a cached entry) before anyone reclaims it.
    m.open_session(&session(31, "/mnt/late")).unwrap();
    m.hold_orphan(31, ino).unwrap();
    assert!(m.unheld_orphans(100).unwrap().is_empty());
    assert_eq!(m.release_orphan(None, ino).unwrap(), None, "held");
    assert!(m.release_orphan(Some(31), ino).unwrap().is_some());
    let e = m.hold_orphan(31, ino).unwrap_err();
    assert!(matches!(e, MetaError::NotFound { .. }), "{e}");
    // Holding a linked inode records nothing.
    let linked = file(m, ROOT_INO, "linked");
    m.hold_orphan(31, linked.ino).unwrap();
    assert!(m.held_orphans(31).unwrap().is_empty());
}

#[test]
fn a_sqlite_volume_made_before_sessions_opens_and_gets_them() {
    let v = fresh_sqlite();
    let f = file(v.meta.as_ref(), ROOT_INO, "old");
    let c = raw(&v);
    c.execute_batch("DROP TABLE orphan_holds; DROP TABLE sessions;")
        .unwrap();
    drop(c);
    let v = v.reopen();
    let m = v.meta.as_ref();
    assert_eq!(m.lookup(ROOT_INO, n("old")).unwrap().ino, f.ino);
    m.open_session(&session(41, "/mnt/old")).unwrap();
    m.unlink(ROOT_INO, n("old"), None).unwrap();
    assert_eq!(m.held_orphans(41).unwrap(), vec![f.ino]);
}
