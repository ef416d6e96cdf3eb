//! Flow tracking: which connection each packet belongs to, and the per-flow record (Zeek's conn.log columns).
//!
//! A flow is the bidirectional 5-tuple plus the outermost VLAN id ([`FlowKey`]). It ends after an idle timeout
//! (TCP 300 s, others 60 s, Zeek's defaults), an active timeout (1800 s, as nfdump splits long flows), a TCP RST,
//! or once both sides have sent a FIN; the next packet with the same key then starts a new flow. Packets without
//! an IP header (ARP, other link-layer traffic) belong to no flow.

use std::net::IpAddr;

use pcaptool_packet::{
    Decoded, Direction, FlowKey, FlowTuple, IpProto, LinkType, Transport, decode, plain_flow, prefetch_item,
};

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

/// Which segment slot holds a flow's packets: a segment writer's id (0: none yet) and the slot there. The flow
/// table keeps one per flow so that the writer finds the slot without a lookup of its own.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct SlotCache {
    pub(crate) writer: u64,
    pub(crate) slot: u32,
}

/// A live flow: its key and the slot cache first (the cache line a lookup loads), then its counters.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Entry {
    tuple: FlowTuple,
    pub(crate) cache: SlotCache,
    pub(crate) id: u64,
    first_ns: u64,
    last_ns: u64,
    /// When the flow started (for the active timeout).
    started_ns: u64,
    /// When the connection closed (both FINs or a RST); `u64::MAX` while it has not.
    closed_ns: u64,
    orig: Side,
    resp: Side,
    pub(crate) orig_is_lo: bool,
    fin_orig: bool,
    fin_resp: bool,
    pub(crate) state: ConnState,
}

impl Entry {
    fn flow(&self) -> Flow {
        Flow {
            id: self.id,
            key: FlowKey::from(self.tuple),
            orig_is_lo: self.orig_is_lo,
            first_ns: self.first_ns,
            last_ns: self.last_ns,
            orig: self.orig,
            resp: self.resp,
            state: self.state,
        }
    }
}

/// The live flows: entries in a vector, found through an open-addressing index (linear probing) of 8-byte
/// slots, each the upper half of the key's hash and the entry's position + 1 (0: empty). A lookup reads the
/// index and then one entry (with 20,000 flows the index is 512 KiB, and streaming packets push it out of cache: its
/// load is most of a lookup's time, docs/BENCHMARKS.md). The hash is seeded per table, so that traffic
/// cannot be crafted to collide.
#[derive(Debug)]
struct Table {
    slots: Vec<u64>,
    entries: Vec<Entry>,
    /// Set when the table is made and never changed, so a hash taken before a lookup (`Ingest::push_all` hashes
    /// 12 packets ahead) is still the key's when the lookup comes, whatever grew or shrank in between.
    seed: u64,
}

const MIN_SLOTS: usize = 1024;

impl Default for Table {
    fn default() -> Table {
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish() | 1;
        Table { slots: vec![0; MIN_SLOTS], entries: Vec::new(), seed }
    }
}

