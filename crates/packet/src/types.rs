//! Wire codes as open newtypes: link types, EtherTypes and IP protocol numbers.

use std::fmt;

/// A link-layer header type as found in pcap and pcapng files (`LINKTYPE_*`).
///
/// Open: every value is representable, known ones have constants.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct LinkType(pub u32);

impl LinkType {
    /// BSD loopback: 4-byte address family in the capturing host's byte order.
    pub const NULL: LinkType = LinkType(0);
    /// Ethernet II / 802.3.
    pub const ETHERNET: LinkType = LinkType(1);
    /// Serial Line IP with a 16-byte pseudo header.
    pub const SLIP: LinkType = LinkType(8);
    /// PPP (RFC 1661), 2-byte protocol, optionally preceded by 0xff 0x03.
    pub const PPP: LinkType = LinkType(9);
    /// Raw IP as some BSDs number it (DLT_RAW = 12).
    pub const RAW_BSD12: LinkType = LinkType(12);
    /// Raw IP as OpenBSD numbers it (DLT_RAW = 14).
    pub const RAW_BSD14: LinkType = LinkType(14);
    /// PPP in HDLC-like framing.
    pub const PPP_HDLC: LinkType = LinkType(50);
    /// PPPoE (PPP over Ethernet, session and discovery payloads).
    pub const PPP_ETHER: LinkType = LinkType(51);
    /// Raw IPv4 or IPv6, version from the first nibble.
    pub const RAW: LinkType = LinkType(101);
    /// Cisco HDLC.
    pub const C_HDLC: LinkType = LinkType(104);
    /// IEEE 802.11 without radio header.
    pub const IEEE802_11: LinkType = LinkType(105);
    /// Frame Relay.
    pub const FRELAY: LinkType = LinkType(107);
    /// OpenBSD loopback: 4-byte address family in network byte order.
    pub const LOOP: LinkType = LinkType(108);
    /// Linux "cooked" capture, version 1.
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// IEEE 802.11 with a radiotap header.
    pub const IEEE802_11_RADIOTAP: LinkType = LinkType(127);
    /// Raw IPv4.
    pub const IPV4: LinkType = LinkType(228);
    /// Raw IPv6.
    pub const IPV6: LinkType = LinkType(229);
    /// Linux netfilter log messages.
    pub const NFLOG: LinkType = LinkType(239);
    /// Linux "cooked" capture, version 2.
    pub const LINUX_SLL2: LinkType = LinkType(276);

    /// The link type proper: the low 16 bits. A pcap header's link-type field also carries FCS information in
    /// its top bits (libpcap's `LT_LINKTYPE`, `LT_FCS_LENGTH`).
    pub fn base(self) -> LinkType {
        LinkType(self.0 & 0xffff)
    }

    /// A short lower-case name, as tcpdump and capinfos spell it where one exists.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 & 0xffff {
            0 => "null",
            1 => "ether",
            8 => "slip",
            9 => "ppp",
            7 => "arcnet",
            10 => "fddi",
            12 | 14 | 101 => "raw",
            50 => "ppp-hdlc",
            51 => "ppp-ether",
            104 => "c-hdlc",
            105 => "ieee802_11",
            107 => "frelay",
            108 => "loop",
            113 => "linux-sll",
            127 => "ieee802_11-radio",
            129 => "arcnet-linux",
            192 => "ppi",
            226 => "ipnet",
            258 => "pktap",
            228 => "ipv4",
            229 => "ipv6",
            239 => "nflog",
            276 => "linux-sll2",
            _ => return None,
        })
    }
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0),
            None => write!(f, "linktype {}", self.0),
        }
    }
}

/// An EtherType (or, for 802.3 frames, the length field that stands in its place).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// ARP.
    pub const ARP: EtherType = EtherType(0x0806);
    /// Transparent Ethernet bridging (GRE carrying Ethernet).
    pub const TEB: EtherType = EtherType(0x6558);
    /// Reverse ARP.
    pub const RARP: EtherType = EtherType(0x8035);
    /// 802.1Q customer VLAN tag.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// MPLS unicast.
    pub const MPLS: EtherType = EtherType(0x8847);
    /// MPLS multicast.
    pub const MPLS_MC: EtherType = EtherType(0x8848);
    /// PPPoE discovery stage.
    pub const PPPOE_DISC: EtherType = EtherType(0x8863);
    /// PPPoE session stage.
    pub const PPPOE_SESS: EtherType = EtherType(0x8864);
    /// 802.1ad service VLAN tag (QinQ).
    pub const QINQ: EtherType = EtherType(0x88a8);
    /// Pre-standard QinQ tag used by some vendors.
    pub const QINQ_OLD1: EtherType = EtherType(0x9100);
    /// Pre-standard QinQ tag used by some vendors.
    pub const QINQ_OLD2: EtherType = EtherType(0x9200);

    /// Whether this EtherType introduces a VLAN tag (802.1Q, 802.1ad or a legacy QinQ value).
    pub fn is_vlan(self) -> bool {
        matches!(self.0, 0x8100 | 0x88a8 | 0x9100 | 0x9200)
    }
}

/// An IP protocol number (IPv4 protocol field, IPv6 next header).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct IpProto(pub u8);

impl IpProto {
    /// IPv6 hop-by-hop options.
    pub const HOPOPT: IpProto = IpProto(0);
    /// ICMP.
    pub const ICMP: IpProto = IpProto(1);
    /// IGMP.
    pub const IGMP: IpProto = IpProto(2);
    /// IPv4 encapsulated in IP.
    pub const IPIP: IpProto = IpProto(4);
    /// TCP.
    pub const TCP: IpProto = IpProto(6);
    /// UDP.
    pub const UDP: IpProto = IpProto(17);
    /// IPv6 encapsulated in IP.
    pub const IPV6: IpProto = IpProto(41);
    /// IPv6 routing header.
    pub const IPV6_ROUTE: IpProto = IpProto(43);
    /// IPv6 fragment header.
    pub const IPV6_FRAG: IpProto = IpProto(44);
    /// GRE.
    pub const GRE: IpProto = IpProto(47);
    /// IPsec ESP.
    pub const ESP: IpProto = IpProto(50);
    /// IPsec AH.
    pub const AH: IpProto = IpProto(51);
    /// ICMPv6.
    pub const ICMPV6: IpProto = IpProto(58);
    /// IPv6 no next header.
    pub const IPV6_NONXT: IpProto = IpProto(59);
    /// IPv6 destination options.
    pub const IPV6_OPTS: IpProto = IpProto(60);
    /// SCTP.
    pub const SCTP: IpProto = IpProto(132);

    /// A lower-case name for the common protocols.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "icmp",
            2 => "igmp",
            4 => "ipip",
            6 => "tcp",
            17 => "udp",
            41 => "ipv6",
            47 => "gre",
            50 => "esp",
            51 => "ah",
            58 => "icmp6",
            89 => "ospf",
            103 => "pim",
            112 => "vrrp",
            132 => "sctp",
            _ => return None,
        })
    }
}

impl fmt::Display for IpProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "proto-{}", self.0),
        }
    }
}

/// Resolution of the timestamps stored in a trace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TsPrecision {
    /// Microseconds (legacy pcap magic `a1b2c3d4`, pcapng default).
    Micro,
    /// Nanoseconds (legacy pcap magic `a1b23c4d`, pcapng `if_tsresol` 9).
    Nano,
}

impl TsPrecision {
    /// Units per second.
    pub fn units_per_sec(self) -> u64 {
        match self {
            TsPrecision::Micro => 1_000_000,
            TsPrecision::Nano => 1_000_000_000,
        }
    }
}
