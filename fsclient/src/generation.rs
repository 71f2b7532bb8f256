//! `fsclient serve`: one *generation* serving a connection the supervisor
//! holds, from adoption to exit, including both sides of a planned upgrade.
//!
//! Adoption: receive `Adopt` and the fd; after a death (`resend`) commit
//! what the dead one left staged and send FUSE_NOTIFY_RESEND; after a
//! planned handover, load the predecessor's [`HandoverState`] (handles) and
//! answer its [`InflightJournal`] before the first read; then serve and say
//! `Serving`.
//!
//! Handing over (`Handover` from the supervisor), in this order:
//! 1. stop reading; requests being handled get [`QUIESCE_BOUND`] to finish;
//! 2. copy the requests still running (the journal), then seal the channel
//!    (later replies are dropped) and fence the filesystem (no metadata
//!    commit, no staging write), so nothing still running here can act
//!    after the successor took over;
//! 3. write the journal and the state;
//! 4. answer `HandedOver` and wait: `Exit` ends the process at once (no
//!    flush: the successor owns the volume), `Resume` (the successor
//!    failed) lifts seal and fence and serves again; if requests were
//!    journaled, their workers may still be running here, so instead it
//!    exits and the supervisor's crash path recovers them with RESEND.
//!    While fenced, requests the stuck workers finish are harmless: their
//!    replies are dropped, and their mutations hit the fence (or ran before
//!    it and left an exactly-once record the successor answers from).
//!
//! Locks cross a handover: held locks in the state, parked SETLKW requests
//! (raw, from the lock table) in the journal, where the successor parks
//! them again (parked LSEEKs too, `fs/seek.rs`). They do not survive a crash: a dead generation's lock table
//! is gone.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fuse_wire::{Channel, IdleWorkers, Session, Stopper, Workers};
use nix::sys::signal::{SigSet, Signal};
use upgrade_protocol::{
    decode_state, encode_state, monotonic_ns, recv_message, send_message, GenerationCounters,
    HandleState, HandoverState, InflightJournal, Message, NegotiatedInit, ProtocolError,
    Unanswered,
};

use crate::error::{Error, Result};
use crate::fault::{self, Point};
use crate::fs::{replaying_journal, BatonFs};
use crate::handles::Handle;
use crate::idle_trim::IdleTrim;

/// How long requests being handled get to finish before they are journaled.
pub const QUIESCE_BOUND: Duration = Duration::from_millis(50);
/// Exit code of a generation that ends itself so that a clean one takes
/// over (a rolled-back handover with requests still running).
pub const EXIT_RESTART_CLEAN: i32 = 75;
/// How often counters are reported to the supervisor.
const STATS_INTERVAL: Duration = Duration::from_secs(1);
/// How often old exactly-once records are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);

/// What `Adopt` said.
pub struct Adoption {
    /// The generation number.
    pub generation: u64,
    /// The connection's random identity (exactly-once keys, the metadata
    /// session; not the kernel's fusectl connection number).
    pub connection_identity: u64,
    /// INIT result.
    pub init: NegotiatedInit,
    /// What to do first with the requests a dead reader left.
    pub unanswered: Unanswered,
    /// A predecessor's handover state.
    pub handover: Option<PathBuf>,
}

/// Receives `Adopt` and the fd from the supervisor.
pub fn receive_adopt(socket: &OwnedFd, path: &Path) -> Result<(Adoption, OwnedFd)> {
    let (message, mut fds) = recv_message(socket.as_fd())?;
    let Message::Adopt {
        generation,
        connection_identity,
        init,
        unanswered,
        handover,
    } = message
    else {
        return Err(Error::Handover {
            socket: path.to_path_buf(),
            reason: "the first message was not `adopt`",
        });
    };
    let Some(fd) = fds.pop() else {
        return Err(Error::Handover {
            socket: path.to_path_buf(),
            reason: "the adopt message carried no /dev/fuse fd",
        });
    };
    Ok((
        Adoption {
            generation,
            connection_identity,
            init,
            unanswered,
            handover,
        },
        fd,
    ))
}

