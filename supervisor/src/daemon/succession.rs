//! Handing every mount from a stopping fs-supervisor to a successor that
//! waits beside it: the Kubernetes DaemonSet rollout (`maxSurge: 1`), where
//! the new pod's supervisor starts while the old pod still serves, and the
//! old pod then gets SIGTERM. The two share the state directory (a hostPath)
//! but not a PID namespace, so the new one can neither see the old
//! generations nor copy fds out of them; the fds cross over a socket.
//!
//! ```text
//! successor (fs-supervisor --successor)   stopping supervisor (SIGTERM)
//! -------------------------------------   ---------------------------------
//! finds the control socket answered,
//! listens on run/successor.sock, waits
//!                                          connects; per mount: writes its
//!                                 <------  record, PassMount{record} + fd
//!                                 <------  PassDone
//! holds every fd, takes the control
//! socket (rename over it), starts a
//! generation per mount (fork, exec,
//! volume open: while the old one serves)
//!                      PassReceived -->
//!                                          kills and reaps every generation
//!                                          (standbys and retiring ones too)
//!                                 <------  Released
//! runs its loop: each new generation gets  exits: no unmount, the control
//! Adopt with RESEND (exactly once)         socket left to the successor
//! ```
//!
//! The switch itself (the application's stall) is only the kill, one
//! message and the RESEND: the successor's generations were started while
//! the old ones still served. They are numbered after every generation the
//! stopping supervisor started, and the successor neither signals the
//! recorded pid nor empties the recorded cgroups (both belong to the
//! stopping supervisor, and may be in another PID namespace).
//!
//! RESEND is safe only once no old generation is alive, which only the
//! stopping supervisor can know (they are its children): hence `Released`.
//! Until `PassReceived` nothing is lost if either side fails: the stopping
//! supervisor falls back to its normal shutdown. After it, a stopping
//! supervisor that fails still exits without unmounting (the successor holds
//! the fds); a successor that sees the socket close before `Released` waits
//! [`RELEASE_GRACE`] (the old pod's processes die with it) and then restores
//! anyway, since holding the fds without serving would hang every caller.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;
use upgrade_protocol::{
    accept_seqpacket, connect_seqpacket, listen_seqpacket, recv_message, send_message, Message,
    ProtocolError,
};

use super::Daemon;
use crate::control::answers;
use crate::state_file::StateDir;

/// How long each step of a handover to a successor may take.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a successor waits after its predecessor vanished before
/// `Released` (its generations die with its pod) before restoring anyway.
pub const RELEASE_GRACE: Duration = Duration::from_secs(2);
/// How long an old generation may take to exit after SIGKILL.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Where a successor waits: `run/successor.sock` of the state directory.
pub fn successor_socket(state: &StateDir) -> PathBuf {
    state.run_dir().join("successor.sock")
}

/// The control socket of the supervisor a successor takes over from: its
/// own socket path if that answers, else the one the holder of the state
/// directory recorded, if that answers (a DaemonSet rollout that changes
/// `--socket`: the old pod on the old path, the new one on the new path,
/// both on one state directory). `None`: no predecessor, start normally.
pub fn find_predecessor(state: &StateDir, own: &Path) -> Option<PathBuf> {
    if answers(own) {
        return Some(own.to_path_buf());
    }
    let recorded = crate::state_lock::holder_socket(state)?;
    if !answers(&recorded) {
        return None;
    }
    tracing::info!(predecessor = %recorded.display(), socket = %own.display(), "the fs-supervisor serving this state directory listens on another control socket; taking over from it");
    Some(recorded)
}

/// What a successor got from its predecessor.
pub enum Succession {
    /// Mounts to restore (their records are in the state directory).
    Mounts(Predecessor),
    /// A shutdown signal came while waiting: exit.
    Stopped,
}

/// A stopping supervisor that passed its mounts and waits for
/// [`Predecessor::confirm`] before it kills its generations.
pub struct Predecessor {
    conn: OwnedFd,
    /// The successor socket it came through (for errors).
    path: PathBuf,
    /// The passed fds, by mount id.
    pub fds: BTreeMap<String, OwnedFd>,
}