/// The 64-bit folded multiply of a and b (the mixing step of foldhash and aHash).
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Table {
    #[inline]
    fn hash(&self, t: &FlowTuple) -> u64 {
        const K: [u64; 3] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344, 0xa409_3822_299f_31d0];
        let rest = u64::from(t.lo_port)
            | u64::from(t.hi_port) << 16
            | u64::from(t.vlan) << 32
            | u64::from(t.proto) << 48
            | u64::from(t.v6) << 56;
        let a = fold(t.lo as u64 ^ self.seed, (t.lo >> 64) as u64 ^ K[0]);
        let b = fold(t.hi as u64 ^ K[1], (t.hi >> 64) as u64 ^ K[2]);
        fold(a ^ rest, b ^ self.seed)
    }

    /// Starts loading the index slot where the search for `t` begins (a hint: nothing changes); returns `t`'s
    /// hash.
    #[inline]
    fn prefetch(&self, t: &FlowTuple) -> u64 {
        let h = self.hash(t);
        prefetch_item(&self.slots, h as usize & (self.slots.len() - 1));
        h
    }

    /// The entry that is likely the one hashed to `h` (the first few index slots are searched for its hash's
    /// tag; the key is not compared), with its first cache lines being loaded.
    #[inline]
    fn prefetch_entry(&self, h: u64) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        for _ in 0..4 {
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            if s >> 32 == h >> 32 {
                let e = (s as u32 - 1) as usize;
                if let Some(entry) = self.entries.get(e) {
                    // Its key and slot cache (an entry may start anywhere in a cache line).
                    prefetch_item(std::slice::from_ref(entry), 0);
                    prefetch_item(std::slice::from_ref(&entry.cache), 0);
                }
                return Some(e);
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The entry holding `t` (hashed to `h`), or the empty slot where it goes.
    #[inline]
    fn find(&self, h: u64, t: &FlowTuple) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let tag = h >> 32;
        let mut i = h as usize & mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                return Err(i);
            }
            if s >> 32 == tag {
                let e = (s as u32 - 1) as usize;
                if self.entries[e].tuple == *t {
                    return Ok(e);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `e` (hashed to `h`) at the empty slot `slot` that [`find`](Self::find) gave; returns its position.
    fn insert(&mut self, slot: usize, h: u64, e: Entry) -> usize {
        let at = self.entries.len();
        self.entries.push(e);
        self.slots[slot] = (h >> 32) << 32 | (at as u64 + 1);
        if self.entries.len() * 2 > self.slots.len() {
            self.rebuild(self.slots.len() * 2);
        }
        at
    }

    /// Rebuilds the index with `cap` slots (a power of two) after growing or removing entries.
    fn rebuild(&mut self, cap: usize) {
        self.slots.clear();
        self.slots.resize(cap, 0);
        let mask = cap - 1;
        for at in 0..self.entries.len() {
            let h = self.hash(&self.entries[at].tuple);
            let mut i = h as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = (h >> 32) << 32 | (at as u64 + 1);
        }
    }

    /// The index slot that names the entry at `at`.
    fn slot_of(&self, at: usize) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.hash(&self.entries[at].tuple) as usize & mask;
        while self.slots[i] as u32 as usize != at + 1 {
            i = (i + 1) & mask;
        }
        i
    }

    /// Removes the entry at `at`: its index slot is emptied by backward-shift deletion (each later slot of the
    /// probe run that may move back does), and the last entry takes its place. No tombstones, no rebuild.
    fn remove(&mut self, at: usize) -> Entry {
        let mask = self.slots.len() - 1;
        let mut hole = self.slot_of(at);
        let mut i = (hole + 1) & mask;
        while self.slots[i] != 0 {
            let e = (self.slots[i] as u32 - 1) as usize;
            let home = self.hash(&self.entries[e].tuple) as usize & mask;
            // The slot moves back into the hole unless its home lies after the hole (cyclically, up to `i`).
            if i.wrapping_sub(home) & mask >= i.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[i];
                hole = i;
            }
            i = (i + 1) & mask;
        }
        self.slots[hole] = 0;
        let last = self.entries.len() - 1;
        if at != last {
            let s = self.slot_of(last);
            self.slots[s] = (self.slots[s] >> 32) << 32 | (at as u64 + 1);
        }
        self.entries.swap_remove(at)
    }

    /// Removes the entries `keep` refuses (each is asked once), in place; the index is rebuilt only when it has
    /// become four times larger than the entries left need. The entries' order changes.
    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        let mut at = 0;
        while at < self.entries.len() {
            if keep(&self.entries[at]) {
                at += 1;
            } else {
                // The last entry, not yet asked, moves to `at`.
                self.remove(at);
            }
        }
        let cap = (self.entries.len() * 4).next_power_of_two().max(MIN_SLOTS);
        if cap < self.slots.len() / 4 {
            self.rebuild(cap);
        }
    }
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
#[derive(Debug)]
pub struct FlowTracker {
    live: Table,
    next_id: u64,
    /// Flows that ended, waiting to be taken.
    done: Vec<Flow>,
    /// Whether ended flows are kept for [`take_done`](Self::take_done).
    keep_done: bool,
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

/// What flow tracking needs of a packet: its flow's key and direction (`None`: no IP header), transport payload
/// bytes, TCP flags, and whether the fast path read it ([`plain_flow`]: every address and port a filter reads
/// from it is then one of the key's endpoints).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PacketFlow {
    pub(crate) flow: Option<(FlowTuple, Direction)>,
    pub(crate) payload: u64,
    pub(crate) flags: u8,
    pub(crate) plain: bool,
}