/// A generation serving its connection.
pub struct Generation {
    fs: Arc<BatonFs>,
    session: Session<BatonFs>,
    channel: Arc<Channel>,
    socket: OwnedFd,
    adoption: Adoption,
    threads: usize,
    /// Workers started before adoption (taken by the first start).
    idle: Mutex<Option<IdleWorkers<BatonFs>>>,
    workers: Mutex<Option<Workers>>,
    /// Requests this generation journaled in a handover, kept for `Resume`.
    journaled: Mutex<Vec<Vec<u8>>>,
}

/// Refuses granted INIT flags outside those this build asks for.
fn check_init_flags(granted: u64) -> Result<()> {
    let unknown = granted & !fuse_wire::InitConfig::baton().flags;
    if unknown != 0 {
        return Err(Error::UnknownInitFlags { unknown });
    }
    Ok(())
}

impl Generation {
    /// Prepares to serve: loads a handover state, or recovers after a death.
    pub fn adopt(
        fs: Arc<BatonFs>,
        socket: OwnedFd,
        adoption: Adoption,
        fd: OwnedFd,
        threads: usize,
        idle: IdleWorkers<BatonFs>,
    ) -> Result<(Arc<Generation>, InflightJournal)> {
        fault::arm_from_env(adoption.generation).map_err(|e| Error::Fault(e.to_string()))?;
        // A flag asks the server for a duty (DONT_MASK: apply the umask;
        // POSIX_ACL: keep ACLs in step with the mode). A connection a newer
        // build negotiated may carry one this build does not know of, as in
        // a rollback; serving it would drop that duty silently.
        let params = fuse_wire::InitParams::from(&adoption.init);
        check_init_flags(params.flags)?;
        // Generation 1 serves a fresh connection; a later one that got no
        // handover state cannot know the handles the kernel holds.
        let inherited = adoption.generation > 1 && adoption.handover.is_none();
        fs.set_connection(adoption.connection_identity, adoption.generation, inherited);
        // After a death (RESEND), and in a new mount's first generation: what
        // an earlier mount left staged (its final flush failed) is committed
        // before serving, as `fsclient mount` does.
        let recovering = adoption.handover.is_none()
            && (adoption.unanswered == Unanswered::Resend || adoption.generation == 1);
        if !recovering {
            // The predecessor, if any, is fenced: staging is ours. (After a
            // death, `recover` takes it over in its own scan, which is in
            // the stall the application sees: one scan, not two.)
            fs.own_staging()?;
        }
        let mut journal = InflightJournal::default();
        if let Some(path) = &adoption.handover {
            let (state, loaded) = load_handover(path)?;
            // Invariant: the state is the one this connection's serving
            // generation wrote for this handover: another mount's or
            // connection's would import handles and locks the kernel never
            // issued here. Broken, this generation dies before it reads; the
            // supervisor rolls the upgrade back and the old one serves on.
            assert_eq!(
                state.connection_identity,
                adoption.connection_identity,
                "handover state {} is of another connection",
                path.display()
            );
            assert_eq!(
                state.init,
                adoption.init,
                "handover state {} holds another INIT",
                path.display()
            );
            assert!(
                state.generation < adoption.generation,
                "handover state {} is from generation {}, not before {}",
                path.display(),
                state.generation,
                adoption.generation
            );
            fs.import_handles(&handles_from(&state), state.next_fh, &state.open_orphans);
            fs.import_locks(&state.locks);
            journal = loaded;
            tracing::info!(
                generation = adoption.generation,
                from = state.generation,
                handles = state.handles.len(),
                journaled = journal.requests.len(),
                "handover state loaded"
            );
        } else if recovering {
            // No other generation is alive: commit what the dead one left,
            // and take over the locks its callers still hold.
            fs.recover(false)?;
            fs.restore_held_locks();
        }
        let channel = Arc::new(Channel::new(fd));
        fs.set_init(&params);
        fs.set_kernel_channel(channel.clone());
        let session = Session::new(Arc::clone(&channel), params, Arc::clone(&fs));
        let generation = Arc::new(Generation {
            fs,
            session,
            channel,
            socket,
            adoption,
            threads,
            idle: Mutex::new(Some(idle)),
            workers: Mutex::new(None),
            journaled: Mutex::new(Vec::new()),
        });
        Ok((generation, journal))
    }

