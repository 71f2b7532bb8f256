//! The control message format is pinned, newer versions are refused, and fds
//! cross a socketpair close-on-exec.

use std::os::fd::{AsFd, AsRawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use upgrade_protocol::{decode, encode, recv_message, send_message, Message, NegotiatedInit, ProtocolError};

fn init() -> NegotiatedInit {
    NegotiatedInit {
        major: 7,
        minor: 45,
        kernel_minor: 45,
        flags: 0x8040640031,
        max_readahead: 131072,
        max_write: 1 << 20,
        max_pages: 256,
        max_background: 64,
        congestion_threshold: 48,
        time_gran: 1,
    }
}

#[test]
fn adopt_frame_is_pinned() {
    let frame = encode(&Message::Adopt { generation: 3, init: init(), resend: true }).unwrap();
    let header: Vec<String> = frame[..12].iter().map(|b| format!("{b:02x}")).collect();
    insta::assert_snapshot!("adopt_frame_v1", format!("{}\n{}", header.join(" "), String::from_utf8_lossy(&frame[12..])));
    assert_eq!(&frame[..4], b"BATN");
    assert_eq!(decode(&frame).unwrap(), Message::Adopt { generation: 3, init: init(), resend: true });
}

#[test]
fn newer_version_truncation_and_garbage_are_refused_clearly() {
    let mut frame = encode(&Message::Serving { generation: 1, pid: 9 }).unwrap();
    frame[4] = 2;
    let err = decode(&frame).unwrap_err();
    assert!(matches!(err, ProtocolError::UnsupportedVersion { found: 2, supported: 1 }), "{err}");
    assert!(err.to_string().contains("newer than this binary"));

    let frame = encode(&Message::Serving { generation: 1, pid: 9 }).unwrap();
    assert!(matches!(decode(&frame[..frame.len() - 3]), Err(ProtocolError::Truncated { .. })));
    assert!(matches!(decode(b"GET / HTTP/1.1\r\n"), Err(ProtocolError::BadMagic)));
    let mut corrupt = frame.clone();
    let last = corrupt.len() - 1;
    corrupt[last] = b'!';
    assert!(matches!(decode(&corrupt), Err(ProtocolError::Body(_))));
}

#[test]
fn fds_arrive_close_on_exec_and_counts_are_checked() {
    let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    let file = tempfile::tempfile().unwrap();
    let message = Message::Adopt { generation: 2, init: init(), resend: false };
    send_message(a.as_fd(), &message, &[file.as_fd()]).unwrap();
    let (got, fds) = recv_message(b.as_fd()).unwrap();
    assert_eq!(got, message);
    assert_eq!(fds.len(), 1);
    let flags = FdFlag::from_bits_truncate(fcntl(fds[0].as_fd(), FcntlArg::F_GETFD).unwrap());
    assert!(flags.contains(FdFlag::FD_CLOEXEC), "received fd {} would leak into children", fds[0].as_raw_fd());

    let err = send_message(a.as_fd(), &message, &[]).unwrap_err();
    assert!(matches!(err, ProtocolError::FdCount { expected: 1, found: 0, .. }));
    drop(a);
    assert!(matches!(recv_message(b.as_fd()), Err(ProtocolError::Closed)));
}
