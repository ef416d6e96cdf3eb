//! Canonical bidirectional flow keys: the 5-tuple plus the outermost VLAN id, the same for both directions.

use std::net::IpAddr;

use crate::decode::Decoded;
use crate::types::{IpProto, LinkType};

/// Which way a packet travels relative to its [`FlowKey`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Direction {
    /// From the `lo` endpoint to the `hi` endpoint.
    LoToHi,
    /// From the `hi` endpoint to the `lo` endpoint.
    HiToLo,
}

/// A bidirectional flow key: both directions of a connection map to the same key.
///
/// The endpoints are ordered so that `(lo_addr, lo_port) <= (hi_addr, hi_port)`. Ports are 0 for protocols without
/// ports and for non-first fragments' protocols (which have no transport header). `vlan` is the outermost VLAN id,
/// 0 when untagged.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FlowKey {
    /// The lower endpoint's address.
    pub lo_addr: IpAddr,
    /// The higher endpoint's address.
    pub hi_addr: IpAddr,
    /// The lower endpoint's port.
    pub lo_port: u16,
    /// The higher endpoint's port.
    pub hi_port: u16,
    /// Upper-layer protocol.
    pub proto: IpProto,
    /// Outermost VLAN id, 0 when untagged.
    pub vlan: u16,
}

impl FlowKey {
    /// Builds the key of a packet going from `src` to `dst`, with its direction.
    pub fn new(src: (IpAddr, u16), dst: (IpAddr, u16), proto: IpProto, vlan: u16) -> (FlowKey, Direction) {
        let (lo, hi, dir) = if src <= dst { (src, dst, Direction::LoToHi) } else { (dst, src, Direction::HiToLo) };
        (FlowKey { lo_addr: lo.0, hi_addr: hi.0, lo_port: lo.1, hi_port: hi.1, proto, vlan }, dir)
    }

    /// The key of a decoded IP packet (outer headers), or `None` when it has no IP header.
    pub fn from_decoded(d: &Decoded) -> Option<(FlowKey, Direction)> {
        let ip = d.ip?;
        let (sp, dp) = d.transport.and_then(|t| t.ports()).unwrap_or((0, 0));
        let vlan = d.vlan_ids().first().copied().unwrap_or(0);
        Some(FlowKey::new((ip.src, sp), (ip.dst, dp), ip.proto, vlan))
    }
}

/// A [`FlowKey`] in fixed-width form, cheap to build, hash and compare: what a flow table keys on.
///
/// Addresses are numbers (an IPv4 address is its 32-bit value), `v6` says which are IPv6 (bit 0 the `lo`
/// endpoint, bit 1 the `hi` one), and the endpoints are ordered as [`FlowKey`] orders them. The conversions both
/// ways are exact.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct FlowTuple {
    /// The lower endpoint's address.
    pub lo: u128,
    /// The higher endpoint's address.
    pub hi: u128,
    /// The lower endpoint's port.
    pub lo_port: u16,
    /// The higher endpoint's port.
    pub hi_port: u16,
    /// Outermost VLAN id, 0 when untagged.
    pub vlan: u16,
    /// Upper-layer protocol.
    pub proto: u8,
    /// Bit 0: `lo` is IPv6; bit 1: `hi` is IPv6.
    pub v6: u8,
}

fn addr_bits(a: IpAddr) -> (bool, u128) {
    match a {
        IpAddr::V4(v) => (false, u128::from(u32::from(v))),
        IpAddr::V6(v) => (true, u128::from(v)),
    }
}

fn bits_addr(v6: bool, v: u128) -> IpAddr {
    if v6 { IpAddr::from(v.to_be_bytes()) } else { IpAddr::from((v as u32).to_be_bytes()) }
}