    /// Sends RESEND if asked, answers `journal`, starts the workers and
    /// tells the supervisor it serves.
    pub fn start(&self, journal: &InflightJournal, unanswered: Unanswered) -> Result<()> {
        if unanswered == Unanswered::Resend {
            self.session.resend()?;
        }
        for raw in &journal.requests {
            replaying_journal(|| self.session.handle(raw));
        }
        let idle = lock(&self.idle).take();
        let workers = match idle {
            Some(idle) => self.session.start_idle(idle)?,
            // Resumed after a rolled-back upgrade: the first workers left.
            None => self.session.start(self.threads)?,
        };
        let reading_ns = monotonic_ns();
        spawn_waiter(workers.stopper());
        *lock(&self.workers) = Some(workers);
        self.send(&Message::Serving {
            generation: self.adoption.generation,
            pid: std::process::id(),
            reading_ns,
        });
        Ok(())
    }

    /// Serves until SIGTERM/SIGINT (then stops between requests, cancels
    /// parked lock requests and flushes) or the connection ends. Returns
    /// whether the connection ended (the mount is gone).
    pub fn run(self: &Arc<Self>, signals: &SigSet) -> Result<bool> {
        self.spawn_control();
        self.spawn_stats();
        let signal = signals.wait().map_err(crate::runtime::signal_error)?;
        tracing::info!(?signal, "stopping between requests");
        let ended = self.stopper().and_then(|s| s.ended()).is_some();
        if let Some(workers) = lock(&self.workers).take() {
            workers.stop();
        }
        self.fs.cancel_lock_waiters();
        self.fs.flush_all_at_exit(ended).map(|()| ended)
    }

    /// Registers the mount's session, or continues it (a generation after
    /// the first: same connection, same session, same holds).
    pub fn open_session(&self, volume: &str) -> Result<()> {
        let mount = format!("{volume} (supervised)");
        self.fs.open_session(&crate::session::host_name(), &mount)
    }

    /// The mount is gone: ends its session (failures are logged; the
    /// session then expires and other mounts clean up).
    pub fn close_session(&self) {
        if let Err(err) = self.fs.close_session() {
            tracing::warn!(%err, "session not closed; it expires and other mounts clean up");
        }
    }

    /// The filesystem served.
    pub fn fs(&self) -> Arc<BatonFs> {
        Arc::clone(&self.fs)
    }

    fn send(&self, message: &Message) {
        if let Err(err) = send_message(self.socket.as_fd(), message, &[]) {
            tracing::warn!(%err, kind = message.kind(), "cannot tell the supervisor");
        }
    }

    fn stopper(&self) -> Option<Stopper> {
        lock(&self.workers).as_ref().map(Workers::stopper)
    }

    /// Reads the supervisor's messages: handover, resume, exit.
    fn spawn_control(self: &Arc<Self>) {
        let this = Arc::clone(self);
        let span = tracing::Span::current();
        std::thread::spawn(move || loop {
            let _in_span = span.enter();
            match recv_message(this.socket.as_fd()) {
                Ok((Message::Handover { dir }, _)) => {
                    let answer = match this.hand_over(&dir) {
                        Ok((state, journaled, stopped_reading_ns)) => Message::HandedOver {
                            state,
                            journaled,
                            stopped_reading_ns,
                        },
                        Err(err) => {
                            tracing::warn!(%err, "handover refused; serving on");
                            Message::HandoverFailed {
                                reason: err.to_string(),
                            }
                        }
                    };
                    this.send(&answer);
                }
                Ok((Message::Resume { unanswered }, _)) => {
                    if let Err(err) = this.resume(unanswered) {
                        tracing::error!(%err, "cannot resume after a failed upgrade; exiting so a new generation recovers");
                        std::process::exit(1);
                    }
                }
                Ok((Message::Exit, _)) => {
                    tracing::info!("successor serves; exiting");
                    // No flush, no unmount: the successor owns everything.
                    std::process::exit(0);
                }
                Ok((other, _)) => {
                    tracing::warn!(
                        kind = other.kind(),
                        "unexpected message from the supervisor"
                    );
                }
                Err(_) => {
                    tracing::warn!("supervisor socket closed; serving on without it");
                    return;
                }
            }
        });
    }

