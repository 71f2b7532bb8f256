//! The metrics text, the status page and its tips, from made-up statuses;
//! the HTTP endpoint on loopback.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::*;
use upgrade_protocol::{
    GenerationCounters, Incident, MountCounters, NegotiatedInit, OpcodeCounters, OperationCounters,
    Recovery, Restarts, StorageCounters, UpgradeReport, LATENCY_BOUNDS_US,
};

const NOW_MS: u64 = 1_800_000_000_000;

fn status() -> MountStatus {
    MountStatus {
        persistent: false,
        mount_id: "abc".into(),
        mountpoint: "/mnt/a \"q\"".into(),
        volume: "v".into(),
        state: "serving".into(),
        generation: 4,
        pid: Some(10),
        standby_pid: Some(11),
        restarts: Restarts {
            exit: 1,
            signal: 2,
            oom: 0,
        },
        uptime_s: 60,
        generation_uptime_s: 5,
        consecutive_failures: 0,
        gave_up: false,
        read_only_reason: None,
        last_upgrade: None,
        client_binary: "/usr/bin/fsclient".into(),
        requests_recovered: 3,
        last_recovery: Some(Recovery {
            died_generation: 3,
            cause: "killed by signal 9".into(),
            at_unix_ms: 0,
            next_generation: Some(4),
            takeover_us: Some(1500),
            warm: true,
        }),
        connection_id: 40,
        counters: Some(MountCounters {
            io: GenerationCounters {
                latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
                requests: vec![OpcodeCounters {
                    opcode: 16,
                    count: 6,
                    latency_us_sum: 3000,
                    // 2 at <= 50 µs, 3 at <= 500 µs, 1 above 5 s.
                    latency_buckets: vec![2, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                }],
                read_bytes: 10,
                written_bytes: 4096,
                cache_hit_count: 3,
                cache_miss_count: 1,
                uploads_pending: 2,
                storage: StorageCounters {
                    object_store: vec![OperationCounters {
                        operation: "put".into(),
                        count: 4,
                        error_count: 1,
                        latency_us_sum: 2_000,
                        latency_buckets: vec![0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0],
                    }],
                    object_store_received_bytes: 0,
                    object_store_sent_bytes: 8192,
                    metadata: vec![OperationCounters {
                        operation: "write".into(),
                        count: 9,
                        error_count: 0,
                        latency_us_sum: 900,
                        latency_buckets: vec![0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    }],
                    staged_bytes: 4096,
                    staged_oldest_age_s: 3,
                    cache_eviction_count: 5,
                },
                cache_used_bytes: 1 << 20,
                cache_capacity_bytes: 1 << 30,
                metadata_quarantined: None,
            },
            generations_started: 5,
            upgrades: 1,
            rollbacks: 1,
            requests_journaled: 2,
        }),
        incidents: Vec::new(),
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

fn incident(kind: &str, ago_ms: u64, detail: &str) -> Incident {
    Incident {
        at_unix_ms: NOW_MS - ago_ms,
        generation: 3,
        kind: kind.into(),
        detail: detail.into(),
    }
}

#[test]
fn metrics_carry_generation_restarts_io_and_escaped_labels() {
    let totals = SupervisorTotals {
        generations_started: 9,
        upgrades: 1,
        rollbacks: 2,
    };
    let memory = Memory {
        rss_bytes: Some(40 << 20),
        cgroup_bytes: Some(64 << 20),
        cgroup_limit_bytes: None,
    };
    let text = render(&[status()], &[memory], &totals, 7);
    let labels = r#"mount="abc",mountpoint="/mnt/a \"q\"",volume="v""#;
    let h = "baton_mount_request_duration_seconds";
    for line in [
        "baton_supervisor_uptime_seconds 7".to_string(),
        "baton_supervisor_generations 2".to_string(),
        "baton_supervisor_rollbacks_total 2".to_string(),
        format!("baton_mount_generation{{{labels}}} 4"),
        format!("baton_mount_serving{{{labels}}} 1"),
        format!("baton_mount_restarts_total{{{labels},cause=\"signal\"}} 2"),
        format!("baton_mount_restarts_total{{{labels},cause=\"oom\"}} 0"),
        format!("baton_mount_last_takeover_seconds{{{labels}}} 0.0015"),
        format!("baton_mount_requests_total{{{labels},opcode=\"write\"}} 6"),
        format!("baton_mount_written_bytes_total{{{labels}}} 4096"),
        format!("baton_mount_cache_hit_ratio{{{labels}}} 0.75"),
        format!("baton_mount_uploads_pending{{{labels}}} 2"),
        format!("baton_mount_cache_used_bytes{{{labels}}} 1048576"),
        format!("baton_mount_cache_capacity_bytes{{{labels}}} 1073741824"),
        format!("baton_mount_requests_recovered_total{{{labels}}} 3"),
        format!("baton_mount_requests_journaled_total{{{labels}}} 2"),
        format!("baton_mount_generation_rss_bytes{{{labels}}} 41943040"),
        format!("baton_mount_cgroup_memory_bytes{{{labels}}} 67108864"),
        // Cumulative buckets; +Inf equals the count.
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"5e-05\"}} 2"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"0.0001\"}} 2"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"0.0005\"}} 5"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"5\"}} 5"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"+Inf\"}} 6"),
        format!("{h}_count{{{labels},opcode=\"write\"}} 6"),
        format!("{h}_sum{{{labels},opcode=\"write\"}} 0.003"),
        format!("baton_mount_object_store_requests_total{{{labels},operation=\"put\"}} 4"),
        format!("baton_mount_object_store_request_errors_total{{{labels},operation=\"put\"}} 1"),
        format!("baton_mount_object_store_request_duration_seconds_bucket{{{labels},operation=\"put\",le=\"0.001\"}} 4"),
        format!("baton_mount_object_store_request_duration_seconds_sum{{{labels},operation=\"put\"}} 0.002"),
        format!("baton_mount_object_store_bytes_total{{{labels},direction=\"sent\"}} 8192"),
        format!("baton_mount_object_store_bytes_total{{{labels},direction=\"received\"}} 0"),
        format!("baton_mount_metadata_transactions_total{{{labels},kind=\"write\"}} 9"),
        format!("baton_mount_metadata_transaction_errors_total{{{labels},kind=\"write\"}} 0"),
        format!("baton_mount_metadata_transaction_duration_seconds_count{{{labels},kind=\"write\"}} 9"),
        format!("baton_mount_staged_bytes{{{labels}}} 4096"),
        format!("baton_mount_staged_oldest_age_seconds{{{labels}}} 3"),
        format!("baton_mount_cache_evictions_total{{{labels}}} 5"),
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
    // Every sample belongs to a metric declared once, with HELP and TYPE,
    // and histogram samples to a histogram.
    for sample in text.lines().filter(|l| !l.starts_with('#')) {
        let name = sample.split(['{', ' ']).next().unwrap();
        let base = [
            name,
            name.trim_end_matches("_bucket"),
            name.trim_end_matches("_sum"),
            name.trim_end_matches("_count"),
        ]
        .into_iter()
        .find(|n| text.contains(&format!("# TYPE {n} ")))
        .unwrap_or_else(|| panic!("{name} undeclared"));
        assert_eq!(
            text.matches(&format!("# TYPE {base} ")).count(),
            1,
            "{base}"
        );
        assert!(
            text.contains(&format!("# HELP {base} ")),
            "{base} has no HELP"
        );
        if base != name {
            assert!(text.contains(&format!("# TYPE {base} histogram")), "{name}");
        }
    }
    assert!(text.contains("# TYPE baton_mount_requests_total counter"));
    assert!(
        !text.contains("baton_mount_cgroup_memory_limit_bytes{"),
        "an unlimited cgroup has no limit sample:\n{text}"
    );
}

#[test]
fn memory_is_read_from_proc_status_and_cgroup_files_with_no_limit_as_none() {
    let status = "Name:\tfsclient\nVmHWM:\t  9000 kB\nVmRSS:\t  2048 kB\n";
    assert_eq!(parse_vm_rss_bytes(status), Some(2 << 20));
    assert_eq!(parse_vm_rss_bytes("Name:\tx\n"), None);
    assert_eq!(parse_cgroup_bytes("1073741824\n"), Some(1 << 30));
    assert_eq!(parse_cgroup_bytes("max\n"), None, "v2: no limit");
    assert_eq!(
        parse_cgroup_bytes("9223372036854771712\n"),
        None,
        "v1: no limit"
    );
    // This process, as a mount's serving generation.
    let mut m = status_with_pid(std::process::id());
    m.cgroup = None;
    let memory = read_memory(&m);
    assert!(memory.rss_bytes.is_some_and(|b| b > 0), "{memory:?}");
    assert_eq!(memory.cgroup_bytes, None);
}

fn status_with_pid(pid: u32) -> MountStatus {
    MountStatus {
        pid: Some(pid),
        ..status()
    }
}

#[test]
fn a_mount_that_has_not_read_a_block_has_no_cache_ratio() {
    let mut m = status();
    m.counters = None;
    let text = render(&[m], &[], &SupervisorTotals::default(), 0);
    assert!(!text.contains("baton_mount_cache_hit_ratio{"), "{text}");
    assert!(text.contains("baton_mount_written_bytes_total{"), "{text}");
}

#[test]
fn supervisor_totals_keep_counting_unmounted_mounts() {
    let snapshot = Snapshot::default();
    let mut other = status();
    other.mount_id = "def".into();
    snapshot.publish(vec![status(), other]);
    assert_eq!(snapshot.read().1.generations_started, 10);
    snapshot.publish(vec![status()]);
    let (mounts, totals) = snapshot.read();
    assert_eq!(mounts.len(), 1);
    assert_eq!(totals.generations_started, 10);
    assert_eq!((totals.upgrades, totals.rollbacks), (2, 2));
}

#[test]
fn a_healthy_mount_has_no_tip() {
    assert!(tips(&status(), NOW_MS).is_empty());
    assert_eq!(health(&status(), NOW_MS), Health::Healthy);
}

#[test]
fn repeated_oom_kills_tell_to_raise_the_memory_limit() {
    let mut m = status();
    m.incidents = vec![
        incident("oom", 20 * 60_000, "old, outside the window"),
        incident("oom", 5 * 60_000, "oom"),
        incident("oom", 3 * 60_000, "oom"),
        incident("oom", 1_000, "oom"),
    ];
    let tips = tips(&m, NOW_MS);
    assert!(
        tips.iter()
            .any(|t| t.starts_with("Generation OOM-killed 3 times in 10 min: raise --memory-max")),
        "{tips:?}"
    );
    assert_eq!(health(&m, NOW_MS), Health::Degraded);
}

#[test]
fn giving_up_says_what_to_do_with_the_last_error() {
    let mut m = status();
    m.state = "gave_up".into();
    m.gave_up = true;
    m.consecutive_failures = 3;
    m.incidents = vec![incident(
        "exit",
        1_000,
        "exit 3; it logged: flaky: refusing to start",
    )];
    let tips = tips(&m, NOW_MS);
    assert_eq!(tips.len(), 1, "{tips:?}");
    assert!(
        tips[0].contains("Gave up after 3 failed starts"),
        "{tips:?}"
    );
    assert!(tips[0].contains("flaky: refusing to start"), "{tips:?}");
    assert!(tips[0].contains("fsctl umount /mnt/a \"q\""), "{tips:?}");
    assert_eq!(health(&m, NOW_MS), Health::Failing);
}

#[test]
fn a_crash_loop_an_unreachable_store_signals_and_a_rollback_each_get_a_tip() {
    let mut m = status();
    m.state = "backoff".into();
    m.consecutive_failures = 2;
    m.incidents = vec![
        incident("signal", 50_000, "signal 15"),
        incident("signal", 40_000, "signal 15"),
        incident(
            "exit",
            1_000,
            "exit 1; it logged: object store s3://b is unreachable: connection refused",
        ),
    ];
    m.last_upgrade = Some(UpgradeReport {
        mountpoint: m.mountpoint.clone(),
        ok: false,
        outcome: "rolled back: the new generation ended before serving".into(),
        from_generation: 4,
        serving_died: false,
        generation: 4,
        binary: "/opt/fsclient-2".into(),
        journaled: 0,
        stall_us: None,
        elapsed_ms: 10,
        at_unix_ms: NOW_MS,
        detail: None,
    });
    let tips = tips(&m, NOW_MS);
    for needle in [
        "Crash loop: 2 failed starts in a row",
        "The object store is unreachable",
        "killed by a signal 2 times in 10 min",
        "The last upgrade (to /opt/fsclient-2) rolled back",
    ] {
        assert!(
            tips.iter().any(|t| t.contains(needle)),
            "{needle}: {tips:?}"
        );
    }
}

#[test]
fn the_page_lists_each_mount_with_health_tips_and_incidents_escaped() {
    let mut failing = status();
    failing.mount_id = "f".into();
    failing.mountpoint = "/mnt/<b>".into();
    failing.gave_up = true;
    failing.state = "gave_up".into();
    failing.consecutive_failures = 3;
    failing.incidents = vec![incident("exit", 2_000, "exit 3; it logged: <boom>")];
    let page = render_page(
        &[status(), failing],
        &SupervisorTotals::default(),
        9,
        NOW_MS,
    );
    assert!(
        page.contains("data-mountpoint=\"/mnt/a &quot;q&quot;\""),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"health\">healthy</span>"),
        "{page}"
    );
    assert!(
        page.contains("<h2>/mnt/&lt;b&gt; <span class=\"health\">failing</span>"),
        "{page}"
    );
    assert!(
        page.contains("<li class=\"tip\">Gave up after 3 failed starts"),
        "{page}"
    );
    assert!(
        page.contains("2 s ago: generation 3 exit: exit 3; it logged: &lt;boom&gt;"),
        "{page}"
    );
    assert!(page.contains("1 need attention"), "{page}");
    assert!(page.contains("write 6"), "{page}");
}

/// One request over a fresh connection, the whole response (bounded).
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TEST_DEADLINE)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    // Until EOF; a refused connection may end in a reset after its answer.
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The loopback address of a server bound to every address.
fn local(addr: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

const TEST_DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn the_endpoint_answers_metrics_the_page_and_health_on_any_address() {
    let snapshot = Snapshot::default();
    snapshot.publish(vec![status()]);
    let addr = local(serve("0.0.0.0:0".parse().unwrap(), snapshot).unwrap());
    let metrics = get(addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.0 200 OK"), "{metrics}");
    assert!(
        metrics.contains("content-type: text/plain; version=0.0.4"),
        "{metrics}"
    );
    assert!(metrics.contains("baton_mount_generation{"), "{metrics}");
    let page = get(addr, "/");
    assert!(
        page.contains("data-mountpoint=\"/mnt/a &quot;q&quot;\"")
            && page.contains("<td class=\"state\">serving</td>"),
        "{page}"
    );
    assert!(get(addr, "/healthz").ends_with("\r\n\r\nok\n"));
    assert!(get(addr, "/readyz").ends_with("\r\n\r\nready\n"));
    assert!(get(addr, "/nope").starts_with("HTTP/1.0 404"));
}

/// Whether the server closed `idle` (EOF or reset) rather than keeping it
/// open; never blocks.
fn closed_by_server(idle: &TcpStream) -> bool {
    idle.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let closed = !matches!(
        (&*idle).read(&mut byte),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    );
    idle.set_nonblocking(false).unwrap();
    closed
}

#[test]
fn an_idle_connection_does_not_delay_a_scrape() {
    let snapshot = Snapshot::default();
    snapshot.publish(vec![status()]);
    // The idle client gets the whole deadline to send its request: a
    // server answering one connection at a time would serve the scrape
    // only after closing the idle one.
    let addr = http::serve_with("127.0.0.1:0".parse().unwrap(), snapshot, TEST_DEADLINE).unwrap();
    let idle = TcpStream::connect(addr).unwrap();
    // Connected first, so accepted first.
    let metrics = get(addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.0 200 OK"), "{metrics}");
    assert!(
        !closed_by_server(&idle),
        "the scrape was answered only once the idle connection was closed"
    );
    // Keep-alive: two scrapes over one HTTP/1.1 connection, the idle one
    // still open.
    let mut kept = TcpStream::connect(addr).unwrap();
    kept.set_read_timeout(Some(TEST_DEADLINE)).unwrap();
    for _ in 0..2 {
        write!(kept, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut response = [0u8; 512];
        let n = kept.read(&mut response).unwrap();
        let text = String::from_utf8_lossy(&response[..n]);
        assert!(
            text.starts_with("HTTP/1.1 200 OK") && text.ends_with("ok\n"),
            "{text}"
        );
    }
    assert!(!closed_by_server(&idle));
}

#[test]
fn past_the_connection_max_a_client_is_told_busy_until_one_closes() {
    let snapshot = Snapshot::default();
    let addr = http::serve_with("127.0.0.1:0".parse().unwrap(), snapshot, TEST_DEADLINE).unwrap();
    let mut idle: Vec<TcpStream> = (0..CONNECTIONS_MAX)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Accepted in order: this one only after every idle one holds a slot.
    let busy = get(addr, "/metrics");
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert!(busy.contains("too many open connections"), "{busy}");
    let (head, body) = busy.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{busy}"
    );
    idle.pop();
    let deadline = Instant::now() + TEST_DEADLINE;
    loop {
        let answer = get(addr, "/healthz");
        if answer.starts_with("HTTP/1.0 200") {
            break;
        }
        assert!(Instant::now() < deadline, "still busy: {answer}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ready_means_every_persistent_mount_serves() {
    let serving = status();
    assert_eq!(not_ready(&[]), None, "no mounts: ready");
    assert_eq!(not_ready(std::slice::from_ref(&serving)), None);
    let starting = MountStatus {
        state: "launching".into(),
        ..serving.clone()
    };
    assert_eq!(
        not_ready(std::slice::from_ref(&starting)),
        None,
        "a mount that is not persistent does not hold readiness"
    );
    let persistent_starting = MountStatus {
        persistent: true,
        ..starting
    };
    let why = not_ready(&[serving, persistent_starting]).expect("not ready");
    assert!(why.contains("/mnt/a \"q\" is launching"), "{why}");
}

#[test]
fn the_page_speaks_human_units_and_reloads_itself() {
    assert_eq!(duration_text(45), "45 s");
    assert_eq!(duration_text(200), "3 min 20 s");
    assert_eq!(duration_text(7500), "2 h 5 min");
    assert_eq!(duration_text(97_200), "1 d 3 h");
    assert_eq!(bytes_text(10), "10 B");
    assert_eq!(bytes_text(1536), "1.5 KiB");
    assert_eq!(bytes_text(3 << 30), "3.0 GiB");
    assert_eq!(micros_text(1500), "1.5 ms");
    let mut m = status();
    m.uptime_s = 200;
    m.incidents = vec![incident("signal", 2_000, "killed by signal 9")];
    m.last_recovery = Some(Recovery {
        died_generation: 3,
        cause: "killed by signal 9".into(),
        at_unix_ms: NOW_MS - 2_000,
        next_generation: Some(4),
        takeover_us: Some(1500),
        warm: true,
    });
    let page = render_page(&[m], &SupervisorTotals::default(), 7500, NOW_MS);
    assert!(page.contains("up 2 h 5 min, 1 mounts"), "{page}");
    assert!(page.contains(">3 min 20 s (generation 5 s)<"), "{page}");
    assert!(page.contains("10 B read, 4.0 KiB written"), "{page}");
    assert!(
        page.contains(
            "2 s ago: generation 3 signal: killed by signal 9; served again after 1.5 ms"
        ),
        "the incident says how long its takeover took: {page}"
    );
    assert!(
        page.contains("generation 4 served after 1.5 ms (warm standby)"),
        "{page}"
    );
    assert!(page.contains("<meta name=\"viewport\" content=\"width=device-width"));
    assert!(page.contains(&format!(
        "<meta http-equiv=\"refresh\" content=\"{PAGE_REFRESH_S}\">"
    )));
}

#[test]
fn the_chart_plots_request_rate_and_mean_latency_between_points() {
    let point = |min: u64, count, us| ChartPoint {
        at_unix_ms: NOW_MS - (60 - min) * 60_000,
        request_count: count,
        latency_us_sum: us,
    };
    assert_eq!(chart_svg(&[point(0, 0, 0)]), "", "one point draws nothing");
    // 600 requests in the first minute (10/s, 2 ms each), none in the second.
    let svg = chart_svg(&[
        point(0, 0, 0),
        point(1, 600, 1_200_000),
        point(2, 600, 1_200_000),
    ]);
    assert!(svg.starts_with("<figure class=\"chart\"><svg"), "{svg}");
    assert!(svg.contains("max 10.0"), "{svg}");
    assert!(svg.contains("max 2.00 ms"), "{svg}");
    // x from 0 to the full width, the busy minute at the top (y 2), the idle one at 0.
    assert!(
        svg.contains("points=\"0.0,60.0 150.0,2.0 300.0,60.0\""),
        "{svg}"
    );
    assert!(svg.contains("last 2 min"), "{svg}");
    let m = status();
    let charts = BTreeMap::from([(m.mount_id.clone(), vec![point(0, 0, 0), point(1, 60, 60)])]);
    let page = render_page_with_charts(&[m], &charts, &SupervisorTotals::default(), 10, NOW_MS);
    assert_eq!(page.matches("<svg").count(), 1, "{page}");
    assert!(page.contains("<figcaption>last 1 min"), "{page}");
}

#[test]
fn a_mount_gets_a_chart_point_a_minute_and_keeps_an_hour() {
    let mut points = std::collections::VecDeque::new();
    let m = status();
    for second in 0..(2 * 3600) {
        chart_sample(&mut points, &m, NOW_MS + second * 1000);
    }
    assert_eq!(points.len(), CHART_POINTS_MAX);
    assert_eq!(
        points[1].at_unix_ms - points[0].at_unix_ms,
        CHART_INTERVAL_MS
    );
    assert_eq!(points[0].request_count, 6);
}

#[test]
fn the_chart_ends_at_the_present_so_a_new_mount_has_one_within_seconds() {
    let snapshot = Snapshot::default();
    let mut m = status();
    snapshot.publish(vec![m.clone()]);
    let sampled = snapshot.charts(0)[&m.mount_id].clone();
    assert_eq!(
        sampled.len(),
        1,
        "no later time: the sample alone: {sampled:?}"
    );
    if let Some(c) = m.counters.as_mut() {
        c.io.requests[0].count += 10;
    }
    snapshot.publish(vec![m.clone()]);
    let now_unix_ms = sampled[0].at_unix_ms + 5000;
    let points = snapshot.charts(now_unix_ms)[&m.mount_id].clone();
    assert_eq!(
        points.len(),
        2,
        "the minute's sample, then the present: {points:?}"
    );
    assert_eq!(points[0], sampled[0]);
    assert_eq!(points[1].request_count, sampled[0].request_count + 10);
    assert_eq!(points[1].at_unix_ms, now_unix_ms);
    assert_eq!(
        snapshot
            .published
            .lock()
            .map(|p| p.charts[&m.mount_id].len())
            .ok(),
        Some(1),
        "the present is not a sample"
    );
    let svg = chart_svg(&points);
    assert!(svg.contains("last 5 s"), "{svg}");
}
