//! Retrieval over packet traces, their indexes and flow stores, with tcpdump's filter semantics.
//!
//! A [`Source`] is opened from a path: a pcap or pcapng trace (its index `TRACE.ptidx` loaded and checked when
//! it has one, see `pcaptool_index`), or a flow store directory (see `pcaptool_flowstore`). A [`Request`] says
//! which packets: a filter in tcpdump's language, a time window, a flow, a limit. [`Source::plan`] tells how
//! the engine would answer, as data ([`Plan`], serialisable to JSON); [`Source::run`] answers, giving the
//! matching records to a [`Sink`] in the source's order: a [`TraceSink`] writing pcap or pcapng, a [`Counter`],
//! a [`ChannelSink`], or the caller's closure ([`FnSink`]). The packets are exactly those tcpdump's filter
//! selects on the same trace, and the index path gives the same bytes as the scan.
//!
//! The engine chooses how to answer by cost: through the index when its candidates are few and close enough
//! together, a scan otherwise; for a store, stage 1 (time range, Bloom filters) and stage 2 (flow tables) choose
//! the segments and flows to read.
//!
//! # A trace
//!
//! ```
//! use pcaptool_engine::{Counter, Request, Source};
//!
//! let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tunnels.pcap");
//! let source = Source::open(trace)?;
//! let mut counter = Counter::default();
//! let outcome = source.run(&Request::filter("ip")?, &mut counter)?;
//! assert_eq!(outcome.matched, counter.records);
//! assert!(counter.records > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # An indexed trace
//!
//! ```
//! use pcaptool_engine::{FnSink, Request, Source, SourceKind, Strategy};
//!
//! let dir = std::env::temp_dir().join(format!("engine-doc-index-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let trace = dir.join("t.pcap");
//! std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tunnels.pcap"), &trace)?;
//! pcaptool_engine::index_trace(&trace, None, &|_| ())?; // writes t.pcap.ptidx, as `pcaptool index` does
//!
//! let source = Source::open(&trace)?;
//! assert_eq!(source.kind(), SourceKind::IndexedTrace);
//! let req = Request::filter("udp")?;
//! let plan = source.plan(&req)?;
//! assert!(plan.index.is_some());
//! let mut times = Vec::new();
//! source.run(&req, &mut FnSink(|rec: &pcaptool_packet::Record<'_>, _: &[pcaptool_packet::Interface]| {
//!     times.push(rec.ts_ns);
//!     true
//! }))?;
//! // The same packets as a scan that ignores the index.
//! let scan = Source::open_with(&trace, &pcaptool_engine::OpenOptions::new().use_index(false))?;
//! assert_eq!(scan.plan(&req)?.strategy, Strategy::Scan);
//! assert_eq!(scan.count(&req)?, times.len() as u64);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # A flow store
//!
//! ```
//! use pcaptool_engine::{Request, Source, TraceSink, WriteOptions};
//! use pcaptool_flowstore::{ImportOptions, Store};
//!
//! let dir = std::env::temp_dir().join(format!("engine-doc-store-{}", std::process::id()));
//! let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tunnels.pcap");
//! Store::create(&dir.join("store"))?.import(trace.as_ref(), &ImportOptions::default(), &mut |_| ())?;
//!
//! let source = Source::open(dir.join("store"))?;
//! let out = dir.join("answer.pcap");
//! let mut sink = TraceSink::create(&out, WriteOptions::new())?;
//! let outcome = source.run(&Request::filter("ip")?, &mut sink)?;
//! // The same packets as the trace gives.
//! assert_eq!(outcome.matched, Source::open(trace)?.count(&Request::filter("ip")?)?);
//! assert_eq!(&std::fs::read(&out)?[..4], &[0xd4, 0xc3, 0xb2, 0xa1]); // a pcap file
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod flows;
mod matchers;
mod merge;
mod plan;
mod positional;
mod remote;
mod request;
mod sink;
mod source;
mod store;
mod trace;

pub use error::{Error, Mismatch, SinkError};
pub use flows::FlowRecord;
pub use matchers::{snap_for, snapshot};
pub use plan::{DamagedPlan, IndexPlan, LinkTypePlan, Plan, StorePlan, Strategy};
pub use positional::Positional;
pub use remote::Remote;
pub use request::{Cancel, Outcome, Progress, Request};
pub use sink::{
    ChannelSink, Container, Counter, FnSink, Layout, NativeFormat, OwnedRecord, Sink, TraceSink, WriteOptions,
    compression_for_name, container_for_name,
};
pub use source::{DEFAULT_INDEX_MEMORY, OpenOptions, Source, SourceKind};
pub use trace::index_trace;
