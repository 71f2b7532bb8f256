//! Gives the heap memory a burst of requests freed back to the kernel once
//! the generation is idle.
//!
//! glibc keeps freed memory in its arenas (one per thread that allocated),
//! so a generation stayed as large as at its busiest moment: 75 MiB of
//! anonymous memory after a 512 MiB write and read, against 6 MiB before.
//! That is memory the node lacks, and it is time too: a kill -9 takeover
//! cannot start before the kernel has freed the dead process's memory,
//! 8.7 ms for that generation against 2.3 ms for an idle one (session 14,
//! docs/benchmarks-history.md). Large buffers allocated with mmap instead (a fixed
//! `M_MMAP_THRESHOLD`) kept it at 6.5 MiB, but their page faults cost 20 %
//! of sequential write and 45 % of sequential read throughput. So once an
//! interval passed in which nothing was answered, the stats thread trims
//! the heap, once per quiet spell.

use std::time::Instant;

/// Whether the heap was trimmed since the generation was last busy.
#[derive(Debug, Default)]
pub struct IdleTrim {
    trimmed: bool,
}

impl IdleTrim {
    /// Called once per stats interval: `busy` if any request or upload
    /// finished in it. Trims after the first quiet one.
    pub fn after_interval(&mut self, busy: bool) {
        if busy {
            self.trimmed = false;
            return;
        }
        if std::mem::replace(&mut self.trimmed, true) {
            return;
        }
        let start = Instant::now();
        let released = trim_heap();
        tracing::debug!(
            released,
            took_us = start.elapsed().as_micros() as u64,
            "idle: freed heap memory returned to the kernel"
        );
    }
}

/// `malloc_trim(0)`: every arena's free pages go back to the kernel. True
/// if any did.
#[cfg(target_env = "gnu")]
fn trim_heap() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas, under their locks.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Other C libraries have no `malloc_trim`; theirs return memory by
/// themselves or not at all.
#[cfg(not(target_env = "gnu"))]
fn trim_heap() -> bool {
    false
}
