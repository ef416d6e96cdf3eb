//! Link layers: Ethernet (with LLC/SNAP), VLAN, MPLS, PPPoE/PPP, Linux cooked captures, loopback, raw IP,
//! Cisco HDLC, Frame Relay, SLIP, 802.11 (plain and radiotap) and NFLOG.

use super::net;
use super::{Decoded, Ethernet, Layer, MAX_TAGS, StopReason, be16, be32};
use crate::types::EtherType;

pub(super) fn decode_link(d: &mut Decoded, b: &[u8], off: usize) {
    match d.linktype.0 & 0xffff {
        1 => ethernet(d, b, off),
        10 => fddi(d, b, off),
        6 => token_ring(d, b, off),
        122 => ip_over_fc(d, b, off),
        0 => null_loopback(d, b, off, false),
        108 => null_loopback(d, b, off, true),
        12 | 14 | 101 => raw_ip(d, b, off),
        228 => net::ipv4(d, b, off),
        229 => net::ipv6(d, b, off),
        113 => linux_sll(d, b, off),
        276 => linux_sll2(d, b, off),
        9 | 50 => ppp(d, b, off, true),
        51 => pppoe(d, b, off, false),
        104 => chdlc(d, b, off),
        107 => frelay(d, b, off),
        8 => {
            // DLT_SLIP: libpcap's 16-byte pseudo header (direction and compressed-header copy), then IP.
            if b.len() < off + 16 {
                d.truncated(Layer::Link, off, 16);
            } else {
                raw_ip(d, b, off + 16)
            }
        }
        105 => ieee802_11(d, b, off),
        7 | 129 => arcnet(d, b, off, d.linktype.0 & 0xffff == 129),
        192 => ppi(d, b, off),
        226 => ipnet(d, b, off),
        258 => pktap(d, b, off),
        127 => radiotap(d, b, off),
        239 => nflog(d, b, off),
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// Ethernet II or 802.3 with LLC/SNAP.
pub(super) fn ethernet(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 14 {
        if b.len() >= off + 12 {
            d.eth = Some(eth_addrs(b, off));
        }
        d.truncated(Layer::Link, off, 14);
        return;
    }
    d.eth = Some(eth_addrs(b, off));
    let ty = be16(b, off + 12);
    if ty <= 1500 {
        llc(d, b, off + 14);
    } else {
        ethertype(d, b, off + 14, EtherType(ty));
    }
}

/// FDDI: frame control, destination and source addresses (13 bytes), then 802.2 LLC (SNAP for IP). The
/// addresses are given as written in the frame.
fn fddi(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 13 {
        d.truncated(Layer::Link, off, 13);
        return;
    }
    d.eth = Some(eth_addrs(b, off + 1));
    llc(d, b, off + 13);
}

/// Token ring (802.5): access control, frame control, destination and source addresses, the routing
/// information field when the source's top bit says so, then 802.2 LLC.
fn token_ring(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 14 {
        d.truncated(Layer::Link, off, 14);
        return;
    }
    d.eth = Some(eth_addrs(b, off + 2));
    let mut llc_at = off + 14;
    if b[off + 8] & 0x80 != 0 {
        let Some(&rif) = b.get(off + 14) else {
            d.truncated(Layer::Link, off, 15);
            return;
        };
        llc_at += usize::from(rif & 0x1f);
    }
    llc(d, b, llc_at);
}

/// IP over Fibre Channel (RFC 2625): a 16-byte network header (destination and source as 2-byte NAA and
/// 6-byte addresses), then 802.2 LLC.
fn ip_over_fc(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 16 {
        d.truncated(Layer::Link, off, 16);
        return;
    }
    let mut e = eth_addrs(b, off + 2);
    e.src.copy_from_slice(&b[off + 10..off + 16]);
    d.eth = Some(e);
    llc(d, b, off + 16);
}

fn eth_addrs(b: &[u8], off: usize) -> Ethernet {
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&b[off..off + 6]);
    src.copy_from_slice(&b[off + 6..off + 12]);
    Ethernet { dst, src }
}

/// 802.2 LLC: SNAP carries an EtherType; other SAPs are not decoded further.
fn llc(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 3 {
        d.truncated(Layer::Llc, off, 3);
        return;
    }
    if b[off] == 0xaa && b[off + 1] == 0xaa && b[off + 2] == 0x03 {
        if b.len() < off + 8 {
            d.truncated(Layer::Llc, off, 8);
            return;
        }
        ethertype(d, b, off + 8, EtherType(be16(b, off + 6)));
    } else {
        d.stop(Layer::Llc, off, StopReason::Unsupported);
    }
}

/// Dispatches on an EtherType at `off`: tags, MPLS, PPPoE, IP, ARP.
pub(super) fn ethertype(d: &mut Decoded, b: &[u8], mut off: usize, mut ty: EtherType) {
    // VLAN tags at any depth.
    while ty.is_vlan() {
        if b.len() < off + 4 {
            d.ethertype = Some(ty);
            d.truncated(Layer::Vlan, off, 4);
            return;
        }
        let n = usize::from(d.vlan_count);
        if n < MAX_TAGS {
            d.vlans[n] = be16(b, off) & 0x0fff;
        }
        d.vlan_count = d.vlan_count.saturating_add(1);
        ty = EtherType(be16(b, off + 2));
        off += 4;
    }
    d.ethertype = Some(ty);
    match ty {
        EtherType::IPV4 => net::ipv4(d, b, off),
        EtherType::IPV6 => net::ipv6(d, b, off),
        EtherType::ARP | EtherType::RARP => net::arp(d, b, off),
        EtherType::MPLS | EtherType::MPLS_MC => mpls(d, b, off),
        EtherType::PPPOE_SESS => pppoe(d, b, off, true),
        // Tags that sit between the MAC header and the payload's EtherType.
        EtherType(0x8926) => skip_tag(d, b, off, 4), // VN-Tag
        EtherType(0x893f) => skip_tag(d, b, off, 6), // IEEE 802.1BR E-Tag
        EtherType(0x88e5) => macsec(d, b, off),
        EtherType(0x894f) => nsh(d, b, off),
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// A fixed-size tag followed by the next EtherType.
fn skip_tag(d: &mut Decoded, b: &[u8], off: usize, len: usize) {
    if b.len() < off + len + 2 {
        d.truncated(Layer::Link, off, len + 2);
        return;
    }
    ethertype(d, b, off + len + 2, EtherType(be16(b, off + len)))
}

/// MACsec SecTAG: the payload is readable only when it is not encrypted (integrity only).
fn macsec(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 6 {
        d.truncated(Layer::Link, off, 6);
        return;
    }
    let tci = b[off];
    if tci & 0x0c != 0 {
        // E (encrypted) or C (changed text) bit: the payload is ciphertext.
        d.stop(Layer::Link, off, StopReason::Unsupported);
        return;
    }
    let len = if tci & 0x20 != 0 { 14 } else { 6 };
    skip_tag(d, b, off, len)
}

/// Network Service Header (RFC 8300): length in 4-byte words, then IPv4, IPv6 or Ethernet.
fn nsh(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 8 {
        d.truncated(Layer::Link, off, 8);
        return;
    }
    let len = usize::from(b[off + 1] & 0x3f) * 4;
    if len < 8 {
        d.stop(Layer::Link, off, StopReason::Malformed("NSH length below 8 bytes"));
        return;
    }
    match b[off + 3] {
        1 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, off + len)
        }
        2 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, off + len)
        }
        3 => ethernet(d, b, off + len),
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// An MPLS label stack; the payload is guessed from its first nibble, as tcpdump does.
fn mpls(d: &mut Decoded, b: &[u8], mut off: usize) {
    loop {
        if b.len() < off + 4 {
            d.truncated(Layer::Mpls, off, 4);
            return;
        }
        let e = be32(b, off);
        let n = usize::from(d.mpls_count);
        if n < MAX_TAGS {
            d.mpls[n] = e >> 12;
        }
        d.mpls_count = d.mpls_count.saturating_add(1);
        off += 4;
        if e & 0x100 != 0 {
            break;
        }
    }
    if b.len() <= off {
        d.truncated(Layer::Mpls, off, 1);
        return;
    }
    match b[off] >> 4 {
        4 => net::ipv4(d, b, off),
        6 => net::ipv6(d, b, off),
        _ => d.stop(Layer::Mpls, off, StopReason::Unsupported),
    }
}

/// PPPoE header (6 bytes), then PPP for session packets.
fn pppoe(d: &mut Decoded, b: &[u8], off: usize, session_known: bool) {
    if b.len() < off + 6 {
        d.truncated(Layer::Ppp, off, 6);
        return;
    }
    // With DLT_PPP_ETHER the code tells session (0) from discovery packets.
    if session_known || b[off + 1] == 0 {
        d.pppoe_session = Some(be16(b, off + 2));
        ppp(d, b, off + 6, false);
    } else {
        d.stop(Layer::Ppp, off, StopReason::Unsupported);
    }
}

/// PPP: optional HDLC address/control (0xff 0x03), then a 1- or 2-byte protocol.
fn ppp(d: &mut Decoded, b: &[u8], mut off: usize, hdlc: bool) {
    if hdlc && b.len() >= off + 2 && b[off] == 0xff && b[off + 1] == 0x03 {
        off += 2;
    }
    if b.len() < off + 1 {
        d.truncated(Layer::Ppp, off, 2);
        return;
    }
    let (proto, len) = if b[off] & 1 == 1 {
        (u16::from(b[off]), 1)
    } else if b.len() < off + 2 {
        d.truncated(Layer::Ppp, off, 2);
        return;
    } else {
        (be16(b, off), 2)
    };
    let off = off + len;
    match proto {
        0x0021 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, off)
        }
        0x0057 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, off)
        }
        0x0281 | 0x0283 => {
            d.ethertype = Some(EtherType::MPLS);
            mpls(d, b, off)
        }
        _ => d.stop(Layer::Ppp, off, StopReason::Unsupported),
    }
}

