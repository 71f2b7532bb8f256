//! Checks before the supervisor starts: a kernel FUSE request timeout
//! (`/proc/sys/fs/fuse/default_request_timeout`, `max_request_timeout`)
//! aborts the whole connection when a request waits longer than it, which a
//! handover gap can; the mount would be lost for good (fuse-handover.md,
//! pitfall 7). So both must be 0.

use std::path::Path;

use crate::Error;

/// Where the FUSE sysctls live.
pub const FUSE_SYSCTL_DIR: &str = "/proc/sys/fs/fuse";

/// The two request-timeout sysctls, in seconds; `None` when the kernel has
/// no such file (older kernels have no timeouts at all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestTimeouts {
    /// `default_request_timeout`.
    pub default_s: Option<u64>,
    /// `max_request_timeout`.
    pub max_s: Option<u64>,
}

/// Refuses any non-zero request timeout. Pure.
pub fn check_request_timeouts(timeouts: RequestTimeouts) -> Result<(), Error> {
    for (name, value) in [
        ("default_request_timeout", timeouts.default_s),
        ("max_request_timeout", timeouts.max_s),
    ] {
        if let Some(value_s) = value.filter(|v| *v != 0) {
            return Err(Error::RequestTimeout { name, value_s });
        }
    }
    Ok(())
}

/// Reads both sysctls from `dir` (normally [`FUSE_SYSCTL_DIR`]).
pub fn read_request_timeouts(dir: &Path) -> Result<RequestTimeouts, Error> {
    let read = |name: &str| -> Result<Option<u64>, Error> {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| Error::Io {
                op: "parsing",
                path,
                source: std::io::Error::other(format!("`{}` is not a number", text.trim())),
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io {
                op: "reading",
                path,
                source,
            }),
        }
    };
    Ok(RequestTimeouts {
        default_s: read("default_request_timeout")?,
        max_s: read("max_request_timeout")?,
    })
}

/// Checks that `binary` can be a generation's executable: an absolute path
/// to an executable regular file. The message names the file and the fix.
/// How long starting a binary retries while it is busy (ETXTBSY): a
/// binary just copied into place stays open for writing in every process
/// its writer forked meanwhile, until that child execs (a multi-threaded
/// installer or test runner), and exec refuses a file open for writing.
pub const TEXT_BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `attempt` (a spawn or exec of a binary) again while it fails with
/// ETXTBSY, for at most [`TEXT_BUSY_RETRY`]; any other outcome at once.
pub fn retrying_busy<T>(mut attempt: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = std::time::Instant::now() + TEXT_BUSY_RETRY;
    loop {
        match attempt() {
            Err(err)
                if err.raw_os_error() == Some(libc::ETXTBSY)
                    && std::time::Instant::now() < deadline =>
            {
                tracing::debug!(%err, "binary busy (open for writing); retrying");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            outcome => return outcome,
        }
    }
}

pub fn check_client_binary(binary: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if !binary.is_absolute() {
        return Err(format!(
            "fsclient binary {} is not an absolute path; pass the full path",
            binary.display()
        ));
    }
    match std::fs::metadata(binary) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(_) => Err(format!(
            "fsclient binary {} is not an executable file; check the path and its mode",
            binary.display()
        )),
        Err(err) => Err(format!(
            "fsclient binary {} cannot be read: {err}; check the path",
            binary.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts(default_s: Option<u64>, max_s: Option<u64>) -> RequestTimeouts {
        RequestTimeouts { default_s, max_s }
    }

    #[test]
    fn a_busy_binary_is_tried_again_until_it_is_free_or_the_time_is_up() {
        let mut busy_left = 3;
        let started = std::time::Instant::now();
        let outcome = retrying_busy(|| {
            if busy_left == 0 {
                return Ok("ran");
            }
            busy_left -= 1;
            Err(std::io::Error::from_raw_os_error(libc::ETXTBSY))
        });
        assert_eq!(outcome.ok(), Some("ran"));
        let always_busy: std::io::Result<()> =
            retrying_busy(|| Err(std::io::Error::from_raw_os_error(libc::ETXTBSY)));
        assert_eq!(
            always_busy.err().and_then(|e| e.raw_os_error()),
            Some(libc::ETXTBSY)
        );
        assert!(started.elapsed() >= TEXT_BUSY_RETRY);
        let mut calls = 0;
        let other: std::io::Result<()> = retrying_busy(|| {
            calls += 1;
            Err(std::io::Error::from_raw_os_error(libc::ENOENT))
        });
        assert!(other.is_err());
        assert_eq!(calls, 1, "only ETXTBSY is retried");
    }

    #[test]
    fn zero_or_absent_timeouts_pass_and_any_other_value_is_refused() {
        assert!(check_request_timeouts(timeouts(Some(0), Some(0))).is_ok());
        assert!(check_request_timeouts(timeouts(None, None)).is_ok());
        let err = check_request_timeouts(timeouts(Some(0), Some(30))).unwrap_err();
        assert!(matches!(
            err,
            Error::RequestTimeout {
                name: "max_request_timeout",
                value_s: 30
            }
        ));
        assert!(err
            .to_string()
            .contains("sysctl -w fs.fuse.max_request_timeout=0"));
        let err = check_request_timeouts(timeouts(Some(5), None)).unwrap_err();
        assert!(
            err.to_string().contains("default_request_timeout is 5 s"),
            "{err}"
        );
    }

    #[test]
    fn sysctl_files_are_read_and_missing_ones_mean_no_timeout() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            read_request_timeouts(dir.path()).unwrap(),
            timeouts(None, None)
        );
        std::fs::write(dir.path().join("default_request_timeout"), "0\n").unwrap();
        std::fs::write(dir.path().join("max_request_timeout"), "12\n").unwrap();
        assert_eq!(
            read_request_timeouts(dir.path()).unwrap(),
            timeouts(Some(0), Some(12))
        );
        std::fs::write(dir.path().join("max_request_timeout"), "x\n").unwrap();
        assert!(read_request_timeouts(dir.path()).is_err());
    }
}
