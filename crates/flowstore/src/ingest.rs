//! Adding packets to a store: [`Ingest`], which tracks flows and keeps one open segment per kind of packet (link
//! type and byte order), each closed and made visible at its bound.

use pcaptool_packet::LinkType;

use crate::blocks::Helper;
use crate::error::StoreError;
use crate::flow::{FlowPacket, FlowTracker, PacketFlow, SlotCache, read_flow};
use crate::format::segment_paths;
use crate::segment::Segment;
use crate::stage1::{SourceMark, StoreMeta};
use crate::store::{ImportOptions, Store};
use crate::writer::{PacketIn, SegmentWriter, Spare};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

/// Segments open at once, at most: a new kind of packet beyond them closes the oldest open segment, so that a
/// trace of many link types keeps its memory bounded (each open segment holds up to its bound).
pub const MAX_OPEN: usize = 16;

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

/// Packets being added to a store, from a trace or a capture: one open segment per kind of segment (link type
/// and byte order; a segment holds the packets of many interfaces, snapshot lengths and precisions of its kind),
/// each closed and made visible at its bound, at [`flush`](Self::flush) and at [`finish`](Self::finish).
/// Packets of one flow stand together in each segment; every packet keeps its position in the order it was
/// pushed. Only a store opened for writing takes packets ([`Store::ingest`]).
#[derive(Debug)]
pub struct Ingest<'s> {
    store: &'s mut Store,
    opts: ImportOptions,
    tracker: FlowTracker,
    first_flow: u64,
    pub(crate) seq: u64,
    /// The number of the first segment it writes, and of the next.
    first_number: u32,
    number: u32,
    /// One per kind of segment (link type and byte order), at most [`MAX_OPEN`].
    writers: Vec<SegmentWriter>,
    /// The kind of the last packet pushed, its writer and interface there (cleared whenever `writers` changes).
    last: Option<(StoreMeta, usize, u16)>,
    /// The trace the packets come from, marked in every segment written.
    pub(crate) source: Option<SourceMark>,
    /// Buffers of closed segments, for the next ones (at most two: one filling while the other closes).
    spares: Vec<Spare>,
    /// The thread that writes full segments while the next ones fill.
    closer: Closer,
    /// Packets per interface lost with segments that could not be written.
    lost: Vec<(u32, u64)>,
    packets: u64,
    segments: u32,
}

