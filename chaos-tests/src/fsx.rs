//! A random-operation file exerciser in the spirit of fsx: seeded random
//! writes, reads, truncates, every fallocate mode, copy_file_range between
//! files, renames, O_TMPFILE files published with `linkat`, access ACLs,
//! chmod, fsyncs and re-opens on a few files in the filesystem under test,
//! each mirrored on files in a plain local directory and checked against
//! them.
//!
//! A mismatch reports the seed, the operation number and the last operations,
//! so `--seed` reproduces the run exactly. A caller-supplied hook can remount
//! the filesystem in the middle (files are closed around it, and everything
//! is compared after it).
//!
//! Each kind of operation past plain I/O has a switch in [`FsxConfig`];
//! [`FsxConfig::every_op`] turns them all on, with COLLAPSE_RANGE and
//! INSERT_RANGE expected to fail as Linux's FUSE makes them fail
//! (EOPNOTSUPP). ACL operations need a reference directory with POSIX
//! ACLs (ext4, or tmpfs built with them): without, they are skipped with a
//! note on stderr and [`FsxStats::acl_skipped`] says so.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, XattrFlags, CWD};

/// Files exercised at once.
pub const FILE_COUNT: usize = 3;
/// Operations kept for the failure report.
const LOG_LEN_MAX: usize = 40;
/// Bytes compared per read of a whole-file check.
const CHECK_CHUNK_BYTES: u64 = 1 << 20;
/// Named users (and named groups) an ACL of the exerciser holds at most.
const ACL_NAMED_COUNT_MAX: u64 = 4;
/// Named entries take ids from `ACL_ID_BASE..ACL_ID_BASE + ACL_ID_SPREAD`.
const ACL_ID_BASE: u32 = 1000;
const ACL_ID_SPREAD: u64 = 12;
/// Largest ACL xattr the exerciser reads back.
const ACL_XATTR_BYTES_MAX: usize = 4 + 8 * 64;
/// The access ACL's xattr name.
const ACL_ACCESS: &str = "system.posix_acl_access";
/// Name an O_TMPFILE is linked at before it is renamed into place.
const PUBLISH_NAME: &str = "fsx-pub";

/// Kinds of operation, as counted in [`FsxStats::by_kind`].
pub const KIND_NAMES: [&str; KIND_COUNT] = [
    "write",
    "read",
    "truncate",
    "fallocate",
    "fallocate-keep-size",
    "punch-hole",
    "zero-range",
    "zero-range-keep-size",
    "collapse-range",
    "insert-range",
    "copy-file-range",
    "exchange",
    "reopen",
    "fsync",
    "tmpfile-new-name",
    "tmpfile-replace",
    "acl-set",
    "acl-remove",
    "chmod",
];
/// Number of kinds of operation.
pub const KIND_COUNT: usize = 19;

/// Index of a kind in [`KIND_NAMES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Kind {
    /// A write at a random offset.
    Write,
    /// A read, compared.
    Read,
    /// ftruncate to a random size.
    Truncate,
    /// fallocate mode 0.
    Fallocate,
    /// fallocate KEEP_SIZE.
    FallocateKeepSize,
    /// fallocate PUNCH_HOLE | KEEP_SIZE.
    PunchHole,
    /// fallocate ZERO_RANGE.
    ZeroRange,
    /// fallocate ZERO_RANGE | KEEP_SIZE.
    ZeroRangeKeepSize,
    /// fallocate COLLAPSE_RANGE.
    CollapseRange,
    /// fallocate INSERT_RANGE.
    InsertRange,
    /// copy_file_range from one file into another.
    CopyFileRange,
    /// Two files swap names.
    Exchange,
    /// Every file closed and opened again.
    Reopen,
    /// fsync.
    Fsync,
    /// An O_TMPFILE linked at a new name.
    TmpfileNewName,
    /// An O_TMPFILE linked, then renamed over one of the files.
    TmpfileReplace,
    /// `system.posix_acl_access` set.
    AclSet,
    /// `system.posix_acl_access` removed.
    AclRemove,
    /// fchmod.
    Chmod,
}

