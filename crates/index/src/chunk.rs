//! A chunk of the index: its parts (time pages, block offsets, key table columns, flows, the lane and shape
//! sequences), each checked the first time a query uses it, and a field condition answered over its packets.

use std::sync::{Arc, Mutex, OnceLock};

use pcaptool_packet::{Field, Need, PacketFields, Pred};

use crate::file::DirEntry;
use crate::format::{BLOCK, Cursor, Damage, EliasFano, KeySet, PAGE, Part, crc32};
use crate::keys::{
    KEY_FIELDS, KeyMemo, KeyTable, LEN_BOUNDS, class_decided, class_may, code_may, key_and_flags, len_class,
};
use crate::lanes::Flows;
use crate::shapes::{ShapeView, Shapes};
use crate::tree::Tree;

/// Flags codes: missing, unknown, and the 256 flag bytes.
pub(crate) const FLAG_CODES: u32 = 2 + 256;
/// Symbols of the shape sequence: `8·flags code + length class`.
pub(crate) const SHAPES: usize = FLAG_CODES as usize * LEN_BOUNDS.len();

/// The shape symbol of a packet: its TCP flags code and wire-length class.
pub(crate) fn shape_of(flags: u32, class: u8) -> u32 {
    flags * LEN_BOUNDS.len() as u32 + u32::from(class)
}

/// Parts of a chunk, in order: time pages, block offsets, the key table's columns, flows, lanes, shapes.
pub(crate) const PARTS: usize = 2 + KEY_FIELDS.len() + 3;
/// Bytes of a chunk's head: fixed fields, then the part table.
pub(crate) const CHUNK_HEAD: usize = 32 + 16 * PARTS;

/// A lazily read part: its bytes, checked and parsed the first time they are used.
#[derive(Debug)]
pub(crate) struct Lazy<'a, T> {
    pub(crate) part: Part<'a>,
    pub(crate) value: OnceLock<Result<T, Damage>>,
}

