//! Flow tracking: which connection each packet belongs to, and the per-flow record (Zeek's conn.log columns).
//!
//! A flow is the bidirectional 5-tuple plus the outermost VLAN id ([`FlowKey`]). It ends after an idle timeout
//! (TCP 300 s, others 60 s, Zeek's defaults), an active timeout (1800 s, as nfdump splits long flows), a TCP RST,
//! or once both sides have sent a FIN; the next packet with the same key then starts a new flow. Packets without
//! an IP header (ARP, other link-layer traffic) belong to no flow.

use std::net::IpAddr;

use pcaptool_packet::{Decoded, Direction, FlowKey, IpProto, Transport};
use rustc_hash::FxHashMap;

/// Idle timeout of TCP flows, ns.
pub const TCP_IDLE_NS: u64 = 300_000_000_000;
/// Idle timeout of other flows, ns.
pub const OTHER_IDLE_NS: u64 = 60_000_000_000;
/// Active timeout: a flow longer than this is split, ns.
pub const ACTIVE_NS: u64 = 1_800_000_000_000;
/// After a TCP connection closed (both FINs, or a RST), its tuple's packets still belong to it for this long
/// unless one opens a new connection (a SYN): Zeek's `tcp_close_delay`, ns.
pub const CLOSE_DELAY_NS: u64 = 5_000_000_000;

/// Zeek's `conn_state` of a TCP connection (other protocols: `Oth`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum ConnState {
    /// Connection attempt seen, no reply.
    S0 = 0,
    /// Established, not terminated.
    S1 = 1,
    /// Normal establishment and termination.
    Sf = 2,
    /// Connection attempt rejected (SYN answered by RST).
    Rej = 3,
    /// Established, the originator aborted (sent a RST).
    Rsto = 4,
    /// Established, the responder aborted.
    Rstr = 5,
    /// The originator sent a SYN then a FIN, no SYN-ACK from the responder.
    Sh = 6,
    /// No SYN seen: midstream traffic, or not TCP.
    Oth = 7,
}

impl ConnState {
    /// Zeek's name.
    pub fn name(self) -> &'static str {
        match self {
            ConnState::S0 => "S0",
            ConnState::S1 => "S1",
            ConnState::Sf => "SF",
            ConnState::Rej => "REJ",
            ConnState::Rsto => "RSTO",
            ConnState::Rstr => "RSTR",
            ConnState::Sh => "SH",
            ConnState::Oth => "OTH",
        }
    }

    /// The state with this code, if any.
    pub fn from_code(c: u8) -> Option<ConnState> {
        Some(match c {
            0 => ConnState::S0,
            1 => ConnState::S1,
            2 => ConnState::Sf,
            3 => ConnState::Rej,
            4 => ConnState::Rsto,
            5 => ConnState::Rstr,
            6 => ConnState::Sh,
            7 => ConnState::Oth,
            _ => return None,
        })
    }
}

/// Per-direction counters of a flow.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Side {
    /// Packets.
    pub packets: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Transport payload bytes (IP payload for protocols without a known transport header).
    pub payload: u64,
    /// OR of the TCP flags.
    pub flags: u8,
}

/// A flow's record.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Flow {
    /// Unique in a store, in order of first packet.
    pub id: u64,
    /// The connection.
    pub key: FlowKey,
    /// Whether the originator (the side of the first packet) is the key's `lo` endpoint.
    pub orig_is_lo: bool,
    /// First and last timestamp, ns (the smallest and largest: timestamps can go backwards).
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
    /// Originator's side.
    pub orig: Side,
    /// Responder's side.
    pub resp: Side,
    /// Zeek's connection state.
    pub state: ConnState,
}

impl Flow {
    /// The originator's address and port.
    pub fn orig_endpoint(&self) -> (IpAddr, u16) {
        if self.orig_is_lo { (self.key.lo_addr, self.key.lo_port) } else { (self.key.hi_addr, self.key.hi_port) }
    }

    /// The responder's address and port.
    pub fn resp_endpoint(&self) -> (IpAddr, u16) {
        if self.orig_is_lo { (self.key.hi_addr, self.key.hi_port) } else { (self.key.lo_addr, self.key.lo_port) }
    }

    /// Adds `other`, a later part of the same flow (from a later segment).
    pub fn merge(&mut self, other: &Flow) {
        self.first_ns = self.first_ns.min(other.first_ns);
        self.last_ns = self.last_ns.max(other.last_ns);
        for (a, b) in [(&mut self.orig, &other.orig), (&mut self.resp, &other.resp)] {
            a.packets += b.packets;
            a.bytes += b.bytes;
            a.payload += b.payload;
            a.flags |= b.flags;
        }
        self.state = other.state;
    }
}

#[derive(Debug)]
struct Live {
    flow: Flow,
    fin_orig: bool,
    fin_resp: bool,
    /// When the flow started (for the active timeout).
    started_ns: u64,
    /// When the connection closed (both FINs or a RST), if it did.
    closed_ns: Option<u64>,
}

