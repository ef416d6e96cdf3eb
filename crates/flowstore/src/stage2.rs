//! A segment's second stage: the flow table and the sorted arrays that find its flows (docs/format/segment.md).
//!
//! Compact by construction (FloSIS keeps its flow index at 0.25% of the stored bytes): addresses are codes
//! into a sorted dictionary, the flow table is cut into blocks of [`BLOCK_FLOWS`] entries whose fields are
//! stored column by column as varints (deltas where neighbours are close) and compressed with zstd, and the
//! sorted arrays are posting lists: for each address and port of the dictionaries, the blocks holding its flows.
//! Slots are in flow-id order, so a flow id is found by binary search in the block directory and one block
//! decoded; an address, prefix or port range by binary search in a dictionary, its posting lists merged, and
//! only the blocks they name decoded.

use std::borrow::Cow;
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use pcaptool_packet::{Field, FlowKey, IpProto, MappedFile, Need, Pred};

use crate::codec::{Rd, get_varint, put_varint};
use crate::error::StoreError;
use crate::flow::{ConnState, Flow, Side};
use crate::format::{ip_of, key_of, no_flow, v4_key, v6_key};
use crate::stage1::need_may;

/// Flow entries per block of the flow table (format 4; 256 before: blocks of 1024 entries compress 7% smaller on
/// the real-traffic bench trace, and a lookup decodes one in tens of microseconds).
pub const BLOCK_FLOWS: usize = 1024;
/// Flow entries per block of formats 2 and 3.
const BLOCK_FLOWS_V3: usize = 256;
/// zstd level the sections are compressed with: 9 made the index 0.02% smaller than 5 on the bench trace's first
/// 1M packets, and tripled the import's CPU time (its match finder's tables, set up for each block).
const ZSTD_LEVEL: i32 = 5;
/// Columns of a block, in order (docs/format/segment.md).
const COLUMNS: usize = 20;
/// Bytes of a directory entry.
const DIR_ENTRY: usize = 40;
/// Bytes of the fixed part of stage 2 (formats 4 and 5; 36 before, without the summary of the packets of no
/// flow).
const FIXED: usize = 40;

/// A flow of a segment as its index describes it.
#[derive(Clone, Copy, Debug)]
pub struct FlowEntry {
    /// Its slot in the segment (0: the packets of no flow).
    pub slot: u32,
    /// The flow's record for its packets in this segment (`id` `u64::MAX`: the packets of no flow).
    pub flow: Flow,
    /// Where its packets are in the data file, and how many.
    pub data_offset: u64,
    /// See `data_offset`.
    pub data_len: u64,
    /// See `data_offset`.
    pub packets: u32,
    positions_at: u64,
    positions_len: u64,
    /// Whether a packet's IP protocol, as filters read it, may differ from the key's (IPv6 extension headers).
    proto_beyond_key: bool,
}

impl FlowEntry {
    /// Whether these are the packets of no flow (ARP and other traffic without an IP header).
    pub fn is_no_flow(&self) -> bool {
        self.slot == 0
    }

    /// Whether the flow may hold a packet satisfying `need` (the packets of no flow always may).
    pub fn may_match(&self, need: &Need) -> bool {
        self.is_no_flow() || need_may(need, &|p| flow_pred_may(&self.flow, p, self.proto_beyond_key))
    }
}

/// Whether a packet of flow `f` may satisfy `p`; `proto_beyond_key`: some packet's IP protocol, as filters
/// read it, is not the key's.
fn flow_pred_may(f: &Flow, p: &Pred, proto_beyond_key: bool) -> bool {
    let k = &f.key;
    let addr = |a: IpAddr| match a {
        IpAddr::V4(v) => (4u8, u128::from(u32::from(v))),
        IpAddr::V6(v) => (6u8, u128::from(v)),
    };
    let either = |fam: u8| [k.lo_addr, k.hi_addr].into_iter().map(addr).any(|(f, v)| f == fam && p.holds(v));
    match p.field {
        Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => either(4),
        Field::Ip6Src | Field::Ip6Dst => either(6),
        Field::SrcPort | Field::DstPort => p.holds(u128::from(k.lo_port)) || p.holds(u128::from(k.hi_port)),
        Field::IpProto => proto_beyond_key || p.holds(u128::from(k.proto.0)),
        Field::VlanId => k.vlan == 0 || p.holds(u128::from(k.vlan)),
        Field::Time => p.mask != u128::MAX || (p.lo <= u128::from(f.last_ns) && u128::from(f.first_ns) <= p.hi),
        _ => true,
    }
}

/// What a segment's packets of no flow hold, as a filter reads them (`PacketFields`): the distinct network
/// protocols, IP protocols, IPv4 addresses (IP and ARP), IPv6 addresses and ports among them, and which fields
/// some of them have cut short. Stage 2 keeps it (format 4), so that a condition none of them can satisfy reads
/// none of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NoFlow {
    /// Bit `i`: some packet has field `Field::ALL[i]` cut short by the snapshot length.
    pub cut: u32,
    pub links: Vec<u16>,
    pub protos: Vec<u8>,
    pub v4: Vec<u32>,
    pub v6: Vec<u128>,
    pub ports: Vec<u16>,
}

/// Bit of a field in [`NoFlow::cut`].
pub(crate) fn field_bit(f: Field) -> u32 {
    1 << Field::ALL.iter().position(|&g| g == f).unwrap_or(31)
}

/// The values of a sorted list as a varint count then varint deltas.
fn put_sorted(out: &mut Vec<u8>, v: impl ExactSizeIterator<Item = u64>) {
    put_varint(out, v.len() as u64);
    let mut prev = 0;
    for x in v {
        put_varint(out, x - prev);
        prev = x;
    }
}

