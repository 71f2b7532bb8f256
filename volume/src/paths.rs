//! Where a volume's files are, from its volume string and the base
//! directory: the metadata URL, this host's directory of the volume
//! (defaults of staging and cache), and the lock file.

use std::path::{Path, PathBuf};

use upgrade_protocol::VolumeSpec;

use crate::VolumeError;

/// Where Baton keeps named volumes, and the local state of shared ones,
/// unless told otherwise.
pub const DEFAULT_BASE_DIR: &str = "/var/lib/baton";

/// Where a volume's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePaths {
    /// The volume string, parsed.
    pub spec: VolumeSpec,
    /// The volume for messages (a URL's password masked).
    pub display: String,
    /// The URL the metadata engine opens.
    pub meta_url: String,
    /// The SQLite metadata file; `None` for a PostgreSQL volume.
    pub sqlite_path: Option<PathBuf>,
    /// This host's directory of the volume: staging and cache default to
    /// it; for a shared volume (PostgreSQL) it is the mount's local state.
    pub dir: PathBuf,
}

impl VolumePaths {
    /// Resolves `volume` (a name, `sqlite:///path/meta.db` or
    /// `postgres://user@host:port/DB`) under `base_dir`.
    pub fn resolve(volume: &str, base_dir: &Path) -> Result<VolumePaths, VolumeError> {
        Ok(VolumePaths::of(VolumeSpec::parse(volume)?, base_dir))
    }

    /// The paths of volume `name` under `base_dir`, refusing anything but a
    /// volume name (`fsctl format`, `fsctl up`).
    pub fn named(name: &str, base_dir: &Path) -> Result<VolumePaths, VolumeError> {
        match VolumeSpec::parse(name) {
            Ok(spec @ VolumeSpec::Named(_)) => Ok(VolumePaths::of(spec, base_dir)),
            _ => Err(VolumeError::InvalidName {
                name: name.to_string(),
            }),
        }
    }

    /// The paths of an already parsed volume string.
    pub fn of(spec: VolumeSpec, base_dir: &Path) -> VolumePaths {
        VolumePaths {
            display: spec.display(),
            meta_url: spec.meta_url(base_dir),
            sqlite_path: spec.sqlite_path(base_dir),
            dir: spec.local_dir(base_dir),
            spec,
        }
    }

    /// Other hosts may serve the volume too (its metadata is PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.spec.is_shared()
    }

    /// The lock that makes this host's mount of the volume the only one:
    /// next to the SQLite file, or in a shared volume's local directory.
    pub fn lock_path(&self) -> PathBuf {
        match &self.sqlite_path {
            Some(path) => {
                let mut name = path.as_os_str().to_owned();
                name.push(".lock");
                PathBuf::from(name)
            }
            None => self.dir.join("mount.lock"),
        }
    }

    /// Where a new volume's objects go unless told otherwise.
    pub fn default_storage_url(&self) -> String {
        format!("file://{}", self.dir.join("data").display())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_under_the_base_dir_and_urls_to_their_file() {
        let p = VolumePaths::resolve("vol", Path::new("/b")).unwrap();
        assert_eq!(p.sqlite_path, Some(PathBuf::from("/b/vol/meta.db")));
        assert_eq!(p.dir, PathBuf::from("/b/vol"));
        assert_eq!(p.lock_path(), PathBuf::from("/b/vol/meta.db.lock"));
        assert_eq!(p.default_storage_url(), "file:///b/vol/data");
        let u = VolumePaths::resolve("sqlite:///x/y/meta.db", Path::new("/b")).unwrap();
        assert_eq!(u.sqlite_path, Some(PathBuf::from("/x/y/meta.db")));
        assert_eq!(u.dir, PathBuf::from("/x/y"));
        let pg = VolumePaths::resolve("postgres://u:pw@h:5432/vol_1", Path::new("/b")).unwrap();
        assert_eq!(pg.dir, PathBuf::from("/b/pg-vol_1"));
        assert_eq!(pg.lock_path(), PathBuf::from("/b/pg-vol_1/mount.lock"));
        assert_eq!(pg.display, "postgres://u:***@h:5432/vol_1");
        assert!(pg.is_shared());
    }

    #[test]
    fn bad_volume_arguments_are_refused() {
        for bad in [
            "",
            "a/b",
            "..",
            "postgres://h",
            "mysql://h/db",
            "sqlite://rel/x.db",
        ] {
            let err = VolumePaths::resolve(bad, Path::new("/b")).unwrap_err();
            assert!(matches!(err, VolumeError::BadVolume(_)), "{bad}: {err}");
        }
        for not_a_name in ["sqlite:///x/meta.db", "postgres://h/db", "a/b", ""] {
            let err = VolumePaths::named(not_a_name, Path::new("/b")).unwrap_err();
            assert!(matches!(err, VolumeError::InvalidName { .. }), "{err}");
        }
        assert!(VolumePaths::named("vol", Path::new("/b")).is_ok());
    }
}
