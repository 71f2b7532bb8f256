//! Names and attributes: lookup, getattr, setattr (incl. truncation through
//! the staging floor), mknod, mkdir, symlink, link, unlink, rmdir, rename,
//! readlink (orphans: `orphans.rs`).
//!
//! Permission checks are the kernel's (`default_permissions`, and POSIX
//! ACLs with POSIX_ACL). With DONT_MASK the kernel leaves the umask to the
//! filesystem: creations pass it on, and baton-meta applies it or, under a
//! directory with a default ACL, inherits the ACL instead (`creation_rules`).
//! Set-group-ID inheritance is baton-meta's. A chmod rewrites the access
//! ACL in its transaction; the kernel forgets its cached ACLs after a
//! SETATTR by itself.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStringExt;

use baton_meta::{
    CreateArgs, FileKind, MetaError, Recorded, RenameFlags, SetAttr, TimeOrNow, Timespec, Unlinked,
    S_ISGID, S_ISUID, S_IXGRP,
};
use fuse_wire::abi::opcode;
use fuse_wire::{AttrOut, EntryOut, Errno, MkdirIn, MknodIn, Request, SetattrIn, SetattrValid};

use super::once::mismatched;
use super::BatonFs;
use crate::error::{Error, Result};

impl BatonFs {
    /// LOOKUP reads the committed bytes (`st_blocks`) with the attributes:
    /// one statement instead of two after each commit.
    ///
    /// A name a directory lacks is a negative entry the kernel keeps as
    /// long as a positive one, on a volume only this mount serves: every
    /// name made later is made through this mount, and the kernel turns
    /// its own negative entry into the new one. Not on a volume shared by
    /// hosts: a file another host made would stay invisible here for the
    /// entry's life (close-to-open).
    pub(super) fn do_lookup(&self, parent: u64, name: &OsStr) -> Result<EntryOut> {
        let token = self.committed_bytes.token();
        let (attr, committed_bytes) = match self.meta.lookup_plus(parent, name) {
            Ok(found) => found,
            Err(MetaError::NotFound { name: Some(_), .. }) if !self.meta.shared_by_hosts() => {
                let (secs, nanos) = self.ttl();
                return Ok(EntryOut {
                    entry_valid: secs,
                    entry_valid_nsec: nanos,
                    ..EntryOut::default()
                });
            }
            Err(err) => return Err(err.into()),
        };
        if attr.kind == FileKind::Regular {
            self.committed_bytes
                .remember(attr.ino, committed_bytes, token);
        }
        self.entry_out_with(&attr, Some(committed_bytes), Some(token))
    }

    /// GETATTR: as LOOKUP, unless the committed bytes are remembered (a
    /// large file's sum over its block rows is then not repeated).
    pub(super) fn do_getattr(&self, ino: u64) -> Result<AttrOut> {
        let token = self.committed_bytes.token();
        if self.committed_bytes.get(ino).is_some() {
            let attr = self.meta.getattr(ino)?;
            return self.attr_out_with(&attr, None, Some(token));
        }
        let (attr, committed_bytes) = self.meta.getattr_plus(ino)?;
        if attr.kind == FileKind::Regular {
            self.committed_bytes.remember(ino, committed_bytes, token);
        }
        self.attr_out_with(&attr, Some(committed_bytes), Some(token))
    }

    pub(super) fn do_setattr(
        &self,
        req: &Request<'_>,
        ino: u64,
        arg: &SetattrIn,
    ) -> Result<AttrOut> {
        self.once(
            req,
            |recorded| match recorded {
                Recorded::SetAttr(attr, _) => self.attr_out(&attr),
                _ => Err(mismatched(
                    ino,
                    "replayed setattr has another kind of record",
                )),
            },
            |key| self.setattr_once(ino, arg, Some(Caller::of(req)), key),
        )
    }

    /// A SETATTR that only sets times (what the kernel sends when a file
    /// written through the writeback cache is closed, or `touch` does):
    /// run again after a death it sets the same times (or "now" once
    /// more), so it needs no exactly-once record.
    ///
    /// With the writeback cache the kernel also sends one after every
    /// UNLINK, to set the ctime the unlink already set (`drop_link`). On a
    /// file that lost its last name and that no handle can reach (none in
    /// this table, and the table is not inherited), nobody can see its
    /// times again before it is reclaimed: that one is answered from a
    /// read, without a metadata transaction.
    pub(super) fn do_setattr_times(&self, ino: u64, arg: &SetattrIn) -> Result<AttrOut> {
        crate::fault::hit(crate::fault::Point::AfterRead, opcode::SETATTR);
        if self.handles.open_count(ino) == 0 && !self.handles.inherited() {
            let attr = self.meta.getattr(ino)?;
            if attr.nlink == 0 {
                return self.attr_out(&attr);
            }
        }
        self.setattr_once(ino, arg, None, None)
    }