impl<'s> Ingest<'s> {
    /// Starts adding packets to `store` after what it holds.
    pub(crate) fn new(store: &'s mut Store, opts: &ImportOptions) -> Ingest<'s> {
        let (seq, first_flow) = store.next_seq_and_flow();
        let number = store.next_number;
        let closer = Closer::new(store.dir.clone());
        Ingest {
            tracker: FlowTracker::forgetting(first_flow),
            first_flow,
            store,
            opts: opts.clone(),
            seq,
            first_number: number,
            number,
            writers: Vec::new(),
            last: None,
            source: None,
            spares: Vec::new(),
            closer,
            lost: Vec::new(),
            packets: 0,
            segments: 0,
        }
    }

    /// The id of the first flow it gives.
    pub(crate) fn first_flow(&self) -> u64 {
        self.first_flow
    }

    /// Restarts the flow ids at `first` (an interrupted import resumed: its flows get the ids they had).
    pub(crate) fn restart_flows_at(&mut self, first: u64) {
        self.tracker = FlowTracker::forgetting(first);
        self.first_flow = first;
    }

    /// Adds a packet of kind `meta` from the interface named `iface_name`; closes its segment when full. A full
    /// segment is written on a thread of its own while the next one fills: if it cannot be written, the push
    /// that closes the next segment (or [`flush`](Self::flush)) returns the error, and both segments' packets are
    /// counted in [`unsaved`](Self::unsaved).
    #[inline]
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
        let (i, iface) = match self.last {
            Some((m, i, iface)) if m == meta => (i, iface),
            _ => self.writer_for(&meta, iface_name)?,
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
                iface,
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

    /// The writer of packets of kind `meta` and their interface's index there: a new writer for a new kind of
    /// segment (the oldest open one closed first when [`MAX_OPEN`] are), and a new segment when the writer
    /// holds as many interfaces as a segment can.
    #[cold]
    fn writer_for(&mut self, meta: &StoreMeta, iface_name: &str) -> Result<(usize, u16), StoreError> {
        self.last = None;
        let kind = (meta.linktype, meta.swapped);
        if let Some(i) = self.writers.iter().position(|w| w.kind() == kind) {
            if let Some(iface) = self.writers[i].iface_index(meta, iface_name) {
                self.last = Some((*meta, i, iface));
                return Ok((i, iface));
            }
            let w = self.writers.swap_remove(i);
            self.close(w)?;
        }
        if self.writers.len() >= MAX_OPEN {
            let oldest = (0..self.writers.len()).min_by_key(|&j| self.writers[j].first_seq()).unwrap_or(0);
            let w = self.writers.swap_remove(oldest);
            self.close(w)?;
        }
        let spare = self.spares.pop().unwrap_or_default();
        let mut w = SegmentWriter::with_spare(*meta, iface_name, spare);
        w.source = self.source;
        w.set_storage(self.opts.compress, self.opts.block_size, self.opts.dedup);
        w.set_helper(Helper::while_idle(Arc::clone(&self.closer.idle)));
        // With two writers open, a flow's packets can go to both, and its slot cache names only one.
        if !self.writers.is_empty() {
            w.index_slots();
            self.writers.iter_mut().for_each(SegmentWriter::index_slots);
        }
        self.writers.push(w);
        let i = self.writers.len() - 1;
        self.last = Some((*meta, i, 0));
        Ok((i, 0))
    }

    /// Hands a full segment to the closing thread (once the one before it is written: one closes at a time, so
    /// memory stays bounded and segments appear in their numbers' order). An error is that of the segment
    /// before, or of this one if it cannot be handed over; the packets of a segment that was not written are
    /// counted in [`unsaved`](Self::unsaved).
    fn close(&mut self, w: SegmentWriter) -> Result<(), StoreError> {
        self.last = None;
        if w.packets() == 0 {
            if self.spares.len() < 2 {
                self.spares.push(w.into_spare());
            }
            return Ok(());
        }
        let counts: Vec<(u32, u64)> = w.iface_counts().collect();
        if let Err(e) = self.wait_closed() {
            counts.into_iter().for_each(|(iface, n)| self.lose(iface, n));
            return Err(e);
        }
        // (The writer's buffers come back as the closed segment's spare; the spares kept here go to the next
        // writers.)
        self.closer.send((w, self.number), counts);
        self.number += 1;
        self.store.next_number = self.number;
        Ok(())
    }

    /// Waits for the segment being closed, if any; adds it to the store or counts its packets lost.
    fn wait_closed(&mut self) -> Result<(), StoreError> {
        let Some((closed, counts)) = self.closer.wait() else { return Ok(()) };
        if self.spares.len() < 2 {
            self.spares.push(closed.spare);
        }
        match closed.result {
            Ok(segment) => {
                self.segments += 1;
                self.store.segments.push(segment);
                Ok(())
            }
            // Written, but it could not be opened: its packets are stored and its number is taken.
            Err(e) if closed.written => Err(e),
            Err(e) => {
                // Its number goes to the next segment, as if it had never been handed over.
                counts.into_iter().for_each(|(iface, n)| self.lose(iface, n));
                self.number -= 1;
                self.store.next_number = self.number;
                Err(e)
            }
        }
    }

    /// Accounts a packet to its flow without storing it (a packet an interrupted import stored already), so
    /// that the flows of the packets after it get the ids and states they had.
    pub(crate) fn account_only(&mut self, meta: StoreMeta, ts_ns: u64, wirelen: u32, data: &[u8]) {
        let r = read_flow(meta.linktype, data);
        if let Some((tuple, dir)) = r.flow {
            let p = FlowPacket { tuple, dir, payload: r.payload, flags: r.flags, wirelen, ts_ns };
            self.tracker.account(&p, None);
        }
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
        let handed = self.close_open();
        let last = self.wait_closed();
        handed.and(last)
    }

    /// Closes every open segment without waiting for the last one to be written (as [`flush`](Self::flush)
    /// does): it becomes visible to queries (of other processes; this one's store lists it once waited for)
    /// when complete, while packets go on coming. If one cannot be written, the error is returned (here or by
    /// the next close) and its packets (and those of the segments after it) are counted in
    /// [`unsaved`](Self::unsaved).
    pub fn close_open(&mut self) -> Result<(), StoreError> {
        // Oldest first: the segment holding the earliest packet gets the lowest number.
        self.writers.sort_by_key(|w| w.first_seq());
        self.last = None;
        let mut result = Ok(());
        for w in std::mem::take(&mut self.writers) {
            if result.is_err() {
                let counts: Vec<(u32, u64)> = w.iface_counts().collect();
                counts.into_iter().for_each(|(iface, n)| self.lose(iface, n));
                continue;
            }
            result = self.close(w);
        }
        result
    }

    /// Packets of interface `iface` pushed but not in a completed segment: held in open segments, or lost with a
    /// segment that could not be written.
    pub fn unsaved(&self, iface: u32) -> u64 {
        let open: u64 = self.writers.iter().map(|w| w.iface_packets(iface)).sum();
        let closing = self.closer.closing(iface);
        open + closing + self.lost.iter().filter(|l| l.0 == iface).map(|l| l.1).sum::<u64>()
    }

    /// Prepares the memory of the next two segments (one fills while the one before it is written): `bytes`
    /// each for their packets (each takes its pcap record, 16 bytes and its captured bytes, plus 24 bytes beside
    /// it), written once so that pushing into them never waits for the kernel to provide a page. A capture
    /// calls this before packets arrive (n2disk preallocates so too); a closed segment's memory goes on to a
    /// later one, so it stays ready.
    pub fn reserve(&mut self, bytes: usize) {
        self.spares.resize_with(2, Spare::default);
        self.spares.iter_mut().for_each(|s| s.touch(bytes));
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
        Ok(self.store.retain_size(max, u32::MAX)?.0)
    }

    /// The number of the first segment this ingest wrote (or will write).
    pub fn first_number(&self) -> u32 {
        self.first_number
    }

    /// Bytes held in open segments.
    pub fn pending_bytes(&self) -> u64 {
        self.writers.iter().map(SegmentWriter::data_bytes).sum()
    }

    /// Closes every open segment; returns the packets pushed and the segments written. With a source, the
    /// segments closed here are marked as the import's last ones (how many they are), so that importing the
    /// same trace again is known to be a duplicate.
    pub fn finish(mut self) -> Result<(u64, u32), StoreError> {
        if let Some(s) = &mut self.source {
            let ends = self.writers.iter().filter(|w| w.packets() > 0).count() as u32;
            s.ends = ends;
            for w in &mut self.writers {
                w.source = Some(*s);
            }
        }
        self.flush()?;
        Ok((self.packets, self.segments))
    }
}

impl Drop for Ingest<'_> {
    /// Waits for the segment being written, so that the store lists it (an ingest dropped without
    /// [`finish`](Ingest::finish) keeps what it closed).
    fn drop(&mut self) {
        let _ = self.wait_closed();
    }
}

/// A segment closed: the segment, or why it could not be written, and its writer's buffers.
struct Closed {
    result: Result<Segment, StoreError>,
    /// Whether its files are complete (an error after that is in opening them: the packets are stored).
    written: bool,
    spare: Spare,
}

impl std::fmt::Debug for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closed").field("result", &self.result.as_ref().map(|s| &s.index)).finish_non_exhaustive()
    }
}

