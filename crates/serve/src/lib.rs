//! The pcaptool query service: traces and flow stores opened once and answered over HTTP/1.1 and HTTP/2.
//!
//! A [`Service`] holds its sources loaded (a trace's index, a store's stage 1 and flow tables), so that a
//! needle costs what the index costs, not a process start. [`serve`] listens on an address, with TLS by rustls
//! when given a certificate, and answers:
//!
//! - `POST /v1/query`: a JSON body (`filter`, `after`, `before`, `limit`, `max_bytes`, `flow`, `format`,
//!   `source`), answered as a pcap (or pcapng) stream written as the engine finds the packets, with
//!   backpressure: a slow client slows the engine, it never makes the service hold the answer. A client that
//!   goes away cancels the work; an answer that fails midway ends the stream with an error, never as a
//!   complete-looking file.
//! - `POST /v1/count`, `POST /v1/explain` (the engine's plan as JSON), `GET /v1/stats`, `GET /healthz`.
//!
//! Security by default: listening on anything but loopback needs TLS and a way to authenticate (client
//! certificates from a CA file, bearer tokens from a token file, see [`auth`]); requests name sources, never
//! paths; bodies, answers and concurrent queries are limited ([`Limits`]). Errors are JSON with a fitting status.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
pub mod auth;
mod body;
mod http;
mod sources;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use auth::{Tokens, add_token};
pub use http::serve;
pub use sources::Service;
pub use tls::TlsFiles;

/// What a service serves and how.
#[derive(Clone, Debug)]
pub struct Config {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The sources: traces (indexed or not) and flow stores, each named by its file or directory name.
    pub sources: Vec<PathBuf>,
    /// TLS, when given.
    pub tls: Option<TlsFiles>,
    /// Bearer tokens (a token file, see [`auth`]): when given, every request but `/healthz` needs one.
    pub tokens: Option<PathBuf>,
    /// Limits on requests and answers.
    pub limits: Limits,
    /// How long a stop waits for running queries before it cancels them.
    pub drain: std::time::Duration,
    /// Heap bytes each flow store may keep of its decoded indexes (flow tables, sorted arrays) between
    /// requests; see `pcaptool_engine::OpenOptions::index_memory`.
    pub index_memory: u64,
}

/// Limits on what one request may ask and on how many run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of a request body (413 beyond).
    pub body_bytes: usize,
    /// Queries running at once (429 beyond).
    pub concurrent: usize,
    /// Packets of one answer at most (a request's own `limit` may be lower).
    pub packets: Option<u64>,
    /// Bytes of one answer's packet data at most (a request's `max_bytes` may be lower).
    pub bytes: Option<u64>,
    /// Seconds one query may run; it is then cancelled (the stream ends with an error).
    pub seconds: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { body_bytes: 64 << 10, concurrent: 16, packets: None, bytes: None, seconds: None }
    }
}

/// What keeps a service from starting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A file could not be read or written.
    #[error("cannot {what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of the token file is not `NAME sha256:HEX`.
    #[error("{}:{line}: {why}", path.display())]
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A token of this name is in the file already.
    #[error("{} has a token named {name} already: choose another name", path.display())]
    TokenExists {
        /// The token file.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// A token name must be one word.
    #[error("a token name must be one word without spaces or control characters, not {name:?}")]
    TokenName {
        /// The name given.
        name: String,
    },
    /// TLS material could not be used.
    #[error("cannot {what} {}: {why}", path.display())]
    Tls {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The configuration is not safe or not complete.
    #[error("{0}")]
    Config(String),
    /// A source could not be opened.
    #[error("cannot serve {}", path.display())]
    Source {
        /// The source.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<pcaptool_engine::Error>,
    },
    /// The address could not be listened on.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Config {
    /// Refuses what would expose packets without protection: anything but loopback needs TLS and a way to
    /// authenticate; and a configuration with nothing to serve.
    pub fn check(&self) -> Result<(), ServeError> {
        if self.sources.is_empty() {
            return Err(ServeError::Config("name at least one trace or flow store to serve".into()));
        }
        if !self.listen.ip().is_loopback() {
            let auth = self.tokens.is_some() || self.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
            if self.tls.is_none() || !auth {
                return Err(ServeError::Config(format!(
                    "{} is not a loopback address: packets leave this machine only over TLS to authenticated \
                     clients; give --tls-cert and --tls-key, and --tokens or --client-ca (or listen on 127.0.0.1)",
                    self.listen
                )));
            }
        }
        if self.limits.concurrent == 0 {
            return Err(ServeError::Config("--max-queries must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str) -> Config {
        Config {
            listen: listen.parse().unwrap(),
            sources: vec!["t.pcap".into()],
            tls: None,
            tokens: None,
            limits: Limits::default(),
            drain: std::time::Duration::from_secs(30),
            index_memory: pcaptool_engine::DEFAULT_INDEX_MEMORY,
        }
    }

    #[test]
    fn only_loopback_goes_without_tls_and_authentication() {
        assert!(config("127.0.0.1:0").check().is_ok());
        assert!(config("[::1]:0").check().is_ok());
        let mut c = config("0.0.0.0:8443");
        assert!(matches!(c.check(), Err(ServeError::Config(m)) if m.contains("not a loopback")));
        c.tokens = Some("tokens".into());
        assert!(c.check().is_err(), "tokens without TLS");
        c.tls = Some(TlsFiles { cert: "c".into(), key: "k".into(), client_ca: None });
        assert!(c.check().is_ok());
        c.tokens = None;
        assert!(c.check().is_err(), "TLS without authentication");
        c.tls = Some(TlsFiles { cert: "c".into(), key: "k".into(), client_ca: Some("ca".into()) });
        assert!(c.check().is_ok());
        let mut empty = config("127.0.0.1:0");
        empty.sources.clear();
        assert!(empty.check().is_err());
    }
}
