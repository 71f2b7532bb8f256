//! The session timer: a thread that runs [`BatonFs::session_tick`] every
//! [`heartbeat_interval`] (a fifth of the expiry) while this process serves
//! a mount, so other mounts of the volume see this one alive and this one
//! cleans up after dead ones (`fs/orphans.rs` says what a tick does).
//! The same thread retries lock requests parked behind another mount's
//! lock (`fs/lock.rs`), every `LOCK_RETRY_INTERVAL` while any wait, and
//! lets go of the inodes requests unlinked (`fs/orphans.rs`), in batches,
//! retires the staging directories flushes emptied
//! (`fs/staging_dirs.rs`), and answers parked LSEEKs (`fs/seek.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fs::LOCK_RETRY_INTERVAL;

use crate::fs::BatonFs;

/// Default time after its last heartbeat at which a session counts as dead.
pub const SESSION_EXPIRY_MS_DEFAULT: u64 = 30_000;
/// Shortest expiry accepted (tests use a few hundred ms).
pub const SESSION_EXPIRY_MS_MIN: u64 = 200;
/// Environment variable giving the expiry when `--session-expiry-ms` is
/// absent (generations started by fs-supervisor inherit its environment).
pub const SESSION_EXPIRY_ENV: &str = "BATON_SESSION_EXPIRY_MS";

/// How often a session renews its heartbeat: five times per expiry, so a
/// few slow database round trips do not make a live mount look dead.
pub fn heartbeat_interval(expiry: Duration) -> Duration {
    expiry / 5
}

/// This host's name, for the session row (`/proc/sys/kernel/hostname`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Puts the calling thread under `SCHED_BATCH`, so that waking it (an
/// UNLINK queueing an orphan, a request letting go of the metadata writer
/// it waits for) does not preempt the request worker that woke it. Under
/// the default policy the woken timer thread took the worker's CPU for its
/// whole batch (2-5 ms every 10 ms of an unlink burst), the worker's reply
/// still unsent, while the other CPU sat idle. Its CPU share is unchanged
/// (same nice), so it is not starved while it holds the writer.
fn schedule_as_background() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (id 0) with a valid
    // parameter block; it touches no memory of ours after returning.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(%error, "session timer thread keeps the default scheduling policy");
    }
}

/// The running timer; [`SessionTimer::stop`] ends it.
pub struct SessionTimer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SessionTimer {
    /// Starts ticking (the first tick at once: it reclaims what dead
    /// mounts left).
    pub fn start(fs: Arc<BatonFs>, expiry: Duration) -> SessionTimer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let interval = heartbeat_interval(expiry);
        let span = tracing::Span::current();
        let thread = std::thread::spawn(move || {
            let _in_span = span.enter();
            schedule_as_background();
            fs.set_timer_thread(Some(std::thread::current()));
            let mut next_tick = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                fs.answer_parked_seeks();
                let orphans_due = fs.settle_queued_orphans(false);
                if Instant::now() >= next_tick {
                    if let Err(err) = fs.session_tick(expiry) {
                        // Fenced (handing over) or the store is
                        // unreachable: the next tick tries again.
                        tracing::warn!(%err, "session tick failed");
                    }
                    next_tick = Instant::now() + interval;
                }
                let mut sleep = next_tick.saturating_duration_since(Instant::now());
                if fs.retry_locks() {
                    sleep = sleep.min(LOCK_RETRY_INTERVAL);
                }
                if let Some(due) = orphans_due {
                    sleep = sleep.min(due);
                }
                if let Some(due) = fs.retire_staging_dirs() {
                    sleep = sleep.min(due);
                }
                std::thread::park_timeout(sleep);
            }
            // From here on requests settle their orphans themselves, and
            // LSEEKs are answered where they arrive.
            fs.set_timer_thread(None);
            fs.stop_parking_seeks();
            fs.settle_orphans_at_exit();
        });
        SessionTimer {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops ticking and waits for the thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
