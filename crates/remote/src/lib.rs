//! Remote sensors as sources of the pcaptool engine: a client of `pcaptool serve` (see docs/service.md).
//!
//! A [`RemoteSource`] is an address (`https://sensor:8740`, optionally `?source=NAME` for one of the service's
//! sources) with the credentials it needs ([`Credentials`]: a bearer token, the certificate authorities that
//! vouch for the server, a client certificate). It implements [`pcaptool_engine::Remote`], so that
//! [`Source::remote`](pcaptool_engine::Source::remote) makes it a source like a local trace or store, and
//! [`Source::merged`](pcaptool_engine::Source::merged) fans one request out over many sensors, merged by
//! timestamp. Every request is one HTTP/1.1 connection; the answer's pcap is parsed as it arrives and its
//! records given to the engine's sink, so a large answer is never held in memory, and an answer cancelled or
//! stopped by its sink closes the connection, which cancels the work on the sensor.
//!
//! A file of sensors ([`parse_sensors`]) names them, one a line, each with its own credentials.
//!
//! ```no_run
//! use std::sync::Arc;
//! use pcaptool_engine::{Request, Source, TraceSink, WriteOptions};
//! use pcaptool_remote::{Credentials, RemoteSource};
//!
//! let creds = Credentials::new().token_file("/etc/pcaptool/token")?.ca("/etc/pcaptool/ca.pem");
//! let sensor = RemoteSource::new("https://sensor1:8740".parse()?, &creds)?;
//! let source = Source::remote(Arc::new(sensor));
//! let mut out = TraceSink::create("answer.pcap".as_ref(), WriteOptions::new())?;
//! source.run(&Request::filter("host 10.0.0.1")?, &mut out)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod call;
mod sensors;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use pcaptool_engine::{Error, FlowRecord, Layout, NativeFormat, Outcome, Plan, Request, Sink};
use pcaptool_packet::{FileFormat, TraceReader};
use serde_json::{Value, json};

pub use sensors::{Sensor, parse_sensors};

use call::{Call, Method};

/// The service's port when an address gives none (`pcaptool serve --listen`'s default).
pub const DEFAULT_PORT: u16 = 8740;

/// What can go wrong with a remote source. Each carries the facts: the address, the file, the status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The address is not `http://HOST[:PORT]` or `https://HOST[:PORT]` (with an optional `/?source=NAME`).
    #[error("{address:?} is not a sensor address: {why} (expected https://HOST[:PORT][/?source=NAME])")]
    Address {
        /// What was given.
        address: String,
        /// What is wrong.
        why: String,
    },
    /// A file of credentials (token, certificate, key) could not be read or holds nothing usable.
    #[error("cannot {what} {}: {why}", path.display())]
    Credentials {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A file of sensors does not parse.
    #[error("{}:{line}: {why}", path.display())]
    Sensors {
        /// The file.
        path: PathBuf,
        /// Its line (0: the file as a whole).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A bearer token would cross the network in clear.
    #[error("{address}: a token is sent only over https (or to a loopback address)")]
    TokenInClear {
        /// The address.
        address: String,
    },
    /// The sensor could not be reached.
    #[error("cannot connect to {address}: {why}")]
    Connect {
        /// `HOST:PORT`.
        address: String,
        /// Why.
        why: String,
    },
    /// The sensor refused the request: its status and its message.
    #[error("refused with {status}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The service's message (its `error` field), with the filter's caret when it gave one.
        message: String,
    },
    /// The exchange broke off (the connection, the HTTP framing).
    #[error("the connection broke: {0}")]
    Http(String),
    /// The answer is not what the service sends (not pcap, not the JSON expected).
    #[error("the answer is not understood: {0}")]
    Answer(String),
    /// The answer's pcap stream is damaged or was cut short (the service ends a failed answer so).
    #[error("the answer broke off")]
    Stream(#[source] pcaptool_packet::TraceError),
}

/// `http` or `https`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP (only sensible on loopback: the service refuses to listen elsewhere without TLS).
    Http,
    /// HTTP over TLS.
    Https,
}

/// Where a sensor is: `https://HOST[:PORT][/][?source=NAME]`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Endpoint {
    /// The scheme.
    pub scheme: Scheme,
    /// The host: a DNS name or an IP address (without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
    /// One of the service's sources (`None`: the service's only source, or all of them merged).
    pub source: Option<String>,
}

