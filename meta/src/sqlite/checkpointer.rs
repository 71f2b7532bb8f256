//! Copies the write-ahead log back into the database file on a thread of
//! its own, so no request waits for a whole checkpoint.
//!
//! SQLite's own automatic checkpoint runs inside the COMMIT that takes the
//! log past 1,000 pages: that one request then fsyncs the log, writes about
//! 1,000 pages into the database file and fsyncs it. On this project's
//! benchmark VM that was 12-16 ms, paid by one unlink in every hundred, and
//! every other write waited behind it for the writer lock: over half of the
//! mean UNLINK time. Here the writer's COMMIT only notices the length (a WAL
//! hook) and wakes this thread.
//!
//! The thread first checkpoints with its own connection beside the writers
//! (PASSIVE: in WAL mode a checkpoint takes no lock a writer or a reader
//! needs), which copies the bulk while they append more, and syncs the log
//! and the database there too. Then, with the writer lock held, one more
//! checkpoint copies (and syncs) the few pages appended meanwhile: two
//! fdatasyncs, about 2 ms on this project's benchmark VM (2.7 ms while the
//! database was synced only there, and with fsync). That last step is
//! what keeps the log short: a write restarts
//! the log from its beginning only if the log was completely copied when it
//! starts, which a checkpoint racing the writers never achieves (without
//! it the log only grew, until commits checkpointed by themselves).
//!
//! The log stays bounded if the thread falls behind or is gone: past
//! [`WAL_CHECKPOINT_INLINE_PAGES`] the committing connection checkpoints
//! itself, as SQLite would have. If the thread is checkpointing right then
//! (where fsync is slow, writes without one can outrun its rounds: a CI
//! machine's log once reached 41 MiB), that commit cannot, and instead
//! later writes wait in [`Checkpointer::wait_while_behind`] until the
//! thread's round is done, as they would have waited behind SQLite's own
//! checkpoint.
//!
//! Durability is unchanged: a checkpoint syncs the log before it copies
//! and the database after, whichever connection runs it. (SQLite syncs
//! with fdatasync: `.cargo/config.toml` tells its bundled build that
//! Linux has it.)

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};

use crate::error::{MetaError, Result};
use crate::limits::{
    WAL_CHECKPOINT_CATCH_UP_ROUNDS_MAX, WAL_CHECKPOINT_FINISH_PAGES, WAL_CHECKPOINT_INLINE_PAGES,
    WAL_CHECKPOINT_PAGES,
};

/// The background checkpoint thread of one [`super::SqliteMeta`]; stopped
/// and joined when dropped.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Wake {
    state: Mutex<WakeState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct WakeState {
    wanted: bool,
    stopping: bool,
    /// The thread is in [`checkpoint`].
    checkpointing: bool,
    /// The log passed [`WAL_CHECKPOINT_INLINE_PAGES`] while the thread was
    /// checkpointing: writes wait until it is done.
    behind: bool,
}

/// The longest a write waits for a checkpoint that is behind before going
/// on anyway: a bound on the wait, never reached unless a sync hangs.
const BEHIND_WAIT_MAX: Duration = Duration::from_secs(5);

impl Checkpointer {
    /// Opens the thread's connection to the database at `path`, starts the
    /// thread, and installs the hook on `writer` that wakes it. The thread
    /// takes `writer`'s lock only to hold writes off for its last step.
    pub(crate) fn start(path: &Path, writer: &Arc<Mutex<Connection>>) -> Result<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)?;
        // A connection that has not read the file yet does not know it is
        // in WAL mode, and its checkpoints do nothing.
        super::schema::set_wal(&conn)?;
        let wake = Arc::new(Wake::default());
        let hook_wake = Arc::clone(&wake);
        // Replaces SQLite's automatic checkpoint, which is itself a WAL hook.
        lock(writer).wal_hook(Some(move |wal: &mut Wal, pages| {
            if pages >= WAL_CHECKPOINT_INLINE_PAGES {
                tracing::debug!(
                    pages,
                    "checkpoint thread behind; checkpointing in the commit"
                );
                // Never an error from here: SQLite would report it as the
                // failure of the statement whose transaction just committed.
                // Busy means the thread (or another process) is
                // checkpointing right now.
                if let Err(err) = wal.checkpoint() {
                    tracing::debug!(pages, %err, "checkpoint in the commit not done");
                    hook_wake.note_behind();
                }
            } else if pages >= WAL_CHECKPOINT_PAGES {
                hook_wake.request();
            }
            Ok(())
        }))?;
        let thread = std::thread::Builder::new()
            .name("baton-meta-checkpoint".into())
            .spawn({
                let wake = Arc::clone(&wake);
                let writer = Arc::clone(writer);
                let files = Files {
                    wal: super::wal_path(path),
                    db: path.to_owned(),
                };
                move || run(&conn, &writer, &files, &wake)
            })
            .map_err(|source| MetaError::Io {
                path: path.to_owned(),
                source,
            })?;
        Ok(Checkpointer {
            wake,
            thread: Some(thread),
        })
    }

    /// Returns at once unless the log outgrew the thread (see the module
    /// docs); then waits until its checkpoint is done. Called before a write
    /// takes the writer lock, which the thread's last round needs.
    pub(crate) fn wait_while_behind(&self) {
        let state = self.wake.lock();
        if !state.behind {
            return;
        }
        let started = Instant::now();
        let (state, timeout) = self
            .wake
            .changed
            .wait_timeout_while(state, BEHIND_WAIT_MAX, |s| s.behind)
            .unwrap_or_else(PoisonError::into_inner);
        drop(state);
        if timeout.timed_out() {
            tracing::warn!(
                waited_ms = BEHIND_WAIT_MAX.as_millis(),
                "metadata checkpoint still running; writing on"
            );
        } else {
            tracing::debug!(
                waited_us = started.elapsed().as_micros(),
                "write waited for the metadata checkpoint"
            );
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        {
            let mut state = self.wake.lock();
            state.stopping = true;
            state.behind = false;
        }
        self.wake.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("metadata checkpoint thread panicked");
            }
        }
    }
}

