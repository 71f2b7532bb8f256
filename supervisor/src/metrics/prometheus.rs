//! The `/metrics` text (Prometheus exposition format 0.0.4): per
//! supervisor (mounts, live generations, generations started, upgrades,
//! rollbacks) and per mount (labels `mount`, `mountpoint`, `volume`):
//! generation, health, restarts by cause, requests by opcode with a latency
//! histogram, bytes, block cache, pending uploads, recovered and journaled
//! requests, takeover and upgrade stalls. Every counter is a total over the
//! mount's life (summed across generations by `mount_tally`), so it never
//! goes down when a generation is replaced. Pure.

use std::fmt::Write as _;

use upgrade_protocol::{GenerationCounters, MountCounters, MountStatus};

use super::opcode_name;
use super::SupervisorTotals;

/// Escapes a label value (backslash, double quote, newline). Pure.
pub fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn mount_labels(m: &MountStatus) -> String {
    format!(
        "mount=\"{}\",mountpoint=\"{}\",volume=\"{}\"",
        escape_label(&m.mount_id),
        escape_label(&m.mountpoint.to_string_lossy()),
        escape_label(&m.volume)
    )
}

type Value = fn(&MountStatus, &MountCounters) -> Option<f64>;

/// One metric per mount: (name, type, help, value; None leaves the mount out).
const PER_MOUNT: &[(&str, &str, &str, Value)] = &[
    ("baton_mount_generation", "gauge", "The generation serving (or starting).", |m, _| Some(m.generation as f64)),
    ("baton_mount_serving", "gauge", "1 when a generation serves the mount.", |m, _| Some(f64::from(u8::from(m.state == "serving")))),
    ("baton_mount_gave_up", "gauge", "1 once --give-up-after was reached: nothing serves the mount.", |m, _| Some(f64::from(u8::from(m.gave_up)))),
    ("baton_mount_uptime_seconds", "gauge", "Seconds since the mount was made.", |m, _| Some(m.uptime_s as f64)),
    ("baton_mount_generation_uptime_seconds", "gauge", "Seconds the current generation has served.", |m, _| Some(m.generation_uptime_s as f64)),
    ("baton_mount_consecutive_failures", "gauge", "Failed starts in a row.", |m, _| Some(f64::from(m.consecutive_failures))),
    ("baton_mount_read_bytes_total", "counter", "Bytes answered to READ requests.", |_, c| Some(c.io.read_bytes as f64)),
    ("baton_mount_written_bytes_total", "counter", "Bytes accepted by WRITE requests.", |_, c| Some(c.io.written_bytes as f64)),
    ("baton_mount_cache_hits_total", "counter", "Block reads served from the local block cache.", |_, c| Some(c.io.cache_hit_count as f64)),
    ("baton_mount_cache_misses_total", "counter", "Block reads fetched from the object store.", |_, c| Some(c.io.cache_miss_count as f64)),
    ("baton_mount_cache_hit_ratio", "gauge", "Block cache hits / (hits + misses) over the mount's life; absent before the first block read.", |_, c| {
        let total = c.io.cache_hit_count + c.io.cache_miss_count;
        (total > 0).then(|| c.io.cache_hit_count as f64 / total as f64)
    }),
    ("baton_mount_cache_used_bytes", "gauge", "Bytes in the mount's local block cache.", |_, c| Some(c.io.cache_used_bytes as f64)),
    ("baton_mount_cache_capacity_bytes", "gauge", "What the mount's local block cache may hold (0: blocks read in place from a local directory).", |_, c| Some(c.io.cache_capacity_bytes as f64)),
    ("baton_mount_uploads_pending", "gauge", "Files with staged data not yet uploaded to the object store.", |_, c| Some(c.io.uploads_pending as f64)),
    ("baton_mount_requests_recovered_total", "counter", "Resent requests answered from an exactly-once record of a dead generation.", |m, _| Some(m.requests_recovered as f64)),
    ("baton_mount_requests_journaled_total", "counter", "Requests handed from an old to a new generation in planned upgrades.", |_, c| Some(c.requests_journaled as f64)),
    ("baton_mount_generations_started_total", "counter", "Generation processes started (standbys and upgrade targets included).", |_, c| Some(c.generations_started as f64)),
    ("baton_mount_upgrades_total", "counter", "Planned upgrades that ended with the new generation serving.", |_, c| Some(c.upgrades as f64)),
    ("baton_mount_rollbacks_total", "counter", "Planned upgrades rolled back to the old generation.", |_, c| Some(c.rollbacks as f64)),
    ("baton_mount_last_takeover_seconds", "gauge", "Death to serving of the last crash recovery.", |m, _| {
        m.last_recovery.as_ref().and_then(|r| r.takeover_us).map(|us| us as f64 / 1e6)
    }),
    ("baton_mount_last_stall_seconds", "gauge", "Application-visible stall of the last planned upgrade.", |m, _| {
        m.last_upgrade.as_ref().and_then(|u| u.stall_us).map(|us| us as f64 / 1e6)
    }),
];

