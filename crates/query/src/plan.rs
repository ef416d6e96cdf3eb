//! The planner: from a filter, a necessary condition over packet fields that an index can answer, and the
//! choice between reading the index's candidates and scanning the trace.
//!
//! The condition ([`Need`]) is implied by the filter: every packet the filter matches satisfies it. The full
//! filter is still evaluated on every candidate, so the index only narrows the packets to read and the answer is
//! always the filter's, with libpcap's semantics. Fields are defined positionally, the way libpcap reads them
//! ([`Field`]), so that an index built on these definitions never drops a packet the filter would match.
//!
//! This crate knows no storage engine: an index is anything that implements [`IndexSource`].

pub use pcaptool_packet::{Field, FieldValue, Need, PacketFields, Pred};

use crate::Filter;
use crate::ast::{AddrKind, Arith, ArithOp, Dir, Expr, Id, Prim, Proto, Qual, RelOp};

fn pred(field: Field, lo: u128, hi: u128) -> Need {
    Need::Pred(Pred::range(field, lo, hi))
}

fn eq(field: Field, v: u128) -> Need {
    pred(field, v, v)
}

/// IP protocol: the fixed header's value, or an IPv6 fragment header in front of it (libpcap looks there too).
fn ip_proto(v: u32, v6: bool) -> Need {
    if v6 { Need::or(vec![eq(Field::IpProto, v.into()), eq(Field::IpProto, 44)]) } else { eq(Field::IpProto, v.into()) }
}

/// Ports qualified by `tcp`, `udp` or `sctp` also need that protocol.
fn with_transport(proto: Proto, ports: Need) -> Need {
    match proto {
        Proto::Tcp => Need::and(vec![ip_proto(6, true), ports]),
        Proto::Udp => Need::and(vec![ip_proto(17, true), ports]),
        Proto::Sctp => Need::and(vec![ip_proto(132, true), ports]),
        _ => ports,
    }
}

fn by_dir(dir: Dir, src: Need, dst: Need) -> Need {
    match dir {
        Dir::Src => src,
        Dir::Dst => dst,
        Dir::SrcAndDst => Need::and(vec![src, dst]),
        Dir::Default | Dir::SrcOrDst => Need::or(vec![src, dst]),
    }
}

struct Walk {
    /// `vlan`, `mpls`, `pppoes` or `geneve` seen: later primitives read moved offsets; the index fields no longer
    /// apply.
    shifted: bool,
}

impl Walk {
    fn expr(&mut self, e: &Expr) -> Need {
        match e {
            Expr::And(v) => Need::and(v.iter().map(|x| self.expr(x)).collect()),
            Expr::Or(v) => Need::or(v.iter().map(|x| self.expr(x)).collect()),
            Expr::Not(a) => {
                // The negation of a necessary condition is not necessary; walk only for the offset state.
                self.expr(a);
                Need::All
            }
            Expr::Prim(p, _) => {
                let n = if self.shifted { Need::All } else { self.prim(p) };
                if matches!(p, Prim::Vlan(_) | Prim::Mpls(_) | Prim::Pppoes(_) | Prim::Geneve(_)) {
                    self.shifted = true;
                }
                n
            }
        }
    }

    fn prim(&self, p: &Prim) -> Need {
        match p {
            Prim::Proto(p) => match p {
                Proto::Ip => eq(Field::LinkProto, 0x0800),
                Proto::Ip6 => eq(Field::LinkProto, 0x86dd),
                Proto::Arp => eq(Field::LinkProto, 0x0806),
                Proto::Rarp => eq(Field::LinkProto, 0x8035),
                Proto::Tcp => ip_proto(6, true),
                Proto::Udp => ip_proto(17, true),
                Proto::Sctp => ip_proto(132, true),
                // IPv4 only (the IPv6 next header field is the same index field).
                Proto::Icmp => Need::and(vec![eq(Field::LinkProto, 0x0800), ip_proto(1, false)]),
                Proto::Icmp6 => ip_proto(58, true),
                Proto::Igmp => Need::and(vec![eq(Field::LinkProto, 0x0800), ip_proto(2, false)]),
                _ => Need::All,
            },
            Prim::Id { q, id, .. } => self.id(*q, id),
            Prim::Less(n) => pred(Field::WireLen, 0, (*n).into()),
            Prim::Greater(n) => pred(Field::WireLen, (*n).into(), u32::MAX.into()),
            Prim::After(t) => pred(Field::Time, (*t).into(), u64::MAX.into()),
            Prim::Before(0) => Need::All,
            Prim::Before(t) => pred(Field::Time, 0, (*t - 1).into()),
            Prim::Vlan(None) => Need::or(VLAN_TPIDS.iter().map(|&t| eq(Field::LinkProto, t)).collect()),
            Prim::Vlan(Some(id)) if *id <= 0x0fff => eq(Field::VlanId, (*id).into()),
            Prim::Rel { op, lhs, rhs } => tcp_flags(*op, lhs, rhs),
            // The outer packet is UDP to port 6081 (libpcap's `udp dst port 6081` tests, and more).
            Prim::Geneve(_) => with_transport(Proto::Udp, eq(Field::DstPort, 6081)),
            _ => Need::All,
        }
    }

