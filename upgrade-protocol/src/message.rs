//! Control messages and their framing.
//!
//! Frame layout (little endian), format version 1:
//!
//! ```text
//! offset 0  magic   "BATN"
//! offset 4  version u16  (FORMAT_VERSION)
//! offset 6  flags   u16  (0)
//! offset 8  length  u32  (body bytes)
//! offset 12 body    JSON of `Message`, `length` bytes
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::control::{MountRecord, Reply, Request};
use crate::counters::GenerationCounters;
use crate::ProtocolError;

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BATN";
/// The frame format this binary writes and the highest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// The largest frame accepted.
pub const MESSAGE_LEN_MAX: usize = 1 << 20;
const HEADER_LEN: usize = 12;

/// The FUSE_INIT result of a connection, as recorded by whoever answered
/// INIT and handed to every generation that adopts the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NegotiatedInit {
    /// Protocol major (7).
    pub major: u32,
    /// Protocol minor in use.
    pub minor: u32,
    /// Minor the kernel offered.
    pub kernel_minor: u32,
    /// Granted flags (`flags | flags2 << 32`).
    pub flags: u64,
    /// Readahead bytes.
    pub max_readahead: u32,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Largest request in pages.
    pub max_pages: u16,
    /// Background requests at most.
    pub max_background: u16,
    /// Congestion threshold.
    pub congestion_threshold: u16,
    /// Timestamp granularity, ns.
    pub time_gran: u32,
}

/// The record of an INIT that fuse-wire answered (the supervisor's, or a
/// self-mounting `fsclient mount`'s).
impl From<&fuse_wire::InitParams> for NegotiatedInit {
    fn from(p: &fuse_wire::InitParams) -> NegotiatedInit {
        NegotiatedInit {
            major: p.major,
            minor: p.minor,
            kernel_minor: p.kernel_minor,
            flags: p.flags,
            max_readahead: p.max_readahead,
            max_write: p.max_write,
            max_pages: p.max_pages,
            max_background: p.max_background,
            congestion_threshold: p.congestion_threshold,
            time_gran: p.time_gran,
        }
    }
}

/// The parameters a generation adopts from the record it was handed.
impl From<&NegotiatedInit> for fuse_wire::InitParams {
    fn from(r: &NegotiatedInit) -> fuse_wire::InitParams {
        fuse_wire::InitParams {
            major: r.major,
            minor: r.minor,
            kernel_minor: r.kernel_minor,
            flags: r.flags,
            max_readahead: r.max_readahead,
            max_write: r.max_write,
            max_pages: r.max_pages,
            max_background: r.max_background,
            congestion_threshold: r.congestion_threshold,
            time_gran: r.time_gran,
        }
    }
}

/// What a generation that starts reading a connection does first with the
/// requests an earlier reader took and never answered. On the wire it is
/// the bool `resend` (true: [`Unanswered::Resend`]), as it always was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "bool", into = "bool")]
pub enum Unanswered {
    /// An earlier reader died with requests it had read: re-queue them all
    /// with FUSE_NOTIFY_RESEND before the first read. Only when no other
    /// reader is alive: RESEND re-queues the whole connection, so a live
    /// reader's requests would run twice.
    Resend,
    /// No dead reader holds requests (a fresh connection, a planned upgrade
    /// whose journal carries them, a rollback before the successor read):
    /// read the queue as it is.
    Leave,
}

impl From<bool> for Unanswered {
    fn from(resend: bool) -> Unanswered {
        if resend {
            Unanswered::Resend
        } else {
            Unanswered::Leave
        }
    }
}

impl From<Unanswered> for bool {
    fn from(unanswered: Unanswered) -> bool {
        unanswered == Unanswered::Resend
    }
}