impl<'a, T> Lazy<'a, T> {
    pub(crate) fn new(part: Part<'a>) -> Lazy<'a, T> {
        Lazy { part, value: OnceLock::new() }
    }

    pub(crate) fn get(&self, what: &str, parse: impl FnOnce(&'a [u8]) -> Result<T, String>) -> Result<&T, Damage> {
        self.value
            .get_or_init(|| {
                let b = self.part.get(what)?;
                parse(b).map_err(|why| self.part.damage(what, why))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    pub(crate) fn loaded(&self) -> Option<&T> {
        self.value.get().and_then(|r| r.as_ref().ok())
    }
}

/// Where a walk to packet `i` of a chunk goes on from: the record after the last packet read (`at`: its offset
/// and position), when that is in `i`'s block and not past `i`; `None`: from the block's first record.
pub(crate) fn resume(at: Option<(u64, usize)>, i: usize) -> Option<(u64, usize)> {
    at.filter(|&(_, j)| j <= i && j / BLOCK == i / BLOCK)
}

/// Blocks up to this many bytes are read whole by [`IndexView::read_packets_at`].
pub(crate) const WHOLE_BLOCK_READ: usize = 16 << 10;

/// At most this many bytes are read at once for a run of adjacent blocks by [`IndexView::read_packets_at`].
pub(crate) const RUN_READ: usize = 64 << 10;

/// One chunk of an index.
#[derive(Debug)]
pub struct ChunkView<'a> {
    pub(crate) n: usize,
    pub(crate) rows: usize,
    pub(crate) first_packet: u64,
    pub(crate) base: u64,
    pub(crate) pages: Lazy<'a, &'a [u8]>,
    /// Stream offset of every block's first record, minus `base`.
    pub(crate) blocks: Lazy<'a, EliasFano<'a>>,
    pub(crate) keys: KeyTable<'a>,
    pub(crate) flows: Lazy<'a, Flows<'a>>,
    /// `2·lane + direction` of every packet.
    pub(crate) lanes: Lazy<'a, Tree<'a>>,
    /// Shape (TCP flags code, wire-length class) of every packet (`shapes.rs`).
    pub(crate) shapes: Lazy<'a, Shapes<'a>>,
    /// Whether the shapes are grouped by lane symbol (version 6) rather than in time order.
    pub(crate) shapes_by_lane: bool,
    pub(crate) t_min: u64,
    pub(crate) t_max: u64,
    /// Key truth tables of recent predicates (planning and selecting ask for the same ones).
    pub(crate) cache: Mutex<Vec<(Pred, Arc<KeySet>)>>,
    /// What the last selection driven by keys learnt of the packets it found, by position: checking their
    /// shapes, and their keys when they are read, then needs no walk of the lane sequence. These are facts of
    /// the index, so a later query may use them whatever it selects.
    pub(crate) selected: Mutex<Vec<Known>>,
}

/// What deciding one packet has looked up so far, each at most once: what selecting by key learnt of it, and its key.
#[derive(Default)]
pub(crate) struct Memo {
    pub(crate) known: Option<Option<Known>>,
    pub(crate) key: Option<Option<usize>>,
}

impl Memo {
    pub(crate) fn known(&mut self, chunk: &ChunkView<'_>, i: usize) -> Option<Known> {
        *self.known.get_or_insert_with(|| chunk.known(i))
    }
}

/// A packet found through its key: its position in the chunk, its key, its lane symbol and the occurrences of that
/// symbol before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Known {
    pub(crate) pos: u32,
    pub(crate) key: u32,
    pub(crate) sym: u32,
    pub(crate) rank: u32,
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl<'a> ChunkView<'a> {
    /// Reads a chunk's head (its checksum is the directory's) and locates its parts.
    pub(crate) fn parse(b: &'a [u8], e: &DirEntry, version: u16) -> Result<ChunkView<'a>, String> {
        let head = b.get(..CHUNK_HEAD).ok_or("the chunk is shorter than its head")?;
        if crc32(head) != e.crc {
            return Err("chunk head checksum mismatch".into());
        }
        let mut c = Cursor::new(head);
        let n = c.u32()? as usize;
        let rows = c.u32()? as usize;
        let first_packet = c.u64()?;
        let base = c.u64()?;
        c.u32()?;
        let parts = c.u32()? as usize;
        if n != e.packets as usize || first_packet != e.first_packet {
            return Err("chunk head differs from the directory".into());
        }
        if parts != PARTS {
            return Err(format!("{parts} parts, expected {PARTS}"));
        }
        if rows > n {
            return Err(format!("{rows} key table rows for {n} packets"));
        }
        let mut list = Vec::with_capacity(PARTS);
        let mut next = CHUNK_HEAD;
        for i in 0..PARTS {
            let (off, len, crc) = (c.u32()? as usize, c.u32()? as usize, c.u32()?);
            c.u32()?;
            if off != next || off.checked_add(len).is_none_or(|end| end > b.len()) {
                return Err(format!("part {i} at byte {off} ({len} bytes) does not follow the previous one"));
            }
            next = (off + len).next_multiple_of(8);
            list.push(Part::new(&b[off..off + len], e.offset + off as u64, crc));
        }
        if next != b.len() {
            return Err("the parts do not tile the chunk".into());
        }
        let mut it = list.into_iter();
        let mut take = || it.next().expect("PARTS parts");
        let pages = Lazy::new(take());
        let blocks = Lazy::new(take());
        let columns: Vec<Part<'a>> = (0..KEY_FIELDS.len()).map(|_| take()).collect();
        let flows = Lazy::new(take());
        // The two sequences are PTWV structures, checked by their own checksum when loaded.
        let lanes = Lazy::new(take().with_own_checksum());
        let shapes = Lazy::new(take().with_own_checksum());
        Ok(ChunkView {
            n,
            rows,
            first_packet,
            base,
            pages,
            blocks,
            keys: KeyTable::new(rows, columns),
            flows,
            lanes,
            shapes,
            shapes_by_lane: version >= 6,
            t_min: e.t_min,
            t_max: e.t_max,
            cache: Mutex::new(Vec::new()),
            selected: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn pages_part(&self) -> Result<&'a [u8], Damage> {
        let (n, t_min, t_max) = (self.n, self.t_min, self.t_max);
        self.pages
            .get("time pages", |b| {
                if b.len() != n.div_ceil(PAGE) * 16 {
                    return Err(format!("{} bytes for {} pages", b.len(), n.div_ceil(PAGE)));
                }
                for p in 0..n.div_ceil(PAGE) {
                    let (lo, hi) = (le64(b, p * 16), le64(b, p * 16 + 8));
                    if lo > hi || lo < t_min || hi > t_max {
                        return Err(format!("time page {p} is outside the chunk's time range"));
                    }
                }
                Ok(b)
            })
            .copied()
    }

    pub(crate) fn blocks_part(&self) -> Result<&EliasFano<'a>, Damage> {
        let want = self.n.div_ceil(BLOCK);
        self.blocks.get("block offsets", |b| {
            let mut c = Cursor::new(b);
            let ef = EliasFano::read(&mut c)?;
            if ef.len() != want || !c.is_empty() {
                return Err(format!("{} offsets in {} bytes for {want} blocks", ef.len(), b.len()));
            }
            Ok(ef)
        })
    }

    pub(crate) fn flows(&self) -> Result<&Flows<'a>, Damage> {
        let (n, rows) = (self.n, self.rows);
        self.flows.get("flows", |b| Flows::read(b, n, rows))
    }

    pub(crate) fn lanes(&self) -> Result<&Tree<'a>, Damage> {
        let n = self.n;
        let flows = self.flows()?;
        let limit = 2 * u64::from(flows.lanes());
        self.lanes.get("lane sequence", |b| {
            let t = Tree::from_bytes(b).map_err(|e| e.to_string())?;
            if t.len() != n {
                return Err(format!("{} symbols for {n} packets", t.len()));
            }
            // A matrix may hold symbols up to its width: each symbol read is checked against the lanes instead.
            if matches!(t, Tree::Huffman(_)) && n > 0 && t.max_symbol() >= limit {
                return Err(format!("symbol {} is past the {} lanes", t.max_symbol(), limit / 2));
            }
            Ok(t)
        })
    }

    pub(crate) fn shapes(&self) -> Result<ShapeView<'_, 'a>, Damage> {
        let n = self.n;
        if !self.shapes_by_lane {
            let shapes = self.shapes.get("shape sequence", |b| Shapes::in_time_order(b, n, SHAPES))?;
            return Ok(shapes.with(None));
        }
        let lanes = self.lanes()?;
        let lane_symbols = 2 * self.flows()?.lanes() as usize;
        let shapes = self.shapes.get("shape sequence", |b| Shapes::by_lane(b, lanes, lane_symbols, SHAPES))?;
        Ok(shapes.with(Some(lanes)))
    }

    /// Checks every part of the chunk (for callers that want a whole index checked at once).
    pub(crate) fn check(&self) -> Result<(), Damage> {
        self.pages_part()?;
        self.blocks_part()?;
        self.keys.check()?;
        self.flows()?;
        self.lanes()?;
        self.shapes()?;
        Ok(())
    }

    /// The key (`2·row + direction`) of packet `i` (`None`: a damaged lane sequence names no flow); `known`:
    /// what selecting by key learnt of it ([`known`](Self::known)).
    pub(crate) fn key_of_packet(&self, i: usize, known: Option<Known>) -> Result<Option<usize>, Damage> {
        if let Some(k) = known {
            return Ok(Some(k.key as usize));
        }
        let flows = self.flows()?;
        // A query that decoded the shapes into time order has every packet's lane symbol at hand.
        let sym = match self.shapes.loaded().and_then(|s| s.decoded_lane(i)) {
            Some(sym) => sym,
            None => self.lanes()?.access(i),
        };
        let (lane, dir) = (sym / 2, sym as usize % 2);
        Ok(flows.row_at(lane, i).map(|r| 2 * r + dir))
    }

    /// What selecting by key learnt of packet `i`, if it found it (looked up once per packet by the callers of
    /// [`key_of_packet`](Self::key_of_packet) and [`shape_at`](Self::shape_at)).
    pub(crate) fn known(&self, i: usize) -> Option<Known> {
        let selected = self.selected.lock().unwrap_or_else(|e| e.into_inner());
        selected.binary_search_by_key(&(i as u32), |k| k.pos).ok().map(|at| selected[at])
    }

    /// The shape of packet `i` (`None` only where a damaged index places none): through its lane symbol and rank
    /// when selecting by key found them (`known`).
    pub(crate) fn shape_at(&self, i: usize, known: Option<Known>) -> Result<Option<u32>, Damage> {
        let view = self.shapes()?;
        if let Some(k) = known
            && let Some(s) = view.at_lane(i, k.sym, k.rank as usize)
        {
            return Ok(Some(s));
        }
        Ok(view.at(i))
    }

    /// What selecting by key learnt of each of `positions` (ascending), looked up together.
    pub(crate) fn known_many(&self, positions: &[u32]) -> Vec<Option<Known>> {
        let selected = self.selected.lock().unwrap_or_else(|e| e.into_inner());
        let mut at = selected.partition_point(|k| k.pos < positions.first().copied().unwrap_or(0));
        positions
            .iter()
            .map(|&p| {
                while at < selected.len() && selected[at].pos < p {
                    at += 1;
                }
                selected.get(at).filter(|k| k.pos == p).copied()
            })
            .collect()
    }

    /// Whether packet `i` has the key and time the index gives it (and its TCP flags and length class, if the
    /// shape sequence is loaded).
    pub(crate) fn is_packet(&self, i: usize, fields: &PacketFields<'_>, wirelen: u32, ts: u64) -> Result<bool, Damage> {
        self.is_packet_with(i, self.known(i), &mut KeyMemo::default(), fields, wirelen, ts)
    }

    /// [`is_packet`](Self::is_packet) with what selecting learnt of packet `i` (`known`) and the key values
    /// checked before (`memo`).
    pub(crate) fn is_packet_with(
        &self,
        i: usize,
        known: Option<Known>,
        memo: &mut KeyMemo,
        fields: &PacketFields<'_>,
        wirelen: u32,
        ts: u64,
    ) -> Result<bool, Damage> {
        let (lo, hi) = self.page(i / PAGE)?;
        if !(lo..=hi).contains(&ts) {
            return Ok(false);
        }
        let Some(k) = self.key_of_packet(i, known)? else { return Ok(false) };
        // (The packet's fields read once for its key and its flags.)
        let (key, flags) = key_and_flags(fields);
        if !self.keys.is_key_with(k, &key, memo)? {
            return Ok(false);
        }
        if self.shapes.loaded().is_some() {
            return Ok(self.shape_at(i, known)? == Some(shape_of(flags, len_class(wirelen))));
        }
        Ok(true)
    }

    /// Packets in the chunk.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the chunk is empty (never, for a chunk of a valid index).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Index in the trace of the chunk's first packet.
    pub fn first_packet(&self) -> u64 {
        self.first_packet
    }

    /// Key ids of the chunk: two per row of its key table (a flow both ways).
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn pages(&self) -> usize {
        self.n.div_ceil(PAGE)
    }

    pub(crate) fn page(&self, p: usize) -> Result<(u64, u64), Damage> {
        let b = self.pages_part()?;
        Ok((le64(b, p * 16), le64(b, p * 16 + 8)))
    }

    /// Stream offset of the first record of block `b`.
    pub(crate) fn block_offset(&self, b: usize) -> Result<u64, Damage> {
        Ok(self.base.saturating_add(self.blocks_part()?.get(b)))
    }

    /// Which keys may satisfy `p`, remembered for the next asks.
    pub(crate) fn key_truth(&self, p: &Pred) -> Result<Arc<KeySet>, Damage> {
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, t)) = cache.iter().find(|(q, _)| q == p) {
                return Ok(t.clone());
            }
        }
        let t = Arc::new(self.keys.eval(p)?);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 64 {
            cache.remove(0);
        }
        cache.push((*p, t.clone()));
        Ok(t)
    }

    /// `need` prepared for this chunk: truth tables per key and per shape; time predicates by their index in
    /// `time_preds`.
    pub(crate) fn prepare(&self, need: &Need, time_preds: &[Pred]) -> Result<Prep, Damage> {
        self.prepare_in(need, time_preds, None)
    }

    /// [`prepare`](Self::prepare) where only the keys of `domain` matter: the caller combines the result with
    /// `domain` by `and`, so a key condition need only be right on `domain`. Conjunctions narrow the domain as
    /// they go, so that after a needle (`host X`) the broad conditions beside it (`tcp`, `port 443`) are checked on
    /// its few keys instead of scanning their columns.
    pub(crate) fn prepare_in(&self, need: &Need, time_preds: &[Pred], domain: Option<&KeySet>) -> Result<Prep, Damage> {
        Ok(match need {
            Need::All => Prep::All,
            Need::Pred(p) => match p.field {
                Field::Time => Prep::Time(time_preds.iter().position(|t| t == p).unwrap_or(usize::MAX)),
                Field::TcpFlags => Prep::Shapes(Arc::new(
                    (0..SHAPES as u32).map(|s| code_may(s / 8, p, self.keys.cut_fails)).collect(),
                )),
                Field::WireLen => Prep::Shapes(Arc::new((0..SHAPES as u32).map(|s| class_may(s % 8, p)).collect())),
                f if KEY_FIELDS.contains(&f) => match domain {
                    Some(d) if d.count().saturating_mul(16) < self.keys.len() => {
                        Prep::Keys(Arc::new(self.keys.eval_in(p, d)?))
                    }
                    _ => Prep::Keys(self.key_truth(p)?),
                },
                _ => Prep::All,
            },
            Need::And(v) => {
                let mut parts = Vec::with_capacity(v.len());
                let mut narrowed: Option<KeySet> = domain.cloned();
                for n in v {
                    let p = self.prepare_in(n, time_preds, narrowed.as_ref())?;
                    if let Prep::Keys(t) = &p {
                        match &mut narrowed {
                            Some(d) => d.combine(t, true),
                            None => narrowed = Some((**t).clone()),
                        }
                    }
                    parts.push(p);
                }
                fold(parts, true)
            }
            Need::Or(v) => {
                fold(v.iter().map(|n| self.prepare_in(n, time_preds, domain)).collect::<Result<_, _>>()?, false)
            }
        })
    }

    /// The flows of the keys `truth` accepts: `(key, lane symbol, start, end)`.
    pub(crate) fn key_spans(&self, truth: &KeySet) -> Result<Vec<(usize, u32, usize, usize)>, Damage> {
        let flows = self.flows()?;
        if truth.count() > 64 {
            flows.index_lanes();
        }
        Ok(truth
            .iter()
            .filter_map(|k| {
                let row = k / 2;
                let lane = flows.lane(row);
                (lane != u32::MAX && row < flows.rows())
                    .then(|| (k, 2 * lane + (k % 2) as u32, flows.start(row), flows.end(row)))
            })
            .collect())
    }

    /// Packets of the keys `truth` accepts, over the whole chunk. A flow ends where the next of its lane starts,
    /// so the flows of a lane tile it: per lane and direction, a run of consecutive flows whose key is accepted
    /// costs one rank at each end, and a set of many keys costs about as many ranks as it has runs (on real
    /// traffic, `tcp` has about 5,000 runs in a chunk of 65,000 flows).
    fn chunk_count(&self, truth: &KeySet) -> Result<usize, Damage> {
        let (lanes, flows) = (self.lanes()?, self.flows()?);
        let mut total = 0;
        for lane in 0..flows.lanes() {
            let (rows, starts) = flows.lane_rows(lane);
            for d in 0..2 {
                let sym = 2 * lane + d;
                let mut from = None;
                for (&row, &start) in rows.iter().zip(starts) {
                    match (truth.contains(2 * row as usize + d as usize), from) {
                        (true, None) => from = Some(start as usize),
                        (false, Some(a)) => {
                            total += lanes.rank(sym, start as usize).saturating_sub(lanes.rank(sym, a));
                            from = None;
                        }
                        _ => {}
                    }
                }
                if let Some(a) = from {
                    total += lanes.rank(sym, self.n).saturating_sub(lanes.rank(sym, a));
                }
            }
        }
        Ok(total)
    }

    /// Packets in `[l, r)` whose key `truth` accepts.
    pub(crate) fn key_count(&self, truth: &KeySet, l: usize, r: usize) -> Result<usize, Damage> {
        // Over the whole chunk, many keys are counted by runs of flows; a few keys cost two ranks each.
        if l == 0 && r == self.n && truth.count() > self.keys.len() / 4 {
            return self.chunk_count(truth);
        }
        // The lane sequence is loaded (checksummed, its directories computed) only when a key of the chunk matches:
        // a value absent from the chunk costs its key columns alone.
        let spans = self.key_spans(truth)?;
        if spans.is_empty() {
            return Ok(0);
        }
        let lanes = self.lanes()?;
        let mut total = 0;
        for (_, sym, s, e) in spans {
            let (a, b) = (s.max(l), e.min(r));
            if a < b {
                total += lanes.rank(sym, b) - lanes.rank(sym, a);
            }
        }
        Ok(total)
    }

    /// Appends the packets in `[l, r)` whose key `truth` accepts, ascending; with `known`, also what was learnt
    /// of each (its key, lane symbol and rank), in the same order.
    pub(crate) fn key_positions(
        &self,
        truth: &KeySet,
        l: usize,
        r: usize,
        out: &mut Vec<u32>,
        known: Option<&mut Vec<Known>>,
    ) -> Result<(), Damage> {
        let spans = self.key_spans(truth)?;
        if spans.is_empty() {
            return Ok(());
        }
        let lanes = self.lanes()?;
        // Each flow's walk is lifted as soon as it is made (keeping them all first costs a walk's state per flow).
        take_walks(spans.into_iter().filter_map(|span| Walk::new(lanes, span, l, r)), out, known);
        Ok(())
    }

    /// The packets in `[l, r)` of the keys `truth` accepts, counted flow by flow, and while the count stays at
    /// most `max`, each flow walked down the lane sequence to its symbol and kept, to be lifted to its positions
    /// ([`take_walks`]); past `max` the other flows are only counted (a rank at each end, no walk kept), and no
    /// walks are returned (nor when there are more flows than `max`). A value no key of the chunk has loads no
    /// lane sequence.
    pub(crate) fn key_walks(
        &self,
        truth: &KeySet,
        l: usize,
        r: usize,
        max: u64,
    ) -> Result<(u64, Option<Vec<Walk<'_>>>), Damage> {
        let spans = self.key_spans(truth)?;
        if spans.is_empty() {
            return Ok((0, Some(Vec::new())));
        }
        let lanes = self.lanes()?;
        // More flows than `max` seldom have `max` packets or fewer (only a direction a flow never took has
        // none): they are counted without walks.
        let (mut count, mut walks) = (0u64, (spans.len() as u64 <= max).then(Vec::new));
        for span @ (_, sym, s, e) in spans {
            let Some(kept) = walks.as_mut() else {
                let (a, b) = (s.max(l), e.min(r));
                if a < b {
                    count += (lanes.rank(sym, b) - lanes.rank(sym, a)) as u64;
                }
                continue;
            };
            let Some(walk) = Walk::new(lanes, span, l, r) else { continue };
            count += walk.found.len() as u64;
            if count > max {
                walks = None;
            } else if walk.found.len() > 0 {
                kept.push(walk);
            }
        }
        Ok((count, walks))
    }

    /// An upper bound of the packets of `[l, r)` that may satisfy `prep` (rank counts; `truth` answers time).
    pub(crate) fn estimate_in(&self, prep: &Prep, l: usize, r: usize, truth: &[bool]) -> Result<usize, Damage> {
        Ok(match prep {
            Prep::All => r - l,
            Prep::Time(i) => truth.get(*i).is_none_or(|t| *t) as usize * (r - l),
            Prep::Keys(t) => self.key_count(t, l, r)?,
            Prep::Shapes(t) => self.shapes()?.count_in(t, l, r),
            Prep::And(v) => {
                let mut best = r - l;
                for p in v {
                    best = best.min(self.estimate_in(p, l, r, truth)?);
                }
                best
            }
            Prep::Or(v) => {
                let mut sum = 0usize;
                for p in v {
                    sum = sum.saturating_add(self.estimate_in(p, l, r, truth)?);
                }
                sum.min(r - l)
            }
        })
    }

    /// A superset of the packets of `[l, r)` satisfying `prep`, ascending (`None`: all of them).
    /// What a drive by keys learns of the packets it finds is appended to `known`.
    pub(crate) fn drive(
        &self,
        prep: &Prep,
        l: usize,
        r: usize,
        truth: &[bool],
        known: &mut Vec<Known>,
    ) -> Result<Option<Vec<u32>>, Damage> {
        Ok(match prep {
            Prep::All => None,
            Prep::Time(i) => {
                if truth.get(*i).is_none_or(|t| *t) {
                    None
                } else {
                    Some(Vec::new())
                }
            }
            Prep::Keys(t) => {
                let mut out = Vec::new();
                self.key_positions(t, l, r, &mut out, Some(known))?;
                Some(out)
            }
            Prep::Shapes(t) => {
                let mut out = Vec::new();
                self.shapes()?.positions(t, l, r, &mut out);
                Some(out)
            }
            Prep::And(v) => {
                let mut best: Option<(usize, &Prep)> = None;
                for p in v {
                    let e = self.estimate_in(p, l, r, truth)?;
                    if best.is_none_or(|b| e < b.0) {
                        best = Some((e, p));
                    }
                }
                match best {
                    Some((_, p)) => self.drive(p, l, r, truth, known)?,
                    None => None,
                }
            }
            Prep::Or(v) => {
                let mut out = Vec::new();
                for p in v {
                    match self.drive(p, l, r, truth, known)? {
                        Some(x) => out.extend(x),
                        None => return Ok(None),
                    }
                }
                out.sort_unstable();
                out.dedup();
                Some(out)
            }
        })
    }

    /// Whether packet `i` may satisfy `prep` (`truth` answers time predicates for its page).
    pub(crate) fn may(&self, prep: &Prep, i: usize, truth: &[bool], memo: &mut Memo) -> Result<bool, Damage> {
        Ok(match prep {
            Prep::All => true,
            Prep::Time(t) => truth.get(*t).is_none_or(|t| *t),
            // A packet whose lane names no flow (only a damaged sequence has one) may match: it is read and then
            // refused as not the packet the index describes.
            Prep::Keys(t) => {
                let k = match memo.key {
                    Some(k) => k,
                    None => {
                        let known = memo.known(self, i);
                        *memo.key.insert(self.key_of_packet(i, known)?)
                    }
                };
                k.is_none_or(|k| k >= t.len() || t.contains(k))
            }
            // A packet the shapes do not place (only a damaged index has one) may match: it is read and checked.
            Prep::Shapes(t) => {
                let known = memo.known(self, i);
                self.shape_at(i, known)?.is_none_or(|s| t.get(s as usize).copied().unwrap_or(false))
            }
            Prep::And(v) => {
                for p in v {
                    if !self.may(p, i, truth, memo)? {
                        return Ok(false);
                    }
                }
                true
            }
            Prep::Or(v) => {
                for p in v {
                    if self.may(p, i, truth, memo)? {
                        return Ok(true);
                    }
                }
                false
            }
        })
    }

    /// Ranges of pages with the same answers to the time predicates: `(first packet, end, answers)`.
    pub(crate) fn page_ranges(&self, time_preds: &[Pred]) -> Result<Vec<(usize, usize, Vec<bool>)>, Damage> {
        if time_preds.is_empty() {
            return Ok(vec![(0, self.n, Vec::new())]);
        }
        let mut out = Vec::new();
        let mut p = 0;
        while p < self.pages() {
            let truth: Vec<bool> = {
                let pg = self.page(p)?;
                time_preds.iter().map(|t| page_may(pg, t)).collect()
            };
            let mut q = p + 1;
            while q < self.pages() {
                let pg = self.page(q)?;
                if !time_preds.iter().map(|t| page_may(pg, t)).eq(truth.iter().copied()) {
                    break;
                }
                q += 1;
            }
            out.push((p * PAGE, (q * PAGE).min(self.n), truth));
            p = q;
        }
        Ok(out)
    }

    /// The packets (indexes in the chunk, ascending) that may satisfy `need`.
    pub(crate) fn select(&self, need: &Need, time_preds: &[Pred]) -> Result<Vec<u32>, Damage> {
        let prep = self.prepare(need, time_preds)?;
        self.select_prepared(&prep, time_preds)
    }

    /// For planning and selecting at once: the packets that may satisfy `need` as
    /// [`estimate_need`](Self::estimate_need) counts them and, when they are at most `max`, the packets
    /// [`select`](Self::select) selects. A condition on keys alone (a needle: `host X`, `host X and port Y`) is
    /// walked down the lane sequence once for both, where counting and then selecting walk it twice.
    pub(crate) fn estimate_select(
        &self,
        need: &Need,
        time_preds: &[Pred],
        max: u64,
    ) -> Result<(u64, Option<Vec<u32>>), Damage> {
        let prep = self.prepare(need, time_preds)?;
        // (Over a quarter of the keys, `key_count` counts by runs of flows, cheaper than walking each flow.)
        if let Prep::Keys(t) = &prep
            && time_preds.is_empty()
            && t.count() <= self.keys.len() / 4
        {
            let (estimate, walks) = self.key_walks(t, 0, self.n, max)?;
            let Some(walks) = walks else { return Ok((estimate, None)) };
            let (mut out, mut known) = (Vec::new(), Vec::new());
            take_walks(walks, &mut out, Some(&mut known));
            self.keep_known(known);
            return Ok((estimate, Some(out)));
        }
        let mut estimate = 0u64;
        for (l, r, truth) in self.page_ranges(time_preds)? {
            estimate += self.estimate_in(&prep, l, r, &truth)? as u64;
        }
        if estimate > max {
            return Ok((estimate, None));
        }
        Ok((estimate, Some(self.select_prepared(&prep, time_preds)?)))
    }

    /// Keeps what driving by keys learnt of the packets it found (see `selected`).
    fn keep_known(&self, mut known: Vec<Known>) {
        if !known.is_empty() {
            // (Several drives, under an `or`, each append theirs in order.)
            known.sort_unstable_by_key(|k| k.pos);
            known.dedup_by_key(|k| k.pos);
            *self.selected.lock().unwrap_or_else(|e| e.into_inner()) = known;
        }
    }

    fn select_prepared(&self, prep: &Prep, time_preds: &[Pred]) -> Result<Vec<u32>, Damage> {
        let leaf = !matches!(prep, Prep::And(_) | Prep::Or(_));
        let mut out = Vec::new();
        for (l, r, truth) in self.page_ranges(time_preds)? {
            // What driving by keys learns of the packets it finds is kept (for this range of pages; the last
            // range's stays for reading them): checking them against the other conditions (their shapes) and
            // reading them then need no walks of the lane sequence.
            let mut known = Vec::new();
            let driven = self.drive(prep, l, r, &truth, &mut known)?;
            self.keep_known(known);
            match driven {
                Some(v) if leaf => out.extend(v),
                Some(v) => {
                    if prep.reads_shapes() {
                        self.shapes()?.expect(v.len());
                    }
                    for i in v {
                        if self.may(prep, i as usize, &truth, &mut Memo::default())? {
                            out.push(i);
                        }
                    }
                }
                None => {
                    if prep.reads_shapes() {
                        self.shapes()?.expect(r - l);
                    }
                    for i in l..r {
                        if self.may(prep, i, &truth, &mut Memo::default())? {
                            out.push(i as u32);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The key-level truth of `prep`, when it reads key fields only.
    pub(crate) fn key_level(&self, prep: &Prep) -> Option<KeySet> {
        let n = self.keys.len();
        Some(match prep {
            Prep::All => KeySet::new(n, true),
            Prep::Keys(t) => (**t).clone(),
            Prep::Shapes(_) | Prep::Time(_) => return None,
            Prep::And(v) | Prep::Or(v) => {
                let and = matches!(prep, Prep::And(_));
                let mut acc = KeySet::new(n, and);
                for p in v {
                    acc.combine(&self.key_level(p)?, and);
                }
                acc
            }
        })
    }

    /// Packets known from the index to satisfy `need` (an exact condition), and the candidates whose fields the
    /// index does not know, to be read.
    pub(crate) fn count(&self, need: &Need, time_preds: &[Pred]) -> Result<(u64, Vec<u32>), Damage> {
        // Keys whose fields the condition reads are all known.
        let mut known = KeySet::new(self.keys.len(), true);
        let mut fields = Vec::new();
        need.any_pred(&mut |p| {
            if KEY_FIELDS.contains(&p.field) && !fields.contains(&p.field) {
                fields.push(p.field);
            }
            false
        });
        for f in fields {
            known.combine(&self.keys.known(f)?, true);
        }
        let prep = self.prepare(need, time_preds)?;
        if let Some(may) = self.key_level(&prep) {
            let mut sure = may.clone();
            sure.combine(&known, true);
            let mut unsure = may;
            unsure.subtract(&known);
            let mut maybe = Vec::new();
            self.key_positions(&unsure, 0, self.n, &mut maybe, None)?;
            return Ok((self.key_count(&sure, 0, self.n)? as u64, maybe));
        }
        // Mixed conditions: decide each candidate from its key, shape and page.
        let mut lens_preds = Vec::new();
        need.any_pred(&mut |p| {
            if p.field == Field::WireLen {
                lens_preds.push(*p);
            }
            false
        });
        let reads_flags = need.any_pred(&mut |p| p.field == Field::TcpFlags);
        let decided_page = |pg: (u64, u64)| {
            let (lo, hi) = (u128::from(pg.0), u128::from(pg.1));
            time_preds.iter().all(|p| p.mask == u128::MAX && ((p.lo <= lo && hi <= p.hi) || hi < p.lo || p.hi < lo))
        };
        let (mut sure, mut maybe) = (0u64, Vec::new());
        let candidates = self.select(need, time_preds)?;
        let shapes = if reads_flags || !lens_preds.is_empty() { Some(self.shapes()?) } else { None };
        if let Some(s) = shapes {
            s.expect(candidates.len());
        }
        for i in candidates {
            let i_us = i as usize;
            let facts = self.known(i_us);
            let key_known = self.key_of_packet(i_us, facts)?.is_some_and(|k| known.contains(k));
            let shape = if shapes.is_some() { self.shape_at(i_us, facts)? } else { None };
            let ok = key_known
                && (!reads_flags || shape.is_some_and(|s| s / 8 != 1))
                && lens_preds.iter().all(|p| shape.is_some_and(|s| class_decided(s % 8, p)))
                && decided_page(self.page(i_us / PAGE)?);
            if ok { sure += 1 } else { maybe.push(i) }
        }
        Ok((sure, maybe))
    }

    /// Packets of the chunk that may satisfy `need` as a whole (for planning): key predicates merged as selecting
    /// merges them, time predicates answered by pages.
    pub(crate) fn estimate_need(&self, need: &Need, time_preds: &[Pred]) -> Result<u64, Damage> {
        let prep = self.prepare(need, time_preds)?;
        let mut total = 0u64;
        for (l, r, truth) in self.page_ranges(time_preds)? {
            total += self.estimate_in(&prep, l, r, &truth)? as u64;
        }
        Ok(total)
    }

    /// Packets of the chunk that may satisfy `pred` (for planning).
    pub(crate) fn estimate(&self, pred: &Pred) -> Result<u64, Damage> {
        if pred.field == Field::Time {
            let mut hit = 0;
            for p in 0..self.pages() {
                hit += usize::from(page_may(self.page(p)?, pred));
            }
            return Ok((hit * PAGE).min(self.n) as u64);
        }
        let prep = self.prepare(&Need::Pred(*pred), &[])?;
        Ok(self.estimate_in(&prep, 0, self.n, &[])? as u64)
    }
}

/// One flow's packets in a range of a chunk, walked down the lane sequence to the flow's symbol: counted
/// (`found.len()`), lifted to their positions as they are taken.
pub(crate) struct Walk<'t> {
    key: u32,
    sym: u32,
    /// The symbol's occurrences before the range.
    first: usize,
    found: Box<dyn ExactSizeIterator<Item = usize> + 't>,
}

impl<'t> Walk<'t> {
    /// The walk of a flow `(key, lane symbol, start, end)` (from `key_spans`) over `[l, r)`, if they meet.
    fn new(lanes: &'t Tree<'_>, (key, sym, s, e): (usize, u32, usize, usize), l: usize, r: usize) -> Option<Walk<'t>> {
        let (a, b) = (s.max(l), e.min(r));
        (a < b).then(|| {
            let (first, found) = lanes.ranked_positions(sym, a, b);
            Walk { key: key as u32, sym, first, found }
        })
    }
}

/// Appends the packets of `walks` to `out`, ascending; with `known`, also what was learnt of each (its key, lane
/// symbol and rank), in the same order.
pub(crate) fn take_walks<'t>(
    walks: impl IntoIterator<Item = Walk<'t>>,
    out: &mut Vec<u32>,
    mut known: Option<&mut Vec<Known>>,
) {
    let start = out.len();
    let known_start = known.as_deref().map_or(0, Vec::len);
    let mut runs = 0;
    for Walk { key, sym, first, found } in walks {
        let before = out.len();
        out.extend(found.map(|i| i as u32));
        if let Some(known) = known.as_deref_mut() {
            // The span's packets are the symbol's occurrences from its rank at the range's start on.
            known.extend(out[before..].iter().zip(first as u32..).map(|(&pos, rank)| Known { pos, key, sym, rank }));
        }
        runs += usize::from(out.len() > before);
    }
    if runs > 1 {
        match known {
            Some(known) => {
                known[known_start..].sort_unstable_by_key(|k| k.pos);
                for (p, k) in out[start..].iter_mut().zip(&known[known_start..]) {
                    *p = k.pos;
                }
            }
            None => out[start..].sort_unstable(),
        }
    }
}

/// Whether a page whose timestamps span `[lo, hi]` may hold a packet satisfying the time predicate `p`.
pub(crate) fn page_may((lo, hi): (u64, u64), p: &Pred) -> bool {
    p.mask != u128::MAX || (u128::from(lo) <= p.hi && p.lo <= u128::from(hi))
}

/// A condition prepared for one chunk.
#[derive(Debug)]
pub(crate) enum Prep {
    All,
    /// Truth per key id.
    Keys(Arc<KeySet>),
    /// Truth per shape symbol.
    Shapes(Arc<Vec<bool>>),
    /// The time predicate with this index.
    Time(usize),
    And(Vec<Prep>),
    Or(Vec<Prep>),
}

impl Prep {
    /// Whether deciding a packet may read its shape.
    pub(crate) fn reads_shapes(&self) -> bool {
        match self {
            Prep::Shapes(_) => true,
            Prep::And(v) | Prep::Or(v) => v.iter().any(Prep::reads_shapes),
            Prep::All | Prep::Keys(_) | Prep::Time(_) => false,
        }
    }
}

/// A conjunction (`and`) or disjunction of prepared conditions, with its key conditions merged into one truth
/// table and its shape conditions into another (a packet's key satisfies them all, or one of them, exactly when
/// it satisfies the merged one), so that each sequence is walked once instead of once per field (`host X` is four
/// key conditions).
pub(crate) fn fold(parts: Vec<Prep>, and: bool) -> Prep {
    let mut keys: Option<KeySet> = None;
    let mut shapes: Option<Vec<bool>> = None;
    let mut rest = Vec::new();
    for p in parts {
        match p {
            Prep::Keys(t) => match &mut keys {
                None => keys = Some((*t).clone()),
                Some(m) => m.combine(&t, and),
            },
            Prep::Shapes(t) => match &mut shapes {
                None => shapes = Some(t.to_vec()),
                Some(m) => m.iter_mut().zip(t.iter()).for_each(|(a, b)| if and { *a &= *b } else { *a |= *b }),
            },
            p => rest.push(p),
        }
    }
    if let Some(m) = shapes {
        rest.insert(0, Prep::Shapes(Arc::new(m)));
    }
    if let Some(m) = keys {
        rest.insert(0, Prep::Keys(Arc::new(m)));
    }
    match (rest.len(), and) {
        (1, _) => rest.pop().unwrap_or(Prep::All),
        (_, true) => Prep::And(rest),
        (_, false) => Prep::Or(rest),
    }
}