    /// `caller`: who asks (a times-only SETATTR, which never kills set-ID
    /// bits, passes none).
    fn setattr_once(
        &self,
        ino: u64,
        arg: &SetattrIn,
        caller: Option<Caller>,
        key: Option<baton_meta::RequestKey>,
    ) -> Result<AttrOut> {
        let valid = arg.valid;
        let mut set = SetAttr::default();
        if valid.contains(SetattrValid::MODE) {
            set.mode = Some(arg.mode);
        }
        if valid.contains(SetattrValid::UID) {
            set.uid = Some(arg.uid);
        }
        if valid.contains(SetattrValid::GID) {
            set.gid = Some(arg.gid);
        }
        set.atime = time_arg(
            valid,
            SetattrValid::ATIME,
            SetattrValid::ATIME_NOW,
            arg.atime,
            arg.atimensec,
        );
        set.mtime = time_arg(
            valid,
            SetattrValid::MTIME,
            SetattrValid::MTIME_NOW,
            arg.mtime,
            arg.mtimensec,
        );
        if valid.contains(SetattrValid::CTIME) {
            set.ctime = Some(Timespec {
                sec: arg.ctime as i64,
                nsec: arg.ctimensec,
            });
        }
        if valid.contains(SetattrValid::KILL_SUIDGID) && set.mode.is_none() {
            let a = self.meta.getattr(ino)?;
            let in_group = || caller.is_some_and(|c| c.in_group(a.gid));
            set.mode = Some(killed_suidgid(a.mode, in_group));
        }
        if valid.contains(SetattrValid::SIZE) {
            self.truncate(ino, arg.size)?;
            if set.mtime.is_none() {
                set.mtime = Some(TimeOrNow::Now);
            }
        }
        let attr = if set == SetAttr::default() {
            self.meta.getattr(ino)?
        } else {
            self.meta.setattr(ino, &set, key)?.0
        };
        self.attr_out(&attr)
    }

    /// Sets the size through staging (the floor protocol): staged blocks
    /// past it are cut, committed data past it reads as zeros, and the next
    /// flush commits it. Flushed at once when no handle has the file open.
    pub(super) fn truncate(&self, ino: u64, size: u64) -> Result<()> {
        self.truncate_open(ino, size, 0)
    }

