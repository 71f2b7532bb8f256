//! Byte encoding of mutation results stored for exactly-once execution.
//!
//! A mutating method called with `Some(RequestKey)` stores the encoded result
//! in `completed_requests` inside the same transaction as the mutation, so the
//! two commit or roll back together. A caller that re-sends the request after
//! a crash first asks `completed_request(key)` and decodes the bytes with
//! [`Recorded::decode`] instead of executing the mutation again.
//!
//! Layout (v1, pinned: a change means a new version byte). All integers are
//! little-endian:
//!
//! ```text
//! u8 version (= 1) | u8 tag | payload
//! tag 0 Unit       : (nothing)
//! tag 1 Attr       : Attr
//! tag 2 SetAttr    : Attr, Released, u8 has_partial, [u64 partial_block]
//! tag 3 Unlinked   : Unlinked
//! tag 4 Renamed    : u8 has_replaced, [Unlinked]
//! tag 5 Released   : Released
//! tag 6 Committed  : Attr, Released
//! Attr     = u64 ino, u8 kind, u32 mode, u32 nlink, u32 uid, u32 gid, u32 rdev,
//!            u64 size, (i64 sec, u32 nsec) x3 for atime mtime ctime, u64 generation
//! Unlinked = u64 ino, u32 nlink_after, u8 kind
//! Released = u32 count, count x (u32 key_len, key_len bytes UTF-8)
//! ```
//! Errors are not recorded: a failed mutation changed nothing.

use crate::error::{MetaError, Result};
use crate::types::{Attr, FileKind, ObjectRef, Renamed, Timespec, TruncatedBlocks, Unlinked};

/// Version byte of the encoding.
pub const RECORD_VERSION: u8 = 1;

/// The result of one mutating operation, as stored for exactly-once replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// `setxattr`, `removexattr`.
    Unit,
    /// `create`, `link`.
    Attr(Attr),
    /// `setattr`.
    SetAttr(Attr, TruncatedBlocks),
    /// `unlink`, `rmdir`.
    Unlinked(Unlinked),
    /// `rename`.
    Renamed(Renamed),
    /// `reclaim`.
    Released(Vec<ObjectRef>),
    /// `commit_blocks`.
    Committed(Attr, Vec<ObjectRef>),
    /// `share_blocks` that ends a copy: the destination's attributes, the
    /// bytes the whole copy reported, the objects released.
    Copied(Attr, u64, Vec<ObjectRef>),
}

impl Recorded {
    /// Encodes to the v1 layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![RECORD_VERSION];
        match self {
            Recorded::Unit => out.push(0),
            Recorded::Attr(a) => {
                out.push(1);
                put_attr(&mut out, a);
            }
            Recorded::SetAttr(a, t) => {
                out.push(2);
                put_attr(&mut out, a);
                put_released(&mut out, &t.released);
                put_opt_u64(&mut out, t.partial_block);
            }
            Recorded::Unlinked(u) => {
                out.push(3);
                put_unlinked(&mut out, u);
            }
            Recorded::Renamed(r) => {
                out.push(4);
                match &r.replaced {
                    Some(u) => {
                        out.push(1);
                        put_unlinked(&mut out, u);
                    }
                    None => out.push(0),
                }
            }
            Recorded::Released(v) => {
                out.push(5);
                put_released(&mut out, v);
            }
            Recorded::Committed(a, v) => {
                out.push(6);
                put_attr(&mut out, a);
                put_released(&mut out, v);
            }
            Recorded::Copied(a, bytes, v) => {
                out.push(7);
                put_attr(&mut out, a);
                out.extend_from_slice(&bytes.to_le_bytes());
                put_released(&mut out, v);
            }
        }
        out
    }

    /// Decodes bytes produced by [`Recorded::encode`]; trailing bytes or an
    /// unknown version or tag are [`MetaError::Corrupt`].
    pub fn decode(bytes: &[u8]) -> Result<Recorded> {
        let mut r = Reader { bytes, pos: 0 };
        let version = r.u8()?;
        if version != RECORD_VERSION {
            return Err(MetaError::corrupt(format!(
                "completed-request record version {version}, expected {RECORD_VERSION}"
            )));
        }
        let out = match r.u8()? {
            0 => Recorded::Unit,
            1 => Recorded::Attr(r.attr()?),
            2 => {
                let attr = r.attr()?;
                let released = r.released()?;
                let partial_block = r.opt_u64()?;
                Recorded::SetAttr(
                    attr,
                    TruncatedBlocks {
                        released,
                        partial_block,
                    },
                )
            }
            3 => Recorded::Unlinked(r.unlinked()?),
            4 => Recorded::Renamed(Renamed {
                replaced: match r.u8()? {
                    0 => None,
                    _ => Some(r.unlinked()?),
                },
            }),
            5 => Recorded::Released(r.released()?),
            6 => Recorded::Committed(r.attr()?, r.released()?),
            7 => Recorded::Copied(r.attr()?, r.u64()?, r.released()?),
            tag => {
                return Err(MetaError::corrupt(format!(
                    "completed-request record tag {tag} unknown"
                )))
            }
        };
        if r.pos != bytes.len() {
            return Err(MetaError::corrupt(
                "completed-request record has trailing bytes",
            ));
        }
        Ok(out)
    }
}

