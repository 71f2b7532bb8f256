//! fs-supervisor's `/metrics` and status page against real mounts: the
//! request, byte and restart counters move with real file I/O and never go
//! down across a kill -9 of the serving generation; the status page, as
//! rendered by headless Chromium, shows a healthy mount and one whose
//! generations crash (given up) with its tip, and fits a phone and a
//! desktop (element boxes read over the DevTools protocol: no sideways
//! scrolling, nothing outside the width or overlapping, no clipped or tiny
//! text, a chart per mount; a screenshot of each is saved).
//!
//! Build the binaries first: `cargo build -p fsclient -p supervisor -p
//! chaos-tests`. Needs root, /dev/fuse and a memory cgroup. The page test
//! needs Debian's `chromium`; without it the test prints why and passes,
//! unless `BATON_REQUIRE_CHROMIUM=1` (set by `.ci/run`), which makes it fail.
//!
//! Every fixture has its own supervisor, state dir, socket, volumes,
//! cgroup parent and metrics port; on drop the supervisor is stopped (it
//! unmounts), anything left in its cgroups is killed and the mounts are
//! detached. Applications and Chromium run as child processes with a
//! deadline.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use chaos_tests::browser::{Browser, Viewport};
use chaos_tests::mount_guard::{wait_until, workspace_binary, ChildGuard, MountGuard};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(120);
const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
static FIXTURES: AtomicU32 = AtomicU32::new(0);