impl Endpoint {
    /// Whether `s` looks like a sensor address rather than a path (it starts with `http://` or `https://`).
    pub fn is_address(s: &str) -> bool {
        let l = s.to_ascii_lowercase();
        l.starts_with("http://") || l.starts_with("https://")
    }

    /// Whether the host is a loopback address (or `localhost`).
    pub fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// `HOST:PORT` as an HTTP `Host` header and a connect address give it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}", self.authority())?;
        if let Some(s) = &self.source {
            write!(f, "/?source={s}")?;
        }
        Ok(())
    }
}

impl FromStr for Endpoint {
    type Err = RemoteError;

    fn from_str(s: &str) -> Result<Endpoint, RemoteError> {
        let bad = |why: &str| RemoteError::Address { address: s.to_string(), why: why.to_string() };
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) if sch.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
            Some((sch, rest)) if sch.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
            _ => return Err(bad("the scheme must be http or https")),
        };
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("credentials in the address are not used: give --token-file"));
        }
        let (host, port) = if let Some(r) = authority.strip_prefix('[') {
            let (h, after) = r.split_once(']').ok_or_else(|| bad("an IPv6 address needs its closing ']'"))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if !host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':')) {
            return Err(bad("the host holds characters no host name has"));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| bad("the port is not 1 to 65535"))?,
            None => DEFAULT_PORT,
        };
        let tail = tail.strip_prefix('/').unwrap_or(tail);
        let source = match tail {
            "" => None,
            t => {
                let q = t
                    .strip_prefix('?')
                    .ok_or_else(|| bad("the service takes no path; name a source with ?source=NAME"))?;
                let name = q.strip_prefix("source=").ok_or_else(|| bad("the only parameter is source=NAME"))?;
                if name.is_empty() || name.contains(['&', '=', '%', '+']) {
                    return Err(bad("the source's name must be plain (as /v1/stats lists it)"));
                }
                Some(name.to_string())
            }
        };
        Ok(Endpoint { scheme, host: host.to_string(), port, source })
    }
}

/// What a sensor needs to trust and to be trusted: a bearer token, the certificate authorities that sign the
/// sensor's certificate (default: the system's, `/etc/ssl/certs/ca-certificates.crt`), a client certificate and
/// key for mutual TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Credentials {
    /// The bearer token (as `pcaptool serve token add` printed it).
    pub token: Option<String>,
    /// Certificate authorities (PEM) to check the sensor's certificate against.
    pub ca: Option<PathBuf>,
    /// A client certificate chain (PEM), for a sensor that asks for one.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

impl Credentials {
    /// None.
    pub fn new() -> Credentials {
        Credentials::default()
    }

    /// The token held in `path` (its first line; the file should be readable only by its owner).
    pub fn token_file(mut self, path: impl AsRef<Path>) -> Result<Credentials, RemoteError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| RemoteError::Credentials {
            what: "read the token file",
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        let token = text.lines().next().unwrap_or("").trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(RemoteError::Credentials {
                what: "use the token file",
                path: path.to_path_buf(),
                why: "its first line is not a token".into(),
            });
        }
        self.token = Some(token.to_string());
        Ok(self)
    }

    /// Certificate authorities to trust for the sensor's certificate.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Credentials {
        self.ca = Some(path.into());
        self
    }

    /// A client certificate chain and its key.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Credentials {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }
}

/// A sensor: a `pcaptool serve` reached over HTTP(S), as a source of the engine.
pub struct RemoteSource {
    name: String,
    endpoint: Endpoint,
    token: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // (Not the token.)
        f.debug_struct("RemoteSource")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl RemoteSource {
    /// A sensor at `endpoint`, named by its address. Reads the credentials' files now, so that a bad file is
    /// told before any request.
    pub fn new(endpoint: Endpoint, creds: &Credentials) -> Result<RemoteSource, RemoteError> {
        let name = endpoint.to_string();
        RemoteSource::named(name, endpoint, creds)
    }

    /// A sensor at `endpoint` with a name of its own (as a file of sensors gives it).
    pub fn named(name: String, endpoint: Endpoint, creds: &Credentials) -> Result<RemoteSource, RemoteError> {
        if creds.token.is_some() && endpoint.scheme == Scheme::Http && !endpoint.is_loopback() {
            return Err(RemoteError::TokenInClear { address: endpoint.to_string() });
        }
        let tls = match endpoint.scheme {
            Scheme::Https => Some(call::client_config(creds)?),
            Scheme::Http => None,
        };
        Ok(RemoteSource { name, endpoint, token: creds.token.clone(), tls })
    }

    /// The sensor's address.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn fail(&self, e: RemoteError) -> Error {
        Error::Remote { name: self.name.clone(), source: Box::new(e) }
    }

