//! A segment's writer: packets held in memory up to the segment's bound in the order they came, then written
//! grouped by flow (each flow's packets in their original order), with the index (stage 1, stage 2, original
//! order positions, data checksums); synced and renamed into place, the index first and the data last, so a
//! segment is visible exactly when both are complete.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pcaptool_packet::{
    Field, FieldValue, FlowKey, FlowTuple, LinkType, PacketFields, TsPrecision, prefetch, prefetch_item,
};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::blocks::{Batches, BlockEntry, BlockMap, Blocker, Codec, Helper, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use crate::bloom::Bloom;
use crate::codec::{put_varint, seal};
use crate::dataout::{DataOut, Stage};
use crate::dedup::{Deduper, MIN_PIECE, Piece};
use crate::error::StoreError;
use crate::flow::{ConnState, Flow, SlotCache};
use crate::stage1::{FlowIds, SegmentIface, SourceMark, Stage1, StoreMeta, iface_bits};
use crate::stage2::{self, Endpoints, NoFlow, NoFlowGroup, NoFlowGroups, SlotIn};
use crate::sums::BLOCK_LOG2;

use crate::format::*;

/// One packet handed to a [`SegmentWriter`].
#[derive(Clone, Copy, Debug)]
pub struct PacketIn<'a> {
    /// Its position in the store's original order.
    pub seq: u64,
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Length on the wire.
    pub wirelen: u32,
    /// Captured bytes.
    pub data: &'a [u8],
    /// Its flow: id, key, whether the originator is the key's `lo` side, and the flow's state now.
    pub flow: Option<(u64, FlowTuple, bool, ConnState)>,
    /// Whether every address and port a filter reads from the packet is absent or an endpoint of its flow's key
    /// (as [`plain_flow`](pcaptool_packet::plain_flow) guarantees), so that the writer need not read them.
    pub fields_in_key: bool,
    /// Whether it went from the originator.
    pub from_orig: bool,
    /// Transport payload bytes.
    pub payload: u32,
    /// TCP flags.
    pub flags: u8,
    /// The interface it came from: an index into the writer's interfaces ([`SegmentWriter::iface_index`]).
    pub iface: u16,
}

/// Bytes the writer keeps of a packet before its record (see [`SegmentWriter::push_cached`]): the difference
/// between its position and its flow's last, its payload length, its TCP flags, its flow's state and its side,
/// and its interface.
const HEAD: usize = 16;

/// Bytes the writer keeps of a packet at the far end of the arena: its slot and its captured length.
const ENTRY: usize = 8;

/// The smallest arena a writer grows to (it doubles from there).
const ARENA_MIN: usize = 64 << 10;

/// The arena size past which it grows by a quarter, not by doubling: a segment of 256 MiB would otherwise end in
/// an arena of up to 512 MiB, every byte of it written once when it grew (most of an import's page faults).
const ARENA_QUARTERS: usize = 64 << 20;

/// The size an arena of `old` bytes grows to when it needs `need` more.
fn grown(old: usize, need: usize) -> usize {
    let step = if old < ARENA_QUARTERS { old } else { old / 4 };
    (old + step).max(old + need).max(ARENA_MIN)
}

/// The flows of a segment: per slot its flow (slot 0: packets of no flow).
#[derive(Debug)]
struct SlotFlow {
    flow: Flow,
    /// Whether some packet's IP protocol, as a filter reads it, is not the key's (IPv6 extension headers: the
    /// key takes the protocol after them, `ip6 proto` the first next header).
    proto_beyond_key: bool,
}

/// A writer's containers, which a closed writer hands to the next (their memory is already faulted in).
#[derive(Debug, Default)]
pub(crate) struct Spare {
    /// The arena: the packets from the front, in the order they came (up to `used`), each its [`HEAD`] and its
    /// pcap record, and from the back an [`ENTRY`] for each (`items` of them, the first at the very end; see
    /// [`SegmentWriter::push_cached`]). All of it has been written once.
    buf: Vec<u8>,
    used: usize,
    items: usize,
    /// Per slot, the position of its flow's last packet (0 before the first).
    last: Vec<u64>,
    slots: Vec<SlotFlow>,
    /// Each flow's slot by id, kept only once the writer is [`indexed`](SegmentWriter::index_slots).
    slot_of: FxHashMap<u64, u32>,
    /// Addresses and ports a filter could read from a packet that are not endpoints of its flow (the Bloom
    /// filters get these and every flow's endpoints).
    addrs: FxHashSet<[u8; 17]>,
    ports: FxHashSet<u16>,
    /// What a close needs for a while, kept so that each close does not fault in fresh pages: the direct
    /// writes' staging buffer, the slots in flow-id order, per slot a count and then a cursor, the packets
    /// (where each is in the arena, and its size) in the order the data file takes them, each flow's span and
    /// its positions' varints.
    stage: Stage,
    order: Vec<u32>,
    cursor: Vec<u32>,
    sorted: Vec<u64>,
    spans: Vec<Span>,
    positions: Vec<u8>,
    /// The data file's block checksums.
    sums: Vec<u32>,
}

/// What a flow's packets take in a closing segment: data bytes and bytes of positions' varints.
#[derive(Clone, Copy, Debug)]
struct Span {
    data: u64,
    positions: u64,
}

impl Spare {
    /// Makes room for at least `bytes` of arena (packets with their records' headers and entries), written
    /// once (`touch`).
    pub(crate) fn touch(&mut self, bytes: usize) {
        if self.buf.len() < bytes {
            // Not zeros: a zeroed allocation may come from `calloc`, whose fresh pages are never touched.
            self.buf.resize(bytes, 0xa5);
        }
    }

    /// Packet `k`'s slot and captured length, from its [`ENTRY`] (the first packet's is at the very end).
    fn entry(&self, k: usize) -> (usize, usize) {
        let at = self.buf.len() - (k + 1) * ENTRY;
        let b = &self.buf[at..at + ENTRY];
        (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize)
    }

    /// Makes room for `need` more bytes between the packets and the entries: the arena grows as [`grown`] says,
    /// its entries move to its new end.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, need: usize) {
        let old = self.buf.len();
        let len = grown(old, need);
        let lo = old - self.items * ENTRY;
        // Exactly: `resize` alone would let the vector pick its own (doubled) capacity.
        self.buf.reserve_exact(len - old);
        self.buf.resize(len, 0xa5);
        self.buf.copy_within(lo..old, len - self.items * ENTRY);
    }

    /// Where its arena is (to tell whose memory a writer took).
    #[cfg(test)]
    pub(crate) fn arena(&self) -> *const u8 {
        self.buf.as_ptr()
    }

    /// Empties every container, keeping its memory.
    fn clear(&mut self) {
        self.used = 0;
        self.items = 0;
        self.last.clear();
        self.slots.clear();
        self.slot_of.clear();
        self.addrs.clear();
        self.ports.clear();
        self.order.clear();
        self.cursor.clear();
        self.sorted.clear();
        self.spans.clear();
        self.positions.clear();
    }
}

