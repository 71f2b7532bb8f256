//! The control socket: mode 0600, one supervisor per socket, root gets
//! answers, and a non-root peer (a forked child that became `nobody`) is
//! refused by SO_PEERCRED with a message saying why.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use upgrade_protocol::client::request;
use upgrade_protocol::{encode, StatusReport};

use super::*;

const NOBODY: libc::uid_t = 65534;

fn status_handler() -> Handler {
    Arc::new(|request| match request {
        Request::Status => Reply::Status {
            report: StatusReport::default(),
        },
        other => Reply::Error {
            kind: ErrorKind::Invalid,
            message: format!("unexpected {}", other.name()),
        },
    })
}

#[test]
fn socket_is_private_single_and_answers_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/supervisor.sock");
    let listener = bind(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let err = bind(&path).unwrap_err();
    assert!(matches!(err, Error::AlreadyRunning { .. }), "{err}");
    let _server = serve(listener, path.clone(), status_handler());
    let reply = request(&path, &Request::Status, Duration::from_secs(10)).unwrap();
    assert_eq!(
        reply,
        Reply::Status {
            report: StatusReport::default()
        }
    );
}

#[test]
fn connections_beyond_the_limit_are_refused_with_a_retry_hint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.sock");
    let listener = bind(&path).unwrap();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let handler: Handler = Arc::new(move |_| {
        let _ = gate.lock().unwrap().recv();
        Reply::Status {
            report: StatusReport::default(),
        }
    });
    let _server = serve(listener, path.clone(), handler);
    // Fill every slot with a request the handler holds (one at a time,
    // the rest queued on the gate's mutex).
    let busy: Vec<_> = (0..CONTROL_CONNECTIONS_MAX)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || request(&path, &Request::Status, Duration::from_secs(30)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let reply = request(&path, &Request::Status, Duration::from_secs(10)).unwrap();
    let Reply::Error { kind, message } = reply else {
        panic!("expected a refusal, got {reply:?}");
    };
    assert_eq!(kind, ErrorKind::Failed);
    assert!(message.contains("retry"), "{message}");
    for _ in 0..CONTROL_CONNECTIONS_MAX {
        release.send(()).unwrap();
    }
    for thread in busy {
        assert!(matches!(thread.join().unwrap(), Ok(Reply::Status { .. })));
    }
}

#[test]
fn stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    drop(bind(&path).unwrap());
    assert!(path.exists());
    let _listener = bind(&path).unwrap();
}

#[test]
fn peer_credentials_refuse_a_non_root_peer() {
    assert!(allowed_peer(0, 0));
    assert!(allowed_peer(1000, 1000));
    assert!(!allowed_peer(NOBODY, 0));

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("supervisor.sock");
    let listener = bind(&path).unwrap();
    // Let `nobody` reach connect(2), so the SO_PEERCRED check is what
    // refuses it (normally the 0600 mode already does).
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let _server = serve(listener, path.clone(), status_handler());

    // Everything the child needs is prepared before fork: after fork in a
    // multi-threaded process only async-signal-safe calls are allowed.
    let frame = encode(&Message::Control {
        request: Request::Status,
    })
    .unwrap();
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let needle = b"permission_denied";
    let hint = b"run fsctl as root";

    // SAFETY: the child only makes raw syscalls on prepared data and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        unsafe {
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if fd < 0 || libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                libc::_exit(11);
            }
            if libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) < 0 {
                libc::_exit(12);
            }
            let mut buf = [0u8; 4096];
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n <= 0 {
                libc::_exit(if n == 0 {
                    13
                } else {
                    100 + *libc::__errno_location()
                });
            }
            let got = &buf[..n as usize];
            let has = |pat: &[u8]| got.windows(pat.len()).any(|w| w == pat);
            libc::_exit(if has(needle) && has(hint) { 0 } else { 14 });
        }
    }
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0),
        "exit 10: setuid, 11: connect, 12: send, 13: no reply, 14: reply was not a refusal"
    );
}
