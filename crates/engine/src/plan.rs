//! The plan of an answer as data: what the engine will read and why, serialisable to JSON (`--explain`).

use serde::{Deserialize, Serialize};

/// How a request will be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Strategy {
    /// Every record of the trace, in order, the filter on each.
    Scan,
    /// Every chunk of the indexed trace from its first record, chunks in parallel (the index lets two threads
    /// start in the middle of a trace whose record walk is serial).
    ChunkScan,
    /// Only the packets the index selects, the filter on each.
    Index,
    /// Counted from the index; only packets it cannot decide are read.
    IndexCount,
    /// The store's segments that pass stage 1, their flows that pass stage 2.
    Stages,
    /// One flow of a store, one read per segment it spans.
    Flow,
    /// Several sources answered in parallel, their matches merged by timestamp (each part's plan in `parts`).
    Merge,
    /// Asked of a remote service, which answers with its own plan (in `parts`).
    Remote,
}

/// What a plan reads of a trace's index.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IndexPlan {
    /// The index file.
    pub path: String,
    /// Packets it describes.
    pub packets: u64,
    /// Its chunks.
    pub chunks: usize,
    /// Its size in bytes.
    pub bytes: u64,
    /// The condition it answers.
    pub uses: Option<String>,
    /// Candidates the planner expects, from the index's statistics (what the choice between reading them and a
    /// scan weighs).
    pub estimate: Option<u64>,
    /// Chunks with candidates (when the index is read).
    pub chunks_touched: Option<usize>,
    /// Candidate packets (when the index is read).
    pub candidates: Option<u64>,
    /// Bytes of the trace the candidates take (when the index is read).
    pub trace_bytes_to_read: Option<u64>,
}

/// A damaged segment a store query meets.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DamagedPlan {
    /// Its number.
    pub segment: u32,
    /// What is wrong.
    pub why: String,
}

/// What a plan reads of a flow store.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StorePlan {
    /// Segments of the store.
    pub segments: usize,
    /// Packets of the store.
    pub packets: u64,
    /// Segments that may hold matches by their time range and Bloom filters (stage 1).
    pub stage1_passed: usize,
    /// Flows to read (stage 2).
    pub flows: u64,
    /// Packets of no flow to read.
    pub no_flow_packets: u64,
    /// Packets of no flow in the segments stage 1 lets through that their segment's summary rules out.
    pub no_flow_skipped: u64,
    /// Bytes of packet data to read (one read each, checked against its checksums).
    pub bytes_to_read: u64,
    /// Segments that cannot be read.
    pub damaged: Vec<DamagedPlan>,
}

/// The tests a filter compiles to for one link type.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LinkTypePlan {
    /// The link type's number.
    pub linktype: u32,
    /// Its name.
    pub linktype_name: String,
    /// Operations of the compiled program.
    pub operations: usize,
    /// Whether the program is optimised as libpcap optimises it (not a filter holding `protochain`).
    pub optimized: bool,
    /// libpcap's tests, in libpcap's order.
    pub tests: String,
    /// The program's listing, a line an operation.
    pub program: Vec<String>,
}

/// How the engine will answer a request: the parsed filter, the condition an index or a store can answer, the
/// strategy and its estimates, and the tests per link type.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Plan {
    /// The source's path.
    pub source: String,
    /// The source's kind.
    pub kind: crate::SourceKind,
    /// The filter as given.
    pub filter: String,
    /// The filter as parsed.
    pub parsed: String,
    /// What every match satisfies that an index or a store can check (time window included).
    pub index_condition: String,
    /// The strategy.
    pub strategy: Strategy,
    /// The strategy in one sentence, with its reason.
    pub plan: String,
    /// Whether the filter is exactly its index condition (so an index can count without reading).
    pub exact: bool,
    /// The trace's index, when it has one.
    pub index: Option<IndexPlan>,
    /// The store's stages, for a store.
    pub store: Option<StorePlan>,
    /// The compiled tests per link type.
    pub link_types: Vec<LinkTypePlan>,
    /// The plan of each part of a merged source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Plan>,
}
