//! The buffers workers read requests into: resident before the first read,
//! and on huge pages where the kernel has them.
//!
//! Why: the kernel copies a request into the reader's buffer with
//! get_user_pages. If a page is not yet present (a fresh allocation is
//! mapped lazily), the copy takes the slow path, which gives up with EINTR
//! when the reader has a fatal signal pending, and `fuse_dev_do_read` then
//! ends the request with EIO. So a generation killed with -9 while a worker
//! is mid-copy would fail an application's WRITE or FSYNC instead of
//! leaving it for RESEND (seen in the kill -9 loops as fsync EIO, more
//! often under load). With every page present, writable and locked, the
//! copy never faults and the request stays in the kernel's processing list,
//! where RESEND finds it.
//!
//! Faulting a buffer in takes a few hundred µs; a process that knows it
//! will serve (a standby generation) prepares its buffers before it takes
//! the connection ([`crate::IdleWorkers`]), out of the
//! applications' stall.
//!
//! Why huge pages: the workers' buffers (`max_write` + 4 KiB each, 4 MiB
//! for four workers at 1 MiB) are most of a generation's anonymous memory,
//! and a kill -9 takeover cannot start before the kernel has freed the dead
//! generation's memory, which it does page by page. So the buffers of a
//! generation's workers are one mapping, aligned to 2 MiB and advised
//! `MADV_HUGEPAGE`: the kernel frees two huge pages where it freed a
//! thousand small ones. Measured on the 2-vCPU VM with `baton-bench stall
//! --kills 60` (alternating builds, 3 rounds): warm-standby stall p50 4.75,
//! 4.84, 4.72 ms → 3.81, 3.88, 3.92 ms (docs/benchmarks-history.md, session 16).
//! The mapping is locked whole: locking part of a huge page splits it.
//! Where the kernel has no huge page to give (THP off, a memory cgroup at
//! its limit, fragmented memory), the mapping is small pages, as a `Vec`
//! was.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::mman::{madvise, mlock, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

use crate::Error;

/// Page size assumed for touching (a smaller real page size only means
/// some pages are touched by mlock alone).
const PAGE_BYTES: usize = 4096;
/// The huge page size the mapping is aligned to (x86-64 and arm64 with 4 KiB
/// pages; elsewhere the advice is simply not taken).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// One worker's read buffer: its own stretch of a [`BufferMapping`].
pub struct RequestBuffer {
    mapping: Arc<BufferMapping>,
    offset: usize,
    len: usize,
}

impl RequestBuffer {
    /// `count` buffers of `len` bytes each, from one zeroed mapping whose
    /// pages are faulted in for writing and, where the process may
    /// (CAP_IPC_LOCK or RLIMIT_MEMLOCK), locked in memory.
    pub fn many(count: usize, len: usize) -> Result<Vec<RequestBuffer>, Error> {
        let stretch = len.next_multiple_of(PAGE_BYTES);
        let total = stretch.checked_mul(count).ok_or(Error::ReadBuffers {
            bytes: usize::MAX,
            errno: Errno::EOVERFLOW,
        })?;
        let mapping = Arc::new(BufferMapping::new(total)?);
        Ok((0..count)
            .map(|index| RequestBuffer {
                mapping: Arc::clone(&mapping),
                offset: index * stretch,
                len,
            })
            .collect())
    }

