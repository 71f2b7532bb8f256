//! The per-inode `size` record of the staging area: the staged logical size,
//! the truncation floor, and their sequence numbers, as one 56-byte
//! checksummed record.
//!
//! The first record of an inode is written to `size.tmp` and renamed into
//! place, so a record is never empty or partial, even if the process dies
//! or the disk fills while writing it. Later ones rewrite it in place
//! (`pwrite` at offset 0): 56 bytes within one page reach the page cache
//! whole or not at all, even if the process dies in the call, and need no
//! new space, so a reader after a kill -9 finds the old record or the new
//! one. Readers in this process hold the inode's stripe lock; another
//! process reads the area only once this one is dead or fenced. Earlier
//! builds replaced every record (`size.tmp`, rename): an inode allocated and
//! one freed on every extending WRITE. Each build reads what the other
//! wrote.
//!
//! Byte layout (little endian), format version 1:
//!
//! ```text
//! 0   4  magic "BTSZ"
//! 4   4  version = 1
//! 8   4  flags: bit0 size is exact, bit1 floor present
//! 12  4  reserved = 0
//! 16  8  size_bytes (exact size, or lower bound when bit0 is clear)
//! 24  8  floor_bytes (valid when bit1 is set)
//! 32  8  seq: bumped on every change of the record
//! 40  8  floor_seq: value of seq when the floor was last set or lowered
//! 48  8  FNV-1a 64 checksum of bytes 0..48
//! ```

use std::path::Path;

use crate::error::{BlocksError, Result};

/// Encoded record length.
pub(crate) const RECORD_BYTES: usize = 56;
const MAGIC: &[u8; 4] = b"BTSZ";
const VERSION: u32 = 1;
const FLAG_EXACT: u32 = 1;
const FLAG_FLOOR: u32 = 2;

/// The staged logical size of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagedSize {
    /// The size was set explicitly (truncate, or an extending write after it).
    Exact(u64),
    /// Only writes were staged: the size is at least this, or the committed
    /// size if that is larger.
    AtLeast(u64),
}

impl StagedSize {
    /// The logical size given the committed (metadata) size.
    pub fn resolve(self, committed_size_bytes: u64) -> u64 {
        match self {
            StagedSize::Exact(s) => s,
            StagedSize::AtLeast(s) => s.max(committed_size_bytes),
        }
    }

    /// The raw value.
    pub fn bytes(self) -> u64 {
        match self {
            StagedSize::Exact(s) | StagedSize::AtLeast(s) => s,
        }
    }
}

/// Decoded size record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeRecord {
    pub(crate) size: StagedSize,
    pub(crate) floor_bytes: Option<u64>,
    pub(crate) seq: u64,
    pub(crate) floor_seq: u64,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

impl SizeRecord {
    pub(crate) fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut buf = [0u8; RECORD_BYTES];
        let (exact, size) = match self.size {
            StagedSize::Exact(s) => (FLAG_EXACT, s),
            StagedSize::AtLeast(s) => (0, s),
        };
        let flags = exact
            | if self.floor_bytes.is_some() {
                FLAG_FLOOR
            } else {
                0
            };
        buf[0..4].copy_from_slice(MAGIC);
        buf[4..8].copy_from_slice(&VERSION.to_le_bytes());
        buf[8..12].copy_from_slice(&flags.to_le_bytes());
        buf[16..24].copy_from_slice(&size.to_le_bytes());
        buf[24..32].copy_from_slice(&self.floor_bytes.unwrap_or(0).to_le_bytes());
        buf[32..40].copy_from_slice(&self.seq.to_le_bytes());
        buf[40..48].copy_from_slice(&self.floor_seq.to_le_bytes());
        let sum = fnv1a(&buf[0..48]);
        buf[48..56].copy_from_slice(&sum.to_le_bytes());
        buf
    }

    pub(crate) fn decode(buf: &[u8], path: &Path) -> Result<Self> {
        let corrupt = |reason: String| BlocksError::StagingCorrupt {
            path: path.to_path_buf(),
            reason,
        };
        if buf.len() != RECORD_BYTES {
            return Err(corrupt(format!("length {} != {RECORD_BYTES}", buf.len())));
        }
        if &buf[0..4] != MAGIC {
            return Err(corrupt("bad magic".to_string()));
        }
        let version = u32_at(buf, 4);
        if version != VERSION {
            return Err(corrupt(format!("unknown version {version}")));
        }
        if u64_at(buf, 48) != fnv1a(&buf[0..48]) {
            return Err(corrupt("checksum mismatch".to_string()));
        }
        let flags = u32_at(buf, 8);
        if flags & !(FLAG_EXACT | FLAG_FLOOR) != 0 {
            return Err(corrupt(format!("unknown flags {flags:#x}")));
        }
        let size_bytes = u64_at(buf, 16);
        Ok(SizeRecord {
            size: if flags & FLAG_EXACT != 0 {
                StagedSize::Exact(size_bytes)
            } else {
                StagedSize::AtLeast(size_bytes)
            },
            floor_bytes: (flags & FLAG_FLOOR != 0).then(|| u64_at(buf, 24)),
            seq: u64_at(buf, 32),
            floor_seq: u64_at(buf, 40),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_detects_corruption() {
        let rec = SizeRecord {
            size: StagedSize::Exact(12345),
            floor_bytes: Some(100),
            seq: 7,
            floor_seq: 5,
        };
        let mut buf = rec.encode();
        let p = Path::new("size");
        assert_eq!(SizeRecord::decode(&buf, p).unwrap(), rec);
        buf[17] ^= 1;
        assert!(matches!(
            SizeRecord::decode(&buf, p),
            Err(BlocksError::StagingCorrupt { .. })
        ));
        assert!(SizeRecord::decode(&buf[..8], p).is_err());
    }

    #[test]
    fn at_least_resolves_against_committed_size() {
        assert_eq!(StagedSize::AtLeast(10).resolve(50), 50);
        assert_eq!(StagedSize::AtLeast(60).resolve(50), 60);
        assert_eq!(StagedSize::Exact(10).resolve(50), 10);
    }
}
