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
//! it does not fsync: the contract in `fsclient`'s flush module says why.

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
