//! The [`fuse_wire::Filesystem`] impl of [`BatonFs`]: routes each request to
//! the submodule doing the work and turns its `Result` into the reply (the
//! errno of a failure, logged with `op`, `unique` and `nodeid`). Every
//! method first starts a `RequestTimer` (`counters.rs`): the request is
//! counted by opcode, with its latency, when the method returns.
//!
//! Nodeids are inode numbers (see `mod.rs`): each method turns the
//! [`fuse_wire::NodeId`]s it gets into the `u64` inode numbers of
//! baton-meta first, and handle numbers into [`fuse_wire::FileHandle`]s
//! in its reply.

use std::ffi::OsStr;

use fuse_wire::reply::{
    DirentBuf, ReplyAttr, ReplyCopy, ReplyCreate, ReplyData, ReplyEmpty, ReplyEntry, ReplyLock,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use fuse_wire::{
    CopyFileRangeIn, CreateIn, FallocateIn, FileHandle, Filesystem, FlushIn, FopenFlags, FsyncIn,
    LkIn, LseekIn, MkdirIn, MknodIn, NodeId, OpenIn, ReadIn, ReleaseIn, RenameFlags, Request,
    SetattrIn, SetxattrIn, WriteIn,
};

use super::namespace::Caller;
use super::{xattr, BatonFs};
use crate::error::Error;

/// Answers `$reply` from `$result`: `$ok` on success, the errno otherwise.
macro_rules! answer {
    ($self:ident, $req:ident, $op:literal, $nodeid:expr, $result:expr, $reply:ident, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(err) if err.is_fenced() => $reply.abandon(),
            Err(err) => $reply.error($self.fail($op, $req, $nodeid, &err)),
        }
    };
}

/// [`answer!`] for a mutation run through `BatonFs::once`: after a
/// successful reply, the request's exactly-once record may go.
macro_rules! answer_once {
    ($self:ident, $req:ident, $op:literal, $nodeid:expr, $result:expr, $reply:ident, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => {
                $ok;
                $self.answered($req);
            }
            Err(err) if err.is_fenced() => $reply.abandon(),
            Err(err) => $reply.error($self.fail($op, $req, $nodeid, &err)),
        }
    };
}

