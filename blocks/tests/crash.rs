//! Crash ordering of a flush: upload objects, commit metadata (caller), clear
//! staging. A "crash" drops every handle and reopens from disk; re-running
//! the flush from the staging directory must give the same file content.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use baton_blocks::{BlockStore, ObjectKey, Staging, UploadSet};
use bytes::Bytes;
use common::{file_url, pattern};

const BS: u64 = 4096;
const INO: u64 = 77;

/// Stand-in for the metadata engine: committed size and block map.
#[derive(Clone, Debug, Default)]
struct Meta {
    size: u64,
    blocks: BTreeMap<u64, (ObjectKey, u64)>,
}

impl Meta {
    /// The one metadata transaction of a flush, in the documented order.
    fn commit(&mut self, set: &UploadSet, keys: &[ObjectKey]) {
        if let Some(floor) = set.floor_bytes {
            self.blocks.retain(|index, _| index * BS < floor);
            for (index, (_, len)) in self.blocks.iter_mut() {
                *len = (*len).min(floor - index * BS);
            }
        }
        for (block, key) in set.blocks.iter().zip(keys) {
            self.blocks
                .insert(block.index, (key.clone(), block.data.len() as u64));
        }
        if let Some(size) = set.size {
            self.size = size.resolve(self.size);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum CrashAt {
    AfterTake,
    AfterUpload,
    AfterCommit,
    Never,
}

fn committed_block(meta: &Meta, store: &BlockStore, index: u64) -> Option<Bytes> {
    meta.blocks
        .get(&index)
        .map(|(key, len)| store.get_range(key, 0..*len).unwrap())
}

/// The file as a reader sees it: committed blocks under the staged overlay.
fn read_file(meta: &Meta, store: &BlockStore, staging: &Staging) -> Vec<u8> {
    let overlay = staging.read_overlay(INO, 0, 1 << 20).unwrap();
    let size = overlay.size.map_or(meta.size, |s| s.resolve(meta.size));
    let mut buf = vec![0u8; size as usize];
    for index in meta.blocks.keys() {
        let data = committed_block(meta, store, *index).unwrap_or_default();
        let start = (index * BS) as usize;
        let end = (start + data.len()).min(buf.len());
        if start < end {
            buf[start..end].copy_from_slice(&data[..end - start]);
        }
    }
    overlay.apply(0, &mut buf);
    buf
}

/// One flush of up to the max blocks; returns false if it "crashed".
fn flush_once(meta: &mut Meta, store: &BlockStore, staging: &Staging, crash: CrashAt) -> bool {
    let set = staging.take_for_upload(INO).unwrap();
    if crash == CrashAt::AfterTake {
        return false;
    }
    let uploads = set
        .blocks
        .iter()
        .map(|b| (INO, b.index, b.data.clone()))
        .collect();
    let keys = store.put_blocks(uploads).unwrap();
    if crash == CrashAt::AfterUpload {
        return false;
    }
    meta.commit(&set, &keys);
    if crash == CrashAt::AfterCommit {
        return false;
    }
    staging.clear(&set).unwrap();
    true
}

fn flush_all(meta: &mut Meta, store: &BlockStore, staging: &Staging) {
    for _ in 0..100 {
        if staging.recover().unwrap().is_empty() {
            return;
        }
        assert!(flush_once(meta, store, staging, CrashAt::Never));
    }
    panic!("flush did not converge");
}

struct Model(Vec<u8>);

impl Model {
    fn write(
        &mut self,
        staging: &Staging,
        meta: &Meta,
        store: &BlockStore,
        offset: u64,
        data: &[u8],
    ) {
        let end = offset as usize + data.len();
        if self.0.len() < end {
            self.0.resize(end, 0);
        }
        self.0[offset as usize..end].copy_from_slice(data);
        let base = |index: u64| Ok(committed_block(meta, store, index));
        staging.write(INO, offset, data, &base).unwrap();
    }

    fn truncate(&mut self, staging: &Staging, size: u64) {
        self.0.resize(size as usize, 0);
        staging.set_size(INO, size).unwrap();
    }
}

fn open(dir: &Path) -> (BlockStore, Staging) {
    let store = BlockStore::open(&file_url(&dir.join("objects"))).unwrap();
    let staging = Staging::open(&dir.join("staging"), BS).unwrap();
    (store, staging)
}

fn scenario(crash: CrashAt) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("objects")).unwrap();
    let mut meta = Meta::default();
    let mut model = Model(Vec::new());
    {
        let (store, staging) = open(dir.path());
        // Phase 1: committed baseline of 5 blocks.
        model.write(
            &staging,
            &meta,
            &store,
            0,
            &pattern(5 * BS as usize - 100, 1),
        );
        flush_all(&mut meta, &store, &staging);
        assert_eq!(read_file(&meta, &store, &staging), model.0);
        // Phase 2: overwrite across a boundary, truncate, extend, write past the floor.
        model.write(&staging, &meta, &store, BS - 10, &pattern(30, 2));
        model.truncate(&staging, 2 * BS + 50);
        model.truncate(&staging, 6 * BS);
        model.write(&staging, &meta, &store, 3 * BS + 7, b"after-truncate");
        assert_eq!(read_file(&meta, &store, &staging), model.0);
        assert!(!flush_once(&mut meta, &store, &staging, crash) || crash == CrashAt::Never);
        // kill -9: every handle dropped without further cleanup.
    }
    let (store, staging) = open(dir.path());
    let pending = staging.recover().unwrap();
    assert_eq!(pending.is_empty(), crash == CrashAt::Never, "{crash:?}");
    assert_eq!(
        read_file(&meta, &store, &staging),
        model.0,
        "before re-flush, {crash:?}"
    );
    flush_all(&mut meta, &store, &staging);
    assert!(staging.recover().unwrap().is_empty());
    assert_eq!(meta.size, model.0.len() as u64);
    assert_eq!(
        read_file(&meta, &store, &staging),
        model.0,
        "after re-flush, {crash:?}"
    );
    // Every mapped object exists; orphans from the crashed attempt are only garbage.
    for (key, _) in meta.blocks.values() {
        assert!(store.list_keys().unwrap().contains(key));
    }
}

#[test]
fn crash_after_take_loses_nothing() {
    scenario(CrashAt::AfterTake);
}

#[test]
fn crash_after_upload_loses_nothing() {
    scenario(CrashAt::AfterUpload);
}

#[test]
fn crash_after_commit_before_clear_loses_nothing() {
    scenario(CrashAt::AfterCommit);
}

#[test]
fn flush_without_crash_matches_model() {
    scenario(CrashAt::Never);
}

#[test]
fn repeated_crashes_at_every_step_converge() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("objects")).unwrap();
    let mut meta = Meta::default();
    let mut model = Model(Vec::new());
    {
        let (store, staging) = open(dir.path());
        model.write(&staging, &meta, &store, 10, &pattern(3 * BS as usize, 3));
        model.truncate(&staging, BS + 1);
    }
    for crash in [
        CrashAt::AfterCommit,
        CrashAt::AfterUpload,
        CrashAt::AfterCommit,
        CrashAt::AfterTake,
    ] {
        let (store, staging) = open(dir.path());
        assert_eq!(read_file(&meta, &store, &staging), model.0, "{crash:?}");
        flush_once(&mut meta, &store, &staging, crash);
    }
    let (store, staging) = open(dir.path());
    flush_all(&mut meta, &store, &staging);
    assert_eq!(read_file(&meta, &store, &staging), model.0);
}
