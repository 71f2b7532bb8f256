//! Prometheus metrics (`GET /metrics`, text format 0.0.4) and a small HTML
//! status page (`GET /`) on a loopback address (`--metrics-listen`). The
//! event loop publishes a [`Snapshot`] of every mount's status after each
//! turn; one thread answers HTTP from the latest snapshot, so a scrape never
//! touches the loop. Plain std HTTP/1.0: one request per connection, a
//! bounded request size and a read timeout.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use upgrade_protocol::MountStatus;

/// Bytes of an HTTP request read at most.
pub const REQUEST_BYTES_MAX: usize = 8192;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT_MS: u64 = 2_000;

/// The latest statuses, shared between the loop and the HTTP thread.
#[derive(Clone)]
pub struct Snapshot {
    mounts: Arc<Mutex<Vec<MountStatus>>>,
    started: Instant,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            mounts: Arc::default(),
            started: Instant::now(),
        }
    }
}

impl Snapshot {
    /// Replaces the statuses (called by the loop).
    pub fn publish(&self, mounts: Vec<MountStatus>) {
        if let Ok(mut guard) = self.mounts.lock() {
            *guard = mounts;
        }
    }

    fn read(&self) -> Vec<MountStatus> {
        self.mounts.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The metrics text for `mounts`. Pure.
pub fn render(mounts: &[MountStatus], uptime_s: u64) -> String {
    let mut out = String::new();
    metric(
        &mut out,
        "baton_supervisor_uptime_seconds",
        "gauge",
        "Seconds since fs-supervisor started.",
    );
    let _ = writeln!(out, "baton_supervisor_uptime_seconds {uptime_s}");
    metric(&mut out, "baton_supervisor_mounts", "gauge", "Mounts held.");
    let _ = writeln!(out, "baton_supervisor_mounts {}", mounts.len());
    let labels = |m: &MountStatus| {
        format!(
            "mount=\"{}\",mountpoint=\"{}\",volume=\"{}\"",
            escape_label(&m.mount_id),
            escape_label(&m.mountpoint.to_string_lossy()),
            escape_label(&m.volume)
        )
    };
    type Gauge = fn(&MountStatus) -> u64;
    let gauges: [(&str, &str, Gauge); 4] = [
        (
            "baton_mount_generation",
            "The generation serving (or starting).",
            |m| m.generation,
        ),
        (
            "baton_mount_uptime_seconds",
            "Seconds since the mount was made.",
            |m| m.uptime_s,
        ),
        (
            "baton_mount_generation_uptime_seconds",
            "Seconds the current generation has served.",
            |m| m.generation_uptime_s,
        ),
        (
            "baton_mount_consecutive_failures",
            "Failed starts in a row.",
            |m| u64::from(m.consecutive_failures),
        ),
    ];
    for (name, help, value) in gauges {
        metric(&mut out, name, "gauge", help);
        for m in mounts {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(m), value(m));
        }
    }
    metric(
        &mut out,
        "baton_mount_serving",
        "gauge",
        "1 when a generation serves the mount.",
    );
    for m in mounts {
        let _ = writeln!(
            out,
            "baton_mount_serving{{{}}} {}",
            labels(m),
            u8::from(m.state == "serving")
        );
    }
    metric(
        &mut out,
        "baton_mount_restarts_total",
        "counter",
        "Generation deaths by cause (exit, signal, oom).",
    );
    for m in mounts {
        for (cause, n) in [
            ("exit", m.restarts.exit),
            ("signal", m.restarts.signal),
            ("oom", m.restarts.oom),
        ] {
            let _ = writeln!(
                out,
                "baton_mount_restarts_total{{{},cause=\"{cause}\"}} {n}",
                labels(m)
            );
        }
    }
    metric(
        &mut out,
        "baton_mount_last_takeover_seconds",
        "gauge",
        "Death to serving of the last recovery.",
    );
    for m in mounts {
        if let Some(us) = m.last_recovery.as_ref().and_then(|r| r.takeover_us) {
            let _ = writeln!(
                out,
                "baton_mount_last_takeover_seconds{{{}}} {}",
                labels(m),
                us as f64 / 1e6
            );
        }
    }
    out
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The status page. Pure.
pub fn render_page(mounts: &[MountStatus], uptime_s: u64) -> String {
    let mut rows = String::new();
    for m in mounts {
        let recovery = m
            .last_recovery
            .as_ref()
            .map(|r| {
                format!(
                    "gen {} {} → {:?} in {:?} µs",
                    r.died_generation, r.cause, r.next_generation, r.takeover_us
                )
            })
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}/{}/{}</td><td>{} s</td><td>{}</td></tr>",
            escape_html(&m.mountpoint.to_string_lossy()),
            escape_html(&m.volume),
            escape_html(&m.state),
            m.generation,
            m.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            m.restarts.exit,
            m.restarts.signal,
            m.restarts.oom,
            m.uptime_s,
            escape_html(&recovery)
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fs-supervisor</title></head><body>\
         <h1>fs-supervisor</h1><p>up {uptime_s} s, {} mounts. <a href=\"/metrics\">metrics</a></p>\
         <table border=\"1\"><tr><th>mountpoint</th><th>volume</th><th>state</th><th>generation</th><th>pid</th>\
         <th>restarts exit/signal/oom</th><th>uptime</th><th>last recovery</th></tr>{rows}</table></body></html>\n",
        mounts.len()
    )
}

/// Binds `addr` (refusing non-loopback addresses: the page names paths
/// and pids) and answers in a thread.
pub fn serve(addr: SocketAddr, snapshot: Snapshot) -> std::io::Result<SocketAddr> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--metrics-listen {addr} is not a loopback address; use 127.0.0.1:PORT or [::1]:PORT"),
        ));
    }
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, "metrics and status page");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(err) = answer(stream, &snapshot) {
                    tracing::debug!(%err, "metrics request failed");
                }
            }
        })?;
    Ok(local)
}

