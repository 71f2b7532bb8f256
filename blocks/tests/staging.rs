//! Staging on real directories: block splitting, base copies, holes,
//! overlays, truncation, recovery and the take/clear protocol.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::Cell;
use std::os::unix::fs::MetadataExt;

use baton_blocks::{
    BlocksError, StagedSize, Staging, OVERLAY_READ_BYTES_MAX, STAGING_RETIRE_DELAY,
    UPLOAD_SET_BLOCK_COUNT_MAX,
};
use bytes::Bytes;
use common::pattern;

const BS: u64 = 4096;

fn no_base(_: u64) -> baton_blocks::Result<Option<Bytes>> {
    Ok(None)
}

fn block_file(dir: &std::path::Path, ino: u64, index: u64) -> std::path::PathBuf {
    dir.join(format!("{ino:016x}"))
        .join(format!("{index:08x}.blk"))
}

/// Reads `len` bytes at `offset` as a caller would: committed bytes
/// (`committed`, a whole file) overlaid with staged data.
fn read_through(staging: &Staging, ino: u64, committed: &[u8], offset: u64, len: u64) -> Vec<u8> {
    let overlay = staging.read_overlay(ino, offset, len).unwrap();
    let size = overlay.size.map_or(committed.len() as u64, |s| {
        s.resolve(committed.len() as u64)
    });
    let end = (offset + len).min(size);
    let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = committed.get(offset as usize + i).copied().unwrap_or(0);
    }
    overlay.apply(offset, &mut buf);
    buf
}

#[test]
fn write_across_block_boundaries_stages_each_block() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let data = pattern(10_000, 1);
    staging.write(3, 3000, &data, &no_base).unwrap();
    assert_eq!(staging.dirty_blocks(3).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(
        staging.staged_size(3).unwrap(),
        Some(StagedSize::AtLeast(13_000))
    );
    let lens: Vec<u64> = (0..4)
        .map(|i| {
            std::fs::metadata(block_file(dir.path(), 3, i))
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(lens, vec![BS, BS, BS, 13_000 - 3 * BS]);
    let got = read_through(&staging, 3, &[], 0, 20_000);
    let mut want = vec![0u8; 3000];
    want.extend_from_slice(&data);
    assert_eq!(got, want);
}

#[test]
fn first_write_copies_committed_base_once_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let committed = pattern(2 * BS as usize, 9);
    let calls = Cell::new(0);
    let base = |index: u64| -> baton_blocks::Result<Option<Bytes>> {
        calls.set(calls.get() + 1);
        let s = (index * BS) as usize;
        Ok(Some(Bytes::copy_from_slice(&committed[s..s + BS as usize])))
    };
    staging.write(1, 100, b"0123456789", &base).unwrap();
    staging.write(1, 200, b"abc", &base).unwrap();
    assert_eq!(calls.get(), 1);
    let mut want = committed[..BS as usize].to_vec();
    want[100..110].copy_from_slice(b"0123456789");
    want[200..203].copy_from_slice(b"abc");
    assert_eq!(std::fs::read(block_file(dir.path(), 1, 0)).unwrap(), want);
    assert_eq!(read_through(&staging, 1, &committed, 0, 2 * BS), {
        let mut w = committed.clone();
        w[..BS as usize].copy_from_slice(&want);
        w
    });
}

#[test]
fn base_errors_propagate_and_stage_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let failing = |index: u64| -> baton_blocks::Result<Option<Bytes>> {
        Err(BlocksError::BaseRead {
            ino: 1,
            index,
            source: "meta down".into(),
        })
    };
    let err = staging.write(1, 0, b"x", &failing).unwrap_err();
    assert!(matches!(err, BlocksError::BaseRead { .. }));
    assert!(staging.dirty_blocks(1).unwrap().is_empty());
}

#[test]
fn write_far_past_end_stays_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let bs = 4 << 20;
    let staging = Staging::open(dir.path(), bs).unwrap();
    let offset = 100u64 << 30; // 100 GiB, block-aligned
    staging
        .write(2, offset + bs - 10, b"tail bytes", &no_base)
        .unwrap();
    staging.write(2, offset + 2 * bs, b"x", &no_base).unwrap();
    let index = offset / bs;
    assert_eq!(staging.dirty_blocks(2).unwrap(), vec![index, index + 2]);
    let meta = std::fs::metadata(block_file(dir.path(), 2, index)).unwrap();
    assert_eq!(meta.len(), bs);
    assert!(
        meta.blocks() * 512 <= 64 << 10,
        "allocated {} bytes",
        meta.blocks() * 512
    );
    let total: u64 = std::fs::read_dir(dir.path().join(format!("{:016x}", 2)))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum();
    assert!(total <= 256 << 10, "staging allocated {total} bytes");
    assert_eq!(
        staging.staged_size(2).unwrap(),
        Some(StagedSize::AtLeast(offset + 2 * bs + 1))
    );
    let got = read_through(&staging, 2, &[], offset + bs - 20, 20);
    assert_eq!(&got[..10], &[0u8; 10]);
    assert_eq!(&got[10..], b"tail bytes");
}

