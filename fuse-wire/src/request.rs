//! Decoding of one request read from /dev/fuse into a typed [`Operation`],
//! keeping the raw bytes and the `unique` reachable for journaling.
//!
//! Decoding is pure: it borrows names and payloads from the read buffer and
//! never allocates, except for BATCH_FORGET's list.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use zerocopy::FromBytes;

use crate::abi::{self, opcode, InHeader};
use crate::types::{NodeId, RenameFlags};

/// Why a request could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than a request header: there is no unique to answer.
    #[error("request of {len} bytes is shorter than the 40-byte FUSE header; dropped")]
    ShortHeader {
        /// Bytes received.
        len: usize,
    },
    /// The header's length field disagrees with the bytes read.
    #[error(
        "request unique={unique:#x} opcode={opcode} says {declared} bytes but {actual} were read"
    )]
    LengthMismatch {
        /// The request's unique.
        unique: u64,
        /// The request's opcode.
        opcode: u32,
        /// `len` from the header.
        declared: u32,
        /// Bytes actually read.
        actual: usize,
    },
    /// The body is too short for the opcode's arguments.
    #[error("request unique={unique:#x} opcode={opcode} is truncated: its {what} is missing")]
    Truncated {
        /// The request's unique.
        unique: u64,
        /// The request's opcode.
        opcode: u32,
        /// Which argument is missing.
        what: &'static str,
    },
}

impl DecodeError {
    /// The unique to answer with an error, if the header was readable.
    pub fn unique(&self) -> Option<u64> {
        match self {
            DecodeError::ShortHeader { .. } => None,
            DecodeError::LengthMismatch { unique, .. } | DecodeError::Truncated { unique, .. } => {
                Some(*unique)
            }
        }
    }
}

/// Options fixed at INIT that change how requests are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// FUSE_SETXATTR_EXT was negotiated: `fuse_setxattr_in` is 16 bytes.
    pub setxattr_ext: bool,
}

/// One decoded request: header, typed operation and the raw bytes.
#[derive(Debug)]
pub struct Request<'a> {
    header: InHeader,
    raw: &'a [u8],
    extensions: &'a [u8],
    operation: Operation<'a>,
}

/// The typed arguments of every opcode a complete filesystem serves at 7.45.
#[derive(Debug, PartialEq, Eq)]
#[allow(missing_docs)] // Variants are named after their opcodes.
pub enum Operation<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        arg: abi::ForgetIn,
    },
    BatchForget {
        nodes: Vec<abi::ForgetOne>,
    },
    Getattr {
        arg: abi::GetattrIn,
    },
    Setattr {
        arg: abi::SetattrIn,
    },
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        arg: abi::MknodIn,
        name: &'a OsStr,
    },
    Mkdir {
        arg: abi::MkdirIn,
        name: &'a OsStr,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        newdir: NodeId,
        flags: RenameFlags,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        arg: abi::LinkIn,
        name: &'a OsStr,
    },
    Open {
        arg: abi::OpenIn,
    },
    Read {
        arg: abi::ReadIn,
    },
    Write {
        arg: abi::WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release {
        arg: abi::ReleaseIn,
    },
    Fsync {
        arg: abi::FsyncIn,
    },
    Setxattr {
        arg: abi::SetxattrIn,
        name: &'a OsStr,
        value: &'a [u8],
    },
    Getxattr {
        arg: abi::GetxattrIn,
        name: &'a OsStr,
    },
    Listxattr {
        arg: abi::GetxattrIn,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        arg: abi::FlushIn,
    },
    Init {
        arg: abi::InitIn,
    },
    Opendir {
        arg: abi::OpenIn,
    },
    Readdir {
        arg: abi::ReadIn,
    },
    Releasedir {
        arg: abi::ReleaseIn,
    },
    Fsyncdir {
        arg: abi::FsyncIn,
    },
    Getlk {
        arg: abi::LkIn,
    },
    Setlk {
        arg: abi::LkIn,
        sleep: bool,
    },
    Access {
        arg: abi::AccessIn,
    },
    Create {
        arg: abi::CreateIn,
        name: &'a OsStr,
    },
    Interrupt {
        arg: abi::InterruptIn,
    },
    Bmap {
        arg: abi::BmapIn,
    },
    Destroy,
    Ioctl {
        arg: abi::IoctlIn,
        data: &'a [u8],
    },
    Poll {
        arg: abi::PollIn,
    },
    Fallocate {
        arg: abi::FallocateIn,
    },
    Readdirplus {
        arg: abi::ReadIn,
    },
    Lseek {
        arg: abi::LseekIn,
    },
    /// COPY_FILE_RANGE (`wide == false`, 32-bit reply) or COPY_FILE_RANGE_64.
    CopyFileRange {
        arg: abi::CopyFileRangeIn,
        wide: bool,
    },
    Syncfs,
    Tmpfile {
        arg: abi::CreateIn,
    },
    Statx {
        arg: abi::StatxIn,
    },
    /// An opcode this layer does not know (or DAX mapping, never negotiated).
    Unknown {
        opcode: u32,
    },
}

