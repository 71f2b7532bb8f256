//! Test-only fault hooks: named points where a generation can be made to
//! die by SIGKILL, so the chaos tests can kill it exactly between two steps
//! (after a request was read, after its metadata committed but before the
//! reply, while a block uploads, while staging is cleared after a commit,
//! while handing over).
//!
//! Armed only by the environment, read once at start:
//!
//! ```text
//! BATON_FAULT=<point>[@<opcode>][#<n>]    e.g. after-commit@mkdir#3
//! BATON_DELAY=<opcode>:<ms>               sleep that long after reading such a request
//!                                         (lseek: before answering a parked one)
//! BATON_FAULT_GENERATION=<g>              both only in generation g (default: any)
//! BATON_DELAY_GENERATION=<g>              the delay only in generation g (default: as above)
//! ```
//!
//! The delay makes a request still running when a handover starts, so it
//! must go through the in-flight journal; in the generation after a kill,
//! it makes a resent request answered after the session timer's first
//! tick.
//!
//! When unset (production) a hook is one relaxed atomic load. A malformed
//! value is refused at start with an error naming the variable, never
//! ignored: a test that thinks it injects a fault must not silently pass.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use fuse_wire::abi::opcode;

/// The environment variable naming the fault.
pub const FAULT_ENV: &str = "BATON_FAULT";
/// The environment variable naming a delay.
pub const DELAY_ENV: &str = "BATON_DELAY";
/// The environment variable restricting it to one generation.
pub const FAULT_GENERATION_ENV: &str = "BATON_FAULT_GENERATION";
/// The environment variable restricting the delay to one generation.
pub const DELAY_GENERATION_ENV: &str = "BATON_DELAY_GENERATION";

/// Where a generation can be killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// A request was read from /dev/fuse; nothing of it was done.
    AfterRead,
    /// A request's metadata changes are durable (in the operation log of
    /// a SQLite volume, committed on PostgreSQL); the reply is not sent.
    AfterCommit,
    /// A block upload started; the block map is not committed. For
    /// copy_file_range: its bytes are staged, no block is shared yet.
    DuringUpload,
    /// Staged data committed; its staging is half cleared (the size record
    /// settled, the block files not removed yet).
    DuringClear,
    /// The handover state is written; the next generation has not taken it.
    DuringHandover,
}

impl Point {
    fn parse(s: &str) -> Option<Point> {
        Some(match s {
            "after-read" => Point::AfterRead,
            "after-commit" => Point::AfterCommit,
            "during-upload" => Point::DuringUpload,
            "during-clear" => Point::DuringClear,
            "during-handover" => Point::DuringHandover,
            _ => return None,
        })
    }
}

#[derive(Debug)]
struct Fault {
    point: Point,
    opcode: Option<u32>,
    nth: u64,
    hits: AtomicU64,
}

static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
static DELAY: OnceLock<Option<(u32, std::time::Duration)>> = OnceLock::new();

/// A malformed fault specification.
#[derive(Debug, thiserror::Error)]
#[error("{variable}={value} is not a fault specification: {reason} (expected <point>[@<opcode>][#<n>], points: after-read, after-commit, during-upload, during-clear, during-handover)")]
pub struct FaultSpecError {
    variable: &'static str,
    value: String,
    reason: &'static str,
}

/// Reads the environment and arms the hook for `generation`. Call once at
/// start, before serving.
pub fn arm_from_env(generation: u64) -> Result<(), FaultSpecError> {
    let only = |variable| match std::env::var(variable) {
        Ok(g) if !g.is_empty() => g.parse::<u64>().map(Some).map_err(|_| FaultSpecError {
            variable,
            value: g.clone(),
            reason: "not a generation number",
        }),
        _ => Ok(None),
    };
    let fault_only = only(FAULT_GENERATION_ENV)?;
    let here = fault_only.is_none_or(|g| g == generation);
    let delay_here = only(DELAY_GENERATION_ENV)?
        .or(fault_only)
        .is_none_or(|g| g == generation);
    let fault = match std::env::var(FAULT_ENV) {
        Ok(spec) if !spec.is_empty() && here => {
            let fault = parse(&spec)?;
            tracing::warn!(spec, generation, "fault hook armed (test only)");
            Some(fault)
        }
        _ => None,
    };
    let delay = match std::env::var(DELAY_ENV) {
        Ok(spec) if !spec.is_empty() && delay_here => {
            let delay = parse_delay(&spec)?;
            tracing::warn!(spec, generation, "delay hook armed (test only)");
            Some(delay)
        }
        _ => None,
    };
    let _ = FAULT.set(fault);
    let _ = DELAY.set(delay);
    Ok(())
}

