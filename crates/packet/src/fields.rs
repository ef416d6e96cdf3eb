//! Index fields: header values read at fixed positions, the way libpcap's filters read them.
//!
//! A packet index stores these values and a query planner derives conditions on them from filters; both must
//! agree on what a field means, so the definition lives here, next to the reader, and nowhere else. Fields are
//! defined positionally, where libpcap's code generator reads them: the network protocol where `ip`, `ip6` and
//! `arp` test it, as an Ethernet type (Ethernet's type field, the Linux SLL/SLL2 and Cisco HDLC protocol, the PPP
//! protocol, a null/loopback address family, a raw IP version), then the network layer at the link type's fixed
//! offset (no VLAN tag is skipped, no IPv6 extension header is followed), because that is what a filter without
//! `vlan`/`mpls`/`pppoes` reads. A value is therefore one of three things ([`FieldValue`]): present, missing (the
//! packet is not of a kind that has the field, e.g. the IPv4 source of an ARP frame: no filter test of that field
//! can match it), or unknown (a link type without such a protocol field, or a packet cut short before the field:
//! anything may match).
//!
//! ```
//! use pcaptool_packet::{Field, FieldValue, LinkType, PacketFields};
//!
//! let mut frame = vec![0u8; 54];
//! frame[12..14].copy_from_slice(&[0x08, 0x00]); // IPv4
//! frame[14] = 0x45;
//! frame[23] = 6; // TCP
//! frame[26..30].copy_from_slice(&[10, 0, 0, 1]);
//! frame[34..36].copy_from_slice(&443u16.to_be_bytes());
//! let f = PacketFields::new(LinkType::ETHERNET, &frame, 54, 0);
//! assert_eq!(f.get(Field::Ip4Src), FieldValue::Value(0x0a00_0001));
//! assert_eq!(f.get(Field::SrcPort), FieldValue::Value(443));
//! assert_eq!(f.get(Field::Ip6Src), FieldValue::Missing);
//! ```
//!
//! [`Need`] is a condition over these fields (what a query planner derives from a filter and an index answers).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::LinkType;

/// A packet field an index can hold and a filter can test.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum Field {
    /// The network protocol, what `ip`, `ip6`, `arp` and `ether proto` test (it also gives the IP version): on
    /// Ethernet the 16-bit type/length field after the MAC addresses; on other link types the Ethernet type their
    /// protocol field stands for in those tests.
    LinkProto,
    /// Ethernet source address (48 bits; Ethernet frames only).
    EthSrc,
    /// Ethernet destination address.
    EthDst,
    /// VLAN id (low 12 bits of the tag control field) of Ethernet frames whose `LinkProto` is 0x8100, 0x88a8 or
    /// 0x9100 (the outer tag: what `vlan N` tests first).
    VlanId,
    /// IPv4 source (header bytes 12-15) of packets whose `LinkProto` is IPv4.
    Ip4Src,
    /// IPv4 destination (bytes 16-19).
    Ip4Dst,
    /// IPv6 source (bytes 8-23) of packets whose `LinkProto` is IPv6.
    Ip6Src,
    /// IPv6 destination (bytes 24-39).
    Ip6Dst,
    /// IPv4 protocol (byte 9) or IPv6 next header of the fixed header (byte 6).
    IpProto,
    /// Source port: the first 16 bits after the IPv4 header of a TCP, UDP or SCTP first fragment, or after the
    /// 40-byte IPv6 header when its next header is TCP, UDP or SCTP.
    SrcPort,
    /// Destination port: the next 16 bits.
    DstPort,
    /// ARP/RARP sender protocol address (bytes 14-17 of the ARP header) of frames whose `LinkProto` is ARP or RARP
    /// (what `host`, `arp host` and `rarp host` test there).
    ArpSpa,
    /// ARP/RARP target protocol address (bytes 24-27).
    ArpTpa,
    /// TCP flags: byte 13 of the TCP header, where [`SrcPort`](Field::SrcPort) finds TCP.
    TcpFlags,
    /// Length on the wire.
    WireLen,
    /// Timestamp, nanoseconds since the epoch.
    Time,
}

impl Field {
    /// Every field, in order: the header fields, then wire length and time.
    pub const ALL: [Field; 16] = [
        Field::LinkProto,
        Field::EthSrc,
        Field::EthDst,
        Field::VlanId,
        Field::Ip4Src,
        Field::Ip4Dst,
        Field::Ip6Src,
        Field::Ip6Dst,
        Field::IpProto,
        Field::SrcPort,
        Field::DstPort,
        Field::ArpSpa,
        Field::ArpTpa,
        Field::TcpFlags,
        Field::WireLen,
        Field::Time,
    ];

