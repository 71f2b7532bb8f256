//! etcd and kube-apiserver for the test, on 127.0.0.1 with free ports in
//! one temp dir: a CA and the server's certificate, the service account
//! signing key (openssl), a static admin token, an audit log of every
//! request (Metadata level). Both processes are killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{json, Value};

pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

pub fn run(command: &mut Command) {
    let out = command.output().expect("spawn");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd and kube-apiserver, with the credentials the test uses.
pub struct Cluster {
    dir: PathBuf,
    url: String,
    pub admin_token: String,
    // Dropped in this order: the API server, then etcd.
    _apiserver: Process,
    _etcd: Process,
}

impl Cluster {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The API server's secure port on 127.0.0.1 (csi/tests/kube_cluster,
    /// which includes this file, gives it to the pods as the in-cluster
    /// API address).
    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("the API server's URL ends with its port")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    pub fn logs(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "--- kube-apiserver.log ---\n{}\n--- etcd.log ---\n{}",
            tail("kube-apiserver.log"),
            tail("etcd.log")
        )
    }

    /// A kubeconfig for `token` at `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url,
                "certificate-authority": s(&self.ca()),
            }}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        });
        std::fs::write(path, serde_json::to_string_pretty(&config).unwrap()).expect("kubeconfig");
    }

    pub async fn client(&self, kubeconfig: &Path) -> Client {
        // kube's provider (see Cargo.toml); a second install is refused,
        // harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(kubeconfig).expect("read kubeconfig"),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig");
        Client::try_from(config).expect("kube client")
    }
}

/// Certificates (a CA, the server's for 127.0.0.1) and the service
/// account signing key, made with openssl in `dir`.
pub fn make_credentials(dir: &Path) {
    let p = |name: &str| dir.join(name);
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=baton-test-ca"])
        .args(["-keyout", s(&p("ca.key")), "-out", s(&p("ca.crt"))]));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
        ])
        .args(["-keyout", s(&p("server.key")), "-out", s(&p("server.csr"))]));
    std::fs::write(
        p("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in", s(&p("server.csr"))])
        .args([
            "-CA",
            s(&p("ca.crt")),
            "-CAkey",
            s(&p("ca.key")),
            "-CAcreateserial",
        ])
        .args(["-extfile", s(&p("server.ext")), "-out", s(&p("server.crt"))]));
    run(Command::new("openssl").args(["genrsa", "-out", s(&p("sa.key")), "2048"]));
    run(Command::new("openssl").args([
        "rsa",
        "-in",
        s(&p("sa.key")),
        "-pubout",
        "-out",
        s(&p("sa.pub")),
    ]));
}

pub fn start_cluster(dir: &Path, apiserver: &Path, etcd: &Path) -> Cluster {
    make_credentials(dir);
    let log = |name: &str| std::fs::File::create(dir.join(name)).expect("log file");

    let (client_port, peer_port) = (free_port(), free_port());
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd = Process(
        Command::new(etcd)
            .args(["--name", "baton-test", "--data-dir", s(&dir.join("etcd"))])
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("baton-test={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log("etcd.log"))
            .stderr(log("etcd.log"))
            .spawn()
            .expect("spawn etcd"),
    );

    let admin_token = format!("admin-{}-{}", std::process::id(), client_port);
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{admin_token},baton-test-admin,baton-test-admin,\"system:masters\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n",
    )
    .unwrap();
    let port = free_port();
    let p = |name: &str| s(&dir.join(name)).to_string();
    let issuer = "https://kubernetes.default.svc.cluster.local";
    let apiserver = Process(
        Command::new(apiserver)
            .arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg("--insecure-port=0")
            .arg(format!("--cert-dir={}", p("certs")))
            .arg(format!("--tls-cert-file={}", p("server.crt")))
            .arg(format!("--tls-private-key-file={}", p("server.key")))
            .arg(format!("--token-auth-file={}", p("tokens.csv")))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg(format!("--service-account-issuer={issuer}"))
            .arg(format!("--api-audiences={issuer}"))
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg("--allow-privileged=true")
            .arg(format!("--audit-policy-file={}", p("audit-policy.yaml")))
            .arg(format!("--audit-log-path={}", p("audit.log")))
            .arg("--audit-log-mode=blocking")
            .arg("--profiling=false")
            .arg("--v=1")
            .stdin(Stdio::null())
            .stdout(log("kube-apiserver.log"))
            .stderr(log("kube-apiserver.log"))
            .spawn()
            .expect("spawn kube-apiserver"),
    );
    Cluster {
        dir: dir.to_path_buf(),
        url: format!("https://127.0.0.1:{port}"),
        admin_token,
        _apiserver: apiserver,
        _etcd: etcd,
    }
}

/// The audit log's requests by `user` on pods: (verb, requestURI).
pub fn pod_requests_of(audit_log: &Path, user: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(audit_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["user"]["username"] == user && e["objectRef"]["resource"] == "pods")
        // Once per request, as it arrives: a 1.20 watch logs its next
        // stage (ResponseStarted) only with its first event.
        .filter(|e| e["stage"] == "RequestReceived")
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                e["requestURI"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}