fn get_sorted(b: &[u8], at: &mut usize, max: u64) -> Result<Vec<u64>, String> {
    let n = get_varint(b, at).ok_or("truncated")?;
    if n > (b.len() - *at) as u64 {
        return Err(format!("{n} values in {} bytes", b.len() - *at));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut v = 0u64;
    for i in 0..n {
        let d = get_varint(b, at).ok_or("truncated")?;
        v = v.checked_add(d).filter(|&v| v <= max && (i == 0 || d > 0)).ok_or("values not strictly increasing")?;
        out.push(v);
    }
    Ok(out)
}

impl NoFlow {
    /// Notes one packet's fields (of a link type whose fields are read).
    pub(crate) fn note(sets: &mut NoFlowSets, fields: &pcaptool_packet::PacketFields<'_>) {
        use pcaptool_packet::FieldValue::{Unknown, Value};
        let r = fields.reader();
        let mut cut = 0;
        let mut note = |f: Field, put: &mut dyn FnMut(u128)| match r.get(f) {
            Value(v) => put(v),
            Unknown => cut |= field_bit(f),
            _ => {}
        };
        note(Field::LinkProto, &mut |v| {
            sets.links.insert(v as u16);
        });
        note(Field::IpProto, &mut |v| {
            sets.protos.insert(v as u8);
        });
        for f in [Field::Ip4Src, Field::Ip4Dst, Field::ArpSpa, Field::ArpTpa] {
            note(f, &mut |v| {
                sets.v4.insert(v as u32);
            });
        }
        for f in [Field::Ip6Src, Field::Ip6Dst] {
            note(f, &mut |v| {
                sets.v6.insert(v);
            });
        }
        for f in [Field::SrcPort, Field::DstPort] {
            note(f, &mut |v| {
                sets.ports.insert(v as u16);
            });
        }
        sets.cut |= cut;
    }

    /// The summary of what [`note`](Self::note) gathered.
    pub(crate) fn of(sets: &NoFlowSets) -> NoFlow {
        fn sorted<T: Copy + Ord>(s: &rustc_hash::FxHashSet<T>) -> Vec<T> {
            let mut v: Vec<T> = s.iter().copied().collect();
            v.sort_unstable();
            v
        }
        NoFlow {
            cut: sets.cut,
            links: sorted(&sets.links),
            protos: sorted(&sets.protos),
            v4: sorted(&sets.v4),
            v6: sorted(&sets.v6),
            ports: sorted(&sets.ports),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut o = self.cut.to_le_bytes().to_vec();
        put_sorted(&mut o, self.links.iter().map(|&v| u64::from(v)));
        put_sorted(&mut o, self.protos.iter().map(|&v| u64::from(v)));
        put_sorted(&mut o, self.v4.iter().map(|&v| u64::from(v)));
        put_varint(&mut o, self.v6.len() as u64);
        for a in &self.v6 {
            o.extend_from_slice(&a.to_be_bytes());
        }
        put_sorted(&mut o, self.ports.iter().map(|&v| u64::from(v)));
        o
    }

    fn decode(b: &[u8]) -> Result<NoFlow, String> {
        let mut r = Rd { b, at: 0 };
        let cut = r.u32()?;
        let mut at = r.at;
        let links = get_sorted(b, &mut at, 0xffff)?.into_iter().map(|v| v as u16).collect();
        let protos = get_sorted(b, &mut at, 0xff)?.into_iter().map(|v| v as u8).collect();
        let v4 = get_sorted(b, &mut at, u64::from(u32::MAX))?.into_iter().map(|v| v as u32).collect();
        let n6 = get_varint(b, &mut at).ok_or("truncated")?;
        if n6 > ((b.len() - at) / 16) as u64 {
            return Err(format!("{n6} IPv6 addresses in {} bytes", b.len() - at));
        }
        let mut v6 = Vec::with_capacity(n6 as usize);
        for _ in 0..n6 {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            at += 16;
            v6.push(u128::from_be_bytes(a));
        }
        if !v6.windows(2).all(|w| w[0] < w[1]) {
            return Err("IPv6 addresses not strictly increasing".into());
        }
        let ports = get_sorted(b, &mut at, 0xffff)?.into_iter().map(|v| v as u16).collect();
        if at != b.len() {
            return Err("bytes after the summary".into());
        }
        Ok(NoFlow { cut, links, protos, v4, v6, ports })
    }

    /// Whether some packet of no flow may satisfy `need`. A field some packet has cut short fails only a
    /// predicate that reads all of its bytes (see `Need::may_match_captured`).
    pub(crate) fn may_match(&self, need: &Need) -> bool {
        need_may(need, &|p| self.may_match_pred(p))
    }

    /// Whether some packet of no flow may satisfy `p`.
    fn may_match_pred(&self, p: &Pred) -> bool {
        fn any<T: Copy + Into<u128>>(v: &[T], p: &Pred) -> bool {
            if p.mask == u128::MAX {
                // A range: the first value not below `lo`.
                let i = v.partition_point(|&x| x.into() < p.lo);
                v.get(i).is_some_and(|&x| x.into() <= p.hi)
            } else {
                v.iter().any(|&x| p.holds(x.into()))
            }
        }
        self.cut_passes(p)
            || match p.field {
                Field::LinkProto => any(&self.links, p),
                Field::IpProto => any(&self.protos, p),
                Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => any(&self.v4, p),
                Field::Ip6Src | Field::Ip6Dst => any(&self.v6, p),
                Field::SrcPort | Field::DstPort => any(&self.ports, p),
                _ => true,
            }
    }

    /// Whether a packet with `p`'s field cut short may satisfy `p`, and one has.
    fn cut_passes(&self, p: &Pred) -> bool {
        self.cut & field_bit(p.field) != 0 && (p.always() || !p.reads_whole_field())
    }
}

/// The groups of packets of no flow of a kept stage 2 by the addresses and ports their summaries hold, each
/// value with its group, sorted: an exact value, prefix or range of them finds its groups by binary search
/// rather than by a test of each group (a segment has up to [`MAX_NO_FLOW_GROUPS`], each tested for every
/// answer: a fifth of a hot store's needle before).
#[derive(Debug, Default)]
struct GroupIndex {
    /// The fields some group has cut short (`NoFlow::cut` of them all).
    cut: u32,
    v4: Vec<(u32, u16)>,
    v6: Vec<(u128, u16)>,
    ports: Vec<(u16, u16)>,
}

impl GroupIndex {
    /// The IPv4 addresses, IPv6 addresses and ports the summaries of `groups` hold.
    fn lens(groups: &[NoFlowGroup]) -> [usize; 3] {
        groups
            .iter()
            .fold([0; 3], |[a, b, c], g| [a + g.summary.v4.len(), b + g.summary.v6.len(), c + g.summary.ports.len()])
    }

    /// The heap bytes the index of `groups` takes.
    fn heap_bytes_of(groups: &[NoFlowGroup]) -> u64 {
        let [v4, v6, ports] = GroupIndex::lens(groups);
        (v4 * size_of::<(u32, u16)>() + v6 * size_of::<(u128, u16)>() + ports * size_of::<(u16, u16)>()) as u64
    }

    fn of(groups: &[NoFlowGroup]) -> GroupIndex {
        // (Sized exactly, so that the bytes taken from the store's budget are those held.)
        let [v4, v6, ports] = GroupIndex::lens(groups);
        let mut ix = GroupIndex {
            cut: 0,
            v4: Vec::with_capacity(v4),
            v6: Vec::with_capacity(v6),
            ports: Vec::with_capacity(ports),
        };
        for (g, group) in groups.iter().enumerate() {
            // (More groups than a u16 counts are never indexed: see `groups_may_match`.)
            let g = g as u16;
            let s = &group.summary;
            ix.cut |= s.cut;
            ix.v4.extend(s.v4.iter().map(|&v| (v, g)));
            ix.v6.extend(s.v6.iter().map(|&v| (v, g)));
            ix.ports.extend(s.ports.iter().map(|&v| (v, g)));
        }
        ix.v4.sort_unstable();
        ix.v6.sort_unstable();
        ix.ports.sort_unstable();
        ix
    }

    /// Marks in `out` the groups holding a value of `p`'s field from `p.lo` to `p.hi` (`p` a range); false if
    /// the index has no list for the field.
    fn mark(&self, p: &Pred, out: &mut [bool]) -> bool {
        fn range<T: Copy + Ord + TryFrom<u128>>(v: &[(T, u16)], lo: u128, hi: u128, max: T, out: &mut [bool]) {
            let Ok(lo) = T::try_from(lo) else { return };
            let hi = T::try_from(hi).unwrap_or(max);
            let from = v.partition_point(|e| e.0 < lo);
            for &(_, g) in v[from..].iter().take_while(|e| e.0 <= hi) {
                if let Some(o) = out.get_mut(usize::from(g)) {
                    *o = true;
                }
            }
        }
        match p.field {
            Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => range(&self.v4, p.lo, p.hi, u32::MAX, out),
            Field::Ip6Src | Field::Ip6Dst => range(&self.v6, p.lo, p.hi, u128::MAX, out),
            Field::SrcPort | Field::DstPort => range(&self.ports, p.lo, p.hi, u16::MAX, out),
            _ => return false,
        }
        true
    }
}

/// Per group of packets of no flow, whether it may hold a packet satisfying `need`, each as
/// [`NoFlow::may_match`] decides; through `index` (of these groups) where it serves.
fn groups_may_match(groups: &[NoFlowGroup], index: Option<&GroupIndex>, need: &Need) -> Vec<bool> {
    let n = groups.len();
    match need {
        Need::All => vec![true; n],
        Need::Pred(p) => {
            let mut out = vec![false; n];
            let indexed = p.mask == u128::MAX
                && p.lo <= p.hi
                && n <= usize::from(u16::MAX) + 1
                && index.is_some_and(|ix| ix.mark(p, &mut out));
            if indexed {
                if index.is_some_and(|ix| ix.cut & field_bit(p.field) != 0) {
                    for (o, g) in out.iter_mut().zip(groups) {
                        *o = *o || g.summary.cut_passes(p);
                    }
                }
            } else {
                for (o, g) in out.iter_mut().zip(groups) {
                    *o = g.summary.may_match_pred(p);
                }
            }
            out
        }
        Need::And(v) => v.iter().fold(vec![true; n], |mut acc, x| {
            if acc.contains(&true) {
                acc.iter_mut().zip(groups_may_match(groups, index, x)).for_each(|(a, b)| *a = *a && b);
            }
            acc
        }),
        Need::Or(v) => v.iter().fold(vec![false; n], |mut acc, x| {
            acc.iter_mut().zip(groups_may_match(groups, index, x)).for_each(|(a, b)| *a = *a || b);
            acc
        }),
    }
}

/// What a writer gathers of its packets of no flow ([`NoFlow::note`]).
#[derive(Debug, Default)]
pub(crate) struct NoFlowSets {
    cut: u32,
    links: rustc_hash::FxHashSet<u16>,
    protos: rustc_hash::FxHashSet<u8>,
    v4: rustc_hash::FxHashSet<u32>,
    v6: rustc_hash::FxHashSet<u128>,
    ports: rustc_hash::FxHashSet<u16>,
}

/// Groups of packets of no flow a segment keeps apart at most (format 8); the packets of a key that comes once
/// this many groups exist join the group its hash names.
pub(crate) const MAX_NO_FLOW_GROUPS: usize = 256;

/// One group of a segment's packets of no flow (format 8): packets of one network protocol and one pair of
/// addresses (ARP's sender and target, say), or several such keys once there are [`MAX_NO_FLOW_GROUPS`]. A
/// group's packets lie together in the data file and its positions together too, the first of them absolute,
/// so that a needle reads (and decompresses) only the groups whose summary allows a match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NoFlowGroup {
    pub packets: u64,
    pub data_len: u64,
    pub positions_len: u64,
    pub summary: NoFlow,
}

impl NoFlowGroup {
    fn encode(groups: &[NoFlowGroup]) -> Vec<u8> {
        let mut o = Vec::new();
        put_varint(&mut o, groups.len() as u64);
        for g in groups {
            let s = g.summary.encode();
            for v in [g.packets, g.data_len, g.positions_len, s.len() as u64] {
                put_varint(&mut o, v);
            }
            o.extend_from_slice(&s);
        }
        o
    }

    fn decode(b: &[u8]) -> Result<Vec<NoFlowGroup>, String> {
        let mut at = 0;
        let n = get_varint(b, &mut at).ok_or("truncated")?;
        if n > MAX_NO_FLOW_GROUPS as u64 {
            return Err(format!("{n} groups (at most {MAX_NO_FLOW_GROUPS})"));
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut v = [0u64; 4];
            for x in &mut v {
                *x = get_varint(b, &mut at).ok_or("truncated")?;
            }
            let [packets, data_len, positions_len, len] = v;
            let s = at
                .checked_add(usize::try_from(len).unwrap_or(usize::MAX))
                .and_then(|end| b.get(at..end))
                .ok_or("a group's summary past the end")?;
            at += s.len();
            if packets == 0 || positions_len < packets || packets.checked_mul(16).is_none_or(|m| data_len < m) {
                return Err(format!("group {i}: {packets} packets in {data_len} bytes, {positions_len} of positions"));
            }
            out.push(NoFlowGroup { packets, data_len, positions_len, summary: NoFlow::decode(s)? });
        }
        if at != b.len() {
            return Err("bytes after the groups".into());
        }
        Ok(out)
    }
}

/// How a writer groups its packets of no flow (see [`NoFlowGroup`]): per group what its packets hold and the
/// position of its last packet, and each packet's group in the order they came.
#[derive(Debug, Default)]
pub(crate) struct NoFlowGroups {
    pub sets: Vec<NoFlowSets>,
    pub last: Vec<u64>,
    pub of_packet: Vec<u16>,
    by_key: rustc_hash::FxHashMap<u64, u16>,
}

impl NoFlowGroups {
    /// The group of a packet of no flow with `fields` (`None`: of a link type whose fields are not read), its
    /// fields noted in the group's summary. The packet's position goes to `last` of that group.
    pub(crate) fn note(&mut self, fields: Option<&pcaptool_packet::PacketFields<'_>>) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        if let Some(fields) = fields {
            let r = fields.reader();
            let v = |f: Field| match r.get(f) {
                pcaptool_packet::FieldValue::Value(v) => Some(v),
                _ => None,
            };
            let pair = |a: Option<u128>, b: Option<u128>| (a.min(b), a.max(b));
            (v(Field::LinkProto), v(Field::IpProto)).hash(&mut h);
            pair(v(Field::Ip4Src).or(v(Field::ArpSpa)), v(Field::Ip4Dst).or(v(Field::ArpTpa))).hash(&mut h);
            pair(v(Field::Ip6Src), v(Field::Ip6Dst)).hash(&mut h);
        } else {
            u64::MAX.hash(&mut h);
        }
        let key = h.finish();
        let n = self.sets.len();
        let g = match self.by_key.get(&key) {
            Some(&g) => usize::from(g),
            None if n < MAX_NO_FLOW_GROUPS => {
                self.by_key.insert(key, n as u16);
                self.sets.push(NoFlowSets::default());
                self.last.push(0);
                n
            }
            None => (key % MAX_NO_FLOW_GROUPS as u64) as usize,
        };
        if let Some(fields) = fields {
            NoFlow::note(&mut self.sets[g], fields);
        }
        self.of_packet.push(g as u16);
        g
    }
}

impl NoFlowGroups {
    /// Orders `sorted`, the packets of no flow as they came (one per [`note`](Self::note)), by group, stably;
    /// returns where each group ends in it. `None` when they are not as many as were noted.
    pub(crate) fn order(&self, sorted: &mut [u64]) -> Option<Vec<usize>> {
        if sorted.len() != self.of_packet.len() {
            return None;
        }
        let mut ends = vec![0usize; self.sets.len()];
        for &g in &self.of_packet {
            ends[usize::from(g)] += 1;
        }
        let mut at = 0;
        let mut start = ends.clone();
        for (e, s) in ends.iter_mut().zip(&mut start) {
            *s = at;
            at += *e;
            *e = at;
        }
        let was = sorted.to_vec();
        for (&p, &g) in was.iter().zip(&self.of_packet) {
            let s = &mut start[usize::from(g)];
            sorted[*s] = p;
            *s += 1;
        }
        Some(ends)
    }
}

/// What stage 2 says of the packets of no flow.
#[derive(Debug)]
enum NoFlowIndex {
    /// Nothing (before format 4): they may match anything.
    Unknown,
    /// One summary of them all (formats 4 to 7).
    One(NoFlow),
    /// Their groups, in data order (format 8).
    Groups(Vec<NoFlowGroup>),
}