    /// The field's short name (`ip.src`, `port.dst`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Field::LinkProto => "link.proto",
            Field::EthSrc => "eth.src",
            Field::EthDst => "eth.dst",
            Field::VlanId => "vlan",
            Field::Ip4Src => "ip.src",
            Field::Ip4Dst => "ip.dst",
            Field::Ip6Src => "ip6.src",
            Field::Ip6Dst => "ip6.dst",
            Field::IpProto => "ip.proto",
            Field::SrcPort => "port.src",
            Field::DstPort => "port.dst",
            Field::ArpSpa => "arp.spa",
            Field::ArpTpa => "arp.tpa",
            Field::TcpFlags => "tcp.flags",
            Field::WireLen => "len",
            Field::Time => "time",
        }
    }

    /// Bits of the field's values.
    pub fn bits(self) -> u32 {
        match self {
            Field::LinkProto | Field::SrcPort | Field::DstPort => 16,
            Field::EthSrc | Field::EthDst => 48,
            Field::VlanId => 12,
            Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa | Field::WireLen => 32,
            Field::Ip6Src | Field::Ip6Dst => 128,
            Field::IpProto | Field::TcpFlags => 8,
            Field::Time => 64,
        }
    }

    /// A value of the field, written the usual way (dotted quad, colon hex, ...).
    pub fn format(self, v: u128) -> impl fmt::Display {
        FieldDisplay(self, v)
    }
}

struct FieldDisplay(Field, u128);

impl fmt::Display for FieldDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.1;
        match self.0 {
            Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => write!(f, "{}", Ipv4Addr::from(v as u32)),
            Field::Ip6Src | Field::Ip6Dst => write!(f, "{}", Ipv6Addr::from(v)),
            Field::EthSrc | Field::EthDst => {
                let b = (v as u64).to_be_bytes();
                write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[2], b[3], b[4], b[5], b[6], b[7])
            }
            Field::LinkProto | Field::TcpFlags => write!(f, "{v:#06x}"),
            Field::Time => write!(f, "{}", crate::Rfc3339(v as u64)),
            _ => write!(f, "{v}"),
        }
    }
}

/// What a packet holds in a field.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum FieldValue {
    /// The packet has this value.
    Value(u128),
    /// The packet is not of a kind that has the field (no filter test of the field matches it).
    Missing,
    /// Not known: a link type whose fields are not read, or the packet was cut before the field (any test may
    /// match).
    Unknown,
}

