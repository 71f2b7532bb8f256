//! Object key naming for block objects.
//!
//! A key names one immutable block object by inode, block index and
//! `unique`, a random 64-bit value drawn for every upload, so two uploads
//! of the same (inode, block index) never share a key: objects are never
//! overwritten, which is what lets caches skip invalidation.
//!
//! Two layouts spell a key; both parse, whatever the volume (a key is
//! stored whole in the metadata), and [`KeyLayout`] says which one a
//! store gives new uploads:
//! - [`KeyLayout::PerInode`], `blocks/{ino:016x}/{index:08x}-{unique:016x}`;
//! - [`KeyLayout::Fanned`], `blocks/{fan:02x}/{ino:016x}-{index:08x}-{unique:016x}`,
//!   `fan` the top byte of `unique`.

use std::fmt;

use crate::error::{BlocksError, Result};

/// Prefix of every block object key.
pub const KEY_PREFIX: &str = "blocks";

/// How a key is spelled (module docs). The volume's metadata format
/// version decides which layout its new uploads get; a build that knows
/// only [`KeyLayout::PerInode`] refuses such a volume at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyLayout {
    /// A directory per inode: what every volume of metadata format 1 uses.
    /// In a local-directory store a file's first upload makes its
    /// directory and its last delete removes it, measured at about 65 and
    /// 450 µs of a small file's create and unlink.
    #[default]
    PerInode,
    /// 256 directories shared by all files, chosen by the key's random
    /// part (metadata format 2 and later).
    Fanned,
}

/// A fresh, never-used name for an inline block of (`ino`, `index`):
/// one kept in its block-map row, not in the store. `prefix` is the
/// metadata's mark of such keys; the rest is spelled as a fanned key's
/// name, `{ino:016x}-{index:08x}-{unique:016x}`. The name is the block
/// codec's associated data, as an object's key is.
pub fn inline_key(prefix: &str, ino: u64, index: u64) -> String {
    let unique = rand::random::<u64>();
    format!("{prefix}{ino:016x}-{index:08x}-{unique:016x}")
}

/// The key of one immutable block object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    ino: u64,
    index: u64,
    unique: u64,
    layout: KeyLayout,
}

impl ObjectKey {
    /// A fresh, never-used key for block `index` of inode `ino`.
    pub fn generate(ino: u64, index: u64, layout: KeyLayout) -> Self {
        ObjectKey {
            ino,
            index,
            unique: rand::random::<u64>(),
            layout,
        }
    }

    /// A key from its parts (tests and tools; normal uploads use [`ObjectKey::generate`]).
    pub fn from_parts(ino: u64, index: u64, unique: u64, layout: KeyLayout) -> Self {
        ObjectKey {
            ino,
            index,
            unique,
            layout,
        }
    }

