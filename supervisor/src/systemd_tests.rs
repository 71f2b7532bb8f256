//! The notify messages, LISTEN_* parsing and a real datagram socket playing
//! systemd's part (messages and the SCM_RIGHTS fd as systemd receives them).

#![allow(clippy::unwrap_used)]

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};

use super::*;

#[test]
fn fdstore_messages_never_let_systemd_poll_and_refuse_bad_names() {
    assert_eq!(
        fdstore_message("0123abcd").unwrap(),
        "FDSTORE=1\nFDNAME=0123abcd\nFDPOLL=0"
    );
    assert_eq!(
        fdstore_remove_message("0123abcd").unwrap(),
        "FDSTOREREMOVE=1\nFDNAME=0123abcd"
    );
    for bad in ["", "a:b", "a b", "x\n", &"x".repeat(FDNAME_LEN_MAX + 1)] {
        assert!(fdstore_message(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(ready_message("2 mounts\nok"), "READY=1\nSTATUS=2 mounts ok");
    assert_eq!(status_message("x"), "STATUS=x");
}

#[test]
fn listen_fds_are_matched_by_name_and_only_for_our_pid() {
    let got = parse_listen_fds(Some("42"), Some("3"), Some("b:a:c"), 42)
        .unwrap()
        .unwrap();
    assert_eq!(got, vec![("b".into(), 3), ("a".into(), 4), ("c".into(), 5)]);
    assert_eq!(
        parse_listen_fds(Some("41"), Some("3"), Some("b:a:c"), 42).unwrap(),
        None
    );
    assert_eq!(parse_listen_fds(None, None, None, 42).unwrap(), None);
    assert_eq!(
        parse_listen_fds(Some("42"), Some("0"), None, 42).unwrap(),
        Some(vec![])
    );
    let unnamed = parse_listen_fds(Some("42"), Some("1"), None, 42)
        .unwrap()
        .unwrap();
    assert_eq!(unnamed, vec![("unknown".into(), 3)]);
    assert!(parse_listen_fds(Some("42"), Some("2"), Some("a"), 42).is_err());
    assert!(parse_listen_fds(Some("x"), Some("1"), None, 42).is_err());
    assert!(parse_listen_fds(Some("42"), Some("-1"), None, 42).is_err());
    let too_many = (LISTEN_FDS_MAX + 1).to_string();
    assert!(parse_listen_fds(Some("42"), Some(&too_many), None, 42).is_err());
}

#[test]
fn the_watchdog_pings_at_half_its_timeout_and_only_for_our_pid() {
    assert_eq!(
        watchdog_interval(Some("10000000"), None, 7),
        Some(Duration::from_secs(5))
    );
    assert_eq!(
        watchdog_interval(Some("10000000"), Some("7"), 7),
        Some(Duration::from_secs(5))
    );
    assert_eq!(watchdog_interval(Some("10000000"), Some("8"), 7), None);
    assert_eq!(watchdog_interval(Some("0"), None, 7), None);
    assert_eq!(watchdog_interval(None, None, 7), None);
}

/// One datagram as systemd reads it: the text and any passed fds.
fn receive(socket: &UnixDatagram) -> (String, Vec<OwnedFd>) {
    let mut buf = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let msg = recvmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .unwrap();
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            fds.extend(raw.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    let len = msg.bytes;
    (String::from_utf8_lossy(&buf[..len]).into_owned(), fds)
}

fn systemd_socket(abstract_name: Option<&str>) -> (UnixDatagram, Vec<u8>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    match abstract_name {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
            let socket = UnixDatagram::bind_addr(&addr).unwrap();
            (socket, format!("@{name}").into_bytes(), dir)
        }
        None => {
            let path = dir.path().join("notify");
            let socket = UnixDatagram::bind(&path).unwrap();
            (socket, path.as_os_str().as_encoded_bytes().to_vec(), dir)
        }
    }
}

#[test]
fn a_socket_playing_systemd_receives_ready_status_and_the_stored_fd() {
    let (systemd, path, _dir) = systemd_socket(None);
    systemd
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut notifier = Notifier::new(Some(&path), None);
    assert!(notifier.active());
    notifier.ready("1 mount");
    assert_eq!(receive(&systemd).0, "READY=1\nSTATUS=1 mount");
    notifier.status("1 mount");
    notifier.status("2 mounts");
    // The unchanged status was not sent again.
    assert_eq!(receive(&systemd).0, "STATUS=2 mounts");

    let (reader, writer) = nix::unistd::pipe().unwrap();
    let mut reader = std::fs::File::from(reader);
    notifier.store_fd("abc", writer.as_fd());
    let (text, fds) = receive(&systemd);
    assert_eq!(text, "FDSTORE=1\nFDNAME=abc\nFDPOLL=0");
    assert_eq!(fds.len(), 1);
    // The received fd is the same open pipe.
    drop(writer);
    let mut stored = std::fs::File::from(fds.into_iter().next().unwrap());
    stored.write_all(b"via systemd").unwrap();
    drop(stored);
    let mut got = String::new();
    reader.read_to_string(&mut got).unwrap();
    assert_eq!(got, "via systemd");

    notifier.remove_fd("abc");
    let (text, fds) = receive(&systemd);
    assert_eq!(text, "FDSTOREREMOVE=1\nFDNAME=abc");
    assert!(fds.is_empty());
}

#[test]
fn an_abstract_notify_socket_and_the_watchdog_schedule_work() {
    let name = format!("baton-notify-test-{}", std::process::id());
    let (systemd, path, _dir) = systemd_socket(Some(&name));
    systemd
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut notifier = Notifier::new(Some(&path), Some(Duration::from_millis(20)));
    let due = notifier.next_deadline().unwrap();
    notifier.tick(due - Duration::from_millis(10));
    notifier.tick(due);
    assert_eq!(receive(&systemd).0, "WATCHDOG=1");
    assert!(notifier.next_deadline().unwrap() >= due + Duration::from_millis(20));
    // Only one ping was sent (the early tick did nothing).
    systemd.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(systemd.recv(&mut buf).is_err());
}

#[test]
fn without_notify_socket_everything_is_a_no_op() {
    let mut notifier = Notifier::new(None, Some(Duration::from_millis(1)));
    assert!(!notifier.active());
    assert_eq!(notifier.next_deadline(), None);
    notifier.ready("x");
    notifier.tick(Instant::now());
}