/// A control message between a holder of the fd (supervisor) and a
/// generation, or between fsctl and the supervisor (`Control`,
/// `ControlReply`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// Holder → generation, with the /dev/fuse fd attached: serve this
    /// initialized connection; first, do with the requests an earlier
    /// reader left unanswered what `unanswered` says.
    Adopt {
        /// The generation number.
        generation: u64,
        /// A random identity of the FUSE connection, chosen at mount: FUSE
        /// uniques restart with every connection, so exactly-once records
        /// are keyed by (connection, unique). 0 from holders predating it.
        #[serde(default, rename = "connection")]
        connection_identity: u64,
        /// The connection's INIT result.
        init: NegotiatedInit,
        /// Re-queue a dead reader's requests, or read the queue as it is.
        #[serde(rename = "resend")]
        unanswered: Unanswered,
        /// A planned upgrade: the predecessor's handover state file (see
        /// `handover.rs`) to load, and its journal to answer, before reading.
        #[serde(default)]
        handover: Option<PathBuf>,
    },
    /// Generation → holder: serving.
    Serving {
        /// The generation number.
        generation: u64,
        /// Its process id.
        pid: u32,
        /// When its workers started reading (CLOCK_MONOTONIC, ns; 0 if
        /// unknown): the end of an upgrade's stall.
        #[serde(default)]
        reading_ns: u64,
    },
    /// Generation → holder, from time to time: counters for `fsctl status`.
    Stats {
        /// The generation number.
        generation: u64,
        /// Replayed requests answered from an earlier generation's
        /// exactly-once record.
        requests_recovered: u64,
        /// Request, byte and cache counters since the generation started
        /// (absent from generations that predate them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        counters: Option<Box<GenerationCounters>>,
    },
    /// Holder → serving generation: stop reading, journal what is in
    /// flight, write the handover state into `dir`, and answer with
    /// `HandedOver` or `HandoverFailed`. Nothing is released yet.
    Handover {
        /// Where to write the state and journal files.
        dir: PathBuf,
    },
    /// Generation → holder: the state is written; the generation is fenced
    /// (replies sealed, metadata refused) until `Resume` or `Exit`.
    HandedOver {
        /// The state file.
        state: PathBuf,
        /// Requests journaled.
        journaled: u32,
        /// When it stopped reading (CLOCK_MONOTONIC, ns): the start of the
        /// upgrade's stall.
        stopped_reading_ns: u64,
    },
    /// Generation → holder: the handover could not be prepared; the
    /// generation serves on.
    HandoverFailed {
        /// Why.
        reason: String,
    },
    /// Holder → handed-over generation: the successor failed; serve again.
    Resume {
        /// [`Unanswered::Resend`] when the successor died with requests it
        /// had read.
        #[serde(rename = "resend")]
        unanswered: Unanswered,
    },
    /// Holder → handed-over generation: the successor serves; exit now
    /// without touching anything.
    Exit,
    /// fsctl → supervisor: one command (see [`Request`]).
    Control {
        /// The command.
        request: Request,
    },
    /// supervisor → fsctl: the answer to a [`Message::Control`].
    ControlReply {
        /// The answer.
        reply: Reply,
    },
    /// Stopping supervisor → its successor (over the successor socket),
    /// with the mount's /dev/fuse fd attached: one mount to hold. Its
    /// generations still serve until [`Message::Released`].
    PassMount {
        /// The mount, as in the state directory.
        record: MountRecord,
    },
    /// Stopping supervisor → successor: every mount was passed.
    PassDone,
    /// Successor → stopping supervisor: it holds the fds of these mounts
    /// (by mount id) and waits for [`Message::Released`].
    PassReceived {
        /// The mount ids held.
        mounts: Vec<String>,
    },
    /// Stopping supervisor → successor: every generation of the passed
    /// mounts is dead (killed and reaped), so new ones may RESEND.
    Released,
}

impl Message {
    /// The message kind, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Adopt { .. } => "adopt",
            Message::Serving { .. } => "serving",
            Message::Stats { .. } => "stats",
            Message::Handover { .. } => "handover",
            Message::HandedOver { .. } => "handed_over",
            Message::HandoverFailed { .. } => "handover_failed",
            Message::Resume { .. } => "resume",
            Message::Exit => "exit",
            Message::Control { .. } => "control",
            Message::ControlReply { .. } => "control_reply",
            Message::PassMount { .. } => "pass_mount",
            Message::PassDone => "pass_done",
            Message::PassReceived { .. } => "pass_received",
            Message::Released => "released",
        }
    }

    /// How many fds travel with this message.
    pub fn fd_count(&self) -> usize {
        match self {
            Message::Adopt { .. } | Message::PassMount { .. } => 1,
            _ => 0,
        }
    }
}

/// Frames a message. Pure.
pub fn encode(message: &Message) -> Result<Vec<u8>, ProtocolError> {
    let body = serde_json::to_vec(message)?;
    if body.len() + HEADER_LEN > MESSAGE_LEN_MAX {
        return Err(ProtocolError::TooLarge {
            len: body.len() + HEADER_LEN,
            max: MESSAGE_LEN_MAX,
        });
    }
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Parses a frame. Pure.
pub fn decode(frame: &[u8]) -> Result<Message, ProtocolError> {
    if frame.len() < HEADER_LEN {
        return Err(ProtocolError::Truncated {
            len: frame.len(),
            declared: HEADER_LEN,
        });
    }
    if frame[..4] != MAGIC {
        return Err(ProtocolError::BadMagic);
    }
    let version = u16::from_le_bytes([frame[4], frame[5]]);
    if version > FORMAT_VERSION {
        return Err(ProtocolError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let declared = u32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]]) as usize;
    let body = frame
        .get(HEADER_LEN..HEADER_LEN + declared)
        .ok_or(ProtocolError::Truncated {
            len: frame.len(),
            declared: HEADER_LEN + declared,
        })?;
    Ok(serde_json::from_slice(body)?)
}
