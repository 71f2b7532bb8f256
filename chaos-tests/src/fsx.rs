//! A random-operation file exerciser in the spirit of fsx: seeded random
//! writes, reads, truncates, fallocates, renames, fsyncs and re-opens on a
//! few files in the filesystem under test, each mirrored on files in a plain
//! local directory and checked against them.
//!
//! A mismatch reports the seed, the operation number and the last operations,
//! so `--seed` reproduces the run exactly. A caller-supplied hook can remount
//! the filesystem in the middle (files are closed around it, and everything
//! is compared after it).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Files exercised at once.
pub const FILE_COUNT: usize = 3;
/// Operations kept for the failure report.
const LOG_LEN_MAX: usize = 40;

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
    /// Exercise fallocate (mode 0 and PUNCH_HOLE | KEEP_SIZE).
    pub fallocate: bool,
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
    /// Operations by kind: write, read, truncate, fallocate, punch, rename, reopen, fsync.
    pub by_kind: [u64; 8],
    /// Bytes compared by reads and full checks.
    pub bytes_checked: u64,
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
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
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
        let (test_len, ref_len) = (
            self.len_of(&self.files[index].test)?,
            self.len_of(&self.files[index].reference)?,
        );
        if test_len != ref_len {
            return Err(self.fail(format!(
                "{}: size {test_len}, expected {ref_len}",
                self.files[index].name
            )));
        }
        let mut offset = 0;
        while offset < ref_len {
            let len = (ref_len - offset).min(1 << 20);
            self.compare(index, offset, len)?;
            offset += len;
        }
        Ok(())
    }

    fn compare(&mut self, index: usize, offset: u64, len: u64) -> Result<(), FsxFailure> {
        let pair = &self.files[index];
        let mut got = vec![0u8; len as usize];
        let mut want = vec![0u8; len as usize];
        let n_got = read_full(&pair.test, &mut got, offset)
            .map_err(|e| self.fail(format!("read {}: {e}", pair.name)))?;
        let n_want = read_full(&pair.reference, &mut want, offset)
            .map_err(|e| self.fail(format!("read reference: {e}")))?;
        if n_got != n_want {
            return Err(self.fail(format!(
                "{}: read {len} at {offset} returned {n_got} bytes, expected {n_want}",
                pair.name
            )));
        }
        if let Some(at) = (0..n_want).find(|&i| got[i] != want[i]) {
            return Err(self.fail(format!(
                "{}: byte {} differs: {:#04x}, expected {:#04x}",
                pair.name,
                offset + at as u64,
                got[at],
                want[at]
            )));
        }
        self.stats.bytes_checked += n_want as u64;
        Ok(())
    }

    fn step(&mut self) -> Result<(), FsxFailure> {
        let index = self.rng.below(FILE_COUNT as u64) as usize;
        let kind = self.rng.below(100);
        let len_now = self.len_of(&self.files[index].reference)?;
        let max = self.config.file_len_max;
        match kind {
            0..=34 => {
                let offset = self.rng.below(max);
                let len = (1 + self.rng.below(self.config.io_len_max)).min(max - offset);
                let fill = self.rng.next();
                let data: Vec<u8> = (0..len)
                    .map(|i| (fill.wrapping_add(i.wrapping_mul(31)) >> 3) as u8)
                    .collect();
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
                self.stats.by_kind[0] += 1;
            }
            35..=64 => {
                let offset = self.rng.below(len_now + 4096);
                let len = 1 + self.rng.below(self.config.io_len_max);
                self.record(format!(
                    "read {} off={offset} len={len}",
                    self.files[index].name
                ));
                self.compare(index, offset, len)?;
                self.stats.by_kind[1] += 1;
            }
            65..=74 => {
                let size = self.rng.below(max);
                self.record(format!("truncate {} size={size}", self.files[index].name));
                let pair = &self.files[index];
                self.io("truncate", pair.test.set_len(size))?;
                self.io("truncate reference", pair.reference.set_len(size))?;
                self.stats.by_kind[2] += 1;
            }
            75..=79 if self.config.fallocate => {
                let punch = self.rng.below(2) == 1;
                let offset = self.rng.below(max);
                let len = (1 + self.rng.below(self.config.io_len_max * 2)).min(max - offset);
                let mode = if punch {
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                } else {
                    0
                };
                self.record(format!(
                    "fallocate {} mode={mode:#x} off={offset} len={len}",
                    self.files[index].name
                ));
                let pair = &self.files[index];
                self.io("fallocate", fallocate(&pair.test, mode, offset, len))?;
                self.io(
                    "fallocate reference",
                    fallocate(&pair.reference, mode, offset, len),
                )?;
                self.stats.by_kind[if punch { 4 } else { 3 }] += 1;
            }
            80..=84 => {
                let other =
                    (index + 1 + self.rng.below(FILE_COUNT as u64 - 1) as usize) % FILE_COUNT;
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
                self.stats.by_kind[5] += 1;
            }
            85..=89 => {
                self.record(format!("close and reopen {}", self.files[index].name));
                self.open_all()?;
                self.check_whole(index)?;
                self.stats.by_kind[6] += 1;
            }
            _ => {
                self.record(format!("fsync {}", self.files[index].name));
                let pair = &self.files[index];
                self.io("fsync", pair.test.sync_all())?;
                self.stats.by_kind[7] += 1;
            }
        }
        Ok(())
    }
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
    };
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