#[test]
fn overlay_covers_only_staged_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(4, BS + 10, b"staged", &no_base).unwrap();
    let overlay = staging.read_overlay(4, 0, 3 * BS).unwrap();
    assert_eq!(overlay.segments.len(), 1);
    // The staged block claims its whole extent up to the read end.
    assert_eq!(overlay.segments[0].offset, BS);
    assert_eq!(overlay.segments[0].data.len() as u64, 2 * BS - BS);
    let committed = vec![7u8; 3 * BS as usize];
    let got = read_through(&staging, 4, &committed, 0, 3 * BS);
    assert_eq!(&got[..BS as usize], &committed[..BS as usize]);
    assert_eq!(&got[BS as usize + 10..BS as usize + 16], b"staged");
    assert_eq!(&got[2 * BS as usize..], &committed[2 * BS as usize..]);
    assert!(staging
        .read_overlay(99, 0, 100)
        .unwrap()
        .segments
        .is_empty());
    assert!(matches!(
        staging.read_overlay(4, 0, OVERLAY_READ_BYTES_MAX + 1),
        Err(BlocksError::InvalidArgument { .. })
    ));
}

#[test]
fn truncate_then_extend_reads_zeros_over_committed_data() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let committed = pattern(3 * BS as usize, 5);
    let base = |index: u64| -> baton_blocks::Result<Option<Bytes>> {
        let s = (index * BS) as usize;
        Ok(Some(Bytes::copy_from_slice(&committed[s..s + BS as usize])))
    };
    staging.write(6, 0, b"head", &base).unwrap();
    staging.write(6, 2 * BS + 1, b"gone", &base).unwrap();
    staging.set_size(6, 5000).unwrap();
    assert_eq!(staging.dirty_blocks(6).unwrap(), vec![0]);
    staging.set_size(6, 12_000).unwrap();
    assert_eq!(
        staging.staged_size(6).unwrap(),
        Some(StagedSize::Exact(12_000))
    );
    let got = read_through(&staging, 6, &committed, 0, 3 * BS);
    assert_eq!(got.len(), 12_000);
    assert_eq!(&got[..4], b"head");
    assert_eq!(&got[4..5000], &committed[4..5000]);
    assert!(got[5000..].iter().all(|b| *b == 0));
    // A later write into the block holding the floor copies base only up to it.
    staging.write(6, 6000, b"!", &base).unwrap();
    let block1 = std::fs::read(block_file(dir.path(), 6, 1)).unwrap();
    assert_eq!(block1.len(), 6001 - BS as usize);
    assert_eq!(&block1[..5000 - BS as usize], &committed[BS as usize..5000]);
    assert!(block1[5000 - BS as usize..1904].iter().all(|b| *b == 0));
    let set = staging.take_for_upload(6).unwrap();
    assert_eq!(set.floor_bytes, Some(5000));
    assert_eq!(set.size, Some(StagedSize::Exact(12_000)));
}

#[test]
fn truncate_cuts_a_staged_block_and_shrinks_reads() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(8, 0, &pattern(6000, 2), &no_base).unwrap();
    staging.set_size(8, 4100).unwrap();
    assert_eq!(
        std::fs::metadata(block_file(dir.path(), 8, 1))
            .unwrap()
            .len(),
        4
    );
    let got = read_through(&staging, 8, &[], 0, 10_000);
    assert_eq!(got, pattern(6000, 2)[..4100].to_vec());
}

