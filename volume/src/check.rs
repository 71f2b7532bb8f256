//! `fsctl fsck` and `fsctl gc`: the volume's block map against the objects
//! in its storage. fsck reports referenced objects that are missing or
//! shorter than the metadata says (lost data) and objects nothing refers to
//! (garbage: uploads a crash left uncommitted, deletes that failed); gc
//! deletes that garbage.
//!
//! Safety of gc: an object uploaded by a live flush is unreferenced until
//! its commit, so gc deletes only objects older than `min_age` (default
//! [`GC_MIN_AGE_SECS_DEFAULT`]), takes the volume's lock (`meta.db.lock`,
//! so a mount on this host refuses to start meanwhile and gc refuses while
//! one runs), and lists the storage before it reads the metadata (an object
//! committed in between is seen as referenced).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use baton_blocks::{BlockStore, ObjectKey, StoredObject};
use baton_meta::MetaStore;
use nix::fcntl::Flock;

use crate::lock::{take_lock, LockMode};
use crate::{VolumeError, VolumePaths};

/// Objects younger than this are never deleted by gc (a flush may be
/// between its upload and its commit).
pub const GC_MIN_AGE_SECS_DEFAULT: u64 = 3600;
/// Block-map rows read per metadata query.
pub const SCAN_PAGE_ROWS_MAX: u32 = 4096;
/// Problems listed one by one in a report (the counts are always whole).
pub const REPORT_PROBLEMS_LISTED_MAX: usize = 20;

/// A referenced object that is not as the metadata says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlock {
    /// Inode of the file.
    pub ino: u64,
    /// Block index in the file.
    pub index: u64,
    /// The object key the metadata names.
    pub key: String,
    /// Bytes the metadata needs.
    pub len_bytes: u64,
    /// Bytes stored, `None` when the object is missing.
    pub stored_bytes: Option<u64>,
}

/// A stored POSIX ACL xattr that does not parse: the kernel refuses it, so
/// access checks on the inode fail until it is removed or set again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadAcl {
    /// The inode.
    pub ino: u64,
    /// `system.posix_acl_access` or `system.posix_acl_default`.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What fsck found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Block-map rows in the metadata.
    pub referenced_count: u64,
    /// Objects named by more than one row (copy_file_range shares whole
    /// blocks): each stays until its last row goes.
    pub shared_count: u64,
    /// Rows of them holding their block's bytes (inline blocks: no object).
    pub inline_count: u64,
    /// Objects in the storage.
    pub stored_count: u64,
    /// Their total size.
    pub stored_bytes: u64,
    /// Referenced objects missing or short (data loss).
    pub bad_blocks: Vec<BadBlock>,
    /// Objects no row refers to.
    pub unreferenced: Vec<StoredObject>,
    /// Inodes unlinked but not yet reclaimed (their objects are kept).
    pub orphan_count: u64,
    /// Directory quotas whose stored usage differs from a recount of
    /// their trees, with their paths.
    pub quota_drifts: Vec<(std::path::PathBuf, baton_meta::QuotaDrift)>,
    /// ACL xattrs that do not parse.
    pub bad_acls: Vec<BadAcl>,
}

/// How far a check (and a gc's deletes) got, counted as it goes; another
/// thread reads it to show progress.
#[derive(Debug, Default)]
pub struct CheckProgress {
    /// Objects listed in the storage so far (the first phase).
    pub listed_objects: AtomicU64,
    /// Block-map rows compared so far (the second phase).
    pub scanned_blocks: AtomicU64,
    /// Set once the block map is read, when quotas are recounted.
    pub recounting_quotas: AtomicBool,
}

impl CheckReport {
    /// No referenced object is missing or short.
    pub fn is_consistent(&self) -> bool {
        self.bad_blocks.is_empty()
    }
}

/// An opened volume for checking.
pub struct CheckedVolume {
    /// Where its files are.
    pub paths: VolumePaths,
    /// Metadata.
    pub meta: Box<dyn MetaStore>,
    /// Storage (the URL the volume records).
    pub store: BlockStore,
}

