//! The control contract between `fsctl` and `fs-supervisor`: one closed
//! enum of commands ([`Request`]), their answers ([`Reply`]), the status
//! report `fsctl status --json` prints ([`StatusReport`]), and the per-mount
//! state record the supervisor keeps in its state directory ([`MountRecord`]).
//!
//! Requests and replies travel in the same frame as every other
//! [`crate::Message`] (`Message::Control` / `Message::ControlReply`), one per
//! SEQPACKET packet, without fds. The state record is a JSON document of its
//! own with a `format_version` (1), encoded and decoded by
//! [`encode_record`] / [`decode_record`] (pure: the caller does the IO).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{GenerationCounters, Incident, MountCounters, NegotiatedInit, ProtocolError};

/// The state record format this binary writes and the highest it reads.
pub const RECORD_FORMAT_VERSION: u32 = 1;

/// Options `fsctl mount` forwards to every `fsclient serve` of the mount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientOptions {
    /// `--cache-dir` (default: next to the metadata).
    pub cache_dir: Option<PathBuf>,
    /// `--staging-dir` (default: next to the metadata).
    pub staging_dir: Option<PathBuf>,
    /// `--threads` (default: fsclient's).
    pub threads: Option<u32>,
    /// `--cache-size` in bytes (default: fsclient's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_size_bytes: Option<u64>,
}

/// fsctl → supervisor: every command there is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// Mount `volume` at `mountpoint` and keep it served.
    Mount {
        /// A volume name under `base_dir`, or `sqlite:///path/meta.db`.
        volume: String,
        /// An existing empty directory (absolute).
        mountpoint: PathBuf,
        /// Where named volumes live.
        base_dir: PathBuf,
        /// Forwarded to every generation.
        options: ClientOptions,
        /// Mount it again when the supervisor starts after a reboot
        /// (omitted when false, so older peers read the same bytes).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        persist: bool,
    },
    /// Report every mount.
    Status,
    /// Stop serving and unmount `mountpoint`.
    Umount {
        /// The mountpoint as given to `Mount` (absolute).
        mountpoint: PathBuf,
    },
    /// Replace fs-supervisor itself by `binary`: it re-executes in place
    /// (same pid, so generations stay its children) with every mount's fd
    /// passed as systemd-style LISTEN_FDS, and restores the mounts from its
    /// state directory.
    UpgradeSupervisor {
        /// The new fs-supervisor binary (absolute).
        binary: PathBuf,
    },
    /// Replace the generation serving `mountpoint` by one running `binary`
    /// (planned handover); roll back if it fails within `timeout_ms`.
    Upgrade {
        /// The mountpoint (absolute).
        mountpoint: PathBuf,
        /// The new fsclient binary (absolute).
        binary: PathBuf,
        /// The whole upgrade's deadline.
        timeout_ms: u64,
    },
}

impl Request {
    /// The command name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Mount { .. } => "mount",
            Request::Status => "status",
            Request::Umount { .. } => "umount",
            Request::Upgrade { .. } => "upgrade",
            Request::UpgradeSupervisor { .. } => "upgrade_supervisor",
        }
    }
}

/// Why a request failed, so fsctl can pick its exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is wrong as given (bad mountpoint, unknown mount, ...).
    Invalid,
    /// The peer is not allowed to control the supervisor.
    PermissionDenied,
    /// The operation was attempted and failed.
    Failed,
}

/// supervisor → fsctl: the answer to one [`Request`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The mount is up and its first generation serves.
    Mounted {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// The serving generation.
        generation: u64,
        /// Its process id.
        pid: u32,
    },
    /// Every mount of this supervisor.
    Status {
        /// The report.
        report: StatusReport,
    },
    /// The mount is gone and its fd closed.
    Unmounted {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// What the last generation could not finish before it ended (its
        /// final flush failed: acknowledged data is still staged), as it
        /// logged it; absent when it ended cleanly.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warning: Option<String>,
    },
    /// fs-supervisor re-executes as `binary` now; poll `Status` for it.
    SupervisorRestarting {
        /// Its pid (the same after the re-exec).
        pid: u32,
        /// The binary it becomes.
        binary: PathBuf,
        /// Mounts it hands to itself.
        mounts: u32,
    },
    /// An upgrade ended (successfully or rolled back: see `report.ok`).
    Upgraded {
        /// What happened.
        report: Box<UpgradeReport>,
    },
    /// The request failed; `message` names the object and the next step.
    Error {
        /// What kind of failure.
        kind: ErrorKind,
        /// The message for the user.
        message: String,
    },
}