    fn id(&self, q: Qual, id: &Id) -> Need {
        let host_kind = matches!(q.addr, AddrKind::Default | AddrKind::Host | AddrKind::Net);
        match (q.addr, id) {
            (AddrKind::Proto, Id::Num(v)) => match q.proto {
                Proto::Default | Proto::Ip6 => ip_proto(*v, true),
                Proto::Ip => Need::and(vec![eq(Field::LinkProto, 0x0800), ip_proto(*v, false)]),
                Proto::Link if *v > 1500 && !matches!(*v, 0x809b | 0x80f3) => eq(Field::LinkProto, (*v).into()),
                _ => Need::All,
            },
            // The walk starts at an IPv4 or IPv6 header.
            (AddrKind::ProtoChain, _) => match q.proto {
                Proto::Ip => eq(Field::LinkProto, 0x0800),
                Proto::Ip6 => eq(Field::LinkProto, 0x86dd),
                Proto::Default => Need::or(vec![eq(Field::LinkProto, 0x0800), eq(Field::LinkProto, 0x86dd)]),
                _ => Need::All,
            },
            (AddrKind::Port | AddrKind::PortRange, Id::Num(v)) => {
                with_transport(q.proto, by_dir(q.dir, eq(Field::SrcPort, (*v).into()), eq(Field::DstPort, (*v).into())))
            }
            (AddrKind::PortRange, Id::Name(n)) => match n
                .split_once('-')
                .map(|(a, b)| (a.parse::<u16>(), b.parse::<u16>()))
            {
                Some((Ok(a), Ok(b))) => {
                    let (lo, hi) = (a.min(b).into(), a.max(b).into());
                    with_transport(q.proto, by_dir(q.dir, pred(Field::SrcPort, lo, hi), pred(Field::DstPort, lo, hi)))
                }
                _ => Need::All,
            },
            (_, Id::V4 { .. } | Id::V4Prefix { .. } | Id::V4Mask { .. } | Id::Num(_)) if host_kind => {
                let Some((v, mask)) = v4_range(q, id) else { return Need::All };
                let (lo, hi) = (u128::from(v & mask), u128::from(v | !mask));
                let ip = by_dir(q.dir, pred(Field::Ip4Src, lo, hi), pred(Field::Ip4Dst, lo, hi));
                // ARP and RARP: libpcap reads the sender and target protocol addresses.
                let arp = || by_dir(q.dir, pred(Field::ArpSpa, lo, hi), pred(Field::ArpTpa, lo, hi));
                match q.proto {
                    Proto::Ip => ip,
                    // libpcap also matches ARP and RARP packets about the address.
                    Proto::Default => Need::or(vec![ip, arp()]),
                    Proto::Arp => Need::and(vec![eq(Field::LinkProto, 0x0806), arp()]),
                    Proto::Rarp => Need::and(vec![eq(Field::LinkProto, 0x8035), arp()]),
                    _ => Need::All,
                }
            }
            (_, Id::V6 { addr, len }) if host_kind && matches!(q.proto, Proto::Default | Proto::Ip6) => {
                let len = len.unwrap_or(128).min(128);
                let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
                let (lo, hi) = (addr & mask, addr | !mask);
                by_dir(q.dir, pred(Field::Ip6Src, lo, hi), pred(Field::Ip6Dst, lo, hi))
            }
            (AddrKind::Default | AddrKind::Host, Id::Mac(m)) if q.proto == Proto::Link => {
                let v = m.iter().fold(0u128, |a, b| (a << 8) | u128::from(*b));
                by_dir(q.dir, eq(Field::EthSrc, v), eq(Field::EthDst, v))
            }
            _ => Need::All,
        }
    }
}

