//! [`InPlaceReader`]: ranged reads of block objects straight from the files
//! of a local-directory store (`file://DIR`), for
//! [`crate::BlockCache::in_place`].
//!
//! Written here rather than through `object_store`'s `LocalFileSystem`,
//! whose ranged GET opens the file anew for every request: a new open file
//! starts with no readahead state, so each 128 KiB FUSE read of a cold
//! sequential scan became one synchronous disk read. Keeping the last
//! [`OPEN_OBJECT_FILES_MAX`] object files open lets the kernel see the
//! scan and read ahead, and saves an open and a close per request.
//!
//! An object's file is `DIR/{key}`, the path `LocalFileSystem` writes it
//! to (keys are `[0-9a-f/-]`, which it stores without escaping; the tests
//! read through both). Objects are immutable, so an open file never goes
//! stale; one deleted while open is unreferenced and never read again.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use crate::error::{BlocksError, Result};
use crate::key::ObjectKey;

/// Object files kept open between reads at most.
pub const OPEN_OBJECT_FILES_MAX: usize = 64;

/// Reads block objects from their files under a local store's directory.
#[derive(Debug)]
pub(crate) struct InPlaceReader {
    root: PathBuf,
    open: Mutex<OpenFiles>,
    read_count: AtomicU64,
}

/// The most recently used object files, by key.
#[derive(Debug, Default)]
struct OpenFiles {
    files: HashMap<ObjectKey, (Arc<File>, u64)>,
    tick: u64,
}

impl OpenFiles {
    fn get(&mut self, key: &ObjectKey) -> Option<Arc<File>> {
        self.tick += 1;
        let tick = self.tick;
        self.files.get_mut(key).map(|(file, used)| {
            *used = tick;
            Arc::clone(file)
        })
    }

    fn insert(&mut self, key: ObjectKey, file: Arc<File>) {
        if self.files.len() >= OPEN_OBJECT_FILES_MAX {
            let oldest = self
                .files
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.files.remove(&oldest);
            }
        }
        self.tick += 1;
        self.files.insert(key, (file, self.tick));
    }
}

impl InPlaceReader {
    /// A reader of the objects under `root` (the store's directory).
    pub(crate) fn new(root: PathBuf) -> Self {
        InPlaceReader {
            root,
            open: Mutex::new(OpenFiles::default()),
            read_count: AtomicU64::new(0),
        }
    }

    /// Reads exactly `start..end` of object `key`.
    pub(crate) fn read(&self, key: &ObjectKey, start: u64, end: u64) -> Result<Bytes> {
        self.read_count.fetch_add(1, Ordering::Relaxed);
        let file = self.file(key)?;
        let mut buf = vec![0u8; (end - start) as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], start + filled as u64) {
                Ok(0) => {
                    return Err(BlocksError::ShortObject {
                        key: key.to_string(),
                        expected_bytes: end - start,
                        got_bytes: filled as u64,
                    })
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(key, e)),
            }
        }
        Ok(Bytes::from(buf))
    }

    /// Reads served so far.
    pub(crate) fn read_count(&self) -> u64 {
        self.read_count.load(Ordering::Relaxed)
    }

    fn file(&self, key: &ObjectKey) -> Result<Arc<File>> {
        if let Some(file) = self.lock().get(key) {
            return Ok(file);
        }
        // Opened outside the lock: other readers go on meanwhile. Two
        // threads opening the same object both insert; the second wins.
        let file = match File::open(self.root.join(key.to_string())) {
            Ok(file) => Arc::new(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(BlocksError::ObjectMissing {
                    key: key.to_string(),
                })
            }
            Err(e) => return Err(self.io_error(key, e)),
        };
        self.lock().insert(key.clone(), Arc::clone(&file));
        Ok(file)
    }

    fn lock(&self) -> MutexGuard<'_, OpenFiles> {
        // The map is valid after any single statement.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn io_error(&self, key: &ObjectKey, source: std::io::Error) -> BlocksError {
        BlocksError::ObjectFileIo {
            path: self.root.join(key.to_string()),
            source,
        }
    }
}
