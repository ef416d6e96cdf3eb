//! A lax header decoder: from raw bytes and a link type to the fields of every layer it can reach.
//!
//! Decoding never panics and never fails as a whole: a packet cut by the snapshot length (or simply malformed)
//! yields every field its bytes contain, and [`Decoded::stop`] says at which layer and offset decoding stopped and
//! why. Offsets are byte offsets from the start of the captured data.
//!
//! Tunnels (GRE, ERSPAN, IP-in-IP, 6in4, VXLAN, Geneve, GTP-U) are decoded outer headers first, as tcpdump sees
//! them; [`Decoded::tunnel`] says where the inner packet starts and [`Decoded::decode_inner`] decodes it.
//!
//! ```
//! use pcaptool_packet::{decode, LinkType, Transport};
//! // An Ethernet + IPv4 + UDP packet, 42 bytes.
//! let mut p = vec![0u8; 42];
//! p[12] = 0x08; // EtherType IPv4
//! p[14] = 0x45; p[16] = 0; p[17] = 28; p[23] = 17; // IPv4, total length 28, UDP
//! p[26..30].copy_from_slice(&[10, 0, 0, 1]);
//! p[30..34].copy_from_slice(&[10, 0, 0, 2]);
//! p[34..36].copy_from_slice(&53u16.to_be_bytes());
//! p[36..38].copy_from_slice(&5353u16.to_be_bytes());
//! let d = decode(LinkType::ETHERNET, &p);
//! assert_eq!(d.ip.unwrap().src.to_string(), "10.0.0.1");
//! assert!(matches!(d.transport, Some(Transport::Udp { src_port: 53, dst_port: 5353, .. })));
//! assert!(d.stop.is_none());
//! ```

mod link;
mod net;
mod transport;

use std::fmt;
use std::net::IpAddr;

use crate::types::{EtherType, IpProto, LinkType};

/// Most VLAN tags and MPLS labels recorded per packet; deeper stacks are counted and skipped.
pub const MAX_TAGS: usize = 4;

/// A layer of the protocol stack, to say where decoding stopped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Layer {
    /// The link-layer header of the capture's link type.
    Link,
    /// An 802.1Q/802.1ad tag.
    Vlan,
    /// An MPLS label stack entry.
    Mpls,
    /// A PPPoE or PPP header.
    Ppp,
    /// 802.2 LLC / SNAP.
    Llc,
    /// IPv4.
    Ipv4,
    /// IPv6 fixed header.
    Ipv6,
    /// An IPv6 extension header.
    Ipv6Ext,
    /// ARP or RARP.
    Arp,
    /// A transport header (TCP, UDP, SCTP, ICMP, ...).
    Transport,
    /// A tunnel header (GRE, VXLAN, ...).
    Tunnel,
}

/// Why decoding stopped before the end of the headers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum StopReason {
    /// The captured bytes end inside the header; `needed` bytes from the layer's offset would complete it.
    Truncated {
        /// Bytes the header needs from its offset.
        needed: u32,
    },
    /// The header's contents are impossible (bad version, length shorter than the minimum, ...).
    Malformed(&'static str),
    /// A protocol the decoder does not look into (the packet is fine).
    Unsupported,
}

/// Where and why decoding stopped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Stop {
    /// The layer that could not be decoded.
    pub layer: Layer,
    /// Its offset in the packet.
    pub offset: u32,
    /// Why.
    pub reason: StopReason,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            StopReason::Truncated { needed } => {
                write!(f, "{:?} header at offset {} is cut: {} bytes needed", self.layer, self.offset, needed)
            }
            StopReason::Malformed(why) => {
                write!(f, "{:?} header at offset {} is malformed: {}", self.layer, self.offset, why)
            }
            StopReason::Unsupported => write!(f, "{:?} payload at offset {} is not decoded", self.layer, self.offset),
        }
    }
}

/// Ethernet addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ethernet {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
}

/// IPv4 or IPv6 fragment information.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Fragment {
    /// Fragment offset in 8-byte units.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub id: u32,
}

impl Fragment {
    /// Whether this is the first fragment (offset 0), the only one that carries the transport header.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
}

/// The network-layer header (the outermost IP header).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ip {
    /// 4 or 6.
    pub version: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IPv4 protocol field or IPv6 fixed-header next header.
    pub next_header: IpProto,
    /// The upper-layer protocol after the IPv6 extension-header chain (equal to `next_header` for IPv4).
    pub proto: IpProto,
    /// TTL or hop limit.
    pub ttl: u8,
    /// IPv4 header length, or 40 plus the extension headers for IPv6.
    pub header_len: u16,
    /// IPv4 total length, or 40 plus the IPv6 payload length.
    pub total_len: u32,
    /// Fragment information when the packet is a fragment (IPv4 MF or offset set, IPv6 fragment header).
    pub fragment: Option<Fragment>,
}

/// An ARP or RARP message (Ethernet/IPv4 addresses only).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Arp {
    /// Operation (1 request, 2 reply, 3/4 RARP).
    pub op: u16,
    /// Sender protocol address, when it is IPv4.
    pub sender_ip: Option<[u8; 4]>,
    /// Target protocol address, when it is IPv4.
    pub target_ip: Option<[u8; 4]>,
}

/// The transport header fields.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Transport {
    /// TCP; `flags` is the byte at offset 13 (CWR ECE URG ACK PSH RST SYN FIN), 0 when cut before it.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Flag byte.
        flags: u8,
        /// Header length from the data offset field (0 when cut before it).
        header_len: u8,
    },
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// SCTP common header.
    Sctp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// ICMP for IPv4.
    Icmp {
        /// Type.
        ty: u8,
        /// Code (0 when cut before it).
        code: u8,
    },
    /// ICMPv6.
    Icmpv6 {
        /// Type.
        ty: u8,
        /// Code (0 when cut before it).
        code: u8,
    },
    /// IGMP.
    Igmp {
        /// Type.
        ty: u8,
    },
}