/// What COLLAPSE_RANGE and INSERT_RANGE do on the file under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShiftRanges {
    /// Not drawn.
    Off,
    /// Drawn and applied to both sides; the results (errno) and contents
    /// must agree (two local filesystems).
    Mirrored,
    /// Drawn; the file under test must refuse with this errno and stay as
    /// it was (the reference is left alone). Linux's FUSE answers
    /// EOPNOTSUPP for both modes without asking the filesystem.
    Refused(i32),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct FsxConfig {
    /// Seed of the operation sequence.
    pub seed: u64,
    /// Number of operations.
    pub ops: u64,
    /// Largest file size the operations produce.
    pub file_len_max: u64,
    /// Largest single write or read.
    pub io_len_max: u64,
    /// Run the remount hook after this many operations (if any).
    pub remount_at: Option<u64>,
    /// Exercise every fallocate mode Linux's FUSE forwards: 0, KEEP_SIZE,
    /// PUNCH_HOLE | KEEP_SIZE, ZERO_RANGE and ZERO_RANGE | KEEP_SIZE.
    pub fallocate: bool,
    /// COLLAPSE_RANGE and INSERT_RANGE.
    pub shift_ranges: ShiftRanges,
    /// copy_file_range from one file into another (the same call on the
    /// reference files); later writes to both come from the other draws.
    pub copy_range: bool,
    /// O_TMPFILE files written, then published with `linkat` at a new name
    /// or renamed over one of the files.
    pub tmpfile: bool,
    /// Access ACLs (random named users and groups, masks), their removal
    /// and chmod; the ACL xattr and the mode compared.
    pub acl: bool,
}

impl FsxConfig {
    /// Every kind of operation, on files up to 1 MiB with I/O up to
    /// 64 KiB, no remount; COLLAPSE_RANGE and INSERT_RANGE expected to be
    /// refused with EOPNOTSUPP (a FUSE mount).
    pub fn every_op(seed: u64, ops: u64) -> FsxConfig {
        FsxConfig {
            seed,
            ops,
            file_len_max: 1 << 20,
            io_len_max: 64 << 10,
            remount_at: None,
            fallocate: true,
            shift_ranges: ShiftRanges::Refused(libc::EOPNOTSUPP),
            copy_range: true,
            tmpfile: true,
            acl: true,
        }
    }
}

/// A failed run: what went wrong and how to reproduce it.
#[derive(Debug)]
pub struct FsxFailure {
    /// Seed to rerun with.
    pub seed: u64,
    /// The operation that failed (0-based).
    pub op_index: u64,
    /// What differed or failed.
    pub message: String,
    /// The last operations, oldest first.
    pub log: Vec<String>,
}

impl std::fmt::Display for FsxFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "fsx failed at operation {} (seed {}): {}",
            self.op_index, self.seed, self.message
        )?;
        writeln!(f, "last operations:")?;
        for line in &self.log {
            writeln!(f, "  {line}")?;
        }
        write!(f, "rerun with seed {}", self.seed)
    }
}

/// Counts of what a successful run did.
#[derive(Debug, Default, Clone)]
pub struct FsxStats {
    /// Operations by kind, indexed by [`Kind`] (names in [`KIND_NAMES`]).
    pub by_kind: [u64; KIND_COUNT],
    /// Bytes compared by reads and full checks.
    pub bytes_checked: u64,
    /// ACL operations were asked for, but the reference directory has no
    /// POSIX ACLs: none ran.
    pub acl_skipped: bool,
}

impl FsxStats {
    /// How many operations of `kind` ran.
    pub fn count(&self, kind: Kind) -> u64 {
        self.by_kind[kind as usize]
    }
}

/// splitmix64: small, seedable, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

struct Pair {
    name: String,
    test: File,
    reference: File,
}

struct Exerciser<'a> {
    config: &'a FsxConfig,
    test_dir: PathBuf,
    ref_dir: PathBuf,
    files: Vec<Pair>,
    rng: Rng,
    log: VecDeque<String>,
    op_index: u64,
    stats: FsxStats,
    /// ACL operations run (asked for, and the reference has ACLs).
    acl: bool,
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// The errno of a result, to compare outcomes on both sides.
fn errno_of<T>(result: &std::io::Result<T>) -> Option<i32> {
    result
        .as_ref()
        .err()
        .map(|e| e.raw_os_error().unwrap_or(-1))
}

