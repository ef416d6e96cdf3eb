//! The record parser shared by every reader: legacy pcap and pcapng, both byte orders, fed from a byte slice.
//!
//! The parser never reads beyond the slice it is given. When a structure continues past the slice it answers
//! [`Step::Need`], and the caller either supplies more bytes (streams) or reports a truncation (end of input).

use crate::error::ErrorKind;
use crate::types::{LinkType, TsPrecision};

/// Magic of a microsecond legacy pcap file, as a native `u32` read in the file's byte order.
pub(crate) const PCAP_MAGIC_US: u32 = 0xa1b2_c3d4;
/// Magic of a nanosecond legacy pcap file.
pub(crate) const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;
/// Magic of Alexey Kuznetzov's modified pcap format (8 more bytes per record header).
pub(crate) const PCAP_MAGIC_KUZNETZOV: u32 = 0xa1b2_cd34;
/// pcapng section header block type (a palindrome, so byte order does not matter).
pub(crate) const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
/// pcapng byte-order magic.
pub(crate) const PCAPNG_BOM: u32 = 0x1a2b_3c4d;

/// The largest captured length accepted for most link types (libpcap's and Wireshark's `MAXIMUM_SNAPLEN`).
pub const MAX_SNAPLEN: u32 = 262_144;
/// The largest captured length accepted for link types that carry whole messages (D-Bus, USBPcap).
pub const MAX_SNAPLEN_LARGE: u32 = 128 * 1024 * 1024;
/// The largest pcapng block accepted.
pub const MAX_BLOCK_LEN: u32 = MAX_SNAPLEN_LARGE + 4096;

/// The largest captured length accepted for a link type, as Wireshark's `wtap_max_snaplen_for_encap`.
pub fn max_caplen(linktype: LinkType) -> u32 {
    match linktype.0 & 0xffff {
        231 /* D-Bus */ | 249 /* USBPcap */ | 279 /* EBHSCR */ => MAX_SNAPLEN_LARGE,
        _ => MAX_SNAPLEN,
    }
}

/// The container format of a trace, with the facts of its header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FileFormat {
    /// Legacy pcap (libpcap's format).
    Pcap {
        /// Timestamp resolution.
        precision: TsPrecision,
        /// Whether the file is big-endian.
        big_endian: bool,
        /// Kuznetzov's modified pcap (record headers of 24 bytes).
        modified: bool,
        /// Version (major, minor) from the header.
        version: (u16, u16),
        /// Snapshot length from the header.
        snaplen: u32,
        /// The file's single link type (the raw header value, including any FCS bits).
        linktype: LinkType,
    },
    /// pcapng.
    PcapNg {
        /// Whether the first section is big-endian.
        big_endian: bool,
    },
}

impl FileFormat {
    /// Whether the file's byte order is not the host's (libpcap's `swapped`; for pcapng, the first section's,
    /// as libpcap refuses files whose sections differ).
    pub fn swapped(&self) -> bool {
        let (FileFormat::Pcap { big_endian, .. } | FileFormat::PcapNg { big_endian }) = *self;
        big_endian != cfg!(target_endian = "big")
    }

    /// A short name: `pcap`, `pcap-ns`, `pcap-modified` or `pcapng`.
    pub fn name(&self) -> &'static str {
        match self {
            FileFormat::Pcap { modified: true, .. } => "pcap-modified",
            FileFormat::Pcap { precision: TsPrecision::Nano, .. } => "pcap-ns",
            FileFormat::Pcap { .. } => "pcap",
            FileFormat::PcapNg { .. } => "pcapng",
        }
    }
}

/// Timestamp resolution of a pcapng interface (`if_tsresol`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TsResolution {
    /// 10^-n seconds.
    Decimal(u8),
    /// 2^-n seconds.
    Binary(u8),
}

impl TsResolution {
    fn from_option(b: u8) -> TsResolution {
        if b & 0x80 == 0 { TsResolution::Decimal(b) } else { TsResolution::Binary(b & 0x7f) }
    }