impl Wake {
    fn lock(&self) -> MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request(&self) {
        let mut state = self.lock();
        if !state.wanted {
            state.wanted = true;
            drop(state);
            self.changed.notify_all();
        }
    }

    /// A commit past [`WAL_CHECKPOINT_INLINE_PAGES`] could not checkpoint:
    /// if the thread is the reason, writes wait for it. (If another process
    /// is, nothing here would end the wait: the next commit tries again.)
    fn note_behind(&self) {
        let mut state = self.lock();
        if state.checkpointing {
            state.behind = true;
        }
    }

    /// The thread starts (true) or ends a checkpoint; its end releases the
    /// writes waiting for it.
    fn set_checkpointing(&self, running: bool) {
        let mut state = self.lock();
        state.checkpointing = running;
        if !running {
            // Commits during it asked again; the log is short now.
            state.wanted = false;
            if std::mem::take(&mut state.behind) {
                drop(state);
                self.changed.notify_all();
            }
        }
    }

    /// Waits for a request; false once stopping.
    fn wait(&self) -> bool {
        let mut state = self.lock();
        while !state.wanted && !state.stopping {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.wanted = false;
        !state.stopping
    }
}

fn lock(writer: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The thread: one checkpoint (see the module docs) per wake-up until
/// stopped. A failure is logged and the next commit past the threshold
/// asks again; it only leaves the log longer.
fn run(conn: &Connection, writer: &Mutex<Connection>, files: &Files, wake: &Wake) {
    let wal = &files.wal;
    while wake.wait() {
        wake.set_checkpointing(true);
        let done = checkpoint(conn, writer, files).map_err(|e| e.in_op("checkpoint"));
        wake.set_checkpointing(false);
        match done {
            Ok(()) => {}
            // Another process's checkpoint (two generations during a
            // handover) is copying the same log.
            Err(MetaError::Store { source, .. })
                if source.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) =>
            {
                tracing::debug!(wal = %wal.display(), "metadata checkpoint busy elsewhere");
            }
            Err(err) => {
                tracing::warn!(%err, wal = %wal.display(), "metadata checkpoint failed; the write-ahead log grows until one succeeds")
            }
        }
    }
}

/// The files a checkpoint syncs.
#[derive(Debug)]
struct Files {
    wal: PathBuf,
    db: PathBuf,
}

/// Catch-up rounds beside the writers while each still finds more than
/// [`WAL_CHECKPOINT_FINISH_PAGES`] new pages (under a stream of writes each
/// round copies about 0.7 of the one before: what was appended while it
/// ran), then an fdatasync of the log and of the database beside them too,
/// then the last round with writes held off, which then syncs only what
/// came since.
///
/// The database sync matters most: SQLite syncs the database only at the
/// end of a checkpoint that copied the whole log, which under writes only
/// the last round does, so that round used to write back every page the
/// catch-up rounds had copied (up to a few MiB) with writes held off.
fn checkpoint(conn: &Connection, writer: &Mutex<Connection>, files: &Files) -> Result<()> {
    let passive = || conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE);
    let mut copied_before = 0;
    for _ in 0..WAL_CHECKPOINT_CATCH_UP_ROUNDS_MAX {
        let (_, copied) = passive()?;
        let copied_now = copied - copied_before;
        copied_before = copied;
        if copied_now <= WAL_CHECKPOINT_FINISH_PAGES {
            break;
        }
    }
    for path in [&files.wal, &files.db] {
        match std::fs::File::open(path).and_then(|f| f.sync_data()) {
            Ok(()) => {}
            // No log (or no database): nothing to copy.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(MetaError::Io {
                    path: path.clone(),
                    source,
                })
            }
        }
    }
    let writes_held = lock(writer);
    let started = Instant::now();
    let (log_pages, copied_pages) = passive()?;
    drop(writes_held);
    tracing::debug!(
        log_pages,
        copied_pages,
        writes_held_us = started.elapsed().as_micros(),
        "metadata checkpoint"
    );
    Ok(())
}