impl Transport {
    /// Source and destination ports for TCP, UDP and SCTP.
    pub fn ports(&self) -> Option<(u16, u16)> {
        match *self {
            Transport::Tcp { src_port, dst_port, .. }
            | Transport::Udp { src_port, dst_port }
            | Transport::Sctp { src_port, dst_port } => Some((src_port, dst_port)),
            _ => None,
        }
    }
}

/// A tunnel type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum TunnelKind {
    /// GRE (RFC 2784/2890).
    Gre,
    /// ERSPAN type II or III inside GRE.
    Erspan,
    /// IPv4 or IPv6 directly inside IPv4 or IPv6 (IP-in-IP, 6in4, 4in6).
    IpInIp,
    /// VXLAN (UDP 4789).
    Vxlan,
    /// Geneve (UDP 6081).
    Geneve,
    /// GTP-U (UDP 2152).
    GtpU,
}

/// What a tunnel carries and where.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Tunnel {
    /// The kind of tunnel.
    pub kind: TunnelKind,
    /// Offset of the inner packet.
    pub inner_offset: u32,
    /// How to decode the inner packet: [`LinkType::ETHERNET`] or [`LinkType::RAW`] (IPv4 or IPv6).
    pub inner_link: LinkType,
}

/// The decoded headers of one packet. `Copy`, allocation-free; fields absent from the packet are `None`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Decoded {
    /// The link type the packet was decoded as.
    pub linktype: LinkType,
    /// Ethernet addresses (Ethernet and Ethernet-carrying link types).
    pub eth: Option<Ethernet>,
    /// Number of VLAN tags (may exceed [`MAX_TAGS`]).
    pub vlan_count: u8,
    /// VLAN ids, outermost first; the first `min(vlan_count, MAX_TAGS)` are valid.
    pub vlans: [u16; MAX_TAGS],
    /// Number of MPLS labels (may exceed [`MAX_TAGS`]).
    pub mpls_count: u8,
    /// MPLS labels, outermost first.
    pub mpls: [u32; MAX_TAGS],
    /// PPPoE session id.
    pub pppoe_session: Option<u16>,
    /// The EtherType of the network layer after tags and encapsulations (for link types that have one).
    pub ethertype: Option<EtherType>,
    /// Offset of the network-layer header.
    pub l3_offset: Option<u32>,
    /// The IP header.
    pub ip: Option<Ip>,
    /// ARP or RARP.
    pub arp: Option<Arp>,
    /// Offset of the transport header (set for first fragments and unfragmented packets only).
    pub l4_offset: Option<u32>,
    /// Transport fields.
    pub transport: Option<Transport>,
    /// A tunnel whose inner packet can be decoded with [`Decoded::decode_inner`].
    pub tunnel: Option<Tunnel>,
    /// Where decoding stopped, if before the end of the known headers.
    pub stop: Option<Stop>,
}

impl Decoded {
    fn new(linktype: LinkType) -> Decoded {
        Decoded {
            linktype,
            eth: None,
            vlan_count: 0,
            vlans: [0; MAX_TAGS],
            mpls_count: 0,
            mpls: [0; MAX_TAGS],
            pppoe_session: None,
            ethertype: None,
            l3_offset: None,
            ip: None,
            arp: None,
            l4_offset: None,
            transport: None,
            tunnel: None,
            stop: None,
        }
    }

    pub(crate) fn stop(&mut self, layer: Layer, offset: usize, reason: StopReason) {
        if self.stop.is_none() {
            self.stop = Some(Stop { layer, offset: offset as u32, reason });
        }
    }

    pub(crate) fn truncated(&mut self, layer: Layer, offset: usize, needed: usize) {
        self.stop(layer, offset, StopReason::Truncated { needed: needed as u32 });
    }

    /// The VLAN ids present, outermost first (at most [`MAX_TAGS`]).
    pub fn vlan_ids(&self) -> &[u16] {
        &self.vlans[..usize::from(self.vlan_count).min(MAX_TAGS)]
    }

    /// The MPLS labels present, outermost first (at most [`MAX_TAGS`]).
    pub fn mpls_labels(&self) -> &[u32] {
        &self.mpls[..usize::from(self.mpls_count).min(MAX_TAGS)]
    }

    /// Whether the decoder stopped because the captured bytes ran out.
    pub fn is_truncated(&self) -> bool {
        matches!(self.stop, Some(Stop { reason: StopReason::Truncated { .. }, .. }))
    }

    /// Decodes the packet carried by [`tunnel`](Self::tunnel), with offsets still relative to `data`'s start.
    /// `data` must be the packet this was decoded from.
    pub fn decode_inner(&self, data: &[u8]) -> Option<Decoded> {
        let t = self.tunnel?;
        Some(decode_from(t.inner_link, data, t.inner_offset as usize))
    }
}

/// Decodes a packet of the given link type.
pub fn decode(linktype: LinkType, data: &[u8]) -> Decoded {
    decode_from(linktype, data, 0)
}

/// Decodes a packet whose link-layer header starts at `start` in `data`.
pub fn decode_from(linktype: LinkType, data: &[u8], start: usize) -> Decoded {
    let mut d = Decoded::new(linktype);
    if start <= data.len() {
        link::decode_link(&mut d, data, start);
    } else {
        d.truncated(Layer::Link, start, 0);
    }
    d
}

#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests;
