//! Transport headers (TCP, UDP, SCTP, ICMP, ICMPv6, IGMP) and the tunnels found there (GRE, ERSPAN, IP-in-IP,
//! VXLAN, Geneve, GTP-U).

use super::{Decoded, Layer, StopReason, Transport, Tunnel, TunnelKind, be16};
use crate::types::{IpProto, LinkType};

/// UDP port of VXLAN (RFC 7348).
pub const VXLAN_PORT: u16 = 4789;
/// UDP port of Geneve (RFC 8926).
pub const GENEVE_PORT: u16 = 6081;
/// UDP port of GTP-U.
pub const GTPU_PORT: u16 = 2152;

pub(super) fn decode(d: &mut Decoded, b: &[u8], off: usize, proto: IpProto) {
    d.l4_offset = Some(off as u32);
    let avail = b.len().saturating_sub(off);
    match proto {
        IpProto::TCP => {
            if avail < 4 {
                d.truncated(Layer::Transport, off, 20);
                return;
            }
            let flags = if avail >= 14 { b[off + 13] } else { 0 };
            let header_len = if avail >= 13 { (b[off + 12] >> 4) * 4 } else { 0 };
            d.transport =
                Some(Transport::Tcp { src_port: be16(b, off), dst_port: be16(b, off + 2), flags, header_len });
            if avail < 20 {
                d.truncated(Layer::Transport, off, 20);
            }
        }
        IpProto::UDP => {
            if avail < 4 {
                d.truncated(Layer::Transport, off, 8);
                return;
            }
            let (sp, dp) = (be16(b, off), be16(b, off + 2));
            d.transport = Some(Transport::Udp { src_port: sp, dst_port: dp });
            if avail < 8 {
                d.truncated(Layer::Transport, off, 8);
                return;
            }
            udp_tunnel(d, b, off + 8, sp, dp);
        }
        IpProto::SCTP => {
            if avail < 4 {
                d.truncated(Layer::Transport, off, 12);
                return;
            }
            d.transport = Some(Transport::Sctp { src_port: be16(b, off), dst_port: be16(b, off + 2) });
            if avail < 12 {
                d.truncated(Layer::Transport, off, 12);
            }
        }
        IpProto::ICMP | IpProto::ICMPV6 | IpProto::IGMP => {
            if avail < 1 {
                d.truncated(Layer::Transport, off, 4);
                return;
            }
            let ty = b[off];
            let code = if avail >= 2 { b[off + 1] } else { 0 };
            d.transport = Some(match proto {
                IpProto::ICMP => Transport::Icmp { ty, code },
                IpProto::ICMPV6 => Transport::Icmpv6 { ty, code },
                _ => Transport::Igmp { ty },
            });
            if avail < 2 {
                d.truncated(Layer::Transport, off, 4);
            }
        }
        IpProto::IPIP | IpProto::IPV6 => {
            set_tunnel(d, b, TunnelKind::IpInIp, off, LinkType::RAW);
        }
        IpProto::GRE => gre(d, b, off),
        _ => d.stop(Layer::Transport, off, StopReason::Unsupported),
    }
}

fn set_tunnel(d: &mut Decoded, b: &[u8], kind: TunnelKind, inner: usize, link: LinkType) {
    if inner > b.len() {
        d.truncated(Layer::Tunnel, d.l4_offset.unwrap_or(0) as usize, inner - d.l4_offset.unwrap_or(0) as usize);
        return;
    }
    d.tunnel = Some(Tunnel { kind, inner_offset: inner as u32, inner_link: link });
}

fn gre(d: &mut Decoded, b: &[u8], off: usize) {
    if b.len() < off + 4 {
        d.truncated(Layer::Tunnel, off, 4);
        return;
    }
    let flags = be16(b, off);
    let proto = be16(b, off + 2);
    let version = flags & 7;
    let mut hl = 4;
    if flags & 0xc000 != 0 {
        hl += 4; // checksum (and offset) present when C or R is set
    }
    if flags & 0x2000 != 0 {
        hl += 4; // key
    }
    if flags & 0x1000 != 0 {
        hl += 4; // sequence number
    }
    if version == 1 && flags & 0x0080 != 0 {
        hl += 4; // PPTP acknowledgment number
    }
    if version > 1 {
        d.stop(Layer::Tunnel, off, StopReason::Malformed("GRE version above 1"));
        return;
    }
    let inner = off + hl;
    match proto {
        0x0800 | 0x86dd => set_tunnel(d, b, TunnelKind::Gre, inner, LinkType::RAW),
        0x6558 => set_tunnel(d, b, TunnelKind::Gre, inner, LinkType::ETHERNET),
        0x88be => {
            // ERSPAN type II carries an 8-byte header (and a GRE sequence number); type I has none.
            let erspan = if flags & 0x1000 != 0 { 8 } else { 0 };
            set_tunnel(d, b, TunnelKind::Erspan, inner + erspan, LinkType::ETHERNET)
        }
        0x22eb => {
            // ERSPAN type III: 12 bytes, plus an 8-byte platform sub-header when the O bit is set.
            if b.len() < inner + 12 {
                d.truncated(Layer::Tunnel, inner, 12);
                return;
            }
            let extra = if b[inner + 11] & 1 != 0 { 8 } else { 0 };
            set_tunnel(d, b, TunnelKind::Erspan, inner + 12 + extra, LinkType::ETHERNET)
        }
        _ => d.stop(Layer::Tunnel, off, StopReason::Unsupported),
    }
}

fn udp_tunnel(d: &mut Decoded, b: &[u8], off: usize, sp: u16, dp: u16) {
    let is = |p: u16| sp == p || dp == p;
    if is(VXLAN_PORT) {
        if b.len() >= off + 8 && b[off] & 0x08 != 0 {
            set_tunnel(d, b, TunnelKind::Vxlan, off + 8, LinkType::ETHERNET);
        }
    } else if is(GENEVE_PORT) {
        if b.len() >= off + 8 {
            let opt = usize::from(b[off] & 0x3f) * 4;
            let link = match be16(b, off + 2) {
                0x6558 => LinkType::ETHERNET,
                0x0800 | 0x86dd => LinkType::RAW,
                _ => return,
            };
            set_tunnel(d, b, TunnelKind::Geneve, off + 8 + opt, link);
        }
    } else if is(GTPU_PORT) && b.len() >= off + 8 {
        let flags = b[off];
        // Version 1, protocol type GTP, message type 255 (G-PDU) carries a user packet.
        if flags >> 5 != 1 || flags & 0x10 == 0 || b[off + 1] != 0xff {
            return;
        }
        let mut p = off + 8;
        if flags & 0x07 != 0 {
            // Sequence number, N-PDU number and next-extension-header type.
            if b.len() < p + 4 {
                return;
            }
            let mut next = b[p + 3];
            p += 4;
            while next != 0 {
                if b.len() < p + 1 {
                    return;
                }
                let len = usize::from(b[p]) * 4;
                if len == 0 || b.len() < p + len {
                    return;
                }
                next = b[p + len - 1];
                p += len;
            }
        }
        set_tunnel(d, b, TunnelKind::GtpU, p, LinkType::RAW);
    }
}
