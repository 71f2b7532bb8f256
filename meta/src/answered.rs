//! The queue of answered requests whose exactly-once records may go: keys
//! are pushed when their reply was written, and a later write transaction
//! takes those older than [`ANSWERED_RECORD_KEEP`] and deletes their
//! records inside itself (no extra commit). Shared by every engine.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::types::RequestKey;

/// Answered request keys queued at most before they are deleted in a
/// transaction of their own rather than riding along with the next write.
pub const ANSWERED_QUEUE_MAX: usize = 1024;
/// How long the record of an answered request is kept. A handover may
/// journal a request whose reply was just written (the worker had not yet
/// withdrawn it); the next generation must still find its record then.
pub const ANSWERED_RECORD_KEEP: Duration = Duration::from_secs(2);

/// Answered request keys, with when they were answered.
#[derive(Debug, Default)]
pub(crate) struct AnsweredQueue {
    keys: Mutex<VecDeque<(Instant, RequestKey)>>,
}

impl AnsweredQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, RequestKey)>> {
        // Valid after any statement.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key`; true when the queue reached [`ANSWERED_QUEUE_MAX`].
    pub(crate) fn push(&self, key: RequestKey) -> bool {
        let mut keys = self.lock();
        keys.push_back((Instant::now(), key));
        keys.len() >= ANSWERED_QUEUE_MAX
    }

    /// Takes the keys answered at least [`ANSWERED_RECORD_KEEP`] ago.
    pub(crate) fn take_due(&self) -> Vec<RequestKey> {
        let mut keys = self.lock();
        let mut due = Vec::new();
        while let Some((at, key)) = keys.front() {
            if at.elapsed() < ANSWERED_RECORD_KEEP {
                break;
            }
            due.push(*key);
            keys.pop_front();
        }
        due
    }

    /// Puts back keys taken for a write that rolled back: in front, due at
    /// once (behind a key answered since, they would wait for it).
    pub(crate) fn put_back(&self, due: Vec<RequestKey>) {
        let now = Instant::now();
        let long_ago = now.checked_sub(ANSWERED_RECORD_KEEP).unwrap_or(now);
        let mut keys = self.lock();
        for key in due.into_iter().rev() {
            keys.push_front((long_ago, key));
        }
    }
}
