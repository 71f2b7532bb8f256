//! Serving an initialized connection with several worker threads, and
//! stopping them between requests.
//!
//! Workers take turns as the reader (leader/follower): the one holding the
//! read token polls the device and a stop eventfd, reads one request, hands
//! the token on and handles the request. Only one thread waits on the device
//! at a time, so a request wakes one thread, not all of them.
//!
//! Stopping ([`Stopper::stop`]): set the flag, wake the poller through the
//! eventfd, and kick a reader that is already blocked in `read()` with
//! SIGUSR2 (installed without SA_RESTART, so `read()` returns EINTR),
//! re-kicking until it has left: the signal can land just before `read()`.
//! A `read()` that already dequeued a request returns it, and it is handled
//! before the worker looks at the flag again, so no request is lost.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::pthread::{pthread_kill, pthread_self, Pthread};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::channel::{Channel, ReadOutcome};
use crate::dispatch::dispatch;
use crate::filesystem::Filesystem;
use crate::init::InitParams;
use crate::reply::{send_message, ReplyChannel};
use crate::request::{DecodeError, Request};
use crate::{abi, Error};

/// Worker threads per session at most.
pub const WORKERS_MAX: usize = 64;
/// How often a stop re-kicks a reader still blocked in `read()`.
const KICK_INTERVAL: Duration = Duration::from_millis(1);

/// The signal that kicks a worker out of a blocking `read()`.
pub const KICK_SIGNAL: Signal = Signal::SIGUSR2;

const STATE_WAITING: u8 = 0;
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
        handle_request(&*self.fs, &self.channel, &self.params, raw);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Starts `threads` workers reading the device.
    pub fn start(&self, threads: usize) -> Result<Workers, Error> {
        install_kick_handler()?;
        let threads = threads.clamp(1, WORKERS_MAX);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).map_err(Error::Poll)?,
            read_token: Mutex::new(()),
            workers: (0..threads).map(|_| WorkerSlot::default()).collect(),
            end: Mutex::new(None),
        });
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads {
            let worker = Worker {
                index,
                shared: Arc::clone(&shared),
                fs: Arc::clone(&self.fs),
                channel: Arc::clone(&self.channel),
                params: self.params,
                served: Arc::clone(&self.served),
            };
            let handle = std::thread::Builder::new()
                .name(format!("fuse-worker-{index}"))
                .spawn(move || worker.run())
                .map_err(Error::Spawn)?;
            handles.push(handle);
        }
        Ok(Workers { shared, handles })
    }
}

/// Decodes `raw` and dispatches it; malformed requests get EINVAL.
fn handle_request<F: Filesystem + ?Sized>(
    fs: &F,
    channel: &Arc<Channel>,
    params: &InitParams,
    raw: &[u8],
) {
    let reply_channel: Arc<dyn ReplyChannel> = channel.clone();
    match Request::parse(raw, params.decode_options()) {
        Ok(request) => {
            tracing::trace!(
                unique = request.unique(),
                opcode = request.opcode(),
                nodeid = request.nodeid(),
                "request"
            );
            dispatch(fs, &request, &reply_channel);
        }
        Err(err) => {
            tracing::error!(%err, "malformed FUSE request");
            let no_reply = matches!(
                err,
                DecodeError::Truncated { opcode, .. }
                    if opcode == abi::opcode::FORGET || opcode == abi::opcode::BATCH_FORGET || opcode == abi::opcode::INTERRUPT
            );
            if let (Some(unique), false) = (err.unique(), no_reply) {
                send_message(&*reply_channel, unique, -(Errno::EINVAL as i32), &[]);
            }
        }
    }
}

#[derive(Default)]
struct WorkerSlot {
    state: AtomicU8,
    thread: Mutex<Option<Pthread>>,
}

struct Shared {
    stop: AtomicBool,
    wake: EventFd,
    read_token: Mutex<()>,
    workers: Vec<WorkerSlot>,
    end: Mutex<Option<Errno>>,
}

impl Shared {
    fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // The eventfd stays readable: every later poll returns at once.
        if let Err(errno) = self.wake.write(1) {
            tracing::error!(%errno, "cannot signal the stop eventfd");
        }
    }

    fn all_exited(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.state.load(Ordering::SeqCst) == STATE_EXITED)
    }

    fn kick_readers(&self) {
        for slot in &self.workers {
            if slot.state.load(Ordering::SeqCst) != STATE_READING {
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
            std::thread::sleep(KICK_INTERVAL);
        }
    }

    /// Asks the workers to stop without waiting.
    pub fn request_stop(&self) {
        self.shared.request_stop();
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
    shared: Arc<Shared>,
    fs: Arc<F>,
    channel: Arc<Channel>,
    params: InitParams,
    served: Arc<AtomicU64>,
}

impl<F: Filesystem> Worker<F> {
    fn run(self) {
        let slot = &self.shared.workers[self.index];
        *slot.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(pthread_self());
        let mut buf = vec![0u8; self.params.read_buffer_len()];
        while let Some(len) = self.next_request(slot, &mut buf) {
            handle_request(&*self.fs, &self.channel, &self.params, &buf[..len]);
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        slot.state.store(STATE_EXITED, Ordering::SeqCst);
    }

    /// Becomes the reader and reads one request; None when stopping.
    fn next_request(&self, slot: &WorkerSlot, buf: &mut [u8]) -> Option<usize> {
        slot.state.store(STATE_WAITING, Ordering::SeqCst);
        let _token = self
            .shared
            .read_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            match self.channel.wait_readable(self.shared.wake.as_fd()) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(err) => {
                    tracing::error!(%err, "polling /dev/fuse failed; stopping");
                    self.end(Errno::EIO);
                    return None;
                }
            }
            if self.shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            slot.state.store(STATE_READING, Ordering::SeqCst);
            let outcome = self.channel.receive(buf);
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
