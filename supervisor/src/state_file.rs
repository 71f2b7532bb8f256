//! The supervisor's state directory: `mounts/<id>.json` (one
//! [`MountRecord`] per mount, written atomically), `run/<id>.sock` (the
//! socket generations of a mount connect to) and `logs/<id>.log` (the
//! generations' stdout and stderr). Created 0700: the sockets hand out the
//! /dev/fuse fd.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use upgrade_protocol::{decode_record, encode_record, MountRecord};

use crate::Error;

/// The layout of the state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Creates `root` and its subdirectories (mode 0700).
    pub fn create(root: &Path) -> Result<StateDir, Error> {
        for dir in [
            root.to_path_buf(),
            root.join("mounts"),
            root.join("run"),
            root.join("logs"),
        ] {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(Error::io("creating", &dir))?;
        }
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `mounts/<id>.json`.
    pub fn record_path(&self, mount_id: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{mount_id}.json"))
    }

    /// `run/`: sockets, and the handover files of upgrades under way.
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// `run/<id>.sock`.
    pub fn socket_path(&self, mount_id: &str) -> PathBuf {
        StateDir::socket_path_in(&self.root, mount_id)
    }

    /// [`StateDir::socket_path`] of a state directory at `root`.
    pub fn socket_path_in(root: &Path, mount_id: &str) -> PathBuf {
        root.join("run").join(format!("{mount_id}.sock"))
    }

    /// `run/<id>.locks`: the locks held on the mount, kept by its serving
    /// generation for a successor after a crash.
    pub fn held_locks_path(&self, mount_id: &str) -> PathBuf {
        self.root.join("run").join(format!("{mount_id}.locks"))
    }

    /// `logs/<id>.log`.
    pub fn log_path(&self, mount_id: &str) -> PathBuf {
        self.root.join("logs").join(format!("{mount_id}.log"))
    }

    /// Writes a record atomically (temp file, fsync, rename).
    pub fn write_record(&self, record: &MountRecord) -> Result<(), Error> {
        let path = self.record_path(&record.mount_id);
        let tmp = path.with_extension("json.tmp");
        let bytes = encode_record(record).map_err(|err| Error::Io {
            op: "encoding",
            path: path.clone(),
            source: std::io::Error::other(err),
        })?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(Error::io("creating", &tmp))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(Error::io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(Error::io("renaming into", &path))
    }

    /// Removes a record (gone already is fine).
    pub fn remove_record(&self, mount_id: &str) -> Result<(), Error> {
        let path = self.record_path(mount_id);
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
                op: "removing",
                path,
                source: err,
            }),
            _ => Ok(()),
        }
    }

    /// Every record left in `mounts/` (by a supervisor that did not unmount).
    pub fn leftover_records(&self) -> Vec<(PathBuf, Result<MountRecord, String>)> {
        let Ok(entries) = std::fs::read_dir(self.root.join("mounts")) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| {
                let record = std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| decode_record(&b).map_err(|e| e.to_string()));
                (p, record)
            })
            .collect()
    }

    /// Opens (truncating) the log of a mount, close-on-exec.
    pub fn open_log(&self, mount_id: &str) -> Result<File, Error> {
        let path = self.log_path(mount_id);
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .and_then(|f| f.set_len(0).map(|()| f))
            .map_err(Error::io("opening", &path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upgrade_protocol::{ClientOptions, NegotiatedInit, RECORD_FORMAT_VERSION};

    #[test]
    fn records_are_written_atomically_listed_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(&dir.path().join("state")).unwrap();
        let record = MountRecord {
            format_version: RECORD_FORMAT_VERSION,
            mount_id: "abc".into(),
            mountpoint: "/mnt/x".into(),
            volume: "v".into(),
            base_dir: "/b".into(),
            options: ClientOptions::default(),
            connection_id: 40,
            connection_identity: 9,
            client_binary: None,
            init: NegotiatedInit {
                major: 7,
                minor: 45,
                kernel_minor: 45,
                flags: 1 << 39,
                max_readahead: 1,
                max_write: 2,
                max_pages: 3,
                max_background: 4,
                congestion_threshold: 5,
                time_gran: 1,
            },
            has_resend: true,
            supervisor_pid: 1,
            generation: 1,
            pid: None,
            created_unix_ms: 0,
            persistent: true,
            history: None,
        };
        state.write_record(&record).unwrap();
        let left = state.leftover_records();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].1.as_ref().unwrap(), &record);
        state.remove_record("abc").unwrap();
        state.remove_record("abc").unwrap();
        assert!(state.leftover_records().is_empty());
    }
}
