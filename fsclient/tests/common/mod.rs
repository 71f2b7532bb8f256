//! Shared fixtures of the fsclient mount tests: a formatted volume in a
//! temp dir, the real `fsclient` binary as a child process (killed on
//! drop), a mount guard that unmounts with MNT_DETACH on every path (and
//! aborts the connection first when the test failed), a watchdog that
//! aborts a connection stuck past its deadline, and shell helpers that run
//! as root or as `nobody`.

#![allow(dead_code, clippy::unwrap_used)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_meta::VolumeConfig;
/// The same guards the chaos tests use: unmount on every path, kill children.
pub use chaos_tests::mount_guard::{wait_until, ChildGuard, MountGuard};

/// How long anything may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// Block size of test volumes: small, so small files span several blocks.
pub const BLOCK_SIZE: u32 = 64 * 1024;
/// The volume name.
pub const VOLUME: &str = "vol";

/// A volume under a temp dir.
pub struct Volume {
    pub dir: tempfile::TempDir,
    pub base: PathBuf,
    pub data: PathBuf,
}

impl Volume {
    pub fn new() -> Volume {
        Volume::with_block_size(BLOCK_SIZE)
    }

    pub fn with_block_size(block_size_bytes: u32) -> Volume {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().join("base");
        let data = dir.path().join("data");
        baton_blocks::private_fs::create_dir_all(&base.join(VOLUME)).expect("volume dir");
        std::fs::create_dir_all(&data).expect("data dir");
        let config = VolumeConfig {
            name: VOLUME.into(),
            storage_url: format!("file://{}", data.display()),
            block_size_bytes,
        };
        let meta = baton_meta::format(s(&base.join(VOLUME).join("meta.db")), &config)
            .expect("format the volume");
        drop(meta);
        Volume { dir, base, data }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn meta_path(&self) -> PathBuf {
        self.base.join(VOLUME).join("meta.db")
    }

    /// A fresh empty mountpoint.
    pub fn mountpoint(&self, name: &str) -> PathBuf {
        let mnt = self.path(name);
        std::fs::create_dir_all(&mnt).expect("mountpoint");
        mnt
    }

    /// `fsclient mount vol MNT --base-dir BASE ...extra`, not waited for.
    pub fn spawn_mount(&self, mnt: &Path, extra: &[&str]) -> ChildGuard {
        self.spawn_mount_env(mnt, extra, &[])
    }

    /// [`Volume::spawn_mount`] with more environment variables for fsclient.
    pub fn spawn_mount_env(&self, mnt: &Path, extra: &[&str], env: &[(&str, &str)]) -> ChildGuard {
        let mut args = vec!["mount", VOLUME, s(mnt), "--base-dir", s(&self.base)];
        args.extend_from_slice(extra);
        ChildGuard(
            Command::new(env!("CARGO_BIN_EXE_fsclient"))
                .args(&args)
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn fsclient"),
        )
    }

    /// Mounts and waits until the mount answers.
    pub fn mount(&self, mnt: &Path) -> Mounted {
        self.mount_with(mnt, &[])
    }

    pub fn mount_with(&self, mnt: &Path, extra: &[&str]) -> Mounted {
        self.mount_with_env(mnt, extra, &[])
    }

    /// [`Volume::mount_with`] with more environment variables for fsclient.
    pub fn mount_with_env(&self, mnt: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mounted {
        let mut child = self.spawn_mount_env(mnt, extra, env);
        let up = wait_until(DEADLINE, || {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("fsclient exited before mounting: {status}");
            }
            fuse_wire::connection_id(mnt).is_ok()
        });
        assert!(up, "fsclient did not mount {}", mnt.display());
        let guard = MountGuard::new(mnt);
        Mounted {
            watchdog: Watchdog::start(mnt, Duration::from_secs(120)),
            guard,
            child,
            mnt: mnt.to_path_buf(),
        }
    }

    /// Runs `fsclient ARGS` to completion (for bad-input cases).
    pub fn run_fsclient(&self, args: &[&str]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fsclient"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fsclient");
        let deadline = Instant::now() + DEADLINE;
        loop {
            if child.try_wait().expect("wait").is_some() {
                return child.wait_with_output().expect("output");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                // It mounted where it should have refused: leave no mount.
                for arg in args {
                    if fuse_wire::connection_id(Path::new(arg)).is_ok() {
                        drop(MountGuard::new(Path::new(arg)));
                    }
                }
                panic!("fsclient {args:?} did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A running mount: dropping it kills fsclient and unmounts.
pub struct Mounted {
    pub watchdog: Watchdog,
    pub guard: MountGuard,
    pub child: ChildGuard,
    pub mnt: PathBuf,
}

impl Mounted {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// fsync of the mount's root (FSYNCDIR): what the mount replied is
    /// then committed, so another connection to its database sees it
    /// (before, it may sit in the writer's open batch for a few ms).
    pub fn sync_metadata(&self) {
        std::fs::File::open(&self.mnt).unwrap().sync_all().unwrap();
    }

    /// SIGKILLs fsclient, then detaches the dead mount (`umount -l`).
    pub fn kill9(mut self) {
        self.child.0.kill().unwrap();
        self.child.0.wait().unwrap();
        fuse_wire::unmount(&self.mnt).unwrap();
    }

    /// SIGTERM, then waits for a clean exit (flush + unmount).
    pub fn stop(mut self) {
        nix::sys::signal::kill(self.child.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self
            .child
            .wait_timeout(DEADLINE)
            .expect("fsclient exits after SIGTERM");
        assert!(status.success(), "fsclient exit status {status}");
        assert!(
            fuse_wire::connection_id(&self.mnt).is_err(),
            "still mounted after SIGTERM"
        );
    }
}

/// Aborts the mount's connection if the test is still running at the
/// deadline, so a hung request fails the test instead of hanging it.
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn start(mnt: &Path, after: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let mnt = mnt.to_path_buf();
        std::thread::spawn(move || {
            let deadline = Instant::now() + after;
            while Instant::now() < deadline {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("watchdog: aborting {} after {after:?}", mnt.display());
            let _ = fuse_wire::abort_connection(&mnt);
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Inodes with data in the volume's staging area: inode directories
/// holding a file (an emptied one waits there for the timer thread, and
/// `retired/` holds only what is being removed).
pub fn staged_inodes(vol: &Volume) -> usize {
    let dir = vol.base.join(VOLUME).join("staging");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.expect("staging dir entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.len() == 16) && p.is_dir())
        .filter(|p| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()))
        .count()
}

/// The block object files of inode `ino` in the volume's data directory.
pub fn object_files(vol: &Volume, ino: u64) -> Vec<PathBuf> {
    chaos_tests::stored::object_files(&vol.data, ino)
}

pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

pub fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// fallocate(2) on `f`; the errno on failure.
pub fn fallocate(f: &std::fs::File, mode: i32, offset: u64, len: u64) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open fd.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// The errno of the last failed libc call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Runs `sh -c SCRIPT` as root; returns (success, stdout, stderr).
pub fn sh(script: &str) -> (bool, String, String) {
    run_shell(Command::new("sh").arg("-c").arg(script))
}

/// Runs `sh -c SCRIPT` as uid/gid 65534 (nobody) without supplementary
/// groups.
pub fn sh_as_nobody(script: &str) -> (bool, String, String) {
    sh_as(65534, 65534, script)
}

pub fn sh_as(uid: u32, gid: u32, script: &str) -> (bool, String, String) {
    run_shell(
        Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .args(["sh", "-c", script]),
    )
}

fn run_shell(cmd: &mut Command) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shell");
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("shell command did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file under `dir` with its bytes, sorted: to prove nothing changed.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.push((path.clone(), Vec::new()));
                stack.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 5) as u8)
        .collect()
}

/// Bytes `statvfs` reports used under `path` (df).
pub fn df_used_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    (st.blocks() - st.blocks_free()) * st.fragment_size()
}

/// [`open_rw`] with O_DIRECT: each write(2) is a WRITE, so a refusal
/// (EDQUOT) reaches it.
pub fn open_direct(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap()
}

/// Opens `path` for reading and writing, creating it (never truncating).
pub fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}