/// Accumulates a segment's packets and writes it when closed.
#[derive(Debug)]
pub struct SegmentWriter {
    /// Unique in the process (never 0), for the flow table's [`SlotCache`]s.
    id: u64,
    /// The link type and byte order of every packet.
    linktype: LinkType,
    swapped: bool,
    /// The interfaces its packets came from, and each one's packets; each one's index by its number, snapshot
    /// length and precision.
    ifaces: Vec<SegmentIface>,
    iface_packets: Vec<u64>,
    iface_of: FxHashMap<(u32, u32, TsPrecision), u16>,
    /// The trace its packets come from, if known.
    pub(crate) source: Option<SourceMark>,
    /// The packets, in the order they came; the flow slots (slot 0: packets of no flow); the Bloom filters' address
    /// and port sets.
    mem: Spare,
    /// The link type's header fields are not read (so the Bloom filters cannot rule packets out).
    unknown_fields: bool,
    /// The groups of the packets of no flow, and what each holds.
    no_flow: NoFlowGroups,
    /// Whether `slot_of` is kept (see [`index_slots`](Self::index_slots)).
    indexed: bool,
    packets: usize,
    /// Bytes of the pcap records held (headers and packets).
    record_bytes: u64,
    /// Positions of the first and last packet.
    first_seq: u64,
    last_seq: u64,
    /// How the data file is stored, the raw size its blocks aim at, and whether flows' payloads are deduplicated.
    codec: Codec,
    /// `None`: the codec's default, or with `dedup` as [`Codec::deduplicated_block_size`] says per segment.
    block_size: Option<usize>,
    dedup: bool,
    /// When its close compresses on a second thread.
    helper: Helper,
}

impl SegmentWriter {
    /// An empty segment of packets of `meta`'s link type and byte order, its first interface (index 0) `meta`'s,
    /// named `iface_name` (see [`iface_index`](Self::iface_index)).
    pub fn new(meta: StoreMeta, iface_name: &str) -> SegmentWriter {
        SegmentWriter::with_spare(meta, iface_name, Spare::default())
    }

