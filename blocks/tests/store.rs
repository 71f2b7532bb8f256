//! BlockStore against real LocalFileSystem stores.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_blocks::{
    store_from_url, BlockStore, BlocksError, KeyLayout, ObjectKey, MULTIPART_PART_BYTES,
    MULTIPART_THRESHOLD_BYTES, RETRY_ATTEMPT_COUNT_MAX, UPLOAD_PARALLEL_MAX,
};
use bytes::Bytes;
use common::{file_url, pattern, Instrumented};

#[test]
fn put_block_then_ranged_gets_return_exact_bytes() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    let data = pattern(10_000, 3);
    let key = store.put_block(42, 5, Bytes::from(data.clone())).unwrap();
    assert_eq!((key.ino(), key.index()), (42, 5));
    assert_eq!(&store.get_range(&key, 0..10).unwrap()[..], &data[0..10]);
    assert_eq!(
        &store.get_range(&key, 4096..10_000).unwrap()[..],
        &data[4096..]
    );
    assert!(store.get_range(&key, 7..7).unwrap().is_empty());
    // The object sits at the documented key path under the root.
    let on_disk = root.path().join(key.to_string());
    assert_eq!(std::fs::read(on_disk).unwrap(), data);
}

#[test]
fn same_block_uploaded_twice_gets_distinct_keys_and_both_objects_survive() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    let a = store.put_block(1, 0, Bytes::from_static(b"first")).unwrap();
    let b = store
        .put_block(1, 0, Bytes::from_static(b"second"))
        .unwrap();
    assert_ne!(a, b);
    assert_eq!(&store.get_range(&a, 0..5).unwrap()[..], b"first");
    assert_eq!(&store.get_range(&b, 0..6).unwrap()[..], b"second");
    assert_eq!(store.list_keys().unwrap().len(), 2);
}

#[test]
fn missing_object_is_object_missing_with_eio() {
    let store = BlockStore::open("memory://").unwrap();
    let key = ObjectKey::from_parts(1, 2, 3, KeyLayout::PerInode);
    let err = store.get_range(&key, 0..10).unwrap_err();
    assert!(matches!(err, BlocksError::ObjectMissing { .. }), "{err}");
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains(&key.to_string()));
}

#[test]
fn short_object_is_reported() {
    let store = BlockStore::open("memory://").unwrap();
    let key = store.put_block(1, 0, Bytes::from_static(b"abc")).unwrap();
    let err = store.get_range(&key, 0..10).unwrap_err();
    assert!(
        matches!(err, BlocksError::ShortObject { got_bytes: 3, .. }),
        "{err}"
    );
}

#[test]
fn put_blocks_keeps_order_and_reaches_upload_parallel_max() {
    let inner = store_from_url("memory://").unwrap();
    let inst = Arc::new(Instrumented::new(inner, 40, 0));
    let store = BlockStore::new(inst.clone(), "instrumented://").unwrap();
    let count = UPLOAD_PARALLEL_MAX * 3;
    let blocks: Vec<_> = (0..count as u64)
        .map(|i| (9, i, Bytes::from(pattern(100, i as u8))))
        .collect();
    let keys = store.put_blocks(blocks).unwrap();
    assert_eq!(keys.len(), count);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(key.index(), i as u64);
        assert_eq!(
            &store.get_range(key, 0..100).unwrap()[..],
            &pattern(100, i as u8)[..]
        );
    }
    assert_eq!(inst.peak.load(Ordering::SeqCst), UPLOAD_PARALLEL_MAX);
}

#[test]
fn transient_put_failures_are_retried_up_to_the_max() {
    let inner = store_from_url("memory://").unwrap();
    let inst = Arc::new(Instrumented::new(inner, 0, RETRY_ATTEMPT_COUNT_MAX - 1));
    let store = BlockStore::new(inst.clone(), "instrumented://").unwrap();
    let key = store.put_block(1, 0, Bytes::from_static(b"x")).unwrap();
    assert_eq!(&store.get_range(&key, 0..1).unwrap()[..], b"x");
    assert_eq!(
        inst.put_calls.load(Ordering::SeqCst),
        RETRY_ATTEMPT_COUNT_MAX
    );
}

