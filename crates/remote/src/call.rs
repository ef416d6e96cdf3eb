//! One HTTP/1.1 exchange with a sensor, on a tokio runtime of its own (current-thread, on the caller's thread):
//! connect, TLS, send, then the answer's body read as a [`Read`] that blocks on the next frame. The caller's cancel
//! flag is looked at every 50 ms while waiting; dropping the call closes the connection, which the service takes
//! as the client leaving (it cancels the query).

use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header;
use hyper_util::rt::TokioIo;
use pcaptool_engine::Cancel;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::{Credentials, Endpoint, RemoteError};

/// How long a sensor may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a wait looks at the cancel flag.
const TICK: Duration = Duration::from_millis(50);
/// Where Debian keeps the system's certificate authorities.
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Clone, Copy, Debug)]
pub(crate) enum Method {
    Get,
    Post,
}

/// Why a call did not start.
#[derive(Debug)]
pub(crate) enum CallError {
    Cancelled,
    Remote(RemoteError),
}

impl From<RemoteError> for CallError {
    fn from(e: RemoteError) -> CallError {
        CallError::Remote(e)
    }
}

/// A call whose answer (status 200) is being read.
pub(crate) struct Call {
    rt: tokio::runtime::Runtime,
    body: Incoming,
    buf: Bytes,
    cancel: Option<Cancel>,
    done: bool,
}

