//! What a volume's staging area holds, as tests look at it from outside.

use std::path::Path;

/// Inodes with data staged under `staging_dir`: inode directories (16 hex
/// digits) holding a file. A flush leaves an emptied directory for the
/// timer thread to retire, and `retired/` holds only what is being removed,
/// so neither counts.
pub fn staged_inodes(staging_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(staging_dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.len() == 16) && p.is_dir())
        .filter(|p| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()))
        .count()
}