fn parse_delay(spec: &str) -> Result<(u32, std::time::Duration), FaultSpecError> {
    let bad = |reason| FaultSpecError {
        variable: DELAY_ENV,
        value: spec.to_owned(),
        reason,
    };
    let (op, ms) = spec
        .split_once(':')
        .ok_or_else(|| bad("expected <opcode>:<ms>"))?;
    let op = opcode_named(op).ok_or_else(|| bad("unknown opcode"))?;
    let ms: u64 = ms.parse().map_err(|_| bad("<ms> must be a number"))?;
    Ok((op, std::time::Duration::from_millis(ms)))
}

fn parse(spec: &str) -> Result<Fault, FaultSpecError> {
    let bad = |reason| FaultSpecError {
        variable: FAULT_ENV,
        value: spec.to_owned(),
        reason,
    };
    let (rest, nth) = match spec.split_once('#') {
        Some((rest, n)) => (
            rest,
            n.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("#<n> must be a positive count"))?,
        ),
        None => (spec, 1),
    };
    let (point, opcode) = match rest.split_once('@') {
        Some((p, op)) => (
            p,
            Some(opcode_named(op).ok_or_else(|| bad("unknown opcode"))?),
        ),
        None => (rest, None),
    };
    let point = Point::parse(point).ok_or_else(|| bad("unknown point"))?;
    Ok(Fault {
        point,
        opcode,
        nth,
        hits: AtomicU64::new(0),
    })
}

fn opcode_named(name: &str) -> Option<u32> {
    Some(match name {
        "setattr" => opcode::SETATTR,
        "symlink" => opcode::SYMLINK,
        "mknod" => opcode::MKNOD,
        "mkdir" => opcode::MKDIR,
        "unlink" => opcode::UNLINK,
        "rmdir" => opcode::RMDIR,
        "rename" => opcode::RENAME2,
        "link" => opcode::LINK,
        "create" => opcode::CREATE,
        "tmpfile" => opcode::TMPFILE,
        "write" => opcode::WRITE,
        "read" => opcode::READ,
        "fsync" => opcode::FSYNC,
        "flush" => opcode::FLUSH,
        "setxattr" => opcode::SETXATTR,
        "removexattr" => opcode::REMOVEXATTR,
        "readdir" => opcode::READDIRPLUS,
        "lookup" => opcode::LOOKUP,
        "lseek" => opcode::LSEEK,
        "fallocate" => opcode::FALLOCATE,
        "copy_file_range" => opcode::COPY_FILE_RANGE_64,
        _ => return None,
    })
}

/// The delay hook: sleeps if the armed delay is for `op`. Runs at
/// after-read ([`hit`]) and, for TMPFILE, also before its handler takes
/// the lock that holds the session tick off (`do_tmpfile`): a TMPFILE read
/// late, as on a loaded machine.
pub fn delay(op: u32) {
    if let Some(Some((delayed, duration))) = DELAY.get() {
        if *delayed == op {
            std::thread::sleep(*duration);
        }
    }
}

/// The hook: dies by SIGKILL here (after-read is hooked for lookup,
/// read, write, fsync, flush, readdir and every exactly-once mutation) if the armed fault matches `point` and
/// the request's `op` (RENAME and RENAME2, READDIR and READDIRPLUS,
/// COPY_FILE_RANGE and its _64 form count as one; delays too) for the n-th time.
pub fn hit(point: Point, op: u32) {
    let op = match op {
        opcode::RENAME => opcode::RENAME2,
        opcode::READDIR => opcode::READDIRPLUS,
        opcode::COPY_FILE_RANGE => opcode::COPY_FILE_RANGE_64,
        other => other,
    };
    if point == Point::AfterRead {
        delay(op);
    }
    let Some(Some(fault)) = FAULT.get() else {
        return;
    };
    if fault.point != point {
        return;
    }
    if fault.opcode.is_some_and(|want| want != op) {
        return;
    }
    if fault.hits.fetch_add(1, Ordering::SeqCst) + 1 == fault.nth {
        tracing::warn!(?point, opcode = op, "fault hook: killing this generation");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn specifications_parse_or_name_the_problem() {
        let f = parse("after-commit@mkdir#3").unwrap();
        assert_eq!(f.point, Point::AfterCommit);
        assert_eq!(f.opcode, Some(opcode::MKDIR));
        assert_eq!(f.nth, 1 + 2);
        let f = parse("during-upload").unwrap();
        assert_eq!((f.point, f.opcode, f.nth), (Point::DuringUpload, None, 1));
        for bad in [
            "after-comit",
            "after-commit@mkdri",
            "after-read#0",
            "after-read#x",
        ] {
            let e = parse(bad).err().unwrap().to_string();
            assert!(e.contains(bad) && e.contains("expected"), "{e}");
        }
    }
}