fn credentials_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> RemoteError {
    RemoteError::Credentials { what, path: path.to_path_buf(), why: e.to_string() }
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, RemoteError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| credentials_error(what, path, e))?;
    if certs.is_empty() {
        return Err(credentials_error(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The rustls configuration for `creds`: the sensor's certificate checked against their authorities (or the
/// system's), a client certificate when they hold one.
pub(crate) fn client_config(creds: &Credentials) -> Result<Arc<rustls::ClientConfig>, RemoteError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca = creds.ca.clone().unwrap_or_else(|| SYSTEM_CAS.into());
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs("read the certificate authorities", &ca)?);
    if added == 0 {
        return Err(credentials_error("use the certificate authorities", &ca, "no certificate in it can be used"));
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| credentials_error("set up TLS with", &ca, e))?
        .with_root_certificates(roots);
    let mut config = match (&creds.cert, &creds.key) {
        (Some(cert), Some(key)) => {
            let chain = certs("read the client certificate", cert)?;
            let k = PrivateKeyDer::from_pem_file(key).map_err(|e| credentials_error("read the client key", key, e))?;
            builder
                .with_client_auth_cert(chain, k)
                .map_err(|e| credentials_error("use the client certificate", cert, e))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(p), None) | (None, Some(p)) => {
            return Err(credentials_error(
                "use the client certificate",
                p,
                "a client certificate needs its key and the key its certificate",
            ));
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The error and its causes in one line (hyper's own message is terse: "connection error"; a TLS alert from the
/// server, such as a refused client certificate, is a cause).
fn http_error(e: impl std::error::Error + 'static) -> RemoteError {
    let mut s = pcaptool_packet::Chain(&e).to_string();
    if s.contains("alert: CertificateRequired") {
        s.push_str(" (the sensor asks for a client certificate: give --client-cert and --client-key)");
    } else if s.contains("alert: UnknownCA")
        || s.contains("alert: BadCertificate")
        || s.contains("alert: CertificateExpired")
    {
        s.push_str(" (the sensor refused the client certificate)");
    }
    RemoteError::Http(s)
}

/// Runs `fut` on `rt`, giving up when `cancel` is set.
fn block_on<T>(rt: &tokio::runtime::Runtime, cancel: Option<&Cancel>, fut: impl Future<Output = T>) -> Option<T> {
    rt.block_on(async {
        tokio::pin!(fut);
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                v = &mut fut => return Some(v),
                _ = tick.tick() => {
                    if cancel.is_some_and(Cancel::is_cancelled) {
                        return None;
                    }
                }
            }
        }
    })
}

async fn exchange<I>(io: I, req: hyper::Request<Full<Bytes>>) -> Result<hyper::Response<Incoming>, RemoteError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(http_error)?;
    tokio::spawn(async move {
        // Ends when the answer has been read or the call is dropped.
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(http_error)
}

impl Call {
    /// Connects, sends, and waits for the answer's head; a status other than 200 is [`RemoteError::Refused`] with
    /// the service's message.
    pub(crate) fn start(
        ep: &Endpoint,
        tls: Option<&Arc<rustls::ClientConfig>>,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Vec<u8>,
        cancel: Option<Cancel>,
    ) -> Result<Call, CallError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(http_error)?;
        let mut req = hyper::Request::builder()
            .method(match method {
                Method::Get => hyper::Method::GET,
                Method::Post => hyper::Method::POST,
            })
            .uri(path)
            .header(header::HOST, ep.authority())
            .header(header::USER_AGENT, concat!("pcaptool/", env!("CARGO_PKG_VERSION")));
        if matches!(method, Method::Post) {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(http_error)?;
        let addr = ep.authority();
        let work = async {
            let connect = tokio::net::TcpStream::connect((ep.host.as_str(), ep.port));
            let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(RemoteError::Connect { address: addr.clone(), why: e.to_string() }),
                Err(_) => return Err(RemoteError::Connect { address: addr.clone(), why: "timed out".into() }),
            };
            let _ = tcp.set_nodelay(true);
            match tls {
                Some(config) => {
                    let name = ServerName::try_from(ep.host.clone())
                        .map_err(|e| RemoteError::Connect { address: addr.clone(), why: e.to_string() })?;
                    let stream = tokio_rustls::TlsConnector::from(config.clone())
                        .connect(name, tcp)
                        .await
                        .map_err(|e| RemoteError::Connect { address: addr.clone(), why: format!("TLS: {e}") })?;
                    exchange(TokioIo::new(stream), req).await
                }
                None => exchange(TokioIo::new(tcp), req).await,
            }
        };
        let resp = match block_on(&rt, cancel.as_ref(), work) {
            None => return Err(CallError::Cancelled),
            Some(r) => r?,
        };
        let status = resp.status();
        let mut call = Call { rt, body: resp.into_body(), buf: Bytes::new(), cancel, done: false };
        if status != hyper::StatusCode::OK {
            let text = call.read_all(64 << 10).unwrap_or_default();
            return Err(CallError::Remote(refusal(status.as_u16(), &text)));
        }
        Ok(call)
    }

    /// The whole answer, refused beyond `max` bytes.
    pub(crate) fn read_all(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 1 << 14];
        loop {
            let n = self.read(&mut chunk)?;
            if n == 0 {
                return Ok(out);
            }
            if out.len() + n > max {
                return Err(io::Error::other(format!("the answer is larger than {max} bytes")));
            }
            out.extend_from_slice(&chunk[..n]);
        }
    }
}

impl Read for Call {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            if self.done {
                return Ok(0);
            }
            let frame = match block_on(&self.rt, self.cancel.as_ref(), self.body.frame()) {
                None => return Err(io::Error::other("cancelled")),
                Some(f) => f,
            };
            match frame {
                None => self.done = true,
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf = data;
                    }
                }
                Some(Err(e)) => return Err(io::Error::other(http_error(e))),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        self.buf.advance(n);
        Ok(n)
    }
}

/// A refusal's status and message from the service's JSON error (`error`, and `caret` for a filter).
fn refusal(status: u16, body: &[u8]) -> RemoteError {
    let message = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v["error"].is_string() => {
            let mut m = v["error"].as_str().unwrap_or_default().to_string();
            if let Some(c) = v["caret"].as_str() {
                m.push('\n');
                m.push_str(c);
            }
            m
        }
        _ => String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string(),
    };
    RemoteError::Refused { status, message }
}

/// `s` percent-encoded for a query string (every byte but RFC 3986's unreserved ones).
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_the_services_message() {
        let e = refusal(400, br#"{"error":"invalid filter: syntax error","caret":"tcp prt\n    ^"}"#);
        assert_eq!(e.to_string(), "refused with 400: invalid filter: syntax error\ntcp prt\n    ^");
        let e = refusal(502, b"Bad Gateway\n");
        assert_eq!(e.to_string(), "refused with 502: Bad Gateway");
    }

    #[test]
    fn query_strings_are_encoded() {
        assert_eq!(percent_encode("host 10.0.0.1 && port 80"), "host%2010.0.0.1%20%26%26%20port%2080");
    }
}
