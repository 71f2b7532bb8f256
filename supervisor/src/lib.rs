//! Baton's control side. Today: creating volumes ([`volume`]) for `fsctl
//! format` and `fsctl up`. The supervisor daemon that holds /dev/fuse and
//! restarts generations comes with the supervisor issue.
//!
//! # Invariant
//! This crate never depends on `fsclient`: it starts the `fsclient` binary
//! and talks to it through `upgrade-protocol` only.

pub mod size;
pub mod volume;