/// Ethertypes of VLAN tags (what libpcap's `vlan` tests).
const VLAN_TPIDS: [u128; 3] = [0x8100, 0x88a8, 0x9100];

/// Whether a relation is a TCP-flags test whose condition is exact (an operator that gives a range).
fn tcp_flags_exact(op: RelOp, lhs: &Arith, rhs: &Arith) -> bool {
    let ranged = match (op, constant(rhs)) {
        (RelOp::Eq | RelOp::Gt | RelOp::Ge | RelOp::Le, Some(_)) => true,
        (RelOp::Ne, Some(0)) => true,
        (RelOp::Lt, Some(v)) => v > 0,
        _ => false,
    };
    ranged && matches!(tcp_flags(op, lhs, rhs), Need::And(v) if v.len() == 3)
}

/// `tcp[13] [& m] op v` (also written `tcp[tcpflags]`): libpcap reads it on IPv4 TCP first fragments only.
fn tcp_flags(op: RelOp, lhs: &Arith, rhs: &Arith) -> Need {
    let flags_byte =
        |a: &Arith| matches!(a, Arith::Load { proto: Proto::Tcp, index, size: 1 } if **index == Arith::Num(13));
    let Some(v) = constant(rhs) else { return Need::All };
    let mask = match lhs {
        l if flags_byte(l) => 0xff,
        Arith::Bin(ArithOp::And, a, b) => match (constant(a), constant(b)) {
            (None, Some(m)) if flags_byte(a) => m & 0xff,
            (Some(m), None) if flags_byte(b) => m & 0xff,
            _ => return Need::All,
        },
        _ => return Need::All,
    };
    let mask = u128::from(mask);
    let v = u128::from(v);
    // The range of `flags & mask` the relation accepts (empty ranges keep the protocol part only).
    let (lo, hi) = match op {
        RelOp::Eq => (v, v),
        RelOp::Ne if v == 0 => (1, mask),
        RelOp::Gt => (v + 1, mask),
        RelOp::Ge => (v, mask),
        RelOp::Lt if v > 0 => (0, v - 1),
        RelOp::Le => (0, v),
        _ => (0, mask),
    };
    let tcp4 = Need::and(vec![eq(Field::LinkProto, 0x0800), eq(Field::IpProto, 6)]);
    if lo > hi || lo > mask {
        return tcp4;
    }
    Need::and(vec![tcp4, Need::Pred(Pred { field: Field::TcpFlags, lo, hi, mask })])
}

/// The value of a constant expression, with BPF's 32-bit arithmetic (`None`: not constant, or a division by 0).
fn constant(a: &Arith) -> Option<u32> {
    Some(match a {
        Arith::Num(v) => *v,
        Arith::Neg(a) => constant(a)?.wrapping_neg(),
        Arith::Bin(op, a, b) => op.apply(constant(a)?, constant(b)?)?,
        _ => return None,
    })
}

/// The address and mask a qualified IPv4 identifier means (libpcap's `gen_ncode`/`gen_mcode` rules).
fn v4_range(q: Qual, id: &Id) -> Option<(u32, u32)> {
    let shift = |bits: u8| 32 - u32::from(bits);
    Some(match *id {
        Id::Num(v) if q.addr == AddrKind::Net => {
            let (mut v, mut m) = (v, u32::MAX);
            while v != 0 && v & 0xff00_0000 == 0 {
                v <<= 8;
                m <<= 8;
            }
            (v, m)
        }
        Id::Num(v) => (v, u32::MAX),
        Id::V4 { addr, bits } => (addr << shift(bits), u32::MAX << shift(bits)),
        Id::V4Prefix { addr, bits, len } if len <= 32 => {
            (addr << shift(bits), if len == 0 { 0 } else { u32::MAX << (32 - len) })
        }
        Id::V4Mask { addr, bits, mask, mask_bits } => (addr << shift(bits), mask << shift(mask_bits)),
        _ => return None,
    })
}

/// The condition over index fields that every packet `filter` matches satisfies.
pub fn necessary(filter: &Filter) -> Need {
    match filter.expr() {
        None => Need::All,
        Some(e) => Walk { shifted: false }.expr(e),
    }
}

