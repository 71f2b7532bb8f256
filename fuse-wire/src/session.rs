//! Serving an initialized connection with several worker threads, and
//! stopping them between requests.
//!
//! Each worker blocks in `read()` on the shared device fd; the kernel wakes
//! one reader per request (an exclusive wait), so no thread is woken for
//! nothing. A poll-and-token loop was measured first and cost half the
//! request rate (an extra poll and a futex hand-off per request on 2 cores),
//! so the loop blocks in `read()` and stops with a signal instead.
//!
//! Stopping ([`Stopper::stop`]): set the flag, then kick every worker that is
//! blocked in `read()` with SIGUSR2 (installed without SA_RESTART, so
//! `read()` returns EINTR), re-kicking until each has left: the signal can
//! land just before `read()` is called. A `read()` that already dequeued a
//! request returns it, and it is handled before the worker looks at the flag
//! again, so no request is lost. Requests not yet read stay queued in the
//! kernel for the next reader, in this process or the next generation.
//!
//! Handover ([`Stopper::stop_within`], [`Stopper::inflight`]): each worker
//! publishes the request it read in its slot (pointer and length, under the
//! slot's mutex) before it marks itself handling, and withdraws it before
//! touching its buffer again, so another thread can copy the raw bytes of
//! requests that did not finish within a bound, for the in-flight journal.
//! `stop_within` returns only once no worker is reading: a kicked worker
//! that has not run yet (a busy CPU) can still dequeue a request, which
//! would be neither journaled nor answered (its reply is sealed off).
//!
//! A filesystem method that panics aborts the process: its reply is gone, so
//! the only way to get the caller an answer is a new generation and RESEND.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::pthread::{pthread_kill, pthread_self, Pthread};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::channel::{Channel, ReadOutcome};
use crate::dispatch::dispatch;
use crate::filesystem::Filesystem;
use crate::init::InitParams;
use crate::reply::{send_message, ReplyChannel};
use crate::request::{DecodeError, DecodeOptions, Request};
use crate::request_buffer::RequestBuffer;
use crate::{abi, Error};

/// Worker threads per session at most.
pub const WORKERS_MAX: usize = 64;
/// How often a stop re-kicks a reader still blocked in `read()`.
const KICK_INTERVAL: Duration = Duration::from_millis(1);
/// The same during a handover, where every microsecond is stall.
const HANDOVER_KICK_INTERVAL: Duration = Duration::from_micros(50);
/// How long [`Stopper::stop_within`] waits, past its bound, for workers
/// that may still read (kicked, but not yet run: a busy CPU) to leave
/// `read()` or publish what they read.
pub const READERS_STOP_MAX: Duration = Duration::from_secs(10);

/// The signal that kicks a worker out of a blocking `read()`.
pub const KICK_SIGNAL: Signal = Signal::SIGUSR2;

const STATE_STARTING: u8 = 0;
const STATE_READING: u8 = 1;
const STATE_HANDLING: u8 = 2;
const STATE_EXITED: u8 = 3;

/// Why the workers stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// [`Stopper::stop`] was called: requests not yet read stay queued in the
    /// kernel for the next generation.
    Stopped,
    /// The connection ended: ENODEV after unmount, ECONNABORTED after abort.
    Ended(Errno),
}

/// A connection being served: the filesystem, the channel and the INIT result.
pub struct Session<F: Filesystem> {
    fs: Arc<F>,
    channel: Arc<Channel>,
    params: InitParams,
    served: Arc<AtomicU64>,
}

