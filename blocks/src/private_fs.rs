//! Files and directories only their owner can read: everything Baton
//! creates on the host (volume directories, metadata, block objects, the
//! block cache, staging) holds file data, and an encrypted volume's cache
//! holds it decrypted. Directories are made 0700 and files 0600 whatever the
//! process umask; an operator who wants others to read them changes the mode
//! of the top directory. Existing paths keep their modes.
//!
//! The explicit modes cover Baton's own code; [`set_private_umask`] covers
//! what libraries create for it (object_store's local directory store writes
//! its objects and directories with the process umask).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Mode of a directory Baton creates.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of a file Baton creates.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Sets the process umask to 077, so that whatever this process creates on
/// the host is owner-only. For binaries that create only Baton's own files
/// (fsclient, fsctl); a directory meant for everyone (a mountpoint's
/// parents) is then given its mode explicitly.
pub fn set_private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// `mkdir -p` with mode 0700 for every directory it creates.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(path)
}

/// Creates or truncates `path` for writing, mode 0600 if it is new.
pub fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
}

/// Creates `path`, which must not exist, for writing, mode 0600.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn new_directories_and_files_are_owner_only_and_old_ones_keep_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(d)), 0o700, "{d}");
        }
        assert_eq!(mode(dir.path()), 0o755, "an existing directory changed");
        create(&deep.join("f")).unwrap();
        create_new(&deep.join("g")).unwrap();
        assert_eq!(mode(&deep.join("f")), 0o600);
        assert_eq!(mode(&deep.join("g")), 0o600);
        assert_eq!(
            create_new(&deep.join("g")).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }
}