/// Why a successor could not take over.
#[derive(Debug, thiserror::Error)]
pub enum SuccessionError {
    /// Another successor already waits.
    #[error("another fs-supervisor already waits at {path} to take over; stop it first")]
    AlreadyWaiting {
        /// The successor socket.
        path: PathBuf,
    },
    /// The socket failed.
    #[error("the successor socket {path}: {source}; check the state directory's permissions")]
    Socket {
        /// The successor socket.
        path: PathBuf,
        /// The failure.
        source: ProtocolError,
    },
    /// The predecessor said something out of order.
    #[error("the stopping fs-supervisor sent {kind} out of order; its mounts stay with it")]
    Unexpected {
        /// The message kind.
        kind: &'static str,
    },
}

/// Waits at the successor socket for the supervisor serving this state
/// directory to be stopped and hand its mounts over; a shutdown signal on
/// `signals` ends the wait. Blocks.
pub fn wait_for_predecessor(
    state: &StateDir,
    signals: &SignalFd,
) -> Result<Succession, SuccessionError> {
    let path = successor_socket(state);
    if answers(&path) {
        return Err(SuccessionError::AlreadyWaiting { path });
    }
    let _ = std::fs::remove_file(&path);
    let listener = listen_seqpacket(&path, 0o600).map_err(|e| socket_error(&path, e))?;
    tracing::info!(socket = %path.display(), "another fs-supervisor serves this state directory; waiting for it to stop and hand its mounts over");
    let conn = loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => {
                let _ = std::fs::remove_file(&path);
                return Err(socket_error(
                    &path,
                    ProtocolError::Socket { op: "poll", errno },
                ));
            }
        }
        if fds[1].any().unwrap_or(false) {
            let _ = std::fs::remove_file(&path);
            tracing::info!("stopped while waiting to take over");
            return Ok(Succession::Stopped);
        }
        if fds[0].any().unwrap_or(false) {
            match accept_seqpacket(listener.as_fd()) {
                Ok(conn) => break conn,
                Err(err) => tracing::warn!(%err, "accepting the stopping fs-supervisor failed"),
            }
        }
    };
    // One predecessor: nobody else may connect from now on.
    drop(listener);
    let _ = std::fs::remove_file(&path);
    let fds = receive_mounts(&conn, &path)?;
    Ok(Succession::Mounts(Predecessor { conn, path, fds }))
}

/// Receives every passed mount (record + fd) up to `PassDone`.
fn receive_mounts(
    conn: &OwnedFd,
    path: &Path,
) -> Result<BTreeMap<String, OwnedFd>, SuccessionError> {
    let mut mounts = BTreeMap::new();
    let timeout = TimeVal::new(STEP_TIMEOUT.as_secs() as _, 0);
    let _ = setsockopt(conn, sockopt::ReceiveTimeout, &timeout);
    loop {
        match recv_message(conn.as_fd()).map_err(|e| socket_error(path, e))? {
            (Message::PassMount { record }, mut fds) if fds.len() == 1 => {
                tracing::info!(mount = %record.mount_id, mountpoint = %record.mountpoint.display(), "received a mount from the stopping fs-supervisor");
                mounts.insert(record.mount_id, fds.remove(0));
            }
            (Message::PassDone, _) => return Ok(mounts),
            (other, _) => return Err(SuccessionError::Unexpected { kind: other.kind() }),
        }
    }
}

fn socket_error(path: &Path, source: ProtocolError) -> SuccessionError {
    SuccessionError::Socket {
        path: path.to_path_buf(),
        source,
    }
}

impl Predecessor {
    /// Says which mounts this successor holds (their new generations are
    /// already starting, so the stall is only the switch) and waits until
    /// the predecessor's generations are gone. Only then may the new ones
    /// RESEND.
    pub fn confirm(self, held: Vec<String>) -> Result<(), SuccessionError> {
        let received = Message::PassReceived { mounts: held };
        send_message(self.conn.as_fd(), &received, &[]).map_err(|e| socket_error(&self.path, e))?;
        // Longer than the predecessor's own wait for its generations.
        let release = TimeVal::new((STEP_TIMEOUT + EXIT_WAIT).as_secs() as _, 0);
        let _ = setsockopt(&self.conn, sockopt::ReceiveTimeout, &release);
        match recv_message(self.conn.as_fd()) {
            Ok((Message::Released, _)) => {
                tracing::info!("the stopping fs-supervisor released its generations");
            }
            Ok((other, _)) => return Err(SuccessionError::Unexpected { kind: other.kind() }),
            Err(err) => {
                tracing::error!(%err, grace_ms = RELEASE_GRACE.as_millis() as u64, "the stopping fs-supervisor went away before releasing its generations; serving after a grace period");
                std::thread::sleep(RELEASE_GRACE);
            }
        }
        Ok(())
    }
}