/// The metrics text. Pure.
pub fn render(mounts: &[MountStatus], totals: &SupervisorTotals, uptime_s: u64) -> String {
    let mut out = String::new();
    let counters: Vec<MountCounters> = mounts
        .iter()
        .map(|m| m.counters.clone().unwrap_or_default())
        .collect();
    let live_generations: usize = mounts
        .iter()
        .map(|m| usize::from(m.pid.is_some()) + usize::from(m.standby_pid.is_some()))
        .sum();
    let supervisor: [(&str, &str, &str, u64); 6] = [
        (
            "baton_supervisor_uptime_seconds",
            "gauge",
            "Seconds since fs-supervisor started.",
            uptime_s,
        ),
        (
            "baton_supervisor_mounts",
            "gauge",
            "Mounts held.",
            mounts.len() as u64,
        ),
        (
            "baton_supervisor_generations",
            "gauge",
            "Generation processes alive (serving and standby).",
            live_generations as u64,
        ),
        (
            "baton_supervisor_generations_started_total",
            "counter",
            "Generation processes started, all mounts (unmounted ones included).",
            totals.generations_started,
        ),
        (
            "baton_supervisor_upgrades_total",
            "counter",
            "Planned upgrades that succeeded, all mounts.",
            totals.upgrades,
        ),
        (
            "baton_supervisor_rollbacks_total",
            "counter",
            "Planned upgrades rolled back, all mounts.",
            totals.rollbacks,
        ),
    ];
    for (name, kind, help, value) in supervisor {
        header(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    for (name, kind, help, value) in PER_MOUNT {
        header(&mut out, name, kind, help);
        for (m, c) in mounts.iter().zip(&counters) {
            if let Some(v) = value(m, c) {
                let _ = writeln!(out, "{name}{{{}}} {v}", mount_labels(m));
            }
        }
    }
    header(
        &mut out,
        "baton_mount_restarts_total",
        "counter",
        "Deaths of the serving generation by cause (exit, signal, oom).",
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
                mount_labels(m)
            );
        }
    }
    header(
        &mut out,
        "baton_mount_requests_total",
        "counter",
        "FUSE requests handled, by opcode.",
    );
    for (m, c) in mounts.iter().zip(&counters) {
        for o in &c.io.requests {
            let _ = writeln!(
                out,
                "baton_mount_requests_total{{{},opcode=\"{}\"}} {}",
                mount_labels(m),
                escape_label(&opcode_name(o.opcode)),
                o.count
            );
        }
    }
    header(
        &mut out,
        "baton_mount_request_duration_seconds",
        "histogram",
        "Time a generation took to handle a FUSE request (read to reply), by opcode.",
    );
    for (m, c) in mounts.iter().zip(&counters) {
        histogram(&mut out, &mount_labels(m), &c.io);
    }
    out
}

/// The histogram samples of one mount: cumulative buckets, `+Inf` equal to
/// `_count`.
fn histogram(out: &mut String, labels: &str, io: &GenerationCounters) {
    let name = "baton_mount_request_duration_seconds";
    for o in &io.requests {
        if o.latency_buckets.len() != io.latency_bounds_us.len() + 1 {
            continue;
        }
        let labels = format!(
            "{labels},opcode=\"{}\"",
            escape_label(&opcode_name(o.opcode))
        );
        let mut cumulative = 0u64;
        for (bound_us, n) in io.latency_bounds_us.iter().zip(&o.latency_buckets) {
            cumulative += n;
            let le = *bound_us as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        cumulative += o.latency_buckets.last().copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            o.latency_us_sum as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}