#[test]
fn put_gives_up_after_retry_attempt_count_max() {
    let inner = store_from_url("memory://").unwrap();
    let inst = Arc::new(Instrumented::new(inner, 0, RETRY_ATTEMPT_COUNT_MAX));
    let store = BlockStore::new(inst.clone(), "instrumented://").unwrap();
    let err = store.put_block(1, 0, Bytes::from_static(b"x")).unwrap_err();
    match &err {
        BlocksError::Put { attempt_count, .. } => {
            assert_eq!(*attempt_count, RETRY_ATTEMPT_COUNT_MAX)
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("still staged"));
    assert_eq!(
        inst.put_calls.load(Ordering::SeqCst),
        RETRY_ATTEMPT_COUNT_MAX
    );
}

#[test]
fn failed_batch_deletes_the_objects_it_uploaded() {
    let inner = store_from_url("memory://").unwrap();
    let inst = Arc::new(Instrumented::new(inner, 0, 0));
    let store = BlockStore::new(inst.clone(), "instrumented://").unwrap();
    let kept = store.put_block(1, 0, Bytes::from_static(b"kept")).unwrap();
    *inst.fail_paths_containing.lock().unwrap() = Some(format!("blocks/{:016x}/", 3));
    let batch = (2..6)
        .map(|ino| (ino, 0, Bytes::from_static(b"a")))
        .collect();
    let err = store.put_blocks(batch).unwrap_err();
    assert!(matches!(err, BlocksError::Put { .. }), "{err}");
    assert!(err.to_string().contains("0000000000000003"), "{err}");
    assert_eq!(store.list_keys().unwrap(), vec![kept]);
}

#[test]
fn delete_is_best_effort_and_counts_missing_as_deleted() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    let a = store.put_block(1, 0, Bytes::from_static(b"a")).unwrap();
    let b = store.put_block(1, 1, Bytes::from_static(b"b")).unwrap();
    let never = ObjectKey::from_parts(1, 2, 3, KeyLayout::PerInode);
    assert_eq!(store.delete(&[a.clone(), b, never]), 3);
    assert!(store.list_keys().unwrap().is_empty());
    assert!(matches!(
        store.get_range(&a, 0..1),
        Err(BlocksError::ObjectMissing { .. })
    ));
}

#[test]
fn deleting_a_local_directory_stores_last_objects_leaves_no_empty_directories() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    let a = store.put_block(7, 0, Bytes::from_static(b"a")).unwrap();
    let b = store.put_block(8, 0, Bytes::from_static(b"b")).unwrap();
    assert_eq!(store.delete(&[a]), 1);
    let left = walkdir(root.path());
    assert_eq!(
        left.len(),
        3,
        "blocks/, inode 8's directory and object: {left:?}"
    );
    assert_eq!(store.delete(&[b]), 1);
    assert_eq!(
        walkdir(root.path()),
        Vec::<std::path::PathBuf>::new(),
        "one directory per inode would pile up for every file ever written"
    );
    // And the store still takes new objects.
    let c = store.put_block(7, 1, Bytes::from_static(b"c")).unwrap();
    assert_eq!(&store.get_range(&c, 0..1).unwrap()[..], b"c");
}

#[test]
fn a_fanned_local_store_shares_directories_and_leaves_none_empty() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path()))
        .unwrap()
        .with_key_layout(KeyLayout::Fanned);
    let mut keys: Vec<ObjectKey> = (0..64)
        .map(|ino| {
            store
                .put_block(ino, 0, Bytes::from(vec![ino as u8; 10]))
                .unwrap()
        })
        .collect();
    // Several blocks at once take the runtime's path.
    let batch = (0..3)
        .map(|i| (99, i, Bytes::from(vec![i as u8; 10])))
        .collect();
    keys.extend(store.put_blocks(batch).unwrap());
    for key in &keys {
        assert_eq!(key.layout(), KeyLayout::Fanned);
        let name = key.to_string();
        assert_eq!(ObjectKey::parse(&name).unwrap(), *key);
        let byte = if key.ino() == 99 {
            key.index()
        } else {
            key.ino()
        } as u8;
        assert_eq!(&store.get_range(key, 0..10).unwrap()[..], &[byte; 10]);
    }
    let dirs: Vec<String> = std::fs::read_dir(root.path().join("blocks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        dirs.iter().all(|d| d.len() == 2),
        "fan directories only, none per inode: {dirs:?}"
    );
    let mut listed = store.list_keys().unwrap();
    listed.sort();
    keys.sort();
    assert_eq!(listed, keys);
    assert_eq!(store.delete(&keys), keys.len());
    assert_eq!(walkdir(root.path()), Vec::<std::path::PathBuf>::new());
}