impl Filesystem for BatonFs {
    fn lookup(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEntry) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        answer!(
            self,
            req,
            "lookup",
            parent,
            self.do_lookup(parent, name),
            reply,
            |e| reply.entry(&e)
        );
    }

    fn forget(&self, req: &Request<'_>, nodeid: NodeId, _nlookup: u64) {
        let _timer = self.counters.timer(req.opcode());
        self.forgotten(nodeid.get());
    }

    fn getattr(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "getattr",
            nodeid,
            self.do_getattr(nodeid),
            reply,
            |a| reply.attr(&a)
        );
    }

    fn setattr(&self, req: &Request<'_>, nodeid: NodeId, arg: &SetattrIn, reply: ReplyAttr) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        if super::namespace::sets_times_only(arg) {
            // Idempotent: no exactly-once record, so none to delete.
            answer!(
                self,
                req,
                "setattr",
                nodeid,
                self.do_setattr_times(nodeid, arg),
                reply,
                |a| reply.attr(&a)
            );
            return;
        }
        answer_once!(
            self,
            req,
            "setattr",
            nodeid,
            self.do_setattr(req, nodeid, arg),
            reply,
            |a| reply.attr(&a)
        );
    }

    fn readlink(&self, req: &Request<'_>, nodeid: NodeId, reply: ReplyData) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "readlink",
            nodeid,
            self.do_readlink(nodeid),
            reply,
            |t| reply.data(&t)
        );
    }

    fn symlink(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        target: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        let r = self.do_symlink(req, parent, name, target);
        answer_once!(self, req, "symlink", parent, r, reply, |e| reply.entry(&e));
    }

    fn mknod(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &MknodIn,
        reply: ReplyEntry,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        let r = self.do_mknod(req, parent, name, arg);
        answer_once!(self, req, "mknod", parent, r, reply, |e| reply.entry(&e));
    }

    fn mkdir(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &MkdirIn,
        reply: ReplyEntry,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        let r = self.do_mkdir(req, parent, name, arg);
        answer_once!(self, req, "mkdir", parent, r, reply, |e| reply.entry(&e));
    }

    fn unlink(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        answer_once!(
            self,
            req,
            "unlink",
            parent,
            self.do_unlink(req, parent, name),
            reply,
            |()| reply.ok()
        );
    }

    fn rmdir(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        answer_once!(
            self,
            req,
            "rmdir",
            parent,
            self.do_rmdir(req, parent, name),
            reply,
            |()| reply.ok()
        );
    }

    fn rename(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        newparent: NodeId,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        let newparent = newparent.get();
        let r = self.do_rename(req, parent, name, newparent, newname, flags);
        answer_once!(self, req, "rename", parent, r, reply, |()| reply.ok());
    }

    fn link(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        newparent: NodeId,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        let newparent = newparent.get();
        let r = self.do_link(req, nodeid, newparent, newname);
        answer_once!(self, req, "link", nodeid, r, reply, |e| reply.entry(&e));
    }

    fn open(&self, req: &Request<'_>, nodeid: NodeId, arg: &OpenIn, reply: ReplyOpen) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "open",
            nodeid,
            self.do_open(nodeid, arg.flags, arg.open_flags, Caller::of(req)),
            reply,
            // Keep the page cache across opens: data changes only through
            // this mount, and AUTO_INVAL_DATA drops pages when mtime or size
            // change.
            |fh| reply.opened(FileHandle::new(fh), FopenFlags::KEEP_CACHE)
        );
    }

    fn read(&self, req: &Request<'_>, nodeid: NodeId, arg: &ReadIn, reply: ReplyData) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        answer!(
            self,
            req,
            "read",
            nodeid,
            self.do_read(nodeid, arg),
            reply,
            |d| {
                self.counters.read(d.len());
                reply.data(&d)
            }
        );
    }

    fn write(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &WriteIn,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        let r = self.do_write(nodeid, arg, data, Caller::of(req));
        answer!(self, req, "write", nodeid, r, reply, |n| {
            self.counters.written(n);
            reply.written(n)
        });
    }

    fn statfs(&self, req: &Request<'_>, nodeid: NodeId, reply: ReplyStatfs) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "statfs",
            nodeid,
            self.do_statfs(nodeid),
            reply,
            |s| { reply.statfs(&s) }
        );
    }

    fn release(&self, req: &Request<'_>, nodeid: NodeId, arg: &ReleaseIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "release",
            nodeid,
            self.do_release(nodeid, arg),
            reply,
            |()| reply.ok()
        );
    }

    fn fsync(&self, req: &Request<'_>, nodeid: NodeId, _arg: &FsyncIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        answer!(
            self,
            req,
            "fsync",
            nodeid,
            self.do_fsync(nodeid),
            reply,
            |()| reply.ok()
        );
    }

    fn setxattr(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        name: &OsStr,
        value: &[u8],
        arg: &SetxattrIn,
        reply: ReplyEmpty,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        let r = self.do_setxattr(req, nodeid, name, value, arg.flags, arg.setxattr_flags);
        answer_once!(self, req, "setxattr", nodeid, r, reply, |()| reply.ok());
    }

    fn getxattr(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        match self.meta.getxattr(nodeid, name).map_err(Error::from) {
            Ok(value) => xattr::answer(&value, size, reply),
            Err(err) => reply.error(self.fail("getxattr", req, nodeid, &err)),
        }
    }

    fn listxattr(&self, req: &Request<'_>, nodeid: NodeId, size: u32, reply: ReplyXattr) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        match self.do_listxattr(nodeid) {
            Ok(list) => xattr::answer(&list, size, reply),
            Err(err) => reply.error(self.fail("listxattr", req, nodeid, &err)),
        }
    }

    fn removexattr(&self, req: &Request<'_>, nodeid: NodeId, name: &OsStr, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        let r = self.do_removexattr(req, nodeid, name);
        answer_once!(self, req, "removexattr", nodeid, r, reply, |()| reply.ok());
    }

    fn flush(&self, req: &Request<'_>, nodeid: NodeId, arg: &FlushIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        answer!(
            self,
            req,
            "flush",
            nodeid,
            self.do_flush(nodeid, arg),
            reply,
            |()| reply.ok()
        );
    }

    fn opendir(&self, req: &Request<'_>, nodeid: NodeId, arg: &OpenIn, reply: ReplyOpen) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "opendir",
            nodeid,
            self.do_opendir(nodeid, arg.flags),
            reply,
            |fh| reply.opened(FileHandle::new(fh), self.dir_open_flags())
        );
    }

    fn readdir(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &ReadIn,
        entries: DirentBuf,
        reply: ReplyData,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        crate::fault::hit(crate::fault::Point::AfterRead, req.opcode());
        match self.do_readdir(nodeid, arg, entries) {
            Ok(buf) => reply.data(buf.as_bytes()),
            Err(err) => reply.error(self.fail("readdir", req, nodeid, &err)),
        }
    }

    fn releasedir(&self, req: &Request<'_>, nodeid: NodeId, arg: &ReleaseIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "releasedir",
            nodeid,
            self.do_releasedir(arg.fh.get()),
            reply,
            |()| reply.ok()
        );
    }

    fn fsyncdir(&self, req: &Request<'_>, nodeid: NodeId, _arg: &FsyncIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        let r = self.do_fsyncdir();
        answer!(self, req, "fsyncdir", nodeid, r, reply, |()| reply.ok());
    }

    fn getlk(&self, req: &Request<'_>, nodeid: NodeId, arg: &LkIn, reply: ReplyLock) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "getlk",
            nodeid,
            self.do_getlk(nodeid, arg),
            reply,
            |lk| reply.lock(&lk)
        );
    }

    fn setlk(&self, req: &Request<'_>, nodeid: NodeId, arg: &LkIn, sleep: bool, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        self.do_setlk(req, nodeid, arg, sleep, reply);
    }

    fn access(&self, req: &Request<'_>, _nodeid: NodeId, _mask: u32, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        // default_permissions: the kernel checks modes itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &CreateIn,
        reply: ReplyCreate,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        answer_once!(
            self,
            req,
            "create",
            parent,
            self.do_create(req, parent, name, arg),
            reply,
            |(entry, fh)| reply.created(&entry, FileHandle::new(fh), FopenFlags::empty())
        );
    }

    fn tmpfile(&self, req: &Request<'_>, parent: NodeId, arg: &CreateIn, reply: ReplyCreate) {
        let _timer = self.counters.timer(req.opcode());
        let parent = parent.get();
        answer_once!(
            self,
            req,
            "tmpfile",
            parent,
            self.do_tmpfile(req, parent, arg),
            reply,
            |(entry, fh)| reply.created(&entry, FileHandle::new(fh), FopenFlags::empty())
        );
    }

    fn interrupt(&self, req: &Request<'_>, unique: u64) {
        let _timer = self.counters.timer(req.opcode());
        self.do_interrupt(unique);
    }

    fn fallocate(&self, req: &Request<'_>, nodeid: NodeId, arg: &FallocateIn, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer!(
            self,
            req,
            "fallocate",
            nodeid,
            self.do_fallocate(req, nodeid, arg),
            reply,
            |()| reply.ok()
        );
    }

    fn lseek(&self, req: &Request<'_>, nodeid: NodeId, arg: &LseekIn, reply: ReplyLseek) {
        let _timer = self.counters.timer(req.opcode());
        self.seek(req, nodeid.get(), arg, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &CopyFileRangeIn,
        reply: ReplyCopy,
    ) {
        let _timer = self.counters.timer(req.opcode());
        let nodeid = nodeid.get();
        answer_once!(
            self,
            req,
            "copy_file_range",
            nodeid,
            self.do_copy_file_range(req, nodeid, arg),
            reply,
            |bytes| reply.copied(bytes)
        );
    }

    fn syncfs(&self, req: &Request<'_>, reply: ReplyEmpty) {
        let _timer = self.counters.timer(req.opcode());
        answer!(self, req, "syncfs", 0, self.do_syncfs(), reply, |()| reply
            .ok());
    }
}
