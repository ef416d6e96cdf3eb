//! Decoder tests: exact fields of testdata/tunnels.pcap, a property test against etherparse's packet builder,
//! laxness on every truncation, and no panic on arbitrary bytes for any link type.

use std::net::IpAddr;

use etherparse::{PacketBuilder, VlanId};
use proptest::prelude::*;

use super::*;
use crate::{LinkType, Records};

const TUNNELS: &[u8] = include_bytes!("../../../../testdata/tunnels.pcap");

fn tunnels() -> Vec<Decoded> {
    Records::new(TUNNELS).map(|r| r.unwrap()).map(|r| decode(r.linktype, r.data)).collect()
}

#[test]
fn qinq_tcp() {
    let d = tunnels()[0];
    assert_eq!(d.vlan_ids(), &[100, 200]);
    assert_eq!(d.ethertype, Some(EtherType::IPV4));
    assert_eq!(d.l3_offset, Some(22));
    assert_eq!(d.ip.unwrap().src, "192.0.2.1".parse::<IpAddr>().unwrap());
    assert_eq!(d.transport, Some(Transport::Tcp { src_port: 1234, dst_port: 443, flags: 0x18, header_len: 20 }));
    assert_eq!(d.l4_offset, Some(42));
    assert!(d.stop.is_none());
    let (k, dir) = d.flow().unwrap();
    assert_eq!(k.vlan, 100);
    assert_eq!(dir, crate::Direction::LoToHi);
}

#[test]
fn mpls_ipv6_udp() {
    let d = tunnels()[1];
    assert_eq!(d.mpls_labels(), &[1000, 2000]);
    assert_eq!(d.ip.unwrap().version, 6);
    assert_eq!(d.transport, Some(Transport::Udp { src_port: 1111, dst_port: 2222 }));
}

#[test]
fn pppoe_icmp() {
    let d = tunnels()[2];
    assert_eq!(d.pppoe_session, Some(0x1234));
    assert_eq!(d.transport, Some(Transport::Icmp { ty: 8, code: 0 }));
}

#[test]
fn gre_with_key_carrying_ethernet() {
    let pkts: Vec<_> = Records::new(TUNNELS).map(|r| r.unwrap()).collect();
    let d = decode(pkts[3].linktype, pkts[3].data);
    assert_eq!(d.ip.unwrap().proto, IpProto::GRE);
    let t = d.tunnel.unwrap();
    assert_eq!(t.kind, TunnelKind::Gre);
    assert_eq!(t.inner_link, LinkType::ETHERNET);
    assert_eq!(t.inner_offset, 14 + 20 + 8);
    let inner = d.decode_inner(pkts[3].data).unwrap();
    assert_eq!(inner.ip.unwrap().dst, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(inner.transport, Some(Transport::Udp { src_port: 7, dst_port: 7 }));
}

#[test]
fn vxlan() {
    let pkts: Vec<_> = Records::new(TUNNELS).map(|r| r.unwrap()).collect();
    let d = decode(pkts[4].linktype, pkts[4].data);
    assert_eq!(d.transport, Some(Transport::Udp { src_port: 33333, dst_port: 4789 }));
    assert_eq!(d.tunnel.unwrap().kind, TunnelKind::Vxlan);
    let inner = d.decode_inner(pkts[4].data).unwrap();
    assert_eq!(inner.transport, Some(Transport::Tcp { src_port: 5, dst_port: 6, flags: 0x02, header_len: 20 }));
}

#[test]
fn ipv6_extension_chain_to_tcp() {
    let d = tunnels()[5];
    let ip = d.ip.unwrap();
    assert_eq!(ip.next_header, IpProto::HOPOPT);
    assert_eq!(ip.proto, IpProto::TCP);
    assert_eq!(ip.header_len, 40 + 8 + 8);
    assert_eq!(ip.fragment, Some(Fragment { offset: 0, more: true, id: 0xabcd }));
    assert_eq!(d.transport.unwrap().ports(), Some((8080, 9090)));
}

#[test]
fn later_ipv4_fragment_has_no_ports() {
    let d = tunnels()[6];
    let f = d.ip.unwrap().fragment.unwrap();
    assert_eq!((f.offset, f.more, f.id), (185, false, 77));
    assert!(d.transport.is_none() && d.l4_offset.is_none());
    assert_eq!(d.flow().unwrap().0.lo_port, 0);
}

#[test]
fn snaplen_cut_keeps_what_is_there() {
    let d = tunnels()[7];
    assert_eq!(d.transport, Some(Transport::Tcp { src_port: 1, dst_port: 2, flags: 0, header_len: 0 }));
    assert_eq!(
        d.stop,
        Some(Stop { layer: Layer::Transport, offset: 34, reason: StopReason::Truncated { needed: 20 } })
    );
    assert!(d.is_truncated());
}

#[test]
fn loopback_both_byte_orders_and_raw() {
    let ip = {
        let mut v = Vec::new();
        PacketBuilder::ipv4([1, 2, 3, 4], [5, 6, 7, 8], 9).udp(10, 11).write(&mut v, b"x").unwrap();
        v
    };
    for hdr in [[2, 0, 0, 0], [0, 0, 0, 2]] {
        let mut p = hdr.to_vec();
        p.extend_from_slice(&ip);
        let d = decode(LinkType::NULL, &p);
        assert_eq!(d.transport.unwrap().ports(), Some((10, 11)), "{hdr:?}");
    }
    assert_eq!(decode(LinkType::RAW, &ip).transport.unwrap().ports(), Some((10, 11)));
    assert_eq!(decode(LinkType::IPV4, &ip).transport.unwrap().ports(), Some((10, 11)));
    let mut sll2 = vec![0x08, 0x00, 0, 0, 0, 0, 0, 3, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0];
    sll2.extend_from_slice(&ip);
    assert_eq!(decode(LinkType::LINUX_SLL2, &sll2).transport.unwrap().ports(), Some((10, 11)));
}

#[derive(Debug, Clone)]
struct Spec {
    vlans: Vec<u16>,
    v6: bool,
    src: [u8; 16],
    dst: [u8; 16],
    l4: u8, // 0 tcp, 1 udp, 2 icmp
    sport: u16,
    dport: u16,
    payload: Vec<u8>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        proptest::collection::vec(1u16..4095, 0..=2),
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        0u8..3,
        any::<u16>(),
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(vlans, v6, src, dst, l4, sport, dport, payload)| Spec {
            vlans,
            v6,
            src,
            dst,
            l4,
            sport,
            dport,
            payload,
        })
}

