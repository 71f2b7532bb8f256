//! One supervisor per state directory: an exclusive `flock` on
//! `supervisor.lock`, held for the life of the process.
//!
//! Every supervisor restores the mounts recorded in its state directory
//! and binds their generation sockets (`run/<id>.sock`). A second
//! supervisor started on the same directory (say `fsctl up` with another
//! `--socket`) used to do exactly that to mounts the first one still
//! served: it took the first one's serving generation away from it and
//! started its own, and the first one went on restarting generations that
//! could not open the volume. Now the second one refuses to start, naming
//! the holder's pid and socket.
//!
//! The lock file is close-on-exec, so no generation inherits it, and the
//! lock goes with the process however it ends. Two hand-offs keep a
//! supervisor that already holds mounts from refusing: a successor
//! (`succession.rs`) takes the lock once its predecessor has exited, and
//! an in-place re-exec (`reexec.rs`) takes it again at start. Both wait
//! for it on a thread of their own, never on the event loop, and serve
//! meanwhile.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::state_file::StateDir;
use crate::Error;

/// The claim, kept until the process exits (it has no other owner).
static HELD: OnceLock<Flock<File>> = OnceLock::new();

/// `supervisor.lock` of the state directory.
pub fn lock_path(state: &StateDir) -> PathBuf {
    state.root().join("supervisor.lock")
}

/// Claims `state` for this supervisor, whose control socket is `socket`,
/// or fails with [`Error::StateDirInUse`] if another process holds it.
pub fn claim(state: &StateDir, socket: &Path) -> Result<(), Error> {
    let path = lock_path(state);
    let file = open(&path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => hold(lock, &path, socket),
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            Err(Error::StateDirInUse {
                dir: state.root().to_path_buf(),
                holder: describe(&holder),
            })
        }
        Err((_, errno)) => Err(Error::Sys {
            op: format!("flock {}", path.display()),
            errno,
        }),
    }
}

/// Claims `state` once whoever holds it lets go, waiting on a thread of
/// its own: for a supervisor that already holds mounts (a successor whose
/// predecessor is exiting, an image re-executed in place).
pub fn claim_when_free(state: &StateDir, socket: &Path) {
    if claim(state, socket).is_ok() {
        return;
    }
    let path = lock_path(state);
    let socket = socket.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("state-dir-claim".into())
        .spawn(move || {
            let claimed = open(&path).and_then(|file| {
                Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| Error::Sys {
                    op: format!("flock {}", path.display()),
                    errno,
                })
            });
            match claimed.and_then(|lock| hold(lock, &path, &socket)) {
                Ok(()) => tracing::info!(lock = %path.display(), "state directory claimed"),
                Err(err) => tracing::warn!(%err, "state directory not claimed"),
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(%err, "cannot start the thread that claims the state directory");
    }
}

/// The control socket the supervisor holding `state` recorded, if one
/// holds it now (a successor finds its predecessor by the state directory
/// it shares, whatever socket path either was given: a DaemonSet whose
/// `--socket` changed between releases). `None` if the lock is free
/// (taken for an instant and let go) or names no socket.
pub fn holder_socket(state: &StateDir) -> Option<PathBuf> {
    let file = open(&lock_path(state)).ok()?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_free) => None,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            file.read_to_string(&mut holder).ok()?;
            recorded_socket(&holder)
        }
        Err(_) => None,
    }
}

/// The socket in a holder line (`pid N, socket PATH`). Pure.
fn recorded_socket(holder: &str) -> Option<PathBuf> {
    let (_, socket) = holder.trim_end_matches('\n').split_once(", socket ")?;
    (!socket.is_empty()).then(|| PathBuf::from(socket))
}

fn open(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io("opening", path))
}

/// Records who holds the lock (for the error another supervisor gets) and
/// keeps it.
fn hold(mut lock: Flock<File>, path: &Path, socket: &Path) -> Result<(), Error> {
    let holder = format!("pid {}, socket {}\n", std::process::id(), socket.display());
    lock.set_len(0)
        .and_then(|()| lock.rewind())
        .and_then(|()| lock.write_all(holder.as_bytes()))
        .map_err(Error::io("writing", path))?;
    // A second claim in one process (not made today) keeps the first.
    let _ = HELD.set(lock);
    Ok(())
}

fn describe(holder: &str) -> String {
    match holder.trim() {
        "" => "another fs-supervisor".to_string(),
        said => format!("fs-supervisor ({said})"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_state_directory_is_refused_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let path = lock_path(&state);
        // Another process's claim, as flock sees it: another open file.
        let mut other = Flock::lock(open(&path).unwrap(), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        other
            .write_all(b"pid 4242, socket /run/other.sock\n")
            .unwrap();
        let err = claim(&state, Path::new("/run/mine.sock")).unwrap_err();
        let said = err.to_string();
        assert!(matches!(err, Error::StateDirInUse { .. }), "{said}");
        assert!(
            said.contains("pid 4242") && said.contains("/run/other.sock"),
            "{said}"
        );
        assert_eq!(
            holder_socket(&state),
            Some(PathBuf::from("/run/other.sock")),
            "a successor finds its predecessor's socket through the lock"
        );
        drop(other);
        assert_eq!(holder_socket(&state), None, "a free lock has no holder");
        claim(&state, Path::new("/run/mine.sock")).unwrap();
        let recorded = std::fs::read_to_string(&path).unwrap();
        assert!(recorded.contains(&format!("pid {}", std::process::id())));
        assert_eq!(
            recorded_socket(&recorded),
            Some(PathBuf::from("/run/mine.sock"))
        );
        assert_eq!(recorded_socket("pid 1\n"), None);
    }
}