/// A segment for the closing thread: its writer and its number.
type Job = (SegmentWriter, u32);

/// Closes a segment (the closing thread's whole work), keeping its writer's buffers for a later one.
fn close_one(dir: &std::path::Path, (w, number): Job) -> Closed {
    let (written, spare) = w.close_keeping(dir, number);
    let ok = written.is_ok();
    let result = written.and_then(|_| Segment::open(segment_paths(dir, number).1));
    Closed { result, written: ok, spare }
}

/// A segment being closed: its packets per interface, and what became of it if that is known already.
type Busy = (Vec<(u32, u64)>, Option<Closed>);

/// The thread that closes full segments, one at a time, while the ingest goes on: compressing and writing a
/// segment takes about as long as filling the next.
#[derive(Debug)]
struct Closer {
    dir: PathBuf,
    /// The thread, started with the first segment.
    thread: Option<(mpsc::SyncSender<Job>, mpsc::Receiver<Closed>, std::thread::JoinHandle<()>)>,
    /// The segment being closed: its packets per interface, and its outcome if it was closed on the ingest's
    /// thread (no closing thread could start).
    busy: Option<Busy>,
    /// Set while the ingest waits for the close.
    idle: Arc<AtomicBool>,
}

impl Closer {
    fn new(dir: PathBuf) -> Closer {
        Closer { dir, thread: None, busy: None, idle: Arc::default() }
    }