#[test]
fn recover_lists_staged_inodes_after_reopen_and_drops_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    {
        let staging = Staging::open(dir.path(), BS).unwrap();
        staging.write(9, 0, b"nine", &no_base).unwrap();
        staging.write(5, BS * 3, b"five", &no_base).unwrap();
        staging.set_size(11, 0).unwrap();
        staging.sync(9).unwrap();
    }
    let stray = dir.path().join(format!("{:016x}", 9)).join("00000004.tmp");
    std::fs::write(&stray, b"interrupted").unwrap();
    std::fs::create_dir(dir.path().join(format!("{:016x}", 12))).unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    assert!(
        stray.exists(),
        "opening must not touch files another generation may be writing"
    );
    assert_eq!(staging.staged_inodes().unwrap(), vec![5, 9, 11]);
    assert!(stray.exists());
    assert_eq!(staging.recover().unwrap(), vec![5, 9, 11]);
    assert!(
        !stray.exists(),
        "recover drops temp files of interrupted writes"
    );
    assert_eq!(read_through(&staging, 5, &[], BS * 3, 4), b"five");
    assert_eq!(staging.staged_size(11).unwrap(), Some(StagedSize::Exact(0)));
}

#[test]
fn reopening_with_another_block_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Staging::open(dir.path(), BS).unwrap());
    let err = Staging::open(dir.path(), 2 * BS).unwrap_err();
    assert!(err.to_string().contains("block_size_bytes=4096"), "{err}");
    assert!(matches!(
        Staging::open(dir.path(), 0),
        Err(BlocksError::InvalidArgument { .. })
    ));
}

#[test]
fn clear_after_take_empties_the_inode() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(1, 0, &pattern(5000, 1), &no_base).unwrap();
    let set = staging.take_for_upload(1).unwrap();
    assert!(set.complete);
    assert_eq!(
        set.blocks
            .iter()
            .map(|b| (b.index, b.data.len()))
            .collect::<Vec<_>>(),
        vec![(0, 4096), (1, 904)]
    );
    staging.clear(&set).unwrap();
    assert!(staging.dirty_blocks(1).unwrap().is_empty());
    assert_eq!(staging.staged_size(1).unwrap(), None);
    assert!(staging.recover().unwrap().is_empty());
    assert!(!dir.path().join(format!("{:016x}", 1)).exists());
}

#[test]
fn writes_between_take_and_clear_stay_staged() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(1, 0, b"old", &no_base).unwrap();
    staging.write(1, BS, b"other", &no_base).unwrap();
    let set = staging.take_for_upload(1).unwrap();
    staging.write(1, 0, b"new", &no_base).unwrap();
    staging.clear(&set).unwrap();
    assert_eq!(staging.dirty_blocks(1).unwrap(), vec![0]);
    assert_eq!(read_through(&staging, 1, &[], 0, 3), b"new");
    assert!(staging.staged_size(1).unwrap().is_some());
}

#[test]
fn truncate_between_take_and_clear_keeps_the_new_floor() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.set_size(1, 100).unwrap();
    let set = staging.take_for_upload(1).unwrap();
    assert_eq!(set.floor_bytes, Some(100));
    staging.set_size(1, 100).unwrap(); // truncated again: must be re-applied
    staging.clear(&set).unwrap();
    assert_eq!(staging.take_for_upload(1).unwrap().floor_bytes, Some(100));
    // An extension after the take does not re-apply the committed floor.
    let set = staging.take_for_upload(1).unwrap();
    staging.set_size(1, 5000).unwrap();
    staging.clear(&set).unwrap();
    let next = staging.take_for_upload(1).unwrap();
    assert_eq!(next.floor_bytes, None);
    assert_eq!(next.size, Some(StagedSize::Exact(5000)));
}

#[test]
fn take_for_upload_returns_at_most_the_max_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let count = UPLOAD_SET_BLOCK_COUNT_MAX as u64 + 3;
    staging
        .write(1, 0, &pattern((count * BS) as usize, 4), &no_base)
        .unwrap();
    let first = staging.take_for_upload(1).unwrap();
    assert_eq!(first.blocks.len(), UPLOAD_SET_BLOCK_COUNT_MAX);
    assert!(!first.complete);
    staging.clear(&first).unwrap();
    assert!(
        staging.staged_size(1).unwrap().is_some(),
        "record kept while blocks remain"
    );
    let second = staging.take_for_upload(1).unwrap();
    assert_eq!(second.blocks.len(), 3);
    assert!(second.complete);
    staging.clear(&second).unwrap();
    assert!(staging.recover().unwrap().is_empty());
}

#[test]
fn discard_drops_everything_for_the_inode() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(1, 0, b"doomed", &no_base).unwrap();
    staging.discard(1).unwrap();
    staging.discard(1).unwrap();
    assert!(staging.recover().unwrap().is_empty());
}

#[test]
fn sync_succeeds_with_and_without_staged_data() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.sync(1).unwrap();
    staging.write(1, 0, b"x", &no_base).unwrap();
    staging.sync(1).unwrap();
}