impl<F: Filesystem> Session<F> {
    /// Serves `channel`, which has already been through INIT with `params`.
    pub fn new(channel: Arc<Channel>, params: InitParams, fs: Arc<F>) -> Self {
        Session {
            fs,
            channel,
            params,
            served: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The channel (e.g. for notifications).
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    /// The INIT parameters this connection runs with.
    pub fn params(&self) -> &InitParams {
        &self.params
    }

    /// The filesystem.
    pub fn filesystem(&self) -> &Arc<F> {
        &self.fs
    }

    /// Requests handled so far by this session.
    pub fn requests_served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Asks the kernel to re-queue every request read but not answered on
    /// this connection. Only when no other generation is alive, before the
    /// first read.
    pub fn resend(&self) -> Result<(), Error> {
        crate::notify::resend(&*self.channel).map_err(Error::Notify)
    }

    /// Decodes and answers one request from its raw bytes: a request just
    /// read, or one a previous generation journaled (its unique is still
    /// valid on this open file description).
    pub fn handle(&self, raw: &[u8]) {
        let channel: Arc<dyn ReplyChannel> = self.channel.clone();
        handle_request(&*self.fs, &channel, self.params.decode_options(), raw);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Starts `threads` workers reading the device.
    pub fn start(&self, threads: usize) -> Result<Workers, Error> {
        let buffer_len = self.params.read_buffer_len();
        self.start_idle(IdleWorkers::spawn(threads, buffer_len)?)
    }

    /// Puts workers started earlier ([`IdleWorkers::spawn`]) to work on
    /// this session: no thread is created and no memory mapped here.
    pub fn start_idle(&self, idle: IdleWorkers<F>) -> Result<Workers, Error> {
        install_kick_handler()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            workers: idle.posts.iter().map(|_| WorkerSlot::default()).collect(),
            end: Mutex::new(None),
            exited: Condvar::new(),
            exit_lock: Mutex::new(()),
        });
        for (index, post) in idle.posts.into_iter().enumerate() {
            let worker = Worker {
                index,
                buffer: None,
                shared: Arc::clone(&shared),
                fs: Arc::clone(&self.fs),
                channel: Arc::clone(&self.channel),
                params: self.params,
                served: Arc::clone(&self.served),
            };
            // Workers log in the caller's span (its fields, e.g. which
            // mount and generation, on every line).
            post.send((worker, tracing::Span::current())).map_err(|_| {
                Error::Spawn(std::io::Error::other("an idle FUSE worker thread is gone"))
            })?;
        }
        Ok(Workers {
            shared,
            handles: idle.handles,
        })
    }
}

/// Decodes `raw` and dispatches it to `fs`, replying through `channel`.
/// A malformed request is logged and answered EINVAL (when it has a unique
/// and expects a reply); it never panics.
pub fn handle_request<F: Filesystem + ?Sized>(
    fs: &F,
    channel: &Arc<dyn ReplyChannel>,
    options: DecodeOptions,
    raw: &[u8],
) {
    match Request::parse(raw, options) {
        Ok(request) => {
            tracing::trace!(
                unique = request.unique(),
                opcode = request.opcode(),
                nodeid = request.nodeid().get(),
                "request"
            );
            dispatch(fs, &request, channel);
        }
        Err(err) => {
            tracing::error!(%err, "malformed FUSE request");
            let no_reply = matches!(
                err,
                DecodeError::Truncated { opcode, .. }
                    if opcode == abi::opcode::FORGET || opcode == abi::opcode::BATCH_FORGET || opcode == abi::opcode::INTERRUPT
            );
            if let (Some(unique), false) = (err.unique(), no_reply) {
                send_message(&**channel, unique, -(Errno::EINVAL as i32), &[]);
            }
        }
    }
}

#[derive(Default)]
struct WorkerSlot {
    state: AtomicU8,
    thread: Mutex<Option<Pthread>>,
    /// The request being handled: address and length in the worker's
    /// buffer. Invariant: while `Some`, the worker neither writes nor frees
    /// that buffer; it sets `None` (under this mutex) before it does.
    handling: Mutex<Option<(usize, usize)>>,
}

impl WorkerSlot {
    fn publish(&self, request: &[u8]) {
        *self.handling.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((request.as_ptr() as usize, request.len()));
    }

    fn withdraw(&self) {
        *self.handling.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// A copy of the request being handled, if any.
    fn copy_handling(&self) -> Option<Vec<u8>> {
        let handling = self.handling.lock().unwrap_or_else(PoisonError::into_inner);
        let (addr, len) = (*handling)?;
        // SAFETY: the slot invariant: the worker keeps the buffer alive and
        // unwritten while the request is published, and cannot withdraw it
        // while we hold the mutex. Both sides only read the bytes.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        Some(bytes.to_vec())
    }
}

struct Shared {
    stop: AtomicBool,
    workers: Vec<WorkerSlot>,
    end: Mutex<Option<Errno>>,
    /// Notified (under `exit_lock`) by each worker as it leaves its loop,
    /// so a stop wakes as soon as the last one left instead of at its next
    /// re-kick.
    exited: Condvar,
    exit_lock: Mutex<()>,
}

impl Shared {
    fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Called by a worker after it marked its slot exited.
    fn announce_exit(&self) {
        let _held = self
            .exit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.exited.notify_all();
    }

