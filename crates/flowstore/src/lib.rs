//! Flow-clustered packet storage with two-stage indexes (after FloSIS: Lee et al., USENIX ATC 2015).
//!
//! A store is a directory of segments. Each segment is a pcap file that tcpdump and Wireshark open as it is, in
//! which the packets of each flow stand together (one connection comes back with one sequential read), and an
//! index in two stages: stage 1 (time range, Bloom filters of addresses and ports, kept in memory for every
//! segment) rules a segment out without reading it; stage 2 (the flow table and sorted arrays of addresses and
//! ports) finds the flows by binary search. Every packet keeps its position in the original order, so results
//! come back in that order. Formats: docs/format/segment.md.
//!
//! The store knows conditions on fields ([`pcaptool_packet::Need`]), not filter syntax: the caller derives them
//! from a filter and runs the filter on what the store returns (a superset of the matches).
//!
//! One process writes a store at a time ([`Store::create`], [`Store::open_writer`]: they take its writer lock,
//! and a second writer gets [`StoreError::Locked`] naming the first); any number read it ([`Store::open`]), which
//! changes nothing, sees the segments complete when it opened the store, and is never disturbed by the writer.
//! Every block of packet data is checked against its CRC-32C before it is used: damage is an error naming the
//! file and byte range ([`StoreError::DataChecksum`]), or with [`Store::set_skip_damaged`] the segment is left out
//! of the answer. What a store promises, and how each promise is tested: docs/guarantees.md.
//!
//! ```no_run
//! use std::path::Path;
//! use pcaptool_flowstore::{ImportOptions, Store};
//! use pcaptool_packet::Need;
//!
//! let mut store = Store::create(Path::new("store"))?; // the writer lock, until `store` is dropped
//! store.import(Path::new("trace.pcap"), &ImportOptions::default(), &mut |_| {})?;
//! drop(store);
//! let store = Store::open(Path::new("store"))?; // a reader
//! store.query(&Need::All, &mut |p| {
//!     println!("{} {} {} {}", p.seq, p.ts_ns, p.wirelen, p.data.len());
//!     true
//! })?;
//! # Ok::<(), pcaptool_flowstore::StoreError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod blocks;
mod bloom;
mod codec;
mod compact;
mod dataout;
mod dedup;
mod error;
pub mod flow;
mod format;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod import;
mod ingest;
mod lock;
mod maintain;
pub mod segment;
mod stage1;
mod stage2;
mod store;
mod sums;
mod writer;

pub use blocks::{Codec, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, ZSTD_DEFAULT_LEVEL};
pub use bloom::Bloom;
pub use compact::CompactStats;
pub use error::{LockHolder, StoreError};
pub use flow::{ConnState, Flow, FlowTracker, Side};
pub use import::trace_identity;
pub use ingest::{Incoming, Ingest, MAX_OPEN};
pub use lock::LOCK_FILE;
pub use maintain::{SegmentCheck, VerifyReport};
pub use segment::{FlowEntry, Segment, Stage2, StoredPacket};
pub use stage1::{SegmentIface, SourceMark, Stage1, StoreMeta};
pub use store::{DamagedSegment, ImportOptions, ImportStats, QUARANTINE, QueryStats, Store, is_store_dir};