    /// Truncates; commits at once when at most `handles_max` handles are
    /// open on the inode (else at their flush or release).
    pub(super) fn truncate_open(&self, ino: u64, size: u64, handles_max: u32) -> Result<()> {
        let attr = self.meta.getattr(ino)?;
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => {
                return Err(Error::refused(
                    ino,
                    "truncate of a directory",
                    Errno::EISDIR,
                ))
            }
            _ => {
                return Err(Error::refused(
                    ino,
                    "truncate of a special file",
                    Errno::EINVAL,
                ))
            }
        }
        if size > baton_blocks::FILE_SIZE_BYTES_MAX {
            return Err(Error::refused(
                ino,
                "size past the largest file",
                Errno::EFBIG,
            ));
        }
        self.check_quota_growth(ino, size)?;
        let _guard = self.staging_lock(ino, "truncate")?;
        self.staging.set_size(ino, size)?;
        self.invalidate(ino);
        if self.handles.open_count(ino) <= handles_max {
            self.flush_locked(ino, &[])?;
        }
        Ok(())
    }

    pub(super) fn do_readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Ok(self.meta.readlink(ino)?.into_vec())
    }

    /// Creates a node owned by the caller; `umask` as the request gave it.
    fn create_node(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mut args: CreateArgs,
        umask: u32,
    ) -> Result<EntryOut> {
        let (uid, gid, _) = req.caller();
        args.mode &= 0o7777;
        self.creation_rules(&mut args, umask);
        args.uid = uid;
        args.gid = gid;
        self.once(
            req,
            |recorded| self.entry_from_record(parent, recorded),
            |key| {
                let attr = self.meta.create(parent, name, &args, key)?;
                self.entry_out(&attr)
            },
        )
    }

    /// The entry a replayed create, mknod, mkdir, symlink or link answers.
    fn entry_from_record(&self, nodeid: u64, recorded: Recorded) -> Result<EntryOut> {
        match recorded {
            Recorded::Attr(attr) => self.entry_out(&attr),
            _ => Err(mismatched(
                nodeid,
                "replayed creation has another kind of record",
            )),
        }
    }

    pub(super) fn do_symlink(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<EntryOut> {
        let mut args = CreateArgs::new(FileKind::Symlink, 0o777);
        args.symlink_target = Some(target.to_owned());
        self.create_node(req, parent, name, args, 0)
    }

    pub(super) fn do_mknod(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        arg: &MknodIn,
    ) -> Result<EntryOut> {
        let kind = match arg.mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::Regular,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => {
                return Err(Error::refused(
                    parent,
                    "mknod of an unknown file type",
                    Errno::EINVAL,
                ))
            }
        };
        let rdev = match kind {
            FileKind::CharDevice | FileKind::BlockDevice => arg.rdev,
            _ => 0,
        };
        let mut args = CreateArgs::new(kind, arg.mode);
        args.rdev = rdev;
        self.create_node(req, parent, name, args, arg.umask)
    }

    pub(super) fn do_mkdir(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        arg: &MkdirIn,
    ) -> Result<EntryOut> {
        self.create_node(
            req,
            parent,
            name,
            CreateArgs::new(FileKind::Directory, arg.mode),
            arg.umask,
        )
    }

    pub(super) fn do_unlink(&self, req: &Request<'_>, parent: u64, name: &OsStr) -> Result<()> {
        let gone = self.once(
            req,
            |recorded| unlinked(parent, recorded),
            |key| Ok(self.meta.unlink(parent, name, key)?),
        )?;
        self.lost_name(gone)
    }

    pub(super) fn do_rmdir(&self, req: &Request<'_>, parent: u64, name: &OsStr) -> Result<()> {
        let gone = self.once(
            req,
            |recorded| unlinked(parent, recorded),
            |key| Ok(self.meta.rmdir(parent, name, key)?),
        )?;
        self.lost_name(gone)
    }

    pub(super) fn do_rename(
        &self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: fuse_wire::RenameFlags,
    ) -> Result<()> {
        let supported = fuse_wire::RenameFlags::NOREPLACE | fuse_wire::RenameFlags::EXCHANGE;
        if !supported.contains(flags) || flags == supported {
            return Err(Error::refused(
                parent,
                "unsupported rename flags",
                Errno::EINVAL,
            ));
        }
        let flags = RenameFlags {
            noreplace: flags.contains(fuse_wire::RenameFlags::NOREPLACE),
            exchange: flags.contains(fuse_wire::RenameFlags::EXCHANGE),
        };
        let renamed = self.once(
            req,
            |recorded| match recorded {
                Recorded::Renamed(renamed) => Ok(renamed),
                _ => Err(mismatched(
                    parent,
                    "replayed rename has another kind of record",
                )),
            },
            |key| {
                Ok(self
                    .meta
                    .rename(parent, name, newparent, newname, flags, key)?)
            },
        )?;
        if parent != newparent {
            self.quota_free.forget_all();
        }
        match renamed.replaced {
            Some(gone) => self.lost_name(gone),
            None => Ok(()),
        }
    }

    pub(super) fn do_link(
        &self,
        req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<EntryOut> {
        let entry = self.once(
            req,
            |recorded| self.entry_from_record(ino, recorded),
            |key| {
                let attr = self.meta.link(ino, newparent, newname, key)?;
                self.quota_free.forget_all();
                self.entry_out(&attr)
            },
        )?;
        if entry.attr.nlink == 1 {
            // Its first name: an O_TMPFILE (`data.rs`).
            self.named_tmpfile(ino);
        }
        Ok(entry)
    }

    /// An inode lost a name; at nlink 0 this session lets go of it soon,
    /// or at its last release if something here has it open (`orphans.rs`).
    fn lost_name(&self, gone: Unlinked) -> Result<()> {
        if gone.nlink_after == 0 {
            self.orphaned(gone.ino)?;
        }
        Ok(())
    }

    /// Clears set-user-ID and set-group-ID after a write by `caller`
    /// (who lacks CAP_FSETID: the kernel's kill flag, or a copy by a user
    /// other than root), as [`killed_suidgid`] says.
    pub(super) fn kill_suidgid(&self, ino: u64, caller: Caller) -> Result<()> {
        let a = self.meta.getattr(ino)?;
        let mode = killed_suidgid(a.mode, || caller.in_group(a.gid));
        if mode != a.mode {
            let set = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            self.meta.setattr(ino, &set, None)?;
            self.invalidate_kernel_attrs(ino);
        }
        Ok(())
    }
}

/// What a replayed unlink or rmdir removed.
fn unlinked(parent: u64, recorded: Recorded) -> Result<Unlinked> {
    match recorded {
        Recorded::Unlinked(gone) => Ok(gone),
        _ => Err(mismatched(
            parent,
            "replayed unlink has another kind of record",
        )),
    }
}