/// BSD loopback (`LINKTYPE_NULL`, host byte order) and OpenBSD loopback (`LINKTYPE_LOOP`, network order).
fn null_loopback(d: &mut Decoded, b: &[u8], off: usize, network_order: bool) {
    if b.len() < off + 4 {
        d.truncated(Layer::Link, off, 4);
        return;
    }
    let raw = [b[off], b[off + 1], b[off + 2], b[off + 3]];
    let mut af = u32::from_be_bytes(raw);
    // LINKTYPE_NULL is in the capturing host's byte order: a family in the high bytes means the other order.
    if !network_order && af & 0xffff_0000 != 0 {
        af = u32::from_le_bytes(raw);
    }
    match af {
        2 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, off + 4)
        }
        10 | 24 | 28 | 30 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, off + 4)
        }
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// Raw IP: the version comes from the first nibble.
pub(super) fn raw_ip(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() <= off {
        d.truncated(Layer::Link, off, 1);
        return;
    }
    match b[off] >> 4 {
        4 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, off)
        }
        6 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, off)
        }
        _ => d.stop(Layer::Link, off, StopReason::Malformed("raw IP packet with a version other than 4 or 6")),
    }
}

/// Linux cooked capture v1: 16 bytes, protocol at 14.
fn linux_sll(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 16 {
        d.truncated(Layer::Link, off, 16);
        return;
    }
    sll_protocol(d, b, off + 16, be16(b, off + 14), be16(b, off + 2));
}

