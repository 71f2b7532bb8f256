//! `baton-chaos`: the fault-injection suite. Each scenario starts its own
//! fs-supervisor, mounts a fresh volume, runs concurrent seeded workloads in
//! child processes (large-file readers, model loaders, fsyncing writers,
//! metadata churn against a model, mmap), injects faults on a seeded
//! schedule (kill -9, OOM kill, named fault points, storage faults, a full
//! staging disk) and verifies: no failed syscalls except the ones the fault
//! must produce, no lost or corrupt bytes, final trees equal to their
//! models.
//!
//! - [`scenario`]: profiles, scenarios, faults and their seeded schedules.
//! - [`runner`]: runs one scenario; [`faults`]: injects one fault.
//! - [`worker`]: the workload processes; [`stats`]: what they report.
//! - [`report`]: the verdict, the table and the JSON.
//! - [`supervisor`]: the per-scenario fs-supervisor and its cleanup.
//! - [`rng`]: seeded randomness and the known content of large files.

pub mod faults;
pub mod report;
pub mod rng;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod supervisor;
pub mod worker;
