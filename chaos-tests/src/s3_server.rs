//! A real S3-compatible server for tests and benches: `moto_server`
//! (`pip install 'moto[server]'`, installed by `.ci/run`) started on a free
//! 127.0.0.1 port, killed on drop, with plain-HTTP helpers to create a
//! bucket and list keys (moto accepts unsigned bucket creation).
//!
//! When `moto_server` is not installed, [`S3Server::start_or_skip`] prints a
//! loud SKIP line and returns `None` — unless `BATON_REQUIRE_S3=1` (set by
//! `.ci/run`), which turns the skip into a test failure.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::mount_guard::{wait_until, ChildGuard};

/// The server program.
pub const S3_SERVER_PROGRAM: &str = "moto_server";
/// Set to `1` to make a missing server fail instead of skip.
pub const REQUIRE_S3_ENV: &str = "BATON_REQUIRE_S3";
/// How long the server may take to answer after it was started.
pub const S3_SERVER_START_TIMEOUT_MS: u64 = 30_000;
/// Credentials handed to clients (moto accepts any by default).
pub const S3_TEST_ACCESS_KEY_ID: &str = "baton-test";
/// See [`S3_TEST_ACCESS_KEY_ID`].
pub const S3_TEST_SECRET_ACCESS_KEY: &str = "baton-test-secret";

/// A running `moto_server`.
pub struct S3Server {
    child: ChildGuard,
    port: u16,
    log: PathBuf,
}

/// Where `program` is on `PATH`, if anywhere.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// A port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl S3Server {
    /// Starts a server, or returns `None` after a loud SKIP message when the
    /// program is missing and [`REQUIRE_S3_ENV`] is not `1`.
    ///
    /// `require_auth`: the server checks credentials from its first request
    /// (moto's `INITIAL_NO_AUTH_ACTION_COUNT=0`), so every key is refused.
    pub fn start_or_skip(test: &str, log_dir: &Path, require_auth: bool) -> Option<S3Server> {
        let Some(program) = find_program(S3_SERVER_PROGRAM) else {
            let required = std::env::var(REQUIRE_S3_ENV).is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{test}: {S3_SERVER_PROGRAM} is not installed but {REQUIRE_S3_ENV}=1: run .ci/run or `pip install 'moto[server]'`"
            );
            eprintln!(
                "\n!!!!! SKIPPED {test}: {S3_SERVER_PROGRAM} is not on PATH; install it with `pip install 'moto[server]'` (CI sets {REQUIRE_S3_ENV}=1 and fails instead) !!!!!\n"
            );
            return None;
        };
        Some(S3Server::start(&program, log_dir, require_auth))
    }

    fn start(program: &Path, log_dir: &Path, require_auth: bool) -> S3Server {
        let port = free_port().expect("a free port");
        let log = log_dir.join(format!("moto-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("create the moto log");
        let mut command = Command::new(program);
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log fd"))
            .stderr(log_file);
        if require_auth {
            command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let child = ChildGuard(command.spawn().expect("spawn moto_server"));
        let mut server = S3Server { child, port, log };
        let up = wait_until(Duration::from_millis(S3_SERVER_START_TIMEOUT_MS), || {
            if let Ok(Some(status)) = server.child.0.try_wait() {
                panic!("moto_server exited with {status}: {}", server.log_text());
            }
            server.http("GET", "/").is_ok()
        });
        assert!(up, "moto_server did not answer: {}", server.log_text());
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server logged (one line per request).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Creates `bucket`; panics if the server refuses.
    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = self
            .http("PUT", &format!("/{bucket}"))
            .expect("create bucket");
        assert_eq!(status, 200, "create bucket {bucket}: {body}");
    }

    /// Writes an empty object `key` into `bucket`.
    pub fn put_empty_object(&self, bucket: &str, key: &str) {
        let (status, body) = self
            .http("PUT", &format!("/{bucket}/{key}"))
            .expect("put object");
        assert_eq!(status, 200, "put {bucket}/{key}: {body}");
    }

    /// Every key under `prefix` in `bucket` (first 1000).
    pub fn list_keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self
            .http("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"))
            .expect("list bucket");
        assert_eq!(status, 200, "list {bucket}: {body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(key, _)| key.to_string()))
            .collect()
    }

    /// Stops the server now (to make the endpoint unreachable).
    pub fn stop(mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }

    /// One plain HTTP/1.1 request; returns (status, body).
    fn http(&self, method: &str, target: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad HTTP response: {response:?}")))?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    }
}
