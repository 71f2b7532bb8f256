//! How a generation is scheduled while it starts, and once it is ready.
//!
//! A warm standby and an upgrade's incoming generation start while another
//! generation serves. Nobody waits for them, but their start-up (exec, the
//! volume's open, read buffers faulted in: tens of ms of CPU) competed with
//! the serving generation and the applications. At nice 10 a starting
//! generation still kept its CPU until its time slice ended, and a FUSE
//! worker or an application woken there waited behind it: on a 2-vCPU VM
//! that made the slowest application call of a planned upgrade 2.81-3.14
//! ms (p50 over 50 upgrades, three runs), 1.91-2.02 ms with this module
//! (`baton-bench upgrade-stall`, docs/benchmarks-history.md, session 14).
//!
//! So such a generation starts under `SCHED_IDLE` ([`Startup::Background`]):
//! it runs on CPU time nobody else wants, and any thread woken beside it
//! preempts it at once. Once it connected (it is ready, and waits idle for
//! the fd) it gets the default policy at nice 0 ([`raise`]), so it serves
//! at normal priority. Two guards:
//! - **Starvation.** On a saturated node a `SCHED_IDLE` process gets almost
//!   no CPU. One that has not connected [`BACKGROUND_START_MAX`] after it
//!   was started gets the default policy at nice [`STARTUP_NICE`]
//!   ([`lift`]), a small but certain share; a standby promoted before it
//!   connected (the serving generation died meanwhile) is raised at once.
//! - **Privilege.** Only a supervisor with `CAP_SYS_NICE` can give a
//!   generation its priority back (the shipped systemd unit keeps that
//!   capability for this). Without it every generation starts as
//!   [`Startup::Urgent`], at the supervisor's own priority, so none can be
//!   left serving at a low one.
//!
//! A generation the mount waits for (a cold start after a death with no
//! standby ready) is [`Startup::Urgent`] too.
//!
//! The caveat of `SCHED_IDLE`: a thread preempted while it holds a kernel
//! lock others need makes them wait until it runs again. The one global
//! lock of a start-up, joining the generation's memory cgroup, is taken
//! before the policy is entered (the join is a `pre_exec` hook, the policy
//! is set by the supervisor after the exec: [`Startup::apply`]); thread
//! creation takes the cgroup fork lock for reading only; and the lift
//! bounds how long anything can wait.

use std::sync::OnceLock;
use std::time::Duration;

/// The nice value a starved background start-up is lifted to (see the
/// module docs).
pub const STARTUP_NICE: i32 = 10;

/// How long a generation may start under `SCHED_IDLE` before it is lifted
/// to [`STARTUP_NICE`]. A standby starts in 40-160 ms on a busy 2-vCPU
/// VM; past this the node is saturated.
pub const BACKGROUND_START_MAX: Duration = Duration::from_millis(500);

/// How a generation is scheduled until it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Startup {
    /// At the supervisor's own priority: the mount waits for it, or the
    /// supervisor could not give it its priority back.
    Urgent,
    /// Under `SCHED_IDLE` (module docs).
    Background,
}

impl Startup {
    /// `Background` if another generation serves meanwhile (`waited_for`
    /// false) and this supervisor can raise it later; `Urgent` otherwise.
    pub fn choose(waited_for: bool) -> Startup {
        if waited_for || !may_raise() {
            Startup::Urgent
        } else {
            Startup::Background
        }
    }

    /// Puts every thread of `pid`, a child just started, under this
    /// start-up's policy. Called by the parent once the child has exec'd,
    /// not from a `pre_exec` hook: between fork and exec the child holds
    /// copies of every supervisor fd (the state directory's lock, the
    /// control socket), and a child starved under `SCHED_IDLE` there kept
    /// them long enough that a supervisor restarted after a kill -9 found
    /// its lock still held and refused to start. Best effort: a process
    /// that could not be put in the background (a seccomp filter, say)
    /// starts at nice 10 or normal priority, and is raised alike; never a
    /// failed start.
    pub fn apply(self, pid: u32) {
        if self == Startup::Urgent {
            return;
        }
        for_each_thread(pid, |tid| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: plain syscalls on a thread of our own child with a
            // valid parameter block. The nice value is kept across the
            // policy change, so a lift to the default policy lands at
            // STARTUP_NICE.
            unsafe {
                if libc::setpriority(libc::PRIO_PROCESS, tid, STARTUP_NICE) != 0
                    || libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_IDLE, &param) != 0
                {
                    tracing::debug!(pid, tid, err = %std::io::Error::last_os_error(), "cannot start a generation thread in the background");
                }
            }
        });
    }
}

/// Gives every thread of `pid` the default policy at nice 0 (threads it
/// set to another policy itself, such as `SCHED_BATCH`, keep it). Best
/// effort: a failure only leaves it slower, and is logged.
pub fn raise(pid: u32) {
    for_each_thread(pid, |tid| {
        leave_idle(tid);
        // SAFETY: setpriority on a thread id of our own child.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 0) } != 0 {
            tracing::debug!(pid, tid, err = %std::io::Error::last_os_error(), "cannot raise a generation thread's priority");
        }
    });
}

/// Gives every `SCHED_IDLE` thread of `pid` the default policy, at the
/// nice value it had ([`STARTUP_NICE`]).
pub fn lift(pid: u32) {
    for_each_thread(pid, leave_idle);
}

fn leave_idle(tid: u32) {
    let tid = tid as libc::pid_t;
    // SAFETY: sched_getscheduler/sched_setscheduler on a thread id of our
    // own child with a valid parameter block.
    unsafe {
        if libc::sched_getscheduler(tid) != libc::SCHED_IDLE {
            return;
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) != 0 {
            tracing::warn!(tid, err = %std::io::Error::last_os_error(), "cannot take a generation thread out of SCHED_IDLE");
        }
    }
}

/// Calls `f` once for every thread of `pid`, including threads started
/// while it walks: a thread started by one not yet visited inherits the
/// old policy, so the walk repeats until a pass finds no new thread.
fn for_each_thread(pid: u32, mut f: impl FnMut(u32)) {
    let mut seen = Vec::new();
    loop {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let new: Vec<u32> = tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse().ok())
            .filter(|tid| !seen.contains(tid))
            .collect();
        if new.is_empty() {
            return;
        }
        for &tid in &new {
            f(tid);
        }
        seen.extend(new);
    }
}

/// This process may raise a generation's priority: `CAP_SYS_NICE` in its
/// effective set (read once).
fn may_raise() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        let may = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| effective_caps(&status))
            .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0);
        if !may {
            tracing::warn!("no CAP_SYS_NICE: standbys and upgrades start at normal priority, beside the serving generation (grant the capability to start them in the background)");
        }
        may
    })
}

/// The capability's bit number (linux/capability.h; not in `libc`).
const CAP_SYS_NICE: u32 = 23;

/// The `CapEff:` bit set of a `/proc/<pid>/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_capabilities_are_read_from_the_status_text() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000800000\n";
        assert_eq!(effective_caps(status), Some(1 << CAP_SYS_NICE));
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }
}
