//! The status page (`GET /`): every mount with its generation, health,
//! restarts, last incidents, and a plain-language tip for each failing
//! state, derived from what the supervisor knows (restart causes and when
//! they happened, consecutive failed starts, the give-up state, what a dying
//! generation logged last, the last upgrade). Pure.

use std::fmt::Write as _;

use upgrade_protocol::{Incident, MountStatus};

use super::{opcode_name, SupervisorTotals};

/// Incidents counted by the tips: those of the last 10 minutes.
pub const TIP_WINDOW_MS: u64 = 10 * 60 * 1000;
/// Incidents shown per mount (newest first).
pub const INCIDENTS_SHOWN_MAX: usize = 5;

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

fn mount_section(out: &mut String, m: &MountStatus, now_unix_ms: u64) {
    let health = health(m, now_unix_ms);
    let counters = m.counters.clone().unwrap_or_default();
    let _ = write!(
        out,
        "<section class=\"mount {h}\" data-mountpoint=\"{mp}\"><h2>{mp} <span class=\"health\">{h}</span></h2>\
         <table><tr><th>volume</th><td>{vol}</td></tr><tr><th>state</th><td class=\"state\">{state}</td></tr>\
         <tr><th>generation</th><td class=\"generation\">{g}</td></tr><tr><th>pid</th><td>{pid}</td></tr>\
         <tr><th>restarts</th><td class=\"restarts\">exit {re} · signal {rs} · oom {ro}</td></tr>\
         <tr><th>failed starts in a row</th><td>{cf}</td></tr>\
         <tr><th>uptime</th><td>{up} s (generation {gup} s)</td></tr>\
         <tr><th>requests</th><td class=\"requests\">{req}</td></tr>\
         <tr><th>upgrades / rollbacks</th><td>{upg} / {rb}</td></tr></table>",
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
        up = m.uptime_s,
        gup = m.generation_uptime_s,
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
            let _ = write!(
                out,
                "<li class=\"incident {k}\">{ago}: generation {g} {k}: {d}</li>",
                ago = ago(now_unix_ms, i.at_unix_ms),
                k = escape_html(&i.kind),
                g = i.generation,
                d = escape_html(&i.detail)
            );
        }
        out.push_str("</ol>");
    }
    out.push_str("</section>");
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
        "{} in all ({}); {} B read, {} B written",
        io.request_count(),
        top.join(", "),
        io.read_bytes,
        io.written_bytes
    )
}

/// The page. Pure.
pub fn render_page(
    mounts: &[MountStatus],
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
        mount_section(&mut body, m, now_unix_ms);
    }
    if mounts.is_empty() {
        body.push_str(
            "<p>No mounts. Mount one with <code>fsctl mount VOLUME MOUNTPOINT</code>.</p>",
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fs-supervisor</title>\
         <style>body{{font-family:sans-serif;margin:1em 2em}}section{{border:1px solid #ccc;padding:0 1em;margin:1em 0}}\
         .healthy .health{{color:#070}}.degraded .health{{color:#a60}}.failing .health{{color:#b00}}\
         th{{text-align:left;padding-right:1em}}.tip{{color:#b00}}</style></head><body>\
         <h1>fs-supervisor</h1><p id=\"summary\">up {uptime_s} s, {n} mounts, {failing} need attention; \
         {gs} generations started, {up} upgrades, {rb} rollbacks. <a href=\"/metrics\">metrics</a></p>{body}</body></html>\n",
        n = mounts.len(),
        gs = totals.generations_started,
        up = totals.upgrades,
        rb = totals.rollbacks,
    )
}
