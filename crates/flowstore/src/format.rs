//! The segment format's constants and the codecs its parts share (docs/format/segment.md): file names, address
//! keys, the entry of packets of no flow.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use pcaptool_packet::{FlowKey, IpProto};

use crate::blocks::Codec;
use crate::flow::{ConnState, Flow, Side};

/// First bytes of a segment index.
pub const MAGIC: [u8; 4] = *b"PTSG";
/// Format version of the segment indexes written (versions 2, without data checksums, 3, with a Bloom filter of
/// flow ids, blocks of 256 flows and no summary of the packets of no flow, 4, with timestamps always in
/// nanoseconds, 5, whose flows do not say whether an IPv6 extension header puts another IP protocol where
/// filters read it, 6, whose data is always plain pcap, 7, with one summary of the packets of no flow, and 8,
/// whose deduplicated data's elisions have no checkpoints, are still read).
pub const VERSION: u16 = 9;
/// Interfaces a segment holds at most (a packet's index among them takes 16 bits in the writer).
pub const MAX_IFACES: usize = 1 << 16;
/// False-positive rate the port Bloom filter is sized for.
pub const BLOOM_FPR: f64 = 0.01;
/// False-positive rate the address Bloom filter is sized for: an absent host then opens stage 2 of one segment in
/// a thousand (at 1%, one of 13 segments of the real-traffic bench trace let an absent host through, which took
/// its lookup in a new process from 2.0 to 2.8 ms); 50% more bits, 0.011% of the stored bytes there.
pub const ADDR_BLOOM_FPR: f64 = 0.001;
/// Bytes of a segment index's header.
pub(crate) const HEADER_LEN: usize = 24;

/// The 17-byte key of an IPv4 address (family byte 4, then the address).
pub(crate) fn v4_key(v: u128) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = 4;
    k[1..5].copy_from_slice(&(v as u32).to_be_bytes());
    k
}

/// The 17-byte key of an IPv6 address (family byte 6, then the address).
pub(crate) fn v6_key(v: u128) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = 6;
    k[1..17].copy_from_slice(&v.to_be_bytes());
    k
}

/// The 17-byte key of an address (the inverse of [`ip_of`]).
pub(crate) fn key_of(a: IpAddr) -> [u8; 17] {
    match a {
        IpAddr::V4(v) => v4_key(u128::from(u32::from(v))),
        IpAddr::V6(v) => v6_key(u128::from(v)),
    }
}

/// The bytes a Bloom filter holds for an address key: 4 for IPv4, 16 for IPv6.
pub(crate) fn bloom_bytes(k: &[u8; 17]) -> &[u8] {
    if k[0] == 4 { &k[1..5] } else { &k[1..17] }
}

/// The flow entry that holds a segment's packets of no flow.
pub(crate) fn no_flow() -> Flow {
    let zero = IpAddr::from([0u8; 4]);
    Flow {
        id: u64::MAX,
        key: FlowKey { lo_addr: zero, hi_addr: zero, lo_port: 0, hi_port: 0, proto: IpProto(0), vlan: 0 },
        orig_is_lo: true,
        first_ns: u64::MAX,
        last_ns: 0,
        orig: Side::default(),
        resp: Side::default(),
        state: ConnState::Oth,
    }
}

/// The data and index paths of segment `number` in `dir`.
pub fn segment_paths(dir: &Path, number: u32) -> (PathBuf, PathBuf) {
    (dir.join(format!("seg-{number:06}.pcap")), dir.join(format!("seg-{number:06}.ptsx")))
}

/// The name of a segment's data file (see [`Stage1::data_file_name`](crate::Stage1::data_file_name)).
pub(crate) fn data_file_name(number: u32, generation: u32, codec: Codec) -> String {
    match generation {
        0 => format!("seg-{number:06}.pcap{}", codec.suffix()),
        g => format!("seg-{number:06}.{g}.pcap{}", codec.suffix()),
    }
}

/// Whether the part of a file name after `seg-NNNNNN.` names a data file: `pcap`, `G.pcap`, either with `.lz4`
/// or `.zst` after it.
pub(crate) fn is_data_ext(ext: &str) -> bool {
    let ext = ext.strip_suffix(".lz4").or_else(|| ext.strip_suffix(".zst")).unwrap_or(ext);
    let ext = match ext.split_once('.') {
        Some((g, rest)) if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => ext,
    };
    ext == "pcap"
}

/// The address of a 17-byte key.
pub(crate) fn ip_of(k: &[u8; 17]) -> IpAddr {
    if k[0] == 4 {
        IpAddr::from([k[1], k[2], k[3], k[4]])
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(&k[1..17]);
        IpAddr::from(a)
    }
}