impl FieldValue {
    /// The value, if present.
    pub fn value(self) -> Option<u128> {
        match self {
            FieldValue::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// A packet seen as index fields.
#[derive(Clone, Copy, Debug)]
pub struct PacketFields<'a> {
    link: Link,
    /// Whether the trace's byte order is not the host's (libpcap's `swapped`): a null/loopback header holds its
    /// address family in the capturing host's byte order.
    swapped: bool,
    data: &'a [u8],
    wirelen: u32,
    ts_ns: u64,
}

/// Where a link type keeps the network protocol and where the network layer starts, as libpcap's code generator
/// reads them (`gen_linktype` and `off_linkpl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// Ethernet: the type/length field at 12 (whatever it holds), the network layer at 14, MAC addresses and VLAN
    /// tags.
    Ether,
    /// A 16-bit Ethernet type at `at` (Linux SLL at 14, SLL2 at 0, Cisco HDLC at 2), the network layer at `nl`.
    EtherType { at: usize, nl: usize },
    /// A 16-bit PPP protocol at `at`, the network layer at `nl`.
    Ppp { at: usize, nl: usize },
    /// BSD null (address family in the capturing host's byte order, `be: false`) or loopback (network order):
    /// 4 bytes, then the network layer.
    Null { be: bool },
    /// A LAN with LLC after its MAC header (token ring, FDDI, IP over Fibre Channel): the SNAP type at `at`
    /// (libpcap does not check that LLC is SNAP), the network layer at `nl`, the destination and source
    /// addresses at `dst` and `src`.
    MacLlc { dst: usize, src: usize, at: usize, nl: usize },
    /// Raw IP: the version nibble of the first byte says IPv4 or IPv6.
    Raw,
    /// Raw IP of a single version: every packet is that protocol.
    Only(u16),
    /// No header field (another link type, or an index format that read fields on Ethernet only): only length
    /// and time are known.
    None,
}

impl Link {
    fn of(linktype: LinkType) -> Link {
        // The same offsets as the filter compiler's (pcaptool-query's `Compiler::new`), for the link types whose
        // protocol test reads one field.
        match linktype.base().0 {
            1 => Link::Ether,
            113 => Link::EtherType { at: 14, nl: 16 },
            // Token ring, FDDI, IP over Fibre Channel: the SNAP type after the MAC header and LLC, as libpcap
            // tests it (without checking that LLC is SNAP); the addresses where `ether host` reads them.
            6 => Link::MacLlc { dst: 2, src: 8, at: 20, nl: 22 },
            10 => Link::MacLlc { dst: 1, src: 7, at: 19, nl: 21 },
            122 => Link::MacLlc { dst: 2, src: 10, at: 22, nl: 24 },
            276 => Link::EtherType { at: 0, nl: 20 },
            104 => Link::EtherType { at: 2, nl: 4 },
            9 | 50 | 166 => Link::Ppp { at: 2, nl: 4 },
            51 => Link::Ppp { at: 6, nl: 8 },
            0 => Link::Null { be: false },
            108 => Link::Null { be: true },
            12 | 101 => Link::Raw,
            228 => Link::Only(0x0800),
            229 => Link::Only(0x86dd),
            _ => Link::None,
        }
    }
}

/// What every header field of a packet depends on: its network protocol as an Ethernet type (`None`: a protocol
/// no field test can match on this link type), where its network layer starts, and where its transport header is
/// (see `PacketFields::transport`).
#[derive(Clone, Copy, Debug)]
struct Context {
    proto: Option<u128>,
    nl: usize,
    /// Where the destination and source MAC addresses are, when the link type has them.
    mac: Option<(usize, usize)>,
    /// Whether VLAN tags are Ethernet's (what `vlan` reads).
    ether: bool,
    transport: Result<Option<(usize, u128)>, ()>,
}

/// Ethertypes of ARP and RARP.
const ARP_TYPES: [u128; 2] = [0x0806, 0x8035];

/// Ethertypes of VLAN tags (what libpcap's `vlan` accepts).
const VLAN_TPIDS: [u128; 3] = [0x8100, 0x88a8, 0x9100];

/// The Ethernet type a PPP protocol stands for in a filter (the inverse of libpcap's `ethertype_to_ppptype`).
/// `None`: a value that libpcap maps away (e.g. 0x0800, which `ip` reads as 0x0021), so no protocol test
/// matches it.
fn ppp_to_ethertype(p: u128) -> Option<u128> {
    Some(match p {
        0x0021 => 0x0800,
        0x0057 => 0x86dd,
        0x0027 => 0x6003,
        0x0029 => 0x809b,
        0x0025 => 0x0600,
        0x0023 => 0xfe,
        0x0031 => 0x42,
        0x002b => 0xe0,
        0x0800 | 0x86dd | 0x6003 | 0x809b | 0x0600 | 0xfe | 0x42 | 0xe0 => return None,
        other => other,
    })
}

/// The Ethernet type a BSD address family stands for (`ip`: 2; `ip6`: the BSDs' 24, 28 or 30).
fn family_to_ethertype(af: u32) -> Option<u128> {
    match af {
        2 => Some(0x0800),
        24 | 28 | 30 => Some(0x86dd),
        _ => None,
    }
}

impl<'a> PacketFields<'a> {
    /// The fields of one packet of link type `linktype`, from a trace in the host's byte order. Ethernet, FDDI, token
    /// ring, IP over Fibre Channel, Linux SLL and SLL2, Cisco HDLC, PPP, BSD null and loopback, and raw IP have header fields; every link type
    /// has length and time.
    pub fn new(linktype: LinkType, data: &'a [u8], wirelen: u32, ts_ns: u64) -> PacketFields<'a> {
        PacketFields { link: Link::of(linktype), swapped: false, data, wirelen, ts_ns }
    }

    /// The same packet from a trace whose byte order is not the host's when `swapped` (what a null/loopback
    /// header's address family is read in, as libpcap reads it).
    pub fn swapped(self, swapped: bool) -> PacketFields<'a> {
        PacketFields { swapped, ..self }
    }

