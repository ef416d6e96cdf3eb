//! A store: a directory of segments, imported into and queried in the original packet order.

use std::path::{Path, PathBuf};

use pcaptool_packet::{FileFormat, LinkType, MappedFile, Need, TraceReader, precision_for};
use rustc_hash::FxHashMap;

use crate::error::StoreError;
use crate::flow::{Flow, FlowPacket, FlowTracker, PacketFlow, SlotCache, read_flow};
use crate::segment::{PacketIn, Record, Segment, SegmentWriter, Spare, StoreMeta, StoredPacket, segment_paths};

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// A segment closes once its data file would exceed this many bytes (default 256 MiB), or once its
    /// packets take twice that in memory (each packet is held with 24 bytes beside its pcap record, which
    /// only packets of a few bytes make as much as the records).
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

/// A packet for [`Ingest::push_all`]: what [`Ingest::push`] takes.
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    /// Its kind (the segments it may go to).
    pub meta: StoreMeta,
    /// The name of the interface it came from.
    pub iface_name: &'a str,
    /// When it was captured, in nanoseconds since the epoch.
    pub ts_ns: u64,
    /// Its length on the wire.
    pub wirelen: u32,
    /// Its captured bytes.
    pub data: &'a [u8],
}

/// How many packets ahead of its push [`Ingest::push_all`] reads a packet: three steps, four packets apart.
const AHEAD: usize = 12;

/// A packet [`Ingest::push_all`] has read and not yet pushed, with what it has found of where its push goes.
#[derive(Clone, Copy, Debug)]
struct Ahead<'a> {
    p: Incoming<'a>,
    flow: PacketFlow,
    /// Its flow's hash (`None`: no flow).
    hash: Option<u64>,
    /// The flow table entry its index slot names.
    entry: Option<usize>,
}

