//! Object key naming for block objects.
//!
//! A key is `blocks/{ino:016x}/{index:08x}-{unique:016x}`. `unique` is a
//! random 64-bit value drawn for every upload, so two uploads of the same
//! (inode, block index) never share a key: objects are immutable and never
//! overwritten, which is what lets caches skip invalidation.

use std::fmt;

use crate::error::{BlocksError, Result};

/// Prefix of every block object key.
pub const KEY_PREFIX: &str = "blocks";

/// The key of one immutable block object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    ino: u64,
    index: u64,
    unique: u64,
}

impl ObjectKey {
    /// A fresh, never-used key for block `index` of inode `ino`.
    pub fn generate(ino: u64, index: u64) -> Self {
        ObjectKey {
            ino,
            index,
            unique: rand::random::<u64>(),
        }
    }

    /// A key from its parts (tests and tools; normal uploads use [`ObjectKey::generate`]).
    pub fn from_parts(ino: u64, index: u64, unique: u64) -> Self {
        ObjectKey { ino, index, unique }
    }

    /// Parses a key string as stored by the metadata engine.
    pub fn parse(s: &str) -> Result<Self> {
        let invalid = || BlocksError::InvalidKey { key: s.to_string() };
        let rest = s
            .strip_prefix(KEY_PREFIX)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(invalid)?;
        let (ino, rest) = rest.split_once('/').ok_or_else(invalid)?;
        let (index, unique) = rest.split_once('-').ok_or_else(invalid)?;
        if ino.len() != 16 || index.len() < 8 || unique.len() != 16 {
            return Err(invalid());
        }
        let hex = |h: &str| {
            if h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                u64::from_str_radix(h, 16).map_err(|_| invalid())
            } else {
                Err(invalid())
            }
        };
        Ok(ObjectKey {
            ino: hex(ino)?,
            index: hex(index)?,
            unique: hex(unique)?,
        })
    }

    /// Inode number the block belongs to.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// Block index within the file.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The per-upload unique part.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The object store path of this key.
    pub fn to_path(&self) -> object_store::path::Path {
        object_store::path::Path::from(self.to_string())
    }

    /// A flat file name for this key (used by the block cache).
    pub(crate) fn file_name(&self) -> String {
        format!(
            "{:016x}-{:08x}-{:016x}.blk",
            self.ino, self.index, self.unique
        )
    }

    /// Inverse of [`ObjectKey::file_name`]; `None` for foreign names.
    pub(crate) fn from_file_name(name: &str) -> Option<Self> {
        let stem = name.strip_suffix(".blk")?;
        let mut parts = stem.split('-');
        let ino = parts.next()?;
        let index = parts.next()?;
        let unique = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let key = format!("{KEY_PREFIX}/{ino}/{index}-{unique}");
        ObjectKey::parse(&key).ok()
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{KEY_PREFIX}/{:016x}/{:08x}-{:016x}",
            self.ino, self.index, self.unique
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn key_formats_and_parses_back() {
        let key = ObjectKey::from_parts(0x2a, 7, 0xdead_beef);
        let s = key.to_string();
        assert_eq!(s, "blocks/000000000000002a/00000007-00000000deadbeef");
        assert_eq!(ObjectKey::parse(&s).unwrap(), key);
        assert_eq!(ObjectKey::from_file_name(&key.file_name()).unwrap(), key);
    }

    #[test]
    fn large_block_index_round_trips() {
        let key = ObjectKey::from_parts(1, 0x1_0000_0000, 3);
        assert_eq!(ObjectKey::parse(&key.to_string()).unwrap(), key);
    }

    #[test]
    fn malformed_keys_are_rejected() {
        for bad in [
            "",
            "blocks/",
            "other/000000000000002a/00000007-00000000deadbeef",
            "blocks/2a/00000007-00000000deadbeef",
            "blocks/000000000000002a/00000007",
            "blocks/000000000000002A/00000007-00000000deadbeef",
            "blocks/000000000000002a/0000000g-00000000deadbeef",
        ] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ObjectKey::from_file_name(".tmp-123").is_none());
    }

    #[test]
    fn generated_keys_are_unique() {
        let keys: HashSet<ObjectKey> = (0..10_000).map(|_| ObjectKey::generate(1, 0)).collect();
        assert_eq!(keys.len(), 10_000);
    }
}
