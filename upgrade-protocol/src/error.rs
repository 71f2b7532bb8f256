//! The one error type of upgrade-protocol.

use std::path::PathBuf;

use nix::errno::Errno;

/// Errors of framing, decoding and passing messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The frame does not start with Baton's magic.
    #[error("control message does not start with the Baton magic; is the peer a Baton process?")]
    BadMagic,
    /// The frame is shorter than its header says.
    #[error("control message truncated: {len} bytes, header says {declared}")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes the header declares.
        declared: usize,
    },
    /// The peer speaks a newer format.
    #[error("control message format {found} is newer than this binary's {supported}; upgrade this side first or roll the peer back")]
    UnsupportedVersion {
        /// Version found.
        found: u16,
        /// Highest version this binary reads.
        supported: u16,
    },
    /// The body is not a valid message.
    #[error("control message body is invalid: {0}")]
    Body(#[from] serde_json::Error),
    /// The message is larger than the limit.
    #[error("control message of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A socket call failed.
    #[error("control socket {op} failed: {errno}")]
    Socket {
        /// sendmsg or recvmsg.
        op: &'static str,
        /// The errno.
        errno: Errno,
    },
    /// A state or journal file is damaged.
    #[error(
        "{what} is corrupt: {reason}; the upgrade rolls back and the old generation keeps serving"
    )]
    Corrupt {
        /// Which file.
        what: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The peer closed the socket.
    #[error("control socket closed by the peer")]
    Closed,
    /// fs-supervisor's control socket cannot be reached.
    #[error("cannot reach fs-supervisor at {path}: {errno}; start it with `fs-supervisor` (or `fsctl up`) or pass --socket")]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// Why.
        errno: Errno,
    },
    /// The control socket is there but this user may not connect to it
    /// (it is 0600, root's).
    #[error("fs-supervisor's control socket {path} is root's ({errno}): run fsctl as root")]
    NotAllowed {
        /// The socket.
        path: PathBuf,
        /// Why (EACCES or EPERM).
        errno: Errno,
    },
    /// fs-supervisor did not answer in time.
    #[error(
        "fs-supervisor at {path} did not answer `{command}` within {timeout_s} s; check its log"
    )]
    NoAnswer {
        /// The socket.
        path: PathBuf,
        /// The command.
        command: &'static str,
        /// The deadline.
        timeout_s: u64,
    },
    /// The peer answered with something other than a reply.
    #[error("fs-supervisor at {path} answered with `{kind}` instead of a reply; is it a Baton supervisor of the same version?")]
    UnexpectedReply {
        /// The socket.
        path: PathBuf,
        /// The message kind received.
        kind: &'static str,
    },
    /// Talking to fs-supervisor failed.
    #[error("talking to fs-supervisor at {path}: {source}")]
    AtSocket {
        /// The socket.
        path: PathBuf,
        /// The cause.
        source: Box<ProtocolError>,
    },
    /// The message carried a different number of fds than it needs.
    #[error("control message {kind} carried {found} fds, expected {expected}")]
    FdCount {
        /// Message kind.
        kind: &'static str,
        /// Fds received.
        found: usize,
        /// Fds expected.
        expected: usize,
    },
}

/// An error and its causes on one line, `error: cause: cause`, for the
/// last word of a program. A cause is added only if the line does not
/// already hold its text: many messages embed their cause, and anyhow's
/// `{:#}` would print it again (`body is invalid: X: X: X`).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        use std::os::unix::ffi::OsStringExt;
        let latin1 = std::ffi::OsString::from_vec(b"/x/caf\xe9".to_vec());
        let json = serde_json::to_vec(&std::path::PathBuf::from(latin1)).unwrap_err();
        let err = ProtocolError::AtSocket {
            path: "/run/baton/supervisor.sock".into(),
            source: Box::new(ProtocolError::Body(json)),
        };
        assert_eq!(
            error_chain(&err),
            "talking to fs-supervisor at /run/baton/supervisor.sock: control message body is invalid: path contains invalid UTF-8 characters"
        );
        let wrapped = anyhow::Error::new(err).context("mounting");
        let line = error_chain(wrapped.as_ref());
        assert_eq!(line.matches("invalid UTF-8").count(), 1, "{line}");
        assert!(line.starts_with("mounting: talking to"), "{line}");
    }
}