/// `mode` after a write by a caller without CAP_FSETID, as Linux clears it
/// on a local filesystem (`setattr_should_drop_suidgid`): without
/// set-user-ID, and without set-group-ID when group-execute is set or the
/// caller is not in the file's group (`in_group`, asked only then).
fn killed_suidgid(mode: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut mode = mode & !S_ISUID;
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !in_group()) {
        mode &= !S_ISGID;
    }
    mode
}

/// Who sent a request (its header): what the set-ID rules ask of them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Caller {
    gid: u32,
    /// In this server's pid namespace; 0 when the kernel cannot name it.
    pid: u32,
}

impl Caller {
    pub(super) fn of(req: &Request<'_>) -> Caller {
        let (_, gid, pid) = req.caller();
        Caller { gid, pid }
    }

    /// Group 0, no process (unit tests).
    #[cfg(test)]
    pub(super) fn root() -> Caller {
        Caller { gid: 0, pid: 0 }
    }

    /// Whether `gid` is the caller's group or one of its supplementary
    /// groups (read from /proc; a process gone or unseen has none).
    fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        if self.pid == 0 {
            return false;
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid));
        status.is_ok_and(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(gid)))
        })
    }
}

/// A time from SETATTR: explicit (ns precision), now, or unchanged.
/// Whether a SETATTR sets nothing but times (see `do_setattr_times`).
pub(super) fn sets_times_only(arg: &SetattrIn) -> bool {
    const TIMES: SetattrValid = SetattrValid::ATIME
        .union(SetattrValid::MTIME)
        .union(SetattrValid::CTIME)
        .union(SetattrValid::ATIME_NOW)
        .union(SetattrValid::MTIME_NOW)
        .union(SetattrValid::FH)
        .union(SetattrValid::LOCKOWNER);
    TIMES.contains(arg.valid)
}

fn time_arg(
    valid: SetattrValid,
    set: SetattrValid,
    now: SetattrValid,
    sec: u64,
    nsec: u32,
) -> Option<TimeOrNow> {
    if valid.intersects(now) {
        Some(TimeOrNow::Now)
    } else if valid.intersects(set) {
        Some(TimeOrNow::At(Timespec {
            sec: sec as i64,
            nsec,
        }))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_suidgid_keeps_sgid_without_group_execute_only_in_the_group() {
        assert_eq!(killed_suidgid(0o6755, || true), 0o0755);
        assert_eq!(killed_suidgid(0o6755, || false), 0o0755);
        assert_eq!(killed_suidgid(0o6745, || true), 0o2745);
        assert_eq!(killed_suidgid(0o6745, || false), 0o0745);
        assert_eq!(killed_suidgid(0o4745, || unreachable!()), 0o0745);
    }

    /// Only a SETATTR that changes times and nothing else skips the
    /// exactly-once record: mode, owner, size or a suid kill replayed
    /// could undo a later change or run twice.
    #[test]
    fn only_time_setattrs_go_without_a_record() {
        let with = |valid| SetattrIn {
            valid,
            ..Default::default()
        };
        assert!(sets_times_only(&with(
            SetattrValid::MTIME | SetattrValid::CTIME
        )));
        assert!(sets_times_only(&with(
            SetattrValid::ATIME_NOW | SetattrValid::MTIME_NOW | SetattrValid::FH
        )));
        for other in [
            SetattrValid::MODE,
            SetattrValid::UID,
            SetattrValid::GID,
            SetattrValid::SIZE,
            SetattrValid::KILL_SUIDGID,
        ] {
            assert!(
                !sets_times_only(&with(SetattrValid::MTIME | other)),
                "{other:?}"
            );
        }
    }

    #[test]
    fn setattr_times_prefer_now_over_explicit() {
        assert_eq!(
            time_arg(
                SetattrValid::ATIME | SetattrValid::ATIME_NOW,
                SetattrValid::ATIME,
                SetattrValid::ATIME_NOW,
                5,
                6
            ),
            Some(TimeOrNow::Now)
        );
        assert_eq!(
            time_arg(
                SetattrValid::ATIME,
                SetattrValid::ATIME,
                SetattrValid::ATIME_NOW,
                5,
                6
            ),
            Some(TimeOrNow::At(Timespec { sec: 5, nsec: 6 }))
        );
        assert_eq!(
            time_arg(
                SetattrValid::empty(),
                SetattrValid::ATIME,
                SetattrValid::ATIME_NOW,
                5,
                6
            ),
            None
        );
    }
}