fn binary(name: &str) -> PathBuf {
    let path = workspace_binary(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p fsclient -p supervisor -p fsctl -p chaos-tests` first",
        path.display()
    );
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// One supervisor with `--metrics-listen`, volumes formatted on demand.
struct Fixture {
    dir: tempfile::TempDir,
    base: PathBuf,
    socket: PathBuf,
    cgroup_parent: String,
    metrics_addr: String,
    supervisor: Option<ChildGuard>,
    mounts: Vec<PathBuf>,
    guards: Vec<MountGuard>,
}

impl Fixture {
    fn start(extra: &[&str]) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = dir.path().join("base");
        let socket = dir.path().join("supervisor.sock");
        let cgroup_parent = format!(
            "baton-obs-test-{}-{}",
            std::process::id(),
            FIXTURES.fetch_add(1, Ordering::SeqCst)
        );
        let mut fixture = Fixture {
            dir,
            base,
            socket,
            cgroup_parent,
            metrics_addr: format!("127.0.0.1:{}", free_port()),
            supervisor: None,
            mounts: Vec::new(),
            guards: Vec::new(),
        };
        let log = std::fs::File::create(fixture.path("supervisor.log")).expect("log");
        let mut command = Command::new(binary("fs-supervisor"));
        if !extra.contains(&"--client-binary") {
            command.args(["--client-binary", s(&binary("fsclient"))]);
        }
        let child = command
            .args(["--state-dir", s(&fixture.path("state"))])
            .args(["--socket", s(&fixture.socket)])
            .args(["--cgroup-parent", &fixture.cgroup_parent])
            .args(["--metrics-listen", &fixture.metrics_addr])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fs-supervisor");
        fixture.supervisor = Some(ChildGuard(child));
        assert!(
            wait_until(DEADLINE, || fixture.socket.exists()
                && std::net::TcpStream::connect(&fixture.metrics_addr).is_ok()),
            "fs-supervisor did not start:\n{}",
            fixture.logs()
        );
        fixture
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn fsctl(&self, args: &[&str]) -> Output {
        Command::new(binary("fsctl"))
            .args(args)
            .args(["--socket", s(&self.socket)])
            .output()
            .expect("run fsctl")
    }

    /// Formats `volume` and mounts it at a new directory; returns it.
    fn mount(&mut self, volume: &str) -> PathBuf {
        let out = Command::new(binary("fsctl"))
            .args(["format", volume, "--base-dir", s(&self.base)])
            .output()
            .expect("fsctl format");
        assert!(
            out.status.success(),
            "format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mnt = self.path(&format!("mnt-{volume}"));
        std::fs::create_dir(&mnt).expect("mountpoint");
        let out = self.fsctl(&["mount", volume, s(&mnt), "--base-dir", s(&self.base)]);
        assert!(
            out.status.success(),
            "fsctl mount failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        self.guards.push(MountGuard::new(&mnt));
        self.mounts.push(mnt.clone());
        mnt
    }

    /// The entry of the mount at `mnt` in `fsctl status --json`.
    fn status(&self, mnt: &Path) -> Value {
        let out = self.fsctl(&["status", "--json"]);
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        report["mounts"]
            .as_array()
            .and_then(|mounts| {
                mounts
                    .iter()
                    .find(|m| m["mountpoint"].as_str() == Some(s(mnt)))
                    .cloned()
            })
            .unwrap_or(Value::Null)
    }

    fn get(&self, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(&self.metrics_addr).expect("connect");
        write!(stream, "GET {path} HTTP/1.0\r\n\r\n").expect("request");
        let mut out = String::new();
        stream.read_to_string(&mut out).expect("response");
        out
    }

    fn logs(&self) -> String {
        let tail = |path: PathBuf| {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        let mut out = format!(
            "--- supervisor log ---\n{}\n",
            tail(self.path("supervisor.log"))
        );
        if let Ok(entries) = std::fs::read_dir(self.path("state/logs")) {
            for entry in entries.flatten() {
                out.push_str(&format!(
                    "--- {} ---\n{}\n",
                    entry.path().display(),
                    tail(entry.path())
                ));
            }
        }
        out
    }

    fn cgroup_dir(&self) -> PathBuf {
        Path::new(CGROUP_V1_MEMORY).join(&self.cgroup_parent)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            for mnt in &self.mounts {
                let _ = fuse_wire::abort_connection(mnt);
            }
        }
        if let Some(mut child) = self.supervisor.take() {
            let _ = kill(child.pid(), Signal::SIGTERM);
            let _ = child.wait_timeout(DEADLINE);
        }
        let cgroups = std::fs::read_dir(self.cgroup_dir())
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_else(|_| Vec::<PathBuf>::new());
        for cgroup in cgroups {
            let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = wait_until(Duration::from_secs(5), || {
                std::fs::remove_dir(&cgroup).is_ok()
            });
        }
        let _ = std::fs::remove_dir(self.cgroup_dir());
        self.guards.clear();
    }
}

/// Runs `script` with `sh -c` as an application (its own process, with a
/// deadline; killed on the way out).
fn app(script: &str) {
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn application");
    let mut guard = ChildGuard(child);
    let status = guard.wait_timeout(DEADLINE);
    assert!(
        status.is_some_and(|s| s.success()),
        "application `{script}` failed or hung: {status:?}"
    );
}

/// The samples of a metrics text: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let body = text.split("\r\n\r\n").nth(1).unwrap_or(text);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The counter samples (counters and histogram parts) of a metrics text.
fn counters(text: &str) -> BTreeMap<String, f64> {
    let counter_names: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            (kind == "counter" || kind == "histogram").then(|| name.to_string())
        })
        .collect();
    samples(text)
        .into_iter()
        .filter(|(key, _)| {
            let name = key.split('{').next().unwrap_or("");
            counter_names.iter().any(|c| {
                name == c
                    || name
                        .strip_prefix(c.as_str())
                        .is_some_and(|rest| ["_bucket", "_sum", "_count"].contains(&rest))
            })
        })
        .collect()
}

/// The value of the sample whose key starts with `prefix` and contains
/// every one of `parts`.
fn value(samples: &BTreeMap<String, f64>, prefix: &str, parts: &[&str]) -> f64 {
    samples
        .iter()
        .find(|(k, _)| k.starts_with(prefix) && parts.iter().all(|p| k.contains(p)))
        .map(|(_, v)| *v)
        .unwrap_or(0.0)
}

fn assert_no_counter_went_down(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    when: &str,
) {
    for (key, old) in before {
        let new = after.get(key).copied().unwrap_or(0.0);
        assert!(new >= *old, "{key} went down {when}: {old} -> {new}");
    }
}

#[test]
fn metrics_count_real_requests_and_bytes_and_never_go_down_across_a_kill_9() {
    let mut fx = Fixture::start(&["--no-standby"]);
    let mnt = fx.mount("vol");
    let m = s(&mnt);
    app(&format!(
        "dd if=/dev/urandom of={m}/a bs=64k count=16 conv=fsync 2>/dev/null && dd if={m}/a of=/dev/null bs=64k iflag=direct 2>/dev/null && mkdir {m}/d && ls {m} >/dev/null"
    ));
    // Generations report about once a second.
    let mut first = BTreeMap::new();
    assert!(
        wait_until(DEADLINE, || {
            first = counters(&fx.get("/metrics"));
            value(&first, "baton_mount_written_bytes_total{", &[]) >= 1_048_576.0
                && value(&first, "baton_mount_requests_total{", &["opcode=\"write\""]) >= 1.0
                && value(&first, "baton_mount_requests_total{", &["opcode=\"mkdir\""]) >= 1.0
                && value(&first, "baton_mount_requests_total{", &["opcode=\"fsync\""]) >= 1.0
                && value(&first, "baton_mount_read_bytes_total{", &[]) >= 1_048_576.0
        }),
        "the counters did not move after 1 MiB written and read back (O_DIRECT), an fsync and a mkdir:\n{}",
        fx.get("/metrics")
    );
    let text = fx.get("/metrics");
    let lookups = value(
        &first,
        "baton_mount_requests_total{",
        &["opcode=\"lookup\""],
    );
    assert!(lookups >= 1.0, "{text}");
    // The histogram is consistent: +Inf bucket == count for writes.
    let inf = value(
        &first,
        "baton_mount_request_duration_seconds_bucket{",
        &["opcode=\"write\"", "le=\"+Inf\""],
    );
    let count = value(
        &first,
        "baton_mount_request_duration_seconds_count{",
        &["opcode=\"write\""],
    );
    assert!(inf >= 1.0 && inf == count, "{text}");
    assert!(
        value(&first, "baton_mount_requests_total{", &["opcode=\"read\""]) >= 1.0,
        "{text}"
    );

    // kill -9 the serving generation, scraping all along the takeover.
    let status = fx.status(&mnt);
    let generation = status["generation"].as_u64().expect("generation");
    let pid = status["pid"].as_i64().expect("pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 the generation");
    let mut previous = first.clone();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let now = counters(&fx.get("/metrics"));
        assert_no_counter_went_down(&previous, &now, "during the takeover");
        previous = now;
        let st = fx.status(&mnt);
        if st["state"] == "serving" && st["generation"].as_u64() > Some(generation) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new generation served: {st}\n{}",
            fx.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // More I/O on the new generation: the totals go on from where they were.
    app(&format!(
        "dd if=/dev/zero of={m}/b bs=64k count=8 conv=fsync 2>/dev/null"
    ));
    let written_before = value(&first, "baton_mount_written_bytes_total{", &[]);
    let mut after = BTreeMap::new();
    assert!(
        wait_until(DEADLINE, || {
            after = counters(&fx.get("/metrics"));
            value(&after, "baton_mount_written_bytes_total{", &[]) >= written_before + 524_288.0
        }),
        "written bytes did not add up across generations (before {written_before}):\n{}",
        fx.get("/metrics")
    );
    assert_no_counter_went_down(&first, &after, "after the kill");
    assert_eq!(
        value(&after, "baton_mount_restarts_total{", &["cause=\"signal\""]),
        1.0
    );
    assert!(value(&after, "baton_mount_generations_started_total{", &[]) >= 2.0);
    assert!(value(&after, "baton_supervisor_generations_started_total", &[]) >= 2.0);
    let gauges = samples(&fx.get("/metrics"));
    assert_eq!(value(&gauges, "baton_supervisor_mounts", &[]), 1.0);
    assert_eq!(value(&gauges, "baton_mount_serving{", &[]), 1.0);
    let health = fx.get("/healthz");
    assert!(
        health.starts_with("HTTP/1.0 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let ready = fx.get("/readyz");
    assert!(
        ready.starts_with("HTTP/1.0 200") && ready.ends_with("ready\n"),
        "{ready}"
    );
}

/// Every PromQL expression in the Grafana dashboard (panel targets and the
/// template variable's `label_values`), with Grafana's variables filled
/// in.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v.as_str()) {
                        ("expr", Some(expr)) => out.push(expr.to_string()),
                        ("definition", Some(query)) => {
                            // label_values(METRIC, LABEL): METRIC is PromQL.
                            let inner = query
                                .strip_prefix("label_values(")
                                .and_then(|q| q.rsplit_once(','))
                                .map(|(metric, _)| metric.to_string());
                            out.push(inner.unwrap_or_else(|| query.to_string()));
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out.iter()
        .map(|q| {
            q.replace("$__rate_interval", "1m")
                .replace("$__interval", "1m")
                .replace("$mountpoint", ".*")
        })
        .collect()
}

/// The metric names and label names an expression selects. Panics with
/// the parser's message if it is not PromQL.
fn selected(expr: &str) -> Vec<(String, Vec<String>)> {
    use promql_parser::parser::Expr;
    struct Selectors(Vec<(String, Vec<String>)>);
    impl promql_parser::util::ExprVisitor for Selectors {
        type Error = ();
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
            let vs = match expr {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            let labels = vs
                .matchers
                .matchers
                .iter()
                .map(|m| m.name.clone())
                .filter(|n| n != "__name__")
                .collect();
            self.0.push((vs.name.clone().unwrap_or_default(), labels));
            Ok(true)
        }
    }
    let parsed = promql_parser::parser::parse(expr)
        .unwrap_or_else(|err| panic!("not PromQL: {expr}\n{err}"));
    let mut selectors = Selectors(Vec::new());
    let _ = promql_parser::util::walk_expr(&mut selectors, &parsed);
    selectors.0
}

/// What a metrics text serves: each sample name (declared by `# TYPE`,
/// with `_bucket`, `_sum` and `_count` of a histogram) with the label
/// names its samples carry (none yet: a gauge such as the last takeover's
/// time has no sample before the first takeover).
fn served(text: &str) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut out: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (name, kind) in text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
    {
        out.entry(name.to_string()).or_default();
        if kind == "histogram" {
            for part in ["_bucket", "_sum", "_count"] {
                out.entry(format!("{name}{part}")).or_default();
            }
        }
    }
    for key in samples(text).keys() {
        let (name, labels) = key.split_once('{').unwrap_or((key.as_str(), ""));
        let entry = out.entry(name.to_string()).or_default();
        for pair in labels.trim_end_matches('}').split("\",") {
            if let Some((label, _)) = pair.split_once('=') {
                entry.insert(label.trim_start_matches(',').to_string());
            }
        }
    }
    out
}

/// The Grafana dashboard (`deploy/grafana/baton.json`) asks only for
/// series a real fs-supervisor serves, with labels they carry: every query
/// parses as PromQL and each metric it selects is declared in a scrape of
/// a mount that has done I/O, its samples carrying the labels matched.
#[test]
fn every_series_the_grafana_dashboard_queries_is_served() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/baton.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/baton.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");

    let mut fx = Fixture::start(&[]);
    let mnt = fx.mount("vol");
    let m = s(&mnt);
    app(&format!(
        "dd if=/dev/urandom of={m}/a bs=64k count=4 conv=fsync 2>/dev/null && dd if={m}/a of=/dev/null bs=64k iflag=direct 2>/dev/null"
    ));
    let mut scrape = String::new();
    assert!(
        wait_until(DEADLINE, || {
            scrape = fx.get("/metrics");
            scrape.contains("baton_mount_request_duration_seconds_bucket{")
                && scrape.contains("baton_mount_requests_total{")
        }),
        "no request series after I/O:\n{scrape}"
    );
    // The storage series move with the I/O: the fsync uploaded blocks
    // (PUT) and committed them in metadata write transactions; the
    // O_DIRECT read got them back (GET: a local directory's objects are
    // read in place, which counts as GET). Reads of what the generation
    // wrote are answered from memory (kind "memory": the new file's
    // absent `security.capability`, asked before its first WRITE).
    let mut storage = BTreeMap::new();
    assert!(
        wait_until(DEADLINE, || {
            scrape = fx.get("/metrics");
            storage = samples(&scrape);
            let put = |name: &str| value(&storage, name, &["operation=\"put\""]);
            let tx = |name: &str, kind: &str| value(&storage, name, &[kind]);
            put("baton_mount_object_store_requests_total{") >= 1.0
                && value(&storage, "baton_mount_object_store_requests_total{", &["operation=\"get\""]) >= 1.0
                && value(&storage, "baton_mount_object_store_bytes_total{", &["direction=\"received\""]) >= 262_144.0
                && put("baton_mount_object_store_request_duration_seconds_count{") >= 1.0
                && value(&storage, "baton_mount_object_store_bytes_total{", &["direction=\"sent\""]) >= 262_144.0
                && tx("baton_mount_metadata_transactions_total{", "kind=\"write\"") >= 1.0
                && tx("baton_mount_metadata_transactions_total{", "kind=\"read\"") >= 1.0
                && tx("baton_mount_metadata_transactions_total{", "kind=\"memory\"") >= 1.0
                && tx("baton_mount_metadata_transaction_duration_seconds_count{", "kind=\"write\"") >= 1.0
        }),
        "no object store PUT and GET, bytes each way or metadata transactions after 256 KiB written with fsync and read back:\n{scrape}"
    );
    assert_eq!(
        value(
            &storage,
            "baton_mount_object_store_request_errors_total{",
            &["operation=\"put\""]
        ),
        0.0,
        "{scrape}"
    );
    // Everything was uploaded by the fsync: nothing staged, nothing old.
    for name in [
        "baton_mount_staged_bytes{",
        "baton_mount_staged_oldest_age_seconds{",
        "baton_mount_cache_evictions_total{",
    ] {
        assert!(
            storage.keys().any(|k| k.starts_with(name)),
            "no {name}:\n{scrape}"
        );
    }
    // Memory is read at scrape time: the generation's RSS and its cgroup.
    let now = samples(&scrape);
    for name in [
        "baton_mount_generation_rss_bytes{",
        "baton_mount_cgroup_memory_bytes{",
    ] {
        assert!(value(&now, name, &[]) > 0.0, "no {name}:\n{scrape}");
    }
    let served = served(&scrape);
    for query in &queries {
        let selected = selected(query);
        assert!(!selected.is_empty(), "selects no series: {query}");
        for (name, labels) in selected {
            let Some(carried) = served.get(&name) else {
                panic!("`{query}` asks for {name}, which fs-supervisor does not serve:\n{scrape}");
            };
            for label in labels {
                assert!(
                    carried.is_empty() || carried.contains(&label),
                    "`{query}` matches label {label}, which {name} does not carry ({carried:?})"
                );
            }
        }
    }
}

