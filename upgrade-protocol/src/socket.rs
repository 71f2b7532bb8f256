//! SOCK_SEQPACKET unix sockets for the control channel: one message per
//! packet, and a peer's death shows as POLLHUP at once.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};

use crate::ProtocolError;

/// Connections waiting to be accepted at most.
pub const LISTEN_BACKLOG_MAX: i32 = 64;

fn socket_error(op: &'static str) -> impl Fn(Errno) -> ProtocolError {
    move |errno| ProtocolError::Socket { op, errno }
}

/// A close-on-exec SEQPACKET socket listening at `path` (which must not
/// exist), with file mode `mode`. The socket is bound and listening under a
/// temporary name next to `path` and renamed into place, so a client that
/// sees `path` can connect (no ECONNREFUSED between bind and listen) and
/// never sees it with a wider mode.
pub fn listen_seqpacket(path: &Path, mode: u32) -> Result<OwnedFd, ProtocolError> {
    use std::os::unix::fs::PermissionsExt;
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(socket_error("socket"))?;
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}", std::process::id()));
    let temp = std::path::PathBuf::from(temp);
    let _ = std::fs::remove_file(&temp);
    let addr = UnixAddr::new(&temp).map_err(socket_error("bind"))?;
    bind(fd.as_raw_fd(), &addr).map_err(socket_error("bind"))?;
    let placed = (|| {
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
            .map_err(io_error("chmod"))?;
        let backlog = Backlog::new(LISTEN_BACKLOG_MAX).map_err(socket_error("listen"))?;
        listen(&fd, backlog).map_err(socket_error("listen"))?;
        std::fs::rename(&temp, path).map_err(io_error("rename"))
    })();
    if placed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    placed.map(|()| fd)
}

fn io_error(op: &'static str) -> impl Fn(std::io::Error) -> ProtocolError {
    move |err| ProtocolError::Socket {
        op,
        errno: err.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
    }
}

/// Accepts one connection (close-on-exec), retrying on EINTR.
pub fn accept_seqpacket(listener: BorrowedFd<'_>) -> Result<OwnedFd, ProtocolError> {
    loop {
        match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a new fd that nothing else owns.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                return Err(ProtocolError::Socket {
                    op: "accept",
                    errno,
                })
            }
        }
    }
}

/// Connects a close-on-exec SEQPACKET socket to `path`.
pub fn connect_seqpacket(path: &Path) -> Result<OwnedFd, ProtocolError> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(socket_error("socket"))?;
    let addr = UnixAddr::new(path).map_err(socket_error("connect"))?;
    connect(fd.as_raw_fd(), &addr).map_err(socket_error("connect"))?;
    Ok(fd)
}
