//! Routing one decoded request to its [`Filesystem`] method with the right
//! typed reply.

use std::sync::Arc;

use nix::errno::Errno;

use crate::filesystem::Filesystem;
use crate::reply::{
    send_message, DirentBuf, ReplyAttr, ReplyBmap, ReplyChannel, ReplyCopy, ReplyCreate, ReplyData,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs,
    ReplyWrite, ReplyXattr,
};
use crate::request::{Operation, Request};
use crate::types::GetattrFlags;

/// Calls the method for `req` on `fs`; its reply goes to `channel`.
pub fn dispatch<F: Filesystem + ?Sized>(
    fs: &F,
    req: &Request<'_>,
    channel: &Arc<dyn ReplyChannel>,
) {
    use Operation as O;
    let node = req.nodeid();
    let unique = req.unique();
    let ch = || Arc::clone(channel);
    match req.operation() {
        O::Lookup { name } => fs.lookup(req, node, name, ReplyEntry::new(ch(), unique)),
        O::Forget { arg } => fs.forget(req, node, arg.nlookup),
        O::BatchForget { nodes } => fs.batch_forget(req, nodes),
        O::Getattr { arg } => {
            let fh = arg
                .getattr_flags
                .contains(GetattrFlags::FH)
                .then_some(arg.fh);
            fs.getattr(req, node, fh, ReplyAttr::new(ch(), unique))
        }
        O::Setattr { arg } => fs.setattr(req, node, arg, ReplyAttr::new(ch(), unique)),
        O::Readlink => fs.readlink(req, node, ReplyData::new(ch(), unique)),
        O::Symlink { name, target } => {
            fs.symlink(req, node, name, target, ReplyEntry::new(ch(), unique))
        }
        O::Mknod { arg, name } => fs.mknod(req, node, name, arg, ReplyEntry::new(ch(), unique)),
        O::Mkdir { arg, name } => fs.mkdir(req, node, name, arg, ReplyEntry::new(ch(), unique)),
        O::Unlink { name } => fs.unlink(req, node, name, ReplyEmpty::new(ch(), unique)),
        O::Rmdir { name } => fs.rmdir(req, node, name, ReplyEmpty::new(ch(), unique)),
        O::Rename {
            newdir,
            flags,
            name,
            newname,
        } => fs.rename(
            req,
            node,
            name,
            *newdir,
            newname,
            *flags,
            ReplyEmpty::new(ch(), unique),
        ),
        O::Link { arg, name } => fs.link(
            req,
            arg.oldnodeid,
            node,
            name,
            ReplyEntry::new(ch(), unique),
        ),
        O::Open { arg } => fs.open(req, node, arg, ReplyOpen::new(ch(), unique)),
        O::Read { arg } => fs.read(req, node, arg, ReplyData::new(ch(), unique)),
        O::Write { arg, data } => fs.write(req, node, arg, data, ReplyWrite::new(ch(), unique)),
        O::Statfs => fs.statfs(req, node, ReplyStatfs::new(ch(), unique)),
        O::Release { arg } => fs.release(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Fsync { arg } => fs.fsync(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Setxattr { arg, name, value } => {
            fs.setxattr(req, node, name, value, arg, ReplyEmpty::new(ch(), unique))
        }
        O::Getxattr { arg, name } => {
            fs.getxattr(req, node, name, arg.size, ReplyXattr::new(ch(), unique))
        }
        O::Listxattr { arg } => fs.listxattr(req, node, arg.size, ReplyXattr::new(ch(), unique)),
        O::Removexattr { name } => fs.removexattr(req, node, name, ReplyEmpty::new(ch(), unique)),
        O::Flush { arg } => fs.flush(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Opendir { arg } => fs.opendir(req, node, arg, ReplyOpen::new(ch(), unique)),
        O::Readdir { arg } => fs.readdir(
            req,
            node,
            arg,
            DirentBuf::new(arg.size),
            ReplyData::new(ch(), unique),
        ),
        O::Readdirplus { arg } => fs.readdir(
            req,
            node,
            arg,
            DirentBuf::new_plus(arg.size),
            ReplyData::new(ch(), unique),
        ),
        O::Releasedir { arg } => fs.releasedir(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Fsyncdir { arg } => fs.fsyncdir(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Getlk { arg } => fs.getlk(req, node, arg, ReplyLock::new(ch(), unique)),
        O::Setlk { arg, sleep } => fs.setlk(req, node, arg, *sleep, ReplyEmpty::new(ch(), unique)),
        O::Access { arg } => fs.access(req, node, arg.mask, ReplyEmpty::new(ch(), unique)),
        O::Create { arg, name } => fs.create(req, node, name, arg, ReplyCreate::new(ch(), unique)),
        O::Interrupt { arg } => fs.interrupt(req, arg.unique),
        O::Bmap { arg } => fs.bmap(req, node, arg, ReplyBmap::new(ch(), unique)),
        O::Destroy => {
            fs.destroy(req);
            send_message(&**channel, unique, 0, &[]);
        }
        O::Ioctl { arg, data } => fs.ioctl(req, node, arg, data, ReplyIoctl::new(ch(), unique)),
        O::Poll { arg } => fs.poll(req, node, arg, ReplyPoll::new(ch(), unique)),
        O::Fallocate { arg } => fs.fallocate(req, node, arg, ReplyEmpty::new(ch(), unique)),
        O::Lseek { arg } => fs.lseek(req, node, arg, ReplyLseek::new(ch(), unique)),
        O::CopyFileRange { arg, wide } => {
            fs.copy_file_range(req, node, arg, ReplyCopy::new(ch(), unique, *wide))
        }
        O::Syncfs => fs.syncfs(req, ReplyEmpty::new(ch(), unique)),
        O::Tmpfile { arg } => fs.tmpfile(req, node, arg, ReplyCreate::new(ch(), unique)),
        O::Statx { arg } => fs.statx(req, node, arg, ReplyAttr::for_statx(ch(), unique)),
        O::Init { .. } => {
            // INIT arrives once per connection, before any adoption; a second
            // one means the kernel reset the connection under us.
            tracing::error!(
                unique,
                "INIT on an initialized connection; answering EPROTO"
            );
            send_message(&**channel, unique, -(Errno::EPROTO as i32), &[]);
        }
        O::Unknown { opcode } => {
            // EOPNOTSUPP, not ENOSYS: the kernel would remember ENOSYS for
            // the mount's life and a later generation could never serve it.
            tracing::warn!(unique, opcode, "unknown opcode; answering EOPNOTSUPP");
            send_message(&**channel, unique, -(Errno::EOPNOTSUPP as i32), &[]);
        }
    }
}

/// True for opcodes the kernel expects no reply to.
pub fn expects_reply(op: &Operation<'_>) -> bool {
    !matches!(
        op,
        Operation::Forget { .. } | Operation::BatchForget { .. } | Operation::Interrupt { .. }
    )
}