impl Ahead<'_> {
    const EMPTY: Ahead<'static> = Ahead {
        p: Incoming {
            meta: StoreMeta {
                linktype: LinkType::ETHERNET,
                snaplen: 0,
                precision: pcaptool_packet::TsPrecision::Micro,
                swapped: false,
                iface: 0,
            },
            iface_name: "",
            ts_ns: 0,
            wirelen: 0,
            data: &[],
        },
        flow: PacketFlow { flow: None, payload: 0, flags: 0, plain: false },
        hash: None,
        entry: None,
    };
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
        let flow = read_flow(meta.linktype, data);
        self.push_read(&Incoming { meta, iface_name, ts_ns, wirelen, data }, &flow, None)
    }

    /// Adds packets in order, as [`push`](Self::push) does one at a time, and faster when they are many: each
    /// packet's flow is read once, and while one is pushed, the memory the next ones' pushes will read is
    /// loaded. If a push fails, its error is returned and the packets after it are not pushed
    /// ([`packets`](Self::packets) counts those that were, the failed one included).
    ///
    /// With many flows interleaved, a push reads places that are rarely in cache: the flow table's index slot,
    /// its entry, and the flow's last position in the open segment, each found from the one before (the packet
    /// itself is written where the last one ended). So a packet is read 12 pushes before its own, and at each
    /// push one step is done for each of three packets: the newest is parsed and hashed and its index slot
    /// starts loading; for the one read 4 pushes ago, that slot (loaded by now) is read and the entry it names
    /// starts loading; 4 pushes later, the entry's slot cache is read and the flow's last position starts
    /// loading. These steps only read, so a push finds what it would have anyway.
    pub fn push_all<'a>(&mut self, packets: impl IntoIterator<Item = Incoming<'a>>) -> Result<(), StoreError> {
        let mut ring = [Ahead::EMPTY; AHEAD];
        let mut packets = packets.into_iter();
        // Packets read; at round k, packet k is read and packet k - AHEAD pushed.
        let (mut read, mut k, mut more) = (0usize, 0usize, true);
        while more || k < read + AHEAD {
            let ago = |back: usize| k.checked_sub(back).filter(|&j| j < read).map(|j| j % AHEAD);
            if let Some(i) = ago(AHEAD) {
                let a = &ring[i];
                self.push_read(&a.p, &a.flow, a.hash)?;
            }
            if let Some(i) = ago(8) {
                self.load_slot(&ring[i]);
            }
            if let Some(i) = ago(4) {
                let a = &mut ring[i];
                a.entry = a.hash.and_then(|h| self.tracker.prefetch_entry(h));
            }
            if more {
                match packets.next() {
                    Some(p) => {
                        // Hashed before it is stored: hashing what was just stored would read it back in one
                        // word from several smaller stores, which waits for them to reach the cache.
                        let flow = read_flow(p.meta.linktype, p.data);
                        let hash = flow.flow.map(|(tuple, _)| self.tracker.prefetch(&tuple));
                        ring[k % AHEAD] = Ahead { p, flow, hash, entry: None };
                        read += 1;
                    }
                    None => more = false,
                }
            }
            k += 1;
        }
        Ok(())
    }

    /// The third step of [`push_all`](Self::push_all)'s look-ahead: reads the entry's slot cache and starts
    /// loading the flow's last position in the writer.
    #[inline]
    fn load_slot(&self, a: &Ahead<'_>) {
        if let Some(c) = a.entry.and_then(|e| self.tracker.cache_at(e))
            && let Some(w) = self.writers.iter().find(|w| w.id() == c.writer)
        {
            w.prefetch_slot(c.slot);
        }
    }

    /// [`push`](Self::push) of a packet whose flow has been read (and hashed, if `hash` is given).
    #[inline]
    fn push_read(&mut self, p: &Incoming<'_>, r: &PacketFlow, hash: Option<u64>) -> Result<(), StoreError> {
        let Incoming { meta, iface_name, ts_ns, wirelen, data } = *p;
        let i = match self.writers.iter().position(|w| w.meta() == meta) {
            Some(i) => i,
            None => {
                let spare = std::mem::take(&mut self.spare);
                let mut w = SegmentWriter::with_spare(meta, iface_name, spare);
                // With two writers open, a flow's packets can go to both, and its slot cache names only one.
                if !self.writers.is_empty() {
                    w.index_slots();
                    self.writers.iter_mut().for_each(SegmentWriter::index_slots);
                }
                self.writers.push(w);
                self.writers.len() - 1
            }
        };
        let mut no_flow = SlotCache::default();
        let (flow, from_orig, cache) = match r.flow {
            Some((tuple, dir)) => {
                let p = FlowPacket { tuple, dir, payload: r.payload, flags: r.flags, wirelen, ts_ns };
                let (e, from_orig) = self.tracker.account(&p, hash);
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

    /// Prepares the memory of the next segment: `bytes` for its packets (each takes its pcap record, 16 bytes
    /// and its captured bytes, plus 24 bytes beside it), written once so that pushing into it never waits
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

#[cfg(test)]
mod tests {
    use super::*;
    use pcaptool_packet::TsPrecision;
    use proptest::prelude::*;

    /// A frame of kind `k`: IPv4 UDP or TCP of one of 6 flows (either direction), a VLAN-tagged one (not the
    /// fast path), or ARP (no flow); `len` bytes at least the headers.
    fn frame(k: usize, reply: bool, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[0..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
        let (a, b) = ([198, 18, 0, 1], [198, 18, 1, k as u8]);
        let (src, dst) = if reply { (b, a) } else { (a, b) };
        let (sp, dp) = if reply { (80u16, 1000 + k as u16) } else { (1000 + k as u16, 80) };
        match k {
            7 => {
                f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
                f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
            }
            _ => {
                if k == 6 {
                    f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
                    f.extend_from_slice(&[0, 5, 0x08, 0x00]);
                } else {
                    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                }
                let tcp = k.is_multiple_of(2);
                let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, if tcp { 6 } else { 17 }, 0, 0];
                ip.extend_from_slice(&src);
                ip.extend_from_slice(&dst);
                let l4_len = if tcp { 20 } else { 8 };
                let total = (20 + l4_len + len.saturating_sub(f.len() + 20 + l4_len)) as u16;
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                f.extend_from_slice(&ip);
                f.extend_from_slice(&sp.to_be_bytes());
                f.extend_from_slice(&dp.to_be_bytes());
                if tcp {
                    f.extend_from_slice(&[
                        0,
                        0,
                        0,
                        1,
                        0,
                        0,
                        0,
                        0,
                        0x50,
                        if reply { 0x12 } else { 0x02 },
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                    ]);
                } else {
                    f.extend_from_slice(&[0, 0, 0, 0]);
                }
            }
        }
        while f.len() < len {
            f.push(f.len() as u8);
        }
        f
    }

    /// Every file of `dir`, by name, with its bytes.
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .expect("store dir")
            .map(|e| {
                let e = e.expect("entry");
                (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("file"))
            })
            .collect();
        v.sort();
        v
    }

    fn meta(iface: u32) -> StoreMeta {
        StoreMeta { linktype: LinkType::ETHERNET, snaplen: 65535, precision: TsPrecision::Nano, swapped: false, iface }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Pushing packets all at once stores exactly what pushing them one by one stores, byte for byte,
        /// whatever the batches' sizes (shorter and longer than the look-ahead), with segments closing in the
        /// middle of a batch, two interfaces and packets of no flow or off the fast path among them.
        #[test]
        fn push_all_stores_what_push_stores(
            packets in proptest::collection::vec((0usize..8, any::<bool>(), 0usize..3, 0u32..2), 1..300),
            batches in proptest::collection::vec(1usize..40, 1..20),
            segment_packets in 3u64..60,
        ) {
            let sizes = [60usize, 130, 1514];
            let frames: Vec<(u32, Vec<u8>)> =
                packets.iter().map(|&(k, reply, size, iface)| (iface, frame(k, reply, sizes[size]))).collect();
            let incoming = |i: usize| {
                let (iface, f) = &frames[i];
                Incoming { meta: meta(*iface), iface_name: ["a", "b"][*iface as usize], ts_ns: 1_000_000 * i as u64, wirelen: f.len() as u32, data: f }
            };
            let opts = ImportOptions { segment_packets, ..ImportOptions::default() };
            let base = std::env::temp_dir().join(format!("pcaptool-push-all-{}-{:?}", std::process::id(), std::thread::current().id()));
            let (one, all) = (base.join("one"), base.join("all"));
            let _ = std::fs::remove_dir_all(&base);
            {
                let mut store = Store::create(&one).expect("store");
                let mut ingest = store.ingest(&opts);
                for i in 0..frames.len() {
                    let p = incoming(i);
                    ingest.push(p.meta, p.iface_name, p.ts_ns, p.wirelen, p.data).expect("push");
                }
                ingest.finish().expect("finish");
            }
            {
                let mut store = Store::create(&all).expect("store");
                let mut ingest = store.ingest(&opts);
                let (mut at, mut b) = (0, 0);
                while at < frames.len() {
                    let n = batches[b % batches.len()].min(frames.len() - at);
                    ingest.push_all((at..at + n).map(incoming)).expect("push_all");
                    prop_assert_eq!(ingest.packets(), (at + n) as u64);
                    at += n;
                    b += 1;
                }
                ingest.finish().expect("finish");
            }
            let (a, b) = (files(&one), files(&all));
            prop_assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                prop_assert!(x == y, "{} and {} differ", x.0, y.0);
            }
            let _ = std::fs::remove_dir_all(&base);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// However a flow's packets alternate between interfaces (two writers open at once, the second opening
        /// while the first holds flows), each segment holds each flow in one entry, and the store gives back
        /// every packet of each flow.
        #[test]
        fn a_flow_has_one_entry_per_segment(
            packets in proptest::collection::vec((0usize..6, any::<bool>(), 0u32..2), 1..200),
            first_alone in 0usize..50,
            segment_packets in 3u64..80,
        ) {
            let frames: Vec<(u32, Vec<u8>)> = packets
                .iter()
                .enumerate()
                .map(|(i, &(k, reply, iface))| (if i < first_alone { 0 } else { iface }, frame(k, reply, 60)))
                .collect();
            let dir = std::env::temp_dir().join(format!("pcaptool-one-entry-{}-{:?}", std::process::id(), std::thread::current().id()));
            let _ = std::fs::remove_dir_all(&dir);
            let mut store = Store::create(&dir).expect("store");
            {
                let mut ingest = store.ingest(&ImportOptions { segment_packets, ..ImportOptions::default() });
                ingest
                    .push_all(frames.iter().enumerate().map(|(i, (iface, f))| Incoming {
                        meta: meta(*iface),
                        iface_name: ["a", "b"][*iface as usize],
                        ts_ns: 1_000 * i as u64,
                        wirelen: 60,
                        data: f,
                    }))
                    .expect("push_all");
                ingest.finish().expect("finish");
            }
            let store = Store::open(&dir).expect("open");
            for seg in store.segments() {
                let mut ids: Vec<u64> =
                    seg.stage2().expect("stage 2").entries().expect("entries").iter().filter(|e| !e.is_no_flow()).map(|e| e.flow.id).collect();
                let n = ids.len();
                ids.sort_unstable();
                ids.dedup();
                prop_assert_eq!(ids.len(), n, "a flow with two entries in one segment");
            }
            let flows = store.flows(&Need::All).expect("flows");
            prop_assert_eq!(flows.len(), packets.iter().map(|p| p.0).collect::<std::collections::BTreeSet<_>>().len());
            let mut total = 0;
            for f in &flows {
                let mut n = 0u64;
                prop_assert!(store.flow(f.id, &mut |_| n += 1).expect("flow"));
                prop_assert_eq!(n, f.orig.packets + f.resp.packets);
                total += n;
            }
            prop_assert_eq!(total, frames.len() as u64);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// A push that fails ends `push_all` there: the packets before it and the failed one are counted, none
    /// after it is pushed.
    #[test]
    fn push_all_stops_at_a_failure() {
        let dir = std::env::temp_dir().join(format!("pcaptool-push-all-fail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::create(&dir).expect("store");
        let mut ingest = store.ingest(&ImportOptions { segment_packets: 10, ..ImportOptions::default() });
        // The segment closing at the 10th packet cannot be written.
        std::fs::remove_dir_all(&dir).expect("remove the store's directory");
        let frames: Vec<Vec<u8>> = (0..30).map(|i| frame(i % 6, false, 60)).collect();
        let r = ingest.push_all(frames.iter().map(|f| Incoming {
            meta: meta(0),
            iface_name: "a",
            ts_ns: 1,
            wirelen: 60,
            data: f,
        }));
        assert!(matches!(r, Err(StoreError::Io { .. })), "{r:?}");
        assert_eq!(ingest.packets(), 10);
        assert_eq!(ingest.unsaved(0), 10);
    }
}
