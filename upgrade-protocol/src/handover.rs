//! What a generation hands to its successor in a planned upgrade: the
//! [`HandoverState`] (a small versioned JSON document) and the
//! [`InflightJournal`] (the raw bytes of requests read but not answered).
//!
//! State file layout (little endian):
//!
//! ```text
//! offset 0  magic  "BATS"
//! offset 4  major  u16  (STATE_FORMAT_MAJOR)   a reader refuses a newer major
//! offset 6  minor  u16  (STATE_FORMAT_MINOR)   additive changes; older readers ignore new fields
//! offset 8  length u32  (body bytes)
//! offset 12 crc32  u32  (of the body)
//! offset 16 body   JSON of `HandoverState`
//! ```
//!
//! Journal file layout: `"BATJ" | major u16 | minor u16 | count u32`, then
//! per request `len u32 | crc32 u32 | raw request bytes` (the request
//! exactly as read from /dev/fuse, its `unique` inside). A reader checks
//! every length and checksum and refuses a truncated or corrupt file: the
//! upgrade rolls back and the old generation answers the requests itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{NegotiatedInit, ProtocolError};

/// The state format this binary writes.
pub const STATE_FORMAT_MAJOR: u16 = 1;
/// Its minor version.
pub const STATE_FORMAT_MINOR: u16 = 0;
/// The journal format this binary writes and the highest major it reads.
pub const JOURNAL_FORMAT_MAJOR: u16 = 1;
/// Requests in one journal at most.
pub const JOURNAL_ENTRIES_MAX: u32 = 1 << 16;
/// One journaled request at most (a 1 MiB write plus headers).
pub const JOURNAL_ENTRY_LEN_MAX: u32 = (1 << 20) + (1 << 16);

/// The held-locks format this binary writes and the highest major it reads.
pub const HELD_LOCKS_FORMAT_MAJOR: u16 = 1;

const STATE_MAGIC: &[u8; 4] = b"BATS";
const HELD_LOCKS_MAGIC: &[u8; 4] = b"BATL";
const JOURNAL_MAGIC: &[u8; 4] = b"BATJ";
const STATE_HEADER_LEN: usize = 16;
const JOURNAL_HEADER_LEN: usize = 12;

/// One open file or directory handle the kernel holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleState {
    /// The number the kernel knows it by.
    pub fh: u64,
    /// The inode.
    pub ino: u64,
    /// open(2) flags.
    pub flags: u32,
    /// A directory handle.
    pub dir: bool,
}

/// One held byte-range or flock lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    /// The inode.
    pub ino: u64,
    /// The kernel's lock owner.
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive; u64::MAX for "to the end").
    pub end: u64,
    /// F_RDLCK or F_WRLCK.
    pub kind: u32,
    /// The holder's pid, for F_GETLK.
    pub pid: u32,
    /// flock(2) rather than POSIX.
    pub flock: bool,
}

/// Everything a generation hands over besides the fd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoverState {
    /// The generation handing over.
    pub generation: u64,
    /// The connection's random identity.
    #[serde(rename = "connection")]
    pub connection_identity: u64,
    /// The connection's INIT result.
    pub init: NegotiatedInit,
    /// Open handles.
    pub handles: Vec<HandleState>,
    /// The next handle number the old generation would have issued.
    pub next_fh: u64,
    /// Orphans kept alive by open handles.
    pub open_orphans: Vec<u64>,
    /// Held locks.
    pub locks: Vec<LockState>,
    /// The in-flight journal, if any request was journaled.
    pub journal: Option<PathBuf>,
    /// Requests journaled.
    pub journaled: u32,
    /// When the old generation stopped reading (CLOCK_MONOTONIC, ns).
    pub stopped_reading_ns: u64,
}

/// Encodes a state document. Pure.
pub fn encode_state(state: &HandoverState) -> Result<Vec<u8>, ProtocolError> {
    Ok(frame(
        STATE_MAGIC,
        STATE_FORMAT_MAJOR,
        STATE_FORMAT_MINOR,
        &serde_json::to_vec(state)?,
    ))
}

/// Decodes a state document, refusing a newer major version, a bad magic,
/// a truncated body or a checksum mismatch. Pure.
pub fn decode_state(bytes: &[u8]) -> Result<HandoverState, ProtocolError> {
    let body = unframe(bytes, STATE_MAGIC, STATE_FORMAT_MAJOR, "handover state")?;
    Ok(serde_json::from_slice(body)?)
}

/// The locks held on one connection, kept on local disk by the serving
/// generation at every change, so that one taking over after a crash
/// (which leaves no [`HandoverState`]) knows what the kernel's callers
/// still hold. Same layout as the state file, magic `BATL`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLocks {
    /// The connection they are held on: a file left by another
    /// connection (an earlier mount) holds nothing for this one.
    #[serde(rename = "connection")]
    pub connection_identity: u64,
    /// Held locks.
    pub locks: Vec<LockState>,
}