/// What [`FlowTracker::packet`] says of a packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Assigned {
    /// The flow's id, or `None` for a packet of no flow.
    pub flow: Option<u64>,
    /// The flow's key (meaningless without a flow).
    pub key: Option<FlowKey>,
    /// Whether the packet went from the originator.
    pub from_orig: bool,
    /// Whether the originator is the key's `lo` endpoint.
    pub orig_is_lo: bool,
    /// The flow's state after this packet.
    pub state: ConnState,
    /// Transport payload bytes of the packet.
    pub payload: u32,
    /// Its TCP flags (0 for other protocols).
    pub flags: u8,
}

/// Assigns packets to flows and keeps their records.
#[derive(Debug, Default)]
pub struct FlowTracker {
    live: FxHashMap<FlowKey, Live>,
    next_id: u64,
    /// Flows that ended, waiting to be taken.
    done: Vec<Flow>,
    last_sweep_ns: u64,
}

fn payload_and_flags(d: &Decoded) -> (u64, u8) {
    let Some(ip) = d.ip else { return (0, 0) };
    let ip_payload = u64::from(ip.total_len).saturating_sub(u64::from(ip.header_len));
    match d.transport {
        Some(Transport::Tcp { flags, header_len, .. }) => (ip_payload.saturating_sub(u64::from(header_len)), flags),
        Some(Transport::Udp { .. }) => (ip_payload.saturating_sub(8), 0),
        _ => (ip_payload, 0),
    }
}

impl FlowTracker {
    /// A tracker whose first flow gets id `first_id`.
    pub fn new(first_id: u64) -> FlowTracker {
        FlowTracker { next_id: first_id, ..FlowTracker::default() }
    }

    /// The id the next new flow gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Accounts a packet (decoded as `d`, `wirelen` bytes on the wire, at `ts_ns`) to its flow.
    pub fn packet(&mut self, d: &Decoded, wirelen: u32, ts_ns: u64) -> Assigned {
        let Some((key, dir)) = FlowKey::from_decoded(d) else {
            let (payload, _) = payload_and_flags(d);
            return Assigned {
                flow: None,
                key: None,
                from_orig: true,
                orig_is_lo: true,
                state: ConnState::Oth,
                payload: payload.min(u64::from(u32::MAX)) as u32,
                flags: 0,
            };
        };
        self.sweep(ts_ns);
        let (payload, flags) = payload_and_flags(d);
        let is_tcp = key.proto == IpProto::TCP;
        let idle = if is_tcp { TCP_IDLE_NS } else { OTHER_IDLE_NS };
        let opens = is_tcp && flags & 0x12 == 0x02;
        let next_id = &mut self.next_id;
        let fresh = |next_id: &mut u64| {
            let id = *next_id;
            *next_id += 1;
            Live {
                flow: Flow {
                    id,
                    key,
                    orig_is_lo: dir == Direction::LoToHi,
                    first_ns: ts_ns,
                    last_ns: ts_ns,
                    orig: Side::default(),
                    resp: Side::default(),
                    state: ConnState::Oth,
                },
                fin_orig: false,
                fin_resp: false,
                started_ns: ts_ns,
                closed_ns: None,
            }
        };
        // One hash lookup: an expired flow is replaced in place by the new one.
        let l = match self.live.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => {
                let l = o.into_mut();
                let expired = l.closed_ns.is_some_and(|c| opens || ts_ns.saturating_sub(c) > CLOSE_DELAY_NS)
                    || ts_ns.saturating_sub(l.flow.last_ns) > idle
                    || ts_ns.saturating_sub(l.started_ns) > ACTIVE_NS;
                if expired {
                    let old = std::mem::replace(l, fresh(next_id));
                    self.done.push(old.flow);
                }
                l
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(fresh(next_id)),
        };
        let from_orig = (dir == Direction::LoToHi) == l.flow.orig_is_lo;
        let f = &mut l.flow;
        f.first_ns = f.first_ns.min(ts_ns);
        f.last_ns = f.last_ns.max(ts_ns);
        let side = if from_orig { &mut f.orig } else { &mut f.resp };
        side.packets += 1;
        side.bytes += u64::from(wirelen);
        side.payload += payload;
        side.flags |= flags;
        if is_tcp {
            const FIN: u8 = 0x01;
            const RST: u8 = 0x04;
            if flags & FIN != 0 {
                if from_orig { l.fin_orig = true } else { l.fin_resp = true }
            }
            l.flow.state = tcp_state(&l.flow, l.fin_orig, l.fin_resp);
            if l.closed_ns.is_none() && (flags & RST != 0 || (l.fin_orig && l.fin_resp)) {
                l.closed_ns = Some(ts_ns);
            }
        }
        Assigned {
            flow: Some(l.flow.id),
            key: Some(key),
            from_orig,
            orig_is_lo: l.flow.orig_is_lo,
            state: l.flow.state,
            payload: payload.min(u64::from(u32::MAX)) as u32,
            flags,
        }
    }

