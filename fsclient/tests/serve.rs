//! The supervisor path: `fsclient serve` adopting an initialized connection
//! from this test (which plays the supervisor: it mounts, answers INIT and
//! keeps /dev/fuse), stopping on SIGTERM without unmounting, a handle opened
//! under one generation used under the next, and a successor recovering a
//! killed generation's staged data (and POSIX ACLs set under it) after
//! RESEND. Needs root, /dev/fuse and setfacl (`acl`).
//!
//! This is the only test of its binary, and every generation is spawned
//! before any file on the mount is opened: a process spawned while this
//! process holds a file on a mount nobody serves would block in execve
//! (close-on-exec sends FLUSH to the mount).

#![allow(clippy::unwrap_used)]

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::*;
use fuse_wire::{Channel, InitConfig, InitParams};
use upgrade_protocol::{
    accept_seqpacket, listen_seqpacket, recv_message, send_message, Message, Unanswered,
};

/// The test as supervisor: holds the mounted, initialized connection.
struct Holder {
    channel: Arc<Channel>,
    params: InitParams,
    _guard: MountGuard,
}

/// A spawned `fsclient serve` waiting for its adopt message.
struct Generation {
    number: u64,
    listener: OwnedFd,
    child: ChildGuard,
}

fn spawn_generation(vol: &Volume, number: u64) -> Generation {
    let socket = vol.path(&format!("gen{number}.sock"));
    let listener = listen_seqpacket(&socket, 0o600).unwrap();
    let child = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_fsclient"))
            .args([
                "serve",
                "--connect",
                s(&socket),
                VOLUME,
                "--base-dir",
                s(&vol.base),
            ])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    Generation {
        number,
        listener,
        child,
    }
}

impl Holder {
    fn mount(mnt: &Path) -> Holder {
        let fd = fuse_wire::mount_fuse(mnt, &fuse_wire::MountOptions::default()).unwrap();
        let guard = MountGuard::new(mnt);
        let channel = Arc::new(Channel::new(fd));
        let params = fuse_wire::initialize(&channel, &InitConfig::baton()).unwrap();
        Holder {
            channel,
            params,
            _guard: guard,
        }
    }

    /// Hands the connection to `generation`; returns once it serves.
    fn adopt(&self, generation: Generation, unanswered: Unanswered) -> ChildGuard {
        // A generation that fails at start never connects: fail, do not hang.
        let mut ready = [nix::poll::PollFd::new(
            generation.listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let polled = nix::poll::poll(&mut ready, nix::poll::PollTimeout::from(30_000u16)).unwrap();
        assert_eq!(
            polled, 1,
            "generation {} did not connect within 30 s",
            generation.number
        );
        let stream = accept_seqpacket(generation.listener.as_fd()).unwrap();
        let adopt = Message::Adopt {
            generation: generation.number,
            connection_identity: 7,
            init: upgrade_protocol::NegotiatedInit::from(&self.params),
            unanswered,
            handover: None,
        };
        send_message(stream.as_fd(), &adopt, &[self.channel.fd()]).unwrap();
        let (reply, _) = recv_message(stream.as_fd()).unwrap();
        let Message::Serving {
            generation: number,
            pid,
            ..
        } = reply
        else {
            panic!("expected serving, got {reply:?}");
        };
        assert_eq!((number, pid), (generation.number, generation.child.0.id()));
        generation.child
    }
}

/// Runs `sh -c SCRIPT` as root; its stdout, or a panic with its stderr.
fn shell_ok(script: &str) -> String {
    let (ok, out, err) = sh(script);
    assert!(ok, "{script}: {err}");
    out
}

fn sigterm(child: &mut ChildGuard) {
    nix::sys::signal::kill(child.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child
        .wait_timeout(DEADLINE)
        .expect("generation exits on SIGTERM");
    assert!(status.success(), "{status}");
}

#[test]
fn serve_adopts_a_connection_and_hands_it_on_without_unmounting() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let holder = Holder::mount(&mnt);
    let _watchdog = Watchdog::start(&mnt, std::time::Duration::from_secs(120));
    let (g1, g2, g3) = (
        spawn_generation(&vol, 1),
        spawn_generation(&vol, 2),
        spawn_generation(&vol, 3),
    );

    let mut gen1 = holder.adopt(g1, Unanswered::Leave);
    fs::write(mnt.join("one"), b"from generation 1").unwrap();
    let open_across = File::open(mnt.join("one")).unwrap();
    sigterm(&mut gen1);
    assert!(
        fuse_wire::connection_id(&mnt).is_ok(),
        "serve never unmounts"
    );

    let mut gen2 = holder.adopt(g2, Unanswered::Resend);
    assert_eq!(fs::read(mnt.join("one")).unwrap(), b"from generation 1");
    let mut buf = [0u8; 4];
    open_across.read_exact_at(&mut buf, 5).unwrap();
    assert_eq!(
        &buf, b"gene",
        "a handle opened under generation 1 still reads"
    );
    drop(open_across);
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("two"))
        .unwrap();
    direct.write_all_at(b"staged by generation 2", 0).unwrap();
    // POSIX ACLs (negotiated at INIT, carried in NegotiatedInit) set under
    // generation 2 ...
    let team = mnt.join("team");
    fs::create_dir(&team).unwrap();
    shell_ok(&format!(
        "setfacl -m u:65533:r {one} && setfacl -d -m u:65533:rwx,g::r-x,o::- {team}",
        one = s(&mnt.join("one")),
        team = s(&team)
    ));
    gen2.0.kill().unwrap();
    gen2.0.wait().unwrap();

    // No generation alive: the successor recovers the staged data, and the
    // RESEND makes the kernel redeliver anything gen2 had read.
    let mut gen3 = holder.adopt(g3, Unanswered::Resend);
    assert_eq!(
        fs::read(mnt.join("two")).unwrap(),
        b"staged by generation 2"
    );
    drop(direct);
    assert_eq!(staged_inodes(&vol), 0);
    // ... outlive its kill -9: generation 3 reads the default ACL from the
    // metadata for a new file (an inode the kernel never cached).
    shell_ok(&format!("umask 077 && touch {}", s(&team.join("new"))));
    assert_eq!(
        shell_ok(&format!("getfacl -n --omit-header {}", s(&team.join("new")))),
        "user::rw-\nuser:65533:rwx\t#effective:rw-\ngroup::r-x\t#effective:r--\nmask::rw-\nother::---\n\n"
    );
    assert!(shell_ok(&format!("getfacl -n {}", s(&mnt.join("one")))).contains("user:65533:r--"));
    sigterm(&mut gen3);
    drop(holder);
}
