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

/// Whether `spec` names sources that are not local paths (sensors, a file of sensors, a list).
pub(crate) fn is_remote_or_list(spec: &Path) -> bool {
    if spec.as_os_str() == "-" || spec.exists() {
        return false;
    }
    let s = spec.to_string_lossy();
    s.contains(',') || s.starts_with('@') || Endpoint::is_address(&s)
}

/// Opens what `specs` name: one source as it is, several merged by timestamp. Each spec is a path (a pattern
/// and a directory of captures give their files, see [`crate::inputs`]), a sensor's address, `@FILE` of
/// sensors, or several of these separated by commas. Indexes left unused are reported (see
/// [`warn_unused_indexes`]).
pub(crate) fn open(specs: &[PathBuf], opts: &OpenOptions, remote: &RemoteArgs) -> anyhow::Result<Source> {
    let source = open_quietly(specs, opts, remote)?;
    warn_unused_indexes(&source);
    Ok(source)
}

/// Says on standard error which traces are scanned because their index cannot be used, and why.
pub(crate) fn warn_unused_indexes(source: &Source) {
    for e in source.unused_indexes() {
        eprintln!("pcaptool: warning: {}; scanning the trace instead", pcaptool_packet::Chain(e));
    }
}

/// One part of an answer before it is opened.
enum Part {
    Local(PathBuf),
    Remote(String, RemoteSource),
}

fn open_quietly(specs: &[PathBuf], opts: &OpenOptions, remote: &RemoteArgs) -> anyhow::Result<Source> {
    let mut parts: Vec<Part> = Vec::new();
    let mut creds = None;
    let mut creds = || -> anyhow::Result<Credentials> {
        if creds.is_none() {
            creds = Some(remote.credentials()?);
        }
        Ok(creds.clone().expect("made above"))
    };
    for spec in specs {
        if !is_remote_or_list(spec) {
            parts.extend(
                crate::inputs::expand(std::slice::from_ref(spec))?.into_iter().map(|i| Part::Local(i.path().into())),
            );
            continue;
        }
        let text = spec.to_string_lossy();
        for item in text.split(',').map(str::trim) {
            if item.is_empty() {
                anyhow::bail!("{text:?} has an empty item: separate sources with single commas");
            }
            if let Some(file) = item.strip_prefix('@') {
                let file = Path::new(file);
                let body = std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read the sensors file {}", file.display()))?;
                for sensor in parse_sensors(&body, file)? {
                    parts.push(Part::Remote(sensor.name.clone(), sensor.source(&creds()?)?));
                }
            } else if Endpoint::is_address(item) {
                let r = RemoteSource::new(item.parse()?, &creds()?)?;
                parts.push(Part::Remote(r.endpoint().to_string(), r));
            } else {
                let local = crate::inputs::expand(&[PathBuf::from(item)])?;
                parts.extend(local.into_iter().map(|i| Part::Local(i.path().into())));
            }
        }
    }
    if parts.len() == 1 && !remote.partial {
        return Ok(match parts.pop().expect("one part") {
            Part::Local(p) => Source::open_with(&p, opts)?,
            Part::Remote(_, r) => Source::remote(Arc::new(r)),
        });
    }
    if parts.len() == 1 {
        anyhow::bail!("--partial is for several sources (a comma-separated list, @FILE of sensors, or several paths)");
    }
    let mut named: Vec<(String, Arc<Source>)> = Vec::new();
    for part in parts {
        let (name, source) = match part {
            Part::Local(p) => (p.display().to_string(), Source::open_with(&p, opts)?),
            Part::Remote(name, r) => (name, Source::remote(Arc::new(r))),
        };
        if named.iter().any(|(n, _)| *n == name) {
            anyhow::bail!("{name} is named twice");
        }
        named.push((name, Arc::new(source)));
    }
    Ok(Source::merged(named, remote.partial))
}