    /// [`new`](Self::new), reusing the buffers of a closed writer.
    pub(crate) fn with_spare(meta: StoreMeta, iface_name: &str, mut spare: Spare) -> SegmentWriter {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let mut w = SegmentWriter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            linktype: meta.linktype,
            swapped: meta.swapped,
            ifaces: Vec::new(),
            iface_packets: Vec::new(),
            iface_of: FxHashMap::default(),
            source: None,
            mem: {
                spare.clear();
                spare.slots.push(SlotFlow { flow: no_flow(), proto_beyond_key: false });
                spare.last.push(0);
                spare
            },
            unknown_fields: false,
            no_flow: NoFlowGroups::default(),
            indexed: false,
            packets: 0,
            record_bytes: 0,
            first_seq: u64::MAX,
            last_seq: 0,
            codec: Codec::None,
            block_size: None,
            dedup: false,
            helper: Helper::default(),
        };
        w.iface_index(&meta, iface_name);
        w
    }

    /// Stores the data file with `codec` in blocks of about `block_size` raw bytes (clamped to
    /// [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`]; `None`: the codec's default, or deduplicated, per segment as
    /// [`Codec::deduplicated_block_size`] says); plain pcap by default. With `dedup` (compressed data only), a
    /// flow direction whose payload an earlier one of the segment carried is stored without it (see the `dedup`
    /// module).
    pub fn set_storage(&mut self, codec: Codec, block_size: Option<usize>, dedup: bool) {
        self.codec = codec;
        self.dedup = dedup && codec.is_compressed();
        self.block_size = block_size.map(|b| b.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE));
    }

    /// Compresses on a second thread at its close only when `helper` says so (always by default).
    pub(crate) fn set_helper(&mut self, helper: Helper) {
        self.helper = helper;
    }

    /// The link type and byte order of its packets.
    pub fn kind(&self) -> (LinkType, bool) {
        (self.linktype, self.swapped)
    }

    /// The index of the interface of packets of kind `meta` (of the writer's link type and byte order) named
    /// `iface_name` (cut to 255 bytes at a character boundary; empty if unknown), added if new; `None` when the
    /// segment holds [`MAX_IFACES`] interfaces already. An interface is its index in the source, snapshot length
    /// and precision; the name is the first given.
    pub fn iface_index(&mut self, meta: &StoreMeta, iface_name: &str) -> Option<u16> {
        debug_assert_eq!((meta.linktype, meta.swapped), self.kind(), "a packet of another kind of segment");
        let key = (meta.iface, meta.snaplen, meta.precision);
        if let Some(&i) = self.iface_of.get(&key) {
            return Some(i);
        }
        if self.ifaces.len() >= MAX_IFACES {
            return None;
        }
        let mut end = iface_name.len().min(255);
        while !iface_name.is_char_boundary(end) {
            end -= 1;
        }
        self.ifaces.push(SegmentIface {
            iface: meta.iface,
            snaplen: meta.snaplen,
            precision: meta.precision,
            name: iface_name[..end].to_string(),
        });
        self.iface_packets.push(0);
        let i = (self.ifaces.len() - 1) as u16;
        self.iface_of.insert(key, i);
        Some(i)
    }

    /// Packets held of interface `iface` (its index in the source, as in [`StoreMeta::iface`]).
    pub fn iface_packets(&self, iface: u32) -> u64 {
        self.ifaces.iter().zip(&self.iface_packets).filter(|(f, _)| f.iface == iface).map(|(_, n)| n).sum()
    }

    /// The interfaces of its packets, as their source numbers them, with the packets of each.
    pub(crate) fn iface_counts(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.ifaces.iter().zip(&self.iface_packets).map(|(f, &n)| (f.iface, n))
    }

    /// Position of its first packet in the store's order (`u64::MAX` while empty).
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Packets held.
    pub fn packets(&self) -> usize {
        self.packets
    }

    /// Bytes the data file will have.
    pub fn data_bytes(&self) -> u64 {
        24 + self.record_bytes
    }

    /// Bytes of memory its packets take: their records and 24 bytes beside each (a close needs 8 more a
    /// packet, and its flows' index).
    pub fn memory_bytes(&self) -> u64 {
        (self.mem.used + self.mem.items * ENTRY) as u64
    }

    /// Adds a packet.
    pub fn push(&mut self, p: &PacketIn<'_>) {
        self.index_slots();
        self.push_cached(p, &mut SlotCache::default());
    }

    /// From now on finds a flow's slot by its id, not only by the flow's [`SlotCache`]. A writer that is not
    /// indexed takes a flow whose cache names another writer for a flow it has not seen, which holds while it
    /// is the only writer its packets go through: the cache names it from the flow's first packet in it on,
    /// until another writer takes one of the flow's packets. So the ingest indexes every writer as soon as two
    /// are open at once (and [`push`](Self::push), which has no cache, indexes always). Until then, a new flow
    /// costs no map insert.
    pub(crate) fn index_slots(&mut self) {
        if !self.indexed {
            self.indexed = true;
            let m = &mut self.mem;
            m.slot_of.extend(m.slots.iter().enumerate().skip(1).map(|(i, sf)| (sf.flow.id, i as u32)));
        }
    }

    /// [`push`](Self::push), with the flow's slot cache from the flow table: when it names this writer, its slot
    /// is the flow's, and when not, it is set.
    ///
    /// The packet goes after the last one, whatever its flow: its [`HEAD`] (its position minus its flow's
    /// previous packet's, or its position for the flow's first, u64 LE at 0; its payload length, u32 LE at 8;
    /// its TCP flags, byte 12; its flow's state and whether it went from the originator, byte 13: state code,
    /// then bit 3), then its pcap record (a 16-byte header: seconds, nanoseconds, captured and wire length; then
    /// its bytes). Its [`ENTRY`] (slot and captured length, u32 LE each) goes below the last packet's at the
    /// arena's far end. Both are written in sequence, so that a push touches no memory of its flow's but the
    /// flow's last position; the close puts each flow's packets together (see `write`).
    #[inline]
    pub(crate) fn push_cached(&mut self, p: &PacketIn<'_>, cache: &mut SlotCache) {
        let slot = match p.flow {
            None => 0,
            Some(_) if cache.writer == self.id => cache.slot,
            Some((id, tuple, orig_is_lo, _)) => {
                let slot = self.slot_of_flow(id, tuple, orig_is_lo);
                *cache = SlotCache { writer: self.id, slot };
                slot
            }
        };
        // (A packet of no flow has no key its fields could be in: its fields are always noted.)
        let group = if !p.fields_in_key || slot == 0 { self.note_fields(p, slot) } else { 0 };
        let state = p.flow.map_or(ConnState::Oth, |f| f.3);
        let len = p.data.len();
        let m = &mut self.mem;
        let need = HEAD + 16 + len + ENTRY;
        if m.buf.len() - m.items * ENTRY - m.used < need {
            m.grow(need);
        }
        // A packet of no flow follows the last of its group (see `NoFlowGroup`).
        let last = if slot == 0 { &mut self.no_flow.last[group] } else { &mut m.last[slot as usize] };
        let delta = p.seq.wrapping_sub(*last);
        *last = p.seq;
        let mut head = [0u8; HEAD + 16];
        head[0..8].copy_from_slice(&delta.to_le_bytes());
        head[8..12].copy_from_slice(&p.payload.to_le_bytes());
        head[12] = p.flags;
        head[13] = state as u8 | u8::from(p.from_orig) << 3;
        head[14..16].copy_from_slice(&p.iface.to_le_bytes());
        head[16..20].copy_from_slice(&((p.ts_ns / 1_000_000_000) as u32).to_le_bytes());
        head[20..24].copy_from_slice(&((p.ts_ns % 1_000_000_000) as u32).to_le_bytes());
        head[24..28].copy_from_slice(&(len as u32).to_le_bytes());
        head[28..32].copy_from_slice(&p.wirelen.to_le_bytes());
        let mut entry = [0u8; ENTRY];
        entry[0..4].copy_from_slice(&slot.to_le_bytes());
        entry[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        let (at, entry_at) = (m.used, m.buf.len() - (m.items + 1) * ENTRY);
        m.buf[entry_at..entry_at + ENTRY].copy_from_slice(&entry);
        m.buf[at..at + HEAD + 16].copy_from_slice(&head);
        m.buf[at + HEAD + 16..at + HEAD + 16 + len].copy_from_slice(p.data);
        m.used += HEAD + 16 + len;
        m.items += 1;
        if self.packets == 0 {
            self.first_seq = p.seq;
        }
        if let Some(n) = self.iface_packets.get_mut(usize::from(p.iface)) {
            *n += 1;
        }
        self.packets += 1;
        self.record_bytes += 16 + len as u64;
        self.last_seq = p.seq;
    }

    /// Where its arena is (see [`Spare::arena`]).
    #[cfg(test)]
    pub(crate) fn arena(&self) -> *const u8 {
        self.mem.arena()
    }

    /// Its id, which flow table entries name in their [`SlotCache`].
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// A hint that a packet of `slot` comes soon: starts loading its flow's last position.
    #[inline]
    pub(crate) fn prefetch_slot(&self, slot: u32) {
        prefetch_item(&self.mem.last, slot as usize);
    }

    /// The slot of flow `id`, new if the flow has none yet (when the writer is not indexed, the flow is new;
    /// see [`index_slots`](Self::index_slots)).
    #[cold]
    fn slot_of_flow(&mut self, id: u64, tuple: FlowTuple, orig_is_lo: bool) -> u32 {
        let (slots, last) = (&mut self.mem.slots, &mut self.mem.last);
        let mut new = || {
            slots.push(SlotFlow {
                flow: Flow { id, key: FlowKey::from(tuple), orig_is_lo, ..no_flow() },
                proto_beyond_key: false,
            });
            last.push(0);
            (slots.len() - 1) as u32
        };
        if self.indexed { *self.mem.slot_of.entry(id).or_insert_with(new) } else { new() }
    }

    /// Puts every address and port value a filter could test on this packet, as the filter reads it, into the
    /// Bloom filters' sets, so that stage 1 never rules out a segment holding a match. Most equal the flow's
    /// endpoints, inserted with the flow. A field cut short by the snapshot length is left out: the exact values
    /// and short port ranges the filters test need all of its bytes, and libpcap rejects a packet whose test
    /// reads past its bytes (see `Need::may_match_captured`). A packet of no flow (slot 0) is put in a group,
    /// whose summary in stage 2 notes its fields too, and the group returned (0 for other packets).
    fn note_fields(&mut self, p: &PacketIn<'_>, slot: u32) -> usize {
        let fields = PacketFields::new(self.linktype, p.data, p.wirelen, p.ts_ns).swapped(self.swapped);
        if !fields.has_header_fields() {
            self.unknown_fields = true;
            return if slot == 0 { self.no_flow.note(None) } else { 0 };
        }
        let mut group = 0;
        if slot == 0 {
            group = self.no_flow.note(Some(&fields));
        } else if let Some((_, tuple, ..)) = p.flow
            && let Some(sf) = self.mem.slots.get_mut(slot as usize)
            && !sf.proto_beyond_key
        {
            // The protocol a filter reads (an IPv6 packet's first next header) may not be the key's.
            sf.proto_beyond_key = match fields.reader().get(Field::IpProto) {
                FieldValue::Value(v) => v != u128::from(tuple.proto),
                FieldValue::Unknown => true,
                FieldValue::Missing => false,
            };
        }
        const FIELDS: [Field; 8] = [
            Field::Ip4Src,
            Field::Ip4Dst,
            Field::ArpSpa,
            Field::ArpTpa,
            Field::Ip6Src,
            Field::Ip6Dst,
            Field::SrcPort,
            Field::DstPort,
        ];
        let key = p.flow.map(|f| f.1);
        // Whether `v` is one of the flow's endpoint addresses of the same family (`v6`).
        let endpoint = |v: u128, v6: bool| {
            key.is_some_and(|k| (k.lo == v && (k.v6 & 1 != 0) == v6) || (k.hi == v && (k.v6 & 2 != 0) == v6))
        };
        let r = fields.reader();
        // Each field read on its own (a constant field folds to its loads; see `PacketFields::reader`).
        let values = [
            r.get(FIELDS[0]),
            r.get(FIELDS[1]),
            r.get(FIELDS[2]),
            r.get(FIELDS[3]),
            r.get(FIELDS[4]),
            r.get(FIELDS[5]),
            r.get(FIELDS[6]),
            r.get(FIELDS[7]),
        ];
        for (i, value) in values.into_iter().enumerate() {
            match value {
                FieldValue::Value(v) if i < 4 => {
                    if !endpoint(v, false) {
                        self.mem.addrs.insert(v4_key(v));
                    }
                }
                FieldValue::Value(v) if i < 6 => {
                    if !endpoint(v, true) {
                        self.mem.addrs.insert(v6_key(v));
                    }
                }
                FieldValue::Value(v) => {
                    if !key.is_some_and(|k| u128::from(k.lo_port) == v || u128::from(k.hi_port) == v) {
                        self.mem.ports.insert(v as u16);
                    }
                }
                FieldValue::Unknown | FieldValue::Missing => {}
            }
        }
        group
    }

    /// Writes the segment as `seg-NUMBER` in `dir` (see the module documentation); returns its stage 1.
    pub fn close(mut self, dir: &Path, number: u32) -> Result<Stage1, StoreError> {
        self.close_in_place(dir, number)
    }

    /// [`close`](Self::close), and the writer's buffers (their memory faulted in) for a later segment.
    pub(crate) fn close_keeping(mut self, dir: &Path, number: u32) -> (Result<Stage1, StoreError>, Spare) {
        let r = self.close_in_place(dir, number);
        (r, std::mem::take(&mut self.mem))
    }

    /// The writer's buffers, for another (a writer closed without packets).
    pub(crate) fn into_spare(self) -> Spare {
        self.mem
    }

    fn close_in_place(&mut self, dir: &Path, number: u32) -> Result<Stage1, StoreError> {
        let index_path = segment_paths(dir, number).1;
        let data_path = dir.join(data_file_name(number, 0, self.codec));
        let tmp = |p: &Path| {
            let mut s = p.as_os_str().to_owned();
            s.push(".tmp");
            PathBuf::from(s)
        };
        let (data_tmp, index_tmp) = (tmp(&data_path), tmp(&index_path));
        let result = self.write(&data_tmp, &index_tmp, number);
        if result.is_err() {
            let _ = std::fs::remove_file(&data_tmp);
            let _ = std::fs::remove_file(&index_tmp);
        }
        let stage1 = result?;
        std::fs::rename(&index_tmp, &index_path).map_err(|e| StoreError::io(&index_path, e))?;
        std::fs::rename(&data_tmp, &data_path).map_err(|e| StoreError::io(&data_path, e))?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(stage1)
    }

    fn write(&mut self, data_tmp: &Path, index_tmp: &Path, number: u32) -> Result<Stage1, StoreError> {
        // Slots in flow-id order (slot 0, the packets of no flow, first), so that stage 2 finds an id by binary
        // search.
        // The close's temporaries, kept from the last close (and handed back below).
        let mut order = std::mem::take(&mut self.mem.order);
        let mut spans = std::mem::take(&mut self.mem.spans);
        let mut positions = std::mem::take(&mut self.mem.positions);
        // (Empty: `Spare::clear` emptied them when the writer was made.)
        order.extend(0..self.mem.slots.len() as u32);
        order[1..].sort_unstable_by_key(|&s| self.mem.slots[s as usize].flow.id);
        let io = |e| StoreError::io(data_tmp, e);
        let out = DataOut::create(data_tmp, std::mem::take(&mut self.mem.stage)).map_err(io)?;
        let mut at = 24u64;
        let (mut t_min, mut t_max) = (u64::MAX, 0u64);
        let corrupt = |why: &str| StoreError::Corrupt {
            path: data_tmp.to_path_buf(),
            offset: 0,
            why: format!("the segment writer's own memory: {why}"),
        };
        // The packets in the order the data file takes them, flow by flow (slots in `order`), each flow's in
        // their original order: a counting sort of where each packet is in the arena, by slot, stable.
        let mut cursor = std::mem::take(&mut self.mem.cursor);
        let mut sorted = std::mem::take(&mut self.mem.sorted);
        let m = &mut self.mem;
        if u32::try_from(m.items).is_err() {
            return Err(corrupt("more than 2^32 packets"));
        }
        // With several interfaces, each position carries its packet's interface in its low bits.
        let bits = iface_bits(self.ifaces.len());
        if bits > 0 && self.last_seq >> (64 - bits) != 0 {
            return Err(corrupt("positions too large to carry an interface"));
        }
        cursor.resize(m.slots.len(), 0);
        for k in 0..m.items {
            let c = cursor.get_mut(m.entry(k).0).ok_or_else(|| corrupt("a packet's slot is out of range"))?;
            *c += 1;
        }
        let mut start = 0u32;
        for &s in &order {
            let c = &mut cursor[s as usize];
            (start, *c) = (start + *c, start);
        }
        sorted.resize(m.items, 0);
        let mut from = 0usize;
        for k in 0..m.items {
            let (slot, len) = m.entry(k);
            let c = &mut cursor[slot];
            // Where the packet is (40 bits: an arena of up to 1 TiB) and its size (24 bits, for the prefetch).
            if from >> 40 != 0 {
                return Err(corrupt("an arena of more than 1 TiB"));
            }
            let size = HEAD + 16 + len;
            sorted[*c as usize] = from as u64 | (size.min(0xff_ffff) as u64) << 40;
            *c += 1;
            from += size;
        }
        if from != m.used {
            return Err(corrupt("the packets' lengths and the arena's disagree"));
        }
        // Now each slot's cursor is where its packets end in `sorted`; each packet's lines are loaded 8 packets
        // before its turn (a line-set is 2-3 lines: its offset in the arena is any).
        let ahead = 8;
        // Deduplicated, what each flow leaves out is decided for the whole segment before its data is written, so
        // that the block size can follow how much was found: the packets whose payload is left out (their place
        // in `sorted`, the payload's offset in the record and its length), in order.
        let mut dd = self.dedup.then(Deduper::default);
        let mut elided: Vec<(u32, u32, u32)> = Vec::new();
        let mut raw = 24u64;
        if let Some(dd) = dd.as_mut() {
            let mut elide: Vec<(usize, usize)> = Vec::new();
            let mut j = 0usize;
            for &s in &order {
                let end = cursor[s as usize] as usize;
                elide.clear();
                // (The packets of no flow are never elided.)
                let stop = elide_flow(&m.buf, &sorted[j..end], raw, (s != 0).then_some(&mut *dd), &mut elide)
                    .ok_or_else(|| corrupt("a record is cut"))?;
                for (k, &(o, l)) in elide.iter().enumerate().filter(|e| e.1.1 > 0) {
                    elided.push(((j + k) as u32, o as u32, l as u32));
                }
                raw = stop;
                j = end;
            }
        }
        let block_size = match (self.block_size, &dd) {
            (Some(b), _) => b,
            (None, Some(dd)) => self.codec.deduplicated_block_size(dd.elided, raw),
            (None, None) => self.codec.default_block_size(),
        };
        let helper = self.helper.clone();
        let mut w = Sink::new(out, self.codec, block_size, std::mem::take(&mut m.sums), helper);
        // The data file's snapshot length: the largest of its interfaces' (libpcap cuts a longer record to it).
        let snaplen = self.ifaces.iter().map(|f| f.snaplen).max().unwrap_or(0);
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&self.linktype.0.to_le_bytes());
        // Deduplicated data is no pcap stream once decompressed (payloads are elsewhere): its magic says so.
        let mut stored_head = h;
        if self.dedup {
            stored_head[0..4].copy_from_slice(&DEDUP_MAGIC);
        }
        w.put(&stored_head).map_err(io)?;
        let mut j = 0usize;
        let mut next_elided = elided.iter().peekable();
        // The packets of no flow by group (see `NoFlowGroup`), each group's in the order they came; per group its
        // end in `sorted`, and what it took.
        let mut group_ends = Vec::new();
        let mut groups = Vec::with_capacity(self.no_flow.sets.len());
        for &s in &order {
            let end = cursor[s as usize] as usize;
            let (data0, pos0) = (at, positions.len());
            if s == 0 {
                group_ends = self.no_flow.order(&mut sorted[j..end]).ok_or_else(|| corrupt("groups of no flow"))?;
                group_ends.iter_mut().for_each(|e| *e += j);
            }
            let (mut group_data, mut group_pos, mut group_first) = (at, positions.len(), j);
            while j < end {
                if let Some(&next) = sorted.get(j + ahead) {
                    let (lo, size) = ((next & 0xff_ffff_ffff) as usize, (next >> 40) as usize);
                    let mut line = lo & !63;
                    while line < lo + size.min(256) {
                        prefetch(&m.buf, line);
                        line += 64;
                    }
                }
                let from = (sorted[j] & 0xff_ffff_ffff) as usize;
                let word = |b: &[u8], k: usize| u32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
                let h = m.buf.get(from..from + HEAD + 16).ok_or_else(|| corrupt("a record header is cut"))?;
                let (delta, payload, flags, code) =
                    (u64::from(word(h, 0)) | u64::from(word(h, 4)) << 32, word(h, 8), h[12], h[13]);
                let iface = u64::from(u16::from_le_bytes([h[14], h[15]]));
                let r = &h[HEAD..];
                let ts = u64::from(word(r, 0)) * 1_000_000_000 + u64::from(word(r, 4));
                let (len, wirelen) = (word(r, 8) as usize, word(r, 12));
                let record =
                    m.buf.get(from + HEAD..from + HEAD + 16 + len).ok_or_else(|| corrupt("a record is cut"))?;
                match next_elided.next_if(|e| e.0 as usize == j) {
                    Some(&(_, o, l)) => {
                        let (o, l) = (o as usize, l as usize);
                        let kept = record.get(..o).zip(record.get(o + l..)).ok_or_else(|| corrupt("an elision"))?;
                        w.put(kept.0).map_err(io)?;
                        w.put(kept.1).map_err(io)?;
                    }
                    None => w.put(record).map_err(io)?,
                }
                at += record.len() as u64;
                put_varint(&mut positions, if bits == 0 { delta } else { delta << bits | iface });
                t_min = t_min.min(ts);
                t_max = t_max.max(ts);
                let f = &mut m.slots[s as usize].flow;
                f.first_ns = f.first_ns.min(ts);
                f.last_ns = f.last_ns.max(ts);
                if s != 0 {
                    f.state = ConnState::from_code(code & 7).unwrap_or(ConnState::Oth);
                }
                let side = if code & 8 != 0 { &mut f.orig } else { &mut f.resp };
                side.packets += 1;
                side.bytes += u64::from(wirelen);
                side.payload += u64::from(payload);
                side.flags |= flags;
                j += 1;
                if s == 0 && group_ends.get(groups.len()) == Some(&j) {
                    let (packets, data_len) = ((j - group_first) as u64, at - group_data);
                    let positions_len = (positions.len() - group_pos) as u64;
                    let summary = NoFlow::of(&self.no_flow.sets[groups.len()]);
                    groups.push(NoFlowGroup { packets, data_len, positions_len, summary });
                    (group_data, group_pos, group_first) = (at, positions.len(), j);
                    if j < end {
                        w.flow_end().map_err(io)?;
                    }
                }
            }
            w.flow_end().map_err(io)?;
            spans.push(Span { data: at - data0, positions: (positions.len() - pos0) as u64 });
        }
        self.mem.cursor = cursor;
        self.mem.sorted = sorted;
        let (stage, map) = w.finish().map_err(io)?;
        let (sums_bytes, n_blocks, stored_bytes) = match map {
            DataMap::Sums(sums) => {
                let bytes: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
                self.mem.sums = sums;
                (bytes, 0, at)
            }
            map => map.into_part_of(at).map_err(|_| corrupt("more than 2^32 blocks"))?,
        };
        let (mut sums_bytes, mut elided_bytes, mut n_elisions, mut elisions_len) = (sums_bytes, 0, 0, 0);
        if let Some(mut dd) = dd {
            let e = dd.encode(true); // (format 9 on: with checkpoints)
            n_elisions = u32::try_from(dd.elisions.len()).map_err(|_| corrupt("more than 2^32 elisions"))?;
            elisions_len = u32::try_from(e.len()).map_err(|_| corrupt("elisions of more than 4 GiB"))?;
            elided_bytes = dd.elided;
            sums_bytes.extend_from_slice(&e);
        }

        let ins: Vec<SlotIn<'_>> = order
            .iter()
            .zip(&spans)
            .map(|(&s, span)| SlotIn {
                flow: &self.mem.slots[s as usize].flow,
                proto_beyond_key: self.mem.slots[s as usize].proto_beyond_key,
                data_len: span.data,
                positions_len: span.positions,
            })
            .collect();
        // The flows' endpoints, sorted: stage 2's dictionaries, and with the packets' other addresses and ports
        // the Bloom filters' keys.
        let ends = Endpoints::of(&ins);

        // Stage 1: what rules the segment out without reading further.
        let nslots = self.mem.slots.len();
        let (addr_bloom, port_bloom) = self.blooms(&ends);
        // (`order` has the slots in id order after slot 0.)
        let ids = order.iter().skip(1).map(|&s| self.mem.slots[s as usize].flow.id);
        let stage1 = Stage1 {
            version: VERSION,
            number,
            linktype: self.linktype,
            swapped: self.swapped,
            snaplen,
            ifaces: self.ifaces.clone(),
            source: self.source,
            block_log2: BLOCK_LOG2,
            sums_crc: 0,
            packets: self.packets as u64,
            bytes: at,
            flows: (nslots - 1) as u32,
            t_min: if self.packets == 0 { 0 } else { t_min },
            t_max,
            seq_min: if self.packets == 0 { 0 } else { self.first_seq },
            seq_max: self.last_seq,
            flow_min: ids.clone().next().unwrap_or(u64::MAX),
            flow_max: ids.clone().next_back().unwrap_or(0),
            unknown_fields: self.unknown_fields,
            addr_bloom,
            port_bloom,
            ids: FlowIds::runs(ids),
            stage2_len: 0,
            stage2_at: 0,
            positions_len: 0,
            codec: self.codec,
            generation: 0,
            n_blocks,
            stored_bytes,
            dedup: self.dedup,
            elided_bytes,
            n_elisions,
            elisions_len,
        };

        // Stage 2: the flow table and sorted arrays of addresses and ports.
        let s2 = stage2::encode(&ins, &ends, &groups, stage1.t_min, &positions);
        let mut stage1 = stage1;
        stage1.stage2_len = s2.len() as u64;
        stage1.sums_crc = stage1.part_crc(&sums_bytes);
        stage1.positions_len = positions.len() as u64;
        let mut s1 = stage1.encode();
        seal(&mut s1);
        self.mem.stage = write_index(index_tmp, VERSION, stage, &[&s1, &s2, &positions, &sums_bytes])?;
        self.mem.order = order;
        self.mem.spans = spans;
        self.mem.positions = positions;
        Ok(stage1)
    }
    /// Stage 1's Bloom filters: every address and port a filter can read from the segment's packets (the flows'
    /// endpoints and the values off their keys), and the flow ids.
    fn blooms(&self, ends: &Endpoints) -> (Bloom, Bloom) {
        let extra_addrs: Vec<&[u8; 17]> =
            self.mem.addrs.iter().filter(|a| ends.addrs.binary_search(a).is_err()).collect();
        let mut addr_bloom = Bloom::with_rate(ends.addrs.len() + extra_addrs.len(), ADDR_BLOOM_FPR);
        for a in ends.addrs.iter().chain(extra_addrs) {
            addr_bloom.insert(bloom_bytes(a));
        }
        let extra_ports: Vec<u16> =
            self.mem.ports.iter().copied().filter(|p| ends.ports.binary_search(p).is_err()).collect();
        let mut port_bloom = Bloom::with_rate(ends.ports.len() + extra_ports.len(), BLOOM_FPR);
        for p in ends.ports.iter().chain(&extra_ports) {
            port_bloom.insert(&p.to_be_bytes());
        }
        (addr_bloom, port_bloom)
    }
}

