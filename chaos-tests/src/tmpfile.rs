//! Atomic publication through O_TMPFILE, as writers of checkpoints do it:
//! open a file without a name in the target directory, write it, then
//! give it its name with `linkat` (nobody ever sees a partial file). The
//! calls, and [`publish`] (run as `baton-testfs tmpfile-publish` by kill
//! tests: it can wait between its write and its link while the test kills
//! the serving generation).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long [`publish`] waits for its go file.
pub const GO_WAIT_MAX: Duration = Duration::from_secs(60);

fn c_path(path: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// `open(dir, O_TMPFILE | O_RDWR | extra_flags, mode)`.
pub fn open_tmpfile(dir: &Path, extra_flags: i32, mode: u32) -> std::io::Result<File> {
    let path = c_path(dir)?;
    // SAFETY: a valid NUL-terminated path; the fd returned is ours alone.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC | extra_flags,
            mode,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new open file descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `linkat(file, "", AT_FDCWD, to, AT_EMPTY_PATH)`: gives the open file
/// `file` the name `to`.
pub fn link_open_file(file: &File, to: &Path) -> std::io::Result<()> {
    let to = c_path(to)?;
    // SAFETY: a valid fd and NUL-terminated paths; plain syscall.
    let rc = unsafe {
        libc::linkat(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The content [`publish`] writes: `len` bytes from `seed`.
pub fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What [`publish`] does.
#[derive(Clone, Debug)]
pub struct PublishConfig {
    /// The directory to publish into.
    pub dir: PathBuf,
    /// The name the file gets.
    pub name: String,
    /// Its size.
    pub len: usize,
    /// Seed of its content ([`content`]).
    pub seed: u64,
    /// Created once the data is written (before the link).
    pub ready_file: Option<PathBuf>,
    /// Waited for (up to [`GO_WAIT_MAX`]) before the link.
    pub go_file: Option<PathBuf>,
    /// Close the file without linking it (it must then be reclaimed).
    pub discard: bool,
}

/// Writes `len` bytes into an O_TMPFILE in `dir`, links it as `name`,
/// then checks it through the name: nlink 1, the size, the same inode,
/// every byte. With `discard`, closes it instead (after the go file) and
/// checks that `name` does not exist.
pub fn publish(config: &PublishConfig) -> anyhow::Result<()> {
    let data = content(config.len, config.seed);
    let mut file = open_tmpfile(&config.dir, 0, 0o600)
        .with_context(|| format!("open(O_TMPFILE) in {}", config.dir.display()))?;
    file.write_all(&data).context("write")?;
    let ino = file.metadata().context("fstat")?.ino();
    if let Some(ready) = &config.ready_file {
        std::fs::write(ready, b"").context("ready file")?;
    }
    if let Some(go) = &config.go_file {
        let deadline = Instant::now() + GO_WAIT_MAX;
        while !go.exists() {
            if Instant::now() > deadline {
                bail!("{} did not appear within {GO_WAIT_MAX:?}", go.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let path = config.dir.join(&config.name);
    if config.discard {
        drop(file);
        if path.symlink_metadata().is_ok() {
            bail!("{} exists though nothing linked it", path.display());
        }
        return Ok(());
    }
    link_open_file(&file, &path).with_context(|| format!("linkat {}", path.display()))?;
    drop(file);
    let st = std::fs::metadata(&path).context("stat the published name")?;
    if (st.nlink(), st.len(), st.ino()) != (1, data.len() as u64, ino) {
        bail!(
            "published file: nlink {}, size {}, inode {} (expected 1, {}, {ino})",
            st.nlink(),
            st.len(),
            st.ino(),
            data.len()
        );
    }
    let back = std::fs::read(&path).context("read the published name")?;
    if let Some(at) = (0..data.len()).find(|&i| back.get(i) != data.get(i)) {
        bail!("byte {at} of {} differs", data.len());
    }
    if back.len() != data.len() {
        bail!("read {} bytes of {}", back.len(), data.len());
    }
    Ok(())
}