/// Small writes land in the writeback cache without a round trip each:
/// the mount clears set-ID bits itself (HANDLE_KILLPRIV_V2), so the kernel
/// does not ask for `security.capability` (GETXATTR) on every `write(2)`.
#[test]
fn small_writes_are_not_a_request_each() {
    const WRITES: u64 = 2000;
    let mut fx = Fixture::start(&["--no-standby"]);
    let mnt = fx.mount("vol");
    let m = s(&mnt);
    app(&format!(
        "dd if=/dev/zero of={m}/small bs=4k count={WRITES} 2>/dev/null"
    ));
    let mut seen = BTreeMap::new();
    assert!(
        wait_until(DEADLINE, || {
            seen = counters(&fx.get("/metrics"));
            value(&seen, "baton_mount_written_bytes_total{", &[]) >= (WRITES * 4096) as f64
        }),
        "{WRITES} writes of 4 KiB were not counted:\n{}",
        fx.get("/metrics")
    );
    let count = |op: &str| {
        value(
            &seen,
            "baton_mount_requests_total{",
            &[&format!("opcode=\"{op}\"")],
        )
    };
    assert!(
        count("getxattr") < 10.0,
        "{} GETXATTRs for {WRITES} writes: the kernel asks for security.capability per write(2)",
        count("getxattr")
    );
    assert!(
        count("write") < (WRITES / 10) as f64,
        "{} WRITE requests for {WRITES} writes of 4 KiB: the writeback cache did not gather them",
        count("write")
    );
}

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// The page at `url` as headless Chromium renders it (its DOM).
fn chromium_dom(chromium: &Path, url: &str) -> String {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let child = Command::new(chromium)
        .args(chaos_tests::browser::HEADLESS_ARGS)
        .arg(format!("--user-data-dir={}", s(profile.path())))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut guard = ChildGuard(child);
    let mut stdout = guard.0.stdout.take().expect("chromium stdout");
    let reader = std::thread::spawn(move || {
        let mut dom = String::new();
        let _ = stdout.read_to_string(&mut dom);
        dom
    });
    let status = guard.wait_timeout(CHROMIUM_DEADLINE);
    assert!(
        status.is_some_and(|s| s.success()),
        "chromium --dump-dom {url} failed or hung: {status:?}"
    );
    reader.join().expect("chromium output")
}