impl HeldLocks {
    /// Encodes the record. Pure.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        Ok(frame(
            HELD_LOCKS_MAGIC,
            HELD_LOCKS_FORMAT_MAJOR,
            0,
            &serde_json::to_vec(self)?,
        ))
    }

    /// Decodes a record, refusing what [`decode_state`] refuses. Pure.
    pub fn decode(bytes: &[u8]) -> Result<HeldLocks, ProtocolError> {
        let body = unframe(
            bytes,
            HELD_LOCKS_MAGIC,
            HELD_LOCKS_FORMAT_MAJOR,
            "held locks",
        )?;
        Ok(serde_json::from_slice(body)?)
    }
}

/// `magic | major | minor | len | crc32 | body`. Pure.
fn frame(magic: &[u8; 4], major: u16, minor: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(STATE_HEADER_LEN + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&major.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The checked body of a [`frame`]d file called `what`. Pure.
fn unframe<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    supported_major: u16,
    what: &'static str,
) -> Result<&'a [u8], ProtocolError> {
    let corrupt = |reason| ProtocolError::Corrupt { what, reason };
    let header = bytes
        .get(..STATE_HEADER_LEN)
        .ok_or(corrupt("shorter than its header"))?;
    if &header[..4] != magic {
        return Err(corrupt("bad magic (not this kind of Baton file)"));
    }
    let major = u16::from_le_bytes([header[4], header[5]]);
    if major > supported_major {
        return Err(ProtocolError::UnsupportedVersion {
            found: major,
            supported: supported_major,
        });
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let crc = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    let body = bytes
        .get(STATE_HEADER_LEN..STATE_HEADER_LEN + len)
        .ok_or(corrupt("truncated body"))?;
    if crc32fast::hash(body) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(body)
}

/// The in-flight journal: raw requests in the order they were read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InflightJournal {
    /// Raw requests, each exactly as read from /dev/fuse.
    pub requests: Vec<Vec<u8>>,
}

impl InflightJournal {
    /// Encodes the journal. Pure.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        if self.requests.len() > JOURNAL_ENTRIES_MAX as usize {
            return Err(ProtocolError::TooLarge {
                len: self.requests.len(),
                max: JOURNAL_ENTRIES_MAX as usize,
            });
        }
        let total: usize = self.requests.iter().map(|r| r.len() + 8).sum();
        let mut out = Vec::with_capacity(JOURNAL_HEADER_LEN + total);
        out.extend_from_slice(JOURNAL_MAGIC);
        out.extend_from_slice(&JOURNAL_FORMAT_MAJOR.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.requests.len() as u32).to_le_bytes());
        for raw in &self.requests {
            if raw.len() > JOURNAL_ENTRY_LEN_MAX as usize {
                return Err(ProtocolError::TooLarge {
                    len: raw.len(),
                    max: JOURNAL_ENTRY_LEN_MAX as usize,
                });
            }
            out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(raw).to_le_bytes());
            out.extend_from_slice(raw);
        }
        Ok(out)
    }

    /// Decodes a journal, checking every length and checksum. Pure.
    pub fn decode(bytes: &[u8]) -> Result<InflightJournal, ProtocolError> {
        let corrupt = |reason| ProtocolError::Corrupt {
            what: "in-flight journal",
            reason,
        };
        let header = bytes
            .get(..JOURNAL_HEADER_LEN)
            .ok_or(corrupt("shorter than its header"))?;
        if &header[..4] != JOURNAL_MAGIC {
            return Err(corrupt("bad magic (not a Baton journal)"));
        }
        let major = u16::from_le_bytes([header[4], header[5]]);
        if major > JOURNAL_FORMAT_MAJOR {
            return Err(ProtocolError::UnsupportedVersion {
                found: major,
                supported: JOURNAL_FORMAT_MAJOR,
            });
        }
        let count = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if count > JOURNAL_ENTRIES_MAX {
            return Err(corrupt("more entries than any journal holds"));
        }
        let mut pos = JOURNAL_HEADER_LEN;
        let mut requests = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let head = bytes
                .get(pos..pos + 8)
                .ok_or(corrupt("truncated entry header"))?;
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
            let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            if len > JOURNAL_ENTRY_LEN_MAX {
                return Err(corrupt("entry longer than any request"));
            }
            pos += 8;
            let raw = bytes
                .get(pos..pos + len as usize)
                .ok_or(corrupt("truncated entry"))?;
            if crc32fast::hash(raw) != crc {
                return Err(corrupt("entry checksum mismatch"));
            }
            requests.push(raw.to_vec());
            pos += len as usize;
        }
        if pos != bytes.len() {
            return Err(corrupt("trailing bytes after the last entry"));
        }
        Ok(InflightJournal { requests })
    }
}

/// CLOCK_MONOTONIC now, in ns: comparable between processes of one boot.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        Err(_) => 0,
    }
}

/// A random identity for a new FUSE connection: exactly-once records are
/// keyed by (connection, unique), and uniques restart with every
/// connection. From the kernel's random pool; falls back to time and pid.
pub fn connection_identity() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    match random {
        Ok(()) => u64::from_ne_bytes(bytes),
        Err(err) => {
            let _ = err; // No /dev/urandom: time and pid still differ per mount.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            now ^ (u64::from(std::process::id()) << 40)
        }
    }
}
