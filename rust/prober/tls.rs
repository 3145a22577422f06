//! TLS for https regions: rustls on the ring provider, trusting the system store (the same
//! roots Python's `ssl` and so the proxy's own connections trust, `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` included) plus an optional PEM bundle of extra CAs.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::ProberError;

/// The client side of every https probe, built once per settings change.
#[derive(Clone)]
pub struct Tls {
    /// Err when no root could be loaded: every https probe then fails with this text, while
    /// plain-HTTP regions are unaffected.
    connector: Result<TlsConnector, String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ready", &self.connector.is_ok())
            .finish()
    }
}

/// Every certificate in a PEM file; a missing, unreadable or certificate-less file is a
/// config error naming the file.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, ProberError> {
    let err = |why: String| ProberError::Config(format!("ca_file {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE blocks".to_owned()));
    }
    Ok(certs)
}

/// ring: builds with a C compiler alone (aws-lc-rs needs cmake and a much longer build).
/// rustls deprecates it for lacking post-quantum key exchange, which guards confidentiality
/// against later decryption; a health probe carries no credentials and nothing secret.
#[allow(deprecated)]
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// The system store plus `ca_file`'s certificates (read now, so a bad file fails at once).
    pub fn load(ca_file: Option<&Path>) -> Result<Self, ProberError> {
        let extra = ca_file.map(read_ca_file).transpose()?.unwrap_or_default();
        let system = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(system.certs);
        for cert in extra {
            roots.add(cert).map_err(|e| {
                let file = ca_file.map_or_else(String::new, |p| p.display().to_string());
                ProberError::Config(format!("ca_file {file}: unusable CA certificate: {e}"))
            })?;
        }
        if roots.is_empty() {
            let why: Vec<String> = system.errors.iter().map(ToString::to_string).collect();
            return Ok(Self {
                connector: Err(format!(
                    "tls: no trusted CA certificates (system store empty{}{}; set ca_file)",
                    if why.is_empty() { "" } else { ": " },
                    why.join("; ")
                )),
            });
        }
        Ok(Self::with_roots(roots))
    }

    /// A client trusting exactly `roots` (tests use this to leave the system store out).
    pub fn with_roots(roots: RootCertStore) -> Self {
        // Explicit provider and versions: never panics on an ambiguous process-wide default.
        let connector = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map(|builder| {
                let mut config = builder.with_root_certificates(roots).with_no_client_auth();
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                TlsConnector::from(Arc::new(config))
            })
            .map_err(|e| format!("tls: {e}"));
        Self { connector }
    }

    /// The connector, or why https probes cannot run.
    pub fn connector(&self) -> Result<&TlsConnector, &str> {
        self.connector.as_ref().map_err(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, body: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("router-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        path
    }

    #[test]
    fn ca_file_errors_name_the_file() {
        let missing = Path::new("/nonexistent/ca.pem");
        let e = read_ca_file(missing).unwrap_err().to_string();
        assert!(e.contains("ca_file /nonexistent/ca.pem"), "{e}");
        let empty = temp_file("empty.pem", b"not pem at all\n");
        let e = Tls::load(Some(&empty)).unwrap_err().to_string();
        assert!(e.contains("no CERTIFICATE blocks"), "{e}");
    }

    #[test]
    fn ca_file_certificates_are_trusted() {
        let ca = rcgen::CertifiedIssuer::self_signed(
            rcgen::CertificateParams::new(Vec::<String>::new()).unwrap(),
            rcgen::KeyPair::generate().unwrap(),
        )
        .unwrap();
        let path = temp_file("ca.pem", ca.pem().as_bytes());
        assert_eq!(read_ca_file(&path).unwrap().len(), 1);
        assert!(Tls::load(Some(&path)).unwrap().connector().is_ok());
    }

    #[test]
    fn no_roots_fails_https_probes_not_construction() {
        let tls = Tls::load(None).unwrap();
        // The system store may or may not be empty here; an empty store is reported per probe.
        if let Err(e) = tls.connector() {
            assert!(e.contains("no trusted CA certificates"), "{e}");
        }
        assert!(Tls::with_roots(RootCertStore::empty()).connector().is_ok());
    }
}
