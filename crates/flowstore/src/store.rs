//! A store: a directory of segments, imported into and queried in the original packet order.

use std::path::{Path, PathBuf};

use pcaptool_packet::{FileFormat, LinkType, MappedFile, Need, TraceReader, precision_for};
use rustc_hash::FxHashMap;

use crate::error::StoreError;
use crate::flow::{Flow, FlowPacket, FlowTracker, SlotCache, read_flow};
use crate::segment::{PacketIn, Record, Segment, SegmentWriter, Spare, StoreMeta, StoredPacket, segment_paths};

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// A segment closes once its data file would exceed this many bytes (default 256 MiB), or once its
    /// packets take twice that in memory (each flow's packets are held in chunks of their own, whose unused
    /// ends can add up to about as much as the packets when most flows have one or two small packets).
    pub segment_bytes: u64,
    /// Or once it holds this many packets (default 4,194,304).
    pub segment_packets: u64,
    /// After the import, the oldest segments are removed whole until the store is at most this big.
    pub max_size: Option<u64>,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions { segment_bytes: 256 << 20, segment_packets: 1 << 22, max_size: None }
    }
}

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportStats {
    /// Packets stored.
    pub packets: u64,
    /// Segments written.
    pub segments: u32,
    /// Segments removed for `--max-size`.
    pub removed: u32,
    /// Damage that ended the trace early (the packets before it were stored).
    pub damage: Option<pcaptool_packet::TraceError>,
}

/// What a query read.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueryStats {
    /// Segments in the store.
    pub segments: u32,
    /// Segments stage 1 let through.
    pub stage1_passed: u32,
    /// Flows whose packets were read.
    pub flows_read: u64,
    /// Packets read.
    pub packets_read: u64,
    /// Bytes of data read.
    pub bytes_read: u64,
}

/// How many packets ahead of each push [`Ingest::prefetch`] is best called.
pub const PREFETCH_AHEAD: usize = 16;

/// Hints in flight: each is worked on in steps 4 pushes apart (see [`Ingest::prefetch`]).
const HINTS: usize = 16;

#[derive(Clone, Copy, Debug, Default)]
struct Hint {
    /// Its packet's flow hash (`None`: no flow).
    hash: Option<u64>,
    /// The flow table entry its index slot names.
    entry: Option<usize>,
    /// The segment writer and slot its entry's cache names (writer 0: none).
    writer: u64,
    slot: u32,
}

#[derive(Debug, Default)]
struct Hints {
    ring: [Hint; HINTS],
    /// Hints given.
    n: usize,
}

/// Packets being added to a store, from a trace or a capture: one open segment per kind of packet (interface,
/// link type, snapshot length, precision, byte order), each closed and made visible at its bound, at
/// [`flush`](Self::flush) and at [`finish`](Self::finish). Packets of one flow from one interface stand together;
/// every packet keeps its position in the order it was pushed.
#[derive(Debug)]
pub struct Ingest<'s> {
    store: &'s mut Store,
    opts: ImportOptions,
    tracker: FlowTracker,
    first_flow: u64,
    seq: u64,
    number: u32,
    writers: Vec<SegmentWriter>,
    /// Buffers of the last closed segment, for the next one.
    spare: Spare,
    hints: Hints,
    /// Packets per interface lost with segments that could not be written.
    lost: Vec<(u32, u64)>,
    packets: u64,
    segments: u32,
}

