//! Headless Chromium driven over the Chrome DevTools Protocol, for tests
//! that look at a page as a browser lays it out (element boxes, computed
//! styles, a screenshot).
//!
//! The protocol runs on a pipe (`--remote-debugging-pipe`): JSON messages,
//! each ended by a NUL byte, on fd 3 into Chromium and fd 4 out of it. No
//! port and no websocket. [`Browser::start`] opens one page and attaches to
//! it; [`Browser::open`] sets the viewport (`Emulation.setDeviceMetricsOverride`)
//! and loads a URL (until `Page.loadEventFired`); [`Browser::evaluate`] runs
//! JavaScript and returns its value; [`Browser::screenshot_png`] captures
//! the whole page.
//!
//! Chromium runs in its own process group with a fresh profile; dropping
//! the [`Browser`] kills that group (SIGKILL) and reaps it, on every path.
//! Every wait has the deadline given to [`Browser::start`].

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use serde_json::{json, Value};

/// A message from Chromium larger than this ends the session (a
/// full-page screenshot of a long page at device scale 3 is a few MiB).
pub const MESSAGE_BYTES_MAX: usize = 64 << 20;
/// Messages read from Chromium and not yet taken; the reader waits when full.
pub const MESSAGES_QUEUED_MAX: usize = 256;
/// Events kept while waiting for a reply; older ones are dropped.
pub const EVENTS_KEPT_MAX: usize = 256;

/// The fds Chromium's `--remote-debugging-pipe` reads from and writes to.
const CHROMIUM_IN_FD: i32 = 3;
const CHROMIUM_OUT_FD: i32 = 4;

/// What the page is shown on.
#[derive(Clone, Copy, Debug)]
pub struct Viewport {
    /// CSS pixels.
    pub width_px: u32,
    /// CSS pixels.
    pub height_px: u32,
    /// Device pixels per CSS pixel.
    pub device_scale_factor: f64,
    /// A phone: the page's `<meta name="viewport">` applies and scrollbars
    /// overlay the content.
    pub mobile: bool,
}

/// A headless Chromium with one page attached.
pub struct Browser {
    child: Child,
    to_chromium: File,
    from_chromium: Receiver<Result<Value, String>>,
    events: VecDeque<Value>,
    session: String,
    next_id: u64,
    timeout: Duration,
    stderr: PathBuf,
    _profile: tempfile::TempDir,
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")
}

/// Reads NUL-terminated JSON messages from `from` into `tx` until EOF.
fn read_messages(mut from: File, tx: std::sync::mpsc::SyncSender<Result<Value, String>>) {
    let mut pending = Vec::new();
    // Bytes of `pending` known to hold no NUL (a screenshot comes in many reads).
    let mut scanned = 0;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.send(Err(format!("reading from chromium: {e}")));
                return;
            }
        };
        pending.extend_from_slice(&chunk[..n]);
        while let Some(at) = pending[scanned..].iter().position(|&b| b == 0) {
            let end = scanned + at;
            let message = serde_json::from_slice(&pending[..end])
                .map_err(|e| format!("chromium sent a message that is not JSON: {e}"));
            pending.drain(..=end);
            scanned = 0;
            if tx.send(message).is_err() {
                return;
            }
        }
        scanned = pending.len();
        if pending.len() > MESSAGE_BYTES_MAX {
            let _ = tx.send(Err(format!(
                "chromium sent a message over {MESSAGE_BYTES_MAX} bytes"
            )));
            return;
        }
    }
}

/// Headless Chromium as root on a closed network: no sandbox (root), no
/// GPU, and none of its own connections (refused here, many at a time).
pub const HEADLESS_ARGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