/// Every file and directory under `dir` (not `dir` itself).
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walkdir(&path));
        }
        found.push(path);
    }
    found
}

#[test]
fn unsupported_and_invalid_urls_are_clear_errors() {
    let err = store_from_url("gs://bucket/prefix").unwrap_err();
    assert!(matches!(err, BlocksError::UnsupportedScheme { .. }));
    assert!(err.to_string().contains("unsupported scheme"), "{err}");
    assert!(matches!(
        store_from_url("s3://Not_A_Bucket/prefix"),
        Err(BlocksError::InvalidUrl { .. })
    ));
    assert!(matches!(
        store_from_url("file://relative/dir"),
        Err(BlocksError::InvalidUrl { .. })
    ));
    assert!(matches!(
        store_from_url("/no/scheme"),
        Err(BlocksError::InvalidUrl { .. })
    ));
}

#[test]
fn missing_file_root_is_storage_unreachable() {
    let root = tempfile::tempdir().unwrap();
    let url = file_url(&root.path().join("does-not-exist"));
    let err = BlockStore::open(&url).unwrap_err();
    assert!(
        matches!(err, BlocksError::StorageUnreachable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("does-not-exist"), "{err}");
}

#[test]
fn unwritable_root_fails_the_reachability_probe() {
    let root = tempfile::tempdir().unwrap();
    // A regular file where the root directory should be: opening works,
    // but nothing can be created under it (also as root).
    let file = root.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let store = BlockStore::open(&file_url(&file)).unwrap();
    let err = store.check_reachable().unwrap_err();
    assert!(
        matches!(err, BlocksError::StorageUnreachable { .. }),
        "{err}"
    );
    assert_eq!(err.errno(), libc::EIO);
}

#[test]
fn reachable_store_passes_the_probe_and_leaves_no_probe_object() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    store.check_reachable().unwrap();
    let probe_dir = root.path().join("probe");
    let leftovers = std::fs::read_dir(&probe_dir)
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(leftovers, 0);
}

#[test]
fn blocks_past_the_multipart_threshold_upload_in_parts_and_read_back_whole() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    // Not a multiple of the part size: the last part is short.
    let len = MULTIPART_THRESHOLD_BYTES + MULTIPART_PART_BYTES / 2 + 7;
    let data = pattern(len, 9);
    let key = store.put_block(3, 1, Bytes::from(data.clone())).unwrap();
    let mid = MULTIPART_PART_BYTES as u64 - 5..MULTIPART_PART_BYTES as u64 + 5;
    assert_eq!(
        &store.get_range(&key, mid.clone()).unwrap()[..],
        &data[mid.start as usize..mid.end as usize]
    );
    assert_eq!(
        std::fs::read(root.path().join(key.to_string())).unwrap(),
        data
    );
    assert_eq!(store.list_keys().unwrap(), vec![key]);
}

