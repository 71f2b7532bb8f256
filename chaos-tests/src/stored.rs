//! What a local-directory object store holds, as tests look at it from
//! outside.

use std::path::{Path, PathBuf};

/// The block object files of inode `ino` in the store at `data_dir`, in
/// either key layout (`blocks/{ino}/...`, one directory per inode, or
/// `blocks/{fan}/{ino}-...`, shared directories; see `baton_blocks::KeyLayout`).
pub fn object_files(data_dir: &Path, ino: u64) -> Vec<PathBuf> {
    let ino = format!("{ino:016x}");
    let fanned_prefix = format!("{ino}-");
    let mut out = Vec::new();
    let dirs = std::fs::read_dir(data_dir.join("blocks"));
    for dir in dirs.into_iter().flatten().flatten() {
        let per_inode = dir.file_name().to_str() == Some(ino.as_str());
        for file in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = file.file_name();
            if per_inode || name.to_str().is_some_and(|n| n.starts_with(&fanned_prefix)) {
                out.push(file.path());
            }
        }
    }
    out.sort();
    out
}