impl From<FlowKey> for FlowTuple {
    fn from(k: FlowKey) -> FlowTuple {
        let (lo6, lo) = addr_bits(k.lo_addr);
        let (hi6, hi) = addr_bits(k.hi_addr);
        FlowTuple {
            lo,
            hi,
            lo_port: k.lo_port,
            hi_port: k.hi_port,
            vlan: k.vlan,
            proto: k.proto.0,
            v6: u8::from(lo6) | u8::from(hi6) << 1,
        }
    }
}

impl From<FlowTuple> for FlowKey {
    fn from(t: FlowTuple) -> FlowKey {
        FlowKey {
            lo_addr: bits_addr(t.v6 & 1 != 0, t.lo),
            hi_addr: bits_addr(t.v6 & 2 != 0, t.hi),
            lo_port: t.lo_port,
            hi_port: t.hi_port,
            proto: IpProto(t.proto),
            vlan: t.vlan,
        }
    }
}

/// What [`plain_flow`] reads of a packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PlainFlow {
    /// The flow's key.
    pub tuple: FlowTuple,
    /// The packet's direction in it.
    pub dir: Direction,
    /// The IP length field less the IP and transport headers (saturating at 0): IPv4 total length less the
    /// header length and TCP's data offset or UDP's 8 bytes; for IPv6 the payload length less the same.
    pub payload: u32,
    /// TCP's flag byte (0 for UDP).
    pub flags: u8,
}

/// The fast path of flow tracking: reads an untagged Ethernet frame carrying an unfragmented IPv4 or IPv6 (no
/// extension headers) packet with its TCP (at least 14 bytes) or UDP (at least 4) header, and nothing else.
///
/// `None` means "not such a packet", never "not a flow": [`decode`](crate::decode) and
/// [`FlowKey::from_decoded`] handle every packet. For a packet it accepts, it agrees with them: the same key,
/// direction, ports and TCP flags; and every address and port a filter reads from it ([`Field::Ip4Src`],
/// [`Field::SrcPort`], ...) is either absent or one of the key's endpoints, never unknown.
///
/// [`Field::Ip4Src`]: crate::Field::Ip4Src
/// [`Field::SrcPort`]: crate::Field::SrcPort
#[inline]
pub fn plain_flow(linktype: LinkType, b: &[u8]) -> Option<PlainFlow> {
    if linktype != LinkType::ETHERNET || b.len() < 14 {
        return None;
    }
    let (v6, src, dst, proto, ip_payload, l4) = match u16::from_be_bytes([b[12], b[13]]) {
        0x0800 => {
            let ip = b.get(14..34)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            // Version 4, a whole header, not a fragment (MF clear, offset 0).
            if ip[0] >> 4 != 4 || ihl < 20 || b.len() < 14 + ihl || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                return None;
            }
            let total = u32::from(u16::from_be_bytes([ip[2], ip[3]]));
            let src = u128::from(u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]));
            let dst = u128::from(u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]));
            (false, src, dst, ip[9], total.saturating_sub(ihl as u32), 14 + ihl)
        }
        0x86dd => {
            let ip = b.get(14..54)?;
            if ip[0] >> 4 != 6 {
                return None;
            }
            let src = u128::from_be_bytes(ip[8..24].try_into().ok()?);
            let dst = u128::from_be_bytes(ip[24..40].try_into().ok()?);
            (true, src, dst, ip[6], u32::from(u16::from_be_bytes([ip[4], ip[5]])), 54)
        }
        _ => return None,
    };
    let (sport, dport, flags, payload) = match proto {
        6 => {
            let t = b.get(l4..l4 + 14)?;
            let header_len = u32::from(t[12] >> 4) * 4;
            (
                u16::from_be_bytes([t[0], t[1]]),
                u16::from_be_bytes([t[2], t[3]]),
                t[13],
                ip_payload.saturating_sub(header_len),
            )
        }
        17 => {
            let t = b.get(l4..l4 + 4)?;
            (u16::from_be_bytes([t[0], t[1]]), u16::from_be_bytes([t[2], t[3]]), 0, ip_payload.saturating_sub(8))
        }
        _ => return None,
    };
    let (lo, hi, dir) = if (src, sport) <= (dst, dport) {
        ((src, sport), (dst, dport), Direction::LoToHi)
    } else {
        ((dst, dport), (src, sport), Direction::HiToLo)
    };
    let tuple =
        FlowTuple { lo: lo.0, hi: hi.0, lo_port: lo.1, hi_port: hi.1, vlan: 0, proto, v6: if v6 { 3 } else { 0 } };
    Some(PlainFlow { tuple, dir, payload, flags })
}