/// Reads what flow tracking needs of a packet: by [`plain_flow`] when it can, else by the decoder.
#[inline]
pub(crate) fn read_flow(linktype: LinkType, data: &[u8]) -> PacketFlow {
    if let Some(p) = plain_flow(linktype, data) {
        return PacketFlow { flow: Some((p.tuple, p.dir)), payload: u64::from(p.payload), flags: p.flags, plain: true };
    }
    let d = decode(linktype, data);
    let (payload, flags) = payload_and_flags(&d);
    match FlowKey::from_decoded(&d) {
        Some((key, dir)) => PacketFlow { flow: Some((FlowTuple::from(key), dir)), payload, flags, plain: false },
        None => PacketFlow { flow: None, payload, flags: 0, plain: false },
    }
}

/// A packet of a flow, as the tracker accounts it (from [`plain_flow`](pcaptool_packet::plain_flow) or from
/// the decoder).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlowPacket {
    pub(crate) tuple: FlowTuple,
    pub(crate) dir: Direction,
    pub(crate) payload: u64,
    pub(crate) flags: u8,
    pub(crate) wirelen: u32,
    pub(crate) ts_ns: u64,
}

impl Default for FlowTracker {
    fn default() -> FlowTracker {
        FlowTracker::new(0)
    }
}

impl FlowTracker {
    /// A tracker whose first flow gets id `first_id`.
    pub fn new(first_id: u64) -> FlowTracker {
        FlowTracker { live: Table::default(), next_id: first_id, done: Vec::new(), keep_done: true, last_sweep_ns: 0 }
    }

    /// A tracker that forgets flows once they end (for callers that keep records elsewhere):
    /// [`take_done`](Self::take_done) is always empty and [`finish`](Self::finish) returns the live flows only.
    pub fn forgetting(first_id: u64) -> FlowTracker {
        FlowTracker { keep_done: false, ..FlowTracker::new(first_id) }
    }

    /// The id the next new flow gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Accounts a packet (decoded as `d`, `wirelen` bytes on the wire, at `ts_ns`) to its flow.
    pub fn packet(&mut self, d: &Decoded, wirelen: u32, ts_ns: u64) -> Assigned {
        let (payload, flags) = payload_and_flags(d);
        let payload32 = payload.min(u64::from(u32::MAX)) as u32;
        let Some((key, dir)) = FlowKey::from_decoded(d) else {
            return Assigned {
                flow: None,
                key: None,
                from_orig: true,
                orig_is_lo: true,
                state: ConnState::Oth,
                payload: payload32,
                flags: 0,
            };
        };
        let p = FlowPacket { tuple: FlowTuple::from(key), dir, payload, flags, wirelen, ts_ns };
        let (e, from_orig) = self.account(&p, None);
        Assigned {
            flow: Some(e.id),
            key: Some(key),
            from_orig,
            orig_is_lo: e.orig_is_lo,
            state: e.state,
            payload: payload32,
            flags,
        }
    }

    /// A hint that a packet of flow tuple `t` comes soon: starts loading the part of the table its lookup reads
    /// first (the index slot, a cache miss per packet when many flows interleave).
    #[inline]
    pub(crate) fn prefetch(&self, t: &FlowTuple) -> u64 {
        self.live.prefetch(t)
    }

    /// The second step of the hint, a few packets after [`prefetch`](Self::prefetch) gave the hash `h`: finds
    /// the entry its index slot names and starts loading it; returns its position.
    #[inline]
    pub(crate) fn prefetch_entry(&self, h: u64) -> Option<usize> {
        self.live.prefetch_entry(h)
    }