    /// Starts closing a segment (the one before it has been waited for); `counts` are its packets per
    /// interface.
    fn send(&mut self, job: Job, counts: Vec<(u32, u64)>) {
        debug_assert!(self.busy.is_none());
        if self.thread.is_none() {
            let (jobs, todo) = mpsc::sync_channel::<Job>(1);
            let (report, done) = mpsc::sync_channel(1);
            let dir = self.dir.clone();
            let spawned = std::thread::Builder::new().name("pcaptool-close".into()).spawn(move || {
                for job in todo {
                    if report.send(close_one(&dir, job)).is_err() {
                        break;
                    }
                }
            });
            if let Ok(handle) = spawned {
                self.thread = Some((jobs, done, handle));
            }
        }
        let job = match &self.thread {
            Some((jobs, ..)) => match jobs.send(job) {
                Ok(()) => {
                    self.busy = Some((counts, None));
                    return;
                }
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        // No closing thread: the segment is closed here.
        self.busy = Some((counts, Some(close_one(&self.dir, job))));
    }

    /// Waits for the segment being closed, if any: what became of it, and its packets per interface.
    fn wait(&mut self) -> Option<(Closed, Vec<(u32, u64)>)> {
        let (counts, closed) = self.busy.take()?;
        let closed = match closed {
            Some(c) => c,
            None => match self.thread.as_ref().and_then(|(_, done, _)| {
                // Waiting, this thread leaves its processor to the close (see `Helper`).
                self.idle.store(true, Ordering::Relaxed);
                let closed = done.recv().ok();
                self.idle.store(false, Ordering::Relaxed);
                closed
            }) {
                Some(c) => c,
                None => {
                    self.thread = None;
                    let why = std::io::Error::other("the thread writing a segment stopped before it was complete");
                    Closed { result: Err(StoreError::io(&self.dir, why)), written: false, spare: Spare::default() }
                }
            },
        };
        Some((closed, counts))
    }

    /// Packets of interface `iface` in the segment being closed.
    fn closing(&self, iface: u32) -> u64 {
        self.busy.as_ref().map_or(0, |(c, _)| c.iter().filter(|c| c.0 == iface).map(|c| c.1).sum())
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some((jobs, done, handle)) = self.thread.take() {
            drop((jobs, done));
            let _ = handle.join();
        }
    }
}

impl Store {
    /// Starts adding packets after what the store holds (see [`Ingest`]); the store must be open for writing.
    pub fn ingest(&mut self, opts: &ImportOptions) -> Result<Ingest<'_>, StoreError> {
        self.writable()?;
        Ok(Ingest::new(self, opts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use pcaptool_packet::Need;
    use pcaptool_packet::TsPrecision;
    use proptest::prelude::*;
    use std::path::Path;

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
                let mut ingest = store.ingest(&opts).expect("writer");
                for i in 0..frames.len() {
                    let p = incoming(i);
                    ingest.push(p.meta, p.iface_name, p.ts_ns, p.wirelen, p.data).expect("push");
                }
                ingest.finish().expect("finish");
            }
            {
                let mut store = Store::create(&all).expect("store");
                let mut ingest = store.ingest(&opts).expect("writer");
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
                let mut ingest = store.ingest(&ImportOptions { segment_packets, ..ImportOptions::default() }).expect("writer");
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
        let mut ingest =
            store.ingest(&ImportOptions { segment_packets: 10, ..ImportOptions::default() }).expect("writer");
        // The segment closing at the 10th packet cannot be written; that is known when the next one closes, at
        // the 20th, whose packets are lost with it.
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
        assert_eq!(ingest.packets(), 20);
        assert_eq!(ingest.unsaved(0), 20);
    }

    /// The memory `reserve` prepares is what every later segment fills: a closed segment's buffers go to the
    /// next writer but one, never a fresh allocation (which would fault its pages in again while packets wait).
    #[test]
    fn reserved_memory_goes_from_segment_to_segment() {
        let dir = std::env::temp_dir().join(format!("pcaptool-spares-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::create(&dir).expect("store");
        let mut ingest =
            store.ingest(&ImportOptions { segment_packets: 10, ..ImportOptions::default() }).expect("writer");
        ingest.reserve(1 << 20);
        let reserved: Vec<*const u8> = ingest.spares.iter().map(Spare::arena).collect();
        let mut seen = Vec::new();
        for i in 0..60 {
            let f = frame(i % 8, i % 3 == 0, 60 + i);
            ingest.push(meta(0), "a", 1, f.len() as u32, &f).expect("push");
            seen.extend(ingest.writers.iter().map(SegmentWriter::arena));
            if i % 25 == 24 {
                ingest.close_open().expect("close_open");
            }
        }
        ingest.finish().expect("finish");
        assert!(store.segments().len() >= 6);
        seen.dedup();
        assert!(seen.iter().all(|p| reserved.contains(p)), "writers' arenas {seen:?}, reserved {reserved:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Segments are written on the closing thread while the next fill: `close_open` hands them over without
    /// waiting, `flush` waits, and an ingest dropped without `finish` keeps every segment it handed over.
    #[test]
    fn segments_close_behind_the_ingest_and_none_is_lost() {
        let dir = std::env::temp_dir().join(format!("pcaptool-closer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::create(&dir).expect("store");
        let frames: Vec<Vec<u8>> = (0..35).map(|i| frame(i % 8, i % 3 == 0, 60 + i)).collect();
        let push = |ingest: &mut Ingest<'_>, from: usize, to: usize| {
            for f in &frames[from..to] {
                ingest.push(meta(0), "a", 1, f.len() as u32, f).expect("push");
            }
        };
        {
            let mut ingest =
                store.ingest(&ImportOptions { segment_packets: 10, ..ImportOptions::default() }).expect("writer");
            push(&mut ingest, 0, 25);
            assert_eq!(ingest.unsaved(0), 25 - ingest.segments as u64 * 10);
            ingest.close_open().expect("close_open");
            push(&mut ingest, 25, 35);
            ingest.flush().expect("flush");
            assert_eq!((ingest.segments, ingest.unsaved(0)), (4, 0));
            push(&mut ingest, 0, 12);
            // Dropped with one segment handed over and two packets open.
        }
        let counts: Vec<u64> = store.segments().iter().map(|s| s.stage1.packets).collect();
        assert_eq!(counts, [10, 10, 5, 10, 10]);
        let reopened = Store::open(&dir).expect("open");
        let listed: Vec<(u32, u64)> = reopened.segments().iter().map(|s| (s.stage1.number, s.stage1.packets)).collect();
        assert_eq!(listed, [(0, 10), (1, 10), (2, 5), (3, 10), (4, 10)]);
        // Every flow's packets read back from the segments written behind the ingest.
        let mut n = 0u64;
        for f in reopened.flows(&Need::All).expect("flows") {
            assert!(reopened.flow(f.id, &mut |_| n += 1).expect("flow"));
        }
        let arp = |fs: &[Vec<u8>]| fs.iter().filter(|f| f[12..14] == [0x08, 0x06]).count() as u64;
        assert_eq!(n + arp(&frames) + arp(&frames[..12]), 45);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
