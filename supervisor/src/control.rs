//! The control socket between fsctl and the supervisor.
//!
//! Server side ([`bind`], [`serve`]): a SEQPACKET socket, mode 0600; one
//! thread accepts, a short-lived thread per connection checks the peer with
//! SO_PEERCRED (root or the supervisor's own uid only; anyone else gets a
//! clear refusal), parses one [`Request`] and hands it to a [`Handler`],
//! which forwards it to the supervisor's event loop and waits for the
//! answer. These threads never touch lifecycle state.
//!
//! Client side ([`request`]): connect, send one request, wait (with a
//! deadline) for the reply.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use nix::sys::time::TimeVal;
use upgrade_protocol::{
    accept_seqpacket, connect_seqpacket, listen_seqpacket, recv_message, send_message, ErrorKind,
    Message, ProtocolError, Reply, Request,
};

use crate::Error;

pub use upgrade_protocol::client::DEFAULT_SOCKET;
/// fsctl connections handled at once at most; more are refused.
pub const CONTROL_CONNECTIONS_MAX: usize = 16;
/// How long a connected client may take to send its request.
pub const REQUEST_RECEIVE_TIMEOUT_MS: u64 = 10_000;
/// How long the accept thread waits for the request of a client it refuses
/// because [`CONTROL_CONNECTIONS_MAX`] are busy.
const REFUSAL_RECEIVE_TIMEOUT_MS: u64 = 100;

/// Answers one request (blocking until the event loop has answered).
pub type Handler = Arc<dyn Fn(Request) -> Reply + Send + Sync>;

/// Whether a peer with `peer_uid` may control a supervisor running as
/// `own_uid`. Pure.
pub fn allowed_peer(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_uid
}

/// Whether a process accepts connections on the socket at `path` (a
/// socket file nobody listens on any more is stale).
pub fn answers(path: &Path) -> bool {
    path.exists() && connect_seqpacket(path).is_ok()
}

/// Binds the control socket at `path` (mode 0600), refusing if another
/// supervisor answers there and replacing a stale socket file.
pub fn bind(path: &Path) -> Result<OwnedFd, Error> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io("creating", parent))?;
    }
    if answers(path) {
        return Err(Error::AlreadyRunning {
            path: path.to_path_buf(),
        });
    }
    if path.exists() {
        std::fs::remove_file(path).map_err(Error::io("removing stale socket", path))?;
    }
    listen_seqpacket(path, 0o600).map_err(|source| Error::Protocol {
        path: path.to_path_buf(),
        source,
    })
}

/// Listens at `path` even while the supervisor that had it still answers
/// there: the name is renamed over (after a handover to this supervisor,
/// `succession.rs`; the stopping one's listener goes with it).
pub fn bind_replacing(path: &Path) -> Result<OwnedFd, Error> {
    listen_seqpacket(path, 0o600).map_err(|source| Error::Protocol {
        path: path.to_path_buf(),
        source,
    })
}

/// Accepts connections on `listener` in a thread of its own.
pub fn serve(listener: OwnedFd, path: PathBuf, handler: Handler) -> std::thread::JoinHandle<()> {
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || loop {
        let conn = match accept_seqpacket(listener.as_fd()) {
            Ok(conn) => conn,
            Err(ProtocolError::Socket {
                errno: Errno::EBADF | Errno::EINVAL,
                ..
            }) => return,
            Err(err) => {
                tracing::warn!(socket = %path.display(), %err, "accepting an fsctl connection failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= CONTROL_CONNECTIONS_MAX {
            active.fetch_sub(1, Ordering::SeqCst);
            // Read the request first (briefly): closing with unread data
            // would reset the connection before the refusal is read.
            let brief = TimeVal::new(0, (REFUSAL_RECEIVE_TIMEOUT_MS * 1000) as _);
            let _ = setsockopt(&conn, sockopt::ReceiveTimeout, &brief);
            let _ = recv_message(conn.as_fd());
            reply(
                &conn,
                Reply::Error {
                    kind: ErrorKind::Failed,
                    message: format!(
                        "fs-supervisor is handling {CONTROL_CONNECTIONS_MAX} commands already; retry in a moment"
                    ),
                },
            );
            continue;
        }
        let (handler, active) = (Arc::clone(&handler), Arc::clone(&active));
        std::thread::spawn(move || {
            handle_connection(&conn, &handler);
            active.fetch_sub(1, Ordering::SeqCst);
        });
    })
}

fn reply(conn: &OwnedFd, reply: Reply) {
    if let Err(err) = send_message(conn.as_fd(), &Message::ControlReply { reply }, &[]) {
        tracing::debug!(%err, "fsctl went away before its reply");
    }
}

fn handle_connection(conn: &OwnedFd, handler: &Handler) {
    let own_uid = nix::unistd::geteuid().as_raw();
    let peer = match getsockopt(conn, sockopt::PeerCredentials) {
        Ok(peer) => peer,
        Err(errno) => {
            tracing::warn!(%errno, "cannot read the peer credentials of an fsctl connection");
            return;
        }
    };
    let timeout = TimeVal::new((REQUEST_RECEIVE_TIMEOUT_MS / 1000) as _, 0);
    if let Err(errno) = setsockopt(conn, sockopt::ReceiveTimeout, &timeout) {
        tracing::warn!(%errno, "cannot set the fsctl receive timeout");
    }
    // Read the request even from a peer about to be refused: closing a unix
    // socket with unread data resets it, and the peer would never see why.
    let received = recv_message(conn.as_fd());
    if !allowed_peer(peer.uid(), own_uid) {
        tracing::warn!(
            peer_uid = peer.uid(),
            peer_pid = peer.pid(),
            "refused a control connection"
        );
        reply(
            conn,
            Reply::Error {
                kind: ErrorKind::PermissionDenied,
                message: format!(
                    "fs-supervisor accepts commands only from root (uid 0) or its own uid {own_uid}; you are uid {}: run fsctl as root (e.g. with sudo)",
                    peer.uid()
                ),
            },
        );
        return;
    }
    let answer = match received {
        Ok((Message::Control { request }, _)) => handler(request),
        Ok((other, _)) => Reply::Error {
            kind: ErrorKind::Invalid,
            message: format!(
                "expected a control request, got `{}`; is the peer fsctl?",
                other.kind()
            ),
        },
        Err(err) => {
            tracing::debug!(%err, "fsctl connection without a request");
            return;
        }
    };
    reply(conn, answer);
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