impl<'a> Request<'a> {
    /// Decodes one request exactly as read from the device.
    pub fn parse(raw: &'a [u8], options: DecodeOptions) -> Result<Self, DecodeError> {
        let (header, body) = InHeader::read_from_prefix(raw)
            .map_err(|_| DecodeError::ShortHeader { len: raw.len() })?;
        if header.len as usize != raw.len() {
            return Err(DecodeError::LengthMismatch {
                unique: header.unique,
                opcode: header.opcode,
                declared: header.len,
                actual: raw.len(),
            });
        }
        let ext_len = usize::from(header.total_extlen) * 8;
        let truncated = |what| DecodeError::Truncated {
            unique: header.unique,
            opcode: header.opcode,
            what,
        };
        if ext_len > body.len() {
            return Err(truncated("extension area"));
        }
        let (body, extensions) = body.split_at(body.len() - ext_len);
        let operation = decode_operation(header.opcode, &mut Body(body), options)
            .ok_or_else(|| truncated(argument_name(header.opcode)))?;
        Ok(Request {
            header,
            raw,
            extensions,
            operation,
        })
    }

    /// The request's unique exactly as read; replies must carry this value.
    pub fn unique(&self) -> u64 {
        self.header.unique
    }

    /// The unique without the RESEND bit: stable across a resend, for keys.
    pub fn key(&self) -> u64 {
        unique_key(self.header.unique)
    }

    /// True if the kernel re-queued this request after FUSE_NOTIFY_RESEND.
    pub fn is_resend(&self) -> bool {
        self.header.unique & abi::UNIQUE_RESEND != 0
    }

    /// The decoded header.
    pub fn header(&self) -> &InHeader {
        &self.header
    }

    /// The node the request is about (0 for some opcodes).
    pub fn nodeid(&self) -> NodeId {
        self.header.nodeid
    }

    /// The opcode.
    pub fn opcode(&self) -> u32 {
        self.header.opcode
    }

    /// The caller's credentials: `(uid, gid, pid)`.
    pub fn caller(&self) -> (u32, u32, u32) {
        (self.header.uid, self.header.gid, self.header.pid)
    }

    /// The typed operation.
    pub fn operation(&self) -> &Operation<'a> {
        &self.operation
    }

    /// The request's bytes exactly as read, for an in-flight journal.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Supplementary groups sent with create-like requests when
    /// FUSE_CREATE_SUPP_GROUP was negotiated; empty otherwise.
    pub fn supplementary_groups(&self) -> Vec<u32> {
        let mut area = Body(self.extensions);
        while let Some(ext) = area.fixed::<abi::ExtHeader>() {
            let payload_len =
                (ext.size as usize).saturating_sub(std::mem::size_of::<abi::ExtHeader>());
            let Some(payload) = area.bytes(payload_len) else {
                break;
            };
            if ext.typ == abi::EXT_GROUPS {
                let mut groups = Body(payload);
                let count = groups.fixed::<u32>().unwrap_or(0);
                return (0..count).map_while(|_| groups.fixed::<u32>()).collect();
            }
        }
        Vec::new()
    }
}

/// `unique` without the RESEND bit (bit 63): the same for a request and
/// its resent copy, so it keys exactly-once records and parked requests.
/// Pure.
pub const fn unique_key(unique: u64) -> u64 {
    unique & !abi::UNIQUE_RESEND
}

/// A cursor over a request body.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn fixed<T: FromBytes>(&mut self) -> Option<T> {
        let (value, rest) = T::read_from_prefix(self.0).ok()?;
        self.0 = rest;
        Some(value)
    }

    fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(head)
    }

    /// A NUL-terminated name.
    fn name(&mut self) -> Option<&'a OsStr> {
        let end = self.0.iter().position(|&b| b == 0)?;
        let name = &self.0[..end];
        self.0 = &self.0[end + 1..];
        Some(OsStr::from_bytes(name))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