    /// Ends flows idle for longer than their timeout at `now` (checked at most once a second of trace time).
    fn sweep(&mut self, now: u64) {
        if now < self.last_sweep_ns.saturating_add(1_000_000_000) {
            return;
        }
        self.last_sweep_ns = now;
        let done = &mut self.done;
        self.live.retain(|k, l| {
            let idle = if k.proto == IpProto::TCP { TCP_IDLE_NS } else { OTHER_IDLE_NS };
            let keep = now.saturating_sub(l.flow.last_ns) <= idle;
            if !keep {
                done.push(l.flow);
            }
            keep
        });
    }

    /// Every live flow's record (for a segment that closes while they go on).
    pub fn live_flows(&self) -> impl Iterator<Item = &Flow> {
        self.live.values().map(|l| &l.flow)
    }

    /// Forgets the flows that ended (for callers that keep records elsewhere; otherwise they pile up).
    pub fn discard_done(&mut self) {
        self.done.clear();
    }

    /// Takes the flows that ended since the last call.
    pub fn take_done(&mut self) -> Vec<Flow> {
        std::mem::take(&mut self.done)
    }

    /// Ends every flow (the end of the input) and returns all the ended flows not yet taken.
    pub fn finish(&mut self) -> Vec<Flow> {
        let mut done = std::mem::take(&mut self.done);
        done.extend(self.live.drain().map(|(_, l)| l.flow));
        done.sort_by_key(|f| f.id);
        done
    }
}

fn tcp_state(f: &Flow, fin_orig: bool, fin_resp: bool) -> ConnState {
    const SYN: u8 = 0x02;
    const RST: u8 = 0x04;
    let (o, r) = (f.orig.flags, f.resp.flags);
    let syn = o & SYN != 0;
    let synack = r & SYN != 0;
    if !syn {
        return ConnState::Oth;
    }
    if !synack {
        if r & RST != 0 {
            return ConnState::Rej;
        }
        if fin_orig {
            return ConnState::Sh;
        }
        return ConnState::S0;
    }
    if o & RST != 0 {
        return ConnState::Rsto;
    }
    if r & RST != 0 {
        return ConnState::Rstr;
    }
    if fin_orig && fin_resp {
        return ConnState::Sf;
    }
    ConnState::S1
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcaptool_packet::{LinkType, decode};

    fn tcp(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, flags: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        let total = (40 + payload) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sp.to_be_bytes());
        f[36..38].copy_from_slice(&dp.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = flags;
        f
    }

    #[test]
    fn a_connection_from_handshake_to_fin() {
        let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let pkts = [
            tcp(c, s, 40000, 80, 0x02, 0),
            tcp(s, c, 80, 40000, 0x12, 0),
            tcp(c, s, 40000, 80, 0x10, 0),
            tcp(c, s, 40000, 80, 0x18, 100),
            tcp(s, c, 80, 40000, 0x18, 1000),
            tcp(c, s, 40000, 80, 0x11, 0),
            tcp(s, c, 80, 40000, 0x11, 0),
            tcp(c, s, 40000, 80, 0x10, 0),
            // The same tuple after both FINs: the last ACK above still belongs to the connection, a SYN opens a
            // new one.
            tcp(c, s, 40000, 80, 0x02, 0),
        ];
        let mut t = FlowTracker::new(7);
        let ids: Vec<Option<u64>> = pkts
            .iter()
            .enumerate()
            .map(|(i, p)| t.packet(&decode(LinkType::ETHERNET, p), p.len() as u32, 1_000 + i as u64).flow)
            .collect();
        assert_eq!(&ids[..8], &[Some(7); 8]);
        assert_eq!(ids[8], Some(8));
        let flows = t.finish();
        assert_eq!(flows.len(), 2);
        let f = &flows[0];
        assert_eq!(f.state, ConnState::Sf);
        assert_eq!(f.orig_endpoint(), (IpAddr::from(c), 40000));
        assert_eq!((f.orig.packets, f.resp.packets), (5, 3), "the ACK after both FINs is the connection's");
        assert_eq!((f.orig.payload, f.resp.payload), (100, 1000));
        assert_eq!((f.first_ns, f.last_ns), (1000, 1007));
        assert_eq!(flows[1].state, ConnState::S0);
    }

    #[test]
    fn rejected_idle_and_no_flow() {
        let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let mut t = FlowTracker::new(0);
        let d = |p: &[u8]| decode(LinkType::ETHERNET, p);
        t.packet(&d(&tcp(c, s, 1, 2, 0x02, 0)), 60, 0);
        t.packet(&d(&tcp(s, c, 2, 1, 0x14, 0)), 60, 1);
        // Idle for longer than the TCP timeout: a new flow.
        let a = t.packet(&d(&tcp(c, s, 3, 4, 0x10, 0)), 60, 2);
        let b = t.packet(&d(&tcp(c, s, 3, 4, 0x10, 0)), 60, 2 + TCP_IDLE_NS + 1);
        assert_ne!(a.flow, b.flow);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(t.packet(&d(&arp), 42, 5).flow, None);
        let flows = t.finish();
        assert_eq!(flows[0].state, ConnState::Rej);
        assert_eq!(flows.len(), 3);
        assert!(flows.iter().skip(1).all(|f| f.state == ConnState::Oth));
    }
}