impl CheckedVolume {
    /// Opens `volume`: a name under `base_dir`, `sqlite:///path/meta.db`
    /// or `postgres://user@host:port/db`.
    pub fn open(volume: &str, base_dir: &Path) -> Result<CheckedVolume, VolumeError> {
        let paths = VolumePaths::resolve(volume, base_dir)?;
        let meta = baton_meta::open(&paths.meta_url).map_err(|cause| VolumeError::MetaOpen {
            volume: paths.display.clone(),
            cause: Box::new(cause),
        })?;
        let storage_url = meta.volume().storage_url;
        // Listing and deleting need no key; sizes of encoded objects are
        // not block sizes (see `check`).
        let store =
            BlockStore::open_undecoded(&storage_url).map_err(|cause| VolumeError::Storage {
                volume: paths.display.clone(),
                cause: Box::new(cause),
            })?;
        Ok(CheckedVolume { paths, meta, store })
    }

    /// Compares the block map with the storage listing.
    pub fn check(&self) -> Result<CheckReport, VolumeError> {
        self.check_counting(&CheckProgress::default())
    }

    /// [`CheckedVolume::check`], counting into `progress` as it goes.
    pub fn check_counting(&self, progress: &CheckProgress) -> Result<CheckReport, VolumeError> {
        // Storage first: an object committed after the listing is referenced
        // by then, so it is never taken for garbage.
        let stored = self
            .store
            .list_objects_counting(&progress.listed_objects)
            .map_err(|source| VolumeError::Storage {
                volume: self.paths.display.clone(),
                cause: Box::new(source),
            })?;
        let meta_err = |source| VolumeError::Meta {
            volume: self.paths.display.clone(),
            cause: Box::new(source),
        };
        let sizes: HashMap<String, u64> = stored
            .iter()
            .map(|o| (o.key.to_string(), o.size_bytes))
            .collect();
        let mut report = CheckReport {
            stored_count: stored.len() as u64,
            stored_bytes: stored.iter().map(|o| o.size_bytes).sum(),
            orphan_count: self.meta.orphans().map_err(meta_err)?.len() as u64,
            ..CheckReport::default()
        };
        let encoded = !baton_blocks::CodecSpec::split_url(&self.meta.volume().storage_url)
            .map(|(_, spec)| spec.is_plain())
            .unwrap_or(true);
        // Rows naming each object: more than one is a shared block.
        let mut referenced: HashMap<String, u32> = HashMap::new();
        let mut after = None;
        loop {
            let page = self
                .meta
                .scan_blocks(after, SCAN_PAGE_ROWS_MAX)
                .map_err(meta_err)?;
            let Some((ino, last)) = page.last() else {
                break;
            };
            after = Some((*ino, last.index));
            progress
                .scanned_blocks
                .fetch_add(page.len() as u64, Ordering::Relaxed);
            for (ino, row) in page {
                report.referenced_count += 1;
                if row.is_inline() {
                    report.inline_count += 1;
                    // The bytes are in the row: present, and (unless
                    // encoded) at least the row's length of them.
                    let stored_bytes = row.inline.as_ref().map(|d| d.len() as u64);
                    if stored_bytes.is_none_or(|size| !encoded && size < u64::from(row.len)) {
                        report.bad_blocks.push(BadBlock {
                            ino,
                            index: row.index,
                            key: row.object_key,
                            len_bytes: u64::from(row.len),
                            stored_bytes,
                        });
                    }
                    continue;
                }
                let stored_bytes = sizes.get(&row.object_key).copied();
                let short = |size: u64| !encoded && size < u64::from(row.len);
                if stored_bytes.is_none_or(short) {
                    report.bad_blocks.push(BadBlock {
                        ino,
                        index: row.index,
                        key: row.object_key.clone(),
                        len_bytes: u64::from(row.len),
                        stored_bytes,
                    });
                }
                *referenced.entry(row.object_key).or_default() += 1;
            }
        }
        report.shared_count = referenced.values().filter(|n| **n > 1).count() as u64;
        report.unreferenced = stored
            .into_iter()
            .filter(|o| !referenced.contains_key(&o.key.to_string()))
            .collect();
        report.bad_acls = self.bad_acls()?;
        progress.recounting_quotas.store(true, Ordering::Relaxed);
        report.quota_drifts = self.recount_quotas(false)?;
        Ok(report)
    }