#[test]
fn offsets_past_the_file_size_max_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let err = staging.write(1, u64::MAX - 1, b"xx", &no_base).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(staging.set_size(1, u64::MAX).is_err());
}

/// A flush leaves the emptied inode dir for the timer thread (removing a
/// dir frees a block: a synchronous discard on some filesystems); only a
/// dir that is still empty is retired, and a deleted file's dir goes at
/// once, its removal later.
#[test]
fn emptied_inode_dirs_are_retired_later_and_never_with_data_in_them() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    let inode_dir = |ino: u64| dir.path().join(format!("{ino:016x}"));
    assert_eq!(staging.retire_due(), None);
    for ino in [1, 2] {
        staging.write(ino, 0, b"flushed", &no_base).unwrap();
        let set = staging.take_for_upload(ino).unwrap();
        staging.clear(&set).unwrap();
    }
    assert!(inode_dir(1).exists(), "kept until retired");
    let due = staging.retire_due().expect("a pass is due");
    assert!(due <= STAGING_RETIRE_DELAY);
    staging.write(2, 0, b"written again", &no_base).unwrap();

    for ino in staging.take_emptied() {
        staging.retire_if_empty(ino).unwrap();
    }
    assert_eq!(staging.remove_retired().unwrap(), 1);
    assert!(!inode_dir(1).exists());
    assert_eq!(read_through(&staging, 2, &[], 0, 13), b"written again");
    assert_eq!(staging.recover().unwrap(), vec![2]);
    assert_eq!(staging.retire_due(), None);

    staging.discard(2).unwrap();
    assert!(!inode_dir(2).exists(), "a deleted file's dir goes at once");
    assert!(staging.recover().unwrap().is_empty());
    assert!(staging.retire_due().is_some());
    assert_eq!(staging.remove_retired().unwrap(), 1);
    let retired: Vec<_> = std::fs::read_dir(dir.path().join("retired"))
        .unwrap()
        .collect();
    assert!(retired.is_empty(), "{retired:?}");
}

/// What a dead process left to retire is removed by the next one: an
/// empty inode dir is retired by recovery, and leftovers in `retired/`
/// make a pass due as soon as the area is opened.
#[test]
fn a_new_process_retires_what_a_dead_one_left() {
    let dir = tempfile::tempdir().unwrap();
    {
        let staging = Staging::open(dir.path(), BS).unwrap();
        staging.write(1, 0, b"x", &no_base).unwrap();
        let set = staging.take_for_upload(1).unwrap();
        staging.clear(&set).unwrap();
        staging.write(2, 0, b"y", &no_base).unwrap();
        staging.discard(2).unwrap();
    } // dies with dir 1 empty and dir 2 in retired/
    let staging = Staging::open(dir.path(), BS).unwrap();
    assert!(staging.retire_due().is_some(), "leftovers in retired/");
    assert!(staging.recover().unwrap().is_empty());
    assert!(!dir.path().join(format!("{:016x}", 1)).exists());
    assert_eq!(staging.remove_retired().unwrap(), 2);
}

/// A standby opens the area while its predecessor still writes; once it
/// owns the area it answers for every inode from memory, and must still
/// see all the predecessor staged, also what it staged after the open.
#[test]
fn an_owner_sees_what_its_predecessor_staged_and_forgets_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let predecessor = Staging::open(dir.path(), BS).unwrap();
    predecessor.write(3, 0, b"early", &no_base).unwrap();
    let standby = Staging::open(dir.path(), BS).unwrap();
    predecessor.write(4, BS, b"late", &no_base).unwrap();
    predecessor.set_size(5, 7).unwrap();
    drop(predecessor); // dead, or fenced for a handover

    assert_eq!(standby.own().unwrap(), vec![3, 4, 5]);
    assert_eq!(read_through(&standby, 3, &[], 0, 5), b"early");
    assert_eq!(read_through(&standby, 4, &[], BS, 4), b"late");
    assert_eq!(standby.dirty_blocks(4).unwrap(), vec![1]);
    assert_eq!(standby.staged_size(5).unwrap(), Some(StagedSize::Exact(7)));
    assert_eq!(standby.staged_size(6).unwrap(), None);

    // Committed and cleared: nothing staged, from memory and on disk.
    let set = standby.take_for_upload(3).unwrap();
    standby.clear(&set).unwrap();
    assert_eq!(standby.staged_size(3).unwrap(), None);
    assert!(standby.take_for_upload(3).unwrap().blocks.is_empty());
    assert!(!block_file(dir.path(), 3, 0).exists());
    // Staged again after the clear: seen again.
    standby
        .write(3, 2, b"again", &|_| Ok(Some(Bytes::from_static(b"xx"))))
        .unwrap();
    assert_eq!(read_through(&standby, 3, b"xx", 0, 7), b"xxagain");
    // Discarded (the file was deleted): gone, and a second discard is a no-op.
    standby.discard(4).unwrap();
    standby.discard(4).unwrap();
    assert_eq!(standby.dirty_blocks(4).unwrap(), Vec::<u64>::new());
    assert_eq!(standby.staged_inodes().unwrap(), vec![3, 5]);
}