/// One planned upgrade of one mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeReport {
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// True if the new generation serves; false if it was rolled back.
    pub ok: bool,
    /// `upgraded`, or why it was rolled back.
    pub outcome: String,
    /// The generation before.
    pub from_generation: u64,
    /// The generation serving after (the new one, or the old one again);
    /// with `serving_died`, the one that died.
    pub generation: u64,
    /// The serving generation died during the upgrade: no generation of
    /// this upgrade serves; crash recovery picks the next one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serving_died: bool,
    /// The binary serving after.
    pub binary: PathBuf,
    /// Requests the old generation journaled for the new one.
    pub journaled: u32,
    /// Application-visible gap: the old generation stopped reading until
    /// the new one started reading (µs; only when upgraded).
    pub stall_us: Option<u64>,
    /// Whole upgrade, request to probe answered (ms).
    pub elapsed_ms: u64,
    /// When it ended (Unix time, ms).
    pub at_unix_ms: u64,
    /// Details of a rollback (the new generation's log tail, the refusal).
    pub detail: Option<String>,
}

/// `fsctl status --json`: every mount of one supervisor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// One entry per mount, in mount order.
    pub mounts: Vec<MountStatus>,
    /// The supervisor answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<SupervisorInfo>,
}

/// Which fs-supervisor answered a status request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorInfo {
    /// Its pid (unchanged by `fsctl upgrade-supervisor`, which re-executes).
    pub pid: u32,
    /// The executable running.
    pub binary: PathBuf,
    /// Its version.
    pub version: String,
    /// When this executable started (Unix time, ms).
    pub started_unix_ms: u64,
    /// It runs under systemd and keeps each mount's fd in the fd store, so
    /// a mount outlives the supervisor and its generation dying together.
    /// Without it a generation alone keeps a copy while the supervisor is
    /// down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fd_store: bool,
    /// What its start did to mounts it could not restore as they were,
    /// one line each (e.g. a dead mount detached and mounted again, or
    /// dropped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_notes: Vec<String>,
}

/// Generation deaths by cause (each one caused a restart or a takeover).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    /// Exited by itself (any exit code, including 0) or could not start.
    pub exit: u64,
    /// Killed by a signal (other than an OOM kill).
    pub signal: u64,
    /// Killed by the kernel OOM killer in its memory cgroup.
    pub oom: u64,
}

/// The last time a generation died and another took over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// The generation that died.
    pub died_generation: u64,
    /// Why: `exit 3`, `signal 9 (SIGKILL)`, `oom`.
    pub cause: String,
    /// When the supervisor saw the death (Unix time, ms).
    pub at_unix_ms: u64,
    /// The generation that took over, once one serves.
    pub next_generation: Option<u64>,
    /// From seeing the death to the next generation reporting it serves, µs.
    pub takeover_us: Option<u64>,
    /// Whether a warm standby took over (false: a cold start).
    pub warm: bool,
}

/// One mount in the status report.
///
/// There is no count of requests recovered by RESEND: the generation that
/// answers them does not report it to the supervisor (protocol version 1).
/// `last_recovery.takeover_us` is what the supervisor measures itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountStatus {
    /// The supervisor's id of the mount (state file, cgroup and socket names).
    pub mount_id: String,
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// The volume as given to `fsctl mount`.
    pub volume: String,
    /// The lifecycle state (`launching`, `adopting`, `serving`, ...).
    pub state: String,
    /// `fsctl mount --persist`: mounted again after a reboot; `/readyz`
    /// waits for every persistent mount to serve.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistent: bool,
    /// The generation that serves (or last served / is starting).
    pub generation: u64,
    /// Its process id, if one is alive.
    pub pid: Option<u32>,
    /// The warm standby's process id, if one is alive.
    pub standby_pid: Option<u32>,
    /// Deaths by cause.
    pub restarts: Restarts,
    /// Seconds since the mount was made.
    pub uptime_s: u64,
    /// Seconds the current generation has served.
    pub generation_uptime_s: u64,
    /// Consecutive failed starts (reset once a generation serves stably).
    pub consecutive_failures: u32,
    /// True once `--give-up-after` was reached: no more restarts.
    pub gave_up: bool,
    /// Set when the serving generation found the volume's metadata corrupt:
    /// it refuses every change (EROFS) and serves reads; why, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_reason: Option<String>,
    /// The last death and takeover.
    pub last_recovery: Option<Recovery>,
    /// The last planned upgrade (or rollback).
    #[serde(default)]
    pub last_upgrade: Option<UpgradeReport>,
    /// The fsclient binary new generations run.
    #[serde(default)]
    pub client_binary: PathBuf,
    /// Resent requests answered from an exactly-once record (committed by
    /// a generation that died before replying), over the mount's life.
    #[serde(default)]
    pub requests_recovered: u64,
    /// The fusectl connection number (`/sys/fs/fuse/connections/N`).
    pub connection_id: u32,
    /// Request, byte, cache and upgrade counters over the mount's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<MountCounters>,
    /// The last deaths and rollbacks, oldest first (at most
    /// `INCIDENTS_MAX` of the supervisor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<Incident>,
    /// The memory cgroup of the serving generation, if cgroups are in use.
    pub cgroup: Option<PathBuf>,
    /// The INIT result every generation adopts.
    pub init: NegotiatedInit,
}

