//! Metadata cost of unlinking a file, with and without sessions (a
//! command, not a test): creates and removes N files on a fresh SQLite
//! volume and prints the process CPU time per file for
//! - `reclaim`: unlink + reclaim with no session registered (the flow
//!   before sessions: nothing held the orphan);
//! - `session`: unlink (which gives every session a hold) + release_orphan
//!   by the one registered session (today's flow for a file nobody has open).
//!
//! Usage: `cargo run --release -p baton-meta --example orphan_cost [N]
//! [reclaim|session]` (with a mode: that flow only, once, for instruction
//! counts under `valgrind --tool=callgrind`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;

use baton_meta::{CreateArgs, FileKind, MetaStore, SessionInfo, VolumeConfig, ROOT_INO};

fn cpu_us() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn run(meta: &dyn MetaStore, n: u32, session: Option<u64>) -> f64 {
    let args = CreateArgs::new(FileKind::Regular, 0o644);
    let start = cpu_us();
    for i in 0..n {
        let name = format!("f{i}");
        let name = OsStr::new(&name);
        meta.create(ROOT_INO, name, &args, None).unwrap();
        let gone = meta.unlink(ROOT_INO, name, None).unwrap();
        match session {
            None => {
                meta.reclaim(gone.ino, None).unwrap();
            }
            Some(id) => {
                assert!(meta.release_orphan(Some(id), gone.ino).unwrap().is_some());
            }
        }
    }
    (cpu_us() - start) as f64 / f64::from(n)
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let config = VolumeConfig {
        name: "bench".into(),
        storage_url: "file:///tmp/objects".into(),
        block_size_bytes: 1 << 20,
    };
    let info = SessionInfo {
        id: 1,
        host: "bench".into(),
        pid: std::process::id(),
        mount: "/bench".into(),
    };
    if let Some(mode) = std::env::args().nth(2) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let meta = baton_meta::format(path.to_str().unwrap(), &config).unwrap();
        let session = (mode == "session").then_some(1);
        if session.is_some() {
            meta.open_session(&info).unwrap();
        }
        println!("{mode}: {:.1} us CPU/file", run(meta.as_ref(), n, session));
        return;
    }
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let meta = baton_meta::format(path.to_str().unwrap(), &config).unwrap();
        let before = run(meta.as_ref(), n, None);
        let path2 = dir.path().join("b.db");
        let meta2 = baton_meta::format(path2.to_str().unwrap(), &config).unwrap();
        meta2.open_session(&info).unwrap();
        let after = run(meta2.as_ref(), n, Some(1));
        println!(
            "round {round}: create+unlink+reclaim {before:.1} us CPU/file; \
             create+unlink+release_orphan (1 session) {after:.1} us CPU/file ({:+.1}%)",
            (after / before - 1.0) * 100.0
        );
    }
}