    /// Converts a timestamp in these units plus an offset in seconds into nanoseconds since the epoch, saturating
    /// at 0 and `u64::MAX` (2554-07-21).
    pub fn to_ns(self, ts: u64, offset_s: i64) -> u64 {
        let t = ts as u128;
        let ns: u128 = match self {
            TsResolution::Decimal(e) if e <= 9 => t * 10u128.pow(9 - u32::from(e)),
            TsResolution::Decimal(e) if e <= 47 => t / 10u128.pow(u32::from(e) - 9),
            TsResolution::Decimal(_) => 0,
            TsResolution::Binary(e) => (t * 1_000_000_000) >> e,
        };
        let total = ns as i128 + i128::from(offset_s) * 1_000_000_000;
        total.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// One capture interface: the only one of a pcap file, or an interface description block of a pcapng section.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Interface {
    /// Link type of its packets.
    pub linktype: LinkType,
    /// Snapshot length (0 means unlimited in pcapng).
    pub snaplen: u32,
    /// Timestamp resolution.
    pub tsresol: TsResolution,
    /// `if_tsoffset`: seconds added to every timestamp.
    pub tsoffset: i64,
    /// Index of the pcapng section that declared it (0 for pcap).
    pub section: u32,
    /// `if_name`, when present.
    pub name: Option<String>,
    /// Length in bytes of the frame check sequence at the end of each packet, when the file says (pcapng
    /// `if_fcslen`; pcap link-type bits 26-31).
    pub fcs_len: Option<u8>,
}

/// Facts of one record, with its data as a range of the slice that was parsed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordMeta {
    pub ts_ns: u64,
    pub has_ts: bool,
    pub caplen: u32,
    pub wirelen: u32,
    pub iface: u32,
    pub linktype: LinkType,
    /// Start of packet data, relative to the start of the parsed slice.
    pub data_start: usize,
    /// Bytes of the record or block, header and padding included.
    pub consumed: usize,
}

/// What the parser found at the current position.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// A packet record.
    Record(RecordMeta),
    /// A structure without a packet (file header, pcapng block of another type): skip this many bytes.
    Skip(usize),
    /// The structure at this position needs `needed` bytes in all; `what` names it for truncation errors.
    Need { needed: usize, what: &'static str },
    /// Clean end: the slice is empty.
    End,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct PcapState {
    big_endian: bool,
    ns: bool,
    header_len: usize,
    limit: u32,
    linktype: LinkType,
}

/// Where the parser is: before the file header, in a pcap file, or in a pcapng section.
#[derive(Clone, Copy, Debug)]
pub(crate) enum State {
    Start,
    Pcap(PcapState),
    PcapNg { big_endian: bool, section: u32, first_iface: u32 },
}

/// Incremental parser of a capture stream.
#[derive(Clone, Debug)]
pub(crate) struct Parser {
    state: State,
    format: Option<FileFormat>,
    interfaces: Vec<Interface>,
}

#[inline(always)]
fn rd32(b: &[u8], at: usize, be: bool) -> u32 {
    let a = [b[at], b[at + 1], b[at + 2], b[at + 3]];
    if be { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) }
}

#[inline(always)]
fn rd16(b: &[u8], at: usize, be: bool) -> u16 {
    let a = [b[at], b[at + 1]];
    if be { u16::from_be_bytes(a) } else { u16::from_le_bytes(a) }
}

impl Parser {
    pub(crate) fn new() -> Parser {
        Parser { state: State::Start, format: None, interfaces: Vec::new() }
    }

    pub(crate) fn format(&self) -> Option<FileFormat> {
        self.format
    }

    pub(crate) fn interfaces(&self) -> &[Interface] {
        &self.interfaces
    }

    /// Where the parser is now (for [`peek_record_in`](Self::peek_record_in)).
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// Parses the structure at the start of `buf`.
    #[inline]
    pub(crate) fn step(&mut self, buf: &[u8]) -> Result<Step, ErrorKind> {
        match self.state {
            State::Pcap(p) => pcap_record(&p, buf),
            State::PcapNg { .. } => self.pcapng_block(buf),
            State::Start => self.start(buf),
        }
    }

