//! Progress of long work (`warmup`, `fsck`, `gc`), always on stderr so
//! stdout keeps only the result (the one JSON object of `--json`): an
//! indicatif bar on a terminal, a plain line every
//! [`PLAIN_PROGRESS_INTERVAL`] otherwise (a log file or a pipe gets no
//! control characters), from a thread of its own that asks the work how
//! far it got. Work done before the first interval prints no line.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a plain (non-terminal) progress line is printed.
pub const PLAIN_PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// How often the bar is redrawn, and the stop flag looked at.
const TICK: Duration = Duration::from_millis(100);

/// How far the work got, as the work says.
pub struct Tick {
    /// Done so far (bytes or items, as the bar's template counts).
    pub position: u64,
    /// The whole, when known (a spinner otherwise).
    pub length: Option<u64>,
    /// What the bar shows beside it and a plain line says.
    pub message: String,
}

/// Where progress goes.
pub enum Sink {
    /// A bar with this indicatif template (`{bar}`, `{pos}`, `{bytes}`,
    /// `{msg}` ...) when stderr is a terminal, plain lines otherwise.
    Stderr {
        /// Template of the bar (with a known length).
        template: &'static str,
    },
    /// Plain lines into this writer at this interval (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Lines(Box<dyn Write + Send>, Duration),
}

/// A running progress display; [`Progress::finish`] stops and clears it.
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts showing the progress of `fsctl <command>`, asking `poll` (with
    /// the time since the start) how far it got.
    pub fn start(
        command: &'static str,
        sink: Sink,
        poll: impl Fn(Duration) -> Tick + Send + 'static,
    ) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || match sink {
                Sink::Stderr { template } if std::io::stderr().is_terminal() => {
                    bar(template, &stopped, &poll)
                }
                Sink::Stderr { .. } => lines(
                    command,
                    &mut std::io::stderr(),
                    PLAIN_PROGRESS_INTERVAL,
                    &stopped,
                    &poll,
                ),
                Sink::Lines(mut out, interval) => {
                    lines(command, &mut out, interval, &stopped, &poll)
                }
            })
            // No thread, no progress: the work itself goes on.
            .ok();
        Progress { stop, thread }
    }

    /// Stops the display (a bar is cleared) before the result is printed.
    pub fn finish(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An error return skips `finish`: the bar must not outlive it.
        self.stop_thread();
    }
}

fn bar(template: &str, stop: &AtomicBool, poll: &dyn Fn(Duration) -> Tick) {
    let started = Instant::now();
    let bar = indicatif::ProgressBar::new_spinner();
    let with_length = indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    let mut spinner = true;
    while !stop.load(Ordering::Relaxed) {
        let tick = poll(started.elapsed());
        match tick.length {
            Some(length) => {
                if spinner {
                    bar.set_style(with_length.clone());
                    spinner = false;
                }
                bar.set_length(length);
            }
            None if !spinner => {
                bar.set_style(indicatif::ProgressStyle::default_spinner());
                spinner = true;
            }
            None => bar.tick(),
        }
        bar.set_position(tick.position);
        bar.set_message(tick.message);
        std::thread::sleep(TICK);
    }
    bar.finish_and_clear();
}

fn lines(
    command: &str,
    out: &mut dyn Write,
    interval: Duration,
    stop: &AtomicBool,
    poll: &dyn Fn(Duration) -> Tick,
) {
    let started = Instant::now();
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK.min(interval));
        if last.elapsed() >= interval && !stop.load(Ordering::Relaxed) {
            last = Instant::now();
            let tick = poll(started.elapsed());
            let _ = writeln!(out, "fsctl {command}: {}", tick.message);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_lines_say_how_far_the_work_got_until_it_finishes() {
        let out = Shared::default();
        let done = Arc::new(AtomicU64::new(0));
        let seen = done.clone();
        let progress = Progress::start(
            "gc",
            Sink::Lines(Box::new(out.clone()), Duration::from_millis(20)),
            move |_| Tick {
                position: seen.load(Ordering::Relaxed),
                length: Some(10),
                message: format!("{} of 10 objects", seen.load(Ordering::Relaxed)),
            },
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = || String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        for n in 1..=3 {
            done.store(n, Ordering::Relaxed);
            let line = format!("fsctl gc: {n} of 10 objects\n");
            while !text().contains(&line) {
                assert!(
                    Instant::now() < deadline,
                    "no line {line:?} in {:?}",
                    text()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Joined: nothing is written after this.
        progress.finish();
        let after = text();
        assert!(
            after.lines().all(|l| l.starts_with("fsctl gc: ")),
            "{after}"
        );
    }
}