    /// Whether the packet's link type has header fields (so that an unknown field is one cut off by the snapshot
    /// length; see [`Need::may_match_captured`]).
    pub fn has_header_fields(&self) -> bool {
        self.link != Link::None
    }

    /// The same packet with header fields on Ethernet only (every other link type's unknown): the definition
    /// that index formats before link-type keys were built with.
    pub fn ethernet_only(self) -> PacketFields<'a> {
        if self.link == Link::Ether { self } else { PacketFields { link: Link::None, ..self } }
    }

    #[inline]
    fn be(&self, at: usize, n: usize) -> Option<u128> {
        let b = self.data.get(at..at.checked_add(n)?)?;
        Some(match b.len() {
            1 => u128::from(b[0]),
            2 => u128::from(u16::from_be_bytes([b[0], b[1]])),
            4 => u128::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                u128::from_be_bytes(a)
            }
            _ => u128::from(b.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x))),
        })
    }

    /// The transport header's offset, when the packet is a TCP/UDP/SCTP first fragment as ports define it
    /// (`Ok(None)`: not such a packet; `Err`: cut short).
    #[inline]
    fn transport(&self, proto: Option<u128>, nl: usize) -> Result<Option<(usize, u128)>, ()> {
        match proto {
            Some(0x0800) => {
                let ihl = self.be(nl, 1).ok_or(())? as usize & 0xf;
                let frag = self.be(nl + 6, 2).ok_or(())? & 0x1fff;
                let p = self.be(nl + 9, 1).ok_or(())?;
                Ok((matches!(p, 6 | 17 | 132) && frag == 0).then_some((nl + 4 * ihl, p)))
            }
            Some(0x86dd) => {
                let p = self.be(nl + 6, 1).ok_or(())?;
                Ok(matches!(p, 6 | 17 | 132).then_some((nl + 40, p)))
            }
            _ => Ok(None),
        }
    }

    /// What every header field depends on (`None`: nothing is known).
    #[inline]
    fn context(&self) -> Option<Context> {
        let mut mac = None;
        let (proto, nl, ether) = match self.link {
            Link::Ether => {
                mac = Some((0, 6));
                (Some(self.be(12, 2)?), 14, true)
            }
            Link::EtherType { at, nl } => (Some(self.be(at, 2)?), nl, false),
            Link::MacLlc { dst, src, at, nl } => {
                mac = Some((dst, src));
                (Some(self.be(at, 2)?), nl, false)
            }
            Link::Ppp { at, nl } => (ppp_to_ethertype(self.be(at, 2)?), nl, false),
            Link::Null { be } => {
                let b = self.data.get(..4)?;
                let b = [b[0], b[1], b[2], b[3]];
                // Network order for loopback; for null, the trace's byte order (the host's unless swapped).
                let af = if be || (self.swapped != cfg!(target_endian = "big")) {
                    u32::from_be_bytes(b)
                } else {
                    u32::from_le_bytes(b)
                };
                (family_to_ethertype(af), 4, false)
            }
            Link::Raw => match self.be(0, 1)? >> 4 {
                4 => (Some(0x0800), 0, false),
                6 => (Some(0x86dd), 0, false),
                _ => (None, 0, false),
            },
            Link::Only(p) => (Some(p.into()), 0, false),
            Link::None => return None,
        };
        Some(Context { proto, nl, mac, ether, transport: self.transport(proto, nl) })
    }

    /// The value of `field` in this packet.
    pub fn get(&self, field: Field) -> FieldValue {
        self.get_in(field, self.context())
    }

    /// The values of `fields`, in their order (the link layer read once for all of them).
    #[inline]
    pub fn get_many<const N: usize>(&self, fields: [Field; N]) -> [FieldValue; N] {
        let r = self.reader();
        let mut out = [FieldValue::Missing; N];
        for (o, f) in out.iter_mut().zip(fields) {
            *o = r.get(f);
        }
        out
    }

    /// A reader of this packet's fields with the link layer read once, for code that reads several fields one at a
    /// time: a [`FieldReader::get`] of a field known at compile time folds to that field's few loads.
    #[inline]
    pub fn reader(&self) -> FieldReader<'_, 'a> {
        FieldReader { fields: self, cx: self.context() }
    }

    /// The values of all fields, in the order of [`Field::ALL`] (faster than one [`get`](Self::get) each).
    pub fn get_all(&self) -> [FieldValue; Field::ALL.len()] {
        let cx = self.context();
        Field::ALL.map(|f| self.get_in(f, cx))
    }

    #[inline(always)]
    fn get_in(&self, field: Field, cx: Option<Context>) -> FieldValue {
        use FieldValue::{Missing, Unknown, Value};
        let known = |v: Option<u128>| v.map_or(Unknown, Value);
        match field {
            Field::WireLen => return Value(self.wirelen.into()),
            Field::Time => return Value(self.ts_ns.into()),
            _ => {}
        }
        let Some(Context { proto, nl, mac, ether, transport }) = cx else { return Unknown };
        // The addresses are there whatever the protocol field holds.
        match (field, mac) {
            (Field::EthDst, Some((dst, _))) => return known(self.be(dst, 6)),
            (Field::EthSrc, Some((_, src))) => return known(self.be(src, 6)),
            _ => {}
        }
        let Some(proto) = proto else { return Missing };
        match field {
            Field::LinkProto => Value(proto),
            Field::VlanId if ether && VLAN_TPIDS.contains(&proto) => known(self.be(14, 2).map(|v| v & 0x0fff)),
            Field::Ip4Src if proto == 0x0800 => known(self.be(nl + 12, 4)),
            Field::Ip4Dst if proto == 0x0800 => known(self.be(nl + 16, 4)),
            Field::Ip6Src if proto == 0x86dd => known(self.be(nl + 8, 16)),
            Field::Ip6Dst if proto == 0x86dd => known(self.be(nl + 24, 16)),
            Field::IpProto if proto == 0x0800 => known(self.be(nl + 9, 1)),
            Field::IpProto if proto == 0x86dd => known(self.be(nl + 6, 1)),
            Field::ArpSpa if ARP_TYPES.contains(&proto) => known(self.be(nl + 14, 4)),
            Field::ArpTpa if ARP_TYPES.contains(&proto) => known(self.be(nl + 24, 4)),
            Field::SrcPort | Field::DstPort | Field::TcpFlags => match transport {
                Err(()) => Unknown,
                Ok(None) => Missing,
                Ok(Some((at, p))) => match field {
                    Field::SrcPort => known(self.be(at, 2)),
                    Field::DstPort => known(self.be(at + 2, 2)),
                    _ if p == 6 => known(self.be(at + 13, 1)),
                    _ => Missing,
                },
            },
            _ => Missing,
        }
    }
}