    /// The JSON body asking `req` of the service.
    fn body(&self, req: &Request) -> Value {
        let mut v = json!({ "filter": req.filter.as_ref().map_or("", |f| f.text()) });
        let secs = |ns: u64| format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
        if let Some(a) = req.after {
            v["after"] = secs(a).into();
        }
        if let Some(b) = req.before {
            v["before"] = secs(b).into();
        }
        if let Some(l) = req.limit {
            v["limit"] = l.into();
        }
        if let Some(f) = req.flow {
            v["flow"] = f.into();
        }
        if let Some(s) = &self.endpoint.source {
            v["source"] = s.clone().into();
        }
        v
    }

    fn call(&self, method: Method, path: &str, body: Vec<u8>, req: &Request) -> Result<Call, Error> {
        let call = Call::start(
            &self.endpoint,
            self.tls.as_ref(),
            self.token.as_deref(),
            method,
            path,
            body,
            req.cancel.clone(),
        );
        call.map_err(|e| match e {
            call::CallError::Cancelled => Error::Cancelled,
            call::CallError::Remote(e) => self.fail(e),
        })
    }

    /// A call whose answer is JSON, read whole (bounded).
    fn json(&self, method: Method, path: &str, body: Vec<u8>, req: &Request) -> Result<Vec<u8>, Error> {
        let mut call = self.call(method, path, body, req)?;
        call.read_all(64 << 20).map_err(|e| self.io_error(req, e))
    }

    fn io_error(&self, req: &Request, e: std::io::Error) -> Error {
        if req.is_cancelled() {
            return Error::Cancelled;
        }
        self.fail(RemoteError::Http(e.to_string()))
    }
}

impl pcaptool_engine::Remote for RemoteSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn plan(&self, req: &Request) -> Result<Plan, Error> {
        let bytes = self.json(Method::Post, "/v1/explain", self.body(req).to_string().into_bytes(), req)?;
        serde_json::from_slice(&bytes).map_err(|e| self.fail(RemoteError::Answer(format!("a plan was expected: {e}"))))
    }

    fn run(&self, req: &Request, sink: &mut dyn Sink) -> Result<Outcome, Error> {
        let body = self.body(req).to_string().into_bytes();
        if req.count_only {
            let bytes = self.json(Method::Post, "/v1/count", body, req)?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| self.fail(RemoteError::Answer(format!("a count was expected: {e}"))))?;
            let (Some(matched), packets) = (v["matched"].as_u64(), v["packets"].as_u64()) else {
                return Err(self.fail(RemoteError::Answer(format!("a count was expected, not {v}"))));
            };
            let mut o = Outcome::default();
            o.matched = matched;
            o.packets = packets.unwrap_or(0);
            return Ok(o);
        }
        let call = self.call(Method::Post, "/v1/query", body, req)?;
        let mut reader = TraceReader::from_reader(Box::new(call), Some(PathBuf::from(&self.name)))
            .map_err(|e| self.stream_error(req, e))?;
        reader.read_header().map_err(|e| self.stream_error(req, e))?;
        let native = match reader.format() {
            Some(FileFormat::Pcap { precision, .. }) => NativeFormat::Pcap(precision),
            Some(_) => NativeFormat::PcapNg,
            None => return Err(self.fail(RemoteError::Answer("the answer holds no capture header".into()))),
        };
        let complete = matches!(native, NativeFormat::Pcap(_));
        sink.begin(&Layout { interfaces: reader.interfaces(), native, complete })?;
        let mut out = Outcome::default();
        let limit = req.limit.unwrap_or(u64::MAX);
        while out.matched < limit {
            if req.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let (rec, ifaces) = match reader.next_with_interfaces() {
                None => break,
                Some(Ok(x)) => x,
                Some(Err(e)) => return Err(self.stream_error(req, e)),
            };
            out.matched += 1;
            if !sink.record(&rec, ifaces)? {
                out.stopped = true;
                break;
            }
        }
        sink.finish(reader.interfaces())?;
        Ok(out)
    }

    fn flows(&self, req: &Request) -> Result<Vec<FlowRecord>, Error> {
        let body = self.body(req);
        let mut q = Vec::new();
        for key in ["filter", "after", "before", "source"] {
            if let Some(s) = body[key].as_str() {
                q.push(format!("{key}={}", call::percent_encode(s)));
            }
        }
        let path = format!("/v1/flows?{}", q.join("&"));
        let bytes = self.json(Method::Get, &path, Vec::new(), req)?;
        let mut flows = Vec::new();
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
            let f: FlowRecord = serde_json::from_slice(line)
                .map_err(|e| self.fail(RemoteError::Answer(format!("a flow was expected: {e}"))))?;
            flows.push(f);
        }
        Ok(flows)
    }
}

