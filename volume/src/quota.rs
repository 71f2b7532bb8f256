//! `fsctl quota`: directory quotas of a volume, through its metadata only
//! ([`QuotaVolume`]). Works while the volume is mounted, on this host or
//! others: each change is one metadata transaction, and every mount reads
//! the limits in the transaction of each change it makes, so a new or
//! changed limit applies to the next call that counts against it.

use std::path::{Component, Path, PathBuf};

use baton_meta::{MetaStore, Quota, ROOT_INO};

use crate::{VolumeError, VolumePaths};

/// A quota with the path of its directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaEntry {
    /// The directory's path from the volume's root (`/` for the root).
    pub path: PathBuf,
    /// Limits and usage.
    pub quota: Quota,
}

/// A volume opened for its quotas: metadata only, no lock, no storage.
#[derive(Debug)]
pub struct QuotaVolume {
    /// Where its files are.
    pub paths: VolumePaths,
    meta: Box<dyn MetaStore>,
}

impl QuotaVolume {
    /// Opens the metadata of `volume` (a name under `base_dir`,
    /// `sqlite:///path/meta.db` or `postgres://...`).
    pub fn open(volume: &str, base_dir: &Path) -> Result<QuotaVolume, VolumeError> {
        let paths = VolumePaths::resolve(volume, base_dir)?;
        let meta = baton_meta::open(&paths.meta_url).map_err(|cause| VolumeError::MetaOpen {
            volume: paths.display.clone(),
            cause: Box::new(cause),
        })?;
        Ok(QuotaVolume { paths, meta })
    }

    fn meta_err(&self, cause: baton_meta::MetaError) -> VolumeError {
        VolumeError::Meta {
            volume: self.paths.display.clone(),
            cause: Box::new(cause),
        }
    }

    /// The inode of the directory at `path` from the volume's root
    /// (`/a/b`, `a/b` or `/`).
    pub fn resolve(&self, path: &Path) -> Result<u64, VolumeError> {
        let mut ino = ROOT_INO;
        for part in path.components() {
            match part {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(name) => {
                    ino = self
                        .meta
                        .lookup(ino, name)
                        .map_err(|e| self.meta_err(e))?
                        .ino;
                }
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(self.meta_err(baton_meta::MetaError::InvalidArgument {
                        ino,
                        reason: format!(
                            "path {} has `..`: give the path from the volume's root",
                            path.display()
                        ),
                    }))
                }
            }
        }
        Ok(ino)
    }

    fn entry(&self, quota: Quota) -> Result<QuotaEntry, VolumeError> {
        let path = self
            .meta
            .dir_path(quota.dir)
            .map_err(|e| self.meta_err(e))?;
        Ok(QuotaEntry { path, quota })
    }

    /// Sets the limits of the quota on directory `dir` (a new quota counts
    /// the tree under it first).
    pub fn set(
        &self,
        dir: u64,
        bytes_max: Option<u64>,
        inodes_max: Option<u64>,
    ) -> Result<QuotaEntry, VolumeError> {
        let q = self
            .meta
            .set_quota(dir, bytes_max, inodes_max)
            .map_err(|e| self.meta_err(e))?;
        tracing::info!(volume = %self.paths.display, nodeid = dir, ?bytes_max, ?inodes_max, "quota set");
        self.entry(q)
    }

    /// The quota on `dir`, if any.
    pub fn get(&self, dir: u64) -> Result<Option<QuotaEntry>, VolumeError> {
        match self.meta.quota(dir).map_err(|e| self.meta_err(e))? {
            Some(q) => self.entry(q).map(Some),
            None => Ok(None),
        }
    }

    /// Every quota of the volume.
    pub fn list(&self) -> Result<Vec<QuotaEntry>, VolumeError> {
        let quotas = self.meta.quotas().map_err(|e| self.meta_err(e))?;
        quotas.into_iter().map(|q| self.entry(q)).collect()
    }

    /// Removes the quota on `dir`; `false` if it had none.
    pub fn remove(&self, dir: u64) -> Result<bool, VolumeError> {
        self.meta.remove_quota(dir).map_err(|e| self.meta_err(e))
    }
}