/// Linux cooked capture v2: 20 bytes, protocol at 0.
fn linux_sll2(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 20 {
        d.truncated(Layer::Link, off, 20);
        return;
    }
    sll_protocol(d, b, off + 20, be16(b, off), be16(b, off + 8));
}

fn sll_protocol(d: &mut Decoded, b: &[u8], off: usize, proto: u16, hatype: u16) {
    match (proto, hatype) {
        // ARPHRD_IPGRE and friends carry a GRE protocol type; others an EtherType.
        (0x0004, _) => llc(d, b, off),
        (0x0001 | 0x0003, _) => d.stop(Layer::Link, off, StopReason::Unsupported),
        (p, _) if p > 1500 => ethertype(d, b, off, EtherType(p)),
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// Cisco HDLC: address, control, EtherType.
fn chdlc(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 4 {
        d.truncated(Layer::Link, off, 4);
        return;
    }
    ethertype(d, b, off + 4, EtherType(be16(b, off + 2)));
}

/// Frame Relay (Q.922 address, UI control, NLPID).
fn frelay(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 4 {
        d.truncated(Layer::Link, off, 4);
        return;
    }
    // Two-byte address (EA bit ends it), then either control 0x03 with an optional pad and the NLPID (RFC 2427),
    // or an EtherType directly (Cisco encapsulation).
    let mut p = off + 2;
    if b[off + 1] & 1 == 0 {
        p += 1;
    }
    if b.len() < p + 2 {
        d.truncated(Layer::Link, off, p + 2 - off);
        return;
    }
    if b[p] != 0x03 {
        return ethertype(d, b, p + 2, EtherType(be16(b, p)));
    }
    p += 1;
    if b[p] == 0 {
        p += 1;
    }
    if b.len() <= p {
        d.truncated(Layer::Link, off, p - off + 1);
        return;
    }
    match b[p] {
        0xcc => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, p + 1)
        }
        0x8e => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, p + 1)
        }
        0x80 if b.len() >= p + 6 => ethertype(d, b, p + 6, EtherType(be16(b, p + 4))),
        _ => d.stop(Layer::Link, p, StopReason::Unsupported),
    }
}

