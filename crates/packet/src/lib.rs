//! The packet core of pcaptool: read any capture, decode its headers without panicking, write captures that
//! tcpdump and Wireshark open.
//!
//! - [`TraceReader`] opens pcap and pcapng files by their magic (either byte order, µs or ns, pcapng sections and
//!   interfaces with their own link types and timestamp resolutions), memory-maps them, decompresses gzip, zstd
//!   and lz4 on a thread of its own, and reads standard input. [`Records`] is the zero-copy iterator over a capture
//!   held in memory. Every record carries its timestamp in nanoseconds, lengths, interface, link type and byte
//!   offset. Damage ends the iteration with a [`TraceError`] naming the file, the offset and the problem, after
//!   every complete record before it.
//! - [`decode`] is a lax decoder from link layer to transport and tunnels; see [`Decoded`].
//! - [`PacketFields`] reads the header fields a packet index stores, as libpcap's filters read them ([`Field`]).
//! - [`FlowKey`] is the canonical bidirectional 5-tuple plus VLAN.
//! - [`PcapWriter`], [`PcapNgWriter`] and [`TraceWriter`] write captures; [`Compressor`] compresses them.
//!
//! ```
//! use pcaptool_packet::{decode, LinkType, PcapWriter, Records, TsPrecision};
//!
//! // Write a one-packet pcap in memory, then read it back and decode it.
//! let frame = [0u8; 14];
//! let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano)?;
//! w.write_packet(1_700_000_000_123_456_789, 14, &frame)?;
//! let file = w.finish()?;
//! for rec in Records::new(&file) {
//!     let rec = rec?;
//!     assert_eq!(rec.ts_ns, 1_700_000_000_123_456_789);
//!     let d = decode(rec.linktype, rec.data);
//!     assert!(d.eth.is_some());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod decode;
mod error;
mod fields;
mod flow;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod read;
mod sys;
mod time;
mod types;
mod write;

pub use decode::{
    Arp, Decoded, Ethernet, Fragment, Ip, Layer, MAX_TAGS, Stop, StopReason, Transport, Tunnel, TunnelKind, decode,
    decode_from,
};
pub use error::{Chain, ErrorKind, TraceError, WriteError};
pub use fields::{Field, FieldReader, FieldValue, Need, PacketFields, Pred};
pub use flow::{Direction, FlowKey, FlowTuple, PlainFlow, plain_flow};
pub use read::{
    Compression, FileFormat, Interface, MAX_SNAPLEN, Peek, ReadOptions, Record, Records, Seeker, TraceReader,
    TsResolution, max_caplen,
};
pub use sys::{MappedFile, prefetch, prefetch_item, touch};
pub use time::{Rfc3339, TimeParseError, parse_time};
pub use types::{EtherType, IpProto, LinkType, TsPrecision};
pub use write::{Compressor, OutputFormat, PcapNgWriter, PcapWriter, TraceWriter, pcap_record_header, precision_for};