/// Whether `filter` is *exactly* its condition ([`necessary`]) on Ethernet packets whose fields the condition
/// reads are all known (present or missing, none unknown): then an index can count its matches without reading
/// them (packets with an unknown field are still read). Conservative: an and/or of primitives known to be
/// exact (addresses, ports qualified or not, `ip`/`ip6`/`arp`/`rarp`/`icmp`/`igmp`, `ether host`, `len`,
/// `after`/`before`, TCP-flag relations); anything else, `not` included, is not. Tested on the corpus against the
/// compiled filters.
pub fn exact(filter: &Filter) -> bool {
    fn expr(e: &Expr) -> bool {
        match e {
            Expr::And(v) | Expr::Or(v) => v.iter().all(expr),
            Expr::Not(_) => false,
            Expr::Prim(p, _) => prim(p),
        }
    }
    fn prim(p: &Prim) -> bool {
        match p {
            Prim::Proto(p) => {
                matches!(p, Proto::Ip | Proto::Ip6 | Proto::Arp | Proto::Rarp | Proto::Icmp | Proto::Igmp)
            }
            Prim::Less(_) | Prim::Greater(_) | Prim::After(_) => true,
            Prim::Before(t) => *t > 0,
            Prim::Rel { op, lhs, rhs } => tcp_flags_exact(*op, lhs, rhs),
            Prim::Id { q, id, .. } => {
                let host_kind = matches!(q.addr, AddrKind::Default | AddrKind::Host | AddrKind::Net);
                match (q.addr, id) {
                    (AddrKind::Port, Id::Num(_)) => {
                        matches!(q.proto, Proto::Default | Proto::Tcp | Proto::Udp | Proto::Sctp)
                    }
                    (_, Id::V4 { .. } | Id::V4Prefix { .. } | Id::V4Mask { .. } | Id::Num(_)) if host_kind => {
                        matches!(q.proto, Proto::Default | Proto::Ip | Proto::Arp | Proto::Rarp)
                            && v4_range(*q, id).is_some()
                    }
                    (_, Id::V6 { .. }) if host_kind => matches!(q.proto, Proto::Default | Proto::Ip6),
                    (AddrKind::Default | AddrKind::Host, Id::Mac(_)) => q.proto == Proto::Link,
                    _ => false,
                }
            }
            _ => false,
        }
    }
    filter.expr().is_some_and(expr)
}

/// An index the planner can use: which fields it holds and how many packets a predicate selects.
pub trait IndexSource {
    /// Packets the index describes.
    fn packets(&self) -> u64;
    /// Whether the index can answer predicates on `field`.
    fn has_field(&self, field: Field) -> bool;
    /// Packets satisfying `pred`, from the index's statistics (`None`: unknown).
    fn estimate(&self, pred: &Pred) -> Option<u64>;
    /// Packets that may satisfy the whole condition `need`, when the index can say better than the planner's
    /// combination of per-predicate estimates (the minimum over a conjunction, the sum over a disjunction); an
    /// index that decides several predicates together (one flow table for every address and port) can.
    fn estimate_need(&self, need: &Need) -> Option<u64> {
        let _ = need;
        None
    }
}

/// The chosen way to answer a filter.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What every match satisfies (over all fields).
    pub need: Need,
    /// The part of it the index answers (`None` without an index).
    pub index: Option<Need>,
    /// Estimated candidates from the index, and the packets it describes.
    pub estimate: Option<(u64, u64)>,
    /// Whether to read the index's candidates (else scan every packet).
    pub use_index: bool,
    /// Whether the filter is exactly its condition on packets whose fields are known ([`exact`]), so that an
    /// index can count matches without reading them.
    pub exact: bool,
}

/// Above this share of the packets, reading candidates in place costs more than a sequential scan.
pub const INDEX_SELECTIVITY_LIMIT: f64 = 0.25;

fn estimate(n: &Need, idx: &dyn IndexSource) -> u64 {
    let total = idx.packets();
    match n {
        Need::All => total,
        Need::Pred(p) => idx.estimate(p).unwrap_or(total).min(total),
        Need::And(v) => v.iter().map(|n| estimate(n, idx)).min().unwrap_or(total),
        Need::Or(v) => v.iter().map(|n| estimate(n, idx)).fold(0u64, u64::saturating_add).min(total),
    }
}