/// Radiotap header (length at bytes 2-3, little-endian), then 802.11.
fn radiotap(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 4 {
        d.truncated(Layer::Link, off, 4);
        return;
    }
    let len = usize::from(u16::from_le_bytes([b[off + 2], b[off + 3]]));
    if len < 8 {
        d.stop(Layer::Link, off, StopReason::Malformed("radiotap header shorter than 8 bytes"));
        return;
    }
    ieee802_11(d, b, off + len)
}

/// IEEE 802.11 data frames with LLC/SNAP; management, control and protected frames are not decoded.
fn ieee802_11(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 24 {
        d.truncated(Layer::Link, off, 24);
        return;
    }
    let fc0 = b[off];
    let fc1 = b[off + 1];
    let ftype = (fc0 >> 2) & 3;
    if ftype != 2 || fc1 & 0x40 != 0 {
        d.stop(Layer::Link, off, StopReason::Unsupported);
        return;
    }
    let subtype = fc0 >> 4;
    if subtype & 0x4 != 0 {
        // Null-data frames carry no payload.
        d.stop(Layer::Link, off, StopReason::Unsupported);
        return;
    }
    let mut hl = 24;
    if fc1 & 3 == 3 {
        hl += 6;
    }
    if subtype & 0x8 != 0 {
        hl += 2;
        if fc1 & 0x80 != 0 {
            hl += 4;
        }
    }
    llc(d, b, off + hl)
}

