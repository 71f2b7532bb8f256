//! Staged files after a power cut: which boot wrote them.
//!
//! Staged files are written without a sync: a kill -9 keeps them (the page
//! cache outlives the process), a power cut or a kernel crash does not. On
//! ext4 after a power cut a staged block file can be there at length 0 and
//! a size record empty: applied, they would replace committed (even
//! fsynced) data with zeros, and an empty record made the area refuse to
//! open. What FSYNC promised is in committed objects and metadata, never in
//! staging alone (`fsclient`'s flush contract), so what a crashed boot
//! left staged is nothing anyone was promised, and maybe torn.
//!
//! `staging_dir/BOOT` says whose staged files these are:
//! - `boot {id}\n`: a process of boot `id` (`/proc/sys/kernel/random/boot_id`)
//!   may have written them unsynced. Written, durably, by the first
//!   [`Staging::open`] of a boot, before that process stages anything.
//! - `synced\n`: every staged file was synced by the last process, as it
//!   ended with its mount gone ([`Staging::mark_synced`]).
//! - missing: a new area, or one an older build wrote (trusted, as before).
//!
//! An area opened in another boot than its `BOOT` names has its inode
//! directories moved, whole and unread, into `unsynced-{id}/` beside them
//! (the area then starts empty; the warning names the directory). Any
//! other `BOOT` content counts as another boot.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::io::{fsync_path, replace_durable};
use super::*;

const BOOT_FILE: &str = "BOOT";
const SYNCED: &str = "synced\n";
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

fn boot_line(id: &str) -> String {
    format!("boot {id}\n")
}

impl Staging {
    /// Sets aside what another boot left staged, and marks the area as
    /// this boot's (module docs). Runs in [`Staging::open`].
    pub(super) fn check_boot(&self) -> Result<()> {
        let id = fs::read_to_string(BOOT_ID_PATH)
            .map_err(|e| self.err("read boot id", Path::new(BOOT_ID_PATH), e))?;
        let this_boot = boot_line(id.trim());
        let path = self.dir.join(BOOT_FILE);
        match fs::read_to_string(&path) {
            Ok(mark) if mark == this_boot => return Ok(()),
            Ok(mark) if mark == SYNCED => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(mark) => {
                let earlier = mark
                    .strip_prefix("boot ")
                    .map(str::trim)
                    .filter(|id| {
                        !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
                    })
                    .unwrap_or("unknown");
                self.set_aside(&self.dir.join(format!("unsynced-{earlier}")))?;
            }
            Err(e) => return Err(self.err("read boot mark", &path, e)),
        }
        self.write_mark(&this_boot)
    }

    /// Syncs every staged file and marks the area `synced`, so that what is
    /// left is applied after a reboot. Only for the last process of a
    /// mount that is gone: another process staging after this would write
    /// under a `synced` mark.
    pub fn mark_synced(&self) -> Result<()> {
        for ino in self.inode_dirs()? {
            self.sync(ino)?;
        }
        self.write_mark(SYNCED)
    }

    fn write_mark(&self, mark: &str) -> Result<()> {
        let path = self.dir.join(BOOT_FILE);
        let tmp = self
            .dir
            .join(format!("{BOOT_FILE}.{}{TMP_SUFFIX}", std::process::id()));
        replace_durable(&path, &tmp, mark.as_bytes())
            .map_err(|e| self.err("write boot mark", &path, e))
    }

    /// Moves every inode directory into `aside` (created), unread.
    fn set_aside(&self, aside: &PathBuf) -> Result<()> {
        let inos = self.inode_dirs()?;
        if inos.is_empty() {
            return Ok(());
        }
        private_fs::create_dir_all(aside).map_err(|e| self.err("create dir", aside, e))?;
        let mut moved = 0;
        for ino in inos {
            let from = self.inode_dir(ino);
            // An emptied directory waiting to be retired holds nothing.
            if fs::remove_dir(&from).is_ok() {
                continue;
            }
            match fs::rename(&from, aside.join(format!("{ino:016x}"))) {
                Ok(()) => moved += 1,
                // Another process of this boot opening at once moved it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err("move aside", &from, e)),
            }
        }
        if moved == 0 {
            let _ = fs::remove_dir(aside);
            return Ok(());
        }
        fsync_path(aside).map_err(|e| self.err("fsync", aside, e))?;
        fsync_path(&self.dir).map_err(|e| self.err("fsync", &self.dir, e))?;
        tracing::warn!(
            inodes = moved,
            dir = %aside.display(),
            "staged writes of an earlier boot that ended without syncing them (a power cut or a crash of the machine) are set aside, not applied: they were never fsynced and may be torn; files read as they were last committed. Inspect and delete the directory"
        );
        Ok(())
    }
}