impl Decoded {
    /// The canonical bidirectional flow key of this packet and its direction, for IP packets.
    pub fn flow(&self) -> Option<(FlowKey, Direction)> {
        FlowKey::from_decoded(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Field, FieldValue, PacketFields, Transport};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn both_directions_share_a_key(a in any::<[u8; 4]>(), b in any::<[u8; 4]>(), pa: u16, pb: u16, proto: u8, vlan in 0u16..4096) {
            let a = IpAddr::from(a);
            let b = IpAddr::from(b);
            let (k1, d1) = FlowKey::new((a, pa), (b, pb), IpProto(proto), vlan);
            let (k2, d2) = FlowKey::new((b, pb), (a, pa), IpProto(proto), vlan);
            prop_assert_eq!(k1, k2);
            if (a, pa) != (b, pb) {
                prop_assert_ne!(d1, d2);
            }
            prop_assert!((k1.lo_addr, k1.lo_port) <= (k1.hi_addr, k1.hi_port));
        }

        #[test]
        fn tuples_and_keys_convert_exactly(a in any::<[u8; 16]>(), b in any::<[u8; 4]>(), a6: bool, b6: bool, pa: u16, pb: u16, proto: u8, vlan: u16) {
            let a = if a6 { IpAddr::from(a) } else { IpAddr::from([a[0], a[1], a[2], a[3]]) };
            let b = if b6 { IpAddr::from([b[0]; 16]) } else { IpAddr::from(b) };
            let (k, _) = FlowKey::new((a, pa), (b, pb), IpProto(proto), vlan);
            prop_assert_eq!(FlowKey::from(FlowTuple::from(k)), k);
        }

        /// Whatever the fast path accepts, it reads as the decoder and the filter's field reader do.
        #[test]
        fn plain_flow_agrees_with_decode_and_fields(frame in plain_ish_frame()) {
            let Some(p) = plain_flow(LinkType::ETHERNET, &frame) else { return Ok(()) };
            let d = crate::decode(LinkType::ETHERNET, &frame);
            let (key, dir) = FlowKey::from_decoded(&d).expect("an IP packet");
            prop_assert_eq!(FlowKey::from(p.tuple), key);
            prop_assert_eq!(FlowTuple::from(key), p.tuple);
            prop_assert_eq!(p.dir, dir);
            let ip = d.ip.unwrap();
            prop_assert!(ip.fragment.is_none());
            let ip_payload = ip.total_len.saturating_sub(u32::from(ip.header_len));
            match d.transport {
                Some(Transport::Tcp { flags, header_len, .. }) => {
                    prop_assert_eq!(p.flags, flags);
                    prop_assert_eq!(p.payload, ip_payload.saturating_sub(u32::from(header_len)));
                }
                Some(Transport::Udp { .. }) => {
                    prop_assert_eq!(p.flags, 0);
                    prop_assert_eq!(p.payload, ip_payload.saturating_sub(8));
                }
                t => prop_assert!(false, "transport {:?}", t),
            }
            let fields = PacketFields::new(LinkType::ETHERNET, &frame, frame.len() as u32, 0);
            let r = fields.reader();
            let addrs = [key.lo_addr, key.hi_addr];
            for (f, v6) in [(Field::Ip4Src, false), (Field::Ip4Dst, false), (Field::ArpSpa, false), (Field::ArpTpa, false), (Field::Ip6Src, true), (Field::Ip6Dst, true)] {
                match r.get(f) {
                    FieldValue::Missing => {}
                    FieldValue::Value(v) => prop_assert!(addrs.iter().any(|a| addr_bits(*a) == (v6, v)), "{:?} = {:x}", f, v),
                    FieldValue::Unknown => prop_assert!(false, "{:?} unknown", f),
                }
            }
            for f in [Field::SrcPort, Field::DstPort] {
                match r.get(f) {
                    FieldValue::Missing => {}
                    FieldValue::Value(v) => prop_assert!(v == u128::from(key.lo_port) || v == u128::from(key.hi_port)),
                    FieldValue::Unknown => prop_assert!(false, "{:?} unknown", f),
                }
            }
        }
    }

