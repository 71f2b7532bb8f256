//! Baton's chaos and benchmark support, shared by the `baton-testfs` and
//! `baton-bench` binaries and the integration tests in `tests/`.
//!
//! - [`browser`]: headless Chromium over the DevTools protocol (a pipe),
//!   for tests that check a page's layout.
//! - [`kube`]: a real one-node Kubernetes cluster (etcd, kube-apiserver,
//!   kubelet, containerd) running deploy/kubernetes, for the CSI driver's
//!   tier-2 test and `baton-bench kube`.
//! - [`memfs`]: an in-memory test filesystem for exercising fuse-wire.
//! - [`mount_guard`]: unmount-on-every-path guards and deadlines for tests
//!   and benches that mount real FUSE filesystems.
//! - [`rw_workload`]: a verifying read/write/readdir workload for any
//!   mount (run as `baton-testfs rw-workload`), for kill and OOM tests.
//! - [`chaos`]: the `baton-chaos` fault-injection suite (scenarios,
//!   faults, workload processes, verdict).
//! - [`s3_server`]: a real S3-compatible server (moto) for tests and benches.
//! - [`staged`] and [`stored`]: a volume's staging area and local object
//!   store, as tests look at them from outside.
//! - [`standby`]: whether a mount's standby generation is ready, from
//!   outside the supervisor.
//! - [`tmpfile`]: publication through O_TMPFILE and `linkat` (run as
//!   `baton-testfs tmpfile-publish` by kill tests).

pub mod bench;
pub mod browser;
pub mod chaos;
pub mod fsx;
pub mod kube;
pub mod memfs;
pub mod mount_guard;
pub mod rw_workload;
pub mod s3_server;
pub mod staged;
pub mod standby;
pub mod stored;
pub mod tmpfile;
pub mod workload;

/// A python3 program that runs a plan of POSIX lock requests between
/// processes, for tests comparing a mount with the local disk.
///
/// Arguments: `FILE N PLAN DEADLINE_S [CONTROL_DIR]`; FILE may be a comma
/// separated list (one file seen through several mounts): process i opens
/// the (i mod count)th. N forked processes
/// each hold byte i of FILE (F_SETLK), then the steps of PLAN (comma
/// separated) run in order: `i>j` is process i asking for byte j with
/// F_SETLKW (the next step waits until it sleeps in the kernel, then
/// 200 ms); `wMS` watches MS ms for answers (one seen there is reported
/// `early-...`); `rI` has process I close its file; `p` creates
/// `CONTROL_DIR/paused` and goes on once `CONTROL_DIR/resume` exists. Each
/// requester reports `granted`, `EDEADLK` or `timeout` (SIGALRM after
/// DEADLINE_S interrupts its wait) and closes its file. Prints `i:word`
/// for each requester, ascending, on one line.
pub const LOCK_PLAN: &str = include_str!("lock_plan.py");

/// A python3 program that writes a file and closes it later, to compare
/// the times a mount shows with the local disk's.
///
/// Arguments: `FILE SIZE_BYTES SLEEP_S [CONTROL_DIR [write-back]]`.
/// Creates (truncates) FILE, writes SIZE_BYTES in one `write(2)` (with
/// `write-back`, then writes its pages back with `sync_file_range`, which
/// leaves the inode's times dirty), creates `CONTROL_DIR/written`
/// and waits for `CONTROL_DIR/resume` if given, sleeps SLEEP_S, `fstat`s,
/// closes and `stat`s. Prints one line of `key=ns` pairs: `write_from`,
/// `write_to` (the clock around the write), `close` (just before it),
/// `open_mtime`, `open_ctime` (the fstat before the close), `mtime`,
/// `ctime` (the stat after it).
pub const WRITE_TIMES: &str = include_str!("write_times.py");
