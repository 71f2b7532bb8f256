//! A mount's counters over its whole life, for `/metrics`, `fsctl status`
//! and the status page: what its generations report (`Message::Stats`),
//! summed across generations so a replaced generation never makes a
//! counter go down, plus what the supervisor sees itself (generations
//! started, upgrades, rollbacks, journaled requests, recent incidents).
//! Pure bookkeeping: the executor feeds it.

use std::collections::{BTreeMap, VecDeque};

use upgrade_protocol::{
    GenerationCounters, GenerationReport, Incident, MountCounters, MountHistory, Restarts,
};

/// Incidents kept per mount (the oldest is dropped).
pub const INCIDENTS_MAX: usize = 16;
/// Generations whose latest report is kept apart (older ones are summed
/// into one total). More than one: a rolled-back upgrade makes the old
/// generation report again after the new one did.
pub const RECENT_GENERATIONS_MAX: usize = 4;
/// Characters of an incident's detail kept.
pub const INCIDENT_DETAIL_CHARS_MAX: usize = 300;

/// The counters of one mount.
#[derive(Debug, Default)]
pub struct MountTally {
    /// Sum of the last reports of older generations.
    before: GenerationCounters,
    recovered_before: u64,
    /// The latest report of each recent generation: (recovered, counters).
    recent: BTreeMap<u64, (u64, GenerationCounters)>,
    /// The generation that reported last, while it serves.
    serving: Option<u64>,
    generations_started: u64,
    upgrades: u64,
    rollbacks: u64,
    requests_journaled: u64,
    incidents: VecDeque<Incident>,
}

impl MountTally {
    /// A report from the serving generation `generation` (its counts since
    /// it started): replaces its previous one. Once more than
    /// [`RECENT_GENERATIONS_MAX`] generations reported, the oldest one's
    /// last report joins the total.
    pub fn report(&mut self, generation: u64, recovered: u64, counters: GenerationCounters) {
        self.recent.insert(generation, (recovered, counters));
        self.serving = Some(generation);
        while self.recent.len() > RECENT_GENERATIONS_MAX {
            if let Some((_, (recovered, counters))) = self.recent.pop_first() {
                self.recovered_before += recovered;
                self.before.add(&counters);
            }
        }
    }

    /// Why the serving generation's metadata takes no more changes (it
    /// found corruption), from its last report.
    pub fn read_only_reason(&self) -> Option<String> {
        let (_, counters) = self.recent.get(&self.serving?)?;
        counters.metadata_quarantined.clone()
    }

    /// The serving generation died: its last report stays in the totals
    /// (counts since that report are lost, never counted twice), its
    /// pending uploads are no longer its own.
    pub fn serving_ended(&mut self) {
        self.serving = None;
    }

    /// A generation process was started.
    pub fn generation_started(&mut self) {
        self.generations_started += 1;
    }

    /// A planned upgrade ended: upgraded (`ok`) or rolled back, with
    /// `journaled` requests handed from the old generation.
    pub fn upgrade_ended(&mut self, ok: bool, rolled_back: bool, journaled: u32) {
        if ok {
            self.upgrades += 1;
        } else if rolled_back {
            self.rollbacks += 1;
        }
        self.requests_journaled += u64::from(journaled);
    }

    /// Records an incident; `detail` is cut to
    /// [`INCIDENT_DETAIL_CHARS_MAX`] characters.
    pub fn incident(&mut self, at_unix_ms: u64, generation: u64, kind: &str, detail: &str) {
        if self.incidents.len() == INCIDENTS_MAX {
            self.incidents.pop_front();
        }
        self.incidents.push_back(Incident {
            at_unix_ms,
            generation,
            kind: kind.to_string(),
            detail: detail.chars().take(INCIDENT_DETAIL_CHARS_MAX).collect(),
        });
    }

    /// Requests recovered by exactly-once records over the mount's life.
    pub fn requests_recovered(&self) -> u64 {
        self.recovered_before + self.recent.values().map(|(r, _)| r).sum::<u64>()
    }

