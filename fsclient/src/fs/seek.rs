//! SEEK_DATA and SEEK_HOLE that see what the kernel has not written yet.
//!
//! With the writeback cache, what a process wrote can sit dirty in the
//! kernel's page cache, unseen by the server, and Linux's FUSE sends LSEEK
//! without writing it back first. Answered from the block map alone, a
//! SEEK_DATA skipped such data (and a SEEK_HOLE ended it early): `cp` of a
//! file being written copied holes where the data was.
//!
//! So an LSEEK is parked, and the session timer's thread answers it: it
//! asks the kernel to write the inode's pages back from the offset on
//! (NOTIFY_INVAL_INODE over that range: the kernel launders every dirty
//! page with a WRITE and waits for the replies), then answers from the
//! block map, which now holds them. Never in the request worker: the
//! WRITEs need workers, and workers waiting in that notification for them
//! deadlocked once every worker did.
//!
//! A parked LSEEK stays in the list until it is answered, so a planned
//! handover journals it (with the parked lock requests) for the successor;
//! after a kill -9 the kernel resends it (RESEND).

use fuse_wire::reply::ReplyLseek;
use fuse_wire::{LseekIn, NodeId, Request};

use super::{lock, BatonFs};

/// `SEEK_DATA` (lseek(2)).
pub(super) const SEEK_DATA: u32 = 3;
/// `SEEK_HOLE` (lseek(2)).
pub(super) const SEEK_HOLE: u32 = 4;

/// The LSEEKs waiting for the timer's thread, until it stops.
#[derive(Default)]
pub(super) struct ParkedSeeks {
    waiting: Vec<ParkedSeek>,
    /// The timer's thread stopped: LSEEKs are answered where they arrive.
    closed: bool,
}

/// An LSEEK waiting for the timer's thread.
pub(super) struct ParkedSeek {
    unique: u64,
    ino: u64,
    arg: LseekIn,
    reply: ReplyLseek,
    /// The request as read from /dev/fuse, for a handover's journal.
    raw: Vec<u8>,
}

impl BatonFs {
    /// LSEEK: SEEK_DATA and SEEK_HOLE are parked for the timer's thread
    /// (module docs), also before it starts (a journaled LSEEK replayed by
    /// a successor). Once it stopped (the mount is ending), or without a
    /// connection to notify, one is answered here, from what the server
    /// has.
    pub(super) fn seek(&self, req: &Request<'_>, ino: u64, arg: &LseekIn, reply: ReplyLseek) {
        if (arg.whence == SEEK_DATA || arg.whence == SEEK_HOLE) && self.kernel.get().is_some() {
            let mut seeks = lock(&self.parked_seeks);
            if !seeks.closed {
                seeks.waiting.push(ParkedSeek {
                    unique: req.unique(),
                    ino,
                    arg: *arg,
                    reply,
                    raw: req.raw().to_vec(),
                });
                drop(seeks);
                return self.wake_timer_thread();
            }
        }
        self.answer_seek(req.unique(), ino, arg, reply);
    }

    /// Answers every parked LSEEK (on the timer's thread), each after the
    /// kernel wrote back its inode's dirty pages from the offset on.
    pub(crate) fn answer_parked_seeks(&self) {
        loop {
            let next = lock(&self.parked_seeks)
                .waiting
                .first()
                .map(|s| (s.unique, s.ino, s.arg));
            let Some((unique, ino, arg)) = next else {
                return;
            };
            crate::fault::delay(fuse_wire::abi::opcode::LSEEK);
            self.write_back_kernel_pages(ino, arg.offset);
            let parked = {
                let seeks = &mut lock(&self.parked_seeks).waiting;
                let at = seeks.iter().position(|s| s.unique == unique);
                at.map(|at| seeks.remove(at))
            };
            // Gone: a handover took it (the successor answers).
            if let Some(parked) = parked {
                self.answer_seek(unique, ino, &arg, parked.reply);
            }
        }
    }

    /// The raw parked LSEEKs, for a handover's journal.
    pub fn parked_seeks(&self) -> Vec<Vec<u8>> {
        lock(&self.parked_seeks)
            .waiting
            .iter()
            .map(|s| s.raw.clone())
            .collect()
    }

    /// The timer's thread is stopping (serving ended): LSEEKs are answered
    /// where they arrive from now on, and those still parked here from
    /// what the server has. (After a handover the sealed channel drops
    /// those answers: the successor, which got them in the journal,
    /// answers.)
    pub(crate) fn stop_parking_seeks(&self) {
        let waiting = {
            let mut seeks = lock(&self.parked_seeks);
            seeks.closed = true;
            std::mem::take(&mut seeks.waiting)
        };
        for parked in waiting {
            self.answer_seek(parked.unique, parked.ino, &parked.arg, parked.reply);
        }
    }

    /// Has the kernel write back `ino`'s dirty pages from `offset` on and
    /// waits for it. ENOENT: the kernel has nothing of `ino` cached.
    fn write_back_kernel_pages(&self, ino: u64, offset: u64) {
        let Some(channel) = self.kernel.get() else {
            return;
        };
        // Whole pages: the one holding `offset` and every one after it
        // (length 0: to the end).
        let from = i64::try_from(offset & !4095).unwrap_or(i64::MAX);
        if let Err(err) =
            fuse_wire::notify::inval_inode(channel.as_ref(), NodeId::from(ino), from, 0)
        {
            if err.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(ino, %err, "could not have the kernel write back its pages before an lseek; answering from what the server has");
            }
        }
    }

    fn answer_seek(&self, unique: u64, ino: u64, arg: &LseekIn, reply: ReplyLseek) {
        match self.do_lseek(ino, arg) {
            Ok(offset) => reply.offset(offset),
            Err(err) if err.is_fenced() => reply.abandon(),
            Err(err) => reply.error(self.fail_unique("lseek", unique, ino, &err)),
        }
    }
}
