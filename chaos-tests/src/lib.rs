//! Baton's chaos and benchmark support, shared by the `baton-testfs` and
//! `baton-bench` binaries and the integration tests in `tests/`.
//!
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
pub mod chaos;
pub mod fsx;
pub mod memfs;
pub mod mount_guard;
pub mod rw_workload;
pub mod s3_server;
pub mod staged;
pub mod standby;
pub mod stored;
pub mod tmpfile;
pub mod workload;
