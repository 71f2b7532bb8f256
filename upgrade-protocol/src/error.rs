//! The one error type of upgrade-protocol.

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
