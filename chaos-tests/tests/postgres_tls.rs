//! TLS to PostgreSQL on a real server started by this test with `ssl=on`
//! and a certificate from a throwaway CA made with openssl; its pg_hba.conf
//! accepts TCP connections only over TLS (`hostssl`), so a success proves
//! the connection was encrypted. `fsctl format` and `fsctl fsck` connect
//! with `sslmode=verify-full` and the right CA (success), with another CA
//! (a quick, clear certificate error), with `sslmode=require` and no CA
//! (encrypted, unauthenticated: success) and without TLS (refused, with a
//! hint to add sslmode).
//!
//! Needs the PostgreSQL server binaries (`.ci/run` installs them) and
//! root; skips loudly without them unless `BATON_REQUIRE_POSTGRES=1`.

#![allow(clippy::unwrap_used)] // Test code: a failed setup step should stop the test.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use chaos_tests::mount_guard::workspace_binary;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn server_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// A PostgreSQL server accepting TCP only over TLS; stopped when dropped.
struct TlsServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl TlsServer {
    fn start(bin: PathBuf) -> TlsServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir.path();
        make_ca(d, "ca", "baton-test-ca");
        make_ca(d, "wrong-ca", "some-other-ca");
        let ext = d.join("server.ext");
        std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
        run(Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-subj", "/CN=localhost", "-keyout"])
            .arg(d.join("server.key"))
            .arg("-out")
            .arg(d.join("server.csr")));
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(d.join("server.csr"))
            .arg("-CA")
            .arg(d.join("ca.crt"))
            .arg("-CAkey")
            .arg(d.join("ca.key"))
            .arg("-CAcreateserial")
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(d.join("server.crt")));

        let data = d.join("data");
        std::fs::create_dir(&data).unwrap();
        run(Command::new("chown").arg("postgres").arg(&data));
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"]));
        for f in ["server.crt", "server.key"] {
            std::fs::copy(d.join(f), data.join(f)).unwrap();
            run(Command::new("chown").arg("postgres").arg(data.join(f)));
        }
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c ssl=on \
             -c ssl_cert_file=server.crt -c ssl_key_file=server.key",
            data.display()
        );
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(data.join("server.log"))
            .args(["-w", "-o", &options, "start"]));
        let server = TlsServer { dir, bin, port };
        // Databases are made over the Unix socket (`local ... trust`).
        for db in ["vol_full", "vol_require"] {
            run(Command::new("psql")
                .arg("-h")
                .arg(&data)
                .args(["-p", &port.to_string(), "-U", "postgres", "-q", "-c"])
                .arg(format!("CREATE DATABASE {db}")));
        }
        server
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn url(&self, db: &str, query: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}{query}", self.port)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

fn make_ca(dir: &Path, name: &str, cn: &str) {
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt"))));
}

fn fsctl(args: &[&str]) -> Output {
    Command::new(workspace_binary("fsctl"))
        .args(args)
        .output()
        .expect("run fsctl (build the workspace first)")
}

fn format(server: &TlsServer, url: &str) -> Output {
    let base = server.path("base");
    let storage = format!("file://{}", server.path("data-objects").display());
    fsctl(&[
        "format",
        "vol",
        "--meta",
        url,
        "--storage",
        &storage,
        "--base-dir",
        base.to_str().unwrap(),
    ])
}

#[test]
fn verify_full_connects_with_the_right_ca_and_fails_clearly_with_another() {
    let Some(bin) = server_bin() else {
        let required = std::env::var("BATON_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "PostgreSQL server binaries are missing but BATON_REQUIRE_POSTGRES=1"
        );
        eprintln!("\n!!!!! SKIPPED postgres TLS: no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql) !!!!!\n");
        return;
    };
    let server = TlsServer::start(bin);
    let ca = server.path("ca.crt");
    let wrong = server.path("wrong-ca.crt");
    let full = |db: &str, ca: &Path| {
        server.url(
            db,
            &format!("?sslmode=verify-full&sslrootcert={}", ca.display()),
        )
    };

    // Another CA: refused before anything is written, quickly, saying why.
    let started = Instant::now();
    let out = format(&server, &full("vol_full", &wrong));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a server certificate from another CA was accepted"
    );
    assert!(said.contains("certificate"), "{said}");
    assert!(
        said.contains("sslrootcert"),
        "the error says what to check: {said}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // The right CA: format, then open again (fsck) over verify-full.
    let out = format(&server, &full("vol_full", &ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = fsctl(&["fsck", &full("vol_full", &ca)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without TLS the server refuses (hostssl only), with a hint.
    let out = fsctl(&["fsck", &server.url("vol_full", "")]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a plain connection was accepted");
    assert!(said.contains("sslmode=require"), "{said}");

    // sslmode=require: encrypted without checking the certificate.
    let out = format(&server, &server.url("vol_require", "?sslmode=require"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
