//! The metrics text, the status page and its tips, from made-up statuses;
//! the HTTP endpoint on loopback.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;
use upgrade_protocol::{
    GenerationCounters, Incident, MountCounters, NegotiatedInit, OpcodeCounters, Recovery,
    Restarts, UpgradeReport, LATENCY_BOUNDS_US,
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
    let text = render(&[status()], &totals, 7);
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
        // Cumulative buckets; +Inf equals the count.
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"0.00005\"}} 2"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"0.0001\"}} 2"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"0.0005\"}} 5"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"5\"}} 5"),
        format!("{h}_bucket{{{labels},opcode=\"write\",le=\"+Inf\"}} 6"),
        format!("{h}_count{{{labels},opcode=\"write\"}} 6"),
        format!("{h}_sum{{{labels},opcode=\"write\"}} 0.003"),
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
}

#[test]
fn a_mount_that_has_not_read_a_block_has_no_cache_ratio() {
    let mut m = status();
    m.counters = None;
    let text = render(&[m], &SupervisorTotals::default(), 0);
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
        page.contains("data-mountpoint=\"/mnt/a &quot;q&quot;\"")
            && page.contains("<td class=\"state\">serving</td>"),
        "{page}"
    );
    assert!(get("/nope").starts_with("HTTP/1.0 404"));
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