    fn start(&mut self, buf: &[u8]) -> Result<Step, ErrorKind> {
        if buf.len() < 4 {
            return Ok(Step::Need { needed: 4, what: "the file magic" });
        }
        let le = rd32(buf, 0, false);
        if le == PCAPNG_SHB {
            self.state = State::PcapNg { big_endian: false, section: 0, first_iface: 0 };
            return self.pcapng_block(buf);
        }
        let (big_endian, magic) = match (le, rd32(buf, 0, true)) {
            (m, _) if [PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV].contains(&m) => (false, m),
            (_, m) if [PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV].contains(&m) => (true, m),
            _ => return Err(ErrorKind::UnknownMagic { found: buf[..4].to_vec() }),
        };
        if buf.len() < 24 {
            return Ok(Step::Need { needed: 24, what: "the pcap file header" });
        }
        let major = rd16(buf, 4, big_endian);
        let minor = rd16(buf, 6, big_endian);
        if major != 2 {
            return Err(ErrorKind::PcapVersion { major, minor });
        }
        let snaplen = rd32(buf, 16, big_endian);
        let linktype = LinkType(rd32(buf, 20, big_endian));
        let ns = magic == PCAP_MAGIC_NS;
        let modified = magic == PCAP_MAGIC_KUZNETZOV;
        let precision = if ns { TsPrecision::Nano } else { TsPrecision::Micro };
        self.format =
            Some(FileFormat::Pcap { precision, big_endian, modified, version: (major, minor), snaplen, linktype });
        self.interfaces.push(Interface {
            linktype,
            snaplen,
            tsresol: TsResolution::Decimal(if ns { 9 } else { 6 }),
            tsoffset: 0,
            section: 0,
            name: None,
            fcs_len: (linktype.0 & 0x0400_0000 != 0).then_some(((linktype.0 >> 28) * 2) as u8),
        });
        self.state = State::Pcap(PcapState {
            big_endian,
            ns,
            header_len: if modified { 24 } else { 16 },
            limit: max_caplen(linktype),
            linktype,
        });
        Ok(Step::Skip(24))
    }

    /// Whether the structure at the start of `buf` is one that reading later packets depends on: the pcap file
    /// header, a pcapng section header or interface description.
    pub(crate) fn is_structure(&self, buf: &[u8]) -> bool {
        match self.state {
            State::Start => true,
            State::Pcap(_) => false,
            State::PcapNg { big_endian, .. } => buf.len() >= 4 && matches!(rd32(buf, 0, big_endian), PCAPNG_SHB | 1),
        }
    }

    /// Whether `buf` starts a new section (a pcap file header or a pcapng section header).
    pub(crate) fn is_section_start(&self, buf: &[u8]) -> bool {
        matches!(self.state, State::Start) || (buf.len() >= 4 && rd32(buf, 0, false) == PCAPNG_SHB)
    }

    /// Checks the frame of the pcapng block at the start of `buf` (lengths, byte order of a section header):
    /// its type, byte order and length, or the step to answer when it is incomplete.
    fn block_frame(&self, buf: &[u8], big_endian: bool) -> Result<Result<(u32, bool, usize), Step>, ErrorKind> {
        if buf.is_empty() {
            return Ok(Err(Step::End));
        }
        if buf.len() < 12 {
            return Ok(Err(Step::Need { needed: 12, what: "a pcapng block header" }));
        }
        let mut big_endian = big_endian;
        let block_type = rd32(buf, 0, big_endian);
        if block_type == PCAPNG_SHB {
            // The byte order of a section is given by its own byte-order magic.
            let bom_le = rd32(buf, 8, false);
            big_endian = match bom_le {
                PCAPNG_BOM => false,
                0x4d3c_2b1a => true,
                found => return Err(ErrorKind::ByteOrderMagic { found }),
            };
        } else if self.format.is_none() {
            return Err(ErrorKind::NoSection);
        }
        let length = rd32(buf, 4, big_endian);
        if length < 12 {
            return Err(ErrorKind::BlockLength { block_type, length, why: "shorter than 12 bytes" });
        }
        if !length.is_multiple_of(4) {
            return Err(ErrorKind::BlockLength { block_type, length, why: "not a multiple of 4" });
        }
        if length > MAX_BLOCK_LEN {
            return Err(ErrorKind::BlockLength { block_type, length, why: "larger than 128 MiB" });
        }
        let len = length as usize;
        if buf.len() < len {
            return Ok(Err(Step::Need { needed: len, what: "a pcapng block" }));
        }
        let trailing = rd32(buf, len - 4, big_endian);
        if trailing != length {
            return Err(ErrorKind::TrailingLength { block_type, leading: length, trailing });
        }
        Ok(Ok((block_type, big_endian, len)))
    }

