//! What can go wrong when opening a source, planning or running a request.

use std::io;
use std::path::PathBuf;

use pcaptool_packet::LinkType;

/// An error of the engine. Each variant carries the facts (the file, the flow, the link type); the cause, when
/// there is one, is [`std::error::Error::source`] and is not repeated in the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A trace could not be opened or its header read.
    #[error("cannot open {}", path.display())]
    Open {
        /// The trace.
        path: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_packet::TraceError,
    },
    /// A trace could not be read while answering (other than damage that ends it, which is reported in
    /// [`crate::Outcome::damage`]).
    #[error("cannot read {}", path.display())]
    Read {
        /// The trace.
        path: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_packet::TraceError,
    },
    /// A file could not be opened or read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The filter does not parse.
    #[error("invalid filter")]
    Filter(#[source] pcaptool_query::FilterError),
    /// The filter parses but means nothing for a link type of the source (as tcpdump refuses it).
    #[error("invalid filter for link type {linktype}")]
    FilterForLinkType {
        /// The link type.
        linktype: LinkType,
        /// Why.
        #[source]
        source: pcaptool_query::FilterError,
    },
    /// The trace's index cannot be used: damaged, of another version, or of another trace.
    #[error("cannot use the index {}; or query with --scan", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_index::IndexError,
    },
    /// Building a trace's index failed.
    #[error("cannot build the index {}", path.display())]
    IndexBuild {
        /// The index file.
        path: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_index::IndexError,
    },
    /// The index says something the trace contradicts.
    #[error(
        "{} does not describe {} as it is now ({mismatch}); rebuild it with `pcaptool index`",
        index.display(),
        trace.display()
    )]
    IndexMismatch {
        /// The index file.
        index: PathBuf,
        /// The trace.
        trace: PathBuf,
        /// What differs.
        mismatch: Mismatch,
    },
    /// A flow store could not be opened.
    #[error("cannot open the store {}", dir.display())]
    OpenStore {
        /// The store directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_flowstore::StoreError,
    },
    /// A flow store could not be read while answering.
    #[error("{}", store_context(dir, source))]
    Store {
        /// The store directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_flowstore::StoreError,
    },
    /// The store holds no packets.
    #[error("the store {} holds no packets: import traces with `pcaptool import`", dir.display())]
    EmptyStore {
        /// The store directory.
        dir: PathBuf,
    },
    /// The store has no flow of this id.
    #[error("the store {} has no flow {id}: `pcaptool flows {}` lists them", dir.display(), dir.display())]
    NoFlow {
        /// The store directory.
        dir: PathBuf,
        /// The flow asked for.
        id: u64,
    },
    /// A flow id was asked of a trace: flows are a store's.
    #[error("--flow needs a flow store: {} is not a directory (see `pcaptool import`)", path.display())]
    FlowNeedsStore {
        /// The trace.
        path: PathBuf,
    },
    /// The time window is empty.
    #[error("--after must be earlier than --before: the window is empty")]
    EmptyWindow,
    /// A part of a merged source failed (see [`Source::merged`](crate::Source::merged)).
    #[error("{name}")]
    Part {
        /// The part's name.
        name: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A remote source failed: it could not be reached, refused the request or broke off its answer.
    #[error("{name}")]
    Remote {
        /// The remote source's name (its address).
        name: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No part of a merged source could answer.
    #[error("no source could answer")]
    NoParts,
    /// A part of a merged source stopped without an answer (its thread panicked).
    #[error("the source stopped without an answer")]
    PartLost,
    /// The request's [`Cancel`](crate::Cancel) was set before the answer was complete.
    #[error("the request was cancelled")]
    Cancelled,
    /// A trace given as a stream (standard input) was asked a second time.
    #[error("{} is a stream and was read by an earlier request: open it again", path.display())]
    Consumed {
        /// The stream's name.
        path: PathBuf,
    },
    /// The output cannot hold the answer or could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// What differs between an index and its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The index's record offsets do not lead to records of the trace.
    Structure(String),
    /// Packet `at` is not the one the index describes.
    Packet {
        /// The packet's position in the trace.
        at: u64,
    },
    /// The index describes packet `described`, but the trace ends after `packets` packets.
    Ends {
        /// A packet the index describes.
        described: u64,
        /// Packets in the trace.
        packets: u64,
    },
    /// The index says the trace is damaged at byte `offset`, but it is not.
    NoDamage {
        /// Where the index says the damage is.
        offset: u64,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Structure(why) => write!(f, "{why}"),
            Mismatch::Packet { at } => write!(f, "packet {at} differs"),
            Mismatch::Ends { described, packets } => {
                write!(f, "it describes packet {described}, but the trace ends after {packets} packets")
            }
            Mismatch::NoDamage { offset } => write!(f, "it says the trace is damaged at byte {offset}, but it is not"),
        }
    }
}

fn store_context(dir: &std::path::Path, e: &pcaptool_flowstore::StoreError) -> String {
    if e.is_damage() {
        format!(
            "the answer would miss packets of the store {}: --skip-damaged answers from the other segments, \
             `pcaptool verify {}` checks the whole store, `pcaptool repair {}` sets damaged segments aside",
            dir.display(),
            dir.display(),
            dir.display()
        )
    } else {
        format!("cannot read the store {}", dir.display())
    }
}

/// An output that cannot take the answer, or failed to take it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Writing failed.
    #[error("cannot write {to}")]
    Write {
        /// The output's name (a path, or "standard output").
        to: String,
        /// Why.
        #[source]
        source: pcaptool_packet::WriteError,
    },
    /// Creating or finishing the output failed.
    #[error("cannot write {to}")]
    Io {
        /// The output's name.
        to: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The chosen container cannot hold the answer's link types (pcap holds one).
    #[error(
        "{to} is a pcap file, which holds one link type, and the answer has {}: write pcapng (a `.pcapng` name or \
         --format pcapng)",
        linktypes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    OneLinkType {
        /// The output's name.
        to: String,
        /// The link types of the answer.
        linktypes: Vec<LinkType>,
    },
}

impl SinkError {
    /// Whether the output was a pipe whose reader went away (the end of `| head`, not a failure).
    pub fn is_broken_pipe(&self) -> bool {
        match self {
            SinkError::Write { source: pcaptool_packet::WriteError::Io(e), .. } | SinkError::Io { source: e, .. } => {
                e.kind() == io::ErrorKind::BrokenPipe
            }
            _ => false,
        }
    }
}

impl Error {
    /// Whether this is the end of a pipe whose reader went away.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Sink(s) if s.is_broken_pipe())
    }

    /// Whether the error is damage in stored data (a store query that `skip_damaged` would answer).
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Store { source, .. } if source.is_damage())
    }
}
