//! The held locks on local disk, so that they survive a crash of the
//! generation. flock and POSIX locks of a FUSE filesystem live in the
//! server (here: the [`LockTable`]); the processes holding them live on
//! through a kill -9 or an OOM kill of the generation, and a successor
//! that forgot them would grant a conflicting lock to the next caller.
//!
//! The serving generation rewrites the file (temp + rename, no fsync: a
//! crash of the process, not of the machine, is what it covers; after a
//! reboot no lock survives anyway) whenever the held locks change, under
//! the table's mutex so writes happen in the order of the changes. A
//! generation that takes over after a crash loads it before serving. A
//! planned upgrade hands the locks over in its state instead, and the new
//! generation rewrites the file as soon as it imports them.
//!
//! The supervisor names the file per mount (`BATON_HELD_LOCKS_FILE`); an
//! fsclient without it (a self-mount) keeps locks in memory only. The file
//! records the connection identity: one left by an earlier mount of the
//! same mountpoint holds nothing for this connection.

use std::io::Write;
use std::path::{Path, PathBuf};

use upgrade_protocol::{HeldLocks, LockState};

use crate::locks::{HeldLock, LockKind, LockTable, LockType};

/// The environment variable the supervisor sets to the file's path.
pub const HELD_LOCKS_FILE_ENV: &str = "BATON_HELD_LOCKS_FILE";

/// Where the held locks of this mount are kept.
#[derive(Debug)]
pub struct HeldLocksFile {
    path: PathBuf,
}

impl HeldLocksFile {
    /// The file named by [`HELD_LOCKS_FILE_ENV`], if set.
    pub fn from_env() -> Option<HeldLocksFile> {
        let path = std::env::var_os(HELD_LOCKS_FILE_ENV)?;
        Some(HeldLocksFile {
            path: PathBuf::from(path),
        })
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file with the held locks of `table` on the connection
    /// whose random identity is `connection_identity`.
    pub fn write<W>(&self, connection_identity: u64, table: &LockTable<W>) -> std::io::Result<()> {
        let record = HeldLocks {
            connection_identity,
            locks: lock_states(table),
        };
        let bytes = record.encode().map_err(std::io::Error::other)?;
        let mut temp = self.path.as_os_str().to_owned();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut file = baton_blocks::private_fs::create(&temp)?;
        file.write_all(&bytes)?;
        drop(file);
        std::fs::rename(&temp, &self.path)
    }

    /// The locks held on the connection `connection_identity`: none when
    /// the file is missing or was left by another connection. A damaged
    /// file is an error (the caller logs it: nothing better than no locks
    /// can be done).
    pub fn read(&self, connection_identity: u64) -> Result<Vec<LockState>, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(format!("reading {}: {err}", self.path.display())),
        };
        let record =
            HeldLocks::decode(&bytes).map_err(|err| format!("{}: {err}", self.path.display()))?;
        if record.connection_identity != connection_identity {
            return Ok(Vec::new());
        }
        Ok(record.locks)
    }
}

/// The held locks of `table` in their wire form. Pure.
pub fn lock_states<W>(table: &LockTable<W>) -> Vec<LockState> {
    table
        .held_locks()
        .into_iter()
        .map(|(ino, kind, l)| LockState {
            ino,
            owner: l.owner,
            start: l.start,
            end: l.end,
            kind: match l.typ {
                LockType::Read => libc::F_RDLCK as u32,
                LockType::Write => libc::F_WRLCK as u32,
            },
            pid: l.pid,
            flock: kind == LockKind::Flock,
        })
        .collect()
}

/// The table's form of wire locks. Pure.
pub fn held_from_states(states: &[LockState]) -> Vec<(u64, LockKind, HeldLock)> {
    states
        .iter()
        .map(|l| {
            let kind = if l.flock {
                LockKind::Flock
            } else {
                LockKind::Posix
            };
            let typ = if l.kind == libc::F_RDLCK as u32 {
                LockType::Read
            } else {
                LockType::Write
            };
            let held = HeldLock {
                owner: l.owner,
                start: l.start,
                end: l.end,
                typ,
                pid: l.pid,
            };
            (l.ino, kind, held)
        })
        .collect()
}