    /// Every ACL xattr of the volume that `baton_meta::acl::Acl::parse`
    /// refuses (a default ACL on a non-directory is also named).
    pub fn bad_acls(&self) -> Result<Vec<BadAcl>, VolumeError> {
        let meta_err = |source| VolumeError::Meta {
            volume: self.paths.display.clone(),
            cause: Box::new(source),
        };
        let mut bad = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .meta
                .scan_acls(after.clone(), SCAN_PAGE_ROWS_MAX)
                .map_err(meta_err)?;
            let Some((ino, name, _)) = page.last() else {
                break;
            };
            after = Some((*ino, name.clone()));
            for (ino, name, value) in page {
                if let Err(e) = baton_meta::acl::Acl::parse(&value) {
                    bad.push(BadAcl {
                        ino,
                        name: name.to_string_lossy().into_owned(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(bad)
    }

    /// Recounts every directory quota's usage from its tree; with
    /// `repair`, stores the recount (in one transaction: safe while the
    /// volume is mounted). Returns the quotas whose stored usage differed.
    pub fn recount_quotas(
        &self,
        repair: bool,
    ) -> Result<Vec<(std::path::PathBuf, baton_meta::QuotaDrift)>, VolumeError> {
        let meta_err = |source| VolumeError::Meta {
            volume: self.paths.display.clone(),
            cause: Box::new(source),
        };
        let drifts = self.meta.recount_quotas(repair).map_err(meta_err)?;
        drifts
            .into_iter()
            .map(|d| Ok((self.meta.dir_path(d.dir).map_err(meta_err)?, d)))
            .collect()
    }

    /// Takes the volume lock for the lifetime of the returned value, so no
    /// mount of the volume starts on this host meanwhile. A PostgreSQL
    /// volume takes none: mounts on other hosts would not see it, and the
    /// minimum age protects their uploads.
    pub fn lock(&self) -> Result<Option<Flock<File>>, VolumeError> {
        if self.paths.is_shared() {
            return Ok(None);
        }
        match take_lock(&self.paths, LockMode::Exclusive) {
            Ok(held) => Ok(Some(held)),
            Err(VolumeError::AlreadyMounted { volume, path, .. }) => {
                Err(VolumeError::Mounted { volume, lock: path })
            }
            Err(other) => Err(other),
        }
    }
}

/// The unreferenced objects gc may delete: older than `min_age` at `now`.
/// Pure.
pub fn collectable(
    unreferenced: &[StoredObject],
    min_age: Duration,
    now: SystemTime,
) -> Vec<ObjectKey> {
    unreferenced
        .iter()
        .filter(|o| {
            now.duration_since(o.last_modified)
                .is_ok_and(|age| age >= min_age)
        })
        .map(|o| o.key.clone())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_objects_older_than_the_minimum_age_are_collectable() {
        let now = SystemTime::now();
        let object = |secs_ago: u64, index: u64| StoredObject {
            key: ObjectKey::generate(9, index, baton_blocks::KeyLayout::Fanned),
            size_bytes: 1,
            last_modified: now - Duration::from_secs(secs_ago),
        };
        let objects = vec![object(10, 0), object(7200, 1), object(3600, 2)];
        let picked = collectable(&objects, Duration::from_secs(3600), now);
        assert_eq!(picked, vec![objects[1].key.clone(), objects[2].key.clone()]);
        assert_eq!(collectable(&objects, Duration::ZERO, now).len(), 3);
        // A clock step backwards (object "from the future") is kept.
        let future = StoredObject {
            last_modified: now + Duration::from_secs(60),
            ..object(0, 3)
        };
        assert!(collectable(&[future], Duration::ZERO, now).is_empty());
    }
}