    /// Reports counters, prunes old exactly-once records and trims an idle
    /// heap ([`IdleTrim`]), periodically.
    fn spawn_stats(self: &Arc<Self>) {
        let this = Arc::clone(self);
        let span = tracing::Span::current();
        std::thread::spawn(move || {
            let _in_span = span.enter();
            let mut reported = (0, GenerationCounters::default());
            let mut since_prune = Duration::ZERO;
            let mut trim = IdleTrim::default();
            loop {
                std::thread::sleep(STATS_INTERVAL);
                let now = (this.fs.requests_recovered(), this.fs.counters());
                trim.after_interval(now != reported);
                if now != reported {
                    this.send(&Message::Stats {
                        generation: this.adoption.generation,
                        requests_recovered: now.0,
                        counters: Some(Box::new(now.1.clone())),
                    });
                    reported = now;
                }
                since_prune += STATS_INTERVAL;
                if since_prune >= PRUNE_INTERVAL {
                    since_prune = Duration::ZERO;
                    match this.fs.prune_request_records() {
                        Ok(n) => tracing::debug!(pruned = n, "old exactly-once records pruned"),
                        Err(err) => tracing::warn!(%err, "pruning exactly-once records failed"),
                    }
                }
            }
        });
    }

    /// The old generation's side of a planned upgrade (module docs).
    fn hand_over(&self, dir: &Path) -> Result<(PathBuf, u32, u64)> {
        let Some(stopper) = self.stopper() else {
            return Err(Error::HandoverRefused("not serving".into()));
        };
        let all_done = stopper.stop_within(QUIESCE_BOUND);
        let stopped_reading_ns = monotonic_ns();
        // Copy the running requests BEFORE sealing: no worker reads any
        // more, so every request whose reply the seal can drop is in this
        // copy. (Sealing first lost a request that finished, had its reply
        // dropped and was withdrawn between the seal and the copy.) One
        // that replies between the copy and the seal is answered twice; the
        // kernel drops the second answer, and a mutation's second run is
        // answered from its exactly-once record.
        let inflight = if all_done {
            Vec::new()
        } else {
            stopper.inflight()
        };
        self.channel.seal();
        self.fs.fence();
        let (held, parked) = self.fs.export_locks();
        // Requests being handled first, then parked lock requests and
        // LSEEKs: all go to the successor; only the first kind still runs
        // here.
        let mut journal = inflight.clone();
        journal.extend(parked);
        journal.extend(self.fs.parked_seeks());
        let written = self.write_state(dir, &journal, held, stopped_reading_ns);
        match written {
            Ok(state) => {
                fault::hit(Point::DuringHandover, 0);
                tracing::info!(running = inflight.len(), journaled = journal.len(), state = %state.display(), "handed over; fenced until exit or resume");
                *lock(&self.journaled) = inflight;
                Ok((state, journal.len() as u32, stopped_reading_ns))
            }
            Err(err) => {
                // Serve on: nothing was handed over.
                *lock(&self.journaled) = inflight;
                self.resume(Unanswered::Leave)?;
                Err(err)
            }
        }
    }