/// Text of the page without tags (entities decoded as a reader sees them).
fn visible_text(dom: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[test]
fn the_status_page_in_chromium_shows_a_healthy_mount_and_a_crash_looping_one_with_its_tip_and_fits_a_phone_and_a_desktop(
) {
    let Some(chromium) = chromium() else {
        if std::env::var("BATON_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("BATON_REQUIRE_CHROMIUM=1 but chromium is missing: apt-get install chromium");
        }
        eprintln!("skipped: chromium is not installed (apt-get install chromium); set BATON_REQUIRE_CHROMIUM=1 to fail instead");
        return;
    };
    // Generations of the volume "broken" fail every start after the first,
    // saying why with a long unbreakable word (a block's checksum).
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("broken-started");
    let script = dir.path().join("fsclient-broken");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$*\" in *broken*)\n  if [ -e {m} ]; then echo 'fsclient: refusing to start: volume broken is damaged: block 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 fails its checksum' >&2; exit 3; fi\n  : > {m};;\nesac\nexec {f} \"$@\"\n",
            m = s(&marker),
            f = s(&binary("fsclient"))
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut fx = Fixture::start(&[
        "--no-standby",
        "--give-up-after",
        "2",
        "--client-binary",
        s(&script),
    ]);
    let healthy = fx.mount("vol");
    // A long unbreakable name, as Kubernetes gives volumes: the page must
    // still fit a phone.
    let broken = fx.mount("broken-pvc-3f1c2a9e-5b7d-4e8f-9a0b-1c2d3e4f5a6b");
    app(&format!("echo hello > {}/f", s(&healthy)));
    let pid = fx.status(&broken)["pid"].as_i64().expect("pid") as i32;
    // Past the stability window: this death is not a failed start.
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill");
    assert!(
        wait_until(DEADLINE, || fx.status(&broken)["gave_up"] == true),
        "never gave up: {}",
        fx.status(&broken)
    );
    // A generation reports its counters about once a second: on a fast
    // machine the broken mount gives up before the first report.
    assert!(
        wait_until(DEADLINE, || fx.get("/").contains("B written")),
        "the healthy mount's write never reached the page"
    );

    let dom = chromium_dom(&chromium, &format!("http://{}/", fx.metrics_addr));
    let text = visible_text(&dom);
    assert!(
        dom.contains("<h1>fs-supervisor</h1>"),
        "not the status page:\n{dom}"
    );
    assert!(text.contains("2 mounts, 1 need attention"), "{text}");
    // One section per mount, with its health.
    let section = |mnt: &Path| -> String {
        let start = dom
            .find(&format!("data-mountpoint=\"{}\"", s(mnt)))
            .unwrap_or_else(|| panic!("no section for {}:\n{dom}", mnt.display()));
        let end = dom[start..]
            .find("</section>")
            .map_or(dom.len(), |e| start + e);
        visible_text(&dom[start..end])
    };
    let ok = section(&healthy);
    assert!(ok.contains("healthy"), "{ok}");
    assert!(ok.contains("serving"), "{ok}");
    assert!(ok.contains("Last incidents") && ok.contains("none"), "{ok}");
    let bad = section(&broken);
    assert!(bad.contains("failing"), "{bad}");
    assert!(bad.contains("gave_up"), "{bad}");
    assert!(
        bad.contains("Gave up after 2 failed starts in a row (--give-up-after)"),
        "the give-up tip is missing: {bad}"
    );
    assert!(
        bad.contains(&format!("fsctl umount {}", s(&broken))),
        "the tip says what to run: {bad}"
    );
    assert!(
        bad.contains("refusing to start: volume broken is damaged"),
        "the incident shows what the generation said last: {bad}"
    );
    assert!(
        bad.contains("signal 9 (SIGKILL)") && !bad.contains("SIGKILL); it logged"),
        "a killed generation's last log line is not its reason: {bad}"
    );
    assert!(
        bad.contains("exit 2 · signal 1 · oom 0"),
        "one kill, then two failed starts: {bad}"
    );
    // It reloads itself, fits a phone's width and speaks human units.
    assert!(
        dom.contains("<meta http-equiv=\"refresh\" content=\"5\">")
            && dom.contains("<meta name=\"viewport\" content=\"width=device-width"),
        "{dom}"
    );
    assert!(text.contains("reloads every 5 s"), "{text}");
    assert!(
        ok.contains(" s (generation ") && ok.contains("B written"),
        "uptime and bytes in units: {ok}"
    );
    assert!(
        bad.contains("generation 3 exit 3; not served again yet"),
        "the last takeover names the death and that nothing took over: {bad}"
    );
    // The same page, laid out on a phone and a desktop.
    assert_status_page_fits(
        &chromium,
        &format!("http://{}/", fx.metrics_addr),
        dir.path(),
        2,
    );
}

/// The phone and the desktop the status page must fit.
const VIEWPORTS: [(&str, Viewport); 2] = [
    (
        "phone",
        Viewport {
            width_px: 390,
            height_px: 844,
            device_scale_factor: 3.0,
            mobile: true,
        },
    ),
    (
        "desktop",
        Viewport {
            width_px: 1280,
            height_px: 800,
            device_scale_factor: 1.0,
            mobile: false,
        },
    ),
];
/// Smallest readable text, CSS px.
const FONT_PX_MIN: f64 = 12.0;
/// Loads of the page before its measurement is given up (it reloads
/// itself every 5 s: a measurement that meets a reload is taken again).
const LAYOUT_ATTEMPTS_MAX: u32 = 3;

/// Boxes (document coordinates, CSS px) of the page's parts, and the text
/// that is wider than its box or smaller than `FONT_PX_MIN` (replaced by
/// [`FONT_PX_MIN`]), as the browser laid them out.
const LAYOUT_JS: &str = r#"(() => {
  if (document.readyState !== 'complete') return {ready: false};
  const name = (e) => {
    let n = e.tagName.toLowerCase();
    if (e.id) n += '#' + e.id;
    const c = e.getAttribute('class');
    if (c && c.trim()) n += '.' + c.trim().split(/\s+/).join('.');
    const s = e.closest('section[data-mountpoint]');
    return s ? n + ' (mount ' + s.dataset.mountpoint + ')' : n;
  };
  const box = (e) => {
    if (!e) return null;
    const r = e.getBoundingClientRect();
    return {name: name(e), left: r.left + scrollX, right: r.right + scrollX,
            top: r.top + scrollY, bottom: r.bottom + scrollY};
  };
  const ownText = (e) => [...e.childNodes]
    .filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.textContent).join('').trim();
  const all = [...document.body.querySelectorAll('*')];
  return {
    ready: true,
    innerWidth: innerWidth,
    scrollWidth: document.scrollingElement.scrollWidth,
    page: [box(document.querySelector('h1')), box(document.getElementById('summary')),
           ...[...document.querySelectorAll('section.mount')].map(box)],
    mounts: [...document.querySelectorAll('section.mount')].map((s) => ({
      mountpoint: s.dataset.mountpoint,
      section: box(s),
      parts: [s.querySelector('h2'), s.querySelector('table.facts'), s.querySelector('.tips'),
              s.querySelector('h3'), s.querySelector('.incidents'), s.querySelector('figure.chart')]
             .filter(Boolean).map(box),
      missing: ['h2', 'table.facts', '.incidents', 'figure.chart svg']
        .filter((q) => !s.querySelector(q)),
      chart: box(s.querySelector('figure.chart svg')),
    })),
    clipped: all.filter((e) => ownText(e) && e.scrollWidth > e.clientWidth + 1
                          && getComputedStyle(e).display !== 'inline')
      .map((e) => ({name: name(e), text: ownText(e).slice(0, 60),
                    scrollWidth: e.scrollWidth, clientWidth: e.clientWidth})),
    small: all.filter((e) => ownText(e) && parseFloat(getComputedStyle(e).fontSize) < FONT_PX_MIN)
      .map((e) => ({name: name(e), text: ownText(e).slice(0, 60),
                    fontPx: parseFloat(getComputedStyle(e).fontSize)})),
  };
})()"#;