    /// The totals: every generation's counts; `uploads_pending` is the
    /// serving generation's.
    pub fn counters(&self) -> MountCounters {
        let mut io = self.before.clone();
        for (_, counters) in self.recent.values() {
            io.add(counters);
        }
        // Gauges are the serving generation's, never sums.
        let serving = self.serving.and_then(|g| self.recent.get(&g));
        io.uploads_pending = serving.map_or(0, |(_, c)| c.uploads_pending);
        io.cache_used_bytes = serving.map_or(0, |(_, c)| c.cache_used_bytes);
        io.cache_capacity_bytes = serving.map_or(0, |(_, c)| c.cache_capacity_bytes);
        io.storage.staged_bytes = serving.map_or(0, |(_, c)| c.storage.staged_bytes);
        io.storage.staged_oldest_age_s = serving.map_or(0, |(_, c)| c.storage.staged_oldest_age_s);
        MountCounters {
            io,
            generations_started: self.generations_started,
            upgrades: self.upgrades,
            rollbacks: self.rollbacks,
            requests_journaled: self.requests_journaled,
        }
    }

    /// The recent incidents, oldest first.
    pub fn incidents(&self) -> Vec<Incident> {
        self.incidents.iter().cloned().collect()
    }

    /// The tally as the state record keeps it (with the executor's own
    /// `restarts`; recovery and upgrade left for it to fill in).
    pub fn to_history(&self, restarts: Restarts) -> MountHistory {
        MountHistory {
            counters_before: self.before.clone(),
            recovered_before: self.recovered_before,
            recent: self
                .recent
                .iter()
                .map(|(generation, (recovered, counters))| GenerationReport {
                    generation: *generation,
                    requests_recovered: *recovered,
                    counters: counters.clone(),
                })
                .collect(),
            generations_started: self.generations_started,
            upgrades: self.upgrades,
            rollbacks: self.rollbacks,
            requests_journaled: self.requests_journaled,
            restarts,
            incidents: self.incidents(),
            last_recovery: None,
            last_upgrade: None,
        }
    }

    /// The tally a record's history describes: no generation serves yet
    /// (the first report says which one does).
    pub fn from_history(history: &MountHistory) -> MountTally {
        let mut tally = MountTally {
            before: history.counters_before.clone(),
            recovered_before: history.recovered_before,
            recent: history
                .recent
                .iter()
                .map(|r| (r.generation, (r.requests_recovered, r.counters.clone())))
                .collect(),
            serving: None,
            generations_started: history.generations_started,
            upgrades: history.upgrades,
            rollbacks: history.rollbacks,
            requests_journaled: history.requests_journaled,
            incidents: history.incidents.iter().cloned().collect(),
        };
        // A hand-edited record cannot make the tally break its bounds.
        while tally.incidents.len() > INCIDENTS_MAX {
            tally.incidents.pop_front();
        }
        while tally.recent.len() > RECENT_GENERATIONS_MAX {
            if let Some((_, (recovered, counters))) = tally.recent.pop_first() {
                tally.recovered_before += recovered;
                tally.before.add(&counters);
            }
        }
        tally
    }
}

