//! Extended attributes, stored by baton-meta, with the FUSE size-probe
//! protocol: a request with size 0 gets the size; a buffer too small gets
//! ERANGE.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use baton_meta::{Recorded, XattrFlags};
use fuse_wire::reply::ReplyXattr;
use fuse_wire::{Errno, Request};

use super::BatonFs;
use crate::error::{Error, Result};

/// `XATTR_CREATE`.
const XATTR_CREATE: u32 = 1;
/// `XATTR_REPLACE`.
const XATTR_REPLACE: u32 = 2;
/// `FUSE_SETXATTR_ACL_KILL_SGID`: the caller is neither in the file's group
/// nor has CAP_FSETID (only sent with SETXATTR_EXT, which Baton negotiates).
const SETXATTR_ACL_KILL_SGID: u32 = fuse_wire::abi::flags::SETXATTR_ACL_KILL_SGID;
/// Names of POSIX ACLs. On a connection that did not negotiate
/// FUSE_POSIX_ACL (an older mount adopted by this build) the kernel passes
/// them through as plain xattrs and would not enforce them; storing one
/// would make `cp -a` believe the mode was set. Refusing with EOPNOTSUPP
/// makes tools fall back to chmod. With POSIX_ACL the kernel validated the
/// ACL (`posix_acl_from_xattr`) and baton-meta keeps it with the mode in
/// step (`baton_meta::acl`); after a set or removal the kernel forgets its
/// cached ACLs and attributes by itself (`fuse_set_acl`).
const POSIX_ACL_NAMES: [&[u8]; 2] = [
    baton_meta::acl::ACL_ACCESS_XATTR,
    baton_meta::acl::ACL_DEFAULT_XATTR,
];

/// Answers a GETXATTR or LISTXATTR with `bytes` under the size protocol.
pub(super) fn answer(bytes: &[u8], size: u32, reply: ReplyXattr) {
    let Ok(len) = u32::try_from(bytes.len()) else {
        return reply.error(Errno::E2BIG);
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(bytes);
    }
}

impl BatonFs {
    pub(super) fn do_setxattr(
        &self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> Result<()> {
        self.refuse_acl_unless_enforced(ino, name)?;
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(Error::refused(ino, "bad setxattr flags", Errno::EINVAL));
        }
        let flags = XattrFlags {
            create: flags & XATTR_CREATE != 0,
            replace: flags & XATTR_REPLACE != 0,
            acl_kill_sgid: setxattr_flags & SETXATTR_ACL_KILL_SGID != 0,
        };
        self.once(
            req,
            |recorded| unit(ino, recorded),
            |key| Ok(self.meta.setxattr(ino, name, value, flags, key)?),
        )
    }

    pub(super) fn do_removexattr(&self, req: &Request<'_>, ino: u64, name: &OsStr) -> Result<()> {
        self.refuse_acl_unless_enforced(ino, name)?;
        self.once(
            req,
            |recorded| unit(ino, recorded),
            |key| Ok(self.meta.removexattr(ino, name, key)?),
        )
    }

    /// EOPNOTSUPP for an ACL name on a connection without POSIX_ACL.
    fn refuse_acl_unless_enforced(&self, ino: u64, name: &OsStr) -> Result<()> {
        if !self.acls_enforced() && POSIX_ACL_NAMES.contains(&name.as_bytes()) {
            return Err(Error::refused(
                ino,
                "POSIX ACLs need FUSE_POSIX_ACL, which this connection did not negotiate",
                Errno::EOPNOTSUPP,
            ));
        }
        Ok(())
    }

    /// The NUL-terminated names, concatenated.
    pub(super) fn do_listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for name in self.meta.listxattr(ino)? {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }
}

/// What a replayed setxattr or removexattr answers.
fn unit(ino: u64, recorded: Recorded) -> Result<()> {
    match recorded {
        Recorded::Unit => Ok(()),
        _ => Err(super::once::mismatched(
            ino,
            "replayed xattr change has another kind of record",
        )),
    }
}
