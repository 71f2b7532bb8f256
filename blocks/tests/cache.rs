//! BlockCache on real directories in front of real stores.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_blocks::{
    store_from_url, BlockCache, BlockStore, BlocksError, KeyLayout, ObjectKey,
    OPEN_OBJECT_FILES_MAX, PREFETCH_QUEUE_MAX, PREFETCH_WORKER_COUNT,
};
use bytes::Bytes;
use common::{file_url, pattern, Instrumented};

const BLOCK: usize = 1000;

fn setup() -> (tempfile::TempDir, Arc<BlockStore>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("objects")).unwrap();
    let store = BlockStore::open(&file_url(&dir.path().join("objects"))).unwrap();
    (dir, Arc::new(store))
}

fn put(store: &BlockStore, index: u64) -> ObjectKey {
    store
        .put_block(1, index, Bytes::from(pattern(BLOCK, index as u8)))
        .unwrap()
}

fn cache_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn miss_fetches_whole_block_then_other_ranges_hit() {
    let (dir, store) = setup();
    let key = put(&store, 0);
    let cache = BlockCache::open(&dir.path().join("cache"), 1 << 20, store).unwrap();
    let data = pattern(BLOCK, 0);
    assert_eq!(
        &cache.read(&key, BLOCK as u64, 10, 20).unwrap()[..],
        &data[10..30]
    );
    assert_eq!(
        &cache.read(&key, BLOCK as u64, 500, 1000).unwrap()[..],
        &data[500..]
    );
    assert!(cache.read(&key, BLOCK as u64, 2000, 10).unwrap().is_empty());
    let stats = cache.stats();
    assert_eq!((stats.miss_count, stats.hit_count), (1, 1));
    assert_eq!(stats.used_bytes, BLOCK as u64);
    assert_eq!(cache_files(&dir.path().join("cache")).len(), 1);
}

#[test]
fn eviction_keeps_used_bytes_within_capacity_dropping_least_recent() {
    let (dir, store) = setup();
    let keys: Vec<_> = (0..4).map(|i| put(&store, i)).collect();
    let cache_dir = dir.path().join("cache");
    let cache = BlockCache::open(&cache_dir, 3 * BLOCK as u64, store).unwrap();
    for key in &keys[..3] {
        cache.read(key, BLOCK as u64, 0, 1).unwrap();
    }
    cache.read(&keys[0], BLOCK as u64, 0, 1).unwrap(); // 0 is now most recent
    cache.read(&keys[3], BLOCK as u64, 0, 1).unwrap(); // evicts 1
    let stats = cache.stats();
    assert_eq!(stats.used_bytes, 3 * BLOCK as u64);
    assert_eq!(stats.entry_count, 3);
    assert!(!cache.contains(&keys[1]));
    assert!(cache.contains(&keys[0]) && cache.contains(&keys[2]) && cache.contains(&keys[3]));
    assert_eq!(cache_files(&cache_dir).len(), 3);
    // An evicted block is simply fetched again.
    assert_eq!(
        &cache.read(&keys[1], BLOCK as u64, 0, 4).unwrap()[..],
        &pattern(BLOCK, 1)[..4]
    );
}

#[test]
fn block_larger_than_capacity_is_served_but_not_cached() {
    let (dir, store) = setup();
    let key = put(&store, 0);
    let cache = BlockCache::open(&dir.path().join("cache"), 10, store).unwrap();
    assert_eq!(cache.read(&key, BLOCK as u64, 0, 5).unwrap().len(), 5);
    assert_eq!(cache.stats().entry_count, 0);
}

#[test]
fn reopen_reindexes_blocks_and_removes_partial_temp_files() {
    let (dir, store) = setup();
    let cache_dir = dir.path().join("cache");
    let keys: Vec<_> = (0..3).map(|i| put(&store, i)).collect();
    {
        let cache = BlockCache::open(&cache_dir, 1 << 20, store.clone()).unwrap();
        for key in &keys {
            cache.read(key, BLOCK as u64, 0, 1).unwrap();
        }
    }
    // An old partial file is a dead process's; a young one may be another
    // live process's insert in progress (a standby opening the same dir).
    let old = cache_dir.join(".tmp-00000000deadbeef");
    std::fs::write(&old, b"half a block").unwrap();
    let age = std::time::Duration::from_secs(baton_blocks::PARTIAL_FILE_AGE_S_MIN + 5);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - age)
        .unwrap();
    let young = cache_dir.join(".tmp-00000000cafef00d");
    std::fs::write(&young, b"being written").unwrap();
    // Objects gone from the store: reads after reopen must come from disk.
    assert_eq!(store.delete(&keys), 3);
    let cache = BlockCache::open(&cache_dir, 1 << 20, store.clone()).unwrap();
    assert!(!old.exists());
    assert!(young.exists(), "a young partial file was removed");
    std::fs::remove_file(&young).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.entry_count, stats.used_bytes), (3, 3 * BLOCK as u64));
    for (i, key) in keys.iter().enumerate() {
        let got = cache.read(key, BLOCK as u64, 100, 50).unwrap();
        assert_eq!(&got[..], &pattern(BLOCK, i as u8)[100..150]);
    }
    assert_eq!((cache.stats().hit_count, cache.stats().miss_count), (3, 0));
    drop(cache);
    // Reopening with a smaller capacity evicts down to it.
    let cache = BlockCache::open(&cache_dir, 2 * BLOCK as u64, store).unwrap();
    assert_eq!(cache.stats().entry_count, 2);
    assert_eq!(cache_files(&cache_dir).len(), 2);
}

