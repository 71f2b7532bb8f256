//! Many threads sharing one store, as the FUSE worker threads do.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use baton_meta::{CreateArgs, FileKind, MetaStore, ROOT_INO};
use common::*;

#[test]
fn concurrent_creates_and_reads_are_all_consistent() {
    let v = fresh();
    let dir = v.dir;
    let meta: Arc<dyn MetaStore> = Arc::from(v.meta);
    let threads = 4;
    let per_thread = 25;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let m = Arc::clone(&meta);
            std::thread::spawn(move || {
                let mut inos = Vec::new();
                for i in 0..per_thread {
                    let name = format!("t{t}-{i}");
                    let args = CreateArgs::new(FileKind::Regular, 0o644);
                    let a = m.create(ROOT_INO, n(&name), &args, None).unwrap();
                    // A read on another connection sees the committed create.
                    assert_eq!(m.lookup(ROOT_INO, n(&name)).unwrap().ino, a.ino);
                    m.readdir(ROOT_INO, 0, 50).unwrap();
                    inos.push(a.ino);
                }
                inos
            })
        })
        .collect();
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), threads * per_thread, "inode numbers are unique");
    assert_eq!(names(meta.as_ref(), ROOT_INO).len(), threads * per_thread);
    drop(dir);
}
