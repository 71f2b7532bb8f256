//! TLS to the PostgreSQL server, chosen by the URL's libpq-style options:
//!
//! | `sslmode=`        | encryption | server certificate checked              |
//! |-------------------|------------|-----------------------------------------|
//! | absent, `disable` | none       | -                                       |
//! | `prefer`          | if offered | no (as libpq without a root cert)       |
//! | `require`         | required   | no; with `sslrootcert=`: as `verify-ca` |
//! | `verify-ca`       | required   | chain to `sslrootcert=`                 |
//! | `verify-full`     | required   | chain to `sslrootcert=` and host name   |
//!
//! `sslrootcert=FILE` is a PEM file of CA certificates (libpq's option of
//! the same name). Both options are taken out of the URL before
//! `tokio-postgres` parses it (it knows neither `verify-*` nor
//! `sslrootcert`). The TLS is rustls (`tokio-postgres-rustls`) with the
//! aws-lc-rs provider, which the object store client already links.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{MetaError, Result};

/// How a connection protects itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP (`sslmode` absent or `disable`).
    Disable,
    /// TLS if the server offers it, no certificate check.
    Prefer,
    /// TLS, no certificate check (unless a root certificate is given).
    Require,
    /// TLS, the certificate chains to `sslrootcert`.
    VerifyCa,
    /// TLS, the certificate chains to `sslrootcert` and names the host.
    VerifyFull,
}

/// The TLS options of a URL, and the URL without them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOptions {
    /// What `sslmode=` asked.
    pub mode: SslMode,
    /// `sslrootcert=`, if given.
    pub root_cert: Option<String>,
    /// The URL for `tokio-postgres`: `sslmode` rewritten to a value it
    /// knows, `sslrootcert` removed.
    pub url: String,
}

/// Splits the TLS options out of `url`. Pure.
pub fn parse(url: &str) -> std::result::Result<TlsOptions, String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = SslMode::Disable;
    let mut root_cert = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                mode = match value {
                    "disable" => SslMode::Disable,
                    "prefer" | "allow" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(format!(
                            "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                        ))
                    }
                }
            }
            "sslrootcert" => root_cert = Some(percent_decode(value)),
            _ => kept.push(pair.to_string()),
        }
    }
    let pg_mode = match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        _ => "require",
    };
    kept.push(format!("sslmode={pg_mode}"));
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        return Err(format!(
            "sslmode={} needs sslrootcert=FILE (a PEM file of the CA that signed the server's certificate)",
            if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
        ));
    }
    Ok(TlsOptions {
        mode,
        root_cert,
        url: format!("{base}?{}", kept.join("&")),
    })
}

/// `%2F` → `/` and the like (paths in URLs are often escaped). Pure.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The rustls connector for `options` (`None`: plain TCP).
pub(crate) fn connector(options: &TlsOptions) -> Result<Option<MakeRustlsConnect>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let bad = |reason: String| MetaError::InvalidConfig { reason };
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS setup failed: {e}")))?;
    let roots = options.root_cert.as_deref().map(load_roots).transpose()?;
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match (options.mode, roots) {
        (SslMode::Disable, _) => return Ok(None),
        (SslMode::Prefer | SslMode::Require, None) => Arc::new(NoCertCheck { algorithms }),
        (SslMode::VerifyFull, Some(roots)) => webpki(roots, &provider)?,
        (_, Some(roots)) => Arc::new(ChainOnly {
            inner: webpki(roots, &provider)?,
        }),
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(bad("sslmode=verify-* needs sslrootcert=FILE".into()))
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| MetaError::InvalidConfig {
            reason: format!("TLS root certificates unusable: {e}"),
        })
}

fn load_roots(path: &str) -> Result<RootCertStore> {
    let bad = |what: String| {
        MetaError::InvalidConfig {
        reason: format!("sslrootcert={path}: {what}; give a PEM file of the CA that signed the server's certificate"),
    }
    };
    let mut roots = RootCertStore::empty();
    let certs =
        CertificateDer::pem_file_iter(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    for cert in certs {
        let cert = cert.map_err(|e| bad(format!("not PEM certificates: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("a certificate is unusable: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no certificate".into()));
    }
    Ok(roots)
}

/// `sslmode=require`/`prefer` without a root certificate: encryption
/// against passive eavesdroppers, no server authentication (libpq's
/// behaviour); handshake signatures are still checked.
#[derive(Debug)]
struct NoCertCheck {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoCertCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca` (and `require` with a root certificate): the chain must
/// lead to a given root; the host name is not compared.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_the_url() {
        let o = parse("postgres://u@h:5/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x")
            .unwrap();
        assert_eq!(o.mode, SslMode::VerifyFull);
        assert_eq!(o.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            o.url,
            "postgres://u@h:5/db?application_name=x&sslmode=require"
        );
        let plain = parse("postgres://u@h:5/db").unwrap();
        assert_eq!(plain.mode, SslMode::Disable);
        assert_eq!(plain.url, "postgres://u@h:5/db?sslmode=disable");
        assert_eq!(
            parse("postgres://h/db?sslmode=require").unwrap().mode,
            SslMode::Require
        );
        let e = parse("postgres://h/db?sslmode=verify-full").unwrap_err();
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = parse("postgres://h/db?sslmode=bogus").unwrap_err();
        assert!(e.contains("not one of"), "{e}");
    }
}
