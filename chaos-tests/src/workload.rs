//! A verifying read workload on a mount, run in its own process so that a
//! test process never blocks in a FUSE call itself (a test thread stuck in
//! the kernel on a dead server cannot be cancelled).
//!
//! Each thread loops: `pread` 4 KiB of `big` (checked against the pattern),
//! read `hello` (checked), `stat` it, and list the root (3 entries). Progress
//! goes to stdout as `ops N` lines; the first error is printed as
//! `error: ...` and ends the process with status 1.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::memfs::{pattern_byte, HELLO, PATTERN_FILE_LEN};

const READ_LEN: usize = 4096;

/// One pass of the loop; returns the operations done.
fn pass(mnt: &Path, big: &std::fs::File, offset: u64) -> Result<u64, String> {
    let mut buf = [0u8; READ_LEN];
    let n = big
        .read_at(&mut buf, offset)
        .map_err(|e| format!("pread big at {offset}: {e}"))?;
    if n != READ_LEN || (0..n).any(|i| buf[i] != pattern_byte(offset + i as u64)) {
        return Err(format!("pread big at {offset}: {n} bytes, content wrong"));
    }
    let hello = std::fs::read(mnt.join("hello")).map_err(|e| format!("read hello: {e}"))?;
    if hello != HELLO {
        return Err(format!("read hello: {} wrong bytes", hello.len()));
    }
    std::fs::metadata(mnt.join("hello")).map_err(|e| format!("stat hello: {e}"))?;
    let entries = std::fs::read_dir(mnt)
        .map_err(|e| format!("readdir: {e}"))?
        .count();
    if entries != 3 {
        return Err(format!("readdir: {entries} entries, expected 3"));
    }
    Ok(4)
}

/// Runs `threads` loops on `mnt` until the process is killed.
pub fn run(mnt: PathBuf, threads: usize) -> ! {
    let ops = Arc::new(AtomicU64::new(0));
    for index in 0..threads.max(1) {
        let (mnt, ops) = (mnt.clone(), Arc::clone(&ops));
        std::thread::spawn(move || {
            let big = match std::fs::File::open(mnt.join("big")) {
                Ok(file) => file,
                Err(err) => fail(&format!("open big: {err}")),
            };
            let span = (PATTERN_FILE_LEN - READ_LEN) as u64;
            let mut offset = (index * READ_LEN) as u64;
            loop {
                match pass(&mnt, &big, offset) {
                    Ok(n) => ops.fetch_add(n, Ordering::Relaxed),
                    Err(err) => fail(&err),
                };
                offset = (offset + 3 * READ_LEN as u64 + 512) % span;
            }
        });
    }
    let mut out = std::io::stdout();
    loop {
        std::thread::sleep(Duration::from_millis(10));
        if writeln!(out, "ops {}", ops.load(Ordering::Relaxed))
            .and_then(|_| out.flush())
            .is_err()
        {
            std::process::exit(0); // The reader went away.
        }
    }
}

fn fail(message: &str) -> ! {
    println!("error: {message}");
    std::process::exit(1);
}