/// The first bytes of deduplicated stored data, in place of the pcap magic.
pub(crate) const DEDUP_MAGIC: [u8; 4] = *b"PTDD";

/// Decides which payload bytes of a flow's packets to leave out: `sorted` holds where each packet is in the
/// arena `buf` (as the writer's sort leaves it), `at` where the flow starts in the raw data. Fills `elide` with
/// each packet's (offset in its record, length) left out, (0, 0) for none (all of them without `dd`). Returns
/// where the flow ends in the raw data; `None` if a record is cut.
fn elide_flow(
    buf: &[u8],
    sorted: &[u64],
    at: u64,
    dd: Option<&mut Deduper>,
    elide: &mut Vec<(usize, usize)>,
) -> Option<u64> {
    let word = |b: &[u8], k: usize| u32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
    let mut dirs: [Vec<Piece>; 2] = [Vec::new(), Vec::new()];
    let mut side = Vec::with_capacity(sorted.len());
    let mut raw = at;
    for &p in sorted {
        let from = (p & 0xff_ffff_ffff) as usize;
        let h = buf.get(from..from + HEAD + 16)?;
        let (payload, orig) = (word(h, 8) as usize, h[13] & 8 != 0);
        let (len, wirelen) = (word(h, HEAD + 8) as usize, word(h, HEAD + 12) as usize);
        // The payload is the end of a packet captured whole.
        let piece = (payload >= MIN_PIECE as usize && len == wirelen && payload <= len).then(|| 16 + len - payload);
        match piece {
            Some(o) => {
                dirs[usize::from(orig)].push(Piece {
                    at: (from + HEAD + o) as u64,
                    raw: raw + o as u64,
                    len: payload as u32,
                });
                elide.push((o, payload));
            }
            None => elide.push((0, 0)),
        }
        side.push(usize::from(orig));
        raw += 16 + len as u64;
    }
    let dup = match dd {
        Some(dd) => [dd.consider(buf, &dirs[0]), dd.consider(buf, &dirs[1])],
        None => [false; 2],
    };
    for (e, &d) in elide.iter_mut().zip(&side) {
        if !dup[d] {
            *e = (0, 0);
        }
    }
    Some(raw)
}