    /// Waits until every worker left or `interval` passed.
    fn wait_for_exits(&self, interval: Duration) {
        let held = self
            .exit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock: a worker that exits after this check
        // notifies only once this thread waits.
        if !self.all_exited() {
            let _ = self.exited.wait_timeout(held, interval);
        }
    }

    fn all_exited(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.state.load(Ordering::SeqCst) == STATE_EXITED)
    }

    /// Whether a worker may still dequeue a request: one in (or about to
    /// enter) `read()`. A starting worker checks the stop flag before its
    /// first read; a handling one has published its request.
    fn any_reading(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.state.load(Ordering::SeqCst) == STATE_READING)
    }

    /// Kicks workers blocked in (or about to enter) `read()`. Workers that
    /// are handling a request are left alone; they see the flag next.
    fn kick_readers(&self) {
        for slot in &self.workers {
            let state = slot.state.load(Ordering::SeqCst);
            if state != STATE_READING && state != STATE_STARTING {
                continue;
            }
            let thread = *slot.thread.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(thread) = thread {
                // ESRCH: the thread is already gone, which is what we want.
                let _ = pthread_kill(thread, KICK_SIGNAL);
            }
        }
    }
}

/// A handle that stops the workers between requests, from any thread.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
}

impl Stopper {
    /// Stops every worker between requests and returns once all have left
    /// the read loop. Requests already read are answered first.
    pub fn stop(&self) {
        self.shared.request_stop();
        while !self.shared.all_exited() {
            self.shared.kick_readers();
            self.shared.wait_for_exits(KICK_INTERVAL);
        }
    }

    /// Asks the workers to stop without waiting: each stops after its
    /// current request, or when the next request arrives. Call
    /// [`Stopper::stop`] to make blocked readers leave at once.
    pub fn request_stop(&self) {
        self.shared.request_stop();
    }

    /// Stops reading (as [`Stopper::stop`]) but waits at most `bound` for
    /// requests being handled to finish. Returns true if every worker left;
    /// otherwise [`Stopper::inflight`] has the requests still running.
    ///
    /// Past `bound` it still waits (up to [`READERS_STOP_MAX`]) until no
    /// worker is reading: one kicked but not yet run can still dequeue a
    /// request, and it must be published before the caller copies them.
    pub fn stop_within(&self, bound: Duration) -> bool {
        let start = std::time::Instant::now();
        let deadline = start + bound;
        self.shared.request_stop();
        loop {
            if self.shared.all_exited() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline && !self.shared.any_reading() {
                return false;
            }
            if now >= start + bound + READERS_STOP_MAX {
                tracing::error!(
                    waited_ms = now.duration_since(start).as_millis() as u64,
                    "FUSE workers still reading after a stop; a request they read now is not journaled"
                );
                return false;
            }
            self.shared.kick_readers();
            // Short: this is the start of an upgrade's stall.
            self.shared.wait_for_exits(HANDOVER_KICK_INTERVAL);
        }
    }

    /// Raw copies of the requests workers are handling right now (for the
    /// in-flight journal). Copy after the workers stopped reading and
    /// BEFORE sealing the channel: then every request whose reply the seal
    /// drops is in the copy (one that finishes in between is answered, and
    /// may be answered again by the next generation: the kernel drops the
    /// second answer).
    pub fn inflight(&self) -> Vec<Vec<u8>> {
        self.shared
            .workers
            .iter()
            .filter_map(WorkerSlot::copy_handling)
            .collect()
    }

    /// Whether every worker has left its loop.
    pub fn all_exited(&self) -> bool {
        self.shared.all_exited()
    }

