//! The queue of answered requests whose exactly-once records may go: keys
//! are pushed when their reply was written, and a later write transaction
//! takes those older than [`ANSWERED_RECORD_KEEP`] (at most
//! [`ANSWERED_FORGET_BATCH_MAX`]) and deletes their records inside itself
//! (no extra commit). Every recorded write takes its share, so the due keys
//! do not pile up while requests keep coming; only a pile of them (a write
//! that kept rolling back) gets a transaction of its own. Shared by every
//! engine.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::types::RequestKey;

/// Answered request keys queued at most before the due ones are deleted
/// in a transaction of their own rather than riding along with the next
/// write, if [`ANSWERED_FORGET_BATCH_MAX`] of them are due. (At a steady
/// rate the queue holds [`ANSWERED_RECORD_KEEP`] of answers, most not due:
/// a transaction each time it passes this length was an extra write, and a
/// wait for the next request, after nearly every reply.)
pub const ANSWERED_QUEUE_MAX: usize = 1024;
/// Due keys one write deletes at most.
pub const ANSWERED_FORGET_BATCH_MAX: usize = 256;
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

    /// Queues `key`; true when the queue reached [`ANSWERED_QUEUE_MAX`]
    /// with at least [`ANSWERED_FORGET_BATCH_MAX`] keys due (the caller
    /// deletes them in a transaction of its own).
    pub(crate) fn push(&self, key: RequestKey) -> bool {
        let mut keys = self.lock();
        keys.push_back((Instant::now(), key));
        keys.len() >= ANSWERED_QUEUE_MAX
            && keys
                .get(ANSWERED_FORGET_BATCH_MAX - 1)
                .is_some_and(|(at, _)| at.elapsed() >= ANSWERED_RECORD_KEEP)
    }

    /// Takes the keys answered at least [`ANSWERED_RECORD_KEEP`] ago, at
    /// most [`ANSWERED_FORGET_BATCH_MAX`].
    pub(crate) fn take_due(&self) -> Vec<RequestKey> {
        let mut keys = self.lock();
        let mut due = Vec::new();
        while let Some((at, key)) = keys.front() {
            if at.elapsed() < ANSWERED_RECORD_KEEP || due.len() == ANSWERED_FORGET_BATCH_MAX {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_of(count: usize, answered_ago: Duration) -> AnsweredQueue {
        let queue = AnsweredQueue::default();
        let at = Instant::now() - answered_ago;
        queue
            .lock()
            .extend((0..count as u64).map(|unique| (at, RequestKey::new(1, unique))));
        queue
    }

    #[test]
    fn a_long_queue_of_keys_not_due_asks_for_no_transaction_of_its_own() {
        // A steady rate: the queue is long, but nothing is due yet (each
        // recorded write takes its share as keys fall due).
        let queue = queue_of(ANSWERED_QUEUE_MAX, Duration::ZERO);
        assert!(!queue.push(RequestKey::new(2, 1)));
        assert!(queue.take_due().is_empty());
    }

    #[test]
    fn a_pile_of_due_keys_asks_for_one_and_a_write_takes_a_bounded_share() {
        let queue = queue_of(ANSWERED_QUEUE_MAX, ANSWERED_RECORD_KEEP);
        assert!(queue.push(RequestKey::new(2, 1)));
        let first = queue.take_due();
        assert_eq!(first.len(), ANSWERED_FORGET_BATCH_MAX);
        assert_eq!(first[0], RequestKey::new(1, 0), "oldest first");
        // Put back after a rollback: first again, before younger keys.
        queue.put_back(first);
        assert_eq!(queue.take_due()[0], RequestKey::new(1, 0));
    }
}
