//! Logs one process leaves for another to read: when a generation dies or
//! fs-supervisor fails to start, whoever started it shows the last lines
//! its log holds.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes of a log shown when its writer dies, at most.
pub const LOG_TAIL_BYTES_MAX: u64 = 2048;

/// The last lines of a log (at most [`LOG_TAIL_BYTES_MAX`] bytes).
pub fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(LOG_TAIL_BYTES_MAX);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    // Drop a partial first line.
    let text = match (start > 0, text.find('\n')) {
        (true, Some(i)) => &text[i + 1..],
        _ => &text[..],
    };
    text.trim_end().to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let mut text = String::new();
        for i in 0..500 {
            text.push_str(&format!("line {i}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let tail = log_tail(&path);
        assert!(tail.ends_with("line 499"));
        assert!(tail.starts_with("line "));
        assert!(tail.len() as u64 <= LOG_TAIL_BYTES_MAX);
    }
}