    /// Why the connection ended (unmount, abort), if it did.
    pub fn ended(&self) -> Option<Errno> {
        *self
            .shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Worker threads started before there is a connection to serve (by a
/// standby): each already has its thread, its stack, its malloc arena and
/// its faulted-in read buffer, and waits for its work.
/// [`Session::start_idle`] starts them, so taking over a connection creates
/// no thread inside the stall (thread stacks and first allocations map
/// memory, and a new process's threads then wait on each other for its
/// memory map, seen with `perf sched` in a new generation's first
/// requests). Dropped unused, the threads end.
pub struct IdleWorkers<F: Filesystem> {
    posts: Vec<SyncSender<(Worker<F>, tracing::Span)>>,
    handles: Vec<JoinHandle<()>>,
}

impl<F: Filesystem> IdleWorkers<F> {
    /// Starts `threads` (clamped to 1..=[`WORKERS_MAX`]) idle workers, each
    /// with a `buffer_len`-byte read buffer (a worker whose session needs a
    /// larger one makes it then), all in one mapping. Returns once every
    /// buffer is faulted in and every thread has started.
    pub fn spawn(threads: usize, buffer_len: usize) -> Result<Self, Error> {
        let threads = threads.clamp(1, WORKERS_MAX);
        let mut idle = IdleWorkers {
            posts: Vec::with_capacity(threads),
            handles: Vec::with_capacity(threads),
        };
        let mut buffers = RequestBuffer::many(threads, buffer_len)?;
        let (ready, started) = sync_channel::<()>(threads);
        for index in 0..threads {
            let buffer = buffers.pop();
            let (post, work) = sync_channel::<(Worker<F>, tracing::Span)>(1);
            let ready = ready.clone();
            let handle = std::thread::Builder::new()
                .name(format!("fuse-worker-{index}"))
                .spawn(move || {
                    // The thread's first allocation attaches it to a malloc
                    // arena, which may map memory: now, not in the stall.
                    drop(std::hint::black_box(Vec::<u8>::with_capacity(64)));
                    let _ = ready.send(());
                    if let Ok((mut worker, span)) = work.recv() {
                        worker.buffer = buffer;
                        span.in_scope(|| worker.run());
                    }
                })
                .map_err(Error::Spawn)?;
            idle.posts.push(post);
            idle.handles.push(handle);
        }
        drop(ready);
        for _ in 0..threads {
            started.recv().map_err(|_| {
                Error::Spawn(std::io::Error::other(
                    "a FUSE worker thread ended before it was ready",
                ))
            })?;
        }
        Ok(idle)
    }
}

/// The running workers of a [`Session`].
pub struct Workers {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// A handle to stop them from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops them between requests and waits.
    pub fn stop(self) -> ExitReason {
        self.stopper().stop();
        self.join()
    }

    /// Waits until they stop (by [`Stopper::stop`] or the connection ending).
    pub fn join(self) -> ExitReason {
        for handle in self.handles {
            if handle.join().is_err() {
                tracing::error!("a FUSE worker panicked");
            }
        }
        match *self
            .shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(errno) => ExitReason::Ended(errno),
            None => ExitReason::Stopped,
        }
    }
}

struct Worker<F: Filesystem> {
    index: usize,
    buffer: Option<RequestBuffer>,
    shared: Arc<Shared>,
    fs: Arc<F>,
    channel: Arc<Channel>,
    params: InitParams,
    served: Arc<AtomicU64>,
}

impl<F: Filesystem> Worker<F> {
    fn run(mut self) {
        let slot = &self.shared.workers[self.index];
        *slot.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(pthread_self());
        let needed = self.params.read_buffer_len();
        let mut buffer = match self.buffer.take() {
            Some(prepared) if prepared.len() >= needed => prepared,
            _ => RequestBuffer::new(needed).unwrap_or_else(|err| {
                // A worker that cannot read would leave its share of the
                // connection unserved; as with a panic, dying hands the
                // requests to a new generation (RESEND).
                tracing::error!(%err, "FUSE worker has no read buffer; aborting the process");
                std::process::abort()
            }),
        };
        let buf = buffer.as_mut_slice();
        let replies: Arc<dyn ReplyChannel> = self.channel.clone();
        let options = self.params.decode_options();
        while let Some(len) = self.next_request(slot, buf) {
            // Published by `next_request`.
            let request = &buf[..len];
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handle_request(&*self.fs, &replies, options, request)
            }));
            slot.withdraw();
            if handled.is_err() {
                // A panicking filesystem method dropped its reply, so the
                // caller would wait forever. Dying instead turns the bug into
                // a crash the next generation recovers with RESEND.
                tracing::error!(
                    "filesystem panicked while handling a request; aborting the process"
                );
                std::process::abort();
            }
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        slot.state.store(STATE_EXITED, Ordering::SeqCst);
        self.shared.announce_exit();
    }

