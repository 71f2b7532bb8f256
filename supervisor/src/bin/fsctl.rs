//! `fsctl`: Baton's control command.
//!
//! Exit codes: 0 success, 1 the operation failed (the message says why and
//! what to do), 2 bad usage.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use supervisor::size::parse_size;
use supervisor::volume::{
    format, FormatRequest, VolumePaths, DEFAULT_BASE_DIR, DEFAULT_BLOCK_SIZE_BYTES,
};

#[derive(Parser)]
#[command(name = "fsctl", about = "Control Baton volumes and mounts")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume (metadata and data store).
    Format {
        /// Volume name.
        name: String,
        /// Metadata URL (default sqlite:///BASE/NAME/meta.db).
        #[arg(long)]
        meta: Option<String>,
        /// Storage URL (default file:///BASE/NAME/data).
        #[arg(long)]
        storage: Option<String>,
        /// Block size, e.g. 4M.
        #[arg(long, default_value = "4M", value_parser = parse_block_size)]
        block_size: u32,
        /// Base directory for defaults.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
    },
    /// Mount volume NAME at MOUNTPOINT, formatting it first if it does not
    /// exist (the main job on the embedded default). Runs in the foreground.
    Up {
        /// Volume name.
        #[arg(default_value = "default")]
        name: String,
        /// Where to mount.
        #[arg(default_value = "/mnt/baton")]
        mountpoint: PathBuf,
        /// Base directory for volumes.
        #[arg(long, default_value = DEFAULT_BASE_DIR)]
        base_dir: PathBuf,
    },
}

fn parse_block_size(text: &str) -> Result<u32, String> {
    let bytes = parse_size(text)?;
    u32::try_from(bytes).map_err(|_| format!("block size {text} is too large"))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fsctl: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Format {
            name,
            meta,
            storage,
            block_size,
            base_dir,
        } => {
            let formatted = format(&FormatRequest {
                name: name.clone(),
                base_dir,
                meta_url: meta,
                storage_url: storage,
                block_size_bytes: block_size,
            })?;
            println!(
                "formatted volume {name}: metadata {}, data {}",
                formatted.meta_url, formatted.storage_url
            );
            println!(
                "mount it with: fsclient mount {} MOUNTPOINT",
                formatted.meta_url
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Up {
            name,
            mountpoint,
            base_dir,
        } => up(&name, &mountpoint, base_dir),
    }
}

fn up(name: &str, mountpoint: &std::path::Path, base_dir: PathBuf) -> anyhow::Result<ExitCode> {
    let paths = VolumePaths::new(&base_dir, name)?;
    if !paths.dir.join("meta.db").exists() {
        let request = FormatRequest {
            name: name.to_string(),
            base_dir: base_dir.clone(),
            meta_url: None,
            storage_url: None,
            block_size_bytes: DEFAULT_BLOCK_SIZE_BYTES,
        };
        let formatted = format(&request)?;
        println!("formatted volume {name} ({})", formatted.meta_url);
    }
    std::fs::create_dir_all(mountpoint)
        .with_context(|| format!("creating mountpoint {}", mountpoint.display()))?;
    let fsclient = std::env::current_exe()?.with_file_name("fsclient");
    println!(
        "mounting volume {name} at {} (Ctrl-C or `umount {}` to stop)",
        mountpoint.display(),
        mountpoint.display()
    );
    let err = std::process::Command::new(&fsclient)
        .arg("mount")
        .arg(&paths.meta_url)
        .arg(mountpoint)
        .arg("--base-dir")
        .arg(&base_dir)
        .exec();
    Err(err).with_context(|| {
        format!(
            "starting {}; build it with `cargo build --release`",
            fsclient.display()
        )
    })
}