/// ARCnet (RFC 1051 and RFC 1201 framing); the Linux variant has two more bytes (an offset) before the protocol id.
fn arcnet(d: &mut Decoded, b: &[u8], off: usize, linux: bool) {
    let p = off + if linux { 4 } else { 2 };
    if b.len() <= p {
        d.truncated(Layer::Link, off, p + 1 - off);
        return;
    }
    let proto = b[p];
    // RFC 1201 types carry a split flag and a sequence number; an exception packet (split flag 0xff) four more.
    let rfc1201 = matches!(proto, 0xd4 | 0xd5 | 0xd6 | 0xc4);
    let mut start = p + 1;
    if rfc1201 {
        if b.len() < p + 4 {
            d.truncated(Layer::Link, off, p + 4 - off);
            return;
        }
        start = p + 4;
        if b[p + 1] == 0xff {
            start += 4;
        }
    }
    match proto {
        0xd4 | 0xf0 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, start)
        }
        0xc4 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, start)
        }
        0xd5 | 0xf1 => {
            d.ethertype = Some(EtherType::ARP);
            net::arp(d, b, start)
        }
        _ => d.stop(Layer::Link, p, StopReason::Unsupported),
    }
}

/// Per-Packet Information header (its length at bytes 2-3 and the payload's link type at 4-7, little-endian).
fn ppi(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 8 {
        d.truncated(Layer::Link, off, 8);
        return;
    }
    let len = usize::from(u16::from_le_bytes([b[off + 2], b[off + 3]]));
    let dlt = u32::from_le_bytes([b[off + 4], b[off + 5], b[off + 6], b[off + 7]]);
    inner_link(d, b, off, len, dlt)
}

/// Apple's PKTAP: header length and the payload's link type at bytes 0-3 and 4-7 (host order, little-endian).
fn pktap(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 8 {
        d.truncated(Layer::Link, off, 8);
        return;
    }
    let len = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]) as usize;
    let dlt = u32::from_le_bytes([b[off + 4], b[off + 5], b[off + 6], b[off + 7]]);
    inner_link(d, b, off, len, dlt)
}

/// Decodes the payload of a pseudo-header as its own link type (no nesting of pseudo-headers).
fn inner_link(d: &mut Decoded, b: &[u8], off: usize, len: usize, dlt: u32) {
    if len < 8 || dlt == 192 || dlt == 258 {
        d.stop(Layer::Link, off, StopReason::Malformed("pseudo-header length or payload link type"));
        return;
    }
    if b.len() < off + len {
        d.truncated(Layer::Link, off, len);
        return;
    }
    let outer = d.linktype;
    d.linktype = crate::LinkType(dlt);
    decode_link(d, b, off + len);
    d.linktype = outer;
}

/// illumos/Solaris IPNET: a 24-byte header whose second byte is the address family.
fn ipnet(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 24 {
        d.truncated(Layer::Link, off, 24);
        return;
    }
    match b[off + 1] {
        2 => {
            d.ethertype = Some(EtherType::IPV4);
            net::ipv4(d, b, off + 24)
        }
        26 => {
            d.ethertype = Some(EtherType::IPV6);
            net::ipv6(d, b, off + 24)
        }
        _ => d.stop(Layer::Link, off, StopReason::Unsupported),
    }
}

/// Linux NFLOG: a 4-byte header then TLVs; the payload TLV (type 9) holds the IP packet.
fn nflog(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 4 {
        d.truncated(Layer::Link, off, 4);
        return;
    }
    let family = b[off];
    let mut p = off + 4;
    while b.len() >= p + 4 {
        let len = usize::from(u16::from_le_bytes([b[p], b[p + 1]]));
        let ty = u16::from_le_bytes([b[p + 2], b[p + 3]]) & 0x7fff;
        if len < 4 {
            d.stop(Layer::Link, p, StopReason::Malformed("NFLOG TLV shorter than 4 bytes"));
            return;
        }
        if ty == 9 {
            let start = p + 4;
            return match family {
                2 => {
                    d.ethertype = Some(EtherType::IPV4);
                    net::ipv4(d, b, start)
                }
                10 => {
                    d.ethertype = Some(EtherType::IPV6);
                    net::ipv6(d, b, start)
                }
                _ => raw_ip(d, b, start),
            };
        }
        p += (len + 3) & !3;
    }
    d.stop(Layer::Link, p.min(b.len()), StopReason::Unsupported);
}
