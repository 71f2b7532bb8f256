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
/// Names of POSIX ACLs. FUSE_POSIX_ACL is not negotiated, so the kernel
/// passes them through as plain xattrs and would not apply them to the mode;
/// storing one would make `cp -a` believe the mode was set. Refusing with
/// EOPNOTSUPP makes tools fall back to chmod.
const POSIX_ACL_NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

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
    ) -> Result<()> {
        if POSIX_ACL_NAMES.contains(&name.as_bytes()) {
            return Err(Error::refused(
                ino,
                "POSIX ACLs are not supported",
                Errno::EOPNOTSUPP,
            ));
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(Error::refused(ino, "bad setxattr flags", Errno::EINVAL));
        }
        let flags = XattrFlags {
            create: flags & XATTR_CREATE != 0,
            replace: flags & XATTR_REPLACE != 0,
        };
        self.once(
            req,
            |recorded| unit(ino, recorded),
            |key| Ok(self.meta.setxattr(ino, name, value, flags, key)?),
        )
    }

    pub(super) fn do_removexattr(&self, req: &Request<'_>, ino: u64, name: &OsStr) -> Result<()> {
        self.once(
            req,
            |recorded| unit(ino, recorded),
            |key| Ok(self.meta.removexattr(ino, name, key)?),
        )
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
