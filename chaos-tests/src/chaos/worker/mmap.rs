//! mmap on the mount: page writes through a shared writable mapping with
//! msync, page reads through it checked against the model, O_DIRECT reads
//! after msync (the bytes reached the filesystem), and page reads through a
//! read-only mapping of a large known-content file whose page cache is
//! dropped now and then so the faults reach the filesystem.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{big_file, AlignedBuf, Ctx};
use crate::chaos::rng::{big_file_key, fill_content};

const PAGE_BYTES: usize = 4096;

/// A shared mapping of a whole file, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize, writable: bool) -> std::io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping of an open file; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is valid for len bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and only writable mappings are written.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn msync(&self, offset: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: a page-aligned range inside the mapping.
        let rc = unsafe { libc::msync(self.ptr.add(offset).cast(), len, libc::MS_SYNC) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what mmap returned.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn drop_cache(file: &File) -> std::io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

struct MmapFile {
    path: PathBuf,
    mapping: Mapping,
    model: Vec<u8>,
}

fn setup(ctx: &mut Ctx) -> Option<(MmapFile, File)> {
    let dir = ctx.args.mnt.join("mmap");
    let path = dir.join(format!("m{}", ctx.args.index));
    let len = (ctx.args.file_bytes as usize).div_ceil(PAGE_BYTES).max(1) * PAGE_BYTES;
    let model = ctx.rng.bytes(len);
    let file = ctx
        .op("create", path.display(), || {
            std::fs::create_dir_all(&dir)?;
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            f.write_all_at(&model, 0)?;
            f.sync_all()?;
            Ok(f)
        })
        .ok()?;
    let mapping = ctx
        .op("mmap", path.display(), || Mapping::new(&file, len, true))
        .ok()?;
    Some((
        MmapFile {
            path,
            mapping,
            model,
        },
        file,
    ))
}

fn check_direct_page(ctx: &mut Ctx, m: &MmapFile, page: usize) {
    let Ok(file) = ctx.op("open", m.path.display(), || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&m.path)
    }) else {
        return;
    };
    let mut buf = AlignedBuf::new(PAGE_BYTES);
    let offset = (page * PAGE_BYTES) as u64;
    if let Ok(n) = ctx.op("read", m.path.display(), || {
        file.read_at(buf.window(), offset)
    }) {
        let expected = m.model[page * PAGE_BYTES..(page + 1) * PAGE_BYTES].to_vec();
        ctx.report.read_bytes_verified += n as u64;
        let got = buf.window()[..n].to_vec();
        ctx.compare(&m.path, offset, &expected, &got);
    }
}

fn big_page(ctx: &mut Ctx, big: &(File, Mapping), path: &Path) {
    if ctx.rng.chance(1, 8) {
        let _ = ctx.op("fadvise", path.display(), || drop_cache(&big.0));
    }
    let pages = big.1.len / PAGE_BYTES;
    let page = ctx.rng.below(pages as u64) as usize;
    let range = page * PAGE_BYTES..(page + 1) * PAGE_BYTES;
    let Ok(got) = ctx.op("mmap_read", path.display(), || {
        Ok(big.1.bytes()[range.clone()].to_vec())
    }) else {
        return;
    };
    let mut expected = vec![0u8; PAGE_BYTES];
    fill_content(
        big_file_key(ctx.args.seed, 0),
        range.start as u64,
        &mut expected,
    );
    ctx.report.read_bytes_verified += PAGE_BYTES as u64;
    ctx.compare(path, range.start as u64, &expected, &got);
}

pub(super) fn run(ctx: &mut Ctx) {
    let Some((mut m, file)) = setup(ctx) else {
        return;
    };
    let big_path = big_file(&ctx.args.mnt, 0);
    let big_len = (ctx.args.big_bytes as usize / PAGE_BYTES) * PAGE_BYTES;
    let big = ctx
        .op("mmap", big_path.display(), || {
            let f = File::open(&big_path)?;
            let map = Mapping::new(&f, big_len.max(PAGE_BYTES), false)?;
            Ok((f, map))
        })
        .ok();
    let pages = m.model.len() / PAGE_BYTES;
    while !ctx.should_stop() {
        let page = ctx.rng.below(pages as u64) as usize;
        let range = page * PAGE_BYTES..(page + 1) * PAGE_BYTES;
        match ctx.rng.below(10) {
            0..=4 => {
                let data = ctx.rng.bytes(PAGE_BYTES);
                let _ = ctx.op("mmap_write", m.path.display(), || {
                    m.mapping.bytes_mut()[range.clone()].copy_from_slice(&data);
                    Ok(())
                });
                m.model[range.clone()].copy_from_slice(&data);
                if ctx.rng.chance(1, 3) {
                    let _ = ctx.op("msync", m.path.display(), || {
                        m.mapping.msync(range.start, PAGE_BYTES)
                    });
                }
            }
            5..=7 => {
                let got = m.mapping.bytes()[range.clone()].to_vec();
                ctx.report.read_bytes_verified += PAGE_BYTES as u64;
                let expected = m.model[range.clone()].to_vec();
                ctx.compare(&m.path, range.start as u64, &expected, &got);
            }
            8 => {
                if ctx
                    .op("msync", m.path.display(), || {
                        m.mapping.msync(0, m.mapping.len)
                    })
                    .is_ok()
                {
                    check_direct_page(ctx, &m, page);
                }
            }
            _ => {
                if let Some(big) = &big {
                    big_page(ctx, big, &big_path);
                }
            }
        }
    }
    let synced = ctx
        .op("msync", m.path.display(), || {
            m.mapping.msync(0, m.mapping.len)
        })
        .is_ok();
    drop(file);
    let path = m.path.clone();
    let model = std::mem::take(&mut m.model);
    drop(m);
    if synced {
        if let Some(got) = ctx.read_direct(&path) {
            ctx.report.acknowledged_bytes_verified += got.len().min(model.len()) as u64;
            ctx.compare(&path, 0, &model, &got);
        }
    }
}