    /// Parses a key string as stored by the metadata engine, in either layout.
    pub fn parse(s: &str) -> Result<Self> {
        let invalid = || BlocksError::InvalidKey { key: s.to_string() };
        let rest = s
            .strip_prefix(KEY_PREFIX)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(invalid)?;
        let (dir, name) = rest.split_once('/').ok_or_else(invalid)?;
        let (layout, ino, rest) = match dir.len() {
            16 => (KeyLayout::PerInode, dir, name),
            2 => {
                let (ino, rest) = name.split_once('-').ok_or_else(invalid)?;
                (KeyLayout::Fanned, ino, rest)
            }
            _ => return Err(invalid()),
        };
        let (index, unique) = rest.split_once('-').ok_or_else(invalid)?;
        if ino.len() != 16 || index.len() < 8 || unique.len() != 16 {
            return Err(invalid());
        }
        let key = ObjectKey {
            ino: lower_hex(ino).ok_or_else(invalid)?,
            index: lower_hex(index).ok_or_else(invalid)?,
            unique: lower_hex(unique).ok_or_else(invalid)?,
            layout,
        };
        if layout == KeyLayout::Fanned && lower_hex(dir) != Some(u64::from(key.fan())) {
            return Err(invalid());
        }
        Ok(key)
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

    /// How the key is spelled.
    pub fn layout(&self) -> KeyLayout {
        self.layout
    }

    /// The object store path of this key.
    pub fn to_path(&self) -> object_store::path::Path {
        object_store::path::Path::from(self.to_string())
    }

    /// A flat file name for this key (used by the block cache):
    /// `{ino}-{index}-{unique}.blk`, with `.fan` before the extension for
    /// a [`KeyLayout::Fanned`] key.
    pub(crate) fn file_name(&self) -> String {
        let fanned = match self.layout {
            KeyLayout::PerInode => "",
            KeyLayout::Fanned => FANNED_FILE_MARK,
        };
        format!(
            "{:016x}-{:08x}-{:016x}{fanned}.blk",
            self.ino, self.index, self.unique
        )
    }

    /// Inverse of [`ObjectKey::file_name`]; `None` for foreign names.
    pub(crate) fn from_file_name(name: &str) -> Option<Self> {
        let stem = name.strip_suffix(".blk")?;
        let (stem, layout) = match stem.strip_suffix(FANNED_FILE_MARK) {
            Some(stem) => (stem, KeyLayout::Fanned),
            None => (stem, KeyLayout::PerInode),
        };
        let mut parts = stem.split('-');
        let (ino, index, unique) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || ino.len() != 16 || index.len() < 8 || unique.len() != 16 {
            return None;
        }
        Some(ObjectKey {
            ino: lower_hex(ino)?,
            index: lower_hex(index)?,
            unique: lower_hex(unique)?,
            layout,
        })
    }

    /// The directory of a [`KeyLayout::Fanned`] key.
    fn fan(&self) -> u8 {
        self.unique.to_be_bytes()[0]
    }
}

/// Marks a [`KeyLayout::Fanned`] key's cache file name.
const FANNED_FILE_MARK: &str = ".fan";

/// A lowercase hex number (the only spelling keys use), or `None`.
fn lower_hex(h: &str) -> Option<u64> {
    if h.is_empty()
        || !h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ino, index, unique) = (self.ino, self.index, self.unique);
        match self.layout {
            KeyLayout::PerInode => {
                write!(f, "{KEY_PREFIX}/{ino:016x}/{index:08x}-{unique:016x}")
            }
            KeyLayout::Fanned => write!(
                f,
                "{KEY_PREFIX}/{:02x}/{ino:016x}-{index:08x}-{unique:016x}",
                self.fan()
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn keys_format_and_parse_back_in_both_layouts() {
        let per_inode = ObjectKey::from_parts(0x2a, 7, 0xdead_beef, KeyLayout::PerInode);
        let fanned = ObjectKey::from_parts(0x2a, 7, 0xc1de_beef_0000_0001, KeyLayout::Fanned);
        for (key, spelled) in [
            (
                &per_inode,
                "blocks/000000000000002a/00000007-00000000deadbeef",
            ),
            (
                &fanned,
                "blocks/c1/000000000000002a-00000007-c1debeef00000001",
            ),
        ] {
            assert_eq!(key.to_string(), spelled);
            assert_eq!(&ObjectKey::parse(spelled).unwrap(), key);
            assert_eq!(&ObjectKey::from_file_name(&key.file_name()).unwrap(), key);
        }
        assert_ne!(
            ObjectKey::from_parts(1, 2, 3, KeyLayout::PerInode).file_name(),
            ObjectKey::from_parts(1, 2, 3, KeyLayout::Fanned).file_name()
        );
    }

    #[test]
    fn large_block_index_round_trips() {
        for layout in [KeyLayout::PerInode, KeyLayout::Fanned] {
            let key = ObjectKey::from_parts(1, 0x1_0000_0000, 3, layout);
            assert_eq!(ObjectKey::parse(&key.to_string()).unwrap(), key);
        }
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
            "blocks/000000000000002a/+0000007-00000000deadbeef",
            // Fanned: the directory must be the unique part's top byte.
            "blocks/c2/000000000000002a-00000007-c1debeef00000001",
            "blocks/C1/000000000000002a-00000007-c1debeef00000001",
            "blocks/c1/000000000000002a-00000007",
            "blocks/c1/2a-00000007-c1debeef00000001",
        ] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ObjectKey::from_file_name(".tmp-123").is_none());
    }

    #[test]
    fn generated_keys_are_unique_and_fan_out() {
        let keys: HashSet<ObjectKey> = (0..10_000)
            .map(|_| ObjectKey::generate(1, 0, KeyLayout::Fanned))
            .collect();
        assert_eq!(keys.len(), 10_000);
        let fans: HashSet<u8> = keys.iter().map(ObjectKey::fan).collect();
        assert_eq!(fans.len(), 256, "10,000 keys should use every directory");
    }
}