/// What the writer knows of one slot.
pub(crate) struct SlotIn<'a> {
    pub flow: &'a Flow,
    /// Whether some packet's IP protocol, as filters read it, is not the key's (format 6: flags bit 4).
    pub proto_beyond_key: bool,
    pub data_len: u64,
    pub positions_len: u64,
}

fn zigzag(v: u64) -> u64 {
    let s = v as i64;
    ((s << 1) ^ (s >> 63)) as u64
}

fn unzigzag(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

fn compress(raw: &[u8]) -> Vec<u8> {
    // Compressing a buffer in memory fails only for lack of memory, which aborts anyway.
    zstd::bulk::compress(raw, ZSTD_LEVEL).unwrap_or_else(|e| panic!("zstd compression of a memory buffer: {e}"))
}

fn decompress(z: &[u8], raw_len: usize, what: &str) -> Result<Vec<u8>, String> {
    let raw =
        crate::blocks::with_zstd_decompressor(|d| d.decompress(z, raw_len)).map_err(|e| format!("{what}: {e}"))?;
    if raw.len() != raw_len {
        return Err(format!("{what}: {} bytes, {raw_len} expected", raw.len()));
    }
    Ok(raw)
}

/// Bytes of the headers in front of the transport payload of a packet of flow `key` in the usual case:
/// Ethernet, its VLAN tag, IPv4 or IPv6 without options or extension headers, TCP without options or UDP. The
/// flow table stores each side's header bytes as the difference to this per packet (0 for the packets of no
/// flow).
fn usual_headers(key: &FlowKey, slot0: bool) -> u64 {
    if slot0 {
        return 0;
    }
    let ip = if key.lo_addr.is_ipv4() { 20 } else { 40 };
    let l4 = match key.proto.0 {
        6 => 20,
        17 => 8,
        _ => 0,
    };
    14 + 4 * u64::from(key.vlan != 0) + ip + l4
}

/// The column values of one entry (see the format's block layout).
/// The difference `a - b` of two timestamps in units of `unit` (both multiples of it), as a wrapping difference.
fn in_units(a: u64, b: u64, unit: u64) -> u64 {
    (a.wrapping_sub(b) as i64 / unit as i64) as u64
}

/// The unit every timestamp of a block's slots is a multiple of: 1000 (all whole microseconds, as from traces of
/// microsecond precision) or 1. The empty entry of no flow's sentinel times do not count.
fn time_unit(slots: &[SlotIn<'_>]) -> u64 {
    let mut times = slots.iter().filter(|s| !is_empty_no_flow(s.flow)).flat_map(|s| [s.flow.first_ns, s.flow.last_ns]);
    if times.all(|t| t % 1000 == 0) { 1000 } else { 1 }
}

/// Whether `f` is the entry of no flow holding no packet (its times are the sentinels `u64::MAX` and 0).
fn is_empty_no_flow(f: &Flow) -> bool {
    f.id == u64::MAX && f.orig.packets == 0 && f.resp.packets == 0
}

/// A slot's columns. Its first timestamp is a difference to `prev_first`, and its last one to its first, in
/// units of `unit`; the empty entry of no flow stores 0 for both (format 5).
fn row(
    s: &SlotIn<'_>,
    codes: (u64, u64),
    prev_id: Option<u64>,
    prev_first: u64,
    slot0: bool,
    unit: u64,
) -> [u64; COLUMNS] {
    let f = s.flow;
    let packets = f.orig.packets + f.resp.packets;
    let (first, last) = if slot0 && is_empty_no_flow(f) {
        (0, 0)
    } else {
        (zigzag(in_units(f.first_ns, prev_first, unit)), in_units(f.last_ns, f.first_ns, unit))
    };
    let h = usual_headers(&f.key, slot0);
    let hdr = |side: &Side| zigzag(side.bytes.wrapping_sub(side.payload).wrapping_sub(h.wrapping_mul(side.packets)));
    let stored = packets.wrapping_mul(16).wrapping_add(f.orig.bytes).wrapping_add(f.resp.bytes);
    [
        prev_id.map_or(0, |p| f.id - p - 1),
        codes.0,
        codes.1,
        u64::from(f.key.lo_port),
        u64::from(f.key.hi_port),
        u64::from(f.key.proto.0),
        u64::from(f.key.vlan),
        u64::from(f.orig_is_lo) | (f.state as u64) << 1 | u64::from(s.proto_beyond_key) << 4,
        u64::from(f.orig.flags),
        u64::from(f.resp.flags),
        first,
        last,
        f.orig.packets,
        f.resp.packets,
        f.orig.payload,
        f.resp.payload,
        hdr(&f.orig),
        hdr(&f.resp),
        zigzag(stored.wrapping_sub(s.data_len)),
        s.positions_len.wrapping_sub(packets),
    ]
}

/// The distinct endpoint addresses and ports of a segment's flows, sorted, and each slot's codes (its
/// endpoints' places in them). Slot 0, the packets of no flow, has none.
pub(crate) struct Endpoints {
    /// Address keys (family 4 or 6, then the address bytes: [`v4_key`], [`v6_key`]), in order: IPv4 first.
    pub(crate) addrs: Vec<[u8; 17]>,
    /// How many of `addrs` are IPv4.
    n4: usize,
    pub(crate) ports: Vec<u16>,
    /// Per slot, the codes of its `lo` and `hi` address, then of its `lo` and `hi` port (0s for slot 0).
    codes: Vec<[u64; 4]>,
}

impl Endpoints {
    /// The endpoints of `slots` (slot 0 the packets of no flow).
    pub(crate) fn of(slots: &[SlotIn<'_>]) -> Endpoints {
        let mut codes = vec![[0u64; 4]; slots.len()];
        // Addresses: each tagged with where its code goes (slot × 4 + side), sorted, and numbered in order; one
        // sort, not a sort and then a binary search for each.
        let mut v4: Vec<u128> = Vec::with_capacity(2 * slots.len());
        let mut v6: Vec<(u128, u64)> = Vec::new();
        for (slot, s) in slots.iter().enumerate().skip(1) {
            for (side, a) in [s.flow.key.lo_addr, s.flow.key.hi_addr].into_iter().enumerate() {
                let tag = (slot * 4 + side) as u64;
                match a {
                    IpAddr::V4(v) => v4.push(u128::from(u32::from(v)) << 64 | u128::from(tag)),
                    IpAddr::V6(v) => v6.push((u128::from(v), tag)),
                }
            }
        }
        v4.sort_unstable();
        v6.sort_unstable();
        let mut addrs = Vec::new();
        let mut number = |key: [u8; 17], tag: u64| {
            if addrs.last() != Some(&key) {
                addrs.push(key);
            }
            codes[(tag / 4) as usize][(tag % 4) as usize] = (addrs.len() - 1) as u64;
        };
        for x in v4 {
            number(v4_key(x >> 64), x as u64);
        }
        for (v, tag) in v6 {
            number(v6_key(v), tag);
        }
        let n4 = addrs.iter().take_while(|a| a[0] == 4).count();
        // Ports: a bitmap of the 65,536 values, a port's code the set bits below it.
        let mut bits = vec![0u64; 1 << 10];
        for s in slots.iter().skip(1) {
            for p in [s.flow.key.lo_port, s.flow.key.hi_port] {
                bits[usize::from(p / 64)] |= 1 << (p % 64);
            }
        }
        let mut below = Vec::with_capacity(bits.len());
        let mut ports = Vec::new();
        for (w, &word) in bits.iter().enumerate() {
            below.push(ports.len() as u64);
            let mut rest = word;
            while rest != 0 {
                ports.push((w * 64) as u16 + rest.trailing_zeros() as u16);
                rest &= rest - 1;
            }
        }
        let rank = |p: u16| {
            below[usize::from(p / 64)] + u64::from((bits[usize::from(p / 64)] & ((1 << (p % 64)) - 1)).count_ones())
        };
        for (slot, s) in slots.iter().enumerate().skip(1) {
            codes[slot][2] = rank(s.flow.key.lo_port);
            codes[slot][3] = rank(s.flow.key.hi_port);
        }
        Endpoints { addrs, n4, ports, codes }
    }
}

/// Encodes stage 2 of the slots (slot 0 the packets of no flow, the others in increasing flow id), whose
/// endpoints are `ends` and whose original-order positions are `positions`.
pub(crate) fn encode(
    slots: &[SlotIn<'_>],
    ends: &Endpoints,
    no_flow: &[NoFlowGroup],
    t_min: u64,
    positions: &[u8],
) -> Vec<u8> {
    let Endpoints { addrs, n4, ports, codes } = ends;
    let n4 = *n4;

    let mut dict = Vec::new();
    let mut prev = 0u64;
    for a in &addrs[..n4] {
        let v = u64::from(u32::from_be_bytes([a[1], a[2], a[3], a[4]]));
        put_varint(&mut dict, v - prev);
        prev = v;
    }
    for a in &addrs[n4..] {
        dict.extend_from_slice(&a[1..17]);
    }

    // Posting lists, one per dictionary value: the blocks of the flow table holding its flows (a block is
    // decoded whole anyway). Streams: port dictionary deltas, list lengths, then block number deltas.
    let mut post = Vec::new();
    let mut prev = 0u64;
    for &p in ports {
        put_varint(&mut post, u64::from(p) - prev);
        prev = u64::from(p);
    }
    // Posting lists by a counting sort of each slot's codes: a code's blocks come out in slot order, so
    // increasing, and repeats stand together.
    let mut lens = Vec::new();
    let mut blocks_of = Vec::new();
    for (sides, n) in [(0..2, addrs.len()), (2..4, ports.len())] {
        let mut start = vec![0usize; n + 1];
        for c in codes.iter().skip(1) {
            for side in sides.clone() {
                start[c[side] as usize + 1] += 1;
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut sorted = vec![0u64; start[n]];
        for (slot, c) in codes.iter().enumerate().skip(1) {
            for side in sides.clone() {
                let f = &mut fill[c[side] as usize];
                sorted[*f] = (slot / BLOCK_FLOWS) as u64;
                *f += 1;
            }
        }
        for code in 0..n {
            let (mut last, mut count) = (None, 0u64);
            for &block in &sorted[start[code]..start[code + 1]] {
                if last != Some(block) {
                    put_varint(&mut blocks_of, block - last.unwrap_or(0));
                    last = Some(block);
                    count += 1;
                }
            }
            put_varint(&mut lens, count);
        }
    }
    post.extend_from_slice(&lens);
    post.extend_from_slice(&blocks_of);

    // Blocks of the flow table.
    let mut dir = Vec::new();
    let mut blocks = Vec::new();
    let (mut data_at, mut pos_at) = (24u64, 0u64);
    for (b, chunk) in slots.chunks(BLOCK_FLOWS).enumerate() {
        let mut rows = Vec::with_capacity(chunk.len());
        // Timestamps in the block's unit, the first a difference to `t_min` rounded down to the unit.
        let unit = time_unit(chunk);
        let (mut prev_id, mut prev_first, mut first_id) = (None, t_min - t_min % unit, u64::MAX);
        let (block_data, block_pos) = (data_at, pos_at);
        for (i, s) in chunk.iter().enumerate() {
            let c = codes[b * BLOCK_FLOWS + i];
            let slot0 = b == 0 && i == 0;
            rows.push(row(s, (c[0], c[1]), prev_id, prev_first, slot0, unit));
            if !slot0 {
                if prev_id.is_none() {
                    first_id = s.flow.id;
                }
                prev_id = Some(s.flow.id);
            }
            if !(slot0 && is_empty_no_flow(s.flow)) {
                prev_first = s.flow.first_ns;
            }
            data_at += s.data_len;
            pos_at += s.positions_len;
        }
        let mut raw = Vec::new();
        put_varint(&mut raw, unit);
        for c in 0..COLUMNS {
            for r in &rows {
                put_varint(&mut raw, r[c]);
            }
        }
        let z = compress(&raw);
        for v in [first_id, block_data, block_pos] {
            dir.extend_from_slice(&v.to_le_bytes());
        }
        let pos_crc = crc32fast::hash(positions.get(block_pos as usize..pos_at as usize).unwrap_or_default());
        for v in [z.len() as u32, raw.len() as u32, crc32fast::hash(&z), pos_crc] {
            dir.extend_from_slice(&v.to_le_bytes());
        }
        blocks.extend_from_slice(&z);
    }

    let (dict_z, post_z) = (compress(&dict), compress(&post));
    let no_flow = NoFlowGroup::encode(no_flow);
    let mut out = Vec::with_capacity(FIXED + dict_z.len() + post_z.len() + dir.len() + blocks.len() + 4);
    for v in [n4, addrs.len() - n4, ports.len(), slots.len().div_ceil(BLOCK_FLOWS)] {
        out.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for v in [dict_z.len(), dict.len(), post_z.len(), post.len()] {
        out.extend_from_slice(&(v as u32).to_le_bytes());
    }
    out.extend_from_slice(&crc32fast::hash(&post_z).to_le_bytes());
    out.extend_from_slice(&(no_flow.len() as u32).to_le_bytes());
    out.extend_from_slice(&dict_z);
    out.extend_from_slice(&dir);
    out.extend_from_slice(&no_flow);
    let head_crc = crc32fast::hash(&out);
    out.extend_from_slice(&head_crc.to_le_bytes());
    out.extend_from_slice(&post_z);
    out.extend_from_slice(&blocks);
    out
}

/// Stage 2 of format 8 (`b`) as format 7 wrote it: the groups of packets of no flow as one summary.
#[cfg(test)]
pub(crate) fn as_format_7(b: &[u8]) -> Vec<u8> {
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    let (n_blocks, dict_z, no_flow_len) = (u32_at(12), u32_at(16), u32_at(36));
    let nf_at = FIXED + dict_z + n_blocks * DIR_ENTRY;
    let groups = NoFlowGroup::decode(&b[nf_at..nf_at + no_flow_len]).unwrap();
    let mut all = NoFlow::default();
    for g in groups {
        let s = g.summary;
        all.cut |= s.cut;
        all.links.extend(s.links);
        all.protos.extend(s.protos);
        all.v4.extend(s.v4);
        all.v6.extend(s.v6);
        all.ports.extend(s.ports);
    }
    fn norm<T: Ord>(v: &mut Vec<T>) {
        v.sort_unstable();
        v.dedup();
    }
    norm(&mut all.links);
    norm(&mut all.protos);
    norm(&mut all.v4);
    norm(&mut all.v6);
    norm(&mut all.ports);
    let one = all.encode();
    let mut head = [&b[..nf_at], &one[..]].concat();
    head[36..40].copy_from_slice(&(one.len() as u32).to_le_bytes());
    let crc = crc32fast::hash(&head);
    head.extend_from_slice(&crc.to_le_bytes());
    head.extend_from_slice(&b[nf_at + no_flow_len + 4..]);
    head
}

#[derive(Clone, Copy, Debug)]
struct Dir {
    first_id: u64,
    data_at: u64,
    pos_at: u64,
    /// Offset of the block in the index, its compressed and raw lengths.
    at: usize,
    zlen: usize,
    raw: usize,
    /// CRC-32 of its compressed bytes and of its flows' positions.
    crc: u32,
    pos_crc: u32,
}

/// Posting lists in compressed-sparse-row form: the blocks of address code `c` are
/// `blocks[starts[c]..starts[c + 1]]`, those of port code `c` follow at `starts[addresses + c]`.
#[derive(Debug)]
struct Postings {
    ports: Vec<u16>,
    starts: Vec<usize>,
    blocks: Vec<u32>,
}

/// What stage 1 tells stage 2 about its segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    /// The segment's format version.
    pub version: u16,
    /// Whether its link type's header fields are not read (stage 1's `unknown_fields` from format 4; in earlier
    /// formats also set by packets cut short): the packets of no flow may then match anything.
    pub unknown_fields: bool,
    pub slots: usize,
    pub t_min: u64,
    pub data_bytes: u64,
    pub packets: u64,
    pub positions_len: usize,
    /// Bits of a packet's interface in its position, and the interfaces.
    pub iface_bits: u32,
    pub ifaces: usize,
}

/// A segment's second stage: its flow table and sorted arrays, read when stage 1 lets it through. Blocks of the
/// flow table are decoded when a lookup needs them.
#[derive(Debug)]
pub struct Stage2 {
    path: PathBuf,
    at: u64,
    frame: Frame,
    bytes: Bytes,
    positions: Range<usize>,
    addrs: Vec<[u8; 17]>,
    n_ports: usize,
    post_z: (usize, usize, usize, u32),
    postings: OnceLock<Postings>,
    dir: Vec<Dir>,
    /// Flow entries per block.
    block_flows: usize,
    /// What the packets of no flow hold.
    no_flow: NoFlowIndex,
    /// In a long-lived store: the blocks decoded so far, kept while the store's budget allows.
    kept: Option<(Arc<Keep>, Vec<OnceLock<KeptBlock>>)>,
    /// In a long-lived store: the groups of packets of no flow by value, made when first needed.
    group_index: OnceLock<GroupIndex>,
}

/// A block of the flow table kept decoded: its entries, and each entry's endpoint addresses as (address key,
/// index of the entry) sorted, so that a lookup by address reads only the entries that hold it (a block holds
/// 1024 flows, and a busy host's posting list names most blocks).
#[derive(Debug)]
struct KeptBlock {
    entries: Vec<FlowEntry>,
    by_addr: Vec<([u8; 17], u16)>,
}

impl KeptBlock {
    fn of(entries: Vec<FlowEntry>) -> KeptBlock {
        let mut by_addr = Vec::with_capacity(2 * entries.len());
        for (i, e) in entries.iter().enumerate().filter(|(_, e)| !e.is_no_flow()) {
            let (lo, hi) = (key_of(e.flow.key.lo_addr), key_of(e.flow.key.hi_addr));
            by_addr.push((lo, i as u16));
            if hi != lo {
                by_addr.push((hi, i as u16));
            }
        }
        by_addr.sort_unstable();
        KeptBlock { entries, by_addr }
    }

    fn heap_bytes(&self) -> u64 {
        (self.entries.capacity() * size_of::<FlowEntry>() + self.by_addr.capacity() * size_of::<([u8; 17], u16)>())
            as u64
    }

    /// The indexes, in order, of the entries with an endpoint address in one of `ranges` (of address keys).
    fn with_addrs(&self, ranges: &[([u8; 17], [u8; 17])]) -> Vec<usize> {
        let mut out = Vec::new();
        for (lo, hi) in ranges {
            let (lo, hi) = (key_ord(lo), key_ord(hi));
            let from = self.by_addr.partition_point(|(k, _)| key_ord(k) < lo);
            out.extend(self.by_addr[from..].iter().take_while(|(k, _)| key_ord(k) <= hi).map(|&(_, i)| usize::from(i)));
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// An address key as a pair of numbers that orders as its bytes do (comparing the bytes is a call to `memcmp`,
/// a tenth of a hot store's needle when it was).
#[inline]
fn key_ord(k: &[u8; 17]) -> (u8, u128) {
    let mut b = [0u8; 16];
    b.copy_from_slice(&k[1..]);
    (k[0], u128::from_be_bytes(b))
}

/// Ranges of address keys one of which holds an endpoint of every flow that may satisfy `need` (as
/// [`FlowEntry::may_match`] decides); `None` when `need` does not bound the addresses.
fn addr_ranges(need: &Need) -> Option<Vec<([u8; 17], [u8; 17])>> {
    match need {
        Need::Pred(p) => addr_range(p).map(|r| vec![r]),
        Need::Or(v) => v.iter().map(addr_ranges).collect::<Option<Vec<_>>>().map(|r| r.concat()),
        Need::And(v) => v.iter().filter_map(addr_ranges).min_by_key(Vec::len),
        _ => None,
    }
}

/// `ranges` sorted, those that overlap made one (a host's four conditions, as source and destination
/// of IP and ARP, are one range).
fn merged(mut ranges: Vec<([u8; 17], [u8; 17])>) -> Vec<([u8; 17], [u8; 17])> {
    ranges.sort_unstable_by_key(|r| key_ord(&r.0));
    let mut out: Vec<([u8; 17], [u8; 17])> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if key_ord(&r.0) <= key_ord(&last.1) => {
                if key_ord(&r.1) > key_ord(&last.1) {
                    last.1 = r.1;
                }
            }
            _ => out.push(r),
        }
    }
    out
}

/// The address keys from and to which `p` holds, when it is a range (an exact value, a prefix) of addresses.
fn addr_range(p: &Pred) -> Option<([u8; 17], [u8; 17])> {
    if p.mask != u128::MAX || p.lo > p.hi {
        return None;
    }
    match p.field {
        Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa if p.hi <= u128::from(u32::MAX) => {
            Some((v4_key(p.lo), v4_key(p.hi)))
        }
        Field::Ip6Src | Field::Ip6Dst => Some((v6_key(p.lo), v6_key(p.hi))),
        _ => None,
    }
}

/// What a long-lived store keeps decoded of its segments' second stages: as much as a budget of heap bytes
/// allows, first come first kept (an answer needs no more than it did; a part the budget refuses is decoded for
/// each answer, as in a store opened once).
#[derive(Debug)]
pub(crate) struct Keep {
    budget: u64,
    used: AtomicU64,
}

impl Keep {
    pub(crate) fn new(budget: u64) -> Keep {
        Keep { budget, used: AtomicU64::new(0) }
    }

    /// Takes `bytes` of the budget if they fit.
    pub(crate) fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| u.checked_add(bytes).filter(|&n| n <= self.budget))
            .is_ok()
    }

    /// Puts `value`, for which `bytes` were [taken](Self::take), into `cell`; returns what `cell` holds, which
    /// another thread may have put first (the bytes are then given back).
    pub(crate) fn put<'c, T>(&self, cell: &'c OnceLock<T>, value: T, bytes: u64) -> &'c T {
        let mut ours = false;
        let kept = cell.get_or_init(|| {
            ours = true;
            value
        });
        if !ours {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
        kept
    }

    /// The bytes taken.
    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// Where stage 2's bytes are: the mapped index file (or, in tests, memory).
pub(crate) enum Bytes {
    Mapped(MappedFile),
    #[cfg(test)]
    Owned(Vec<u8>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.bytes(),
            #[cfg(test)]
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.get().len())
    }
}

impl Stage2 {
    /// Parses stage 2 from its checked bytes (`body` and `positions` of `bytes`): the fixed part, the address
    /// dictionary and the block directory (posting lists and blocks are decoded when used). `path` and `at`
    /// name it in errors.
    pub(crate) fn parse(
        path: &Path,
        at: u64,
        frame: Frame,
        bytes: Bytes,
        body: Range<usize>,
        positions: Range<usize>,
    ) -> Result<Stage2, StoreError> {
        let corrupt = |why: String| StoreError::Corrupt { path: path.to_path_buf(), offset: at, why };
        let all = bytes.get();
        let (base, body_bytes) = (body.start, &all[body.clone()]);
        let mut r = Rd { b: body_bytes, at: 0 };
        let mut fixed = || r.u32().map(|v| v as usize).map_err(corrupt);
        let (n4, n6, n_ports, n_blocks) = (fixed()?, fixed()?, fixed()?, fixed()?);
        let (dict_z, dict_raw, post_z, post_raw) = (fixed()?, fixed()?, fixed()?, fixed()?);
        let post_crc = fixed()? as u32;
        let no_flow_len = if frame.version >= 4 { fixed()? } else { 0 };
        let block_flows = if frame.version >= 4 { BLOCK_FLOWS } else { BLOCK_FLOWS_V3 };
        let flows = frame.slots - 1;
        if n_blocks != frame.slots.div_ceil(block_flows) {
            return Err(corrupt(format!("{n_blocks} blocks for {} flow entries", frame.slots)));
        }
        if n4.saturating_add(n6) > 2 * flows || n_ports > (2 * flows).min(65536) {
            return Err(corrupt(format!("{n4} + {n6} addresses and {n_ports} ports for {flows} flows")));
        }
        if dict_raw > n4 * 5 + n6 * 16 || post_raw > n_ports * 3 + (n4 + n6 + n_ports) * 5 + 4 * flows * 5 {
            return Err(corrupt("a section longer than its entries allow".into()));
        }
        // The head (fixed part, dictionary, directory) is checked as a whole; the posting lists and each block
        // (with its flows' positions) are checked when decoded, so a lookup reads only what it uses.
        let dict_bytes = r.take(dict_z).map_err(corrupt)?;
        let dir_bytes = r.take(n_blocks.saturating_mul(DIR_ENTRY)).map_err(corrupt)?;
        let no_flow_bytes = r.take(no_flow_len).map_err(corrupt)?;
        let head_end = r.at;
        if crc32fast::hash(&body_bytes[..head_end]) != r.u32().map_err(corrupt)? {
            return Err(corrupt("stage 2 checksum mismatch".into()));
        }
        let post_at = r.at;
        r.take(post_z).map_err(corrupt)?;
        let dict = decompress(dict_bytes, dict_raw, "address dictionary").map_err(corrupt)?;
        let mut addrs = Vec::with_capacity(n4 + n6);
        let mut d = Rd { b: &dict, at: 0 };
        let mut v = 0u64;
        for i in 0..n4 {
            let delta = get_varint(&dict, &mut d.at).ok_or_else(|| corrupt("address dictionary truncated".into()))?;
            v = v
                .checked_add(delta)
                .filter(|&v| v <= u64::from(u32::MAX) && (i == 0 || delta > 0))
                .ok_or_else(|| corrupt("the IPv4 dictionary is not strictly increasing 32-bit addresses".into()))?;
            addrs.push(v4_key(u128::from(v)));
        }
        for _ in 0..n6 {
            let b = d.take(16).map_err(corrupt)?;
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            addrs.push(v6_key(u128::from_be_bytes(a)));
        }
        if d.at != dict.len() || !addrs.is_sorted() {
            return Err(corrupt("the address dictionary is not sorted or has bytes after it".into()));
        }
        let mut dir = Vec::with_capacity(n_blocks);
        let mut at_block = r.at;
        for e in dir_bytes.chunks_exact(DIR_ENTRY) {
            let mut e = Rd { b: e, at: 0 };
            let mut u64s = || e.u64().map_err(corrupt);
            let (first_id, data_at, pos_at) = (u64s()?, u64s()?, u64s()?);
            let mut u32s = || e.u32().map_err(corrupt);
            let (zlen, raw, crc, pos_crc) = (u32s()? as usize, u32s()? as usize, u32s()?, u32s()?);
            if raw > block_flows * COLUMNS * 10 {
                return Err(corrupt(format!("a block of {raw} bytes")));
            }
            dir.push(Dir { first_id, data_at, pos_at, at: base + at_block, zlen, raw, crc, pos_crc });
            at_block = at_block.checked_add(zlen).ok_or_else(|| corrupt("block lengths overflow".into()))?;
        }
        if at_block != body_bytes.len() {
            return Err(corrupt(format!("the blocks end at {at_block} of {} bytes", body_bytes.len())));
        }
        let ordered = dir
            .windows(2)
            .all(|w| w[0].data_at <= w[1].data_at && w[0].pos_at <= w[1].pos_at && (w[0].first_id < w[1].first_id));
        let last_pos = dir.last().map_or(0, |d| d.pos_at);
        if !ordered
            || dir.first().is_some_and(|d| d.data_at != 24 || d.pos_at != 0)
            || last_pos > positions.len() as u64
        {
            return Err(corrupt("the block directory is not in order".into()));
        }
        let post_z = (base + post_at, post_z, post_raw, post_crc);
        let no_flow = match frame.version {
            8.. => NoFlowGroup::decode(no_flow_bytes).map(NoFlowIndex::Groups),
            4.. => NoFlow::decode(no_flow_bytes).map(NoFlowIndex::One),
            _ => Ok(NoFlowIndex::Unknown),
        }
        .map_err(|why| corrupt(format!("packets of no flow: {why}")))?;
        Ok(Stage2 {
            path: path.to_path_buf(),
            at,
            frame,
            bytes,
            positions,
            addrs,
            n_ports,
            post_z,
            postings: OnceLock::new(),
            dir,
            block_flows,
            no_flow,
            kept: None,
            group_index: OnceLock::new(),
        })
    }

    fn corrupt(&self, why: String) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), offset: self.at, why }
    }

    /// Flow entries, slot 0 (the packets of no flow) included.
    pub fn len(&self) -> usize {
        self.frame.slots
    }

    /// Whether the segment has no entries at all (never: slot 0 is always there).
    pub fn is_empty(&self) -> bool {
        self.frame.slots == 0
    }

    fn postings(&self) -> Result<&Postings, StoreError> {
        if let Some(p) = self.postings.get() {
            return Ok(p);
        }
        let (at, zlen, raw, crc) = self.post_z;
        if crc32fast::hash(&self.bytes.get()[at..at + zlen]) != crc {
            return Err(self.corrupt("posting lists checksum mismatch".into()));
        }
        let b = decompress(&self.bytes.get()[at..at + zlen], raw, "posting lists").map_err(|w| self.corrupt(w))?;
        let bad = || self.corrupt("posting lists truncated or out of range".into());
        let mut at = 0usize;
        let mut ports = Vec::with_capacity(self.n_ports);
        let mut v = 0u64;
        for i in 0..self.n_ports {
            let d = get_varint(&b, &mut at).ok_or_else(bad)?;
            v = v.checked_add(d).filter(|&v| v <= 0xffff && (i == 0 || d > 0)).ok_or_else(bad)?;
            ports.push(v as u16);
        }
        let lists = self.addrs.len() + self.n_ports;
        let mut starts = Vec::with_capacity(lists + 1);
        starts.push(0usize);
        for _ in 0..lists {
            let n = get_varint(&b, &mut at).filter(|&n| n <= self.dir.len() as u64).ok_or_else(bad)?;
            starts.push(starts[starts.len() - 1] + n as usize);
        }
        let mut blocks = Vec::with_capacity(starts[lists].min(b.len()));
        for w in starts.windows(2) {
            let mut v = 0u64;
            for i in 0..w[1] - w[0] {
                let d = get_varint(&b, &mut at).ok_or_else(bad)?;
                v = v.checked_add(d).filter(|&v| v < self.dir.len() as u64 && (i == 0 || d > 0)).ok_or_else(bad)?;
                blocks.push(v as u32);
            }
        }
        if at != b.len() {
            return Err(self.corrupt("bytes after the posting lists".into()));
        }
        let p = Postings { ports, starts, blocks };
        Ok(self.postings.get_or_init(|| p))
    }

    /// Heap bytes this stage 2 holds once its posting lists are decoded, blocks aside (an upper bound: a posting
    /// list's varints take a byte or more each, decoded at most eight).
    pub(crate) fn head_bytes(&self) -> u64 {
        let addrs = self.addrs.len() * size_of::<[u8; 17]>();
        let dir = self.dir.len() * size_of::<Dir>();
        (addrs + dir + self.post_z.2 * 8) as u64
    }

    /// Keeps each block decoded from now on, as far as `keep`'s budget allows.
    pub(crate) fn keep_blocks(&mut self, keep: Arc<Keep>) {
        self.kept = Some((keep, (0..self.dir.len()).map(|_| OnceLock::new()).collect()));
    }

    /// Block `b` of the flow table: kept from an earlier lookup, or decoded (and kept if it may be).
    fn block(&self, b: usize) -> Result<Cow<'_, [FlowEntry]>, StoreError> {
        Ok(match self.kept_block(b)? {
            Ok(k) => Cow::Borrowed(&k.entries),
            Err(v) => Cow::Owned(v),
        })
    }

    /// Block `b` kept (from an earlier lookup, or decoded now and kept), or decoded only (`Err`: the store does
    /// not keep blocks, or its budget is spent).
    fn kept_block(&self, b: usize) -> Result<Result<&KeptBlock, Vec<FlowEntry>>, StoreError> {
        let Some((keep, blocks)) = &self.kept else { return self.decode_block(b).map(Err) };
        if let Some(k) = blocks[b].get() {
            return Ok(Ok(k));
        }
        let k = KeptBlock::of(self.decode_block(b)?);
        let bytes = k.heap_bytes();
        if !keep.take(bytes) {
            return Ok(Err(k.entries));
        }
        Ok(Ok(keep.put(&blocks[b], k, bytes)))
    }

    /// Decodes block `b` of the flow table, checking its checksums and those of its flows' positions.
    fn decode_block(&self, b: usize) -> Result<Vec<FlowEntry>, StoreError> {
        let d = self.dir[b];
        let bad = |why: &str| self.corrupt(format!("flow table block {b}: {why}"));
        if crc32fast::hash(&self.bytes.get()[d.at..d.at + d.zlen]) != d.crc {
            return Err(bad("checksum mismatch"));
        }
        let pos_end = self.dir.get(b + 1).map_or(self.frame.positions_len as u64, |n| n.pos_at);
        let pos = &self.bytes.get()[self.positions.clone()];
        if crc32fast::hash(&pos[d.pos_at as usize..pos_end as usize]) != d.pos_crc {
            return Err(bad("positions checksum mismatch"));
        }
        let raw = decompress(&self.bytes.get()[d.at..d.at + d.zlen], d.raw, "flow table block")
            .map_err(|w| self.corrupt(w))?;
        let first_slot = b * self.block_flows;
        let n = self.block_flows.min(self.frame.slots - first_slot);
        let mut cols = vec![[0u64; COLUMNS]; n];
        let mut at = 0usize;
        // Format 5: the block's time unit first.
        let unit = match self.frame.version {
            5.. => match get_varint(&raw, &mut at) {
                Some(u @ (1 | 1000)) => u,
                _ => return Err(bad("time unit")),
            },
            _ => 1,
        };
        for c in 0..COLUMNS {
            for r in cols.iter_mut() {
                r[c] = get_varint(&raw, &mut at).ok_or_else(|| bad("truncated"))?;
            }
        }
        if at != raw.len() {
            return Err(bad("bytes after its columns"));
        }
        let (mut data_at, mut pos_at) = (d.data_at, d.pos_at);
        let (mut prev_id, mut prev_first) = (None::<u64>, self.frame.t_min - self.frame.t_min % unit);
        let mut out = Vec::with_capacity(n);
        for (i, c) in cols.iter().enumerate() {
            let slot = first_slot + i;
            let small = |v: u64, max: u64, what: &str| if v <= max { Ok(v) } else { Err(bad(what)) };
            let mut flow = no_flow();
            if slot != 0 {
                let id = match prev_id {
                    None => d.first_id,
                    Some(p) => p.checked_add(c[0]).and_then(|v| v.checked_add(1)).ok_or_else(|| bad("flow id"))?,
                };
                prev_id = Some(id);
                let addr = |code: u64| self.addrs.get(code as usize).map(ip_of).ok_or_else(|| bad("address code"));
                flow.id = id;
                flow.key = FlowKey {
                    lo_addr: addr(c[1])?,
                    hi_addr: addr(c[2])?,
                    lo_port: small(c[3], 0xffff, "port")? as u16,
                    hi_port: small(c[4], 0xffff, "port")? as u16,
                    proto: IpProto(small(c[5], 0xff, "protocol")? as u8),
                    vlan: small(c[6], 0xffff, "VLAN id")? as u16,
                };
                flow.orig_is_lo = c[7] & 1 == 1;
            }
            // Format 6: the state in bits 1-3, bit 4 whether the flow's IP protocol as filters read it may differ
            // from its key's; before, bits 1.. the state, and an IPv6 flow may (its extension headers were not
            // looked at).
            let state = if self.frame.version >= 6 { c[7] >> 1 & 7 } else { c[7] >> 1 };
            flow.state = ConnState::from_code(small(state, 0xff, "state")? as u8).ok_or_else(|| bad("state"))?;
            if self.frame.version >= 6 && c[7] >> 5 != 0 {
                return Err(bad("flags"));
            }
            let proto_beyond_key =
                if self.frame.version >= 6 { c[7] >> 4 & 1 == 1 } else { matches!(flow.key.lo_addr, IpAddr::V6(_)) };
            if slot == 0 && self.frame.version >= 5 && c[12] == 0 && c[13] == 0 {
                // The empty entry of no flow: its sentinel times, not stored.
                (flow.first_ns, flow.last_ns) = (u64::MAX, 0);
            } else {
                flow.first_ns = prev_first.wrapping_add(unzigzag(c[10]).wrapping_mul(unit));
                prev_first = flow.first_ns;
                flow.last_ns = flow.first_ns.wrapping_add(c[11].wrapping_mul(unit));
            }
            let h = usual_headers(&flow.key, slot == 0);
            let side = |packets: u64, payload: u64, hdr: u64, flags: u64| -> Result<Side, StoreError> {
                let flags = small(flags, 0xff, "TCP flags")? as u8;
                let bytes = payload.wrapping_add(unzigzag(hdr)).wrapping_add(h.wrapping_mul(packets));
                Ok(Side { packets, bytes, payload, flags })
            };
            flow.orig = side(c[12], c[14], c[16], c[8])?;
            flow.resp = side(c[13], c[15], c[17], c[9])?;
            let packets =
                c[12].checked_add(c[13]).filter(|&p| p <= self.frame.packets).ok_or_else(|| bad("packets"))?;
            let stored = packets.wrapping_mul(16).wrapping_add(flow.orig.bytes).wrapping_add(flow.resp.bytes);
            let data_len = stored.wrapping_sub(unzigzag(c[18]));
            let positions_len = packets.checked_add(c[19]).ok_or_else(|| bad("positions length"))?;
            out.push(FlowEntry {
                slot: slot as u32,
                flow,
                data_offset: data_at,
                data_len,
                packets: packets as u32,
                positions_at: pos_at,
                positions_len,
                proto_beyond_key,
            });
            data_at = data_at.checked_add(data_len).ok_or_else(|| bad("data lengths overflow"))?;
            pos_at = pos_at.checked_add(positions_len).ok_or_else(|| bad("positions overflow"))?;
        }
        let (data_end, pos_end, next_id) = match self.dir.get(b + 1) {
            Some(next) => (next.data_at, next.pos_at, Some(next.first_id)),
            None => (self.frame.data_bytes, self.frame.positions_len as u64, None),
        };
        if data_at != data_end || pos_at != pos_end {
            return Err(bad("its flows do not end where the next block's begin"));
        }
        if let (Some(last), Some(next)) = (prev_id, next_id)
            && last >= next
        {
            return Err(bad("flow ids not increasing"));
        }
        if b == 0 && n > 1 && d.first_id == u64::MAX {
            return Err(bad("flow id"));
        }
        Ok(out)
    }

    /// Checks every part (posting lists, every block and its positions) and returns every entry, those of no flow
    /// first.
    pub fn check_all(&self) -> Result<Vec<FlowEntry>, StoreError> {
        self.postings()?;
        let entries = self.entries()?;
        for e in &entries {
            self.positions_and_ifaces(e)?;
        }
        Ok(entries)
    }

    /// Every entry in data order: the packets of no flow first (one entry per group from format 8, none when
    /// there are none; before, one entry, slot 0), then the flows.
    pub fn entries(&self) -> Result<Vec<FlowEntry>, StoreError> {
        let mut out = Vec::with_capacity(self.frame.slots);
        for b in 0..self.dir.len() {
            for &e in self.block(b)?.iter() {
                if e.is_no_flow() {
                    self.no_flow_parts(e, None, &mut out)?;
                } else {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }

    /// The entries that may hold a packet satisfying `need`: addresses and ports found by binary search in the
    /// dictionaries, their posting lists merged into the blocks that may hold them, only those blocks decoded and
    /// each of their entries checked against the whole condition. The packets of no flow are candidates where
    /// their summary allows: by group from format 8, all of them before (always, before format 4).
    pub fn candidates(&self, need: &Need) -> Result<Vec<FlowEntry>, StoreError> {
        let groups = self.groups_allowed(need);
        let no_flow = match &groups {
            Some(g) => g.contains(&true),
            None => self.no_flow_may_match(need),
        };
        let blocks = match self.lookup(need)? {
            Some(mut v) => {
                if no_flow {
                    v.push(0);
                }
                v.sort_unstable();
                v.dedup();
                v
            }
            None => (0..self.dir.len() as u32).collect(),
        };
        let mut out = Vec::new();
        let ranges = if self.kept.is_some() { addr_ranges(need).map(merged) } else { None };
        let allowed = (no_flow, groups.as_deref());
        for b in blocks {
            match (self.kept_block(b as usize)?, &ranges) {
                // A kept block: only its entries of the addresses asked (and the packets of no flow).
                (Ok(k), Some(r)) => {
                    if let Some(e) = k.entries.first().filter(|e| e.is_no_flow()) {
                        self.candidate(e, need, allowed, &mut out)?;
                    }
                    for i in k.with_addrs(r) {
                        self.candidate(&k.entries[i], need, allowed, &mut out)?;
                    }
                }
                (Ok(k), None) => k.entries.iter().try_for_each(|e| self.candidate(e, need, allowed, &mut out))?,
                (Err(v), _) => v.iter().try_for_each(|e| self.candidate(e, need, allowed, &mut out))?,
            }
        }
        Ok(out)
    }

    /// Per group of packets of no flow (format 8 on), whether it may satisfy `need`; `None` before format 8.
    fn groups_allowed(&self, need: &Need) -> Option<Vec<bool>> {
        let NoFlowIndex::Groups(groups) = &self.no_flow else { return None };
        if self.frame.unknown_fields {
            return Some(vec![true; groups.len()]);
        }
        Some(groups_may_match(groups, self.group_index(groups), need))
    }

    /// The index of `groups` (this stage 2's) in a long-lived store, made when first needed if the store's budget
    /// takes it; `None` otherwise (each group is then tested).
    fn group_index(&self, groups: &[NoFlowGroup]) -> Option<&GroupIndex> {
        let (keep, _) = self.kept.as_ref()?;
        if let Some(ix) = self.group_index.get() {
            return Some(ix);
        }
        let bytes = GroupIndex::heap_bytes_of(groups);
        if !keep.take(bytes) {
            return None;
        }
        Some(keep.put(&self.group_index, GroupIndex::of(groups), bytes))
    }

    /// Puts `e` into `out` if it may hold a packet satisfying `need`: a flow by its key, the packets of no flow
    /// by group, as `no_flow` says (whether any may; and per group, when they are grouped).
    fn candidate(
        &self,
        e: &FlowEntry,
        need: &Need,
        no_flow: (bool, Option<&[bool]>),
        out: &mut Vec<FlowEntry>,
    ) -> Result<(), StoreError> {
        if e.is_no_flow() {
            if no_flow.0 {
                self.no_flow_parts(*e, no_flow.1, out)?;
            }
        } else if e.may_match(need) {
            out.push(*e);
        }
        Ok(())
    }

    /// Puts into `out` the entries of the packets of no flow (`slot0`, their one entry in the flow table) that
    /// `allowed` names per group (`None`: all): from format 8 one entry per group, each group's data and
    /// positions within `slot0`'s, whose sums must equal `slot0`'s.
    fn no_flow_parts(
        &self,
        slot0: FlowEntry,
        allowed: Option<&[bool]>,
        out: &mut Vec<FlowEntry>,
    ) -> Result<(), StoreError> {
        let NoFlowIndex::Groups(groups) = &self.no_flow else {
            out.push(slot0);
            return Ok(());
        };
        let (mut data_at, mut pos_at, mut packets) = (slot0.data_offset, slot0.positions_at, 0u64);
        for (i, g) in groups.iter().enumerate() {
            if allowed.is_none_or(|a| a.get(i).copied().unwrap_or(true)) {
                let mut flow = slot0.flow;
                flow.orig = Side { packets: g.packets, bytes: g.data_len - 16 * g.packets, payload: 0, flags: 0 };
                flow.resp = Side::default();
                out.push(FlowEntry {
                    flow,
                    data_offset: data_at,
                    data_len: g.data_len,
                    packets: g.packets as u32,
                    positions_at: pos_at,
                    positions_len: g.positions_len,
                    ..slot0
                });
            }
            data_at = data_at.saturating_add(g.data_len);
            pos_at = pos_at.saturating_add(g.positions_len);
            packets = packets.saturating_add(g.packets);
        }
        if (data_at - slot0.data_offset, pos_at - slot0.positions_at, packets)
            != (slot0.data_len, slot0.positions_len, u64::from(slot0.packets))
        {
            return Err(self.corrupt(format!(
                "the groups of packets of no flow hold {packets} packets in {} bytes and {} bytes of positions, \
                 their entry {} in {} and {}",
                data_at - slot0.data_offset,
                pos_at - slot0.positions_at,
                slot0.packets,
                slot0.data_len,
                slot0.positions_len
            )));
        }
        Ok(())
    }

    /// The segment's packets of no flow (in slot 0).
    pub fn no_flow_packets(&self) -> Result<u64, StoreError> {
        let first = self.block(0)?.first().copied().filter(FlowEntry::is_no_flow);
        first.map(|e| u64::from(e.packets)).ok_or_else(|| self.corrupt("no entry for the packets of no flow".into()))
    }

    /// Whether some packet of no flow of the segment may satisfy `need`.
    pub fn no_flow_may_match(&self, need: &Need) -> bool {
        self.frame.unknown_fields
            || match &self.no_flow {
                NoFlowIndex::Unknown => true,
                NoFlowIndex::One(n) => n.may_match(need),
                NoFlowIndex::Groups(_) if self.kept.is_some() => {
                    self.groups_allowed(need).is_some_and(|a| a.contains(&true))
                }
                NoFlowIndex::Groups(g) => g.iter().any(|g| g.summary.may_match(need)),
            }
    }

    /// The blocks an address or port condition allows (exact values, CIDR prefixes and ranges: the address
    /// dictionary sorts by family then value), unsorted and possibly repeated; `None`: the dictionaries cannot
    /// narrow it.
    fn lookup(&self, need: &Need) -> Result<Option<Vec<u32>>, StoreError> {
        Ok(match need {
            Need::Pred(p) if p.mask == u128::MAX && p.lo <= p.hi => {
                if let Some((lo, hi)) = addr_range(p) {
                    let (lo, hi) = (key_ord(&lo), key_ord(&hi));
                    let from = self.addrs.partition_point(|e| key_ord(e) < lo);
                    let to = self.addrs.partition_point(|e| key_ord(e) <= hi).max(from);
                    let post = self.postings()?;
                    return Ok(Some(post.blocks[post.starts[from]..post.starts[to]].to_vec()));
                }
                match p.field {
                    Field::SrcPort | Field::DstPort if p.lo <= 0xffff => {
                        let post = self.postings()?;
                        let (lo, hi) = (p.lo as u16, p.hi.min(0xffff) as u16);
                        let from = post.ports.partition_point(|&v| v < lo);
                        let to = post.ports.partition_point(|&v| v <= hi).max(from);
                        let n = self.addrs.len();
                        Some(post.blocks[post.starts[n + from]..post.starts[n + to]].to_vec())
                    }
                    _ => None,
                }
            }
            Need::And(v) => {
                let mut best: Option<Vec<u32>> = None;
                for n in v {
                    if let Some(mut s) = self.lookup(n)? {
                        s.sort_unstable();
                        s.dedup();
                        best = Some(match best {
                            None => s,
                            Some(b) => b.into_iter().filter(|x| s.binary_search(x).is_ok()).collect(),
                        });
                    }
                }
                best
            }
            Need::Or(v) => {
                let mut all = Vec::new();
                for n in v {
                    let Some(s) = self.lookup(n)? else { return Ok(None) };
                    all.extend(s);
                }
                Some(all)
            }
            _ => None,
        })
    }

    /// The entry of flow `id`, if the segment holds part of it: binary search in the block directory (slots are
    /// in id order), then one block decoded.
    pub fn find(&self, id: u64) -> Result<Option<FlowEntry>, StoreError> {
        let b = self.dir.partition_point(|d| d.first_id <= id);
        if b == 0 || id == u64::MAX {
            return Ok(None);
        }
        Ok(self.block(b - 1)?.iter().find(|e| !e.is_no_flow() && e.flow.id == id).copied())
    }

    /// The original-order positions of entry `e`'s packets, in its data order.
    pub fn positions(&self, e: &FlowEntry) -> Result<Vec<u64>, StoreError> {
        Ok(self.positions_and_ifaces(e)?.0)
    }

    /// [`positions`](Self::positions), and each packet's interface (an index into the segment's; empty when the
    /// segment has one).
    pub fn positions_and_ifaces(&self, e: &FlowEntry) -> Result<(Vec<u64>, Vec<u16>), StoreError> {
        let bad = |why: &str| self.corrupt(format!("positions of flow entry {}: {why}", e.slot));
        let bits = self.frame.iface_bits;
        let from = usize::try_from(e.positions_at).map_err(|_| bad("offset"))?;
        let to = usize::try_from(e.positions_at.saturating_add(e.positions_len)).map_err(|_| bad("offset"))?;
        let b = self.bytes.get()[self.positions.clone()].get(from..to).ok_or_else(|| bad("past the end"))?;
        let mut at = 0usize;
        let mut out = Vec::with_capacity((e.packets as usize).min(b.len()));
        let mut ifaces = Vec::with_capacity(if bits == 0 { 0 } else { out.capacity() });
        let mut last = 0u64;
        for i in 0..e.packets {
            let mut v = get_varint(b, &mut at).ok_or_else(|| bad("truncated"))?;
            if bits > 0 {
                let iface = (v & ((1 << bits) - 1)) as usize;
                if iface >= self.frame.ifaces {
                    return Err(bad("an interface out of range"));
                }
                ifaces.push(iface as u16);
                v >>= bits;
            }
            last = if i == 0 { v } else { last.checked_add(v).ok_or_else(|| bad("overflow"))? };
            out.push(last);
        }
        if at != b.len() {
            return Err(bad("more bytes than packets"));
        }
        Ok((out, ifaces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A flow from random parts: addresses from a small pool (so they repeat), any counters.
    fn flow_of(id: u64, parts: (u8, u8, u16, u16, u8, u64, u64, [u64; 6], u8), t0: u64) -> Flow {
        let (a, b, pa, pb, proto, first, dur, c, flags) = parts;
        let addr = |x: u8| -> IpAddr {
            if x % 5 == 4 {
                IpAddr::from([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, x])
            } else {
                IpAddr::from([10, 0, x / 16, x])
            }
        };
        let (lo, hi) = (addr(a), addr(b));
        let (lo, hi) = if lo.is_ipv4() == hi.is_ipv4() { (lo, hi) } else { (lo, lo) };
        let state = ConnState::from_code(flags % 8).unwrap_or(ConnState::Oth);
        Flow {
            id,
            key: FlowKey {
                lo_addr: lo,
                hi_addr: hi,
                lo_port: pa,
                hi_port: pb,
                proto: IpProto(proto),
                vlan: u16::from(flags) * 3,
            },
            orig_is_lo: flags & 1 == 1,
            first_ns: t0.wrapping_add(first),
            last_ns: t0.wrapping_add(first).wrapping_add(dur),
            orig: Side {
                packets: c[0] % 1000 + 1,
                bytes: c[1] % 1_000_000 + c[2] % 1000,
                payload: c[1] % 1_000_000,
                flags,
            },
            resp: Side {
                packets: c[3] % 1000,
                bytes: c[4] % 1_000_000 + c[5] % 1000,
                payload: c[4] % 1_000_000,
                flags: !flags,
            },
            state,
        }
    }

    proptest! {
        #[test]
        fn stage2_round_trips_and_finds_what_a_scan_finds(
            parts in proptest::collection::vec(any::<(u8, u8, u16, u16, u8, u64, u64, [u64; 6], u8)>(), 0..700),
            gaps in proptest::collection::vec(1u64..5000, 700),
            cut in proptest::collection::vec(0u64..3000, 701),
            t0 in any::<u64>(),
            q in any::<(u8, u8, u16, u16, u64)>(),
            nf in any::<(u32, Vec<u8>, Vec<u16>, u8)>(),
            micro in any::<bool>(),
        ) {
            // Whole microseconds (a trace of microsecond precision) in half the cases: stored in that unit.
            // (Real timestamps are far below 2^63 and never wrap.)
            let t0 = if micro { (t0 >> 2) / 1000 * 1000 } else { t0 };
            let mut slot0 = no_flow();
            slot0.orig.packets = cut[0] % 3;
            slot0.orig.bytes = 60 * slot0.orig.packets;
            if slot0.orig.packets > 0 {
                slot0.first_ns = t0;
                slot0.last_ns = t0.wrapping_add(if micro { 9000 } else { 9 });
            }
            let mut flows = vec![slot0];
            let mut id = t0 % 1_000_000;
            for (p, g) in parts.iter().zip(&gaps) {
                id += g;
                let mut f = flow_of(id, *p, t0);
                if micro {
                    let first = t0 + (p.5 >> 24) / 1000 * 1000;
                    (f.first_ns, f.last_ns) = (first, first + (p.6 >> 24) / 1000 * 1000);
                }
                flows.push(f);
            }
            let ins: Vec<SlotIn<'_>> = flows
                .iter()
                .zip(&cut)
                .map(|(f, c)| {
                    let packets = f.orig.packets + f.resp.packets;
                    let full = 16 * packets + f.orig.bytes + f.resp.bytes;
                    SlotIn {
                        flow: f,
                        proto_beyond_key: c % 5 == 0,
                        data_len: full - c.min(&(f.orig.bytes + f.resp.bytes)),
                        positions_len: packets + c % 3,
                    }
                })
                .collect();
            // The endpoints equal a sort, a dedup and binary searches.
            let ends = Endpoints::of(&ins);
            let key = |a: IpAddr| match a {
                IpAddr::V4(v) => v4_key(u128::from(u32::from(v))),
                IpAddr::V6(v) => v6_key(u128::from(v)),
            };
            let mut addrs: Vec<[u8; 17]> = flows[1..].iter().flat_map(|f| [key(f.key.lo_addr), key(f.key.hi_addr)]).collect();
            addrs.sort_unstable();
            addrs.dedup();
            let mut ports: Vec<u16> = flows[1..].iter().flat_map(|f| [f.key.lo_port, f.key.hi_port]).collect();
            ports.sort_unstable();
            ports.dedup();
            prop_assert_eq!(&ends.addrs, &addrs);
            prop_assert_eq!(ends.n4, addrs.iter().filter(|a| a[0] == 4).count());
            prop_assert_eq!(&ends.ports, &ports);
            prop_assert_eq!(ends.codes[0], [0; 4]);
            for (f, c) in flows.iter().zip(&ends.codes).skip(1) {
                let code = |a| addrs.binary_search(&key(a)).unwrap() as u64;
                let pcode = |p| ports.binary_search(&p).unwrap() as u64;
                prop_assert_eq!(*c, [code(f.key.lo_addr), code(f.key.hi_addr), pcode(f.key.lo_port), pcode(f.key.hi_port)]);
            }
            // A summary of packets of no flow: addresses near the queries', ports, protocols, some fields cut.
            let v4n = |x: u8| u32::from_be_bytes([10, 0, x / 16, x]);
            let mut sets = NoFlowSets { cut: nf.0 & (field_bit(Field::Ip4Src) | field_bit(Field::SrcPort) | field_bit(Field::Ip6Dst)), ..NoFlowSets::default() };
            sets.v4.extend(nf.1.iter().map(|&x| v4n(x)));
            sets.ports.extend(nf.2.iter().copied());
            sets.protos.insert(nf.3);
            sets.links.insert(0x0806);
            sets.v6.insert((0x2001_0db8 << 96) | u128::from(nf.3));
            // The packets of no flow in as many groups as packets, up to 2: the second holds the addresses of
            // the first half of `nf.1`, the first the rest.
            let mut sets2 = NoFlowSets::default();
            if slot0.orig.packets == 2 {
                for &x in &nf.1[..nf.1.len() / 2] {
                    sets.v4.remove(&v4n(x));
                    sets2.v4.insert(v4n(x));
                }
                sets2.links.insert(0x0806);
            }
            let summaries = [NoFlow::of(&sets), NoFlow::of(&sets2)];
            let (dl, pl) = (ins[0].data_len, ins[0].positions_len);
            let groups: Vec<NoFlowGroup> = match slot0.orig.packets {
                0 => Vec::new(),
                1 => vec![NoFlowGroup { packets: 1, data_len: dl, positions_len: pl, summary: summaries[0].clone() }],
                _ => {
                    let d1 = 16 + (dl - 32) / 2;
                    vec![
                        NoFlowGroup { packets: 1, data_len: d1, positions_len: 1, summary: summaries[0].clone() },
                        NoFlowGroup { packets: 1, data_len: dl - d1, positions_len: pl - 1, summary: summaries[1].clone() },
                    ]
                }
            };
            let zeros = vec![0u8; ins.iter().map(|s| s.positions_len).sum::<u64>() as usize];
            let body = encode(&ins, &ends, &groups, t0, &zeros);
            let frame = Frame {
                version: crate::format::VERSION,
                unknown_fields: false,
                slots: ins.len(),
                t_min: t0,
                data_bytes: 24 + ins.iter().map(|s| s.data_len).sum::<u64>(),
                packets: flows.iter().map(|f| f.orig.packets + f.resp.packets).sum(),
                positions_len: ins.iter().map(|s| s.positions_len).sum::<u64>() as usize,
                iface_bits: 0,
                ifaces: 1,
            };
            let n = body.len();
            let mut bytes = body;
            bytes.resize(n + frame.positions_len, 0);
            let parse = |bytes: Vec<u8>| Stage2::parse(Path::new("x"), 0, frame, Bytes::Owned(bytes), 0..n, n..n + frame.positions_len).unwrap();
            // Kept as a long-lived store keeps it: with room for everything, and with room for a block of a
            // few hundred flows (the flow table's one block is kept or refused as it is smaller or larger).
            let kept: Vec<(Stage2, Arc<Keep>)> = [u64::MAX, 50_000]
                .into_iter()
                .map(|budget| {
                    let keep = Arc::new(Keep::new(budget));
                    let mut s2 = parse(bytes.clone());
                    s2.keep_blocks(Arc::clone(&keep));
                    (s2, keep)
                })
                .collect();
            let s2 = parse(bytes);
            let all = s2.entries().unwrap();
            let ng = groups.len();
            prop_assert_eq!(all.len(), ins.len() - 1 + ng);
            prop_assert!(matches!(&s2.no_flow, NoFlowIndex::Groups(g) if *g == groups));
            prop_assert_eq!(s2.no_flow_packets().unwrap(), slot0.orig.packets);
            // The groups of no flow, one after the other, then the flows.
            let (mut at, mut pos) = (24, 0);
            for (e, g) in all.iter().zip(&groups) {
                prop_assert!(e.is_no_flow());
                prop_assert_eq!((e.data_offset, e.data_len, u64::from(e.packets)), (at, g.data_len, g.packets));
                prop_assert_eq!((e.positions_at, e.positions_len), (pos, g.positions_len));
                prop_assert_eq!((e.flow.first_ns, e.flow.last_ns), (slot0.first_ns, slot0.last_ns));
                (at, pos) = (at + g.data_len, pos + g.positions_len);
            }
            let mut at = 24 + ins[0].data_len;
            for (e, s) in all[ng..].iter().zip(&ins[1..]) {
                prop_assert_eq!(&e.flow, s.flow);
                prop_assert_eq!(s2.find(s.flow.id).unwrap().map(|f| f.slot), Some(e.slot));
                prop_assert!(s2.find(s.flow.id + 1).unwrap().is_none_or(|f| f.flow.id == s.flow.id + 1));
                prop_assert_eq!((e.data_offset, e.data_len), (at, s.data_len));
                prop_assert_eq!(e.proto_beyond_key, s.proto_beyond_key);
                at += s.data_len;
            }
            // A flow whose packets' IP protocol may differ from its key's matches a condition on another one.
            for e in all.iter().filter(|e| e.slot != 0) {
                let other = u128::from(e.flow.key.proto.0 ^ 1);
                prop_assert_eq!(e.may_match(&Need::Pred(Pred::range(Field::IpProto, other, other))), e.proto_beyond_key);
            }
            // Lookups equal a scan of the entries.
            let (a, b, pa, pb, bits) = q;
            let v4 = |x: u8| u128::from(u32::from_be_bytes([10, 0, x / 16, x]));
            let needs = [
                Need::Pred(Pred::range(Field::Ip4Src, v4(a), v4(a))),
                Need::Pred(Pred::range(Field::Ip4Dst, v4(a.min(b)), v4(a.max(b)))),
                Need::Pred(Pred::range(Field::Ip4Src, v4(a) & !0xff, v4(a) | 0xff)),
                Need::Pred(Pred::range(Field::Ip6Src, 0x2001_0db8 << 96, (0x2001_0db8 << 96) | u128::from(b))),
                Need::Pred(Pred::range(Field::DstPort, u128::from(pa.min(pb)), u128::from(pa.max(pb)))),
                Need::and(vec![
                    Need::Pred(Pred::range(Field::SrcPort, u128::from(pa), u128::from(pa))),
                    Need::Pred(Pred::range(Field::IpProto, u128::from(bits as u8), u128::from(bits as u8))),
                ]),
                Need::or(vec![
                    Need::Pred(Pred::range(Field::Ip4Src, v4(b), v4(b))),
                    Need::Pred(Pred::range(Field::SrcPort, u128::from(pb), u128::from(pb))),
                ]),
                Need::Pred(Pred::range(Field::Time, u128::from(t0), u128::from(t0.saturating_add(bits)))),
                Need::and(vec![
                    Need::Pred(Pred::range(Field::Time, u128::from(t0), u128::from(t0.saturating_add(bits) << 8))),
                    Need::or(vec![
                        Need::Pred(Pred::range(Field::Ip4Src, v4(a), v4(a))),
                        Need::Pred(Pred::range(Field::Ip4Dst, v4(a), v4(a))),
                    ]),
                ]),
                Need::or(vec![
                    Need::Pred(Pred::range(Field::Ip4Dst, v4(b), v4(b))),
                    Need::Pred(Pred::range(Field::Ip6Dst, 0x2001_0db8 << 96, (0x2001_0db8 << 96) | u128::from(a))),
                ]),
            ];
            // A summary's answer, by a linear scan of its values (a cut field passes the prefix and range tests
            // of longer fields).
            let naive = |need: &Need, summary: &NoFlow| need_may(need, &|p: &Pred| {
                let vals: Vec<u128> = match p.field {
                    Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => summary.v4.iter().map(|&v| u128::from(v)).collect(),
                    Field::Ip6Src | Field::Ip6Dst => summary.v6.clone(),
                    Field::SrcPort | Field::DstPort => summary.ports.iter().map(|&v| u128::from(v)).collect(),
                    Field::IpProto => summary.protos.iter().map(|&v| u128::from(v)).collect(),
                    Field::LinkProto => summary.links.iter().map(|&v| u128::from(v)).collect(),
                    _ => return true,
                };
                (summary.cut & field_bit(p.field) != 0 && !(p.field.bits() <= 32 || p.lo == p.hi)) || vals.iter().any(|&v| p.holds(v))
            });
            for need in &needs {
                let got: Vec<(u32, u64)> = s2.candidates(need).unwrap().iter().map(|e| (e.slot, e.data_offset)).collect();
                let want: Vec<(u32, u64)> = all
                    .iter()
                    .enumerate()
                    .filter(|(i, e)| if e.is_no_flow() { naive(need, &groups[*i].summary) } else { e.may_match(need) })
                    .map(|(_, e)| (e.slot, e.data_offset))
                    .collect();
                // A kept stage 2 answers the same, the first time (blocks decoded and kept) and the next.
                for (k, keep) in &kept {
                    for _ in 0..2 {
                        let again: Vec<(u32, u64)> = k.candidates(need).unwrap().iter().map(|e| (e.slot, e.data_offset)).collect();
                        prop_assert_eq!(&again, &want, "{} kept", need);
                    }
                    prop_assert!(keep.used() <= keep.budget);
                    prop_assert_eq!(k.entries().unwrap().iter().map(|e| e.slot).collect::<Vec<_>>(), all.iter().map(|e| e.slot).collect::<Vec<_>>());
                }
                prop_assert_eq!(got, want, "{}", need);
                prop_assert_eq!(s2.no_flow_may_match(need), groups.iter().any(|g| naive(need, &g.summary)));
            }
            // With room for everything, every block is kept once decoded.
            let (k, keep) = &kept[0];
            prop_assert!(k.kept.as_ref().is_some_and(|(_, b)| b.iter().all(|b| b.get().is_some())));
            let groups_bytes = match (&k.no_flow, k.group_index.get()) {
                (NoFlowIndex::Groups(g), Some(ix)) => {
                    prop_assert_eq!((ix.v4.capacity(), ix.v6.capacity(), ix.ports.capacity()), (ix.v4.len(), ix.v6.len(), ix.ports.len()));
                    GroupIndex::heap_bytes_of(g)
                }
                _ => 0,
            };
            prop_assert_eq!(keep.used(), groups_bytes + k.kept.as_ref().map_or(0, |(_, b)| b.iter().filter_map(|b| b.get()).map(KeptBlock::heap_bytes).sum::<u64>()));
        }
    }

    #[test]
    fn ranges_that_overlap_are_merged_and_others_kept() {
        let k = |v: u32| v4_key(u128::from(v));
        let r = |a: u32, b: u32| (k(a), k(b));
        // A host's four conditions are one range; a range inside another goes; disjoint ones stay, sorted.
        assert_eq!(merged(vec![r(5, 5); 4]), vec![r(5, 5)]);
        assert_eq!(merged(vec![r(10, 20), r(1, 3), r(12, 15), r(18, 30)]), vec![r(1, 3), r(10, 30)]);
        assert_eq!(merged(vec![r(4, 6), r(7, 9)]), vec![r(4, 6), r(7, 9)]);
        // IPv6 keys sort after IPv4 ones.
        let six = (v6_key(1), v6_key(2));
        assert_eq!(merged(vec![six, r(1, 2)]), vec![r(1, 2), six]);
        assert!(merged(Vec::new()).is_empty());
    }

    #[test]
    fn zigzag_round_trips_every_difference() {
        for v in [0u64, 1, 2, u64::MAX, u64::MAX - 1, 1 << 63, 12345, 0u64.wrapping_sub(12345)] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(0u64.wrapping_sub(1)), 1);
        assert_eq!(zigzag(1), 2);
    }
}
