//! One source type over every kind of packet collection.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::merge::Merged;
use crate::plan::Plan;
use crate::store::StoreSource;
use crate::trace::TraceSource;
use crate::{Error, Outcome, Progress, Request, Sink};

/// The kind of a [`Source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SourceKind {
    /// A pcap or pcapng trace (possibly compressed, or a stream) without an index.
    Trace,
    /// A trace with its index (`TRACE.ptidx`).
    IndexedTrace,
    /// A flow store directory.
    Store,
    /// Several sources answered as one ([`Source::merged`]).
    Merged,
    /// A source answered elsewhere ([`Source::remote`]).
    Remote,
}

/// How to open a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenOptions {
    /// Use a trace's index when it has one (default true; false scans and does not check the index).
    pub use_index: bool,
    /// Answer from a store's undamaged segments when some are damaged (the skipped ones are reported in
    /// [`Outcome::skipped`]); by default a damaged segment fails the answer.
    pub skip_damaged: bool,
    /// The source will answer many requests (a service): keep a trace's mapping between them and read an index's
    /// candidates through it, so that each page fault is paid once in the source's life. By default (a command
    /// that answers once) few candidates are read with `pread`, which costs less than faulting pages into a new
    /// mapping.
    pub long_lived: bool,
    /// For a long-lived store: the heap bytes it may keep of its segments' flow tables and sorted arrays once
    /// decoded ([`DEFAULT_INDEX_MEMORY`] by default; see `Store::keep_indexes`).
    pub index_memory: u64,
}

/// What a long-lived store keeps of its decoded indexes unless told otherwise: 512 MiB, the flow tables of some
/// 2.5 million flows (about 200 bytes each decoded).
pub const DEFAULT_INDEX_MEMORY: u64 = 512 << 20;

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions { use_index: true, skip_damaged: false, long_lived: false, index_memory: DEFAULT_INDEX_MEMORY }
    }
}

impl OpenOptions {
    /// The defaults: use the index, fail on damage.
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Whether to use a trace's index.
    pub fn use_index(mut self, yes: bool) -> OpenOptions {
        self.use_index = yes;
        self
    }

    /// Whether the source will answer many requests (see [`OpenOptions::long_lived`]).
    pub fn long_lived(mut self, yes: bool) -> OpenOptions {
        self.long_lived = yes;
        self
    }

    /// The heap bytes a long-lived store may keep of its decoded indexes (see [`OpenOptions::index_memory`]).
    pub fn index_memory(mut self, bytes: u64) -> OpenOptions {
        self.index_memory = bytes;
        self
    }

    /// Whether to skip a store's damaged segments.
    pub fn skip_damaged(mut self, yes: bool) -> OpenOptions {
        self.skip_damaged = yes;
        self
    }
}

/// A collection of packets to ask: a trace (with its index, when it has one) or a flow store.
///
/// Opening does the once-per-source work (a trace's header and index, a store's segment list); every
/// [`plan`](Source::plan) and [`run`](Source::run) after reuses it, so a long-running program keeps sources
/// open between requests.
#[derive(Debug)]
pub struct Source {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Trace(Box<TraceSource>),
    Store(StoreSource),
    Merged(Merged),
    Remote(Arc<dyn crate::Remote>, PathBuf),
}

impl Source {
    /// Opens `path` with the default options: a directory is a flow store, `-` standard input, anything else a
    /// trace file.
    pub fn open(path: impl AsRef<Path>) -> Result<Source, Error> {
        Source::open_with(path, &OpenOptions::default())
    }