impl Ingest<'_> {
    /// Adds a packet of kind `meta` from the interface named `iface_name`; closes its segment when full.
    pub fn push(
        &mut self,
        meta: StoreMeta,
        iface_name: &str,
        ts_ns: u64,
        wirelen: u32,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let i = match self.writers.iter().position(|w| w.meta() == meta) {
            Some(i) => i,
            None => {
                let spare = std::mem::take(&mut self.spare);
                self.writers.push(SegmentWriter::with_spare(meta, iface_name, spare));
                self.writers.len() - 1
            }
        };
        let r = read_flow(meta.linktype, data);
        let mut no_flow = SlotCache::default();
        let (flow, from_orig, cache) = match r.flow {
            Some((tuple, dir)) => {
                let p = FlowPacket { tuple, dir, payload: r.payload, flags: r.flags, wirelen, ts_ns };
                let (e, from_orig) = self.tracker.account(&p);
                (Some((e.id, tuple, e.orig_is_lo, e.state)), from_orig, &mut e.cache)
            }
            None => (None, true, &mut no_flow),
        };
        let w = &mut self.writers[i];
        w.push_cached(
            &PacketIn {
                seq: self.seq,
                ts_ns,
                wirelen,
                data,
                flow,
                fields_in_key: r.plain,
                from_orig,
                payload: r.payload.min(u64::from(u32::MAX)) as u32,
                flags: r.flags,
            },
            cache,
        );
        self.seq += 1;
        self.packets += 1;
        if w.data_bytes() >= self.opts.segment_bytes
            || w.packets() as u64 >= self.opts.segment_packets
            || w.memory_bytes() >= self.opts.segment_bytes.saturating_mul(2)
        {
            let w = self.writers.swap_remove(i);
            self.close(w)?;
        } else if self.writers.len() > 1 && self.pending_bytes() > self.opts.segment_bytes.saturating_mul(2) {
            // Many kinds at once: memory stays within two segments' worth, the biggest closes early.
            let big = (0..self.writers.len()).max_by_key(|&j| self.writers[j].data_bytes()).unwrap_or(i);
            let w = self.writers.swap_remove(big);
            self.close(w)?;
        }
        Ok(())
    }

    fn close(&mut self, w: SegmentWriter) -> Result<(), StoreError> {
        if w.packets() > 0 {
            let (iface, n) = (w.meta().iface, w.packets() as u64);
            if let Err(e) = w.close_keeping(&self.store.dir, self.number, &mut self.spare) {
                self.lose(iface, n);
                return Err(e);
            }
            let (data, index) = segment_paths(&self.store.dir, self.number);
            self.store.segments.push(Segment::open(data, index)?);
            self.number += 1;
            self.segments += 1;
        }
        Ok(())
    }

    fn lose(&mut self, iface: u32, n: u64) {
        match self.lost.iter_mut().find(|l| l.0 == iface) {
            Some(l) => l.1 += n,
            None => self.lost.push((iface, n)),
        }
    }

    /// Closes every open segment, so that queries see every packet pushed so far. If one cannot be written,
    /// the error is returned and its packets (and those of the segments after it) are counted in
    /// [`unsaved`](Self::unsaved).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        // Oldest first: the segment holding the earliest packet gets the lowest number.
        self.writers.sort_by_key(|w| w.first_seq());
        let mut result = Ok(());
        for w in std::mem::take(&mut self.writers) {
            if result.is_err() {
                self.lose(w.meta().iface, w.packets() as u64);
                continue;
            }
            result = self.close(w);
        }
        result
    }

    /// Packets of interface `iface` pushed but not in a completed segment: held in open segments, or lost with a
    /// segment that could not be written.
    pub fn unsaved(&self, iface: u32) -> u64 {
        let open: u64 = self.writers.iter().filter(|w| w.meta().iface == iface).map(|w| w.packets() as u64).sum();
        open + self.lost.iter().filter(|l| l.0 == iface).map(|l| l.1).sum::<u64>()
    }

    /// A hint that a packet of link type `linktype` with bytes `data` will be [pushed](Self::push) soon, so
    /// that the push waits less for memory. A caller holding several packets calls it [`PREFETCH_AHEAD`]
    /// packets ahead of each push (a capture's writer does). It changes nothing that a push or query sees.
    ///
    /// With many flows interleaved, a push reads three places that are rarely in cache: the flow table's index
    /// slot, its entry, and the end of the flow's chunk in the open segment, each found from the one before.
    /// So each hint does one step for each of four packets: for this one, it parses and hashes the packet and
    /// starts loading its index slot; for the one hinted 4 calls ago, it reads that slot (loaded by now) and
    /// starts loading the entry it names; 4 calls later, it reads the entry's slot cache and starts loading
    /// the writer's record of the flow's chunk; 4 calls later, where the packet will be written.
    #[inline]
    pub fn prefetch(&mut self, linktype: LinkType, data: &[u8]) {
        let n = self.hints.n;
        self.hints.n = n.wrapping_add(1);
        let at = |back: usize| n.wrapping_sub(back) % HINTS;
        // Step 4, for the packet hinted 12 calls ago.
        let h = self.hints.ring[at(12)];
        if h.writer != 0
            && let Some(w) = self.writers.iter().find(|w| w.id() == h.writer)
        {
            w.prefetch_tail(h.slot);
        }
        // Step 3, for the packet hinted 8 calls ago.
        let h = &mut self.hints.ring[at(8)];
        h.writer = 0;
        if let Some(c) = h.entry.and_then(|e| self.tracker.cache_at(e))
            && let Some(w) = self.writers.iter().find(|w| w.id() == c.writer)
        {
            w.prefetch_slot(c.slot);
            (h.writer, h.slot) = (c.writer, c.slot);
        }
        // Step 2, for the packet hinted 4 calls ago.
        let h = &mut self.hints.ring[at(4)];
        h.entry = h.hash.and_then(|hash| self.tracker.prefetch_entry(hash));
        // Step 1, for this packet.
        let hash = read_flow(linktype, data).flow.map(|(tuple, _)| self.tracker.prefetch(&tuple));
        self.hints.ring[at(0)] = Hint { hash, entry: None, writer: 0, slot: 0 };
    }

    /// Prepares the memory of the next segment: `bytes` for its packets (each takes its pcap record, 16 bytes
    /// and its captured bytes, plus 7 to 16 bytes beside it), written once so that pushing into it never waits
    /// for the kernel to provide a page. A capture calls this before packets arrive (n2disk preallocates so
    /// too); a closed segment's memory goes on to the next, so it stays ready.
    pub fn reserve(&mut self, bytes: usize) {
        self.spare.touch(bytes);
    }

    /// Packets pushed so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Flows begun so far.
    pub fn flows(&self) -> u64 {
        self.tracker.next_id() - self.first_flow
    }

    /// Removes the store's oldest segments whole until it takes at most `max` bytes (see
    /// [`Store::retain_size`]); returns how many.
    pub fn retain_size(&mut self, max: u64) -> Result<u32, StoreError> {
        self.store.retain_size(max)
    }

    /// Bytes held in open segments.
    pub fn pending_bytes(&self) -> u64 {
        self.writers.iter().map(SegmentWriter::data_bytes).sum()
    }

    /// Closes every open segment; returns the packets pushed and the segments written.
    pub fn finish(mut self) -> Result<(u64, u32), StoreError> {
        self.flush()?;
        Ok((self.packets, self.segments))
    }
}

