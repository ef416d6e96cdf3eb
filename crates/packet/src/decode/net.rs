//! Network layer: IPv4 (options, fragments), IPv6 (extension-header chains) and ARP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::transport;
use super::{Arp, Decoded, Fragment, Ip, Layer, StopReason, be16, be32};
use crate::types::IpProto;

pub(super) fn ipv4(d: &mut Decoded, b: &[u8], off: usize) {
    if off > b.len() {
        // A length field of an outer header points past the captured bytes.
        d.truncated(Layer::Ipv4, off, 20);
        return;
    }
    d.l3_offset = Some(off as u32);
    if b.len() < off + 20 {
        d.truncated(Layer::Ipv4, off, 20);
        return;
    }
    if b[off] >> 4 != 4 {
        d.stop(Layer::Ipv4, off, StopReason::Malformed("IPv4 header with another version"));
        return;
    }
    let ihl = usize::from(b[off] & 0x0f) * 4;
    let flags_off = be16(b, off + 6);
    let frag_off = flags_off & 0x1fff;
    let more = flags_off & 0x2000 != 0;
    let fragment =
        (more || frag_off != 0).then_some(Fragment { offset: frag_off, more, id: u32::from(be16(b, off + 4)) });
    let proto = IpProto(b[off + 9]);
    let src = Ipv4Addr::new(b[off + 12], b[off + 13], b[off + 14], b[off + 15]);
    let dst = Ipv4Addr::new(b[off + 16], b[off + 17], b[off + 18], b[off + 19]);
    d.ip = Some(Ip {
        version: 4,
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
        next_header: proto,
        proto,
        ttl: b[off + 8],
        header_len: ihl as u16,
        total_len: u32::from(be16(b, off + 2)),
        fragment,
    });
    if ihl < 20 {
        d.stop(Layer::Ipv4, off, StopReason::Malformed("IPv4 header length below 20"));
        return;
    }
    if b.len() < off + ihl {
        d.truncated(Layer::Ipv4, off, ihl);
        return;
    }
    if frag_off != 0 {
        return; // Later fragments carry no transport header.
    }
    transport::decode(d, b, off + ihl, proto);
}

pub(super) fn ipv6(d: &mut Decoded, b: &[u8], off: usize) {
    if off > b.len() {
        // A length field of an outer header points past the captured bytes.
        d.truncated(Layer::Ipv6, off, 40);
        return;
    }
    d.l3_offset = Some(off as u32);
    if b.len() < off + 40 {
        d.truncated(Layer::Ipv6, off, 40);
        return;
    }
    if b[off] >> 4 != 6 {
        d.stop(Layer::Ipv6, off, StopReason::Malformed("IPv6 header with another version"));
        return;
    }
    let mut s = [0u8; 16];
    s.copy_from_slice(&b[off + 8..off + 24]);
    let mut t = [0u8; 16];
    t.copy_from_slice(&b[off + 24..off + 40]);
    let next_header = IpProto(b[off + 6]);
    let mut ip = Ip {
        version: 6,
        src: IpAddr::V6(Ipv6Addr::from(s)),
        dst: IpAddr::V6(Ipv6Addr::from(t)),
        next_header,
        proto: next_header,
        ttl: b[off + 7],
        header_len: 40,
        total_len: 40 + u32::from(be16(b, off + 4)),
        fragment: None,
    };
    // Walk the extension-header chain to the upper-layer protocol.
    let mut nh = next_header.0;
    let mut p = off + 40;
    let mut later_fragment = false;
    loop {
        let ext_len = match nh {
            0 | 43 | 60 | 135 | 139 | 140 => {
                if b.len() < p + 2 {
                    None
                } else {
                    Some((usize::from(b[p + 1]) + 1) * 8)
                }
            }
            51 => {
                if b.len() < p + 2 {
                    None
                } else {
                    Some((usize::from(b[p + 1]) + 2) * 4)
                }
            }
            44 => {
                if b.len() < p + 8 {
                    None
                } else {
                    let fo = be16(b, p + 2);
                    let frag = Fragment { offset: fo >> 3, more: fo & 1 != 0, id: be32(b, p + 4) };
                    later_fragment = frag.offset != 0;
                    ip.fragment = Some(frag);
                    Some(8)
                }
            }
            _ => break,
        };
        let Some(len) = ext_len else {
            ip.proto = IpProto(nh);
            ip.header_len = (p - off).min(u16::MAX as usize) as u16;
            d.ip = Some(ip);
            d.truncated(Layer::Ipv6Ext, p, if nh == 44 { 8 } else { 2 });
            return;
        };
        nh = b[p];
        p += len;
        if later_fragment {
            break;
        }
    }
    ip.proto = IpProto(nh);
    ip.header_len = (p - off).min(u16::MAX as usize) as u16;
    d.ip = Some(ip);
    if later_fragment || nh == IpProto::IPV6_NONXT.0 {
        return;
    }
    if b.len() < p {
        d.truncated(Layer::Ipv6Ext, off + 40, p - off - 40);
        return;
    }
    transport::decode(d, b, p, IpProto(nh));
}

pub(super) fn arp(d: &mut Decoded, b: &[u8], off: usize) {
    if off > b.len() {
        // A length field of an outer header points past the captured bytes.
        d.truncated(Layer::Arp, off, 8);
        return;
    }
    d.l3_offset = Some(off as u32);
    if b.len() < off + 8 {
        d.truncated(Layer::Arp, off, 8);
        return;
    }
    let hlen = usize::from(b[off + 4]);
    let plen = usize::from(b[off + 5]);
    let op = be16(b, off + 6);
    let spa = off + 8 + hlen;
    let tpa = spa + plen + hlen;
    let ip4 = |at: usize| (plen == 4 && b.len() >= at + 4).then(|| [b[at], b[at + 1], b[at + 2], b[at + 3]]);
    d.arp = Some(Arp { op, sender_ip: ip4(spa), target_ip: ip4(tpa) });
    if b.len() < tpa + plen {
        d.truncated(Layer::Arp, off, tpa + plen - off);
    }
}
