//! The one contract Baton's supervisor and filesystem generations speak:
//! control messages, /dev/fuse fd passing, and the negotiated INIT record.
//!
//! # Brief overview
//! - [`Message`]: what crosses the control socket, framed by [`encode`] /
//!   [`decode`] with a magic and a format version.
//! - [`NegotiatedInit`]: the FUSE_INIT result, recorded once per connection
//!   and given to every generation.
//! - [`Request`] / [`Reply`]: the fsctl ↔ supervisor commands, carried as
//!   [`Message::Control`] / [`Message::ControlReply`]; [`StatusReport`] is
//!   what `fsctl status --json` prints; [`MountRecord`] is the supervisor's
//!   per-mount state file.
//! - [`GenerationCounters`]: request counters a generation reports in
//!   [`Message::Stats`]; [`MountCounters`] / [`Incident`]: what the
//!   supervisor keeps per mount for `/metrics` and its status page.
//! - [`HandoverState`] / [`InflightJournal`]: what a planned upgrade hands
//!   from one generation to the next (versioned files, see `handover.rs`).
//! - [`VolumeSpec`]: the volume string every program takes (a name, a
//!   `sqlite://` or a `postgres://` URL), parsed once, purely, for all.
//! - [`client::request`]: the client side of fs-supervisor's control
//!   socket (fsctl, and any other client of the daemon).
//! - [`parse_size`]: the size syntax of every command line.
//! - [`send_message`] / [`recv_message`]: one message per SOCK_SEQPACKET
//!   packet, with fds as SCM_RIGHTS; received fds are close-on-exec
//!   (MSG_CMSG_CLOEXEC), so they never leak into child processes.
//!
//! # Invariants
//! - This crate does no IO beyond the socket calls it is asked to make, and
//!   uses no other Baton crate but fuse-wire, whose INIT result it records
//!   ([`NegotiatedInit`] converts from and to [`fuse_wire::InitParams`]).
//! - Formats are versioned from their first commit: a reader refuses a
//!   newer major version with [`ProtocolError::UnsupportedVersion`].
//!
//! # Example
//! ```no_run
//! # fn demo(sock: std::os::fd::BorrowedFd<'_>, fuse: std::os::fd::BorrowedFd<'_>, init: upgrade_protocol::NegotiatedInit) -> Result<(), upgrade_protocol::ProtocolError> {
//! use upgrade_protocol::{send_message, Message, Unanswered};
//! let adopt = Message::Adopt {
//!     generation: 2,
//!     connection_identity: 7,
//!     init,
//!     unanswered: Unanswered::Resend,
//!     handover: None,
//! };
//! send_message(sock, &adopt, &[fuse])?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod client;
mod control;
mod counters;
mod error;
mod fdpass;
mod handover;
mod logs;
mod message;
mod size;
mod socket;
mod volume_spec;

pub use control::{
    decode_record, encode_record, ClientOptions, ErrorKind, GenerationReport, MountHistory,
    MountRecord, MountStatus, Recovery, Reply, Request, Restarts, StatusReport, SupervisorInfo,
    UpgradeReport, RECORD_FORMAT_VERSION,
};
pub use counters::{
    GenerationCounters, Incident, MountCounters, OpcodeCounters, OperationCounters,
    StorageCounters, LATENCY_BOUNDS_US,
};
pub use error::{error_chain, ProtocolError};
pub use fdpass::{recv_message, send_message, FDS_PER_MESSAGE_MAX};
pub use handover::{
    connection_identity, decode_state, encode_state, monotonic_ns, HandleState, HandoverState,
    HeldLocks, InflightJournal, LockState, HELD_LOCKS_FORMAT_MAJOR, JOURNAL_ENTRIES_MAX,
    JOURNAL_ENTRY_LEN_MAX, JOURNAL_FORMAT_MAJOR, STATE_FORMAT_MAJOR, STATE_FORMAT_MINOR,
};
pub use logs::{log_tail, LOG_TAIL_BYTES_MAX};
pub use message::{
    decode, encode, Message, NegotiatedInit, Unanswered, FORMAT_VERSION, MAGIC, MESSAGE_LEN_MAX,
};
pub use size::parse_size;
pub use socket::{accept_seqpacket, connect_seqpacket, listen_seqpacket, LISTEN_BACKLOG_MAX};
pub use volume_spec::{is_valid_name, VolumeSpec, VolumeSpecError, VOLUME_NAME_LEN_MAX};