    /// One buffer of `len` bytes, in a mapping of its own.
    pub fn new(len: usize) -> Result<RequestBuffer, Error> {
        Ok(RequestBuffer {
            mapping: Arc::new(BufferMapping::new(len)?),
            offset: 0,
            len,
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `offset + len` is inside the mapping (`many` gives each
        // buffer its own page-rounded stretch of it), the mapping lives as
        // long as this `Arc`, and no two buffers share a byte, so this
        // `&mut self` borrow is the only access to those bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.mapping.addr.as_ptr().add(self.offset), self.len)
        }
    }
}

/// An anonymous private mapping that starts on a huge page boundary,
/// unmapped (and so unlocked) when the last buffer in it is dropped.
struct BufferMapping {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory with no thread affinity; each `RequestBuffer` reads
// and writes only its own disjoint stretch of it.
unsafe impl Send for BufferMapping {}
// SAFETY: as above; `BufferMapping` itself exposes no access to the bytes.
unsafe impl Sync for BufferMapping {}

impl BufferMapping {
    fn new(len: usize) -> Result<BufferMapping, Error> {
        let len = len.max(1).next_multiple_of(PAGE_BYTES);
        let fail = |errno| Error::ReadBuffers { bytes: len, errno };
        // Map a huge page more than needed, then give back the unaligned
        // head and the tail: mmap only promises page alignment.
        let reserved = len
            .checked_add(HUGE_PAGE_BYTES)
            .ok_or_else(|| fail(Errno::EOVERFLOW))?;
        let reserved_nz = NonZeroUsize::new(reserved).ok_or_else(|| fail(Errno::EINVAL))?;
        // SAFETY: a fresh anonymous mapping at an address the kernel picks
        // aliases nothing.
        let raw = unsafe {
            mmap_anonymous(
                None,
                reserved_nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(fail)?;
        let base = raw.as_ptr() as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let head = start - base;
        let tail = reserved - head - len;
        // SAFETY: both ranges are page-aligned parts of the mapping just
        // made, outside [start, start + len), and nothing refers to them.
        unsafe {
            if let Some(at) = NonNull::new(base as *mut libc::c_void).filter(|_| head > 0) {
                let _ = munmap(at, head);
            }
            if let Some(at) = NonNull::new((start + len) as *mut libc::c_void).filter(|_| tail > 0)
            {
                let _ = munmap(at, tail);
            }
        }
        let addr = NonNull::new(start as *mut u8).ok_or_else(|| fail(Errno::EINVAL))?;
        let mapping = BufferMapping { addr, len };
        // SAFETY: the range is exactly this live mapping.
        if let Err(errno) = unsafe { madvise(addr.cast(), len, MmapAdvise::MADV_HUGEPAGE) } {
            tracing::debug!(%errno, len, "read buffers not advised onto huge pages");
        }
        // Write-fault every page before the first read (volatile, so the
        // stores are not dropped as writes of what is already there).
        for offset in (0..len).step_by(PAGE_BYTES) {
            // SAFETY: `offset < len`, inside the mapping.
            unsafe { std::ptr::write_volatile(addr.as_ptr().add(offset), 0) };
        }
        // SAFETY: as for madvise; it stays locked until `Drop` unmaps it.
        if let Err(errno) = unsafe { mlock(addr.cast(), len) } {
            tracing::debug!(%errno, len, "read buffers not locked in memory (touched only)");
        }
        Ok(mapping)
    }
}

impl Drop for BufferMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; every buffer in it is gone
        // (each held an `Arc` to this).
        let _ = unsafe { munmap(self.addr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages of `slice` (widened to page boundaries) that are not resident.
    fn absent_pages(slice: &[u8]) -> usize {
        let start = (slice.as_ptr() as usize) & !(PAGE_BYTES - 1);
        let len = slice.as_ptr() as usize + slice.len() - start;
        let mut pages = vec![0u8; len.div_ceil(PAGE_BYTES)];
        // SAFETY: mincore reads the page tables of this live mapping
        // (rounded down to a page boundary) into `pages`, one byte a page.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|p| *p & 1 == 0).count()
    }

    #[test]
    fn every_page_is_resident_before_the_first_read() {
        let mut buffers = RequestBuffer::many(3, (1 << 20) + 4096).unwrap();
        for buf in &mut buffers {
            let absent = absent_pages(buf.as_mut_slice());
            assert_eq!(absent, 0, "{absent} pages of a read buffer not resident");
        }
    }

    #[test]
    fn buffers_of_one_mapping_do_not_overlap() {
        let len = (1 << 20) + 4096 + 7;
        let mut buffers = RequestBuffer::many(4, len).unwrap();
        for (index, buf) in buffers.iter_mut().enumerate() {
            assert_eq!(buf.len(), len);
            buf.as_mut_slice().fill(index as u8 + 1);
        }
        for (index, buf) in buffers.iter_mut().enumerate() {
            let slice = buf.as_mut_slice();
            assert!(
                slice.iter().all(|b| *b == index as u8 + 1),
                "buffer {index} was overwritten by another"
            );
        }
    }

    /// The mapping starts on a huge page boundary and, where this kernel
    /// hands out transparent huge pages on advice, is backed by them.
    #[test]
    fn the_mapping_is_on_huge_pages_where_the_kernel_has_them() {
        let mut buffers = RequestBuffer::many(4, (1 << 20) + 4096).unwrap();
        let start = buffers[0].as_mut_slice().as_ptr() as usize;
        assert_eq!(
            start % HUGE_PAGE_BYTES,
            0,
            "mapping not aligned to a huge page"
        );
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !(thp.contains("[madvise]") || thp.contains("[always]")) {
            eprintln!("skipped the huge page check: transparent huge pages are {thp:?} here");
            return;
        }
        let huge_kib = anon_huge_kib_at(start);
        assert!(
            huge_kib >= 4096,
            "read buffers on {huge_kib} KiB of huge pages, expected the 4 MiB their two whole huge pages hold"
        );
    }

    /// `AnonHugePages` of the mapping holding `start`, from /proc/self/smaps
    /// (the kernel may have merged it with a neighbour of the same kind).
    fn anon_huge_kib_at(start: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_mapping = false;
        for line in smaps.lines() {
            let range = line.split_once(' ').map_or(line, |(range, _)| range);
            if let Some((from, to)) = range.split_once('-') {
                if let (Ok(from), Ok(to)) = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                ) {
                    in_mapping = (from..to).contains(&start);
                    continue;
                }
            }
            if in_mapping {
                if let Some(kib) = line.strip_prefix("AnonHugePages:") {
                    return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
                }
            }
        }
        panic!("no mapping at {start:#x} in /proc/self/smaps");
    }
}
