//! The SQLite write-ahead log under a stream of writes: copied back into the
//! database by the checkpoint thread and started again from its beginning,
//! so it stays short, and nothing written is lost on the way.
#![allow(clippy::unwrap_used)]

mod common;

use baton_meta::ROOT_INO;
use common::*;

/// Files created and then unlinked: about 100,000 log pages in all, six
/// times the length at which a commit would checkpoint by itself.
const FILES: usize = 6000;

#[test]
fn a_stream_of_writes_keeps_the_write_ahead_log_short_and_loses_nothing() {
    let v = fresh_sqlite();
    let wal = v.dir.path().join("meta.db-wal");
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
    // The thread is woken at 1,000 pages (4 MiB); past 4,000 (16 MiB) a
    // commit checkpoints by itself. This stream is faster than any FUSE
    // workload, and on a loaded machine the thread can fall behind it, so
    // what is asserted is the bound. That no commit waits for a whole
    // checkpoint is a matter of time, measured in docs/BENCHMARKS.md.
    assert!(
        longest < 24 << 20,
        "the write-ahead log grew to {longest} bytes"
    );

    let v = v.reopen();
    let kept: Vec<String> = (1..FILES).step_by(2).map(|i| format!("f{i:05}")).collect();
    assert_eq!(names(v.meta.as_ref(), ROOT_INO), kept);
}
