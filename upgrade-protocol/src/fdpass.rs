//! Sending and receiving one framed message with fds over a SOCK_SEQPACKET
//! unix socket.
//!
//! Built on nix's sendmsg/recvmsg rather than the `sendfd` crate, which
//! receives fds without close-on-exec (they would leak into every child).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::errno::Errno;
use nix::sys::socket::{recv, recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::message::{decode, encode, Message, MESSAGE_LEN_MAX};
use crate::ProtocolError;

/// Fds one message may carry at most.
pub const FDS_PER_MESSAGE_MAX: usize = 8;

/// Sends `message` with `fds` attached (SCM_RIGHTS).
pub fn send_message(
    socket: BorrowedFd<'_>,
    message: &Message,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    if fds.len() != message.fd_count() {
        return Err(ProtocolError::FdCount {
            kind: message.kind(),
            found: fds.len(),
            expected: message.fd_count(),
        });
    }
    let frame = encode(message)?;
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(&frame)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                return Err(ProtocolError::Socket {
                    op: "sendmsg",
                    errno,
                })
            }
        }
    }
}

/// Receives one message and its fds; fds arrive close-on-exec.
pub fn recv_message(socket: BorrowedFd<'_>) -> Result<(Message, Vec<OwnedFd>), ProtocolError> {
    // A buffer of the message's own size: a fresh zeroed MESSAGE_LEN_MAX
    // one per message cost up to 0.4 ms of page faults (malloc serves it
    // from the heap after the first free), in the stall of every upgrade.
    let len = next_message_len(socket)?;
    let mut buf = vec![0u8; len.clamp(1, MESSAGE_LEN_MAX)];
    let mut space = cmsg_space!([RawFd; FDS_PER_MESSAGE_MAX]);
    let (len, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().map_err(|errno| ProtocolError::Socket {
                    op: "recvmsg",
                    errno,
                })? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: the kernel just installed these fds in this
                        // process for us; nothing else owns them.
                        fds.extend(
                            received
                                .into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                break (msg.bytes, fds);
            }
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                return Err(ProtocolError::Socket {
                    op: "recvmsg",
                    errno,
                })
            }
        }
    };
    if len == 0 {
        return Err(ProtocolError::Closed);
    }
    let message = decode(&buf[..len])?;
    if fds.len() != message.fd_count() {
        return Err(ProtocolError::FdCount {
            kind: message.kind(),
            found: fds.len(),
            expected: message.fd_count(),
        });
    }
    Ok((message, fds))
}

/// The length of the next message, without taking it (MSG_PEEK; MSG_TRUNC
/// makes the kernel return the whole length, not the 0 bytes copied).
/// Blocks until one arrives; 0 when the peer closed the socket. Only for
/// SOCK_SEQPACKET (every socket here): on a stream socket MSG_TRUNC
/// would mean something else.
fn next_message_len(socket: BorrowedFd<'_>) -> Result<usize, ProtocolError> {
    loop {
        match recv(
            socket.as_raw_fd(),
            &mut [],
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
        ) {
            Ok(len) => return Ok(len),
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(ProtocolError::Socket { op: "recv", errno }),
        }
    }
}