/// The fields of one packet with its link layer read (see [`PacketFields::reader`]).
#[derive(Clone, Copy, Debug)]
pub struct FieldReader<'p, 'a> {
    fields: &'p PacketFields<'a>,
    cx: Option<Context>,
}

impl FieldReader<'_, '_> {
    /// The value of `field` ([`PacketFields::get`]).
    #[inline(always)]
    pub fn get(&self, field: Field) -> FieldValue {
        self.fields.get_in(field, self.cx)
    }
}

/// `lo <= field & mask <= hi`: an exact value, an address prefix, a port or length range, a time window, a test
/// of flag bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Pred {
    /// The field.
    pub field: Field,
    /// Smallest value.
    pub lo: u128,
    /// Largest value.
    pub hi: u128,
    /// Bits of the field compared (`u128::MAX`: the whole value).
    pub mask: u128,
}

impl Pred {
    /// `lo <= field <= hi`.
    pub fn range(field: Field, lo: u128, hi: u128) -> Pred {
        Pred { field, lo, hi, mask: u128::MAX }
    }

    /// Whether a present value satisfies the predicate.
    pub fn holds(&self, v: u128) -> bool {
        (self.lo..=self.hi).contains(&(v & self.mask))
    }

    /// Whether a filter's test of this predicate loads every byte of the field: a field of at most 4 bytes is
    /// loaded at once, a longer one word by word, all of them for an exact value.
    pub fn reads_whole_field(&self) -> bool {
        self.field.bits() <= 32 || (self.lo == self.hi && self.mask == u128::MAX)
    }

    /// Whether every value of the field satisfies the predicate (`field & 0 == 0`, a range over all values).
    pub fn always(&self) -> bool {
        let bits = self.field.bits();
        let all = if bits >= 128 { u128::MAX } else { (1u128 << bits) - 1 };
        self.lo == 0 && self.hi >= self.mask & all
    }
}

impl fmt::Display for Pred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.field.name();
        if self.mask != u128::MAX {
            write!(f, "{name} & {:#x} in [{:#x}, {:#x}]", self.mask, self.lo, self.hi)
        } else if self.lo == self.hi {
            write!(f, "{name} = {}", self.field.format(self.lo))
        } else {
            write!(f, "{name} in [{}, {}]", self.field.format(self.lo), self.field.format(self.hi))
        }
    }
}

