//! Writing one block object straight into a local-directory store
//! (`file://DIR`), on the caller's thread.
//!
//! `object_store`'s `LocalFileSystem` runs every put on a blocking thread
//! of the store's runtime (two thread hand-offs), tries the open before
//! creating the inode's directory, and stats the file for an ETag Baton
//! does not use. For a small file that was a large share of its FLUSH;
//! this writes the same file the same way (a temp file named
//! `{path}#{digits}`, which `LocalFileSystem` lists skip as an upload in
//! progress, renamed into place) with none of that. Like `LocalFileSystem`,
//! it does not fsync: a close need not reach the disk. An fsync does, and
//! [`sync_files`] is its part: the objects' data and the directory entries
//! that name them (the contract in `fsclient`'s flush module).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{BlocksError, Result};
use crate::key::ObjectKey;
use crate::private_fs;

/// Writes `data` as object `key` under `root`.
pub(crate) fn put_file(root: &Path, key: &ObjectKey, data: &[u8]) -> Result<()> {
    let path = root.join(key.to_string());
    let mut tmp = OsString::from(path.as_os_str());
    tmp.push(format!("#{}", rand::random::<u32>()));
    let tmp = PathBuf::from(tmp);
    let written = create_new(&tmp)
        .and_then(|mut file| file.write_all(data))
        .and_then(|()| fs::rename(&tmp, &path));
    written.map_err(|source| {
        let _ = fs::remove_file(&tmp);
        BlocksError::ObjectFileWrite { path, source }
    })
}

/// Creates `path` (which must not exist), and its directory if missing.
fn create_new(path: &Path) -> io::Result<File> {
    match private_fs::create_new(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                private_fs::create_dir_all(dir)?;
            }
            private_fs::create_new(path)
        }
        other => other,
    }
}

/// Makes objects `keys` under `root` durable against power loss: each
/// file's data (fdatasync), then every directory from its parent up to
/// `root` (fsync: the rename that named it, the mkdir that made its
/// directory), each directory once. An object already deleted is skipped
/// (a later commit released it; nothing names it).
pub(crate) fn sync_files(root: &Path, keys: &[ObjectKey]) -> Result<()> {
    let mut dirs = BTreeSet::new();
    for key in keys {
        let path = root.join(key.to_string());
        match File::open(&path).and_then(|file| file.sync_data()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(BlocksError::ObjectFileWrite { path, source }),
        }
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(root)) {
            if !dirs.insert(d.to_path_buf()) {
                break;
            }
            dir = d.parent();
        }
    }
    for dir in dirs {
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| BlocksError::ObjectFileWrite { path: dir, source })?;
    }
    Ok(())
}