/// Where a segment's data goes: a plain pcap file with a checksum per block of [`BLOCK_LOG2`] bytes, or
/// compressed blocks.
pub(crate) enum Sink {
    Plain(DataOut),
    Blocks(Box<BlockSink>),
}

/// What describes the data written: the plain file's checksums, or the compressed blocks and the file's length.
pub(crate) enum DataMap {
    Sums(Vec<u32>),
    Blocks(Vec<BlockEntry>, u64),
}

impl DataMap {
    /// The index's last part, the number of blocks and the data file's length (`raw` bytes if plain).
    pub(crate) fn into_part_of(self, raw: u64) -> Result<(Vec<u8>, u32, u64), std::num::TryFromIntError> {
        match self {
            DataMap::Sums(sums) => Ok((sums.iter().flat_map(|s| s.to_le_bytes()).collect(), 0, raw)),
            DataMap::Blocks(entries, stored) => Ok((BlockMap::encode(&entries), u32::try_from(entries.len())?, stored)),
        }
    }
}

/// Compressed data: raw bytes cut into blocks between flows ([`Blocker`]), each compressed and written.
pub(crate) struct BlockSink {
    out: DataOut,
    blocker: Blocker,
    batches: Batches,
    entries: Vec<BlockEntry>,
    stored: u64,
}