fn decode_operation<'a>(
    op: u32,
    b: &mut Body<'a>,
    options: DecodeOptions,
) -> Option<Operation<'a>> {
    use Operation as O;
    Some(match op {
        opcode::LOOKUP => O::Lookup { name: b.name()? },
        opcode::FORGET => O::Forget { arg: b.fixed()? },
        opcode::BATCH_FORGET => {
            let head: abi::BatchForgetIn = b.fixed()?;
            let nodes = (0..head.count)
                .map(|_| b.fixed())
                .collect::<Option<Vec<_>>>()?;
            O::BatchForget { nodes }
        }
        opcode::GETATTR => O::Getattr { arg: b.fixed()? },
        opcode::SETATTR => O::Setattr { arg: b.fixed()? },
        opcode::READLINK => O::Readlink,
        opcode::SYMLINK => O::Symlink {
            name: b.name()?,
            target: b.name()?,
        },
        opcode::MKNOD => O::Mknod {
            arg: b.fixed()?,
            name: b.name()?,
        },
        opcode::MKDIR => O::Mkdir {
            arg: b.fixed()?,
            name: b.name()?,
        },
        opcode::UNLINK => O::Unlink { name: b.name()? },
        opcode::RMDIR => O::Rmdir { name: b.name()? },
        opcode::RENAME => {
            let arg: abi::RenameIn = b.fixed()?;
            O::Rename {
                newdir: arg.newdir,
                flags: RenameFlags::empty(),
                name: b.name()?,
                newname: b.name()?,
            }
        }
        opcode::RENAME2 => {
            let arg: abi::Rename2In = b.fixed()?;
            O::Rename {
                newdir: arg.newdir,
                flags: arg.flags,
                name: b.name()?,
                newname: b.name()?,
            }
        }
        opcode::LINK => O::Link {
            arg: b.fixed()?,
            name: b.name()?,
        },
        opcode::OPEN => O::Open { arg: b.fixed()? },
        opcode::READ => O::Read { arg: b.fixed()? },
        opcode::WRITE => {
            let arg: abi::WriteIn = b.fixed()?;
            O::Write {
                arg,
                data: b.bytes(arg.size as usize)?,
            }
        }
        opcode::STATFS => O::Statfs,
        opcode::RELEASE => O::Release { arg: b.fixed()? },
        opcode::FSYNC => O::Fsync { arg: b.fixed()? },
        opcode::SETXATTR => {
            let arg = if options.setxattr_ext {
                b.fixed()?
            } else {
                let compat: abi::GetxattrIn = b.fixed()?; // {size, flags}: same shape
                abi::SetxattrIn {
                    size: compat.size,
                    flags: compat.padding,
                    ..Default::default()
                }
            };
            let name = b.name()?;
            O::Setxattr {
                arg,
                name,
                value: b.bytes(arg.size as usize)?,
            }
        }
        opcode::GETXATTR => O::Getxattr {
            arg: b.fixed()?,
            name: b.name()?,
        },
        opcode::LISTXATTR => O::Listxattr { arg: b.fixed()? },
        opcode::REMOVEXATTR => O::Removexattr { name: b.name()? },
        opcode::FLUSH => O::Flush { arg: b.fixed()? },
        opcode::INIT => O::Init { arg: init_in(b)? },
        opcode::OPENDIR => O::Opendir { arg: b.fixed()? },
        opcode::READDIR => O::Readdir { arg: b.fixed()? },
        opcode::RELEASEDIR => O::Releasedir { arg: b.fixed()? },
        opcode::FSYNCDIR => O::Fsyncdir { arg: b.fixed()? },
        opcode::GETLK => O::Getlk { arg: b.fixed()? },
        opcode::SETLK => O::Setlk {
            arg: b.fixed()?,
            sleep: false,
        },
        opcode::SETLKW => O::Setlk {
            arg: b.fixed()?,
            sleep: true,
        },
        opcode::ACCESS => O::Access { arg: b.fixed()? },
        opcode::CREATE => O::Create {
            arg: b.fixed()?,
            name: b.name()?,
        },
        opcode::INTERRUPT => O::Interrupt { arg: b.fixed()? },
        opcode::BMAP => O::Bmap { arg: b.fixed()? },
        opcode::DESTROY => O::Destroy,
        opcode::IOCTL => O::Ioctl {
            arg: b.fixed()?,
            data: b.rest(),
        },
        opcode::POLL => O::Poll { arg: b.fixed()? },
        opcode::FALLOCATE => O::Fallocate { arg: b.fixed()? },
        opcode::READDIRPLUS => O::Readdirplus { arg: b.fixed()? },
        opcode::LSEEK => O::Lseek { arg: b.fixed()? },
        opcode::COPY_FILE_RANGE => O::CopyFileRange {
            arg: b.fixed()?,
            wide: false,
        },
        opcode::COPY_FILE_RANGE_64 => O::CopyFileRange {
            arg: b.fixed()?,
            wide: true,
        },
        opcode::SYNCFS => O::Syncfs,
        opcode::TMPFILE => O::Tmpfile { arg: b.fixed()? },
        opcode::STATX => O::Statx { arg: b.fixed()? },
        other => O::Unknown { opcode: other },
    })
}

/// INIT from kernels before 7.36 is 16 bytes; later ones send 64.
fn init_in(b: &mut Body<'_>) -> Option<abi::InitIn> {
    if b.0.len() >= std::mem::size_of::<abi::InitIn>() {
        return b.fixed();
    }
    let head = b.bytes(16)?;
    let mut arg = abi::InitIn::default();
    let mut words = head
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    arg.major = words.next()?;
    arg.minor = words.next()?;
    arg.max_readahead = words.next()?;
    arg.flags = words.next()?;
    Some(arg)
}

/// Names the fixed argument of an opcode, for truncation errors.
fn argument_name(op: u32) -> &'static str {
    match op {
        opcode::LOOKUP | opcode::UNLINK | opcode::RMDIR | opcode::REMOVEXATTR => "name",
        opcode::SYMLINK => "name or link target",
        opcode::WRITE => "write header or data",
        opcode::SETXATTR => "setxattr header, name or value",
        opcode::RENAME | opcode::RENAME2 => "rename header or names",
        opcode::BATCH_FORGET => "forget list",
        _ => "fixed argument",
    }
}