    /// The slot cache of the entry at `at` (the third step of the hint), if there is one.
    #[inline]
    pub(crate) fn cache_at(&self, at: usize) -> Option<SlotCache> {
        self.live.entries.get(at).map(|e| e.cache)
    }

    /// Accounts a packet to its flow; returns the flow's entry and whether the packet went from the originator.
    /// `hash` is the tuple's hash if the caller has it ([`prefetch`](Self::prefetch) gave it).
    #[inline]
    pub(crate) fn account(&mut self, p: &FlowPacket, hash: Option<u64>) -> (&mut Entry, bool) {
        let ts_ns = p.ts_ns;
        self.sweep(ts_ns);
        let is_tcp = p.tuple.proto == IpProto::TCP.0;
        let idle = if is_tcp { TCP_IDLE_NS } else { OTHER_IDLE_NS };
        let opens = is_tcp && p.flags & 0x12 == 0x02;
        let fresh = |id: u64| Entry {
            tuple: p.tuple,
            cache: SlotCache::default(),
            id,
            first_ns: ts_ns,
            last_ns: ts_ns,
            started_ns: ts_ns,
            closed_ns: u64::MAX,
            orig: Side::default(),
            resp: Side::default(),
            orig_is_lo: p.dir == Direction::LoToHi,
            fin_orig: false,
            fin_resp: false,
            state: ConnState::Oth,
        };
        let h = hash.unwrap_or_else(|| self.live.hash(&p.tuple));
        debug_assert_eq!(h, self.live.hash(&p.tuple), "a hash from another tuple or table");
        let at = match self.live.find(h, &p.tuple) {
            Ok(at) => {
                let l = &mut self.live.entries[at];
                let expired = (l.closed_ns != u64::MAX
                    && (opens || ts_ns.saturating_sub(l.closed_ns) > CLOSE_DELAY_NS))
                    || ts_ns.saturating_sub(l.last_ns) > idle
                    || ts_ns.saturating_sub(l.started_ns) > ACTIVE_NS;
                if expired {
                    // An expired flow is replaced in place by the new one.
                    if self.keep_done {
                        self.done.push(l.flow());
                    }
                    *l = fresh(self.next_id);
                    self.next_id += 1;
                }
                at
            }
            Err(slot) => {
                let id = self.next_id;
                self.next_id += 1;
                self.live.insert(slot, h, fresh(id))
            }
        };
        let l = &mut self.live.entries[at];
        let from_orig = (p.dir == Direction::LoToHi) == l.orig_is_lo;
        l.first_ns = l.first_ns.min(ts_ns);
        l.last_ns = l.last_ns.max(ts_ns);
        let side = if from_orig { &mut l.orig } else { &mut l.resp };
        side.packets += 1;
        side.bytes += u64::from(p.wirelen);
        side.payload += p.payload;
        side.flags |= p.flags;
        if is_tcp {
            const FIN: u8 = 0x01;
            const RST: u8 = 0x04;
            if p.flags & FIN != 0 {
                if from_orig { l.fin_orig = true } else { l.fin_resp = true }
            }
            l.state = tcp_state(l.orig.flags, l.resp.flags, l.fin_orig, l.fin_resp);
            if l.closed_ns == u64::MAX && (p.flags & RST != 0 || (l.fin_orig && l.fin_resp)) {
                l.closed_ns = ts_ns;
            }
        }
        (l, from_orig)
    }

    /// Ends flows idle for longer than their timeout at `now` (checked at most once a second of trace time).
    fn sweep(&mut self, now: u64) {
        if now < self.last_sweep_ns.saturating_add(1_000_000_000) {
            return;
        }
        self.last_sweep_ns = now;
        let (done, keep_done) = (&mut self.done, self.keep_done);
        self.live.retain(|l| {
            let idle = if l.tuple.proto == IpProto::TCP.0 { TCP_IDLE_NS } else { OTHER_IDLE_NS };
            let keep = now.saturating_sub(l.last_ns) <= idle;
            if !keep && keep_done {
                done.push(l.flow());
            }
            keep
        });
    }