    /// Parses the record at the start of `buf` without changing the parser (for reading records at known
    /// offsets): a structure block (section header, interface description) or any other block is a `Skip`.
    ///
    /// The parser answers as it would in `state` with only the capture's first `interfaces` interfaces declared:
    /// a parser that has read a whole capture answers for any section of it, without a copy of itself per
    /// section.
    pub(crate) fn peek_record_in(&self, state: State, interfaces: u32, buf: &[u8]) -> Result<Step, ErrorKind> {
        match state {
            State::Pcap(p) => pcap_record(&p, buf),
            State::PcapNg { big_endian, first_iface, .. } => match self.block_frame(buf, big_endian)? {
                Err(step) => Ok(step),
                Ok((PCAPNG_SHB | 1, _, len)) => Ok(Step::Skip(len)),
                Ok((block_type, be, len)) => self.packet_block_in(first_iface, interfaces, block_type, &buf[..len], be),
            },
            State::Start => Err(ErrorKind::NoSection),
        }
    }

    fn pcapng_block(&mut self, buf: &[u8]) -> Result<Step, ErrorKind> {
        let State::PcapNg { big_endian, mut section, .. } = self.state else {
            unreachable!("pcapng_block called in another state")
        };
        let (block_type, be, len) = match self.block_frame(buf, big_endian)? {
            Ok(frame) => frame,
            Err(step) => return Ok(step),
        };
        let length = len as u32;
        let body = &buf[8..len - 4];
        match block_type {
            PCAPNG_SHB => {
                if body.len() < 16 {
                    return Err(ErrorKind::BlockLength {
                        block_type,
                        length,
                        why: "section header shorter than 28 bytes",
                    });
                }
                let major = rd16(body, 4, be);
                let minor = rd16(body, 6, be);
                if major != 1 {
                    return Err(ErrorKind::PcapNgVersion { major, minor });
                }
                if self.format.is_none() {
                    self.format = Some(FileFormat::PcapNg { big_endian: be });
                    section = 0;
                } else {
                    section += 1;
                }
                let first_iface = self.interfaces.len() as u32;
                self.state = State::PcapNg { big_endian: be, section, first_iface };
                Ok(Step::Skip(len))
            }
            1 => {
                // Interface description block.
                if body.len() < 8 {
                    return Err(ErrorKind::BlockLength {
                        block_type,
                        length,
                        why: "interface description shorter than 20 bytes",
                    });
                }
                let mut iface = Interface {
                    linktype: LinkType(u32::from(rd16(body, 0, be))),
                    snaplen: rd32(body, 4, be),
                    tsresol: TsResolution::Decimal(6),
                    tsoffset: 0,
                    section,
                    name: None,
                    fcs_len: None,
                };
                for (code, value) in options(&body[8..], be) {
                    match code {
                        2 => iface.name = Some(String::from_utf8_lossy(value).trim_end_matches('\0').to_string()),
                        9 if !value.is_empty() => iface.tsresol = TsResolution::from_option(value[0]),
                        13 if !value.is_empty() => iface.fcs_len = Some(value[0]),
                        14 if value.len() >= 8 => {
                            let v = [value[0], value[1], value[2], value[3], value[4], value[5], value[6], value[7]];
                            iface.tsoffset = if be { i64::from_be_bytes(v) } else { i64::from_le_bytes(v) };
                        }
                        _ => {}
                    }
                }
                self.interfaces.push(iface);
                Ok(Step::Skip(len))
            }
            _ => self.packet_block(block_type, &buf[..len], be),
        }
    }

    /// A packet block (enhanced, simple, obsolete) of the current section; other blocks are skipped.
    fn packet_block(&self, block_type: u32, block: &[u8], be: bool) -> Result<Step, ErrorKind> {
        let State::PcapNg { first_iface, .. } = self.state else {
            unreachable!("packet_block called in another state")
        };
        self.packet_block_in(first_iface, u32::MAX, block_type, block, be)
    }