impl BlockSink {
    fn new(out: DataOut, codec: Codec, block_size: usize, helper: Helper) -> BlockSink {
        BlockSink {
            out,
            blocker: Blocker::new(block_size),
            batches: Batches::new(codec, helper),
            entries: Vec::new(),
            stored: 0,
        }
    }
}

/// Hands a raw block to be compressed; writes the blocks compressed (the fields of a [`BlockSink`] but its
/// blocker, which hands the block).
fn emit_block(
    raw: &mut Vec<u8>,
    batches: &mut Batches,
    out: &mut DataOut,
    entries: &mut Vec<BlockEntry>,
    stored: &mut u64,
) -> std::io::Result<()> {
    batches.push(raw, &mut |framed, e| write_block(framed, e, out, entries, stored))
}

fn write_block(
    framed: &[u8],
    e: BlockEntry,
    out: &mut DataOut,
    entries: &mut Vec<BlockEntry>,
    stored: &mut u64,
) -> std::io::Result<()> {
    out.put(framed)?;
    *stored += framed.len() as u64;
    entries.push(e);
    Ok(())
}

impl Sink {
    /// Data written to `out`: plain with its checksums (into `sums`, whose memory is reused), or compressed with
    /// `codec` in blocks of about `block_size` raw bytes, on a second thread when `helper` says so.
    pub(crate) fn new(out: DataOut, codec: Codec, block_size: usize, sums: Vec<u32>, helper: Helper) -> Sink {
        if codec.is_compressed() {
            Sink::Blocks(Box::new(BlockSink::new(out, codec, block_size, helper)))
        } else {
            Sink::Plain(out.with_sums(sums))
        }
    }