    /// Every live flow's record (for a segment that closes while they go on), in no particular order.
    pub fn live_flows(&self) -> impl Iterator<Item = Flow> + '_ {
        self.live.entries.iter().map(Entry::flow)
    }

    /// Takes the flows that ended since the last call, in no particular order.
    pub fn take_done(&mut self) -> Vec<Flow> {
        std::mem::take(&mut self.done)
    }

    /// Ends every flow (the end of the input) and returns all the ended flows not yet taken, in id order.
    pub fn finish(&mut self) -> Vec<Flow> {
        let mut done = std::mem::take(&mut self.done);
        done.extend(self.live.entries.drain(..).map(|l| l.flow()));
        self.live.rebuild(MIN_SLOTS);
        done.sort_by_key(|f| f.id);
        done
    }
}

fn tcp_state(o: u8, r: u8, fin_orig: bool, fin_resp: bool) -> ConnState {
    const SYN: u8 = 0x02;
    const RST: u8 = 0x04;
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
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn entry(tuple: FlowTuple, id: u64) -> Entry {
        Entry {
            tuple,
            cache: SlotCache::default(),
            id,
            first_ns: 0,
            last_ns: 0,
            started_ns: 0,
            closed_ns: u64::MAX,
            orig: Side::default(),
            resp: Side::default(),
            orig_is_lo: true,
            fin_orig: false,
            fin_resp: false,
            state: ConnState::Oth,
        }
    }

    proptest! {
        /// The table finds what was put in and nothing else, through growth, removals and shrinking, with
        /// keys that differ in one field only.
        #[test]
        fn the_flow_table_is_a_map(ops in prop::collection::vec((0u8..8, 0u32..3000), 1..3000)) {
            let mut t = Table::default();
            let mut m: HashMap<FlowTuple, u64> = HashMap::new();
            for (i, &(op, k)) in ops.iter().enumerate() {
                let tuple = match k % 4 {
                    0 => FlowTuple { lo: u128::from(k), ..FlowTuple::default() },
                    1 => FlowTuple { hi: u128::from(k) << 64, v6: 2, ..FlowTuple::default() },
                    2 => FlowTuple { lo_port: k as u16, proto: 6, ..FlowTuple::default() },
                    _ => FlowTuple { vlan: k as u16, hi_port: 1, ..FlowTuple::default() },
                };
                let h = t.hash(&tuple);
                if op < 7 {
                    match t.find(h, &tuple) {
                        Ok(at) => prop_assert_eq!(Some(&t.entries[at].id), m.get(&tuple)),
                        Err(slot) => {
                            prop_assert!(!m.contains_key(&tuple));
                            t.insert(slot, h, entry(tuple, i as u64));
                            m.insert(tuple, i as u64);
                        }
                    }
                } else if k % 2 == 0 {
                    // Remove most entries now and then, so that the index shrinks too.
                    let keep = u64::from(k % 5);
                    let mut asked = HashMap::new();
                    t.retain(|e| {
                        *asked.entry(e.id).or_insert(0) += 1;
                        e.id % 5 == keep
                    });
                    prop_assert!(asked.values().all(|&n| n == 1), "an entry asked twice");
                    prop_assert_eq!(asked.len(), m.len());
                    m.retain(|_, id| *id % 5 == keep);
                } else {
                    // And a few at a time, so that removals go through crowded probe runs.
                    let gone = u64::from(k % 7);
                    t.retain(|e| e.id % 7 != gone || e.id % 3 != 0);
                    m.retain(|_, id| *id % 7 != gone || *id % 3 != 0);
                }
                prop_assert!(t.entries.len() * 2 <= t.slots.len());
                prop_assert_eq!(t.slots.iter().filter(|&&s| s != 0).count(), t.entries.len());
            }
            prop_assert_eq!(t.entries.len(), m.len());
            for (tuple, id) in &m {
                let at = t.find(t.hash(tuple), tuple);
                prop_assert!(at.is_ok());
                prop_assert_eq!(t.entries[at.unwrap_or(0)].id, *id);
            }
        }
    }

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