impl Browser {
    /// Starts headless `chromium` (fresh profile, no network of its own)
    /// and attaches to a blank page; every later wait is bounded by
    /// `timeout`.
    pub fn start(chromium: &Path, timeout: Duration) -> Result<Browser> {
        let profile = tempfile::tempdir().context("chromium profile dir")?;
        let stderr = profile.path().join("chromium.stderr");
        let (in_read, in_write) = pipe()?;
        let (out_read, out_write) = pipe()?;
        let (in_fd, out_fd) = (in_read.as_raw_fd(), out_write.as_raw_fd());
        let mut command = Command::new(chromium);
        command
            .args(HEADLESS_ARGS)
            .args(["--hide-scrollbars", "--remote-debugging-pipe"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).context("chromium stderr file")?)
            .process_group(0);
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork
        // and exec. The pipe ends are first moved above the fds they go to,
        // so one never overwrites the other, then put at 3 and 4 without
        // CLOEXEC (dup2 clears it).
        unsafe {
            command.pre_exec(move || {
                let high_in = libc::fcntl(in_fd, libc::F_DUPFD_CLOEXEC, 10);
                let high_out = libc::fcntl(out_fd, libc::F_DUPFD_CLOEXEC, 10);
                if high_in < 0
                    || high_out < 0
                    || libc::dup2(high_in, CHROMIUM_IN_FD) < 0
                    || libc::dup2(high_out, CHROMIUM_OUT_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("start {}", chromium.display()))?;
        // Only Chromium holds these ends now: its exit ends the reader.
        drop((in_read, out_write));
        let (tx, rx) = sync_channel(MESSAGES_QUEUED_MAX);
        let from = File::from(out_read);
        std::thread::spawn(move || read_messages(from, tx));
        let mut browser = Browser {
            child,
            to_chromium: File::from(in_write),
            from_chromium: rx,
            events: VecDeque::new(),
            session: String::new(),
            next_id: 1,
            timeout,
            stderr,
            _profile: profile,
        };
        let target = browser.send(None, "Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"]
            .as_str()
            .ok_or_else(|| anyhow!("Target.createTarget returned no targetId: {target}"))?
            .to_owned();
        let attached = browser.send(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        )?;
        browser.session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("Target.attachToTarget returned no sessionId: {attached}"))?
            .to_owned();
        browser.call("Page.enable", json!({}))?;
        Ok(browser)
    }

    /// The last lines Chromium wrote to stderr (for failure messages).
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Sends `method` to the attached page and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    fn next_message(&mut self, deadline: Instant, waiting_for: &str) -> Result<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.from_chromium.recv_timeout(left) {
            Ok(Ok(message)) => Ok(message),
            Ok(Err(e)) => bail!("{e} (waiting for {waiting_for})"),
            Err(RecvTimeoutError::Timeout) => bail!(
                "chromium did not answer {waiting_for} in {:?}; its stderr:\n{}",
                self.timeout,
                self.stderr_tail()
            ),
            Err(RecvTimeoutError::Disconnected) => bail!(
                "chromium closed the pipe (exited?) waiting for {waiting_for}; its stderr:\n{}",
                self.stderr_tail()
            ),
        }
    }

    fn keep_event(&mut self, message: Value) {
        if self.events.len() == EVENTS_KEPT_MAX {
            self.events.pop_front();
        }
        self.events.push_back(message);
    }

    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message)?;
        bytes.push(0);
        self.to_chromium
            .write_all(&bytes)
            .with_context(|| format!("sending {method} to chromium"))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let message = self.next_message(deadline, method)?;
            if message["id"].as_u64() != Some(id) {
                if message.get("method").is_some() {
                    self.keep_event(message);
                }
                continue;
            }
            if let Some(error) = message.get("error") {
                bail!("{method} failed: {error}");
            }
            return Ok(message["result"].clone());
        }
    }

    /// Forgets the events seen so far.
    pub fn clear_events(&mut self) {
        self.events.clear();
    }

    /// Waits for the page's event `method` (one seen since the last
    /// [`Browser::clear_events`] counts) and returns its params.
    pub fn wait_event(&mut self, method: &str) -> Result<Value> {
        let ours = |m: &Value, session: &str| {
            m["method"].as_str() == Some(method) && m["sessionId"].as_str() == Some(session)
        };
        if let Some(at) = self.events.iter().position(|m| ours(m, &self.session)) {
            let event = self.events.remove(at).unwrap_or_default();
            return Ok(event["params"].clone());
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let message = self.next_message(deadline, method)?;
            if ours(&message, &self.session) {
                return Ok(message["params"].clone());
            }
            if message.get("method").is_some() {
                self.keep_event(message);
            }
        }
    }

    /// Shows the page on `viewport`, loads `url` and waits until it fired
    /// its load event.
    pub fn open(&mut self, url: &str, viewport: &Viewport) -> Result<()> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({
                "width": viewport.width_px,
                "height": viewport.height_px,
                "deviceScaleFactor": viewport.device_scale_factor,
                "mobile": viewport.mobile,
            }),
        )?;
        self.clear_events();
        let navigated = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(error) = navigated["errorText"].as_str() {
            bail!("loading {url}: {error}");
        }
        self.wait_event("Page.loadEventFired")
            .with_context(|| format!("loading {url}"))?;
        Ok(())
    }

    /// Evaluates `expression` in the page and returns its value (JSON);
    /// a thrown exception is an error with its text.
    pub fn evaluate(&mut self, expression: &str) -> Result<Value> {
        let reply = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        )?;
        if let Some(exception) = reply.get("exceptionDetails") {
            bail!("the page's script threw: {exception}");
        }
        Ok(reply["result"]["value"].clone())
    }

    /// A PNG of the whole page (beyond the viewport), at the viewport's
    /// device scale.
    pub fn screenshot_png(&mut self) -> Result<Vec<u8>> {
        let metrics = self.call("Page.getLayoutMetrics", json!({}))?;
        let size = &metrics["cssContentSize"];
        let (width, height) = (size["width"].as_f64(), size["height"].as_f64());
        let (Some(width), Some(height)) = (width, height) else {
            bail!("Page.getLayoutMetrics returned no cssContentSize: {metrics}");
        };
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            }),
        )?;
        let data = shot["data"]
            .as_str()
            .ok_or_else(|| anyhow!("Page.captureScreenshot returned no data"))?;
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .context("the screenshot is not base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: the browser and the renderers it started.
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