/// The supervisor's durable record of one mount (`STATE_DIR/mounts/ID.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRecord {
    /// [`RECORD_FORMAT_VERSION`].
    pub format_version: u32,
    /// The supervisor's id of the mount.
    pub mount_id: String,
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// The volume as given.
    pub volume: String,
    /// Where named volumes live.
    pub base_dir: PathBuf,
    /// Forwarded to every generation.
    pub options: ClientOptions,
    /// The fusectl connection number.
    pub connection_id: u32,
    /// The random identity of the connection (see `Message::Adopt`).
    #[serde(default, rename = "connection")]
    pub connection_identity: u64,
    /// The fsclient binary its generations run (changed by upgrades).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_binary: Option<PathBuf>,
    /// The INIT result.
    pub init: NegotiatedInit,
    /// Whether FUSE_HAS_RESEND was granted (also in `init.flags`; spelled
    /// out because recovery depends on it being harmless either way).
    pub has_resend: bool,
    /// The supervisor holding the fd.
    pub supervisor_pid: u32,
    /// The generation serving when the record was written.
    pub generation: u64,
    /// Its process id.
    pub pid: Option<u32>,
    /// When the mount was made (Unix time, ms).
    pub created_unix_ms: u64,
    /// `fsctl mount --persist`: mounted again at start after a reboot;
    /// without it a record with no live mount is removed at start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistent: bool,
    /// What the mount has seen so far, so a restarted or re-executed
    /// supervisor carries its totals on (absent in records of older
    /// supervisors: their totals start again at zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Box<MountHistory>>,
}

/// A mount's totals over its life as its state record keeps them: the
/// supervisor's tally of generation reports (kept per recent generation, so
/// a generation that outlives its supervisor and reports again replaces its
/// own entry instead of being counted twice), restarts, incidents and the
/// last recovery and upgrade. Written with the record, at most a few seconds
/// behind the live figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountHistory {
    /// Sum of the last reports of generations older than `recent`.
    pub counters_before: GenerationCounters,
    /// Their recovered requests.
    pub recovered_before: u64,
    /// The latest report of each recent generation.
    pub recent: Vec<GenerationReport>,
    /// Generation processes started.
    pub generations_started: u64,
    /// Planned upgrades that succeeded.
    pub upgrades: u64,
    /// Planned upgrades rolled back.
    pub rollbacks: u64,
    /// Requests handed over in upgrade journals.
    pub requests_journaled: u64,
    /// Generation deaths by cause.
    pub restarts: Restarts,
    /// Recent incidents, oldest first.
    pub incidents: Vec<Incident>,
    /// The last takeover after a death.
    pub last_recovery: Option<Recovery>,
    /// The last planned upgrade.
    pub last_upgrade: Option<UpgradeReport>,
}

/// One generation's latest `Stats` report, as kept in [`MountHistory`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationReport {
    /// The generation.
    pub generation: u64,
    /// Requests it answered from exactly-once records.
    pub requests_recovered: u64,
    /// Its counters since it started.
    pub counters: GenerationCounters,
}

/// Serializes a state record (pretty JSON). Pure.
pub fn encode_record(record: &MountRecord) -> Result<Vec<u8>, ProtocolError> {
    Ok(serde_json::to_vec_pretty(record)?)
}

/// Parses a state record, refusing a newer format. Pure.
pub fn decode_record(bytes: &[u8]) -> Result<MountRecord, ProtocolError> {
    #[derive(Deserialize)]
    struct Version {
        format_version: u32,
    }
    let version: Version = serde_json::from_slice(bytes)?;
    if version.format_version > RECORD_FORMAT_VERSION {
        return Err(ProtocolError::UnsupportedVersion {
            found: u16::try_from(version.format_version).unwrap_or(u16::MAX),
            supported: RECORD_FORMAT_VERSION as u16,
        });
    }
    Ok(serde_json::from_slice(bytes)?)
}
