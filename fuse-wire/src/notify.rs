//! Notifications: messages to the kernel that answer no request
//! (`unique == 0`, the code in `error`).
//!
//! RESEND re-queues every request of the whole connection that was read and
//! not answered, by any holder of any fd of it. Send it only when no other
//! generation is alive (a live one's requests would run twice), and before
//! the first read. Invalidations must wait until the generation serves: an
//! inval_entry sent before serving can deadlock against a resent LOOKUP.

use zerocopy::IntoBytes;

use crate::abi::{self, notify_code};
use crate::reply::ReplyChannel;
use crate::types::NodeId;

/// Encodes a notification message. Pure.
pub fn encode(code: i32, payload: &[&[u8]]) -> Vec<u8> {
    let len =
        std::mem::size_of::<abi::OutHeader>() + payload.iter().map(|p| p.len()).sum::<usize>();
    let header = abi::OutHeader {
        len: len as u32,
        error: code,
        unique: 0,
    };
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(header.as_bytes());
    for part in payload {
        out.extend_from_slice(part);
    }
    out
}

fn send(channel: &dyn ReplyChannel, message: Vec<u8>) -> std::io::Result<()> {
    channel.send(&[std::io::IoSlice::new(&message)])
}

/// Asks the kernel to re-queue every request read but not answered.
pub fn resend(channel: &dyn ReplyChannel) -> std::io::Result<()> {
    send(channel, encode(notify_code::RESEND, &[]))
}

/// Drops cached data (`offset..offset+len`; len 0 = to the end, offset -1 =
/// attributes only) and attributes of `nodeid`.
pub fn inval_inode(
    channel: &dyn ReplyChannel,
    nodeid: NodeId,
    offset: i64,
    len: i64,
) -> std::io::Result<()> {
    let out = abi::NotifyInvalInodeOut {
        ino: nodeid,
        off: offset,
        len,
    };
    send(channel, encode(notify_code::INVAL_INODE, &[out.as_bytes()]))
}

/// Drops the cached entry `name` in directory `parent`.
pub fn inval_entry(
    channel: &dyn ReplyChannel,
    parent: NodeId,
    name: &[u8],
    expire_only: bool,
) -> std::io::Result<()> {
    let flags = if expire_only {
        abi::flags::EXPIRE_ONLY
    } else {
        0
    };
    let out = abi::NotifyInvalEntryOut {
        parent,
        namelen: name.len() as u32,
        flags,
    };
    send(
        channel,
        encode(notify_code::INVAL_ENTRY, &[out.as_bytes(), name, b"\0"]),
    )
}

/// Tells the kernel that `name` in `parent` (inode `child`) was deleted.
pub fn delete(
    channel: &dyn ReplyChannel,
    parent: NodeId,
    child: NodeId,
    name: &[u8],
) -> std::io::Result<()> {
    let out = abi::NotifyDeleteOut {
        parent,
        child,
        namelen: name.len() as u32,
        padding: 0,
    };
    send(
        channel,
        encode(notify_code::DELETE, &[out.as_bytes(), name, b"\0"]),
    )
}
