//! The client side of fs-supervisor's control socket: what `fsctl` (and
//! any other client of the daemon) calls. One request per connection, one
//! reply, bounded by a deadline per command.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use crate::{
    connect_seqpacket, recv_message, send_message, Message, ProtocolError, Reply, Request,
};

/// Where fs-supervisor listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/baton/supervisor.sock";
/// fs-supervisor's state directory unless told otherwise (mount records,
/// generation logs, its own log when `fsctl up` starts it).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/baton/supervisor";
/// How long `fs-supervisor` gives a new binary's `--version` before it
/// re-executes into it (`fsctl upgrade-supervisor`).
pub const UPGRADE_SUPERVISOR_PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client waits for the answer to `request`: each command's
/// own work plus time for the supervisor to say why it failed.
pub fn command_timeout(request: &Request) -> Duration {
    match request {
        Request::Status => Duration::from_secs(10),
        Request::Mount { .. } | Request::Umount { .. } => Duration::from_secs(90),
        // The supervisor rolls back at the deadline; leave it time to say so.
        Request::Upgrade { timeout_ms, .. } => {
            Duration::from_millis(*timeout_ms) + Duration::from_secs(30)
        }
        Request::UpgradeSupervisor { .. } => {
            UPGRADE_SUPERVISOR_PREFLIGHT_TIMEOUT + Duration::from_secs(10)
        }
    }
}

/// Sends `request` to the supervisor at `socket` and waits up to `timeout`
/// for its reply.
pub fn request(
    socket: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, ProtocolError> {
    let at_socket = |source| ProtocolError::AtSocket {
        path: socket.to_path_buf(),
        source: Box::new(source),
    };
    let conn = connect_seqpacket(socket).map_err(|err| match err {
        ProtocolError::Socket {
            errno: errno @ (Errno::EACCES | Errno::EPERM),
            ..
        } => ProtocolError::NotAllowed {
            path: socket.to_path_buf(),
            errno,
        },
        ProtocolError::Socket { errno, .. } => ProtocolError::Unreachable {
            path: socket.to_path_buf(),
            errno,
        },
        source => at_socket(source),
    })?;
    let deadline = TimeVal::new(timeout.as_secs().max(1) as _, 0);
    setsockopt(&conn, sockopt::ReceiveTimeout, &deadline).map_err(|errno| {
        at_socket(ProtocolError::Socket {
            op: "setsockopt(SO_RCVTIMEO)",
            errno,
        })
    })?;
    let message = Message::Control {
        request: request.clone(),
    };
    send_message(conn.as_fd(), &message, &[]).map_err(at_socket)?;
    match recv_message(conn.as_fd()) {
        Ok((Message::ControlReply { reply }, _)) => Ok(reply),
        Ok((other, _)) => Err(ProtocolError::UnexpectedReply {
            path: socket.to_path_buf(),
            kind: other.kind(),
        }),
        Err(ProtocolError::Socket {
            errno: Errno::EAGAIN,
            ..
        }) => Err(ProtocolError::NoAnswer {
            path: socket.to_path_buf(),
            command: request.name(),
            timeout_s: timeout.as_secs(),
        }),
        Err(err) => Err(at_socket(err)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_is_unreachable_and_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let err = request(&path, &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ProtocolError::Unreachable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("start it with `fs-supervisor`"), "{text}");
    }

    #[test]
    fn a_silent_supervisor_is_no_answer_after_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        let _listener = crate::listen_seqpacket(&path, 0o600).unwrap();
        let err = request(&path, &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::NoAnswer {
                    command: "status",
                    timeout_s: 1,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
