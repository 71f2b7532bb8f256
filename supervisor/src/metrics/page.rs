//! The status page (`GET /`): every mount with its generation, health,
//! restarts, last incidents, and a plain-language tip for each failing
//! state, derived from what the supervisor knows (restart causes and when
//! they happened, consecutive failed starts, the give-up state, what a dying
//! generation logged last, the last upgrade). Durations and sizes in human
//! units, each crash with the time its takeover took and the last upgrade
//! with its stall; it reloads itself every [`PAGE_REFRESH_S`] and fits a
//! phone's width (sections stack, a table's rows become label-over-value,
//! any long word breaks, the chart is as wide as its section). Pure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use upgrade_protocol::{Incident, MountStatus};

use super::{opcode_name, ChartPoint, SupervisorTotals};

/// Incidents counted by the tips: those of the last 10 minutes.
pub const TIP_WINDOW_MS: u64 = 10 * 60 * 1000;
/// Incidents shown per mount (newest first).
pub const INCIDENTS_SHOWN_MAX: usize = 5;
/// The page reloads itself this often.
pub const PAGE_REFRESH_S: u64 = 5;

/// `200` → `3 min 20 s`, `7500` → `2 h 5 min`, `97200` → `1 d 3 h`. Pure.
pub fn duration_text(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match seconds {
        0..=59 => format!("{s} s"),
        60..=3599 if s == 0 => format!("{m} min"),
        60..=3599 => format!("{m} min {s} s"),
        3600..=86_399 if m == 0 => format!("{h} h"),
        3600..=86_399 => format!("{h} h {m} min"),
        _ if h == 0 => format!("{d} d"),
        _ => format!("{d} d {h} h"),
    }
}

/// `1536` → `1.5 KiB`, `10` → `10 B`. Pure.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Microseconds as people read a stall: `1500` → `1.5 ms`. Pure.
pub fn micros_text(us: u64) -> String {
    match us {
        0..=999 => format!("{us} µs"),
        1000..=999_999 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// How a mount is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Serving, nothing went wrong recently.
    Healthy,
    /// Serving, but something went wrong recently (see the tips).
    Degraded,
    /// Not serving: starting, recovering, or given up.
    Failing,
}

impl Health {
    fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Failing => "failing",
        }
    }
}

fn recent<'a>(
    m: &'a MountStatus,
    kind: &'a str,
    now_unix_ms: u64,
) -> impl Iterator<Item = &'a Incident> {
    m.incidents.iter().filter(move |i| {
        i.kind == kind && now_unix_ms.saturating_sub(i.at_unix_ms) <= TIP_WINDOW_MS
    })
}

fn times(n: usize) -> String {
    if n == 1 {
        "once".into()
    } else {
        format!("{n} times")
    }
}

/// What an operator should do about `m`, one sentence per problem. Pure.
pub fn tips(m: &MountStatus, now_unix_ms: u64) -> Vec<String> {
    let mp = m.mountpoint.display();
    let mut tips = Vec::new();
    let last = m.incidents.last().map(|i| i.detail.as_str()).unwrap_or("");
    if m.gave_up {
        tips.push(format!(
            "Gave up after {} failed starts in a row (--give-up-after): nothing serves {mp} and applications using it wait. \
             Fix the cause (last: {last}), then run `fsctl umount {mp}` and mount it again.",
            m.consecutive_failures
        ));
    } else if m.consecutive_failures > 0 {
        tips.push(format!(
            "Crash loop: {} failed starts in a row; the supervisor keeps restarting (until --give-up-after, if set). Last: {last}. \
             Read the generation log in the state directory's logs/ and fix what it reports.",
            m.consecutive_failures
        ));
    }
    let ooms = recent(m, "oom", now_unix_ms).count();
    if ooms > 0 {
        tips.push(format!(
            "Generation OOM-killed {} in 10 min: raise --memory-max (the memory limit of each generation's cgroup).",
            times(ooms)
        ));
    }
    if m.incidents
        .iter()
        .rev()
        .take(3)
        .any(|i| i.detail.contains("unreachable"))
    {
        tips.push(
            "The object store is unreachable: check the network path to it and the endpoint, region and credentials \
             of the volume's storage URL. Generations recover by themselves once it answers."
                .into(),
        );
    }
    let signals = recent(m, "signal", now_unix_ms).count();
    if signals > 1 {
        tips.push(format!(
            "Generation killed by a signal {} in 10 min by something outside Baton (an operator, a script, a service manager, \
             or an OOM killer outside its cgroup): find who sends it. Applications saw only a stall.",
            times(signals)
        ));
    }
    let exits = recent(m, "exit", now_unix_ms).count();
    if exits > 1 && m.consecutive_failures == 0 && !m.gave_up {
        tips.push(format!(
            "Generation exited {} in 10 min: read the last line it logged (incidents below) and the generation log.",
            times(exits)
        ));
    }
    if let Some(upgrade) = m.last_upgrade.as_ref().filter(|u| !u.ok) {
        tips.push(format!(
            "The last upgrade (to {}) {}: generation {} serves on with the previous binary. Fix the new binary, then run `fsctl upgrade` again.",
            upgrade.binary.display(),
            upgrade.outcome,
            upgrade.generation
        ));
    }
    if tips.is_empty() && m.state != "serving" {
        tips.push(format!(
            "Not serving yet (state {}): requests on {mp} wait until a generation serves.",
            m.state
        ));
    }
    tips
}