fn size_record(dir: &std::path::Path, ino: u64) -> std::path::PathBuf {
    dir.join(format!("{ino:016x}")).join("size")
}

#[test]
fn extending_writes_rewrite_the_size_record_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    staging.write(3, 0, b"first", &no_base).unwrap();
    let record = size_record(dir.path(), 3);
    let inode = std::fs::metadata(&record).unwrap().ino();
    for end in 1..=20u64 {
        staging.write(3, end * 1000, b"more", &no_base).unwrap();
        assert_eq!(
            std::fs::metadata(&record).unwrap().ino(),
            inode,
            "an extending write replaced the size record (a new inode per WRITE)"
        );
    }
    staging.set_size(3, 7).unwrap();
    assert_eq!(std::fs::metadata(&record).unwrap().ino(), inode);
    drop(staging);
    let staging = Staging::open(dir.path(), BS).unwrap();
    assert_eq!(staging.staged_size(3).unwrap(), Some(StagedSize::Exact(7)));
}

/// Set in the child of `size_record_survives_kill_9_during_extending_writes`:
/// the staging directory it writes to.
const KILL_CHILD_ENV: &str = "BATON_STAGING_KILL_CHILD_DIR";

#[test]
fn size_record_survives_kill_9_during_extending_writes() {
    use std::io::{BufRead, Write};
    const INO: u64 = 21;
    if let Some(dir) = std::env::var_os(KILL_CHILD_ENV) {
        // The child: extending writes as fast as it can, printing the end
        // of each one acknowledged (returned) until it is killed.
        let staging = Staging::open(std::path::Path::new(&dir), BS).unwrap();
        let mut out = std::io::stdout().lock();
        for end in 1u64.. {
            staging.write(INO, end - 1, b"z", &no_base).unwrap();
            writeln!(out, "{end}").unwrap();
            out.flush().unwrap();
        }
        return;
    }
    let test_name = "size_record_survives_kill_9_during_extending_writes";
    for round in 0..5u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(KILL_CHILD_ENV, dir.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acknowledged = 0u64;
        // Let it run past its start-up, then kill it between any two of
        // its instructions: at a different write each round.
        let wanted = 500 + round * 137;
        for line in lines.by_ref() {
            if let Ok(end) = line.unwrap().trim().parse::<u64>() {
                acknowledged = end;
                if end >= wanted {
                    break;
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_micros(round * 300));
        child.kill().unwrap();
        child.wait().unwrap();
        for line in lines {
            if let Ok(end) = line.unwrap().trim().parse::<u64>() {
                acknowledged = end;
            }
        }
        assert!(
            acknowledged >= wanted,
            "round {round}: the child stopped early"
        );
        let staging = Staging::open(dir.path(), BS).unwrap();
        let Some(StagedSize::AtLeast(size)) = staging.staged_size(INO).unwrap() else {
            panic!("round {round}: no readable size record after kill -9");
        };
        assert!(
            size >= acknowledged,
            "round {round}: staged size {size} lost acknowledged writes up to {acknowledged}"
        );
        let bytes = read_through(&staging, INO, &[], 0, size);
        assert!(
            bytes.iter().all(|b| *b == b'z'),
            "round {round}: staged bytes corrupt"
        );
    }
}

#[test]
fn pending_counts_staged_bytes_and_the_oldest_write() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::open(dir.path(), BS).unwrap();
    assert_eq!(staging.pending().unwrap(), (0, None));
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(2);
    staging.write(3, 0, &pattern(100, 1), &no_base).unwrap();
    staging.write(4, BS, &pattern(10, 2), &no_base).unwrap();
    let (bytes, oldest) = staging.pending().unwrap();
    // Inode 4's write staged block 1 only, 10 bytes long (block 0 is a hole).
    assert_eq!(bytes, 100 + 10);
    assert!(oldest.is_some_and(|t| t >= before), "{oldest:?}");
}