/// The last non-empty line of a generation's log tail: what it said
/// before dying. Pure.
pub fn last_log_line(tail: &str) -> &str {
    tail.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use upgrade_protocol::{OpcodeCounters, LATENCY_BOUNDS_US};

    fn writes(count: u64, bytes: u64) -> GenerationCounters {
        GenerationCounters {
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            requests: vec![OpcodeCounters {
                opcode: 16,
                count,
                latency_us_sum: count,
                latency_buckets: vec![count, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            }],
            written_bytes: bytes,
            uploads_pending: count,
            ..GenerationCounters::default()
        }
    }

    #[test]
    fn staging_gauges_are_the_serving_generations_and_storage_counters_add_up() {
        let storage = |puts, staged_bytes| GenerationCounters {
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            storage: upgrade_protocol::StorageCounters {
                object_store: vec![upgrade_protocol::OperationCounters {
                    operation: "put".to_string(),
                    count: puts,
                    latency_buckets: vec![puts, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    ..Default::default()
                }],
                staged_bytes,
                staged_oldest_age_s: staged_bytes / 100,
                ..Default::default()
            },
            ..GenerationCounters::default()
        };
        let mut tally = MountTally::default();
        tally.report(1, 0, storage(3, 500));
        tally.serving_ended();
        let io = tally.counters().io;
        assert_eq!(
            (io.storage.staged_bytes, io.storage.staged_oldest_age_s),
            (0, 0)
        );
        tally.report(2, 0, storage(2, 300));
        let io = tally.counters().io;
        assert_eq!(io.storage.object_store[0].count, 5);
        assert_eq!(
            (io.storage.staged_bytes, io.storage.staged_oldest_age_s),
            (300, 3)
        );
    }

    #[test]
    fn totals_never_go_down_when_a_generation_is_replaced() {
        let mut tally = MountTally::default();
        tally.report(1, 1, writes(5, 500));
        tally.report(1, 2, writes(7, 700));
        assert_eq!(tally.counters().io.request_count(), 7);
        // Killed: generation 2 starts from zero.
        tally.serving_ended();
        assert_eq!(tally.counters().io.written_bytes, 700);
        assert_eq!(tally.counters().io.uploads_pending, 0);
        tally.report(2, 0, writes(1, 10));
        assert_eq!(tally.counters().io.request_count(), 8);
        assert_eq!(tally.counters().io.written_bytes, 710);
        assert_eq!(tally.counters().io.uploads_pending, 1);
        // A planned upgrade: generation 3 reports without a death seen...
        tally.report(3, 1, writes(2, 20));
        assert_eq!(tally.counters().io.request_count(), 10);
        assert_eq!(tally.requests_recovered(), 3);
        // ... and is rolled back: generation 2 reports its running total.
        tally.report(2, 0, writes(3, 30));
        assert_eq!(tally.counters().io.request_count(), 12, "no double count");
        // Many generations later, the old ones are summed, still counted.
        for g in 4..20 {
            tally.report(g, 0, writes(1, 1));
        }
        assert_eq!(tally.counters().io.request_count(), 12 + 16);
        assert_eq!(tally.requests_recovered(), 3);
    }

    #[test]
    fn a_tally_read_back_from_its_history_counts_on_without_double_counting() {
        let mut tally = MountTally::default();
        tally.generation_started();
        tally.report(1, 2, writes(5, 500));
        tally.serving_ended();
        tally.report(2, 0, writes(3, 300));
        tally.incident(7, 1, "signal", "signal 9 (SIGKILL)");
        tally.upgrade_ended(true, false, 4);
        let restarts = Restarts {
            signal: 1,
            ..Restarts::default()
        };
        let history = tally.to_history(restarts);
        assert_eq!(history.restarts, restarts);
        let mut back = MountTally::from_history(&history);
        assert_eq!(back.counters().io.written_bytes, 800);
        assert_eq!(back.requests_recovered(), 2);
        assert_eq!(back.incidents(), tally.incidents());
        assert_eq!(back.counters().upgrades, 1);
        assert_eq!(back.counters().io.uploads_pending, 0, "nothing serves yet");
        // Generation 2 outlived the old supervisor and reports its running
        // total again: it replaces its entry.
        back.report(2, 0, writes(4, 400));
        assert_eq!(back.counters().io.written_bytes, 900);
        assert_eq!(back.counters().io.uploads_pending, 4);
    }

    #[test]
    fn incidents_are_bounded_and_cut() {
        let mut tally = MountTally::default();
        for i in 0..INCIDENTS_MAX as u64 + 3 {
            tally.incident(i, i, "oom", &"x".repeat(1000));
        }
        let incidents = tally.incidents();
        assert_eq!(incidents.len(), INCIDENTS_MAX);
        assert_eq!(incidents[0].at_unix_ms, 3);
        assert_eq!(incidents[0].detail.len(), INCIDENT_DETAIL_CHARS_MAX);
        tally.upgrade_ended(true, false, 2);
        tally.upgrade_ended(false, true, 1);
        tally.upgrade_ended(false, false, 0);
        let c = tally.counters();
        assert_eq!((c.upgrades, c.rollbacks, c.requests_journaled), (1, 1, 3));
    }

    #[test]
    fn the_last_log_line_is_what_a_generation_said_last() {
        assert_eq!(
            last_log_line("a\nerror: x unreachable\n\n  \n"),
            "error: x unreachable"
        );
        assert_eq!(last_log_line(""), "");
    }
}
