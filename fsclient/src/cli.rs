//! The command line: `fsclient mount` and `fsclient serve`, their options,
//! and size parsing (`--cache-size 1G`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use baton_volume::{VolumeOptions, DEFAULT_BASE_DIR};
use upgrade_protocol::parse_size;

/// Environment variable naming the key file when `--key-file` is absent.
pub const KEY_FILE_ENV: &str = "BATON_KEY_FILE";
/// Environment variable naming the passphrase file when
/// `--passphrase-file` is absent.
pub const PASSPHRASE_FILE_ENV: &str = "BATON_PASSPHRASE_FILE";

/// Worker threads by default.
pub const DEFAULT_THREADS: usize = 4;
/// Default entry and attribute cache time of a volume only this mount
/// serves (see [`VolumeArgs::attr_ttl`]).
pub const EXCLUSIVE_ATTR_TTL: Duration = Duration::from_secs(60);
/// Default entry and attribute cache time of a volume other hosts may
/// change: what they did shows here within this long.
pub const SHARED_ATTR_TTL: Duration = Duration::from_secs(1);

/// The fsclient command line.
#[derive(Debug, Parser)]
#[command(
    name = "fsclient",
    version,
    about = "Serve a Baton volume as a POSIX filesystem over FUSE"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount VOLUME at MOUNTPOINT and serve it in the foreground until
    /// unmounted or SIGTERM/SIGINT (then flush and unmount).
    Mount {
        /// A volume name (metadata at BASE/NAME/meta.db) or a metadata URL
        /// (sqlite:///path/meta.db).
        volume: String,
        /// An existing empty directory.
        mountpoint: PathBuf,
        /// Volume options.
        #[command(flatten)]
        options: VolumeArgs,
    },
    /// Adopt an initialized FUSE connection from a supervisor and serve
    /// VOLUME on it until SIGTERM (then flush and exit 0, still mounted).
    Serve {
        /// The supervisor's SEQPACKET socket.
        #[arg(long)]
        connect: PathBuf,
        /// A volume name or a metadata URL.
        volume: String,
        /// Volume options.
        #[command(flatten)]
        options: VolumeArgs,
    },
}

/// Options shared by `mount` and `serve`.
#[derive(Debug, Args, Clone)]
pub struct VolumeArgs {
    /// Block cache directory [default: next to the metadata, `cache/`].
    /// A volume whose objects are plain files in a local directory (no
    /// compression, no encryption) has no cache unless this or
    /// `--cache-size` is given: its blocks are read in place.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Block cache capacity in bytes, or with a K/M/G/T suffix (binary)
    /// [default: 1G].
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// Write staging directory [default: next to the metadata, `staging/`].
    #[arg(long)]
    pub staging_dir: Option<PathBuf>,
    /// FUSE worker threads.
    #[arg(long, default_value_t = DEFAULT_THREADS)]
    pub threads: usize,
    /// Where named volumes live.
    #[arg(long, default_value = DEFAULT_BASE_DIR)]
    pub base_dir: PathBuf,
    /// S3 endpoint to use instead of the one the volume records.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// S3 region to use instead of the one the volume records.
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Key file of an encrypted volume [default: $BATON_KEY_FILE].
    #[arg(long, value_name = "FILE", conflicts_with = "passphrase_file")]
    pub key_file: Option<PathBuf>,
    /// Passphrase file of a volume formatted with `--passphrase-file`
    /// [default: $BATON_PASSPHRASE_FILE].
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    /// How long the kernel caches entries and attributes, in milliseconds
    /// [default: 60000 for a volume only this mount serves (SQLite), 1000
    /// for one other hosts may change (PostgreSQL)].
    #[arg(long)]
    pub attr_ttl_ms: Option<u64>,
    /// How long after its last heartbeat another mount of the volume counts
    /// as dead (its open-but-unlinked files are then reclaimed), in
    /// milliseconds; heartbeats are sent five times as often [default:
    /// $BATON_SESSION_EXPIRY_MS, else 30000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(crate::session::SESSION_EXPIRY_MS_MIN..))]
    pub session_expiry_ms: Option<u64>,
}

impl VolumeArgs {
    /// The local volume options.
    pub fn volume_options(&self) -> VolumeOptions {
        VolumeOptions {
            cache_dir: self.cache_dir.clone(),
            cache_size_bytes: self.cache_size,
            staging_dir: self.staging_dir.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            // Generations started by fs-supervisor inherit its environment.
            key_file: self
                .key_file
                .clone()
                .or_else(|| std::env::var_os(KEY_FILE_ENV).map(PathBuf::from)),
            passphrase_file: self
                .passphrase_file
                .clone()
                .or_else(|| std::env::var_os(PASSPHRASE_FILE_ENV).map(PathBuf::from)),
        }
    }

    /// The attribute cache time: the flag, else by whether other hosts
    /// may change the volume (`shared`).
    ///
    /// A volume only this mount serves changes only through this kernel,
    /// which updates or drops what it cached on each of its own requests
    /// (and asks again for size, times and blocks after writes): its cache
    /// stays right however long it is kept, and every lookup or stat it
    /// answers saves a round trip to the filesystem process. The bound
    /// limits how long a change the kernel did not see could show.
    pub fn attr_ttl(&self, shared: bool) -> Duration {
        match (self.attr_ttl_ms, shared) {
            (Some(ms), _) => Duration::from_millis(ms),
            (None, true) => SHARED_ATTR_TTL,
            (None, false) => EXCLUSIVE_ATTR_TTL,
        }
    }

    /// The session expiry: the flag, else the environment, else the
    /// default; at least [`crate::session::SESSION_EXPIRY_MS_MIN`].
    pub fn session_expiry(&self) -> Duration {
        use crate::session::{
            SESSION_EXPIRY_ENV, SESSION_EXPIRY_MS_DEFAULT, SESSION_EXPIRY_MS_MIN,
        };
        let ms = self.session_expiry_ms.unwrap_or_else(|| {
            std::env::var(SESSION_EXPIRY_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(SESSION_EXPIRY_MS_DEFAULT)
        });
        Duration::from_millis(ms.max(SESSION_EXPIRY_MS_MIN))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mount_defaults_match_the_brief() {
        let cli = Cli::try_parse_from(["fsclient", "mount", "vol", "/mnt"]).unwrap();
        let Command::Mount { options, .. } = cli.command else {
            panic!("mount expected");
        };
        assert_eq!(options.cache_size, None, "cache as the store needs it");
        assert_eq!(options.threads, DEFAULT_THREADS);
        assert_eq!(options.base_dir, PathBuf::from(DEFAULT_BASE_DIR));
        assert_eq!(options.attr_ttl(false), EXCLUSIVE_ATTR_TTL);
        assert_eq!(options.attr_ttl(true), SHARED_ATTR_TTL);
        assert!(
            Cli::try_parse_from(["fsclient", "mount", "v", "/m", "--session-expiry-ms", "5"])
                .is_err()
        );
    }
}