fn px(b: &Value, side: &str) -> f64 {
    b[side].as_f64().unwrap_or(f64::NAN)
}

fn box_text(b: &Value) -> String {
    format!(
        "{} at x {:.0}..{:.0}, y {:.0}..{:.0}",
        b["name"].as_str().unwrap_or("?"),
        px(b, "left"),
        px(b, "right"),
        px(b, "top"),
        px(b, "bottom")
    )
}

/// What is wrong with the layout `l` (from [`LAYOUT_JS`]) on a viewport
/// `width_px` wide: one line per problem, naming the element and where it
/// is.
fn layout_problems(l: &Value, width_px: u32, mounts_expected: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let width = f64::from(width_px);
    let inner = l["innerWidth"].as_f64().unwrap_or(0.0);
    if inner != width {
        problems.push(format!(
            "the layout viewport is {inner} px wide, not the device's {width}: the browser zooms out \
             to fit content wider than its screen, or the page lacks \
             <meta name=viewport content=width=device-width>; either way its text is shrunk"
        ));
    }
    let scroll = l["scrollWidth"].as_f64().unwrap_or(f64::NAN);
    if scroll.is_nan() || scroll > width {
        problems.push(format!(
            "the page scrolls sideways: its content is {scroll} px wide on a {width} px screen"
        ));
    }
    let fits = |b: &Value, problems: &mut Vec<String>| {
        if b.is_null() {
            return;
        }
        let (left, right, top, bottom) =
            (px(b, "left"), px(b, "right"), px(b, "top"), px(b, "bottom"));
        // NaN (a missing side) is neither sized nor inside.
        let sized = right - left >= 1.0 && bottom - top >= 1.0;
        let inside = left >= -0.5 && right <= width + 0.5;
        if !sized {
            problems.push(format!("{} has no size", box_text(b)));
        } else if !inside {
            problems.push(format!("{} does not fit the {width} px width", box_text(b)));
        }
    };
    let overlaps = |group: &[Value], problems: &mut Vec<String>| {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let x = px(a, "right").min(px(b, "right")) - px(a, "left").max(px(b, "left"));
                let y = px(a, "bottom").min(px(b, "bottom")) - px(a, "top").max(px(b, "top"));
                if x > 0.5 && y > 0.5 {
                    problems.push(format!("{} overlaps {}", box_text(a), box_text(b)));
                }
            }
        }
    };
    let page = l["page"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = page.iter().filter_map(|b| b["name"].as_str()).collect();
    if page.iter().any(Value::is_null) || page.len() != 2 + mounts_expected {
        problems.push(format!(
            "expected the headline (h1), the summary (p#summary) and {mounts_expected} mount sections, found {names:?}"
        ));
    }
    let page: Vec<Value> = page.into_iter().filter(|b| !b.is_null()).collect();
    page.iter().for_each(|b| fits(b, &mut problems));
    overlaps(&page, &mut problems);
    for m in l["mounts"].as_array().into_iter().flatten() {
        let mountpoint = m["mountpoint"].as_str().unwrap_or("?");
        let parts = m["parts"].as_array().cloned().unwrap_or_default();
        parts.iter().for_each(|b| fits(b, &mut problems));
        overlaps(&parts, &mut problems);
        for missing in m["missing"].as_array().into_iter().flatten() {
            problems.push(format!("mount {mountpoint} has no {missing}"));
        }
        if !m["chart"].is_null() {
            fits(&m["chart"], &mut problems);
            if px(&m["chart"], "right") > px(&m["section"], "right") + 0.5 {
                problems.push(format!(
                    "{} sticks out of its section, {}",
                    box_text(&m["chart"]),
                    box_text(&m["section"])
                ));
            }
        }
    }
    for c in l["clipped"].as_array().into_iter().flatten() {
        problems.push(format!(
            "{}: its text does not fit its box ({} px of text in {} px): {:?}",
            c["name"].as_str().unwrap_or("?"),
            c["scrollWidth"],
            c["clientWidth"],
            c["text"].as_str().unwrap_or("")
        ));
    }
    for s in l["small"].as_array().into_iter().flatten() {
        problems.push(format!(
            "{} has {} px text (under {FONT_PX_MIN}): {:?}",
            s["name"].as_str().unwrap_or("?"),
            s["fontPx"],
            s["text"].as_str().unwrap_or("")
        ));
    }
    problems
}

