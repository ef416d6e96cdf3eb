//! What `pcaptool query` asks: a trace or a store by its path, a sensor by its address (`https://host:port`), a
//! file of sensors (`@FILE`), or several of these separated by commas, merged by timestamp into one answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use pcaptool_engine::{OpenOptions, Source};
use pcaptool_remote::{Credentials, Endpoint, RemoteSource, parse_sensors};

/// How to reach sensors that have no credentials of their own.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct RemoteArgs {
    /// A file holding the bearer token for the sensors (as `pcaptool serve token add` printed it).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Certificate authorities (PEM) that sign the sensors' certificates (default: the system's).
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// A client certificate (PEM) for sensors that ask for one (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// With several sources: answer from those that can when some fail (each failure is reported by name, and the
    /// exit status is 3); by default one failing source fails the query.
    #[arg(long)]
    partial: bool,
}

impl RemoteArgs {
    fn credentials(&self) -> anyhow::Result<Credentials> {
        let mut c = Credentials::new();
        if let Some(t) = &self.token_file {
            c = c.token_file(t)?;
        }
        if let Some(ca) = &self.ca_cert {
            c = c.ca(ca);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            c = c.client_cert(cert, key);
        }
        Ok(c)
    }
}

/// Whether `spec` names sources that are not one local path (sensors, a file of sensors, a list).
pub(crate) fn is_remote_or_list(spec: &Path) -> bool {
    if spec.as_os_str() == "-" || spec.exists() {
        return false;
    }
    let s = spec.to_string_lossy();
    s.contains(',') || s.starts_with('@') || Endpoint::is_address(&s)
}

/// Opens what `spec` names: one source as it is, several merged. Indexes left unused are reported (see
/// [`warn_unused_indexes`]).
pub(crate) fn open(spec: &Path, opts: &OpenOptions, remote: &RemoteArgs) -> anyhow::Result<Source> {
    let source = open_quietly(spec, opts, remote)?;
    warn_unused_indexes(&source);
    Ok(source)
}

/// Says on standard error which traces are scanned because their index cannot be used, and why.
pub(crate) fn warn_unused_indexes(source: &Source) {
    for e in source.unused_indexes() {
        eprintln!("pcaptool: warning: {}; scanning the trace instead", pcaptool_packet::Chain(e));
    }
}

fn open_quietly(spec: &Path, opts: &OpenOptions, remote: &RemoteArgs) -> anyhow::Result<Source> {
    if !is_remote_or_list(spec) {
        if remote.partial {
            anyhow::bail!("--partial is for several sources (a comma-separated list, or @FILE of sensors)");
        }
        return Ok(Source::open_with(spec, opts)?);
    }
    let creds = remote.credentials()?;
    let text = spec.to_string_lossy();
    let mut parts: Vec<(String, Arc<Source>)> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            anyhow::bail!("{text:?} has an empty item: separate sources with single commas");
        }
        let mut add = |name: String, source: Source| -> anyhow::Result<()> {
            if parts.iter().any(|(n, _)| *n == name) {
                anyhow::bail!("{name} is named twice");
            }
            parts.push((name, Arc::new(source)));
            Ok(())
        };
        if let Some(file) = item.strip_prefix('@') {
            let file = Path::new(file);
            let body = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the sensors file {}", file.display()))?;
            for sensor in parse_sensors(&body, file)? {
                let r = sensor.source(&creds)?;
                add(sensor.name.clone(), Source::remote(Arc::new(r)))?;
            }
        } else if Endpoint::is_address(item) {
            let r = RemoteSource::new(item.parse()?, &creds)?;
            add(r.endpoint().to_string(), Source::remote(Arc::new(r)))?;
        } else {
            add(item.to_string(), Source::open_with(item, opts)?)?;
        }
    }
    if parts.len() == 1 && !remote.partial {
        let (_, only) = parts.pop().expect("one part");
        return Ok(Arc::into_inner(only).expect("the only holder"));
    }
    Ok(Source::merged(parts, remote.partial))
}