/// The health of `m`. Pure.
pub fn health(m: &MountStatus, now_unix_ms: u64) -> Health {
    if m.gave_up || m.state != "serving" {
        Health::Failing
    } else if tips(m, now_unix_ms).is_empty() {
        Health::Healthy
    } else {
        Health::Degraded
    }
}

/// Escapes text for HTML content and attribute values. Pure.
pub fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ago(now_unix_ms: u64, at_unix_ms: u64) -> String {
    let s = now_unix_ms.saturating_sub(at_unix_ms) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

/// Width and height of a chart (SVG user units).
const CHART_WIDTH: u64 = 300;
const CHART_HEIGHT: u64 = 60;

/// A small inline SVG of a mount's request rate (requests/s, solid) and
/// mean latency (ms, dashed) between consecutive `points`, each line
/// scaled to its own maximum, which the caption gives. Empty below two
/// points. Pure.
pub fn chart_svg(points: &[ChartPoint]) -> String {
    let steps: Vec<(u64, f64, f64)> = points
        .windows(2)
        .filter_map(|w| {
            let ms = w[1]
                .at_unix_ms
                .checked_sub(w[0].at_unix_ms)
                .filter(|&ms| ms > 0)?;
            let n = w[1].request_count.saturating_sub(w[0].request_count);
            let us = w[1].latency_us_sum.saturating_sub(w[0].latency_us_sum);
            let mean_ms = if n > 0 {
                us as f64 / n as f64 / 1000.0
            } else {
                0.0
            };
            Some((w[1].at_unix_ms, n as f64 * 1000.0 / ms as f64, mean_ms))
        })
        .collect();
    let (Some(first), Some(last)) = (points.first(), steps.last()) else {
        return String::new();
    };
    let span_ms = last.0.saturating_sub(first.at_unix_ms).max(1) as f64;
    let line = |value: fn(&(u64, f64, f64)) -> f64| {
        let max = steps.iter().map(value).fold(0.0, f64::max);
        let coords: Vec<String> = std::iter::once((first.at_unix_ms, 0.0))
            .chain(steps.iter().map(|s| (s.0, value(s))))
            .map(|(at, v)| {
                let x = (at - first.at_unix_ms) as f64 / span_ms * CHART_WIDTH as f64;
                let y = CHART_HEIGHT as f64
                    - if max > 0.0 { v / max } else { 0.0 } * (CHART_HEIGHT - 2) as f64;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        (coords.join(" "), max)
    };
    let (rate, rate_max) = line(|s| s.1);
    let (latency, latency_max) = line(|s| s.2);
    format!(
        "<figure class=\"chart\"><svg viewBox=\"0 0 {CHART_WIDTH} {CHART_HEIGHT}\" width=\"100%\" \
         role=\"img\" aria-label=\"requests per second and mean latency\" preserveAspectRatio=\"none\">\
         <polyline class=\"rate\" fill=\"none\" stroke=\"#06c\" vector-effect=\"non-scaling-stroke\" points=\"{rate}\"/>\
         <polyline class=\"latency\" fill=\"none\" stroke=\"#a60\" stroke-dasharray=\"4 2\" vector-effect=\"non-scaling-stroke\" points=\"{latency}\"/></svg>\
         <figcaption>last {span}: requests/s (blue, max {rate_max:.1}), mean latency (orange, dashed, max {latency_max:.2} ms)</figcaption></figure>",
        span = duration_text((span_ms / 1000.0) as u64),
    )
}

fn mount_section(out: &mut String, m: &MountStatus, now_unix_ms: u64, chart: &str) {
    let health = health(m, now_unix_ms);
    let counters = m.counters.clone().unwrap_or_default();
    let _ = write!(
        out,
        "<section class=\"mount {h}\" data-mountpoint=\"{mp}\"><h2>{mp} <span class=\"health\">{h}</span></h2>\
         <table class=\"facts\"><tr><th>volume</th><td>{vol}</td></tr><tr><th>state</th><td class=\"state\">{state}</td></tr>\
         <tr><th>generation</th><td class=\"generation\">{g}</td></tr><tr><th>pid</th><td>{pid}</td></tr>\
         <tr><th>restarts</th><td class=\"restarts\">exit {re} · signal {rs} · oom {ro}</td></tr>\
         <tr><th>failed starts in a row</th><td>{cf}</td></tr>\
         <tr><th>uptime</th><td class=\"uptime\">{up} (generation {gup})</td></tr>\
         <tr><th>requests</th><td class=\"requests\">{req}</td></tr>\
         <tr><th>last takeover</th><td class=\"takeover\">{takeover}</td></tr>\
         <tr><th>upgrades / rollbacks</th><td>{upg} / {rb}</td></tr>\
         <tr><th>last upgrade</th><td class=\"upgrade\">{upgrade}</td></tr></table>",
        h = health.name(),
        mp = escape_html(&m.mountpoint.to_string_lossy()),
        vol = escape_html(&m.volume),
        state = escape_html(&m.state),
        g = m.generation,
        pid = m.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
        re = m.restarts.exit,
        rs = m.restarts.signal,
        ro = m.restarts.oom,
        cf = m.consecutive_failures,
        up = duration_text(m.uptime_s),
        gup = duration_text(m.generation_uptime_s),
        takeover = escape_html(&takeover_text(m, now_unix_ms)),
        upgrade = escape_html(&upgrade_text(m, now_unix_ms)),
        req = escape_html(&request_summary(&counters.io)),
        upg = counters.upgrades,
        rb = counters.rollbacks,
    );
    let tips = tips(m, now_unix_ms);
    if !tips.is_empty() {
        out.push_str("<ul class=\"tips\">");
        for tip in tips {
            let _ = write!(out, "<li class=\"tip\">{}</li>", escape_html(&tip));
        }
        out.push_str("</ul>");
    }
    out.push_str("<h3>Last incidents</h3>");
    if m.incidents.is_empty() {
        out.push_str("<p class=\"incidents\">none</p>");
    } else {
        out.push_str("<ol class=\"incidents\">");
        for i in m.incidents.iter().rev().take(INCIDENTS_SHOWN_MAX) {
            // The last crash's takeover, beside the death it followed.
            let took = m
                .last_recovery
                .as_ref()
                .filter(|r| r.died_generation == i.generation && i.kind != "rollback")
                .and_then(|r| r.takeover_us)
                .map(|us| format!("; served again after {}", micros_text(us)))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<li class=\"incident {k}\">{ago}: generation {g} {k}: {d}{took}</li>",
                ago = ago(now_unix_ms, i.at_unix_ms),
                k = escape_html(&i.kind),
                g = i.generation,
                d = escape_html(&i.detail),
                took = escape_html(&took)
            );
        }
        out.push_str("</ol>");
    }
    out.push_str(chart);
    out.push_str("</section>");
}

/// The last crash recovery in words. Pure.
fn takeover_text(m: &MountStatus, now_unix_ms: u64) -> String {
    let Some(r) = m.last_recovery.as_ref() else {
        return "none".into();
    };
    let took = match (r.takeover_us, r.next_generation) {
        (Some(us), Some(next)) => format!(
            "generation {next} served after {}{}",
            micros_text(us),
            if r.warm { " (warm standby)" } else { "" }
        ),
        _ => "not served again yet".into(),
    };
    format!(
        "{}: generation {} {}; {took}",
        ago(now_unix_ms, r.at_unix_ms),
        r.died_generation,
        r.cause
    )
}

/// The last planned upgrade in words. Pure.
fn upgrade_text(m: &MountStatus, now_unix_ms: u64) -> String {
    let Some(u) = m.last_upgrade.as_ref() else {
        return "none".into();
    };
    let stall = u
        .stall_us
        .map(|us| format!(", applications stalled {}", micros_text(us)))
        .unwrap_or_default();
    format!(
        "{}: generation {} to {} {}{stall}",
        ago(now_unix_ms, u.at_unix_ms),
        u.from_generation,
        u.generation,
        u.outcome
    )
}

fn request_summary(io: &upgrade_protocol::GenerationCounters) -> String {
    if io.requests.is_empty() {
        return "none yet".into();
    }
    let mut by_count: Vec<_> = io.requests.iter().collect();
    by_count.sort_by_key(|o| std::cmp::Reverse(o.count));
    let top: Vec<String> = by_count
        .iter()
        .take(6)
        .map(|o| format!("{} {}", opcode_name(o.opcode), o.count))
        .collect();
    format!(
        "{} in all ({}); {} read, {} written",
        io.request_count(),
        top.join(", "),
        bytes_text(io.read_bytes),
        bytes_text(io.written_bytes)
    )
}

/// The page without charts. Pure.
pub fn render_page(
    mounts: &[MountStatus],
    totals: &SupervisorTotals,
    uptime_s: u64,
    now_unix_ms: u64,
) -> String {
    render_page_with_charts(mounts, &BTreeMap::new(), totals, uptime_s, now_unix_ms)
}

/// The page, each mount with the chart of its `charts` points (by mount
/// id; [`chart_svg`]). Pure.
pub fn render_page_with_charts(
    mounts: &[MountStatus],
    charts: &BTreeMap<String, Vec<ChartPoint>>,
    totals: &SupervisorTotals,
    uptime_s: u64,
    now_unix_ms: u64,
) -> String {
    let failing = mounts
        .iter()
        .filter(|m| health(m, now_unix_ms) != Health::Healthy)
        .count();
    let mut body = String::new();
    for m in mounts {
        let chart = charts
            .get(&m.mount_id)
            .map_or(String::new(), |p| chart_svg(p));
        mount_section(&mut body, m, now_unix_ms, &chart);
    }
    if mounts.is_empty() {
        body.push_str(
            "<p>No mounts. Mount one with <code>fsctl mount VOLUME MOUNTPOINT</code>.</p>",
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fs-supervisor</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"{PAGE_REFRESH_S}\">\
         <style>body{{font-family:sans-serif;margin:0 auto;padding:0 1em;max-width:60em;overflow-wrap:anywhere}}\
         section{{border:1px solid #ccc;padding:0 1em;margin:1em 0}}\
         table{{border-collapse:collapse;width:100%}}th,td{{vertical-align:top}}\
         figure{{margin:1em 0}}.chart svg{{display:block;height:5em;background:#f6f6f6}}\
         .healthy .health{{color:#070}}.degraded .health{{color:#a60}}.failing .health{{color:#b00}}\
         th{{text-align:left;padding-right:1em;white-space:nowrap}}.tip{{color:#b00}}\
         @media (max-width:40em){{body{{padding:0 .5em}}section{{padding:0 .5em}}th,td{{display:block}}\
         th{{padding-top:.4em}}td{{padding-left:1em}}}}</style></head><body>\
         <h1>fs-supervisor</h1><p id=\"summary\">up {up_text}, {n} mounts, {failing} need attention; \
         {gs} generations started, {up} upgrades, {rb} rollbacks. <a href=\"/metrics\">metrics</a> \
         · reloads every {PAGE_REFRESH_S} s</p>{body}</body></html>\n",
        up_text = duration_text(uptime_s),
        n = mounts.len(),
        gs = totals.generations_started,
        up = totals.upgrades,
        rb = totals.rollbacks,
    )
}
