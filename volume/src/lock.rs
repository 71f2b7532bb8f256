//! The volume lock: one mount of a volume per host (a `flock` on
//! [`VolumePaths::lock_path`], held for the process's life), and gc's
//! exclusion of mounts.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;

use baton_blocks::private_fs;
use nix::fcntl::{Flock, FlockArg};

use crate::{VolumeError, VolumePaths};

/// Who else may hold the volume lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// `fsclient mount`, `fsctl gc`: the only holder of the volume on this
    /// host.
    Exclusive,
    /// `fsclient serve`: generations of one supervisor may overlap during a
    /// planned upgrade, but a `mount` of the same volume is refused.
    Shared,
}

/// Takes the volume lock; a conflict names the pid recorded in the file.
pub(crate) fn take_lock(paths: &VolumePaths, mode: LockMode) -> Result<Flock<File>, VolumeError> {
    let path = paths.lock_path();
    let io_err = |cause| VolumeError::Lock {
        volume: paths.display.clone(),
        path: path.clone(),
        cause,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(private_fs::PRIVATE_FILE_MODE)
        .open(&path)
        .map_err(io_err)?;
    let arg = match mode {
        LockMode::Exclusive => FlockArg::LockExclusiveNonblock,
        LockMode::Shared => FlockArg::LockSharedNonblock,
    };
    match Flock::lock(file, arg) {
        Ok(mut locked) => {
            let pid = std::process::id().to_string();
            let written = locked
                .set_len(0)
                .and_then(|()| locked.rewind())
                .and_then(|()| locked.write_all(pid.as_bytes()));
            written.map_err(io_err)?;
            Ok(locked)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            Err(VolumeError::AlreadyMounted {
                volume: paths.display.clone(),
                pid: text.trim().parse().unwrap_or(0),
                path: path.clone(),
            })
        }
        Err((_, errno)) => Err(io_err(std::io::Error::from(errno))),
    }
}
