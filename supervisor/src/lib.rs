//! `fs-supervisor`, Baton's fd holder: the daemon that opens /dev/fuse,
//! mounts, answers FUSE_INIT once, holds the fd for the mount's whole life
//! and hands it to successive `fsclient serve` generations, restarting them
//! when they die. It links no storage stack: its clients (`fsctl`, the
//! CSI plugin) talk to it over its control socket.
//!
//! # Brief overview
//! - [`lifecycle::mount`]: the pure per-mount state machine.
//! - [`daemon`]: the single event loop; [`executor`]: the only code acting
//!   on the machine's actions; [`mounting`]: mount(2) + INIT, validation,
//!   the unmount helper.
//! - [`generation`]: starting a generation process (in its cgroup, with a
//!   pidfd) and classifying its death; [`scheduling`]: standbys start in
//!   the background (`SCHED_IDLE`) and serve at normal priority.
//! - [`cgroup`]: memory cgroups per generation (v1 or v2), OOM counts.
//! - [`control`]: the fsctl ↔ supervisor socket (SO_PEERCRED check) and the
//!   client side.
//! - [`preflight`]: refusing kernels whose FUSE request timeouts would abort
//!   a mount during a handover.
//! - [`state_file`]: the per-mount JSON record in the state directory;
//!   [`daemon::restore`]: mounts restored from it at start;
//!   [`state_lock`]: one supervisor per state directory.
//! - [`systemd`]: sd_notify, the watchdog and the fd store (FDSTORE).
//! - [`metrics`]: Prometheus `/metrics`, a status page, `/healthz`, `/readyz`;
//!   [`mount_tally`]: per-mount counters summed across generations;
//!   [`mount_events`]: crash/OOM/recovery/upgrade events from status diffs;
//!   `kubernetes` (feature): Events, status ConfigMap, node-scoped pod watch.
//! - [`reexec`]: `fsctl upgrade-supervisor` (re-execute in place).
//!
//! # Invariants
//! This crate depends only on `fuse-wire` and `upgrade-protocol` (and, with
//! the `kubernetes` feature, kube): it starts the `fsclient` binary and
//! talks to it through `upgrade-protocol` only, and reads a volume string
//! only through `upgrade_protocol::VolumeSpec`. RESEND is requested only
//! when no other generation that held the fd is alive. The supervisor never
//! aborts a connection because of a timeout while it lives.

pub mod cgroup;
pub mod control;
pub mod daemon;
pub mod error;
pub mod executor;
pub mod generation;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod lifecycle;
pub mod metrics;
pub mod mount_events;
pub mod mount_tally;
pub mod mounting;
pub mod preflight;
pub mod reexec;
pub mod scheduling;
pub mod state_file;
pub mod state_lock;
pub mod systemd;

pub use error::Error;
