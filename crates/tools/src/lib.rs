//! Trace tools in the spirit of editcap, mergecap, reordercap and libtrace's tools, each streaming with bounded
//! memory and keeping nanoseconds and interfaces:
//!
//! - [`anon`]: prefix-preserving IP address anonymisation (Crypto-PAn), keyed MAC addresses, payload truncation,
//!   with IP, TCP, UDP and ICMPv6 checksums kept as valid (or as invalid) as they were;
//! - [`dedup`]: duplicate packets within a window of packets or of time, as `editcap -d/-D/-w`;
//! - [`split`]: one trace into many by packets, bytes, time interval or flow;
//! - [`sort`]: a trace in time order (runs sorted in memory, spilled, merged), as `reordercap`;
//! - [`stats`]: packets and bytes per filter and per interval, as libtrace's `tracestats`.
//!
//! Merging traces by time is the engine's ([`pcaptool_engine::Source::merged`]).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod anon;
pub mod dedup;
pub mod sort;
pub mod split;
pub mod stats;

mod pipe;

pub use pipe::{Copied, Emit, Step, copy_through};

use std::path::PathBuf;

/// What a tool could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// Opening or reading a trace failed.
    #[error("cannot read {}", path.display())]
    Read {
        /// The trace.
        path: PathBuf,
        /// Why.
        #[source]
        source: pcaptool_packet::TraceError,
    },
    /// Writing an output failed.
    #[error(transparent)]
    Write(#[from] pcaptool_engine::SinkError),
    /// A file operation failed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A key file or key text is not a key.
    #[error("{0}")]
    Key(String),
    /// The engine failed (merging the runs of a sort).
    #[error(transparent)]
    Engine(#[from] pcaptool_engine::Error),
    /// A filter does not parse.
    #[error("invalid filter {name:?}: {why}")]
    Filter {
        /// The filter's name.
        name: String,
        /// The parser's message.
        why: String,
    },
}
