//! Whether a mount's standby generation is ready, seen from outside the
//! supervisor: what a test waits for before an event that must find one
//! ready (a warm takeover) or must not find one being spawned (a kill -9
//! of the supervisor).
//!
//! A standby connects to its mount's socket once it is ready to take over
//! (volume open, workers started). It counts as ready when its own
//! SEQPACKET socket is connected and the supervisor has accepted it (the
//! mount's socket has a connection beside the serving generation's), both
//! read from `/proc/net/unix`.

use std::path::{Path, PathBuf};

/// One row of `/proc/net/unix`.
struct UnixSocket {
    inode: u64,
    seqpacket: bool,
    /// `SS_CONNECTED`: a connected client, or a connection accept(2)ed.
    connected: bool,
    path: Option<PathBuf>,
}

/// The Unix sockets of this network namespace.
fn unix_sockets() -> Vec<UnixSocket> {
    // Num RefCount Protocol Flags Type St Inode [Path]
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(UnixSocket {
                inode: f.get(6)?.parse().ok()?,
                seqpacket: *f.get(4)? == "0005",
                connected: *f.get(5)? == "03",
                path: f.get(7).map(PathBuf::from),
            })
        })
        .collect()
}

/// The inodes of the sockets `pid` has open.
fn socket_inodes(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let target = std::fs::read_link(e.path()).ok()?;
                    target
                        .to_str()?
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the standby named in `status` (a mount's entry in `fsctl
/// status --json`) has connected to the supervisor whose state directory
/// is `state_dir`.
pub fn standby_connected(status: &serde_json::Value, state_dir: &Path) -> bool {
    let (Some(standby), Some(mount_id)) =
        (status["standby_pid"].as_u64(), status["mount_id"].as_str())
    else {
        return false;
    };
    let Ok(standby) = u32::try_from(standby) else {
        return false;
    };
    let sockets = unix_sockets();
    let own = socket_inodes(standby);
    let connected = sockets
        .iter()
        .any(|u| own.contains(&u.inode) && u.seqpacket && u.connected);
    // Bound as `<id>.sock.<pid>` and renamed: accepted connections carry
    // the name it was bound under.
    let listener = state_dir.join("run").join(format!("{mount_id}.sock"));
    let Some(listener) = listener.to_str() else {
        return false;
    };
    let accepted = sockets
        .iter()
        .filter(|u| {
            u.connected
                && u.path
                    .as_deref()
                    .and_then(Path::to_str)
                    .is_some_and(|p| p == listener || p.starts_with(&format!("{listener}.")))
        })
        .count();
    connected && accepted >= 2
}