impl RemoteSource {
    fn stream_error(&self, req: &Request, e: pcaptool_packet::TraceError) -> Error {
        if req.is_cancelled() {
            return Error::Cancelled;
        }
        self.fail(RemoteError::Stream(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_their_defaults() {
        let e: Endpoint = "https://sensor1:8443".parse().unwrap();
        assert_eq!((e.scheme, e.host.as_str(), e.port, e.source.as_deref()), (Scheme::Https, "sensor1", 8443, None));
        let e: Endpoint = "http://127.0.0.1".parse().unwrap();
        assert_eq!(e.port, DEFAULT_PORT);
        assert!(e.is_loopback());
        let e: Endpoint = "https://[::1]:9000/?source=store".parse().unwrap();
        assert_eq!((e.host.as_str(), e.port, e.source.as_deref()), ("::1", 9000, Some("store")));
        assert_eq!(e.to_string(), "https://[::1]:9000/?source=store");
        assert_eq!(e.authority(), "[::1]:9000");
        for bad in [
            "ftp://x",
            "sensor:8443",
            "https://",
            "https://x:0",
            "https://x:99999",
            "https://user:pw@x",
            "https://x/v1/query",
            "https://x/?src=a",
            "https://[::1",
            "https://a b",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad} was accepted");
        }
        assert!(Endpoint::is_address("HTTPS://x") && !Endpoint::is_address("./https.pcap"));
    }

    #[test]
    fn a_token_is_not_sent_in_clear_off_loopback() {
        let creds = Credentials { token: Some("t".into()), ..Credentials::default() };
        let err = RemoteSource::new("http://10.1.2.3:8740".parse().unwrap(), &creds).unwrap_err();
        assert!(matches!(err, RemoteError::TokenInClear { .. }), "{err}");
        assert!(RemoteSource::new("http://127.0.0.1:8740".parse().unwrap(), &creds).is_ok());
    }

    #[test]
    fn the_body_carries_the_request() {
        let s = RemoteSource::new("http://127.0.0.1:1/?source=a".parse().unwrap(), &Credentials::new()).unwrap();
        let req = Request::filter("tcp port 80").unwrap().after(1_500_000_000_000_000_001).limit(5).flow(7);
        let v = s.body(&req);
        assert_eq!(
            v,
            json!({ "filter": "tcp port 80", "after": "1500000000.000000001", "limit": 5, "flow": 7, "source": "a" })
        );
        // The service reads the time back to the nanosecond.
        assert_eq!(pcaptool_packet::parse_time(v["after"].as_str().unwrap()).unwrap(), 1_500_000_000_000_000_001);
    }

    #[test]
    fn an_unreachable_sensor_is_named() {
        // A port nothing listens on: bind one, then free it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let s = RemoteSource::new(format!("http://127.0.0.1:{port}").parse().unwrap(), &Credentials::new()).unwrap();
        let source = pcaptool_engine::Source::remote(Arc::new(s));
        let err = source.count(&Request::filter("tcp").unwrap()).unwrap_err();
        let Error::Remote { name, source } = &err else { panic!("{err:?}") };
        assert_eq!(name, &format!("http://127.0.0.1:{port}"));
        assert!(source.to_string().starts_with("cannot connect to 127.0.0.1:"), "{source}");
    }
}