    /// [`packet_block`](Self::packet_block) of the section whose interfaces start at `first_iface`, with the
    /// capture's first `limit` interfaces declared.
    fn packet_block_in(
        &self,
        first_iface: u32,
        limit: u32,
        block_type: u32,
        block: &[u8],
        be: bool,
    ) -> Result<Step, ErrorKind> {
        let declared_all = (self.interfaces.len() as u32).min(limit);
        let len = block.len();
        let length = len as u32;
        let body = &block[8..len - 4];
        match block_type {
            6 | 2 => {
                // Enhanced packet block, or the obsolete packet block.
                if body.len() < 20 {
                    return Err(ErrorKind::BlockLength {
                        block_type,
                        length,
                        why: "packet block shorter than 32 bytes",
                    });
                }
                let id = if block_type == 6 { rd32(body, 0, be) } else { u32::from(rd16(body, 0, be)) };
                let declared = declared_all.saturating_sub(first_iface);
                if id >= declared {
                    return Err(ErrorKind::UnknownInterface { id, declared });
                }
                let global = first_iface + id;
                let iface = &self.interfaces[global as usize];
                let ts = (u64::from(rd32(body, 4, be)) << 32) | u64::from(rd32(body, 8, be));
                let caplen = rd32(body, 12, be);
                let wirelen = rd32(body, 16, be);
                let room = (body.len() - 20) as u32;
                if caplen > room {
                    return Err(ErrorKind::CapLenBeyondBlock { caplen, room });
                }
                let limit = max_caplen(iface.linktype);
                if caplen > limit {
                    return Err(ErrorKind::CapLenTooLarge { caplen, limit });
                }
                Ok(Step::Record(RecordMeta {
                    ts_ns: iface.tsresol.to_ns(ts, iface.tsoffset),
                    has_ts: true,
                    caplen,
                    wirelen,
                    iface: global,
                    linktype: iface.linktype,
                    data_start: 28,
                    consumed: len,
                }))
            }
            3 => {
                // Simple packet block: interface 0, no timestamp, captured length implied.
                if body.len() < 4 {
                    return Err(ErrorKind::BlockLength {
                        block_type,
                        length,
                        why: "simple packet block shorter than 16 bytes",
                    });
                }
                let declared = declared_all.saturating_sub(first_iface);
                if declared == 0 {
                    return Err(ErrorKind::UnknownInterface { id: 0, declared });
                }
                let iface = &self.interfaces[first_iface as usize];
                let wirelen = rd32(body, 0, be);
                let mut caplen = wirelen.min((body.len() - 4) as u32);
                if iface.snaplen != 0 {
                    caplen = caplen.min(iface.snaplen);
                }
                Ok(Step::Record(RecordMeta {
                    ts_ns: 0,
                    has_ts: false,
                    caplen,
                    wirelen,
                    iface: first_iface,
                    linktype: iface.linktype,
                    data_start: 12,
                    consumed: len,
                }))
            }
            _ => Ok(Step::Skip(len)),
        }
    }
}

/// Iterates the options of a pcapng block body: (code, value) pairs until `opt_endofopt` or the end.
fn options(mut b: &[u8], be: bool) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let code = rd16(b, 0, be);
        let len = usize::from(rd16(b, 2, be));
        if code == 0 || 4 + len > b.len() {
            return None;
        }
        let value = &b[4..4 + len];
        let padded = (4 + len + 3) & !3;
        b = &b[padded.min(b.len())..];
        Some((code, value))
    })
}

/// The offset of the record `n` records after the pcap record at `offset` of `data`, each record on the way
/// checked as [`pcap_record`] checks it (header whole, captured length within the limit, data whole); `None` as
/// soon as one is not, for the caller to read it the long way and report why.
#[inline(always)]
pub(crate) fn skip_pcap_records(p: &PcapState, data: &[u8], mut offset: u64, n: usize) -> Option<u64> {
    let hl = p.header_len as u64;
    for _ in 0..n {
        let at = usize::try_from(offset).ok()?;
        let header = data.get(at..at.checked_add(p.header_len)?)?;
        let caplen = rd32(header, 8, p.big_endian);
        if caplen > p.limit {
            return None;
        }
        let next = offset + hl + u64::from(caplen);
        if next > data.len() as u64 {
            return None;
        }
        offset = next;
    }
    Some(offset)
}

