//! A generation given a bad handover state refuses it clearly and changes
//! nothing: a state of a newer major version (an old binary must not
//! half-load a new format), a corrupt state, and a truncated journal. Each
//! time the process exits non-zero before serving, naming the file, and a
//! generation started afterwards serves the untouched volume. The test
//! plays the supervisor: it mounts, answers INIT and holds the fd.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::*;
use fuse_wire::{Channel, InitConfig};
use upgrade_protocol::{
    accept_seqpacket, encode_state, listen_seqpacket, recv_message, send_message, HandoverState,
    InflightJournal, Message,
};

/// A generation that serves (killed on drop).
type Serving = (ChildGuard, std::os::fd::OwnedFd);

/// Runs `fsclient serve`, adopts it with `handover`; returns it if it
/// serves, or (exit success, stderr) once it ended.
fn adopt_with(
    vol: &Volume,
    channel: &Channel,
    init: upgrade_protocol::NegotiatedInit,
    handover: Option<&Path>,
    number: u64,
) -> Result<Serving, (bool, String)> {
    let socket = vol.path(&format!("gen{number}.sock"));
    let listener = listen_seqpacket(&socket, 0o600).unwrap();
    let mut child = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_fsclient"))
            .args([
                "serve",
                "--connect",
                s(&socket),
                VOLUME,
                "--base-dir",
                s(&vol.base),
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stream = accept_seqpacket(listener.as_fd()).unwrap();
    let adopt = Message::Adopt {
        generation: number,
        connection_identity: 5,
        init,
        unanswered: upgrade_protocol::Unanswered::Leave,
        handover: handover.map(Path::to_path_buf),
    };
    send_message(stream.as_fd(), &adopt, &[channel.fd()]).unwrap();
    match recv_message(stream.as_fd()) {
        Ok((Message::Serving { .. }, _)) => Ok((child, stream)),
        _ => {
            let status = child.wait_timeout(DEADLINE).expect("exits");
            let mut err = String::new();
            use std::io::Read;
            child
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            Err((status.success(), err))
        }
    }
}

fn state(
    init: upgrade_protocol::NegotiatedInit,
    journal: Option<&Path>,
    journaled: u32,
) -> HandoverState {
    HandoverState {
        generation: 1,
        connection_identity: 5,
        init,
        handles: Vec::new(),
        next_fh: 1,
        open_orphans: Vec::new(),
        locks: Vec::new(),
        journal: journal.map(Path::to_path_buf),
        journaled,
        stopped_reading_ns: 0,
    }
}

#[test]
fn bad_handover_states_are_refused_and_change_nothing() {
    let vol = Volume::new();
    let mnt = vol.mountpoint("mnt");
    let fd = fuse_wire::mount_fuse(&mnt, &fuse_wire::MountOptions::default()).unwrap();
    let _guard = MountGuard::new(&mnt);
    let _watchdog = Watchdog::start(&mnt, std::time::Duration::from_secs(120));
    let channel = Arc::new(Channel::new(fd));
    let init = upgrade_protocol::NegotiatedInit::from(
        &fuse_wire::initialize(&channel, &InitConfig::baton()).unwrap(),
    );

    let newer = vol.path("newer.state");
    let mut bytes = encode_state(&state(init, None, 0)).unwrap();
    bytes[4] = 9;
    fs::write(&newer, &bytes).unwrap();
    let (ok, err) = adopt_with(&vol, &channel, init, Some(&newer), 1)
        .err()
        .expect("refused");
    assert!(!ok && err.contains("newer than this binary"), "{err}");

    let corrupt = vol.path("corrupt.state");
    let mut bytes = encode_state(&state(init, None, 0)).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x40;
    fs::write(&corrupt, &bytes).unwrap();
    let (ok, err) = adopt_with(&vol, &channel, init, Some(&corrupt), 2)
        .err()
        .expect("refused");
    assert!(
        !ok && err.contains("corrupt") && err.contains("rolls back"),
        "{err}"
    );

    let journal = vol.path("journal");
    let full = InflightJournal {
        requests: vec![vec![0u8; 64]],
    }
    .encode()
    .unwrap();
    fs::write(&journal, &full[..full.len() - 10]).unwrap();
    let with_journal = vol.path("with-journal.state");
    fs::write(
        &with_journal,
        encode_state(&state(init, Some(&journal), 1)).unwrap(),
    )
    .unwrap();
    let (ok, err) = adopt_with(&vol, &channel, init, Some(&with_journal), 3)
        .err()
        .expect("refused");
    assert!(!ok && err.contains("in-flight journal is corrupt"), "{err}");

    // Nothing was changed: a generation without a handover serves.
    let serving = adopt_with(&vol, &channel, init, None, 4);
    assert!(serving.is_ok(), "a clean generation serves");
    let (ok, out, err) = sh(&format!("echo ok > {m}/f && cat {m}/f", m = s(&mnt)));
    assert!(ok && out == "ok\n", "{out}{err}");
}