/// Deterministic bytes for a write: `fill` seeds them.
fn pattern(fill: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (fill.wrapping_add(i.wrapping_mul(31)) >> 3) as u8)
        .collect()
}

impl<'a> Exerciser<'a> {
    fn fail(&self, message: String) -> FsxFailure {
        FsxFailure {
            seed: self.config.seed,
            op_index: self.op_index,
            message,
            log: self.log.iter().cloned().collect(),
        }
    }

    fn io<T>(&self, what: &str, result: std::io::Result<T>) -> Result<T, FsxFailure> {
        result.map_err(|err| self.fail(format!("{what}: {err}")))
    }

    fn record(&mut self, line: String) {
        if self.log.len() == LOG_LEN_MAX {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{} {line}", self.op_index));
    }

    fn count(&mut self, kind: Kind) {
        self.stats.by_kind[kind as usize] += 1;
    }

    /// Both sides must have answered alike: both done, or the same errno.
    fn same_outcome<T>(
        &self,
        what: &str,
        got: &std::io::Result<T>,
        want: &std::io::Result<T>,
    ) -> Result<(), FsxFailure> {
        let (g, w) = (errno_of(got), errno_of(want));
        if g != w {
            return Err(self.fail(format!(
                "{what}: errno {g:?} on the file under test, {w:?} on the reference ({:?} vs {:?})",
                got.as_ref().err(),
                want.as_ref().err()
            )));
        }
        Ok(())
    }

    fn open_all(&mut self) -> Result<(), FsxFailure> {
        self.files.clear();
        for i in 0..FILE_COUNT {
            let name = format!("fsx-{i}");
            let test = self.io("open test file", open(&self.test_dir.join(&name)))?;
            let reference = self.io("open reference file", open(&self.ref_dir.join(&name)))?;
            self.files.push(Pair {
                name,
                test,
                reference,
            });
        }
        Ok(())
    }

    fn len_of(&self, file: &File) -> Result<u64, FsxFailure> {
        Ok(self.io("fstat", file.metadata())?.len())
    }

    fn check_whole(&mut self, index: usize) -> Result<(), FsxFailure> {
        let pair = &self.files[index];
        self.stats.bytes_checked += self.compare_files(&pair.name, &pair.test, &pair.reference)?;
        if self.acl {
            self.compare_acl(&pair.name, &pair.test, &pair.reference)?;
        }
        Ok(())
    }

    /// Sizes and every byte of two open files; the bytes compared.
    fn compare_files(&self, name: &str, test: &File, reference: &File) -> Result<u64, FsxFailure> {
        let (test_len, ref_len) = (self.len_of(test)?, self.len_of(reference)?);
        if test_len != ref_len {
            return Err(self.fail(format!("{name}: size {test_len}, expected {ref_len}")));
        }
        let mut offset = 0;
        while offset < ref_len {
            let len = (ref_len - offset).min(CHECK_CHUNK_BYTES);
            self.compare_range(name, test, reference, offset, len)?;
            offset += len;
        }
        Ok(ref_len)
    }

    fn compare(&mut self, index: usize, offset: u64, len: u64) -> Result<(), FsxFailure> {
        let pair = &self.files[index];
        self.stats.bytes_checked +=
            self.compare_range(&pair.name, &pair.test, &pair.reference, offset, len)?;
        Ok(())
    }

    /// `len` bytes at `offset` of two open files; the bytes compared.
    fn compare_range(
        &self,
        name: &str,
        test: &File,
        reference: &File,
        offset: u64,
        len: u64,
    ) -> Result<u64, FsxFailure> {
        let mut got = vec![0u8; len as usize];
        let mut want = vec![0u8; len as usize];
        let n_got = read_full(test, &mut got, offset)
            .map_err(|e| self.fail(format!("read {name}: {e}")))?;
        let n_want = read_full(reference, &mut want, offset)
            .map_err(|e| self.fail(format!("read reference: {e}")))?;
        if n_got != n_want {
            return Err(self.fail(format!(
                "{name}: read {len} at {offset} returned {n_got} bytes, expected {n_want}"
            )));
        }
        if let Some(at) = (0..n_want).find(|&i| got[i] != want[i]) {
            return Err(self.fail(format!(
                "{name}: byte {} differs: {:#04x}, expected {:#04x}",
                offset + at as u64,
                got[at],
                want[at]
            )));
        }
        Ok(n_want as u64)
    }

    /// The mode and the access ACL's xattr (bytes, or the errno of its
    /// absence) of two open files.
    fn compare_acl(&self, name: &str, test: &File, reference: &File) -> Result<(), FsxFailure> {
        let mode = |f: &File| -> Result<u32, FsxFailure> {
            Ok(self.io("fstat", f.metadata())?.mode() & 0o7777)
        };
        let (got, want) = (mode(test)?, mode(reference)?);
        if got != want {
            return Err(self.fail(format!("{name}: mode {got:o}, expected {want:o}")));
        }
        let (got, want) = (get_acl(test), get_acl(reference));
        self.same_outcome(&format!("getxattr {ACL_ACCESS} of {name}"), &got, &want)?;
        if let (Ok(got), Ok(want)) = (got, want) {
            if got != want {
                return Err(self.fail(format!(
                    "{name}: {ACL_ACCESS} is {}, expected {}",
                    describe_acl(&got),
                    describe_acl(&want)
                )));
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), FsxFailure> {
        let index = self.rng.below(FILE_COUNT as u64) as usize;
        let kind = self.rng.below(100);
        let config = self.config;
        match kind {
            0..=29 => self.write(index),
            30..=54 => self.read(index),
            55..=61 => self.truncate(index),
            62..=69 if config.fallocate => self.fallocate(index),
            70..=74 if config.copy_range => self.copy_range(index),
            75..=77 => self.exchange(index),
            78..=81 => self.reopen(index),
            82..=84 if config.tmpfile => self.tmpfile(index),
            85..=89 if self.acl => self.acl_change(index),
            90..=95 => self.fsync(index),
            _ => self.write(index),
        }
    }

    fn write(&mut self, index: usize) -> Result<(), FsxFailure> {
        let max = self.config.file_len_max;
        let offset = self.rng.below(max);
        let len = (1 + self.rng.below(self.config.io_len_max)).min(max - offset);
        let data = pattern(self.rng.next(), len);
        self.record(format!(
            "write {} off={offset} len={len}",
            self.files[index].name
        ));
        let pair = &self.files[index];
        self.io("write", pair.test.write_all_at(&data, offset))?;
        self.io(
            "write reference",
            pair.reference.write_all_at(&data, offset),
        )?;
        self.count(Kind::Write);
        Ok(())
    }

    fn read(&mut self, index: usize) -> Result<(), FsxFailure> {
        let len_now = self.len_of(&self.files[index].reference)?;
        let offset = self.rng.below(len_now + 4096);
        let len = 1 + self.rng.below(self.config.io_len_max);
        self.record(format!(
            "read {} off={offset} len={len}",
            self.files[index].name
        ));
        self.compare(index, offset, len)?;
        self.count(Kind::Read);
        Ok(())
    }

    fn truncate(&mut self, index: usize) -> Result<(), FsxFailure> {
        let size = self.rng.below(self.config.file_len_max);
        self.record(format!("truncate {} size={size}", self.files[index].name));
        let pair = &self.files[index];
        self.io("truncate", pair.test.set_len(size))?;
        self.io("truncate reference", pair.reference.set_len(size))?;
        self.count(Kind::Truncate);
        Ok(())
    }

    fn fallocate(&mut self, index: usize) -> Result<(), FsxFailure> {
        use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
        let shifts = self.config.shift_ranges != ShiftRanges::Off;
        let choice = self.rng.below(if shifts { 7 } else { 5 });
        let (kind, mode) = match choice {
            0 => (Kind::Fallocate, 0),
            1 => (Kind::FallocateKeepSize, KEEP),
            2 => (Kind::PunchHole, FALLOC_FL_PUNCH_HOLE | KEEP),
            3 => (Kind::ZeroRange, FALLOC_FL_ZERO_RANGE),
            4 => (Kind::ZeroRangeKeepSize, FALLOC_FL_ZERO_RANGE | KEEP),
            5 => return self.shift_range(index, Kind::CollapseRange),
            _ => return self.shift_range(index, Kind::InsertRange),
        };
        let max = self.config.file_len_max;
        let offset = self.rng.below(max);
        let len = (1 + self.rng.below(self.config.io_len_max * 2)).min(max - offset);
        self.record(format!(
            "fallocate {} mode={mode:#x} off={offset} len={len}",
            self.files[index].name
        ));
        let pair = &self.files[index];
        self.io("fallocate", fallocate(&pair.test, mode, offset, len))?;
        let on_reference = match fallocate(&pair.reference, mode, offset, len) {
            // tmpfs has no ZERO_RANGE: the same bytes, written.
            Err(e)
                if e.raw_os_error() == Some(libc::EOPNOTSUPP)
                    && mode & FALLOC_FL_ZERO_RANGE != 0 =>
            {
                zero_range_by_writes(&pair.reference, offset, len, mode & KEEP != 0)
            }
            other => other,
        };
        self.io("fallocate reference", on_reference)?;
        self.count(kind);
        Ok(())
    }

    /// COLLAPSE_RANGE or INSERT_RANGE: block-aligned most of the time, so
    /// that a local filesystem that has them does them.
    fn shift_range(&mut self, index: usize, kind: Kind) -> Result<(), FsxFailure> {
        const ALIGN: u64 = 4096;
        let max = self.config.file_len_max;
        let len_now = self.len_of(&self.files[index].reference)?;
        let aligned = self.rng.below(4) != 0;
        let mut offset = self.rng.below(len_now.max(1));
        let mut len = 1 + self.rng.below(self.config.io_len_max);
        if kind == Kind::InsertRange {
            len = len.min(max.saturating_sub(len_now).max(1));
        }
        if aligned {
            offset -= offset % ALIGN;
            len = (len - len % ALIGN).max(ALIGN);
        }
        let mode = if kind == Kind::CollapseRange {
            libc::FALLOC_FL_COLLAPSE_RANGE
        } else {
            libc::FALLOC_FL_INSERT_RANGE
        };
        self.record(format!(
            "fallocate {} mode={mode:#x} off={offset} len={len}",
            self.files[index].name
        ));
        let pair = &self.files[index];
        let got = fallocate(&pair.test, mode, offset, len);
        match self.config.shift_ranges {
            ShiftRanges::Refused(errno) => {
                if errno_of(&got) != Some(errno) {
                    return Err(self.fail(format!(
                        "fallocate mode {mode:#x}: {got:?}, expected errno {errno}"
                    )));
                }
            }
            ShiftRanges::Mirrored | ShiftRanges::Off => {
                let want = fallocate(&pair.reference, mode, offset, len);
                self.same_outcome("fallocate (shift)", &got, &want)?;
            }
        }
        self.count(kind);
        Ok(())
    }

    /// copy_file_range from `index` into another file, the same call on
    /// both sides; the byte counts must agree (the contents are compared
    /// by later reads and checks, after later writes to both).
    fn copy_range(&mut self, index: usize) -> Result<(), FsxFailure> {
        let other = (index + 1 + self.rng.below(FILE_COUNT as u64 - 1) as usize) % FILE_COUNT;
        let max = self.config.file_len_max;
        let len_now = self.len_of(&self.files[index].reference)?;
        let off_in = self.rng.below(len_now + 4096);
        let off_out = self.rng.below(max);
        let len = (1 + self.rng.below(self.config.io_len_max * 2)).min(max - off_out);
        self.record(format!(
            "copy_file_range {} off={off_in} -> {} off={off_out} len={len}",
            self.files[index].name, self.files[other].name
        ));
        let (src, dst) = (&self.files[index], &self.files[other]);
        let got = copy_all(&src.test, off_in, &dst.test, off_out, len);
        let want = copy_all(&src.reference, off_in, &dst.reference, off_out, len);
        self.same_outcome("copy_file_range", &got, &want)?;
        if let (Ok(got), Ok(want)) = (&got, &want) {
            if got != want {
                return Err(self.fail(format!(
                    "copy_file_range copied {got} bytes, expected {want}"
                )));
            }
        }
        self.compare(other, off_out, len)?;
        self.count(Kind::CopyFileRange);
        Ok(())
    }

    fn exchange(&mut self, index: usize) -> Result<(), FsxFailure> {
        let other = (index + 1 + self.rng.below(FILE_COUNT as u64 - 1) as usize) % FILE_COUNT;
        let (a, b) = (
            self.files[index].name.clone(),
            self.files[other].name.clone(),
        );
        self.record(format!(
            "exchange {a} {b} (rename through a temp name, then reopen)"
        ));
        for dir in [self.test_dir.clone(), self.ref_dir.clone()] {
            let tmp = dir.join("fsx-tmp");
            self.io("rename", std::fs::rename(dir.join(&a), &tmp))?;
            self.io("rename", std::fs::rename(dir.join(&b), dir.join(&a)))?;
            self.io("rename", std::fs::rename(&tmp, dir.join(&b)))?;
        }
        self.open_all()?;
        self.count(Kind::Exchange);
        Ok(())
    }

    fn reopen(&mut self, index: usize) -> Result<(), FsxFailure> {
        self.record(format!("close and reopen {}", self.files[index].name));
        self.open_all()?;
        self.check_whole(index)?;
        self.count(Kind::Reopen);
        Ok(())
    }

    fn fsync(&mut self, index: usize) -> Result<(), FsxFailure> {
        self.record(format!("fsync {}", self.files[index].name));
        let pair = &self.files[index];
        self.io("fsync", pair.test.sync_all())?;
        self.count(Kind::Fsync);
        Ok(())
    }

    /// An O_TMPFILE in each directory, written (and sometimes fsynced),
    /// then linked at [`PUBLISH_NAME`]: compared there and unlinked, or
    /// renamed over file `index` (atomic publication).
    fn tmpfile(&mut self, index: usize) -> Result<(), FsxFailure> {
        let replace = self.rng.below(2) == 0;
        let writes = 1 + self.rng.below(3);
        let sync = self.rng.below(4) == 0;
        let max = self.config.file_len_max;
        let mut data = Vec::new();
        for _ in 0..writes {
            let offset = self.rng.below(max);
            let len = (1 + self.rng.below(self.config.io_len_max)).min(max - offset);
            data.push((offset, pattern(self.rng.next(), len)));
        }
        let target = if replace {
            self.files[index].name.clone()
        } else {
            PUBLISH_NAME.to_string()
        };
        let spans: Vec<_> = data.iter().map(|(o, d)| (*o, d.len())).collect();
        self.record(format!(
            "O_TMPFILE, writes (off, len) {spans:?}{}, linkat {PUBLISH_NAME}{}",
            if sync { ", fsync" } else { "" },
            if replace {
                format!(", rename over {target}")
            } else {
                String::new()
            }
        ));
        let mut published = Vec::new();
        for dir in [self.test_dir.clone(), self.ref_dir.clone()] {
            let file = self.io("open O_TMPFILE", open_tmpfile(&dir))?;
            for (offset, bytes) in &data {
                self.io("write O_TMPFILE", file.write_all_at(bytes, *offset))?;
            }
            if sync {
                self.io("fsync O_TMPFILE", file.sync_all())?;
            }
            let at = dir.join(PUBLISH_NAME);
            self.io(
                "linkat O_TMPFILE",
                rustix::fs::linkat(file.as_fd(), "", CWD, &at, AtFlags::EMPTY_PATH)
                    .map_err(std::io::Error::from),
            )?;
            if replace {
                self.io("rename over", std::fs::rename(&at, dir.join(&target)))?;
            }
            published.push(file);
        }
        let (test, reference) = (&published[0], &published[1]);
        self.stats.bytes_checked += self.compare_files(&target, test, reference)?;
        if self.acl {
            self.compare_acl(&target, test, reference)?;
        }
        if replace {
            self.open_all()?;
            self.check_whole(index)?;
            self.count(Kind::TmpfileReplace);
        } else {
            for dir in [&self.test_dir, &self.ref_dir] {
                self.io("unlink", std::fs::remove_file(dir.join(PUBLISH_NAME)))?;
            }
            self.count(Kind::TmpfileNewName);
        }
        Ok(())
    }

    /// Sets a random access ACL (sometimes one the mode says in full, which
    /// is stored as none), removes it, or chmods; then compares the mode
    /// and the ACL.
    fn acl_change(&mut self, index: usize) -> Result<(), FsxFailure> {
        let choice = self.rng.below(5);
        let name = self.files[index].name.clone();
        let (kind, got, want) = if choice < 3 {
            let acl = random_acl(&mut self.rng);
            self.record(format!(
                "setxattr {ACL_ACCESS} {name} {}",
                describe_acl(&acl)
            ));
            let pair = &self.files[index];
            let set = |f: &File| {
                rustix::fs::fsetxattr(f.as_fd(), ACL_ACCESS, &acl, XattrFlags::empty())
                    .map_err(std::io::Error::from)
            };
            (Kind::AclSet, set(&pair.test), set(&pair.reference))
        } else if choice == 3 {
            self.record(format!("removexattr {ACL_ACCESS} {name}"));
            let pair = &self.files[index];
            let remove = |f: &File| {
                rustix::fs::fremovexattr(f.as_fd(), ACL_ACCESS).map_err(std::io::Error::from)
            };
            (Kind::AclRemove, remove(&pair.test), remove(&pair.reference))
        } else {
            let mode = self.rng.below(0o1000) as u32;
            self.record(format!("chmod {name} {mode:o}"));
            let pair = &self.files[index];
            let chmod = |f: &File| {
                rustix::fs::fchmod(f.as_fd(), Mode::from_bits_truncate(mode))
                    .map_err(std::io::Error::from)
            };
            (Kind::Chmod, chmod(&pair.test), chmod(&pair.reference))
        };
        self.same_outcome(KIND_NAMES[kind as usize], &got, &want)?;
        let pair = &self.files[index];
        self.compare_acl(&name, &pair.test, &pair.reference)?;
        self.count(kind);
        Ok(())
    }
}

/// A random valid access ACL in its xattr form: the owner, 0 to
/// [`ACL_NAMED_COUNT_MAX`] named users, the owning group, named groups, a
/// mask (always with named entries, sometimes without) and other.
fn random_acl(rng: &mut Rng) -> Vec<u8> {
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const GROUP: u16 = 0x08;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;
    const UNDEFINED: u32 = u32::MAX;
    let named = |rng: &mut Rng| {
        let mut ids: Vec<u32> = (0..rng.below(ACL_NAMED_COUNT_MAX + 1))
            .map(|_| ACL_ID_BASE + rng.below(ACL_ID_SPREAD) as u32)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let (users, groups) = (named(rng), named(rng));
    let mut entries = vec![(USER_OBJ, rng.below(8) as u16, UNDEFINED)];
    entries.extend(users.iter().map(|&id| (USER, rng.below(8) as u16, id)));
    entries.push((GROUP_OBJ, rng.below(8) as u16, UNDEFINED));
    entries.extend(groups.iter().map(|&id| (GROUP, rng.below(8) as u16, id)));
    if !users.is_empty() || !groups.is_empty() || rng.below(3) == 0 {
        entries.push((MASK, rng.below(8) as u16, UNDEFINED));
    }
    entries.push((OTHER, rng.below(8) as u16, UNDEFINED));
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// An ACL xattr as `tag:id:perm` entries, for messages.
fn describe_acl(bytes: &[u8]) -> String {
    let entries: Vec<String> = bytes
        .get(4..)
        .unwrap_or_default()
        .chunks(8)
        .map(|e| {
            let field = |r: std::ops::Range<usize>| {
                e.get(r).map_or(0, |b| {
                    b.iter().rev().fold(0u32, |a, &x| (a << 8) | x as u32)
                })
            };
            let id = field(4..8);
            let id = if id == u32::MAX {
                String::new()
            } else {
                id.to_string()
            };
            format!("{:#x}:{id}:{:o}", field(0..2), field(2..4))
        })
        .collect();
    format!("[{}]", entries.join(","))
}

fn get_acl(file: &File) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; ACL_XATTR_BYTES_MAX];
    let len = rustix::fs::fgetxattr(file.as_fd(), ACL_ACCESS, &mut buf[..])?;
    buf.truncate(len);
    Ok(buf)
}

/// Whether `dir` keeps POSIX ACLs: a probe file's access ACL reads as
/// absent (ENODATA) rather than unsupported.
fn has_acls(dir: &Path) -> std::io::Result<bool> {
    let probe = tempfile::tempfile_in(dir)?;
    match get_acl(&probe) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
        Err(e) => Err(e),
    }
}

fn open_tmpfile(dir: &Path) -> std::io::Result<File> {
    let fd = rustix::fs::openat(
        CWD,
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_bits_truncate(0o640),
    )?;
    Ok(File::from(fd))
}

/// copy_file_range of up to `len` bytes, repeated over short copies until
/// the source ends; the bytes copied.
fn copy_all(
    src: &File,
    mut off_in: u64,
    dst: &File,
    mut off_out: u64,
    len: u64,
) -> std::io::Result<u64> {
    let mut done = 0;
    while done < len {
        let n = rustix::fs::copy_file_range(
            src.as_fd(),
            Some(&mut off_in),
            dst.as_fd(),
            Some(&mut off_out),
            (len - done) as usize,
        )?;
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

/// ZERO_RANGE by writing zeros (a reference filesystem without it).
fn zero_range_by_writes(
    file: &File,
    offset: u64,
    len: u64,
    keep_size: bool,
) -> std::io::Result<()> {
    let size = file.metadata()?.len();
    let end = if keep_size {
        (offset + len).min(size)
    } else {
        offset + len
    };
    let mut at = offset;
    while at < end {
        let n = (end - at).min(CHECK_CHUNK_BYTES);
        file.write_all_at(&vec![0u8; n as usize], at)?;
        at += n;
    }
    Ok(())
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
    nix::fcntl::fallocate(file.as_fd(), flags, offset as i64, len as i64)
        .map_err(std::io::Error::from)
}

/// Runs the exerciser on `test_dir` against `ref_dir` (a plain directory).
/// `remount` is called with every file closed, at `config.remount_at`.
pub fn run(
    config: &FsxConfig,
    test_dir: &Path,
    ref_dir: &Path,
    remount: &mut dyn FnMut() -> Result<(), String>,
) -> Result<FsxStats, FsxFailure> {
    let mut ex = Exerciser {
        config,
        test_dir: test_dir.to_path_buf(),
        ref_dir: ref_dir.to_path_buf(),
        files: Vec::new(),
        rng: Rng(config.seed),
        log: VecDeque::new(),
        op_index: 0,
        stats: FsxStats::default(),
        acl: false,
    };
    if config.acl {
        ex.acl = ex.io("probe the reference for ACLs", has_acls(ref_dir))?;
        if !ex.acl {
            eprintln!(
                "fsx: note: {} has no POSIX ACLs; ACL operations skipped",
                ref_dir.display()
            );
            ex.stats.acl_skipped = true;
        }
    }
    ex.open_all()?;
    while ex.op_index < config.ops {
        if Some(ex.op_index) == config.remount_at {
            ex.record("remount".to_string());
            ex.files.clear();
            remount().map_err(|err| ex.fail(format!("remount: {err}")))?;
            ex.open_all()?;
            for index in 0..FILE_COUNT {
                ex.check_whole(index)?;
            }
        }
        ex.step()?;
        ex.op_index += 1;
    }
    for index in 0..FILE_COUNT {
        ex.check_whole(index)?;
    }
    Ok(ex.stats)
}