    fn write_state(
        &self,
        dir: &Path,
        inflight: &[Vec<u8>],
        locks: Vec<upgrade_protocol::LockState>,
        stopped_reading_ns: u64,
    ) -> Result<PathBuf> {
        let io = |what: &'static str| {
            move |source: std::io::Error| Error::HandoverIo {
                what,
                path: dir.to_path_buf(),
                source,
            }
        };
        let journal = if inflight.is_empty() {
            None
        } else {
            let bytes = InflightJournal {
                requests: inflight.to_vec(),
            }
            .encode()?;
            let mut file = tempfile::Builder::new()
                .prefix("journal-")
                .tempfile_in(dir)
                .map_err(io("creating the in-flight journal"))?;
            // No fsync: the files only matter while this boot's mount lives.
            file.write_all(&bytes)
                .map_err(io("writing the in-flight journal"))?;
            let (_, path) = file
                .keep()
                .map_err(|e| io("keeping the in-flight journal")(e.error))?;
            Some(path)
        };
        let (handles, next_fh, open_orphans) = self.fs.export_handles();
        let state = HandoverState {
            generation: self.adoption.generation,
            connection_identity: self.adoption.connection_identity,
            init: self.adoption.init,
            handles: handles
                .into_iter()
                .map(|(fh, h)| HandleState {
                    fh,
                    ino: h.ino,
                    flags: h.flags,
                    dir: h.dir,
                })
                .collect(),
            next_fh,
            open_orphans,
            locks,
            journal,
            journaled: inflight.len() as u32,
            stopped_reading_ns,
        };
        let mut file = tempfile::Builder::new()
            .prefix("handover-")
            .tempfile_in(dir)
            .map_err(io("creating the handover state"))?;
        file.write_all(&encode_state(&state)?)
            .map_err(io("writing the handover state"))?;
        let (_, path) = file
            .keep()
            .map_err(|e| io("keeping the handover state")(e.error))?;
        Ok(path)
    }

    /// Serves again after a handover that was rolled back.
    ///
    /// If requests were journaled, their workers may still be running here
    /// and would act once unfenced, racing the replay: instead this process
    /// exits, and the supervisor's crash path starts a clean generation
    /// that recovers everything with RESEND (applications see a stall).
    fn resume(&self, unanswered: Unanswered) -> Result<()> {
        let journal = InflightJournal {
            requests: std::mem::take(&mut *lock(&self.journaled)),
        };
        if !journal.requests.is_empty() {
            tracing::warn!(
                journaled = journal.requests.len(),
                "rolled back with requests still running here; exiting so a clean generation recovers them"
            );
            std::process::exit(EXIT_RESTART_CLEAN);
        }
        self.fs.unfence();
        // Whatever the successor staged before it failed is ours again.
        self.fs.own_staging()?;
        self.channel.unseal();
        tracing::info!(?unanswered, "resuming after a rolled-back upgrade");
        self.start(&journal, unanswered)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn handles_from(state: &HandoverState) -> Vec<(u64, Handle)> {
    state
        .handles
        .iter()
        .map(|h| {
            (
                h.fh,
                Handle {
                    ino: h.ino,
                    flags: h.flags,
                    dir: h.dir,
                },
            )
        })
        .collect()
}

/// Reads and checks a handover state and its journal.
fn load_handover(path: &Path) -> Result<(HandoverState, InflightJournal)> {
    let io = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::HandoverIo {
            what,
            path: p,
            source,
        }
    };
    let bytes = std::fs::read(path).map_err(io("reading the handover state", path))?;
    let state = decode_state(&bytes)?;
    let journal = match &state.journal {
        Some(journal) => {
            let bytes =
                std::fs::read(journal).map_err(io("reading the in-flight journal", journal))?;
            InflightJournal::decode(&bytes)?
        }
        None => InflightJournal::default(),
    };
    if journal.requests.len() != state.journaled as usize {
        return Err(Error::from(ProtocolError::Corrupt {
            what: "in-flight journal",
            reason: "holds a different number of requests than the state says",
        }));
    }
    Ok((state, journal))
}

/// Watches the workers: if the connection ends by itself (unmount: ENODEV;
/// abort), wakes the main thread with SIGTERM. Returns quietly when they
/// were stopped (shutdown or handover).
fn spawn_waiter(stopper: Stopper) {
    const CHECK_INTERVAL: Duration = Duration::from_millis(100);
    let span = tracing::Span::current();
    std::thread::spawn(move || loop {
        let _in_span = span.enter();
        if let Some(errno) = stopper.ended() {
            tracing::info!(%errno, "FUSE connection ended");
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
            return;
        }
        if stopper.all_exited() {
            return;
        }
        std::thread::sleep(CHECK_INTERVAL);
    });
}

#[cfg(test)]
mod tests {
    use fuse_wire::abi::init_flags as f;

    use super::check_init_flags;
    use crate::error::Error;

    #[test]
    fn a_connection_with_a_flag_this_build_does_not_ask_for_is_refused() {
        let ours = fuse_wire::InitConfig::baton().flags;
        assert!(check_init_flags(ours).is_ok());
        // What a supervisor without ACL support negotiated: a subset.
        assert!(check_init_flags(ours & !(f::POSIX_ACL | f::DONT_MASK)).is_ok());
        // PASSTHROUGH asks the server to open backing files; no Baton
        // build asks for it yet.
        assert_eq!(ours & f::PASSTHROUGH, 0);
        match check_init_flags(ours | f::PASSTHROUGH) {
            Err(Error::UnknownInitFlags { unknown }) => assert_eq!(unknown, f::PASSTHROUGH),
            other => panic!("expected UnknownInitFlags, got {other:?}"),
        }
    }
}