/// Calls `f` with the records `got` (each the index of its segment's mapped data in `maps`) in the store's order;
/// false if `f` asked to stop.
fn in_order(
    maps: &[(&Segment, MappedFile)],
    mut got: Vec<(u32, Record)>,
    f: &mut dyn FnMut(&StoredPacket<'_>) -> bool,
) -> bool {
    got.sort_unstable_by_key(|g| g.1.seq);
    for (m, r) in &got {
        let (seg, data) = &maps[*m as usize];
        let data = &data.bytes()[r.at..r.at + r.len];
        if !f(&StoredPacket { seq: r.seq, ts_ns: r.ts_ns, wirelen: r.wirelen, data, meta: seg.stage1.meta }) {
            return false;
        }
    }
    true
}

/// An open store.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    segments: Vec<Segment>,
    repairs: Vec<String>,
}

fn segment_number(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("seg-")?;
    let (num, ext) = rest.split_once('.')?;
    (num.len() == 6 && num.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (num.parse().ok(), ext))
        .and_then(|(n, e)| Some((n?, e)))
}

impl Store {
    /// Opens the store in `dir`, creating the directory if it does not exist (see [`open`](Self::open)).
    pub fn create(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        Store::open(dir)
    }

    /// Opens the store in `dir`, which must exist. An interrupted segment (files left with a `.tmp` suffix, or an
    /// index whose data file never got its final name) is removed, and said so in [`repairs`](Self::repairs):
    /// segments become visible only once complete, so no completed one is lost.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        if !dir.is_dir() {
            return Err(StoreError::Refused(format!(
                "{} is not a store directory: create one with `pcaptool import TRACE --store {}`",
                dir.display(),
                dir.display()
            )));
        }
        let mut repairs = Vec::new();
        let mut numbers: FxHashMap<u32, (bool, bool)> = FxHashMap::default();
        for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))? {
            let entry = entry.map_err(|e| StoreError::io(dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((n, ext)) = segment_number(name) else { continue };
            match ext {
                "pcap" => numbers.entry(n).or_default().0 = true,
                "ptsx" => numbers.entry(n).or_default().1 = true,
                "pcap.tmp" | "ptsx.tmp" => {
                    std::fs::remove_file(entry.path()).map_err(|e| StoreError::io(entry.path(), e))?;
                    repairs.push(format!("removed {name}, left by an interrupted segment"));
                }
                _ => {}
            }
        }
        let mut nums: Vec<u32> = numbers.keys().copied().collect();
        nums.sort_unstable();
        let mut segments = Vec::new();
        for n in nums {
            let (data, index) = segment_paths(dir, n);
            match numbers[&n] {
                (true, true) => segments.push(Segment::open(data, index)?),
                (false, true) => {
                    std::fs::remove_file(&index).map_err(|e| StoreError::io(&index, e))?;
                    repairs.push(format!(
                        "removed {}: its segment was interrupted before its data file was complete",
                        index.display()
                    ));
                }
                (true, false) => repairs
                    .push(format!("left {} out: it has no index (it was not written by pcaptool)", data.display())),
                (false, false) => {}
            }
        }
        Ok(Store { dir: dir.to_path_buf(), segments, repairs })
    }

    /// What opening the store repaired.
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segments, oldest first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// What the store's packets are: each distinct link type, snapshot length, precision and byte order of its
    /// segments, in order of first appearance (empty while the store is).
    pub fn metas(&self) -> Vec<StoreMeta> {
        let mut v: Vec<StoreMeta> = Vec::new();
        for s in &self.segments {
            if !v.contains(&s.stage1.meta) {
                v.push(s.stage1.meta);
            }
        }
        v
    }

    /// Packets stored.
    pub fn packets(&self) -> u64 {
        self.segments.iter().map(|s| s.stage1.packets).sum()
    }

    /// Starts adding packets after what the store holds (see [`Ingest`]).
    pub fn ingest(&mut self, opts: &ImportOptions) -> Ingest<'_> {
        let seq = self.segments.iter().map(|s| s.stage1.seq_max + 1).max().unwrap_or(0);
        let first_flow = self.segments.iter().map(|s| s.stage1.flow_max.wrapping_add(1)).filter(|&f| f != 0).max();
        let number = self.segments.iter().map(|s| s.stage1.number + 1).max().unwrap_or(0);
        Ingest {
            tracker: FlowTracker::forgetting(first_flow.unwrap_or(0)),
            first_flow: first_flow.unwrap_or(0),
            store: self,
            opts: opts.clone(),
            seq,
            number,
            writers: Vec::new(),
            spare: Spare::default(),
            hints: Hints::default(),
            lost: Vec::new(),
            packets: 0,
            segments: 0,
        }
    }

    /// Imports `trace` after what the store holds. Memory holds at most one segment's packets per kind of
    /// packet (interface, link type, snapshot length, precision, byte order); each segment is complete on disk
    /// when it becomes visible. `progress` gets the stream offset reached.
    pub fn import(
        &mut self,
        trace: &Path,
        opts: &ImportOptions,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportStats, StoreError> {
        let mut reader = TraceReader::open(trace)?;
        reader.read_header()?;
        let precision = match reader.format() {
            Some(FileFormat::Pcap { precision, .. }) => precision,
            _ => reader.interfaces().first().map_or(pcaptool_packet::TsPrecision::Micro, |i| precision_for(i.tsresol)),
        };
        let swapped = match reader.format() {
            Some(FileFormat::Pcap { big_endian, .. }) | Some(FileFormat::PcapNg { big_endian }) => {
                big_endian != cfg!(target_endian = "big")
            }
            _ => false,
        };
        let mut damage = None;
        let mut ingest = self.ingest(opts);
        let mut last_report = 0u64;
        // Snapshot length and name per interface, learnt at each interface's first packet.
        let mut ifaces: Vec<Option<(u32, String)>> = Vec::new();
        let mut copy = Vec::new();
        loop {
            let rec = match reader.next_record() {
                None => break,
                Some(Err(e)) => {
                    damage = Some(e);
                    break;
                }
                Some(Ok(r)) => r,
            };
            let (ts_ns, wirelen, linktype, offset, iface) =
                (rec.ts_ns, rec.wirelen, rec.linktype, rec.offset, rec.iface);
            let i = iface as usize;
            let data = if ifaces.get(i).is_some_and(Option::is_some) {
                rec.data
            } else {
                // The record borrows the reader: keep its bytes while asking the reader for the interface.
                copy.clear();
                copy.extend_from_slice(rec.data);
                let (snap, name) = reader.interfaces().get(i).map_or((0, None), |f| (f.snaplen, f.name.clone()));
                if ifaces.len() <= i {
                    ifaces.resize(i + 1, None);
                }
                ifaces[i] = Some((if snap == 0 { 262_144 } else { snap }, name.unwrap_or_default()));
                &copy[..]
            };
            let (snaplen, name) = ifaces[i].as_ref().map_or((262_144, ""), |(s, n)| (*s, n.as_str()));
            let meta = StoreMeta { linktype, snaplen, precision, swapped, iface };
            ingest.push(meta, name, ts_ns, wirelen, data)?;
            if offset >= last_report + (1 << 24) {
                last_report = offset;
                progress(offset);
            }
        }
        let (packets, segments) = ingest.finish()?;
        let mut stats = ImportStats { packets, segments, damage, ..ImportStats::default() };
        if let Some(max) = opts.max_size {
            stats.removed = self.retain_size(max)?;
        }
        Ok(stats)
    }

    /// Removes the oldest segments whole until the store's files take at most `max` bytes; returns how many.
    pub fn retain_size(&mut self, max: u64) -> Result<u32, StoreError> {
        let size = |s: &Segment| {
            let index = std::fs::metadata(&s.index).map_or(s.stage1.stage2_bytes(), |m| m.len());
            s.stage1.bytes + index
        };
        let mut total: u64 = self.segments.iter().map(size).sum();
        let mut removed = 0;
        while total > max && !self.segments.is_empty() {
            let s = self.segments.remove(0);
            total -= size(&s);
            // Data first: an index left alone by a crash here is removed when the store is next opened.
            std::fs::remove_file(&s.data).map_err(|e| StoreError::io(&s.data, e))?;
            std::fs::remove_file(&s.index).map_err(|e| StoreError::io(&s.index, e))?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Calls `f` with every packet that may satisfy `need`, in the original order. Stage 1 rules segments out, stage 2 picks the flows, each flow is one read; `f`
    /// returns false to stop.
    pub fn query(&self, need: &Need, f: &mut dyn FnMut(&StoredPacket<'_>) -> bool) -> Result<QueryStats, StoreError> {
        let mut st = QueryStats { segments: self.segments.len() as u32, ..QueryStats::default() };
        // Segments by their first packet; segments whose positions overlap (several kinds of packet were being
        // stored at once) are read together and their packets merged by position.
        let mut order: Vec<&Segment> = self.segments.iter().filter(|s| s.stage1.packets > 0).collect();
        order.sort_by_key(|s| s.stage1.seq_min);
        let mut i = 0;
        while i < order.len() {
            let mut end = order[i].stage1.seq_max;
            let mut j = i + 1;
            while j < order.len() && order[j].stage1.seq_min <= end {
                end = end.max(order[j].stage1.seq_max);
                j += 1;
            }
            let mut maps: Vec<(&Segment, MappedFile)> = Vec::new();
            let mut got: Vec<(u32, Record)> = Vec::new();
            for seg in &order[i..j] {
                if !seg.stage1.may_match(need) {
                    continue;
                }
                st.stage1_passed += 1;
                let s2 = seg.stage2()?;
                let entries = s2.candidates(need)?;
                if entries.iter().all(|e| e.packets == 0) {
                    continue;
                }
                // Each flow is one sequential stretch of the mapped data file; the packets are then visited in
                // original order.
                let data = seg.map_data()?;
                let m = maps.len() as u32;
                for e in entries.iter().filter(|e| e.packets > 0) {
                    st.flows_read += 1;
                    st.bytes_read += e.data_len;
                    let span = seg.span(&data, e)?;
                    let seqs = s2.positions(e)?;
                    let base = e.data_offset as usize;
                    got.extend(seg.records(e, &seqs, span)?.into_iter().map(|r| (m, Record { at: base + r.at, ..r })));
                }
                maps.push((seg, data));
            }
            st.packets_read += got.len() as u64;
            if !in_order(&maps, got, f) {
                return Ok(st);
            }
            i = j;
        }
        Ok(st)
    }

    /// Calls `f` with the packets of flow `id` in order (one read per segment the flow spans); false if the
    /// store has no such flow.
    pub fn flow(&self, id: u64, f: &mut dyn FnMut(&StoredPacket<'_>)) -> Result<bool, StoreError> {
        let mut maps: Vec<(&Segment, MappedFile)> = Vec::new();
        let mut got: Vec<(u32, Record)> = Vec::new();
        for seg in self.segments.iter().filter(|s| s.stage1.may_hold_flow(id)) {
            if let Some((entry, seqs)) = seg.find_flow(id)? {
                let data = seg.map_data()?;
                let base = entry.data_offset as usize;
                let m = maps.len() as u32;
                let recs = seg.records(&entry, &seqs, seg.span(&data, &entry)?)?;
                got.extend(recs.into_iter().map(|r| (m, Record { at: base + r.at, ..r })));
                maps.push((seg, data));
            }
        }
        // A flow seen on several interfaces lies in segments of each: merged by position.
        in_order(&maps, got, &mut |p| {
            f(p);
            true
        });
        Ok(!maps.is_empty())
    }

    /// The flow records that may satisfy `need`, parts in several segments merged, by id.
    pub fn flows(&self, need: &Need) -> Result<Vec<Flow>, StoreError> {
        let mut by_id: FxHashMap<u64, Flow> = FxHashMap::default();
        for seg in self.segments.iter().filter(|s| s.stage1.may_match(need)) {
            let s2 = seg.stage2()?;
            for e in s2.candidates(need)? {
                if e.is_no_flow() {
                    continue;
                }
                by_id.entry(e.flow.id).and_modify(|f| f.merge(&e.flow)).or_insert(e.flow);
            }
        }
        let mut v: Vec<Flow> = by_id.into_values().collect();
        v.sort_by_key(|f| f.id);
        Ok(v)
    }
}
