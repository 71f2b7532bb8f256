//! Small file helpers for the staging area: positional reads padded with
//! zeros, space reservation before writes, atomic replace and in-page
//! overwrite.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::private_fs;

/// Reserves disk space for `len` bytes at `offset` without changing the file
/// size, so that the following `pwrite` cannot fail half way with ENOSPC.
/// Filesystems without `fallocate` are accepted as they are.
pub(crate) fn reserve(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: fallocate only reads its integer arguments; the fd is owned by
    // `file`, which outlives the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, len) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
        _ => Err(err),
    }
}

/// The smallest page size Linux uses: a write within one such page is
/// copied into the page cache whole or not at all.
const PAGE_BYTES: u64 = 4096;

/// Writes `data` at `offset`, reserving its space first when the write
/// spans pages (a multi-page write could stop half way on ENOSPC).
///
/// A write within one page is not reserved: it cannot fail half way, and
/// a reservation allocates a disk block at once, which a flush that
/// clears the block file moments later frees again: a synchronous discard
/// (~0.3 ms) on a filesystem mounted with `discard` and no journal. Left to
/// delayed allocation, a small staged file usually dies before it has a
/// block.
pub(crate) fn write_at_reserved(file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
    let len = data.len() as u64;
    let last = offset.saturating_add(len.saturating_sub(1));
    if offset / PAGE_BYTES != last / PAGE_BYTES {
        reserve(file, offset, len)?;
    }
    file.write_all_at(data, offset)
}

/// Reads `len` bytes at `offset`; bytes past end of file read as zeros.
pub(crate) fn read_padded(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// Replaces `path` with `data` atomically (write `tmp`, rename). No fsync:
/// the page cache survives process death; `Staging::sync` adds durability.
pub(crate) fn replace(path: &Path, tmp: &Path, data: &[u8]) -> io::Result<()> {
    write_and_rename(path, tmp, data, false)
}

/// [`replace`], durable against power loss: the file's data before the
/// rename, the directory after it.
pub(crate) fn replace_durable(path: &Path, tmp: &Path, data: &[u8]) -> io::Result<()> {
    write_and_rename(path, tmp, data, true)
}

fn write_and_rename(path: &Path, tmp: &Path, data: &[u8], durable: bool) -> io::Result<()> {
    let res = private_fs::create(tmp)
        .and_then(|mut f| {
            f.write_all(data)?;
            if durable {
                f.sync_data()?;
            }
            Ok(())
        })
        .and_then(|()| fs::rename(tmp, path))
        .and_then(|()| match path.parent() {
            Some(dir) if durable => fs::File::open(dir).and_then(|d| d.sync_all()),
            _ => Ok(()),
        });
    if res.is_err() {
        let _ = fs::remove_file(tmp);
    }
    res
}

/// Rewrites the record `path` holds with `data`, a record of the same
/// length, in place: `Ok(false)` if there is no such file (write it with
/// [`replace`]: a file created here and killed or out of space before its
/// bytes would be an empty, unreadable record). `data` must fit in one page:
/// then the write reaches the page cache whole or not at all, even if the
/// process dies in it, and an existing page needs no new space. Unlike
/// [`replace`] it allocates no inode: a write-then-rename per call is an
/// inode allocated and one freed, on every extending WRITE of a file.
pub(crate) fn overwrite_in_page(path: &Path, data: &[u8]) -> io::Result<bool> {
    debug_assert!(data.len() as u64 <= PAGE_BYTES);
    match OpenOptions::new().write(true).open(path) {
        Ok(file) => file.write_all_at(data, 0).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens an existing file for positional writing.
pub(crate) fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Opens a file, mapping "not found" to `None`.
pub(crate) fn open_optional(path: &Path) -> io::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes a file; a missing file is fine.
pub(crate) fn remove_optional(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Fsyncs a file or directory.
pub(crate) fn fsync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}