    #[inline]
    pub(crate) fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Plain(out) => out.put(bytes),
            Sink::Blocks(b) => {
                let BlockSink { out, blocker, batches, entries, stored } = &mut **b;
                blocker.put(bytes, &mut |raw| emit_block(raw, batches, out, entries, stored))
            }
        }
    }

    /// Marks the end of a flow (and of the packets of no flow): where a block may end.
    pub(crate) fn flow_end(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Plain(_) => Ok(()),
            Sink::Blocks(b) => {
                let BlockSink { out, blocker, batches, entries, stored } = &mut **b;
                blocker.flow_end(&mut |raw| emit_block(raw, batches, out, entries, stored))
            }
        }
    }

    /// Writes what is left and syncs the file; returns the staging buffer and what describes the data.
    pub(crate) fn finish(self) -> std::io::Result<(Stage, DataMap)> {
        match self {
            Sink::Plain(out) => {
                let (stage, sums) = out.finish()?;
                Ok((stage, DataMap::Sums(sums.unwrap_or_default())))
            }
            Sink::Blocks(mut b) => {
                let BlockSink { out, blocker, batches, entries, stored } = &mut *b;
                blocker.finish(&mut |raw| emit_block(raw, batches, out, entries, stored))?;
                batches.flush(&mut |framed, e| write_block(framed, e, out, entries, stored))?;
                let (stage, _) = b.out.finish()?;
                Ok((stage, DataMap::Blocks(b.entries, b.stored)))
            }
        }
    }
}

