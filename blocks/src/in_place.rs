//! [`InPlaceReader`]: ranged reads of block objects straight from the files
//! of a local-directory store (`file://DIR`), for
//! [`crate::BlockCache::in_place`].
//!
//! Written here rather than through `object_store`'s `LocalFileSystem`,
//! whose ranged GET opens the file anew for every request: a new open file
//! starts with no readahead state, so each 128 KiB FUSE read of a cold
//! sequential scan became one synchronous disk read. Keeping the most
//! recently read object files open (up to [`OPEN_OBJECT_FILES_MAX`], and a
//! quarter of the process's open-file limit) lets the kernel see the scan
//! and read ahead, and saves an open and a close per request: at 64 files,
//! cold random reads of a 1 GiB file (256 objects) opened and closed a
//! file for 3 READs in 4.
//!
//! An object's file is `DIR/{key}`, the path `LocalFileSystem` writes it
//! to (keys are `[0-9a-f/-]`, which it stores without escaping; the tests
//! read through both). Objects are immutable, so an open file never goes
//! stale; one deleted while open is unreferenced and never read again.
//!
//! The kernel reads ahead within one object file only. A scan that
//! crosses into the next block would wait for the disk at every block
//! boundary (a quarter of a cold sequential read's time, measured), so
//! [`InPlaceReader::prefetch`] has a thread ask the kernel for the next
//! blocks' files before the scan reaches them.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use bytes::Bytes;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::error::{BlocksError, Result};
use crate::key::ObjectKey;

/// Object files kept open between reads at most (4 GiB of 4 MiB blocks).
pub const OPEN_OBJECT_FILES_MAX: usize = 1024;
/// Readahead hints waiting for the readahead thread at most; more are
/// dropped (the scan is then further ahead than the disk).
const READAHEAD_QUEUE_MAX: usize = 16;

/// Reads block objects from their files under a local store's directory.
#[derive(Debug)]
pub(crate) struct InPlaceReader {
    files: Arc<ObjectFiles>,
    readahead_tx: Option<SyncSender<(ObjectKey, u64)>>,
    readahead: Option<JoinHandle<()>>,
}

/// The store's directory and the object files open in it.
#[derive(Debug)]
struct ObjectFiles {
    root: PathBuf,
    open: Mutex<OpenFiles>,
    read_count: AtomicU64,
    // The store's counters: a read here is its GET.
    counters: Arc<crate::op_stats::StoreCounters>,
}

/// The most recently used object files, by key.
#[derive(Debug)]
struct OpenFiles(hashlink::LruCache<ObjectKey, Arc<File>>);

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles(hashlink::LruCache::new(open_files_max()))
    }
}

impl OpenFiles {
    fn get(&mut self, key: &ObjectKey) -> Option<Arc<File>> {
        self.0.get(key).map(Arc::clone)
    }

    fn insert(&mut self, key: ObjectKey, file: Arc<File>) {
        self.0.insert(key, file);
    }
}

/// [`OPEN_OBJECT_FILES_MAX`], or a quarter of the soft open-file limit if
/// that is less (`fsclient mount` run by hand keeps the usual 1024).
fn open_files_max() -> usize {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let quarter = usize::try_from(limit / 4).unwrap_or(usize::MAX);
    quarter.clamp(16, OPEN_OBJECT_FILES_MAX)
}

impl InPlaceReader {
    /// A reader of the objects under `root` (the store's directory), with
    /// its readahead thread.
    pub(crate) fn new(
        root: PathBuf,
        counters: Arc<crate::op_stats::StoreCounters>,
    ) -> Result<Self> {
        let files = Arc::new(ObjectFiles {
            root,
            open: Mutex::new(OpenFiles::default()),
            read_count: AtomicU64::new(0),
            counters,
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(READAHEAD_QUEUE_MAX);
        let worker = Arc::clone(&files);
        let readahead = std::thread::Builder::new()
            .name("baton-readahead".to_string())
            .spawn(move || readahead_loop(&worker, &rx))
            .map_err(|e| BlocksError::cache("readahead thread start", &files.root, e))?;
        Ok(InPlaceReader {
            files,
            readahead_tx: Some(tx),
            readahead: Some(readahead),
        })
    }

    /// Reads exactly `start..end` of object `key`.
    pub(crate) fn read(&self, key: &ObjectKey, start: u64, end: u64) -> Result<Bytes> {
        let mut buf = vec![0u8; (end - start) as usize];
        self.files.read_into(key, start, &mut buf)?;
        Ok(Bytes::from(buf))
    }

    /// Fills `buf` from offset `start` of object `key`.
    pub(crate) fn read_into(&self, key: &ObjectKey, start: u64, buf: &mut [u8]) -> Result<()> {
        self.files.read_into(key, start, buf)
    }

    /// Queues the first `len` bytes of each object for the readahead
    /// thread, which asks the kernel to read them into the page cache
    /// (`POSIX_FADV_WILLNEED`: allocating the pages for 4 MiB takes about
    /// a millisecond here, which no request should wait for). Returns how
    /// many were queued. A hint: an object that cannot be opened is
    /// skipped, and the read that needs it reports the error.
    pub(crate) fn prefetch(&self, blocks: &[(ObjectKey, u64)]) -> usize {
        let Some(tx) = &self.readahead_tx else {
            return 0;
        };
        let mut queued_count = 0;
        for block in blocks {
            match tx.try_send(block.clone()) {
                Ok(()) => queued_count += 1,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => break,
            }
        }
        queued_count
    }

    /// Reads served so far.
    pub(crate) fn read_count(&self) -> u64 {
        self.files.read_count.load(Ordering::Relaxed)
    }
}

impl Drop for InPlaceReader {
    fn drop(&mut self) {
        self.readahead_tx = None;
        if let Some(thread) = self.readahead.take() {
            if thread.join().is_err() {
                tracing::error!("readahead thread panicked");
            }
        }
    }
}

/// Advises the kernel of each queued object until the reader is dropped.
fn readahead_loop(files: &ObjectFiles, rx: &Receiver<(ObjectKey, u64)>) {
    while let Ok((key, len)) = rx.recv() {
        files.advise(&key, len);
    }
}

impl ObjectFiles {
    fn read_into(&self, key: &ObjectKey, start: u64, buf: &mut [u8]) -> Result<()> {
        self.read_count.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = self.read_file(key, start, buf);
        let op = crate::op_stats::StoreOp::Get;
        self.counters.record(op, started, result.is_ok());
        if result.is_ok() {
            self.counters.received(buf.len() as u64);
        }
        result
    }

    fn read_file(&self, key: &ObjectKey, start: u64, buf: &mut [u8]) -> Result<()> {
        let file = self.file(key)?;
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], start + filled as u64) {
                Ok(0) => {
                    return Err(BlocksError::ShortObject {
                        key: key.to_string(),
                        expected_bytes: buf.len() as u64,
                        got_bytes: filled as u64,
                    })
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(key, e)),
            }
        }
        Ok(())
    }

    /// Asks the kernel to read the first `len` bytes of `key` into its page
    /// cache. Asking again is cheap (pages already there are skipped), and
    /// needed: the pages may have been evicted while the file stayed open.
    fn advise(&self, key: &ObjectKey, len: u64) {
        let file = match self.file(key) {
            Ok(file) => file,
            Err(error) => {
                tracing::debug!(%key, %error, "object readahead skipped");
                return;
            }
        };
        let len = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
        if let Err(errno) = posix_fadvise(
            file.as_fd(),
            0,
            len,
            PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        ) {
            tracing::debug!(%key, %errno, "object readahead refused");
        }
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
