//! The SQLite write-ahead log under a stream of writes: copied back into the
//! database by the checkpoint thread and started again from its beginning,
//! so it stays short, and nothing written is lost on the way.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_meta::ROOT_INO;
use common::*;

/// Files created and then unlinked: about 100,000 log pages in all, six
/// times the length at which a commit would checkpoint by itself.
const FILES: usize = 6000;

#[test]
fn a_stream_of_writes_keeps_the_write_ahead_log_short_and_loses_nothing() {
    let v = fresh_sqlite();
    let wal = v.dir.path().join("meta.db-wal");
    // Slow fsyncs: the checkpoint thread falls behind the writes, which
    // sync nothing. Before writes waited for it then, this log grew to
    // 40-43 MiB here (and to 41 MiB on a CI machine without a neighbour).
    let neighbour = SyncingNeighbour::start(&v.dir.path().join("neighbour"));
    let m = v.meta.as_ref();
    let mut longest = 0;
    let mut note_length = || longest = longest.max(std::fs::metadata(&wal).unwrap().len());
    for i in 0..FILES {
        file(m, ROOT_INO, &format!("f{i:05}"));
        if i % 100 == 0 {
            note_length();
        }
    }
    for i in (0..FILES).step_by(2) {
        m.unlink(ROOT_INO, n(&format!("f{i:05}")), None).unwrap();
        if i % 100 == 0 {
            note_length();
        }
    }
    drop(neighbour);
    // The thread is woken at 1,000 pages (4 MiB); past 4,000 (16 MiB) a
    // commit checkpoints by itself, or writes wait for the thread. What is
    // asserted is that bound. That no commit waits for a whole checkpoint
    // on a quiet machine is a matter of time, measured in
    // docs/benchmarks-history.md (session 11).
    assert!(
        longest < 24 << 20,
        "the write-ahead log grew to {longest} bytes"
    );

    let v = v.reopen();
    let kept: Vec<String> = (1..FILES).step_by(2).map(|i| format!("f{i:05}")).collect();
    assert_eq!(names(v.meta.as_ref(), ROOT_INO), kept);
}

/// Another writer on the same disk: 8 MiB written and fsynced, over and
/// over, until dropped.
struct SyncingNeighbour {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SyncingNeighbour {
    fn start(path: &Path) -> SyncingNeighbour {
        let stop = Arc::new(AtomicBool::new(false));
        let mut file = std::fs::File::create(path).unwrap();
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let chunk = vec![7u8; 1 << 20];
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..8 {
                        file.write_all(&chunk).unwrap();
                    }
                    file.sync_all().unwrap();
                    file.set_len(0).unwrap();
                    std::io::Seek::rewind(&mut file).unwrap();
                }
            }
        });
        SyncingNeighbour {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SyncingNeighbour {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}