fn build(s: &Spec) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]);
    let mut out = Vec::new();
    macro_rules! finish {
        ($b:expr) => {{
            let ip = if s.v6 {
                $b.ipv6(s.src, s.dst, 64)
            } else {
                let mut a = [0u8; 4];
                a.copy_from_slice(&s.src[..4]);
                let mut b = [0u8; 4];
                b.copy_from_slice(&s.dst[..4]);
                $b.ipv4(a, b, 64)
            };
            match (s.l4, s.v6) {
                (0, _) => ip.tcp(s.sport, s.dport, 1, 1000).syn().write(&mut out, &s.payload).unwrap(),
                (1, _) => ip.udp(s.sport, s.dport).write(&mut out, &s.payload).unwrap(),
                (_, false) => ip.icmpv4_echo_request(1, 2).write(&mut out, &s.payload).unwrap(),
                (_, true) => ip.icmpv6_echo_request(1, 2).write(&mut out, &s.payload).unwrap(),
            }
        }};
    }
    match s.vlans.as_slice() {
        [] => finish!(eth),
        [a] => finish!(eth.single_vlan(VlanId::try_new(*a).unwrap())),
        [a, b, ..] => finish!(eth.double_vlan(VlanId::try_new(*a).unwrap(), VlanId::try_new(*b).unwrap())),
    }
    out
}

proptest! {
    /// Packets built by etherparse decode to the fields they were built with.
    #[test]
    fn agrees_with_etherparse_builder(s in spec()) {
        let p = build(&s);
        let d = decode(LinkType::ETHERNET, &p);
        prop_assert!(d.stop.is_none(), "{:?}", d.stop);
        prop_assert_eq!(d.vlan_ids(), &s.vlans[..]);
        let ip = d.ip.unwrap();
        if s.v6 {
            prop_assert_eq!(ip.src, IpAddr::from(s.src));
        } else {
            prop_assert_eq!(ip.src, IpAddr::from([s.src[0], s.src[1], s.src[2], s.src[3]]));
        }
        match s.l4 {
            0 => prop_assert_eq!(d.transport, Some(Transport::Tcp { src_port: s.sport, dst_port: s.dport, flags: 0x02, header_len: 20 })),
            1 => prop_assert_eq!(d.transport.unwrap().ports(), Some((s.sport, s.dport))),
            _ if s.v6 => prop_assert_eq!(d.transport, Some(Transport::Icmpv6 { ty: 128, code: 0 })),
            _ => prop_assert_eq!(d.transport, Some(Transport::Icmp { ty: 8, code: 0 })),
        }
        // etherparse's own lax reading agrees on the transport offset.
        let sliced = etherparse::SlicedPacket::from_ethernet(&p).unwrap();
        if let Some(etherparse::TransportSlice::Tcp(t)) = sliced.transport {
            prop_assert_eq!(t.destination_port(), s.dport);
        }
    }

    /// Cutting a packet anywhere never panics, and every field decoded from the prefix equals the full decode's.
    #[test]
    fn truncation_is_lax(s in spec(), cut in 0usize..200) {
        let p = build(&s);
        let full = decode(LinkType::ETHERNET, &p);
        let cut = cut.min(p.len());
        let d = decode(LinkType::ETHERNET, &p[..cut]);
        let header_end = full.l4_offset.unwrap() as usize + match s.l4 { 0 => 20, 1 => 8, _ => 2 };
        if cut < header_end {
            // Cut inside the headers: decoding says so.
            prop_assert!(d.is_truncated(), "cut {} header end {} stop {:?}", cut, header_end, d.stop);
        } else {
            prop_assert_eq!(d, full);
        }
        if let Some(e) = d.eth { prop_assert_eq!(Some(e), full.eth); }
        if let Some(ip) = d.ip { prop_assert_eq!(Some(ip), full.ip); }
        if let Some(t) = d.transport {
            prop_assert_eq!(t.ports(), full.transport.unwrap().ports());
        }
        prop_assert!(d.vlan_ids().len() <= full.vlan_ids().len());
    }

    /// No input panics, whatever the link type.
    #[test]
    fn arbitrary_bytes_never_panic(lt in prop_oneof![Just(0u32), Just(1), Just(8), Just(9), Just(12), Just(50), Just(51),
            Just(101), Just(104), Just(105), Just(107), Just(108), Just(113), Just(127), Just(228), Just(229), Just(239),
            Just(276), any::<u32>()],
        bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let d = decode(LinkType(lt), &bytes);
        for off in [d.l3_offset, d.l4_offset].into_iter().flatten() {
            prop_assert!(off as usize <= bytes.len());
        }
        if let Some(t) = d.tunnel {
            let _ = d.decode_inner(&bytes);
            prop_assert!(t.inner_offset as usize <= bytes.len());
        }
        let _ = d.flow();
    }
}