#[test]
fn damaged_cache_file_is_refetched() {
    let (dir, store) = setup();
    let cache_dir = dir.path().join("cache");
    let key = put(&store, 7);
    let cache = BlockCache::open(&cache_dir, 1 << 20, store).unwrap();
    cache.read(&key, BLOCK as u64, 0, 1).unwrap();
    let file = cache_dir.join(cache_files(&cache_dir).remove(0));
    std::fs::write(&file, b"short").unwrap();
    let got = cache.read(&key, BLOCK as u64, 900, 100).unwrap();
    assert_eq!(&got[..], &pattern(BLOCK, 7)[900..]);
    assert_eq!(cache.stats().miss_count, 2);
}

#[test]
fn prefetch_fills_the_cache_in_the_background() {
    let (dir, store) = setup();
    let keys: Vec<_> = (0..4).map(|i| put(&store, i)).collect();
    let cache = BlockCache::open(&dir.path().join("cache"), 1 << 20, store).unwrap();
    let hints: Vec<_> = keys.iter().map(|k| (k.clone(), BLOCK as u64)).collect();
    assert_eq!(cache.prefetch(&hints), 4);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !keys.iter().all(|k| cache.contains(k)) {
        assert!(Instant::now() < deadline, "prefetch did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    for key in &keys {
        cache.read(key, BLOCK as u64, 0, 10).unwrap();
    }
    assert_eq!((cache.stats().hit_count, cache.stats().miss_count), (4, 0));
    // Already cached blocks are not queued again.
    assert_eq!(cache.prefetch(&hints), 0);
}

#[test]
fn prefetch_drops_hints_beyond_the_queue_max() {
    let inner = store_from_url("memory://").unwrap();
    let inst = Arc::new(Instrumented::new(inner, 0, 0));
    let store = Arc::new(BlockStore::new(inst.clone(), "instrumented://").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let cache = BlockCache::open(dir.path(), 1 << 20, store).unwrap();
    inst.get_delay_ms.store(200, Ordering::SeqCst);
    let total = PREFETCH_QUEUE_MAX + PREFETCH_WORKER_COUNT + 50;
    let hints: Vec<_> = (0..total as u64)
        .map(|i| (ObjectKey::from_parts(1, i, i, KeyLayout::PerInode), 10))
        .collect();
    let queued = cache.prefetch(&hints);
    assert!(
        queued <= PREFETCH_QUEUE_MAX + PREFETCH_WORKER_COUNT,
        "{queued}"
    );
    assert!(queued >= PREFETCH_QUEUE_MAX, "{queued}");
    let stats = cache.stats();
    assert_eq!(stats.prefetch_dropped_count as usize, total - queued);
    // Dropping the cache skips what is still queued instead of fetching it.
    let started = Instant::now();
    drop(cache);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_local_plain_store_is_read_in_place_and_nothing_is_copied() {
    let (dir, store) = setup();
    assert!(store.reads_in_place(), "file:// without a codec");
    let key = put(&store, 3);
    let cache = BlockCache::in_place(&store).unwrap();
    cache.insert(&key, &pattern(BLOCK, 3));
    let data = pattern(BLOCK, 3);
    assert_eq!(
        &cache.read(&key, BLOCK as u64, 10, 20).unwrap()[..],
        &data[10..30]
    );
    assert_eq!(
        &cache.read(&key, BLOCK as u64, 900, 1000).unwrap()[..],
        &data[900..],
        "a read past the block's end is cut at it"
    );
    assert!(cache.read(&key, BLOCK as u64, 2000, 10).unwrap().is_empty());
    assert!(!cache.contains(&key));
    let stats = cache.stats();
    assert_eq!(
        (stats.miss_count, stats.hit_count, stats.used_bytes),
        (2, 0, 0)
    );
    assert_eq!(
        cache_files(dir.path()),
        vec!["objects".to_string()],
        "no cache directory and no copies"
    );
    // A missing object, or one shorter than metadata says, is an error,
    // never zeros.
    let gone = ObjectKey::from_parts(1, 9, 9, KeyLayout::PerInode);
    assert!(matches!(
        cache.read(&gone, BLOCK as u64, 0, 10),
        Err(BlocksError::ObjectMissing { .. })
    ));
    assert!(matches!(
        cache.read(&key, 2 * BLOCK as u64, 0, 2 * BLOCK as u64),
        Err(BlocksError::ShortObject { .. })
    ));
}

#[test]
fn read_into_fills_the_callers_buffer_from_either_cache() {
    let (dir, store) = setup();
    let key = put(&store, 4);
    let data = pattern(BLOCK, 4);
    let in_place = BlockCache::in_place(&store).unwrap();
    let on_disk = BlockCache::open(&dir.path().join("cache"), 1 << 20, store).unwrap();
    for (name, cache) in [("in place", &in_place), ("on disk", &on_disk)] {
        let mut buf = vec![0xAAu8; 300];
        assert_eq!(
            cache.read_into(&key, BLOCK as u64, 100, &mut buf).unwrap(),
            300,
            "{name}"
        );
        assert_eq!(&buf[..], &data[100..400], "{name}");
        let mut buf = vec![0xAAu8; 300];
        assert_eq!(
            cache.read_into(&key, BLOCK as u64, 900, &mut buf).unwrap(),
            100,
            "{name}: a read past the block's end is cut at it"
        );
        assert_eq!(&buf[..100], &data[900..], "{name}");
        assert!(
            buf[100..].iter().all(|&b| b == 0xAA),
            "{name}: the rest is left alone"
        );
        let gone = ObjectKey::from_parts(1, 9, 9, KeyLayout::PerInode);
        assert!(
            cache.read_into(&gone, BLOCK as u64, 0, &mut buf).is_err(),
            "{name}"
        );
    }
}

/// Pages of `path` in the page cache (mincore of a mapping of it).
fn resident_pages(path: &std::path::Path) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: a read-only mapping of a file we hold open, unmapped before
    // return; `vec` has one byte per page of it.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED);
        assert_eq!(libc::mincore(addr, len, vec.as_mut_ptr()), 0);
        libc::munmap(addr, len);
    }
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

#[test]
fn prefetch_in_place_has_the_kernel_read_the_objects_ahead() {
    let (dir, store) = setup();
    let keys: Vec<ObjectKey> = (0..3).map(|i| put(&store, i)).collect();
    let paths: Vec<_> = keys
        .iter()
        .map(|k| dir.path().join("objects").join(k.to_string()))
        .collect();
    for path in &paths {
        let file = std::fs::File::open(path).unwrap();
        file.sync_all().unwrap();
        nix::fcntl::posix_fadvise(
            &file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .unwrap();
        assert_eq!(resident_pages(path), 0, "{} evicted", path.display());
    }
    let cache = BlockCache::in_place(&store).unwrap();
    let blocks: Vec<_> = keys.iter().map(|k| (k.clone(), BLOCK as u64)).collect();
    assert_eq!(cache.prefetch(&blocks), 3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while paths.iter().any(|p| resident_pages(p) == 0) {
        assert!(
            Instant::now() < deadline,
            "prefetched objects still not in memory"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let missing = ObjectKey::from_parts(1, 9, 9, KeyLayout::PerInode);
    assert_eq!(
        cache.prefetch(&[(missing.clone(), BLOCK as u64)]),
        1,
        "a hint for a missing object is queued"
    );
    assert!(
        matches!(
            cache.read(&missing, BLOCK as u64, 0, 10),
            Err(BlocksError::ObjectMissing { .. })
        ),
        "and the read that needs it reports it"
    );
    assert_eq!(
        &cache.read(&keys[2], BLOCK as u64, 0, BLOCK as u64).unwrap()[..],
        &pattern(BLOCK, 2)[..]
    );
}

#[test]
fn reads_in_place_stay_right_past_the_open_file_limit() {
    let (_dir, store) = setup();
    let count = OPEN_OBJECT_FILES_MAX as u64 + 8;
    let keys: Vec<ObjectKey> = (0..count).map(|i| put(&store, i)).collect();
    let cache = BlockCache::in_place(&store).unwrap();
    for round in 0..2 {
        for (i, key) in keys.iter().enumerate() {
            let got = cache.read(key, BLOCK as u64, 0, BLOCK as u64).unwrap();
            assert_eq!(&got[..], &pattern(BLOCK, i as u8)[..], "round {round}");
        }
    }
    let memory = BlockStore::open("memory://").unwrap();
    assert!(matches!(
        BlockCache::in_place(&memory),
        Err(BlocksError::InvalidArgument { .. })
    ));
}

#[test]
fn only_a_local_directory_without_a_codec_reads_in_place() {
    let (dir, _) = setup();
    let objects = file_url(&dir.path().join("objects"));
    assert!(!BlockStore::open("memory://").unwrap().reads_in_place());
    let lz4 = BlockStore::open(&format!("{objects}?compression=lz4")).unwrap();
    assert!(!lz4.reads_in_place(), "compressed objects are not blocks");
}
