//! `baton-csi`: serves the CSI Identity service plus the Node service
//! (`--node`), the Controller service (`--controller`) or both, on a unix
//! socket; with `--registration-socket` it also registers itself with
//! kubelet's plugin watcher.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use baton_csi::authority;
use tonic::transport::Server;

use baton_csi::controller::ControllerService;
use baton_csi::identity::{IdentityService, RegistrationService};
use baton_csi::node::{reap_idle, NodeService};
use baton_csi::proto::controller_server::ControllerServer;
use baton_csi::proto::identity_server::IdentityServer;
use baton_csi::proto::node_server::NodeServer;
use baton_csi::registration::registration_server::RegistrationServer;
use baton_csi::supervisor::Supervisor;

#[derive(Parser, Debug)]
#[command(
    name = "baton-csi",
    version,
    about = "Baton's CSI v1 plugin: a client of fs-supervisor"
)]
struct Args {
    /// The CSI socket to serve (a path; `unix://` is accepted).
    #[arg(long, default_value = "/csi/csi.sock")]
    endpoint: String,
    /// Serve the Node service.
    #[arg(long)]
    node: bool,
    /// Serve the Controller service.
    #[arg(long)]
    controller: bool,
    /// This node's id (NodeGetInfo); defaults to $NODE_NAME.
    #[arg(long, default_value = "")]
    node_id: String,
    /// fs-supervisor's control socket.
    #[arg(long, default_value = upgrade_protocol::client::DEFAULT_SOCKET)]
    supervisor_socket: PathBuf,
    /// Where named Baton volumes live.
    #[arg(long, default_value = "/var/lib/baton/volumes")]
    base_dir: PathBuf,
    /// Where each volume's shared mount is made (one directory per volume).
    #[arg(long, default_value = "/var/lib/baton/csi")]
    mounts_dir: PathBuf,
    /// A shared mount with no publication for this long is unmounted.
    #[arg(long, default_value_t = 300)]
    unmount_grace_s: u64,
    /// Serve kubelet's registration service here (in
    /// /var/lib/kubelet/plugins_registry) for kubelet's plugin watcher.
    #[arg(long)]
    registration_socket: Option<PathBuf>,
    /// The CSI socket's path as kubelet sees it (default: --endpoint).
    #[arg(long)]
    kubelet_endpoint: Option<String>,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            // Not eprintln!, which panics when stderr cannot be written
            // (a full disk under the log file).
            let _ = writeln!(
                std::io::stderr(),
                "baton-csi: {}",
                upgrade_protocol::error_chain(err.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

/// Listens on a unix socket at `path`. The socket is bound and listening
/// under a temporary name first and then renamed over `path` (replacing a
/// stale one), so whoever sees the file appear (kubelet's plugin watcher,
/// a sidecar) can connect at once: a plain bind makes the file visible a
/// moment before listen(2), and a connect in between is refused.
fn listen(path: &Path) -> anyhow::Result<UnixListenerStream> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("socket path {} names no file", path.display()))?;
    let staging = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    match std::fs::remove_file(&staging) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(err)
                .with_context(|| format!("removing the old socket {}", staging.display()))
        }
        _ => {}
    }
    let listener = UnixListener::bind(&staging)
        .with_context(|| format!("listening on {}", staging.display()))?;
    std::fs::rename(&staging, path).with_context(|| {
        format!(
            "moving the socket {} to {}",
            staging.display(),
            path.display()
        )
    })?;
    Ok(UnixListenerStream::new(listener))
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("signal received: stopping (mounts and publications stay)");
}

fn run() -> anyhow::Result<ExitCode> {
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
    let args = Args::parse();
    if !args.node && !args.controller {
        bail!("give --node, --controller or both: which CSI services this process serves");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let endpoint = PathBuf::from(args.endpoint.trim_start_matches("unix://"));
    let supervisor = Supervisor::new(
        args.supervisor_socket.clone(),
        args.base_dir.clone(),
        args.mounts_dir.clone(),
    );
    let node_id = match args.node_id.as_str() {
        "" => std::env::var("NODE_NAME").unwrap_or_default(),
        id => id.to_string(),
    };
    if args.node && node_id.is_empty() {
        bail!("give --node-id or set NODE_NAME (the Kubernetes node name) for the Node service");
    }
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    let identity = IdentityService {
        supervisor: supervisor.clone(),
        controller: args.controller,
    };
    let node = args.node.then(|| {
        NodeServer::new(NodeService {
            supervisor: supervisor.clone(),
            node_id: node_id.clone(),
            lock: lock.clone(),
        })
    });
    let controller = args.controller.then(|| {
        ControllerServer::new(ControllerService {
            supervisor: supervisor.clone(),
        })
    });
    if args.node {
        let grace = Duration::from_secs(args.unmount_grace_s);
        tokio::spawn(reap_idle(supervisor.clone(), lock, grace));
    }
    if let Some(path) = &args.registration_socket {
        let incoming = listen(path)?;
        let kubelet_endpoint = args
            .kubelet_endpoint
            .clone()
            .unwrap_or_else(|| endpoint.display().to_string());
        let service = RegistrationServer::new(RegistrationService {
            endpoint: kubelet_endpoint,
        });
        let path = path.clone();
        tokio::spawn(async move {
            let served = Server::builder()
                .add_service(service)
                .serve_with_incoming(authority::incoming(incoming))
                .await;
            if let Err(err) = served {
                tracing::error!(socket = %path.display(), error = %err, "registration service stopped");
            }
        });
    }
    let incoming = listen(&endpoint)?;
    tracing::info!(endpoint = %endpoint.display(), node = args.node, controller = args.controller, supervisor = %args.supervisor_socket.display(), "serving CSI");
    Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_optional_service(node)
        .add_optional_service(controller)
        .serve_with_incoming_shutdown(authority::incoming(incoming), shutdown())
        .await
        .with_context(|| format!("serving CSI on {}", endpoint.display()))
}
