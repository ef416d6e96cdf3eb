//! The sources a service answers from, opened once and kept; a flow store is opened again when its directory
//! changes (a capture closing a segment), so that new segments become queryable without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use pcaptool_engine::{Source, SourceKind};
use serde::Serialize;

use crate::ServeError;

/// One source, by name.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) name: String,
    path: PathBuf,
    /// How it is opened, and opened again.
    opts: pcaptool_engine::OpenOptions,
    current: RwLock<Current>,
}

#[derive(Debug)]
struct Current {
    source: Arc<Source>,
    /// The store directory's modification time when it was opened (`None` for a trace).
    seen: Option<SystemTime>,
}

/// What `GET /v1/stats` says of a source.
#[derive(Debug, Serialize)]
pub(crate) struct SourceStats {
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) segments: Option<usize>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Served {
    fn open(path: &Path, opts: pcaptool_engine::OpenOptions) -> Result<Served, ServeError> {
        let source = Source::open_with(path, &opts)
            .map_err(|source| ServeError::Source { path: path.to_path_buf(), source: Box::new(source) })?;
        let name =
            path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
        let seen = (source.kind() == SourceKind::Store).then(|| modified(path)).flatten();
        Ok(Served {
            name,
            path: path.to_path_buf(),
            opts,
            current: RwLock::new(Current { source: Arc::new(source), seen }),
        })
    }

    /// The source as it is now.
    pub(crate) fn source(&self) -> Arc<Source> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).source.clone()
    }

    /// Opens a store again if its directory changed since; true when it did. A store that cannot be opened
    /// now keeps its last good state (the error is returned, to be logged).
    fn refresh(&self) -> Result<bool, ServeError> {
        let seen = self.current.read().unwrap_or_else(|e| e.into_inner()).seen;
        let Some(seen) = seen else { return Ok(false) };
        let now = modified(&self.path);
        if now.is_none_or(|t| t == seen) {
            return Ok(false);
        }
        let source = Source::open_with(&self.path, &self.opts)
            .map_err(|source| ServeError::Source { path: self.path.clone(), source: Box::new(source) })?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Current { source: Arc::new(source), seen: now };
        Ok(true)
    }

    pub(crate) fn stats(&self) -> SourceStats {
        let source = self.source();
        let mut s = SourceStats {
            name: self.name.clone(),
            kind: match source.kind() {
                SourceKind::Store => "store",
                SourceKind::IndexedTrace => "indexed trace",
                _ => "trace",
            },
            packets: None,
            first_ns: None,
            last_ns: None,
            segments: None,
        };
        if let Some(store) = source.store() {
            let segs = store.segments();
            s.segments = Some(segs.len());
            s.packets = Some(store.packets());
            s.first_ns = segs.iter().filter(|g| g.stage1.packets > 0).map(|g| g.stage1.t_min).min();
            s.last_ns = segs.iter().filter(|g| g.stage1.packets > 0).map(|g| g.stage1.t_max).max();
        } else if let Some(index) = source.index() {
            s.packets = Some(index.packets());
            if let Some((a, b)) = index.time_span() {
                (s.first_ns, s.last_ns) = (Some(a), Some(b));
            }
        }
        s
    }
}

/// The sources of a service, opened once.
#[derive(Debug)]
pub struct Service {
    pub(crate) sources: Vec<Served>,
    /// The counters of a capture writing into a served store in the same process (`pcaptool capture --serve`),
    /// as it last reported them; shown by `GET /v1/stats`.
    capture: std::sync::Mutex<Option<serde_json::Value>>,
}

impl Service {
    /// Opens every source (a trace with its index when it has one, or a flow store); names must differ. Each
    /// store keeps up to [`DEFAULT_INDEX_MEMORY`](pcaptool_engine::DEFAULT_INDEX_MEMORY) of its decoded indexes.
    pub fn open(paths: &[PathBuf]) -> Result<Service, ServeError> {
        Service::open_with(paths, pcaptool_engine::DEFAULT_INDEX_MEMORY)
    }

    /// [`open`](Self::open), each store keeping up to `index_memory` heap bytes of its decoded indexes.
    pub fn open_with(paths: &[PathBuf], index_memory: u64) -> Result<Service, ServeError> {
        let opts = pcaptool_engine::OpenOptions::new().long_lived(true).index_memory(index_memory);
        let mut sources: Vec<Served> = Vec::new();
        for p in paths {
            let s = Served::open(p, opts)?;
            for e in s.source().unused_indexes() {
                let why = pcaptool_packet::Chain(e).to_string();
                crate::http::log(&serde_json::json!({ "event": "index_unused", "source": s.name, "why": why }));
            }
            if let Some(other) = sources.iter().find(|o| o.name == s.name) {
                return Err(ServeError::Config(format!(
                    "{} and {} are both named {}: serve sources whose file names differ",
                    other.path.display(),
                    p.display(),
                    s.name
                )));
            }
            sources.push(s);
        }
        Ok(Service { sources, capture: std::sync::Mutex::new(None) })
    }

    /// Records a running capture's counters (JSON), shown under `capture` by `GET /v1/stats`.
    pub fn set_capture_stats(&self, counters: serde_json::Value) {
        *self.capture.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(counters);
    }

    /// The capture's counters last recorded, if a capture reports them.
    pub fn capture_stats(&self) -> Option<serde_json::Value> {
        self.capture.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The names of the sources, in the order given.
    pub fn names(&self) -> Vec<&str> {
        self.sources.iter().map(|s| s.name.as_str()).collect()
    }

    /// The source a request names: one name, several joined with commas (merged by timestamp), or every
    /// source when `name` is `None`. Returns the name shown and the source.
    pub(crate) fn find(&self, name: Option<&str>) -> Result<(String, Arc<Source>), String> {
        let chosen: Vec<&Served> = match name {
            None => self.sources.iter().collect(),
            Some(list) => list
                .split(',')
                .map(|n| self.sources.iter().find(|s| s.name == n).ok_or_else(|| format!("no source named {n:?}")))
                .collect::<Result<_, _>>()?,
        };
        match chosen.as_slice() {
            [] => Err("name a source".to_string()),
            [one] => Ok((one.name.clone(), one.source())),
            many => {
                let parts: Vec<(String, Arc<Source>)> = many.iter().map(|s| (s.name.clone(), s.source())).collect();
                let name = parts.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join(",");
                Ok((name, Arc::new(Source::merged(parts, false))))
            }
        }
    }

    /// Opens again every store whose directory changed; the names of those opened again, and errors.
    pub fn refresh(&self) -> Vec<Result<String, ServeError>> {
        self.sources
            .iter()
            .filter_map(|s| match s.refresh() {
                Ok(true) => Some(Ok(s.name.clone())),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            })
            .collect()
    }

    /// How often stores are looked at for new segments.
    pub(crate) const WATCH: Duration = Duration::from_millis(500);
}
