//! Canonical bidirectional flow keys: the 5-tuple plus the outermost VLAN id, the same for both directions.

use std::net::IpAddr;

use crate::decode::Decoded;
use crate::types::IpProto;

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

#[cfg(test)]
mod tests {
    use super::*;
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
    }
}