    /// Opens `path` with `opts`.
    pub fn open_with(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Source, Error> {
        let path = path.as_ref();
        let inner = if path.is_dir() {
            Inner::Store(StoreSource::open(path, opts.skip_damaged, opts.long_lived.then_some(opts.index_memory))?)
        } else {
            Inner::Trace(Box::new(TraceSource::open(path, opts.use_index, opts.long_lived)?))
        };
        Ok(Source { inner })
    }

    /// Sources answered as one, each named: their matches merged by timestamp (ties in the order given), as
    /// one trace holding all their packets would answer. Each part answers on a thread of its own, into a
    /// bounded channel, so memory holds a few batches a part. The output's interfaces are every part's; it is
    /// pcap when the parts are pcap of one link type. Without `partial`, a part that fails fails the answer
    /// ([`Error::Part`], naming it); with it, the others answer and [`Outcome::failed`] names those left out.
    pub fn merged(parts: Vec<(String, Arc<Source>)>, partial: bool) -> Source {
        Source { inner: Inner::Merged(Merged::new(parts, partial)) }
    }

    /// A source answered elsewhere (a `pcaptool serve` reached by `pcaptool_remote`): every request is sent to
    /// it, and its answer taken as a local source's. Remote sources merge with others by [`Source::merged`].
    pub fn remote(remote: Arc<dyn crate::Remote>) -> Source {
        let name = PathBuf::from(remote.name());
        Source { inner: Inner::Remote(remote, name) }
    }

    /// What it is.
    pub fn kind(&self) -> SourceKind {
        match &self.inner {
            Inner::Trace(t) => t.kind(),
            Inner::Store(_) => SourceKind::Store,
            Inner::Merged(_) => SourceKind::Merged,
            Inner::Remote(..) => SourceKind::Remote,
        }
    }

    /// The path it was opened from (a merged source's: its parts' names, joined with commas).
    pub fn path(&self) -> &Path {
        match &self.inner {
            Inner::Trace(t) => t.path(),
            Inner::Store(s) => s.store().dir(),
            Inner::Merged(m) => m.path(),
            Inner::Remote(_, name) => name,
        }
    }

    /// The flow store, if this is one (for what only a store has: flows, segments, damage).
    pub fn store(&self) -> Option<&pcaptool_flowstore::Store> {
        match &self.inner {
            Inner::Store(s) => Some(s.store()),
            Inner::Trace(_) | Inner::Merged(_) | Inner::Remote(..) => None,
        }
    }

    /// The trace's index, if this is an indexed trace.
    pub fn index(&self) -> Option<&pcaptool_index::IndexFile> {
        match &self.inner {
            Inner::Trace(t) => t.index_file(),
            Inner::Store(_) | Inner::Merged(_) | Inner::Remote(..) => None,
        }
    }

    /// The indexes found beside traces but left unused, and why (stale: the trace changed since; damaged; of
    /// another format): those traces are scanned instead, which gives the same answer more slowly. A program
    /// should tell its user, who can rebuild them with `pcaptool index`.
    pub fn unused_indexes(&self) -> Vec<&pcaptool_index::IndexError> {
        match &self.inner {
            Inner::Trace(t) => t.unused_index().into_iter().collect(),
            Inner::Merged(m) => m.parts().iter().flat_map(|(_, p)| p.unused_indexes()).collect(),
            Inner::Store(_) | Inner::Remote(..) => Vec::new(),
        }
    }

    /// The flows of a store that `req`'s filter may match, in id order: those whose keys pass the filter's
    /// necessary condition (a superset of the flows with a matching packet), within the time window. A trace
    /// has no flow table: [`Error::FlowNeedsStore`].
    pub fn flows(&self, req: &Request) -> Result<Vec<crate::FlowRecord>, Error> {
        match &self.inner {
            Inner::Store(s) => s.flows(req),
            Inner::Trace(t) => Err(Error::FlowNeedsStore { path: t.path().to_path_buf() }),
            Inner::Merged(m) => m.flows(req),
            Inner::Remote(r, _) => r.flows(req),
        }
    }

    /// How `req` would be answered, without reading packets.
    pub fn plan(&self, req: &Request) -> Result<Plan, Error> {
        match &self.inner {
            Inner::Trace(t) => t.plan(req),
            Inner::Store(s) => s.plan(req),
            Inner::Merged(m) => m.plan(req),
            Inner::Remote(r, name) => {
                let theirs = r.plan(req)?;
                Ok(Plan {
                    source: name.display().to_string(),
                    kind: SourceKind::Remote,
                    strategy: crate::Strategy::Remote,
                    plan: format!("asked of {}, which answers by its own plan", name.display()),
                    index: None,
                    store: None,
                    parts: vec![theirs.clone()],
                    ..theirs
                })
            }
        }
    }

    /// Answers `req`, giving the matches to `sink` in the source's order.
    pub fn run(&self, req: &Request, sink: &mut dyn Sink) -> Result<Outcome, Error> {
        self.run_with_progress(req, sink, &())
    }

    /// [`Source::run`], telling `progress` how far it has come.
    pub fn run_with_progress(
        &self,
        req: &Request,
        sink: &mut dyn Sink,
        progress: &dyn Progress,
    ) -> Result<Outcome, Error> {
        let result = match &self.inner {
            Inner::Trace(t) => t.run(req, sink, progress),
            Inner::Store(s) => s.run(req, sink),
            Inner::Merged(m) => m.run(req, sink),
            Inner::Remote(r, _) => {
                req.check()?;
                r.run(req, sink)
            }
        };
        if result.is_err() {
            // Whatever failed (the filter for a link type met on the way, a read, the output), the sink removes
            // what it wrote: no partial answer looks like a whole one.
            sink.abandon();
        }
        result
    }

    /// The number of packets `req` selects.
    pub fn count(&self, req: &Request) -> Result<u64, Error> {
        let req = req.clone().count_only(true);
        Ok(self.run(&req, &mut crate::Counter::default())?.matched)
    }
}