    /// Reads one request; None when stopping or when the connection ended.
    fn next_request(&self, slot: &WorkerSlot, buf: &mut [u8]) -> Option<usize> {
        loop {
            slot.state.store(STATE_READING, Ordering::SeqCst);
            if self.shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            let outcome = self.channel.receive(buf);
            // Invariant: a request is published before the worker stops
            // counting as a reader, so a handover that waited for no
            // reader to remain has it in `inflight` (or it was answered).
            if let ReadOutcome::Request(len) = outcome {
                slot.publish(&buf[..len]);
            }
            slot.state.store(STATE_HANDLING, Ordering::SeqCst);
            match outcome {
                ReadOutcome::Request(len) => return Some(len),
                ReadOutcome::Retry => continue,
                ReadOutcome::Ended(errno) => {
                    tracing::info!(%errno, "FUSE connection ended");
                    self.end(errno);
                    return None;
                }
            }
        }
    }

    fn end(&self, errno: Errno) {
        self.shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(errno);
        self.shared.request_stop();
    }
}

extern "C" fn kick_handler(_: libc::c_int) {}

/// Installs the no-op SIGUSR2 handler without SA_RESTART, so a blocked
/// `read()` returns EINTR when kicked.
fn install_kick_handler() -> Result<(), Error> {
    let action = SigAction::new(
        SigHandler::Handler(kick_handler),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, which is async-signal-safe.
    unsafe { sigaction(KICK_SIGNAL, &action) }.map_err(Error::Signal)?;
    Ok(())
}

/// Wraps a received fd in a channel; a convenience for adopters.
pub fn adopt(fd: OwnedFd) -> Arc<Channel> {
    Arc::new(Channel::new(fd))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stopper_with(workers: usize) -> Stopper {
        Stopper {
            shared: Arc::new(Shared {
                stop: AtomicBool::new(false),
                workers: (0..workers).map(|_| WorkerSlot::default()).collect(),
                end: Mutex::new(None),
                exited: Condvar::new(),
                exit_lock: Mutex::new(()),
            }),
        }
    }

    #[test]
    fn a_handover_stop_waits_for_a_reader_that_has_not_run_yet_and_journals_what_it_read() {
        // Worker 0 is still handling a request past the bound; worker 1 was
        // kicked while blocked in read() but has not run yet (a busy CPU)
        // and dequeues a request when it does, 100 ms later. The stop must
        // not return before that request is published, or it would be
        // neither journaled nor answered.
        let stopper = stopper_with(2);
        let shared = Arc::clone(&stopper.shared);
        let running = b"running request".to_vec();
        shared.workers[0].publish(&running);
        shared.workers[0]
            .state
            .store(STATE_HANDLING, Ordering::SeqCst);
        shared.workers[1]
            .state
            .store(STATE_READING, Ordering::SeqCst);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // What `next_request` does once `read()` returned a request.
            let read: &'static [u8] = b"read after the stop";
            shared.workers[1].publish(read);
            shared.workers[1]
                .state
                .store(STATE_HANDLING, Ordering::SeqCst);
        });
        let all_done = stopper.stop_within(Duration::from_millis(1));
        assert!(!all_done);
        let mut journal = stopper.inflight();
        journal.sort();
        assert_eq!(
            journal,
            vec![b"read after the stop".to_vec(), running.clone()],
            "every request read is journaled"
        );
        late.join().unwrap();
    }

    #[test]
    fn a_handover_stop_returns_at_once_when_every_worker_left() {
        let stopper = stopper_with(2);
        for slot in &stopper.shared.workers {
            slot.state.store(STATE_EXITED, Ordering::SeqCst);
        }
        assert!(stopper.stop_within(Duration::from_secs(60)));
        assert!(stopper.inflight().is_empty());
    }
}