/// Writes a segment index of format `version`: the header (magic, version, stage 1's length, its CRC), then
/// `parts` (stage 1, stage 2, positions, data checksums), with direct I/O through the buffer `stage`, which it
/// hands back.
pub(crate) fn write_index(
    index_tmp: &Path,
    version: u16,
    stage: Stage,
    parts: &[&[u8]; 4],
) -> Result<Stage, StoreError> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&(parts[0].len() as u32).to_le_bytes());
    header.extend_from_slice(&[0u8; 8]);
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    // Direct too: the index is as many bytes again as a packet's position, and the page cache would cost as much
    // CPU as its data file's direct writes.
    let io = |e| StoreError::io(index_tmp, e);
    let mut w = DataOut::create(index_tmp, stage).map_err(io)?;
    w.put(&header).map_err(io)?;
    for part in parts {
        w.put(part).map_err(io)?;
    }
    Ok(w.finish().map_err(io)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{ConnState, Side};
    use crate::segment::Segment;
    use pcaptool_packet::{FlowTuple, LinkType, TsPrecision};

    /// A packet of no flow at `seq` and `ts_ns`, captured whole, of interface 0.
    pub(super) fn no_flow_packet(seq: u64, ts_ns: u64, data: &[u8]) -> PacketIn<'_> {
        PacketIn {
            seq,
            ts_ns,
            wirelen: data.len() as u32,
            data,
            flow: None,
            fields_in_key: true,
            from_orig: true,
            payload: 0,
            flags: 0,
            iface: 0,
        }
    }

    /// Ethernet packets of interface 0, nanosecond timestamps.
    fn ethernet_meta(snaplen: u32) -> StoreMeta {
        StoreMeta { linktype: LinkType::ETHERNET, snaplen, precision: TsPrecision::Nano, swapped: false, iface: 0 }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Whatever the packets' sizes (empty, small, bigger than the arena's first size) and however their flows
        /// interleave, a closed segment holds each flow's packets in the order they came, flows in id order
        /// after the packets of no flow, with each flow's counts summed over exactly its packets.
        #[test]
        fn a_segment_holds_each_flows_packets_in_order(
            packets in proptest::collection::vec((0usize..7, 0usize..6, proptest::bool::ANY, 0u8..=0xff), 1..400),
        ) {
            let meta = ethernet_meta(262_144);
            let dir = std::env::temp_dir().join(format!("pcaptool-seg-prop-{}-{:?}", std::process::id(), std::thread::current().id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut w = SegmentWriter::new(meta, "x");
            // Flow f (1..7, id 100 - f so that ids and arrival orders differ; 0: no flow).
            let tuple = |f: usize| FlowTuple { lo: 1, hi: 2 + f as u128, lo_port: 1, hi_port: f as u16, vlan: 0, proto: 17, v6: 0 };
            let sizes = [0usize, 1, 60, 1514, 9000, 70_000];
            // Per flow: position, timestamp, wire length and bytes of each packet put.
            type Put = (u64, u64, u32, Vec<u8>);
            let mut want: Vec<Vec<Put>> = vec![Vec::new(); 7];
            let mut sides = vec![[(0u64, 0u64, 0u64, 0u8); 2]; 7];
            for (seq, &(f, size, orig, flags)) in packets.iter().enumerate() {
                let seq = 10 + 3 * seq as u64;
                let data: Vec<u8> = (0..sizes[size]).map(|i| (i as u64 * 7 + seq) as u8).collect();
                let ts = 1_700_000_000_123_456_789 + seq * 1_000_001;
                let wirelen = data.len() as u32 + 4;
                let payload = (seq % 1000) as u32;
                let flow = (f != 0).then(|| (100 - f as u64, tuple(f), true, ConnState::from_code(seq as u8 % 8).unwrap()));
                w.push(&PacketIn { seq, ts_ns: ts, wirelen, data: &data, flow, fields_in_key: true, from_orig: orig, payload, flags, iface: 0 });
                want[f].push((seq, ts, wirelen, data));
                let side = &mut sides[f][usize::from(!orig)];
                side.0 += 1;
                side.1 += u64::from(wirelen);
                side.2 += u64::from(payload);
                side.3 |= flags;
            }
            let stage1 = w.close(&dir, 0).expect("close");
            proptest::prop_assert_eq!(stage1.packets, packets.len() as u64);
            let (data_path, index_path) = segment_paths(&dir, 0);
            let seg = Segment::open(index_path).expect("open");
            let s2 = seg.stage2().expect("stage 2");
            let mut buf = Vec::new();
            let mut offset = 24;
            let mut ids = Vec::new();
            // The packets of no flow come in groups (each in the order they came), which together are all.
            let mut no_flow = Vec::new();
            for e in s2.entries().expect("entries") {
                proptest::prop_assert_eq!(e.data_offset, offset);
                offset += e.data_len;
                ids.push(e.flow.id);
                let f = if e.flow.id == u64::MAX { 0 } else { (100 - e.flow.id) as usize };
                let mut got = Vec::new();
                seg.read_flow(&s2, &e, &mut buf, &mut |p| got.push((p.seq, p.ts_ns, p.wirelen, p.data.to_vec())))
                    .expect("read");
                proptest::prop_assert!(got.is_sorted_by_key(|p| p.0));
                if f == 0 {
                    no_flow.extend(got);
                    continue;
                }
                proptest::prop_assert!(got == want[f], "flow {}: {} packets back, {} put", f, got.len(), want[f].len());
                if f != 0 {
                    let [o, r] = sides[f];
                    let side = |s: &Side| (s.packets, s.bytes, s.payload, s.flags);
                    proptest::prop_assert_eq!((side(&e.flow.orig), side(&e.flow.resp)), (o, r));
                    let last = packets.iter().enumerate().rev().find(|p| p.1.0 == f).map(|p| 10 + 3 * p.0 as u64);
                    proptest::prop_assert_eq!(Some(e.flow.state), last.and_then(|s| ConnState::from_code(s as u8 % 8)));
                    proptest::prop_assert_eq!((e.flow.first_ns, e.flow.last_ns), (want[f][0].1, want[f][want[f].len() - 1].1));
                }
            }
            no_flow.sort_by_key(|p| p.0);
            proptest::prop_assert!(no_flow == want[0], "no flow: {} packets back, {} put", no_flow.len(), want[0].len());
            proptest::prop_assert_eq!(offset, std::fs::metadata(&data_path).expect("data").len());
            let mut sorted = ids.clone();
            sorted.sort_by_key(|&id| if id == u64::MAX { 0 } else { id + 1 });
            proptest::prop_assert_eq!(ids, sorted);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// An arena doubles up to `ARENA_QUARTERS`, then grows by a quarter, and always by at least what is needed.
    #[test]
    fn arenas_double_then_grow_by_quarters() {
        assert_eq!(grown(0, 10), ARENA_MIN);
        assert_eq!(grown(ARENA_MIN, 1), 2 * ARENA_MIN);
        assert_eq!(grown(ARENA_QUARTERS / 2, 1), ARENA_QUARTERS);
        assert_eq!(grown(ARENA_QUARTERS, 1), ARENA_QUARTERS + ARENA_QUARTERS / 4);
        assert_eq!(grown(ARENA_QUARTERS, ARENA_QUARTERS), 2 * ARENA_QUARTERS);
        // From an empty arena to 256 MiB, the last size is under 1.25 times what was needed.
        let (mut len, need) = (0, 256 << 20);
        while len < need {
            len = grown(len, 1);
        }
        assert!(len * 4 < need * 5, "{len} bytes for {need}");
    }

    /// A reserved writer holds its packets where the reservation put them: pushing within it moves no buffer
    /// (so no page is touched for the first time), and each packet takes what `Ingest::reserve` documents.
    #[test]
    fn a_reserved_writer_pushes_without_moving_its_buffers() {
        let mut spare = Spare::default();
        spare.touch(20_000);
        assert!(spare.buf.len() >= 20_000 && spare.used == 0);
        let data_at = spare.buf.as_ptr();
        let meta = ethernet_meta(65535);
        let mut w = SegmentWriter::with_spare(meta, "x", spare);
        let frame = [0u8; 60];
        for i in 0..100u64 {
            w.push(&no_flow_packet(i, i, &frame));
        }
        assert_eq!(w.packets(), 100);
        assert_eq!(w.data_bytes(), 24 + 100 * 76);
        // The packets' records and an item beside each.
        assert_eq!(w.memory_bytes(), 100 * (76 + (HEAD + ENTRY) as u64));
        assert_eq!(w.mem.buf.as_ptr(), data_at);
        // Touching again keeps memory that is already larger.
        let mut again = std::mem::take(&mut w.mem);
        again.touch(10);
        assert!(again.buf.len() >= 20_000);
    }
}

#[cfg(test)]
mod no_flow_tests {
    use super::*;
    use crate::segment::Segment;
    use crate::stage2;
    use pcaptool_packet::{Field, LinkType, Need, Pred, TsPrecision};

    /// An ARP request from `spa` for `tpa`.
    fn arp(spa: u32, tpa: u32) -> Vec<u8> {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&spa.to_be_bytes());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa.to_be_bytes());
        f
    }

    /// The packets of no flow go into groups by protocol and address pair (hashed together past 256), and a
    /// needle reads only the groups whose summary allows it: exactly the packets a scan finds, and with fewer
    /// keys than groups, only its own group's packets.
    #[test]
    fn a_needle_reads_only_its_groups_of_packets_of_no_flow() {
        for pairs in [200u32, 400] {
            needles_on_packets_of_no_flow(pairs);
        }
    }

    fn needles_on_packets_of_no_flow(pairs: u32) {
        let dir = std::env::temp_dir().join(format!("pcaptool-no-flow-groups-{}-{pairs}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let meta = StoreMeta {
            linktype: LinkType::ETHERNET,
            snaplen: 65535,
            precision: TsPrecision::Nano,
            swapped: false,
            iface: 0,
        };
        let mut w = SegmentWriter::new(meta, "x");
        let host = |i: u32| u32::from_be_bytes([10, 1, (i >> 8) as u8, i as u8]);
        // LLDP frames (no address), then `pairs` pairs each asking 3 times, interleaved.
        let mut put = Vec::new();
        for round in 0..3u32 {
            let mut lldp = vec![0x01, 0x80, 0xc2, 0, 0, 0x0e, 2, 0, 0, 0, 0, 1, 0x88, 0xcc];
            lldp.resize(60, round as u8);
            put.push(lldp);
            for i in 0..pairs {
                put.push(arp(host(i), host(i + 1000)));
            }
        }
        for (seq, data) in put.iter().enumerate() {
            let seq = 5 + 2 * seq as u64;
            w.push(&tests::no_flow_packet(seq, 1_700_000_000_000_000_000 + seq, data));
        }
        w.close(&dir, 0).unwrap();
        let seg = Segment::open(segment_paths(&dir, 0).1).unwrap();
        let s2 = seg.stage2().unwrap();
        let all = s2.entries().unwrap();
        let groups = (pairs as usize + 1).min(stage2::MAX_NO_FLOW_GROUPS);
        assert_eq!(all.len(), groups, "one group per key, up to the limit");
        assert_eq!(s2.no_flow_packets().unwrap(), put.len() as u64);
        let mut buf = Vec::new();
        let read = |entries: &[stage2::FlowEntry], buf: &mut Vec<u8>| {
            let mut got = Vec::new();
            for e in entries {
                assert!(e.is_no_flow());
                seg.read_flow(&s2, e, buf, &mut |p| got.push((p.seq, p.data.to_vec()))).unwrap();
            }
            got.sort();
            got
        };
        assert_eq!(
            read(&all, &mut buf),
            put.iter().enumerate().map(|(s, d)| (5 + 2 * s as u64, d.clone())).collect::<Vec<_>>()
        );
        for i in [0u32, 7, 198, 199, 254, 255, 399, 1000, 1199, 5000] {
            let a = u128::from(host(i));
            let need = Need::or(vec![
                Need::Pred(Pred::range(Field::ArpSpa, a, a)),
                Need::Pred(Pred::range(Field::ArpTpa, a, a)),
            ]);
            let got = read(&s2.candidates(&need).unwrap(), &mut buf);
            let want: Vec<(u64, Vec<u8>)> = put
                .iter()
                .enumerate()
                .filter(|(_, d)| {
                    d.len() == 42 && (d[28..32] == host(i).to_be_bytes() || d[38..42] == host(i).to_be_bytes())
                })
                .map(|(s, d)| (5 + 2 * s as u64, d.clone()))
                .collect();
            let matching: Vec<_> = got.iter().filter(|g| want.contains(g)).cloned().collect();
            assert_eq!(matching, want, "host {i}, {pairs} pairs");
            if groups > pairs as usize {
                assert_eq!(got, want, "host {i} reads only its group");
            }
        }
        let lldp = Need::Pred(Pred::range(Field::LinkProto, 0x88cc, 0x88cc));
        assert_eq!(read(&s2.candidates(&lldp).unwrap(), &mut buf).len(), 3, "LLDP: its group alone");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
