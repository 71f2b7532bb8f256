//! The trait a filesystem implements to be served by a [`crate::Session`].
//!
//! Each method gets the decoded request (for `unique`, caller credentials and
//! the raw bytes) and a typed reply it must consume. Defaults never answer
//! ENOSYS: the kernel remembers ENOSYS for the life of the mount, so a later
//! generation could never serve that operation. Defaults answer what a
//! filesystem without the feature would (EOPNOTSUPP, ENOTTY, ...).
//!
//! Identifiers come typed ([`NodeId`], [`FileHandle`], and inside the
//! argument structs [`crate::LockOwner`] and the flag sets), so a node
//! cannot be passed where a handle, an owner or an offset is meant.

use std::ffi::OsStr;

use nix::errno::Errno;

use crate::abi;
use crate::reply::{
    DirentBuf, ReplyAttr, ReplyBmap, ReplyCopy, ReplyCreate, ReplyData, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use crate::request::Request;
use crate::types::{FileHandle, FopenFlags, GetattrFlags, NodeId, RenameFlags};

/// `POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM`: what a regular file reports.
pub const DEFAULT_POLL_MASK: u32 =
    (libc::POLLIN | libc::POLLOUT | libc::POLLRDNORM | libc::POLLWRNORM) as u32;

/// A filesystem served over FUSE. Called from several worker threads at once.
#[allow(unused_variables)]
pub trait Filesystem: Send + Sync + 'static {
    /// LOOKUP `name` in `parent`.
    fn lookup(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEntry);

    /// FORGET: the kernel dropped `nlookup` references to `nodeid`.
    fn forget(&self, req: &Request<'_>, nodeid: NodeId, nlookup: u64) {}

    /// BATCH_FORGET; by default one [`Filesystem::forget`] per node.
    fn batch_forget(&self, req: &Request<'_>, nodes: &[abi::ForgetOne]) {
        for node in nodes {
            self.forget(req, node.nodeid, node.nlookup);
        }
    }

    /// GETATTR; `fh` is set when the kernel asks through an open file.
    fn getattr(&self, req: &Request<'_>, nodeid: NodeId, fh: Option<FileHandle>, reply: ReplyAttr);

    /// SETATTR with the kernel's struct (`valid` says which fields apply).
    fn setattr(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::SetattrIn, reply: ReplyAttr) {
        reply.error(Errno::EROFS);
    }

    /// READLINK.
    fn readlink(&self, req: &Request<'_>, nodeid: NodeId, reply: ReplyData) {
        reply.error(Errno::EINVAL);
    }

    /// SYMLINK `name` in `parent` pointing at `target`.
    fn symlink(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        target: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    /// MKNOD.
    fn mknod(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &abi::MknodIn,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    /// MKDIR.
    fn mkdir(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &abi::MkdirIn,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    /// UNLINK.
    fn unlink(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    /// RMDIR.
    fn rmdir(&self, req: &Request<'_>, parent: NodeId, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    /// RENAME and RENAME2 (`flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, ...).
    #[allow(clippy::too_many_arguments)]
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
        reply.error(Errno::EROFS);
    }

    /// LINK `nodeid` as `newname` in `newparent`.
    fn link(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        newparent: NodeId,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    /// OPEN; by default a stateless handle 0 and no FOPEN flags.
    fn open(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::OpenIn, reply: ReplyOpen) {
        reply.opened(FileHandle::default(), FopenFlags::empty());
    }

    /// READ `arg.size` bytes at `arg.offset`.
    fn read(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::ReadIn, reply: ReplyData) {
        reply.error(Errno::EIO);
    }

    /// WRITE `data` at `arg.offset`.
    fn write(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::WriteIn,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    /// STATFS.
    fn statfs(&self, req: &Request<'_>, nodeid: NodeId, reply: ReplyStatfs) {
        reply.statfs(&abi::Kstatfs {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Default::default()
        });
    }

    /// RELEASE: the last close of an open file.
    fn release(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::ReleaseIn, reply: ReplyEmpty) {
        reply.ok();
    }

    /// FSYNC.
    fn fsync(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::FsyncIn, reply: ReplyEmpty) {
        reply.ok();
    }

    /// SETXATTR.
    fn setxattr(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        name: &OsStr,
        value: &[u8],
        arg: &abi::SetxattrIn,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// GETXATTR (`size == 0` asks for the size).
    fn getxattr(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// LISTXATTR (`size == 0` asks for the size).
    fn listxattr(&self, req: &Request<'_>, nodeid: NodeId, size: u32, reply: ReplyXattr) {
        reply.size(0);
    }

    /// REMOVEXATTR.
    fn removexattr(&self, req: &Request<'_>, nodeid: NodeId, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// FLUSH: a close(2) of a descriptor of an open file.
    fn flush(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::FlushIn, reply: ReplyEmpty) {
        reply.ok();
    }

    /// OPENDIR; by default a stateless handle 0 and no FOPEN flags.
    fn opendir(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::OpenIn, reply: ReplyOpen) {
        reply.opened(FileHandle::default(), FopenFlags::empty());
    }

    /// READDIR and READDIRPLUS: fill `entries` from cookie `arg.offset`, then
    /// answer with its bytes (see [`DirentBuf::is_plus`]).
    fn readdir(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::ReadIn,
        entries: DirentBuf,
        reply: ReplyData,
    );

    /// RELEASEDIR.
    fn releasedir(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::ReleaseIn,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// FSYNCDIR.
    fn fsyncdir(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::FsyncIn, reply: ReplyEmpty) {
        reply.ok();
    }

    /// GETLK (only sent when POSIX_LOCKS was negotiated).
    fn getlk(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::LkIn, reply: ReplyLock) {
        reply.error(Errno::ENOLCK);
    }

    /// SETLK / SETLKW (`sleep`), also flock when FLOCK_LOCKS was negotiated.
    fn setlk(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::LkIn,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOLCK);
    }

    /// ACCESS (only sent without `default_permissions`).
    fn access(&self, req: &Request<'_>, nodeid: NodeId, mask: u32, reply: ReplyEmpty) {
        reply.ok();
    }

    /// CREATE: create and open `name` in `parent`.
    fn create(
        &self,
        req: &Request<'_>,
        parent: NodeId,
        name: &OsStr,
        arg: &abi::CreateIn,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    /// INTERRUPT of request `unique` (as the kernel knows it).
    fn interrupt(&self, req: &Request<'_>, unique: u64) {}

    /// BMAP (block-device filesystems only).
    fn bmap(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::BmapIn, reply: ReplyBmap) {
        reply.error(Errno::EINVAL);
    }

    /// DESTROY: the connection is going away (unmount).
    fn destroy(&self, req: &Request<'_>) {}

    /// IOCTL: no ioctls by default.
    fn ioctl(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::IoctlIn,
        data: &[u8],
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    /// POLL: by default always ready, like a regular file.
    fn poll(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::PollIn, reply: ReplyPoll) {
        reply.revents(DEFAULT_POLL_MASK & arg.events);
    }

    /// FALLOCATE.
    fn fallocate(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::FallocateIn,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// LSEEK with SEEK_DATA or SEEK_HOLE.
    fn lseek(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::LseekIn, reply: ReplyLseek) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// COPY_FILE_RANGE: the kernel falls back to read and write on EOPNOTSUPP.
    fn copy_file_range(
        &self,
        req: &Request<'_>,
        nodeid: NodeId,
        arg: &abi::CopyFileRangeIn,
        reply: ReplyCopy,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// SYNCFS.
    fn syncfs(&self, req: &Request<'_>, reply: ReplyEmpty) {
        reply.ok();
    }

    /// TMPFILE (O_TMPFILE).
    fn tmpfile(&self, req: &Request<'_>, parent: NodeId, arg: &abi::CreateIn, reply: ReplyCreate) {
        reply.error(Errno::EOPNOTSUPP);
    }

    /// STATX: the kernel asks only when the caller wants more than the basic
    /// stats (e.g. btime). The default answers the basic stats through
    /// [`Filesystem::getattr`]; an error here would fail `stat(1)`.
    fn statx(&self, req: &Request<'_>, nodeid: NodeId, arg: &abi::StatxIn, reply: ReplyAttr) {
        let fh = arg
            .getattr_flags
            .contains(GetattrFlags::FH)
            .then_some(arg.fh);
        self.getattr(req, nodeid, fh, reply);
    }
}