/// The status page at `url` fits each of [`VIEWPORTS`]: no sideways
/// scrolling, every part inside the width and apart from the others,
/// no clipped or tiny text, a chart per mount within its section. Saves a
/// full-page screenshot per viewport (in `BATON_SCREENSHOT_DIR` if set,
/// else in `dir`) before it judges, and prints its path.
fn assert_status_page_fits(chromium: &Path, url: &str, dir: &Path, mounts_expected: usize) {
    let shots = std::env::var_os("BATON_SCREENSHOT_DIR").map_or(dir.to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&shots).expect("the screenshot directory");
    let mut browser = Browser::start(chromium, CHROMIUM_DEADLINE).expect("start chromium");
    let layout_js = LAYOUT_JS.replace("FONT_PX_MIN", &FONT_PX_MIN.to_string());
    for (name, viewport) in &VIEWPORTS {
        let mut layout = Value::Null;
        for attempt in 1..=LAYOUT_ATTEMPTS_MAX {
            let measured = browser
                .open(url, viewport)
                .and_then(|()| browser.evaluate(&layout_js));
            match measured {
                Ok(l) if l["ready"] == true => {
                    layout = l;
                    break;
                }
                Ok(_) | Err(_) if attempt < LAYOUT_ATTEMPTS_MAX => continue,
                Ok(l) => panic!("the page at {url} never finished loading on the {name}: {l}"),
                Err(e) => panic!(
                    "measuring {url} on the {name}: {e:#}\n{}",
                    browser.stderr_tail()
                ),
            }
        }
        let png = browser.screenshot_png().expect("screenshot");
        let path = shots.join(format!("status-page-{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        eprintln!("status page on the {name}: {}", path.display());
        let problems = layout_problems(&layout, viewport.width_px, mounts_expected);
        assert!(
            problems.is_empty(),
            "the status page's layout breaks on the {name} ({}×{} CSS px; screenshot {}):\n- {}",
            viewport.width_px,
            viewport.height_px,
            path.display(),
            problems.join("\n- ")
        );
    }
}
