//! Directories: opendir, readdir and readdirplus, releasedir.
//!
//! Cookies are baton-meta's (1 = `.`, 2 = `..`, then stable per-entry
//! cookies), so a listing resumes correctly across concurrent changes and
//! across server generations. READDIRPLUS fills an `EntryOut` for every
//! entry except `.` and `..`; each filled entry counts as a lookup, which
//! needs no bookkeeping here (nodeids are inode numbers).

use std::os::unix::ffi::OsStrExt;

use baton_meta::FileKind;
use fuse_wire::reply::{DirentBuf, DirentRecord};
use fuse_wire::Errno;
use fuse_wire::{EntryOut, FopenFlags, ReadIn};

use super::BatonFs;
use crate::error::{Error, Result};

/// Smallest encoded directory entry, to size metadata queries.
const DIRENT_BYTES_MIN: u32 = 32;

/// Most entries one READDIRPLUS reply carries.
///
/// The kernel asks for READDIRPLUS only at the start of a listing and
/// after lookups in the directory (`READDIRPLUS_AUTO`), and recent
/// kernels size the request by the reader's buffer: glibc's is the
/// directory's `st_blksize` (1 MiB here), so a first request asked for
/// 4,096 entries. Each entry then cost about 3 µs here and 4.6 µs in the
/// kernel, which links a dentry per entry; a plain entry costs under 1 µs
/// in all. A listing that never stats paid that for nothing, and one of
/// 10,000 entries ran at a quarter of bindfs's speed. 128 entries (20 KiB)
/// is more than the one page older kernels asked for, and a program that
/// stats as it lists still gets its attributes in batches: its lookups
/// mark the directory, and the next request is a READDIRPLUS again.
const READDIRPLUS_ENTRIES_MAX: u32 = 128;

impl BatonFs {
    /// How the kernel may cache a directory's listing. A volume only this
    /// mount serves changes only through this kernel, which notes each
    /// change to a directory and lists it anew after one: there it keeps
    /// listings (`CACHE_DIR`) across opens (`KEEP_CACHE`), and a directory
    /// listed again unchanged costs no request. Other hosts change a shared
    /// volume unseen: there every listing asks.
    pub(super) fn dir_open_flags(&self) -> FopenFlags {
        if self.meta.shared_by_hosts() {
            FopenFlags::empty()
        } else {
            FopenFlags::CACHE_DIR | FopenFlags::KEEP_CACHE
        }
    }

    /// OPENDIR: registered before the inode is read, as OPEN (`data.rs`).
    pub(super) fn do_opendir(&self, ino: u64, open_flags: u32) -> Result<u64> {
        let fh = self.register(ino, open_flags, true)?;
        let checked = self
            .meta
            .getattr(ino)
            .map_err(Error::from)
            .and_then(|attr| {
                if attr.kind != FileKind::Directory {
                    return Err(Error::refused(
                        ino,
                        "opendir of a non-directory",
                        Errno::ENOTDIR,
                    ));
                }
                if attr.nlink == 0 {
                    self.hold_open_orphan(ino)?;
                }
                Ok(())
            });
        match checked {
            Ok(()) => Ok(fh),
            Err(e) => {
                self.unregister(fh);
                Err(e)
            }
        }
    }

    pub(super) fn do_readdir(
        &self,
        ino: u64,
        arg: &ReadIn,
        mut entries: DirentBuf,
    ) -> Result<DirentBuf> {
        let per_entry = if entries.is_plus() {
            DIRENT_BYTES_MIN + std::mem::size_of::<EntryOut>() as u32
        } else {
            DIRENT_BYTES_MIN
        };
        let limit = (arg.size / per_entry).max(1) + 1;
        if !entries.is_plus() {
            for entry in self.meta.readdir(ino, arg.offset, limit)? {
                if !entries.push(record(&entry), None) {
                    break;
                }
            }
            return Ok(entries);
        }
        // READDIRPLUS: the attributes come with the listing, in one read.
        let limit = limit.min(READDIRPLUS_ENTRIES_MAX);
        let token = self.committed_bytes.token();
        for listed in self.meta.readdir_plus(ino, arg.offset, limit)? {
            let plus = match &listed.attr {
                Some(attr) => {
                    Some(self.entry_out_with(attr, Some(listed.committed_bytes), Some(token))?)
                }
                None => None,
            };
            if !entries.push(record(&listed.entry), plus.as_ref()) {
                break;
            }
        }
        Ok(entries)
    }

    pub(super) fn do_releasedir(&self, fh: u64) -> Result<()> {
        let released = self.handles.release(fh);
        match released.handle {
            Some(handle) if released.reclaim => self.settle_orphan(handle.ino),
            _ => Ok(()),
        }
    }
}

/// The dirent of a listed entry.
fn record(entry: &baton_meta::DirEntry) -> DirentRecord<'_> {
    DirentRecord {
        ino: entry.ino,
        offset_next: entry.offset_next,
        typ: entry.kind.type_bits() >> 12,
        name: entry.name.as_bytes(),
    }
}