/// A condition every matching packet satisfies.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Need {
    /// Nothing known: every packet is a candidate.
    All,
    /// One field predicate.
    Pred(Pred),
    /// All of these.
    And(Vec<Need>),
    /// Any of these.
    Or(Vec<Need>),
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, v: &[Need], op: &str| {
            write!(f, "(")?;
            for (i, n) in v.iter().enumerate() {
                if i > 0 {
                    write!(f, " {op} ")?;
                }
                write!(f, "{n}")?;
            }
            write!(f, ")")
        };
        match self {
            Need::All => write!(f, "any packet"),
            Need::Pred(p) => write!(f, "{p}"),
            Need::And(v) => join(f, v, "and"),
            Need::Or(v) => join(f, v, "or"),
        }
    }
}

impl Need {
    /// Conjunction, simplified (`All` drops out).
    pub fn and(parts: Vec<Need>) -> Need {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Need::All => {}
                Need::And(v) => out.extend(v),
                p => out.push(p),
            }
        }
        match out.len() {
            0 => Need::All,
            1 => out.pop().unwrap_or(Need::All),
            _ => Need::And(out),
        }
    }

    /// Disjunction, simplified (`All` absorbs).
    pub fn or(parts: Vec<Need>) -> Need {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Need::All => return Need::All,
                Need::Or(v) => out.extend(v),
                p => out.push(p),
            }
        }
        match out.len() {
            0 => Need::All,
            1 => out.pop().unwrap_or(Need::All),
            _ => Need::Or(out),
        }
    }

    /// Keeps only predicates on fields `keep` accepts (the others become `All`).
    pub fn restrict(&self, keep: &dyn Fn(Field) -> bool) -> Need {
        match self {
            Need::All => Need::All,
            Need::Pred(p) => {
                if keep(p.field) {
                    Need::Pred(*p)
                } else {
                    Need::All
                }
            }
            Need::And(v) => Need::and(v.iter().map(|n| n.restrict(keep)).collect()),
            Need::Or(v) => Need::or(v.iter().map(|n| n.restrict(keep)).collect()),
        }
    }

    /// Whether a packet with these field values may satisfy the condition (a missing field fails every
    /// predicate, an unknown one may satisfy any).
    pub fn may_match(&self, value: &dyn Fn(Field) -> FieldValue) -> bool {
        match self {
            Need::All => true,
            Need::Pred(p) => match value(p.field) {
                FieldValue::Value(v) => p.holds(v),
                FieldValue::Missing => false,
                FieldValue::Unknown => true,
            },
            Need::And(v) => v.iter().all(|n| n.may_match(value)),
            Need::Or(v) => v.iter().any(|n| n.may_match(value)),
        }
    }

    /// [`may_match`](Self::may_match) for a packet of a link type whose fields are read, where an unknown field
    /// is one cut short by the snapshot length: such a field fails a predicate that reads all of its bytes (one of
    /// a field of at most 4 bytes, which a filter loads at once, or an exact value), unless every value satisfies
    /// it. A filter tests a field by loading its bytes, and libpcap rejects the packet when a load reaches past the
    /// bytes captured, so no match depends on such a test of a cut field (save tests its optimiser drops as always
    /// true); a prefix of a longer field (`net fe80::/10`) loads only the words the prefix covers.
    pub fn may_match_captured(&self, value: &dyn Fn(Field) -> FieldValue) -> bool {
        match self {
            Need::All => true,
            Need::Pred(p) => match value(p.field) {
                FieldValue::Value(v) => p.holds(v),
                FieldValue::Missing => false,
                FieldValue::Unknown => p.always() || !p.reads_whole_field(),
            },
            Need::And(v) => v.iter().all(|n| n.may_match_captured(value)),
            Need::Or(v) => v.iter().any(|n| n.may_match_captured(value)),
        }
    }

    /// Whether the condition holds, when every field it reads is known (present or missing); `None` when one is
    /// unknown.
    pub fn decide(&self, value: &dyn Fn(Field) -> FieldValue) -> Option<bool> {
        if self.any_pred(&mut |p| value(p.field) == FieldValue::Unknown) { None } else { Some(self.may_match(value)) }
    }

    /// Whether some predicate of the condition satisfies `f`.
    pub fn any_pred(&self, f: &mut dyn FnMut(&Pred) -> bool) -> bool {
        match self {
            Need::All => false,
            Need::Pred(p) => f(p),
            Need::And(v) | Need::Or(v) => v.iter().any(|n| n.any_pred(f)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tri_state() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[20] = 17;
        f[54..56].copy_from_slice(&53u16.to_be_bytes());
        let p = PacketFields::new(LinkType::ETHERNET, &f, 60, 7);
        assert_eq!(p.get(Field::SrcPort), FieldValue::Value(53));
        assert_eq!(p.get(Field::TcpFlags), FieldValue::Missing);
        assert_eq!(p.get(Field::Ip4Dst), FieldValue::Missing);
        assert_eq!(p.get(Field::Time), FieldValue::Value(7));
        // Cut before the ports: unknown, not missing.
        let p = PacketFields::new(LinkType::ETHERNET, &f[..50], 60, 7);
        assert_eq!(p.get(Field::SrcPort), FieldValue::Unknown);
        // Link types without a protocol field libpcap tests know only length and time.
        let p = PacketFields::new(LinkType(147), &f, 60, 7);
        assert_eq!(p.get(Field::LinkProto), FieldValue::Unknown);
        assert_eq!(p.get(Field::WireLen), FieldValue::Value(60));
        // So does an Ethernet-only reading of another link type.
        let p = PacketFields::new(LinkType::LINUX_SLL, &f, 60, 7).ethernet_only();
        assert_eq!(p.get(Field::Ip4Src), FieldValue::Unknown);
        // VLAN id of a tagged frame.
        f[12..16].copy_from_slice(&[0x81, 0x00, 0x20, 0x64]);
        let p = PacketFields::new(LinkType::ETHERNET, &f, 60, 7);
        assert_eq!(p.get(Field::VlanId), FieldValue::Value(100));
        assert_eq!(p.get(Field::IpProto), FieldValue::Missing);
        assert_eq!(Field::Ip4Src.format(0x0a00_0001).to_string(), "10.0.0.1");
    }

    /// One IPv4 TCP packet from 10.0.0.1:1234 to 10.0.0.2:80 behind the link-layer header `link`.
    fn behind(link: &[u8]) -> Vec<u8> {
        let mut p = link.to_vec();
        p.extend_from_slice(&[0x45, 0, 0, 40, 0, 1, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend_from_slice(&[0x04, 0xd2, 0, 80, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x12, 0x20, 0, 0, 0, 0, 0]);
        p
    }

    #[test]
    fn every_link_type_with_a_protocol_field() {
        let sll = {
            let mut h = vec![0u8; 14];
            h.extend_from_slice(&[0x08, 0x00]);
            h
        };
        let sll2 = {
            let mut h = vec![0x08, 0x00];
            h.resize(20, 0);
            h
        };
        let cases: [(LinkType, Vec<u8>, bool); 11] = [
            (LinkType::NULL, 2u32.to_le_bytes().to_vec(), false),
            (LinkType::NULL, 2u32.to_be_bytes().to_vec(), true),
            (LinkType::LOOP, 2u32.to_be_bytes().to_vec(), false),
            (LinkType::RAW, vec![], false),
            (LinkType::RAW_BSD12, vec![], false),
            (LinkType::IPV4, vec![], false),
            (LinkType::LINUX_SLL, sll, false),
            (LinkType::LINUX_SLL2, sll2, false),
            (LinkType::PPP, vec![0xff, 0x03, 0x00, 0x21], false),
            (LinkType::PPP_HDLC, vec![0xff, 0x03, 0x00, 0x21], false),
            (LinkType::C_HDLC, vec![0x0f, 0x00, 0x08, 0x00], false),
        ];
        for (lt, link, swapped) in cases {
            let data = behind(&link);
            let p = PacketFields::new(lt, &data, data.len() as u32, 0).swapped(swapped);
            let what = format!("link type {lt} (swapped {swapped})");
            assert_eq!(p.get(Field::LinkProto), FieldValue::Value(0x0800), "{what}");
            assert_eq!(p.get(Field::Ip4Src), FieldValue::Value(0x0a00_0001), "{what}");
            assert_eq!(p.get(Field::Ip4Dst), FieldValue::Value(0x0a00_0002), "{what}");
            assert_eq!(p.get(Field::IpProto), FieldValue::Value(6), "{what}");
            assert_eq!(p.get(Field::SrcPort), FieldValue::Value(1234), "{what}");
            assert_eq!(p.get(Field::DstPort), FieldValue::Value(80), "{what}");
            assert_eq!(p.get(Field::TcpFlags), FieldValue::Value(0x12), "{what}");
            assert_eq!(p.get(Field::EthSrc), FieldValue::Missing, "{what}");
            assert_eq!(p.get(Field::VlanId), FieldValue::Missing, "{what}");
            // Cut inside the link-layer header: nothing is known.
            let p = PacketFields::new(lt, &data[..link.len().min(1)], 60, 0).swapped(swapped);
            if !link.is_empty() {
                assert_eq!(p.get(Field::Ip4Src), FieldValue::Unknown, "{what}");
            }
        }
        // A null header in the other byte order, an unknown family, IP version 5, PPP's own 0x0800 and an
        // IPv6-only link type: a protocol no filter test matches.
        let data = behind(&2u32.to_be_bytes());
        assert_eq!(PacketFields::new(LinkType::NULL, &data, 60, 0).get(Field::LinkProto), FieldValue::Missing);
        let data = behind(&7u32.to_le_bytes());
        assert_eq!(PacketFields::new(LinkType::NULL, &data, 60, 0).get(Field::Ip4Src), FieldValue::Missing);
        let mut data = behind(&[]);
        data[0] = 0x55;
        assert_eq!(PacketFields::new(LinkType::RAW, &data, 60, 0).get(Field::LinkProto), FieldValue::Missing);
        let data = behind(&[0xff, 0x03, 0x08, 0x00]);
        assert_eq!(PacketFields::new(LinkType::PPP, &data, 60, 0).get(Field::Ip4Src), FieldValue::Missing);
        let data = behind(&[]);
        let p = PacketFields::new(LinkType::IPV6, &data, 60, 0);
        assert_eq!((p.get(Field::LinkProto), p.get(Field::Ip4Src)), (FieldValue::Value(0x86dd), FieldValue::Missing));
        // IPv6 behind BSD loopback (family 24, 28 or 30), and ARP behind Linux SLL.
        let mut data = 30u32.to_le_bytes().to_vec();
        data.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
        data.extend_from_slice(&[0u8; 32]);
        data[4 + 8 + 15] = 1;
        data.extend_from_slice(&[0, 53, 0, 54, 0, 8, 0, 0]);
        let p = PacketFields::new(LinkType::NULL, &data, 60, 0);
        assert_eq!(p.get(Field::Ip6Src), FieldValue::Value(1));
        assert_eq!(p.get(Field::DstPort), FieldValue::Value(54));
        let mut data = vec![0u8; 14];
        data.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 192, 168, 0, 1]);
        data.extend_from_slice(&[0, 0, 0, 0, 0, 0, 192, 168, 0, 2]);
        let p = PacketFields::new(LinkType::LINUX_SLL, &data, 60, 0);
        assert_eq!(p.get(Field::ArpSpa), FieldValue::Value(0xc0a8_0001));
        assert_eq!(p.get(Field::ArpTpa), FieldValue::Value(0xc0a8_0002));
    }

    proptest::proptest! {
        /// Every way of reading fields agrees with `get`, on frames of any bytes and length (the ether types,
        /// IP versions and protocols that decide the fields are drawn from the interesting ones).
        #[test]
        fn every_reader_agrees_with_get(
            mut frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            ether in proptest::sample::select(vec![0x0800u16, 0x86dd, 0x0806, 0x8100, 0x88a8, 0x1234]),
            proto in proptest::sample::select(vec![6u8, 17, 132, 1]),
            linktype in proptest::sample::select(vec![LinkType::ETHERNET, LinkType(101), LinkType(0), LinkType(113), LinkType(9)]),
        ) {
            if frame.len() >= 14 {
                frame[12..14].copy_from_slice(&ether.to_be_bytes());
            }
            for at in [20, 23] {
                if frame.len() > at {
                    frame[at] = proto;
                }
            }
            let p = PacketFields::new(linktype, &frame, 99, 5);
            let want: Vec<FieldValue> = Field::ALL.iter().map(|&f| p.get(f)).collect();
            proptest::prop_assert_eq!(&p.get_all()[..], &want[..]);
            proptest::prop_assert_eq!(&p.get_many(Field::ALL)[..], &want[..]);
            let r = p.reader();
            let read: Vec<FieldValue> = Field::ALL.iter().map(|&f| r.get(f)).collect();
            proptest::prop_assert_eq!(read, want);
        }
    }
}