impl Daemon {
    /// On a shutdown signal: hands every mount to a successor waiting at
    /// the successor socket (module docs). `false` when none waits or it
    /// failed before taking the fds: then shut down as usual.
    pub(super) fn hand_to_successor(&mut self) -> bool {
        let path = successor_socket(&self.env.state);
        let Ok(conn) = connect_seqpacket(&path) else {
            return false;
        };
        tracing::info!(socket = %path.display(), mounts = self.mounts.len(), "a successor waits: handing every mount over");
        let timeout = TimeVal::new(STEP_TIMEOUT.as_secs() as _, 0);
        let _ = setsockopt(&conn, sockopt::ReceiveTimeout, &timeout);
        let passed = match self.pass_mounts(&conn) {
            Ok(passed) => passed,
            Err(err) => {
                tracing::error!(%err, "the successor did not take the mounts; shutting down as without one");
                return false;
            }
        };
        // From here the successor holds the fds: never unmount. Its new
        // generations wait for `Released` before they RESEND.
        for mount in &mut self.mounts {
            stop_processes(mount);
        }
        if let Err(err) = send_message(conn.as_fd(), &Message::Released, &[]) {
            tracing::error!(%err, "cannot tell the successor the generations are gone; it restores after its grace period");
        }
        tracing::info!(
            mounts = passed.len(),
            "every mount handed to the successor; exiting"
        );
        // Their fds close here; the successor's copies keep the mounts.
        self.mounts.clear();
        true
    }

    /// Sends every mount (record + fd) and waits for the successor to say
    /// it holds them all.
    fn pass_mounts(&self, conn: &OwnedFd) -> Result<BTreeSet<String>, String> {
        let mut passed = BTreeSet::new();
        for mount in &self.mounts {
            let Some(channel) = &mount.channel else {
                continue;
            };
            // Generations of the successor are numbered after every one
            // this side started (a standby included): handle numbers carry
            // their generation, and cgroups are named by it.
            let mut record = mount.record();
            record.generation = mount.highest_generation();
            if let Err(err) = self.env.state.write_record(&record) {
                tracing::warn!(mount = %mount.id, %err, "cannot write the mount's state record");
            }
            send_message(
                conn.as_fd(),
                &Message::PassMount { record },
                &[channel.fd()],
            )
            .map_err(|err| format!("passing mount {}: {err}", mount.id))?;
            passed.insert(mount.id.clone());
        }
        send_message(conn.as_fd(), &Message::PassDone, &[]).map_err(|err| err.to_string())?;
        match recv_message(conn.as_fd()) {
            Ok((Message::PassReceived { mounts }, _)) => {
                let held: BTreeSet<String> = mounts.into_iter().collect();
                if held != passed {
                    // It holds some: it will serve those, and the rest
                    // would run twice if this side kept serving them.
                    tracing::error!(
                        ?passed,
                        ?held,
                        "the successor holds other mounts than passed; handing over anyway"
                    );
                }
                Ok(passed)
            }
            Ok((other, _)) => Err(format!("the successor answered {}", other.kind())),
            Err(err) => Err(format!("no answer from the successor: {err}")),
        }
    }
}

/// Kills every process of `mount` and reaps it (waiting on its pidfd).
fn stop_processes(mount: &mut crate::executor::Mount) {
    let pids: Vec<u32> = mount.processes().map(|p| p.pid).collect();
    for pid in pids {
        let Some((_, process)) = mount.take_process(pid) else {
            continue;
        };
        process.signal(Signal::SIGKILL);
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            match process.exit_cause() {
                Ok(Some(_)) => {
                    process.reap();
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    let mut fds = [PollFd::new(process.pidfd(), PollFlags::POLLIN)];
                    let _ = poll(&mut fds, PollTimeout::from(100u8));
                }
                Ok(None) => {
                    tracing::error!(mount = %mount.id, pid, "a generation did not exit after SIGKILL; the successor may run its requests twice");
                    break;
                }
                Err(err) => {
                    tracing::error!(mount = %mount.id, pid, %err, "cannot reap a generation");
                    break;
                }
            }
        }
    }
}
