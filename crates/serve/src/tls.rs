//! TLS by rustls (ring's cryptography): the server's certificate chain and key from PEM files, and, for mutual
//! TLS, the certificate authorities whose client certificates are accepted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use crate::ServeError;

/// Where the service's TLS material is.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The certificate chain, PEM, the server's own first.
    pub cert: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Certificate authorities (PEM): when given, every client must present a certificate one of them issued
    /// (mutual TLS), checked during the handshake.
    pub client_ca: Option<PathBuf>,
}

fn pem_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> ServeError {
    ServeError::Tls { what, path: path.to_path_buf(), why: e.to_string() }
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ServeError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The rustls configuration for `files`, offering HTTP/2 and HTTP/1.1.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs("read the certificate chain", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| pem_error("read the private key", &files.key, e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| pem_error("set up TLS with", &files.cert, e))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("read the client certificate authorities", ca)? {
                roots.add(c).map_err(|e| pem_error("add a client certificate authority from", ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| pem_error("use the client certificate authorities", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_single_cert(chain, key).map_err(|e| pem_error("use the certificate and key", &files.cert, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client certificate's name in logs: `cert:` and the first 16 hexadecimal digits of its SHA-256.
pub(crate) fn cert_name(cert: &CertificateDer<'_>) -> String {
    let d = Sha256::digest(cert.as_ref());
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("cert:{hex}")
}
