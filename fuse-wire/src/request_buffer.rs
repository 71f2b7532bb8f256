//! The buffer a worker reads requests into, resident before the first read.
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

use std::ptr::NonNull;

/// Page size assumed for touching (a smaller real page size only means
/// some pages are touched by mlock alone).
const PAGE_BYTES: usize = 4096;

/// A zeroed buffer whose pages are faulted in for writing and, where the
/// process may (CAP_IPC_LOCK or RLIMIT_MEMLOCK), locked in memory.
pub struct RequestBuffer {
    bytes: Vec<u8>,
    locked: bool,
}

impl RequestBuffer {
    /// A resident buffer of `len` bytes.
    pub fn new(len: usize) -> RequestBuffer {
        let mut bytes = vec![0u8; len];
        // Write-fault every page (volatile: the allocator's zeroing would
        // otherwise let the compiler drop plain stores of zero).
        for offset in (0..len).step_by(PAGE_BYTES) {
            // SAFETY: `offset < len`, inside the allocation.
            unsafe { std::ptr::write_volatile(bytes.as_mut_ptr().add(offset), 0) };
        }
        let locked = match NonNull::new(bytes.as_mut_ptr().cast()) {
            // SAFETY: the range is this live allocation; it is unlocked in
            // Drop before the Vec frees it.
            Some(addr) if len > 0 => match unsafe { nix::sys::mman::mlock(addr, len) } {
                Ok(()) => true,
                Err(errno) => {
                    tracing::debug!(%errno, len, "request buffer not locked in memory (touched only)");
                    false
                }
            },
            _ => false,
        };
        RequestBuffer { bytes, locked }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The whole buffer.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for RequestBuffer {
    fn drop(&mut self) {
        if !self.locked {
            return;
        }
        if let Some(addr) = NonNull::new(self.bytes.as_mut_ptr().cast()) {
            // SAFETY: the range locked in `new`, still allocated.
            let _ = unsafe { nix::sys::mman::munlock(addr, self.bytes.len()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_resident_before_the_first_read() {
        let mut buf = RequestBuffer::new(1 << 20);
        let slice = buf.as_mut_slice();
        let start = (slice.as_ptr() as usize) & !(PAGE_BYTES - 1);
        let len = slice.as_ptr() as usize + slice.len() - start;
        let mut pages = vec![0u8; len.div_ceil(PAGE_BYTES)];
        // SAFETY: mincore reads the page tables of this live allocation
        // (rounded down to a page boundary) into `pages`, one byte a page.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        let absent = pages.iter().filter(|p| *p & 1 == 0).count();
        assert_eq!(absent, 0, "{absent} of {} pages not resident", pages.len());
    }
}
