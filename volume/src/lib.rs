//! Everything about a Baton volume, in one place: what a volume string
//! names and where its files are ([`VolumePaths`], over the pure
//! [`upgrade_protocol::VolumeSpec`]), creating one ([`format`]), opening
//! one with every check a mount needs ([`Volume::open`]), and checking its
//! block map against its storage ([`CheckedVolume`]: `fsctl fsck`/`gc`),
//! and its directory quotas ([`QuotaVolume`]: `fsctl quota`).
//!
//! Its users are the filesystem (`fsclient`) and the admin command
//! (`fsctl`). The fd holder (`fs-supervisor`) never links it: it only
//! parses volume strings, through `upgrade_protocol::VolumeSpec`.
//!
//! # Invariants
//! - A failed check changes nothing in the volume: every read-only check
//!   passes before the lock is taken and the first file is written.
//! - One mount of a volume per host: the volume lock
//!   ([`VolumePaths::lock_path`]) is held for the serving process's life.
//!
//! # Example
//! ```no_run
//! # fn demo() -> Result<(), baton_volume::VolumeError> {
//! use std::path::Path;
//! use baton_volume::{LockMode, Volume, VolumeOptions, VolumePaths};
//! let paths = VolumePaths::resolve("vol", Path::new("/var/lib/baton"))?;
//! let volume = Volume::open(&paths, &VolumeOptions::default(), LockMode::Exclusive)?;
//! println!("{} has {}-byte blocks", volume.name, volume.block_size_bytes);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod check;
mod error;
mod format;
mod lock;
mod open;
mod paths;
mod quota;

/// Owner-only files and directories, and the umask that makes them.
pub use baton_blocks::private_fs;
pub use baton_meta::{Quota, QuotaDrift, QuotaUsage};
pub use check::{
    collectable, BadBlock, CheckProgress, CheckReport, CheckedVolume, GC_MIN_AGE_SECS_DEFAULT,
    REPORT_PROBLEMS_LISTED_MAX, SCAN_PAGE_ROWS_MAX,
};
pub use error::VolumeError;
pub use format::{format, FormatRequest, Formatted, DEFAULT_BLOCK_SIZE_BYTES};
pub use lock::LockMode;
pub use open::{Volume, VolumeOptions, DEFAULT_CACHE_SIZE_BYTES};
pub use paths::{VolumePaths, DEFAULT_BASE_DIR};
pub use quota::{QuotaEntry, QuotaVolume};
