//! A compressed sidecar index of a pcap or pcapng trace (after pcapWT: Kim et al., Computer Networks 2015), built
//! without rewriting the trace, that answers conditions on header fields with rank/select instead of a scan.
//!
//! Per chunk of packets (1,048,576 by default) the index keeps, each part with its own checksum:
//! - a **key table**: one row per flow (both directions) over the header fields of [`KEY_FIELDS`] (Ethernet
//!   addresses, VLAN id, IPv4/IPv6 addresses, protocol, ports: what stays the same along a flow; key `2·row` one
//!   way, `2·row + 1` the other), column by column, each column a sorted dictionary (so prefixes and ranges are
//!   dictionary ranges) and bit-packed codes;
//! - the **lane of every packet**: flows are laid out in lanes, a lane holding one flow after another, so that a
//!   packet's symbol `2·lane + direction` costs about as many bits as there are flows open at once; one wavelet tree
//!   (`pcaptool-wavelet`) holds them, and per row the flow part keeps its lane and first packet, so a flow's
//!   packets come out by `select` between its start and the next flow of its lane;
//! - the **shape of every packet** (TCP flags and wire-length class) in a second wavelet tree, grouped by lane symbol
//!   (a flow's packets in a row, where RRR bit vectors code its runs of one shape compactly); a conjunction is
//!   driven by its most selective part and the rest checked per candidate;
//! - the **earliest and latest timestamp of every page** of 1024 packets, for time windows;
//! - the **offset of every block** of 16 records: a packet is read by walking at most 15 records from there.
//!
//! A query checks and reads only the parts it needs: a needle query the columns of its fields, the flow part and
//! the lane sequence. The file format is in docs/format/index.md, the measurements in docs/BENCHMARKS.md. Fields
//! are read exactly as [`pcaptool_packet::PacketFields`] defines them, so that a
//! [`Need`](pcaptool_packet::Need) derived from a filter selects a superset of its matches: the caller still runs
//! the filter on every selected packet.
//!
//! ```no_run
//! use std::path::Path;
//! use pcaptool_index::{BuildOptions, IndexFile, build, sidecar_path};
//! use pcaptool_packet::{Field, Need, Pred};
//!
//! let trace = Path::new("trace.pcap");
//! build(trace, &sidecar_path(trace), &BuildOptions::default(), &|_| {})?;
//! let file = IndexFile::open(&sidecar_path(trace))?;
//! file.check_trace(trace, None, u32::MAX, None)?;
//! let index = file.view()?;
//! let sel = index.select(&Need::Pred(Pred::range(Field::DstPort, 53, 53)))?;
//! println!("{} candidate packets", sel.count());
//! # Ok::<(), pcaptool_index::IndexError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod build;
mod chunk;
mod error;
mod file;
mod format;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod keys;
mod lanes;
mod select;
mod shapes;
mod tree;

use std::path::{Path, PathBuf};

pub use build::{BuildOptions, BuildStats, build};
pub use chunk::ChunkView;
pub use error::IndexError;
pub use file::IndexFile;
pub use format::{BLOCK, MAGIC, OLDEST_READ, PAGE, VERSION};
pub use keys::{KEY_FIELDS, LEN_BOUNDS};
pub use select::{Estimated, IndexView, Selection};

/// The index of `trace`: the same path with `.ptidx` appended.
pub fn sidecar_path(trace: &Path) -> PathBuf {
    let mut s = trace.as_os_str().to_owned();
    s.push(".ptidx");
    PathBuf::from(s)
}

/// The code the index header gives a compression (0 none, 1 gzip, 2 zstd, 3 lz4).
pub fn compression_code(c: Option<pcaptool_packet::Compression>) -> u8 {
    build::compression_code(c)
}
