//! `fsclient` binary: parses the command line and runs it (see the library
//! docs). Errors print as `fsclient: <chain>` and exit 2.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    baton_blocks::private_fs::set_private_umask();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        // Colour only on a terminal, never in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // On a full disk a failed log write is dropped: tracing-subscriber
        // would report it with eprintln!, which panics when stderr is that
        // same full log file, and a log must never end the process.
        .log_internal_errors(false)
        .init();
    match run() {
        Ok(code) => code,
        Err(err) => {
            // Not eprintln!, which panics when stderr cannot be written
            // (a full disk under the log file).
            let _ = writeln!(
                std::io::stderr(),
                "fsclient: {}",
                upgrade_protocol::error_chain(err.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = fsclient::cli::Cli::parse();
    Ok(fsclient::runtime::run(cli)?)
}