#[inline(always)]
fn pcap_record(p: &PcapState, buf: &[u8]) -> Result<Step, ErrorKind> {
    let hl = p.header_len;
    if buf.len() < hl {
        if buf.is_empty() {
            return Ok(Step::End);
        }
        return Ok(Step::Need { needed: hl, what: "a record header" });
    }
    let be = p.big_endian;
    let sec = rd32(buf, 0, be);
    let frac = rd32(buf, 4, be);
    let caplen = rd32(buf, 8, be);
    let wirelen = rd32(buf, 12, be);
    if caplen > p.limit {
        return Err(ErrorKind::CapLenTooLarge { caplen, limit: p.limit });
    }
    let total = hl + caplen as usize;
    if buf.len() < total {
        return Ok(Step::Need { needed: total, what: "packet data" });
    }
    let ts_ns = u64::from(sec) * 1_000_000_000 + if p.ns { u64::from(frac) } else { u64::from(frac) * 1000 };
    Ok(Step::Record(RecordMeta {
        ts_ns,
        has_ts: true,
        caplen,
        wirelen,
        iface: 0,
        linktype: p.linktype,
        data_start: hl,
        consumed: total,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsresol_conversions() {
        assert_eq!(TsResolution::Decimal(6).to_ns(1_500_000, 0), 1_500_000_000);
        assert_eq!(TsResolution::Decimal(9).to_ns(7, 0), 7);
        assert_eq!(TsResolution::Decimal(12).to_ns(7_000, 0), 7);
        assert_eq!(TsResolution::Binary(10).to_ns(1024, 0), 1_000_000_000);
        assert_eq!(TsResolution::Binary(0).to_ns(3, 1), 4_000_000_000);
        // Above 2^32 units per second: no truncation (a pcap-parser 0.17 pitfall).
        assert_eq!(TsResolution::Binary(40).to_ns(1 << 40, 0), 1_000_000_000);
        assert_eq!(TsResolution::Decimal(6).to_ns(u64::MAX, 0), u64::MAX);
        assert_eq!(TsResolution::Decimal(6).to_ns(0, -5), 0);
    }

    /// A little-endian section header block, 28 bytes.
    fn shb() -> Vec<u8> {
        let mut b = vec![0x0a, 0x0d, 0x0d, 0x0a];
        b.extend_from_slice(&28u32.to_le_bytes());
        b.extend_from_slice(&PCAPNG_BOM.to_le_bytes());
        b.extend_from_slice(&[1, 0, 0, 0]);
        b.extend_from_slice(&[0xff; 8]);
        b.extend_from_slice(&28u32.to_le_bytes());
        b
    }

    /// A section header and one Ethernet interface with `snaplen`.
    fn shb_idb(snaplen: u32) -> Vec<u8> {
        let mut b = shb();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&20u32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&snaplen.to_le_bytes());
        b.extend_from_slice(&20u32.to_le_bytes());
        b
    }

    /// A simple packet block's captured length is the smallest of the original length, the bytes in the block and
    /// the interface's snaplen (pcap-parser 0.17 inverts its `truncated()` here).
    #[test]
    fn simple_packet_block_lengths() {
        for (snaplen, origlen, body, want_caplen) in [(0u32, 10u32, 12usize, 10u32), (0, 100, 12, 12), (8, 100, 12, 8)]
        {
            let mut b = shb_idb(snaplen);
            let start = b.len();
            let total = 16 + body as u32;
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&total.to_le_bytes());
            b.extend_from_slice(&origlen.to_le_bytes());
            b.extend_from_slice(&vec![0xab; body]);
            b.extend_from_slice(&total.to_le_bytes());
            let recs: Vec<_> = crate::Records::new(&b).collect::<Result<_, _>>().unwrap();
            assert_eq!(recs.len(), 1);
            assert_eq!(recs[0].caplen(), want_caplen, "snaplen {snaplen} origlen {origlen}");
            assert_eq!(recs[0].wirelen, origlen);
            assert_eq!(recs[0].is_truncated(), want_caplen < origlen);
            assert!(!recs[0].has_ts);
            assert_eq!(recs[0].offset, start as u64);
        }
    }

    #[test]
    fn pcapng_block_length_4_to_11_is_an_error_not_a_panic() {
        for len in [0u32, 4, 8, 11] {
            let mut p = Parser::new();
            assert!(matches!(p.step(&shb()), Ok(Step::Skip(28))));
            let mut blk = 6u32.to_le_bytes().to_vec();
            blk.extend_from_slice(&len.to_le_bytes());
            blk.extend_from_slice(&[0; 16]);
            assert!(matches!(p.step(&blk), Err(ErrorKind::BlockLength { .. })), "len {len}");
        }
    }
}
