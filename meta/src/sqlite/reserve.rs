//! Room kept beside the database for deletions on a full disk.
//!
//! Every metadata change appends to SQLite's write-ahead log, deletions
//! too: on a disk full even for root (a tmpfs, XFS, a node whose root
//! reserve is gone) `rm` inside the mount answered ENOSPC, and the only
//! way to free space was outside it. So the database keeps a file of
//! [`RESERVE_BYTES`] allocated (`meta.db-reserve`). A write that fails for
//! lack of space releases it and runs once more: that one, and the
//! deletions after it, have room; writes that add data still hear ENOSPC
//! from the full staging and object store. The reserve is taken again once
//! the disk has [`REARM_FREE_BYTES_MIN`] available, checked at most every
//! [`REARM_INTERVAL`].

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes kept allocated for deletions on a full disk.
pub const RESERVE_BYTES: u64 = 16 << 20;
/// Space the disk must have available before the reserve is taken again
/// (taking it back must not fill the disk at once).
pub const REARM_FREE_BYTES_MIN: u64 = 4 * RESERVE_BYTES;
/// How often a released reserve checks whether it can be taken again.
pub const REARM_INTERVAL: Duration = Duration::from_secs(10);

/// The reserve file of one database (module docs).
#[derive(Debug)]
pub(crate) struct DiskReserve {
    path: PathBuf,
    /// The file holds [`RESERVE_BYTES`] of allocated space.
    armed: AtomicBool,
    /// When a released reserve last tried to arm.
    last_attempt: Mutex<Option<Instant>>,
}

impl DiskReserve {
    /// The reserve of the database at `db_path`, taken now if the disk
    /// has room (best effort: a reserve that cannot be taken is logged).
    pub(crate) fn open(db_path: &Path) -> DiskReserve {
        let mut path = db_path.as_os_str().to_owned();
        path.push("-reserve");
        let reserve = DiskReserve {
            path: PathBuf::from(path),
            armed: AtomicBool::new(false),
            last_attempt: Mutex::new(None),
        };
        reserve.arm();
        reserve
    }

    /// Releases the reserve if it is held; returns whether it was (the
    /// caller may then retry its write once).
    pub(crate) fn release(&self) -> bool {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return false;
        }
        *self
            .last_attempt
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        match File::options()
            .write(true)
            .open(&self.path)
            .and_then(|f| f.set_len(0))
        {
            Ok(()) => {
                tracing::warn!(
                    path = %self.path.display(),
                    bytes = RESERVE_BYTES,
                    "disk full: released the metadata reserve so deletions can go on; free space on this disk"
                );
                true
            }
            Err(err) => {
                tracing::warn!(path = %self.path.display(), %err, "disk full and the metadata reserve cannot be released");
                false
            }
        }
    }

    /// Takes the reserve again if it was released, [`REARM_INTERVAL`] has
    /// passed since the last try, and the disk has room.
    pub(crate) fn rearm_if_due(&self) {
        if self.armed.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut last = self
                .last_attempt
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < REARM_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.arm();
    }

    fn arm(&self) {
        let file = match File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&self.path)
        {
            Ok(file) => file,
            Err(err) => {
                tracing::warn!(path = %self.path.display(), %err, "metadata reserve not taken");
                return;
            }
        };
        // Still held from an earlier open (a takeover on a full disk).
        if file
            .metadata()
            .is_ok_and(|m| m.blocks() * 512 >= RESERVE_BYTES)
        {
            self.armed.store(true, Ordering::SeqCst);
            return;
        }
        match available_bytes(&file) {
            Some(free) if free >= REARM_FREE_BYTES_MIN => {}
            _ => return,
        }
        let len = RESERVE_BYTES as libc::off_t;
        // SAFETY: fallocate on an fd we own, mode 0 (allocate), in range.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            self.armed.store(true, Ordering::SeqCst);
        } else {
            let err = std::io::Error::last_os_error();
            let _ = file.set_len(0);
            tracing::warn!(path = %self.path.display(), %err, "metadata reserve not taken");
        }
    }
}

/// Bytes available to this process on the filesystem holding `file`.
fn available_bytes(file: &File) -> Option<u64> {
    // SAFETY: fstatvfs fills the zeroed struct for an fd we own.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::fstatvfs(file.as_raw_fd(), &mut st) == 0)
            .then(|| st.f_bavail as u64 * st.f_frsize as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_taken_released_once_and_not_taken_back_before_its_interval() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let reserve = DiskReserve::open(&db);
        let file = dir.path().join("meta.db-reserve");
        let allocated = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
        assert!(allocated(&file) >= RESERVE_BYTES, "taken at open");
        assert!(reserve.release());
        assert_eq!(allocated(&file), 0, "released");
        assert!(!reserve.release(), "released once");
        reserve.rearm_if_due();
        assert_eq!(allocated(&file), 0, "not taken back within the interval");
        drop(reserve);
        // A reserve still allocated counts as held when the database is
        // opened again (a takeover), whatever the disk has left.
        let reserve = DiskReserve::open(&db);
        assert!(allocated(&file) >= RESERVE_BYTES);
        assert!(reserve.release(), "held after a reopen");
    }
}