fn put_attr(out: &mut Vec<u8>, a: &Attr) {
    out.extend_from_slice(&a.ino.to_le_bytes());
    out.push(a.kind.code());
    for v in [a.mode, a.nlink, a.uid, a.gid, a.rdev] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&a.size.to_le_bytes());
    for t in [a.atime, a.mtime, a.ctime] {
        out.extend_from_slice(&t.sec.to_le_bytes());
        out.extend_from_slice(&t.nsec.to_le_bytes());
    }
    out.extend_from_slice(&a.generation.to_le_bytes());
}

fn put_unlinked(out: &mut Vec<u8>, u: &Unlinked) {
    out.extend_from_slice(&u.ino.to_le_bytes());
    out.extend_from_slice(&u.nlink_after.to_le_bytes());
    out.push(u.kind.code());
}

fn put_released(out: &mut Vec<u8>, v: &[ObjectRef]) {
    // Invariant: counts and key lengths fit u32; keys come from block-map
    // rows and a commit is capped at COMMIT_BLOCKS_ROWS_MAX rows.
    out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
    for o in v {
        let key = o.key.as_bytes();
        out.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(key);
    }
}

fn put_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(x) => {
            out.push(1);
            out.extend_from_slice(&x.to_le_bytes());
        }
        None => out.push(0),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let end = self.pos.checked_add(N).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(MetaError::corrupt("completed-request record truncated"));
        };
        let mut buf = [0u8; N];
        buf.copy_from_slice(&self.bytes[self.pos..end]);
        self.pos = end;
        Ok(buf)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn time(&mut self) -> Result<Timespec> {
        let sec = i64::from_le_bytes(self.take()?);
        Ok(Timespec {
            sec,
            nsec: self.u32()?,
        })
    }
    fn kind(&mut self) -> Result<FileKind> {
        let code = self.u8()?;
        FileKind::from_code(i64::from(code))
            .ok_or_else(|| MetaError::corrupt(format!("record file kind {code} unknown")))
    }
    fn opt_u64(&mut self) -> Result<Option<u64>> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some(self.u64()?),
        })
    }
    fn attr(&mut self) -> Result<Attr> {
        Ok(Attr {
            ino: self.u64()?,
            kind: self.kind()?,
            mode: self.u32()?,
            nlink: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            rdev: self.u32()?,
            size: self.u64()?,
            atime: self.time()?,
            mtime: self.time()?,
            ctime: self.time()?,
            generation: self.u64()?,
        })
    }
    fn unlinked(&mut self) -> Result<Unlinked> {
        Ok(Unlinked {
            ino: self.u64()?,
            nlink_after: self.u32()?,
            kind: self.kind()?,
        })
    }
    fn released(&mut self) -> Result<Vec<ObjectRef>> {
        let count = self.u32()? as usize;
        let mut v = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let len = self.u32()? as usize;
            let end = self.pos.checked_add(len).filter(|e| *e <= self.bytes.len());
            let Some(end) = end else {
                return Err(MetaError::corrupt("completed-request record key truncated"));
            };
            let key = std::str::from_utf8(&self.bytes[self.pos..end])
                .map_err(|_| MetaError::corrupt("completed-request record key not UTF-8"))?;
            self.pos = end;
            v.push(ObjectRef {
                key: key.to_owned(),
            });
        }
        Ok(v)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn attr() -> Attr {
        Attr {
            ino: 42,
            kind: FileKind::Regular,
            mode: 0o4755,
            nlink: 3,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 1 << 40,
            atime: Timespec { sec: -5, nsec: 7 },
            mtime: Timespec { sec: 10, nsec: 0 },
            ctime: Timespec {
                sec: 11,
                nsec: 999_999_999,
            },
            generation: 1,
        }
    }

    #[test]
    fn every_variant_round_trips() {
        let keys = vec![
            ObjectRef { key: "a/1".into() },
            ObjectRef { key: "".into() },
        ];
        let u = Unlinked {
            ino: 9,
            nlink_after: 0,
            kind: FileKind::Directory,
        };
        let all = [
            Recorded::Unit,
            Recorded::Attr(attr()),
            Recorded::SetAttr(
                attr(),
                TruncatedBlocks {
                    released: keys.clone(),
                    partial_block: Some(7),
                },
            ),
            Recorded::Unlinked(u),
            Recorded::Renamed(Renamed { replaced: Some(u) }),
            Recorded::Renamed(Renamed { replaced: None }),
            Recorded::Released(keys.clone()),
            Recorded::Committed(attr(), keys.clone()),
            Recorded::Copied(attr(), 3 << 40, keys),
        ];
        for r in all {
            assert_eq!(Recorded::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn unit_encoding_is_pinned() {
        assert_eq!(Recorded::Unit.encode(), vec![1, 0]);
        let u = Unlinked {
            ino: 2,
            nlink_after: 1,
            kind: FileKind::Regular,
        };
        assert_eq!(
            Recorded::Unlinked(u).encode(),
            vec![1, 3, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]
        );
    }

    #[test]
    fn truncated_or_trailing_or_unknown_bytes_are_corrupt() {
        let full = Recorded::Attr(attr()).encode();
        for cut in 0..full.len() {
            assert!(Recorded::decode(&full[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = full.clone();
        long.push(0);
        assert!(Recorded::decode(&long).is_err());
        assert!(Recorded::decode(&[2, 0]).is_err());
        assert!(Recorded::decode(&[1, 99]).is_err());
    }
}