/// Plans `filter` against an index (or none): the index part, its estimated candidates, and the choice.
pub fn plan(filter: &Filter, index: Option<&dyn IndexSource>) -> Plan {
    let need = necessary(filter);
    let exact = exact(filter);
    let Some(idx) = index else {
        return Plan { need, index: None, estimate: None, use_index: false, exact };
    };
    let part = need.restrict(&|f| idx.has_field(f));
    let est = idx.estimate_need(&part).unwrap_or_else(|| estimate(&part, idx)).min(idx.packets());
    let total = idx.packets();
    let use_index = part != Need::All && (est as f64) <= INDEX_SELECTIVITY_LIMIT * total as f64;
    // An exact condition the index holds completely can also count without reading.
    let exact = exact && part == need;
    Plan { need, index: Some(part), estimate: Some((est, total)), use_index, exact }
}

impl Plan {
    /// One line for `--explain`.
    pub fn describe(&self) -> String {
        match (&self.index, self.estimate) {
            (None, _) => "scan every packet (no index)".to_string(),
            (Some(Need::All), _) => "scan every packet (the index cannot narrow this filter)".to_string(),
            (Some(part), Some((est, total))) if self.use_index => {
                format!("index: {part} selects about {est} of {total} packets; the full filter runs on each candidate")
            }
            (Some(_), Some((est, total))) => format!(
                "scan every packet (the index would select about {est} of {total}, more than {:.0}%)",
                INDEX_SELECTIVITY_LIMIT * 100.0
            ),
            (Some(_), None) => "scan every packet".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mock;
    impl IndexSource for Mock {
        fn packets(&self) -> u64 {
            1000
        }
        fn has_field(&self, f: Field) -> bool {
            f != Field::EthSrc
        }
        fn estimate(&self, p: &Pred) -> Option<u64> {
            Some(if p.field == Field::Ip4Src { 10 } else { 500 })
        }
    }

    #[test]
    fn necessary_conditions() {
        let n = |s: &str| necessary(&Filter::new(s).unwrap()).to_string();
        assert_eq!(n("ip src 10.0.0.1"), "ip.src = 10.0.0.1");
        assert_eq!(
            n("net 10.0.0.0/8 and tcp"),
            "((ip.src in [10.0.0.0, 10.255.255.255] or ip.dst in [10.0.0.0, 10.255.255.255] or arp.spa in [10.0.0.0, 10.255.255.255] or arp.tpa in [10.0.0.0, 10.255.255.255]) and (ip.proto = 6 or ip.proto = 44))"
        );
        assert_eq!(n("not tcp"), "any packet");
        assert_eq!(n("vlan and host 1.2.3.4"), "(link.proto = 0x8100 or link.proto = 0x88a8 or link.proto = 0x9100)");
        assert_eq!(n("udp dst portrange 5000-6000"), "((ip.proto = 17 or ip.proto = 44) and port.dst in [5000, 6000])");
        assert_eq!(n("vlan 7"), "vlan = 7");
        // Tests after `geneve` read the inner packet, which the index does not describe.
        assert_eq!(n("geneve 5 and host 1.2.3.4"), "((ip.proto = 17 or ip.proto = 44) and port.dst = 6081)");
        assert_eq!(
            n("tcp[tcpflags] & (tcp-syn|tcp-ack) = tcp-syn"),
            "(link.proto = 0x0800 and ip.proto = 6 and tcp.flags & 0x12 in [0x2, 0x2])"
        );
        assert_eq!(n("tcp[13] & 2 != 0"), "(link.proto = 0x0800 and ip.proto = 6 and tcp.flags & 0x2 in [0x1, 0x2])");
    }

    #[test]
    fn plan_uses_the_index_when_selective() {
        let f = Filter::new("ip src 10.0.0.1 and ether src 1:2:3:4:5:6").unwrap();
        let p = plan(&f, Some(&Mock));
        assert!(p.use_index);
        assert_eq!(p.estimate, Some((10, 1000)));
        assert_eq!(p.index.unwrap().to_string(), "ip.src = 10.0.0.1");
        let f = Filter::new("udp").unwrap();
        assert!(!plan(&f, Some(&Mock)).use_index);
        assert!(!plan(&f, None).use_index);
    }
}