fn answer(mut stream: TcpStream, snapshot: &Snapshot) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < REQUEST_BYTES_MAX {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let mounts = snapshot.read();
    let uptime_s = snapshot.started.elapsed().as_secs();
    let (status, kind, body) = match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            render(&mounts, uptime_s),
        ),
        "/" => (
            "200 OK",
            "text/html; charset=utf-8",
            render_page(&mounts, uptime_s),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics or /\n".into(),
        ),
    };
    write!(
        stream,
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use upgrade_protocol::{NegotiatedInit, Recovery, Restarts};

    fn status() -> MountStatus {
        MountStatus {
            mount_id: "abc".into(),
            mountpoint: "/mnt/a \"q\"".into(),
            volume: "v".into(),
            state: "serving".into(),
            generation: 4,
            pid: Some(10),
            standby_pid: None,
            restarts: Restarts {
                exit: 1,
                signal: 2,
                oom: 0,
            },
            uptime_s: 60,
            generation_uptime_s: 5,
            consecutive_failures: 0,
            gave_up: false,
            last_upgrade: None,
            client_binary: "/usr/bin/fsclient".into(),
            requests_recovered: 0,
            last_recovery: Some(Recovery {
                died_generation: 3,
                cause: "killed by signal 9".into(),
                at_unix_ms: 0,
                next_generation: Some(4),
                takeover_us: Some(1500),
                warm: true,
            }),
            connection_id: 40,
            cgroup: None,
            init: NegotiatedInit {
                major: 7,
                minor: 45,
                kernel_minor: 45,
                flags: 0,
                max_readahead: 0,
                max_write: 0,
                max_pages: 0,
                max_background: 0,
                congestion_threshold: 0,
                time_gran: 1,
            },
        }
    }

    #[test]
    fn metrics_carry_generation_restarts_by_cause_and_escaped_labels() {
        let text = render(&[status()], 7);
        let labels = r#"mount="abc",mountpoint="/mnt/a \"q\"",volume="v""#;
        for line in [
            "baton_supervisor_uptime_seconds 7".to_string(),
            format!("baton_mount_generation{{{labels}}} 4"),
            format!("baton_mount_serving{{{labels}}} 1"),
            format!("baton_mount_restarts_total{{{labels},cause=\"signal\"}} 2"),
            format!("baton_mount_restarts_total{{{labels},cause=\"oom\"}} 0"),
            format!("baton_mount_last_takeover_seconds{{{labels}}} 0.0015"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        // Every sample belongs to a declared metric.
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap();
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} undeclared"
            );
        }
    }

    #[test]
    fn the_endpoint_answers_metrics_and_the_page_on_loopback_only() {
        let snapshot = Snapshot::default();
        snapshot.publish(vec![status()]);
        assert!(serve("0.0.0.0:0".parse().unwrap(), snapshot.clone()).is_err());
        let addr = serve("127.0.0.1:0".parse().unwrap(), snapshot).unwrap();
        let get = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let metrics = get("/metrics");
        assert!(metrics.starts_with("HTTP/1.0 200 OK"), "{metrics}");
        assert!(metrics.contains("baton_mount_generation{"), "{metrics}");
        let page = get("/");
        assert!(
            page.contains("<td>/mnt/a \"q\"</td>") && page.contains("<td>serving</td>"),
            "{page}"
        );
        assert!(get("/nope").starts_with("HTTP/1.0 404"));
    }
}