    /// Frames near the fast path's edge: IPv4 or IPv6 or something else, any header lengths, fragment bits and
    /// protocols, cut anywhere.
    fn plain_ish_frame() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::sample::select(vec![0x0800u16, 0x86dd, 0x8100, 0x0806, 0x88a8]),
            0u8..16,
            prop::sample::select(vec![6u8, 17, 1, 132, 47, 0, 44, 43]),
            prop_oneof![Just(0u16), Just(0x4000), Just(0x2000), Just(0x0001), any::<u16>()],
            prop::collection::vec(any::<u8>(), 120),
            0usize..130,
            any::<bool>(),
        )
            .prop_map(|(ethertype, ihl, proto, frag_bits, mut rest, cut, sane_len)| {
                let mut f = vec![0u8; 14];
                f[12..14].copy_from_slice(&ethertype.to_be_bytes());
                if ethertype == 0x86dd {
                    rest[0] = 0x60 | (rest[0] & 0x0f);
                    rest[6] = proto;
                } else {
                    rest[0] = 0x40 | ihl;
                    rest[9] = proto;
                    rest[6..8].copy_from_slice(&frag_bits.to_be_bytes());
                    if sane_len {
                        rest[2..4].copy_from_slice(&100u16.to_be_bytes());
                    }
                }
                f.extend_from_slice(&rest);
                f.truncate(cut.max(14));
                f
            })
    }

    #[test]
    fn plain_flow_takes_the_common_packets() {
        let mut v4 = vec![0u8; 14 + 20 + 20];
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        v4[14] = 0x45;
        v4[16..18].copy_from_slice(&40u16.to_be_bytes());
        v4[20] = 0x40; // DF: not a fragment
        v4[23] = 6;
        v4[26..30].copy_from_slice(&[10, 0, 0, 9]);
        v4[30..34].copy_from_slice(&[10, 0, 0, 1]);
        v4[34..36].copy_from_slice(&443u16.to_be_bytes());
        v4[36..38].copy_from_slice(&50000u16.to_be_bytes());
        v4[46] = 5 << 4;
        v4[47] = 0x12;
        let p = plain_flow(LinkType::ETHERNET, &v4).expect("IPv4 TCP");
        assert_eq!(
            (p.tuple.lo, p.tuple.lo_port, p.dir, p.flags, p.payload),
            (0x0a00_0001, 50000, Direction::HiToLo, 0x12, 0)
        );
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[14] = 0x60;
        v6[18..20].copy_from_slice(&20u16.to_be_bytes());
        v6[20] = 17;
        v6[37] = 1;
        v6[53] = 2;
        let p = plain_flow(LinkType::ETHERNET, &v6).expect("IPv6 UDP");
        assert_eq!((p.tuple.lo, p.tuple.hi, p.tuple.v6, p.payload), (1, 2, 3, 12));
        v6[20] = 0; // a hop-by-hop header: the slow path's
        assert_eq!(plain_flow(LinkType::ETHERNET, &v6), None);
        v4[20] = 0x20; // MF: a fragment
        assert_eq!(plain_flow(LinkType::ETHERNET, &v4), None);
    }
}