#[test]
fn an_encrypted_compressed_store_round_trips_and_hides_the_bytes() {
    use baton_blocks::{key_check, CodecSpec};
    let root = tempfile::tempdir().unwrap();
    let key = [42u8; 32];
    let spec = CodecSpec {
        compress: true,
        key_check: Some(key_check(&key)),
        kdf_salt: None,
    };
    let url = spec.add_to_url(&file_url(root.path()));
    let store = BlockStore::open_with_key(&url, Some(&key)).unwrap();
    store.check_reachable().unwrap();
    let mut data = b"PLAINTEXT-MARKER ".repeat(4000);
    data.extend(pattern(10_000, 5));
    let k = store.put_block(9, 0, Bytes::from(data.clone())).unwrap();
    assert_eq!(
        &store.get_range(&k, 0..17).unwrap()[..],
        b"PLAINTEXT-MARKER "
    );
    assert_eq!(
        &store.get_range(&k, 60_000..78_000).unwrap()[..],
        &data[60_000..78_000]
    );
    let on_disk = std::fs::read(root.path().join(k.to_string())).unwrap();
    assert!(on_disk.len() < data.len() / 2, "compressed before sealing");
    assert!(!on_disk.windows(16).any(|w| w == b"PLAINTEXT-MARKER"));
    // A range past the block is a short object, not garbage bytes.
    assert!(matches!(
        store.get_range(&k, 0..data.len() as u64 + 1),
        Err(BlocksError::ShortObject { .. })
    ));
    // Large blocks go through multipart and the codec alike.
    let big = pattern(baton_blocks::MULTIPART_THRESHOLD_BYTES + 3, 1);
    let kb = store.put_block(9, 1, Bytes::from(big.clone())).unwrap();
    assert_eq!(
        &store.get_range(&kb, 0..big.len() as u64).unwrap()[..],
        &big[..]
    );

    let none = BlockStore::open(&url).unwrap_err();
    assert!(matches!(none, BlocksError::KeyNeeded { .. }), "{none}");
    let wrong = BlockStore::open_with_key(&url, Some(&[1u8; 32])).unwrap_err();
    assert!(matches!(wrong, BlocksError::WrongKey { .. }), "{wrong}");
    // Listing and deleting work without the key.
    let raw = BlockStore::open_undecoded(&url).unwrap();
    assert_eq!(raw.list_keys().unwrap().len(), 2);
    assert_eq!(raw.delete(&[k]), 1);
}

/// One block to a local store is written on the caller's thread
/// (`local_put.rs`): the file `LocalFileSystem` would write, no temp file
/// left beside it, and a data directory that cannot hold it is an error
/// naming the file.
#[test]
fn a_local_put_leaves_only_the_object_and_names_a_file_it_cannot_write() {
    let root = tempfile::tempdir().unwrap();
    let store = BlockStore::open(&file_url(root.path())).unwrap();
    let key = store.put_block(7, 0, Bytes::from_static(b"abc")).unwrap();
    let keys = store
        .put_blocks(vec![(7, 1, Bytes::from_static(b"de"))])
        .unwrap();
    let inode_dir = root.path().join(key.to_string());
    let mut names: Vec<String> = std::fs::read_dir(inode_dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want = [key.to_string(), keys[0].to_string()];
    want.sort();
    let want: Vec<String> = want
        .iter()
        .map(|k| k.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(names, want);
    assert_eq!(store.list_keys().unwrap().len(), 2);
    assert_eq!(&store.get_range(&keys[0], 0..2).unwrap()[..], b"de");

    let broken = tempfile::tempdir().unwrap();
    std::fs::write(broken.path().join("blocks"), b"not a directory").unwrap();
    let store = BlockStore::open(&file_url(broken.path())).unwrap();
    let err = store
        .put_block(7, 0, Bytes::from_static(b"abc"))
        .unwrap_err();
    assert!(matches!(err, BlocksError::ObjectFileWrite { .. }), "{err}");
    assert!(
        err.to_string().contains("blocks/0000000000000007/"),
        "{err}"
    );
    assert!(err.to_string().contains("data directory"), "{err}");
}

#[test]
fn stats_count_calls_errors_and_bytes_by_operation() {
    let store = BlockStore::open("memory://").unwrap();
    let key = store
        .put_block(1, 0, Bytes::from_static(b"0123456789"))
        .unwrap();
    assert_eq!(&store.get_range(&key, 2..6).unwrap()[..], b"2345");
    let missing = ObjectKey::from_parts(1, 2, 3, KeyLayout::PerInode);
    assert!(store.get_range(&missing, 0..1).is_err());
    assert_eq!(store.list_keys().unwrap().len(), 1);
    assert_eq!(store.delete(&[key]), 1);
    let stats = store.stats();
    let op = |name: &str| {
        stats
            .operations
            .iter()
            .find(|(op, _)| op.name() == name)
            .map(|(_, s)| {
                (
                    s.count,
                    s.error_count,
                    s.latency_buckets.iter().sum::<u64>(),
                )
            })
            .unwrap()
    };
    assert_eq!(op("put"), (1, 0, 1));
    assert_eq!(op("get"), (2, 1, 2));
    assert_eq!(op("list"), (1, 0, 1));
    assert_eq!(op("delete"), (1, 0, 1));
    assert_eq!((stats.sent_bytes, stats.received_bytes), (10, 4));
}
