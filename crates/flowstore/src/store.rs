//! A store: a directory of segments, opened for reading (which changes nothing) or for writing (under the writer
//! lock), queried in the original packet order.
//!
//! What a store promises and how each promise is tested: docs/guarantees.md.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pcaptool_packet::Need;
use rustc_hash::FxHashMap;

use crate::blocks::Codec;
use crate::error::StoreError;
use crate::flow::Flow;
use crate::format::{is_data_ext, segment_paths};
use crate::lock::{LOCK_FILE, WriterLock};
use crate::segment::{FlowEntry, Record, SegBytes, SegData, Segment, StoredPacket};
use crate::stage1::StoreMeta;
use crate::stage2::Keep;

/// The folder of a store where `pcaptool repair` puts damaged segments.
pub const QUARANTINE: &str = "quarantine";

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// A segment closes once its data file would exceed this many bytes (default 256 MiB), or once its
    /// packets take twice that in memory (each packet is held with 24 bytes beside its pcap record, which
    /// only packets of a few bytes make as much as the records).
    pub segment_bytes: u64,
    /// Or once it holds this many packets (default 4,194,304).
    pub segment_packets: u64,
    /// After the import, the oldest segments are removed whole until the store is at most this big (never
    /// those the import wrote).
    pub max_size: Option<u64>,
    /// Import a trace the store already holds whole, as new packets (by default it is refused).
    pub allow_duplicates: bool,
    /// How the segments' data is stored (default: plain pcap).
    pub compress: Codec,
    /// Raw bytes each compressed block aims at (`None`: the codec's [default](Codec::default_block_size)).
    pub block_size: Option<usize>,
    /// Store a flow direction whose payload an earlier one of the segment carried without it, referring to it
    /// (compressed data only; FloSIS's whole-flow deduplication).
    pub dedup: bool,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            segment_bytes: 256 << 20,
            segment_packets: 1 << 22,
            max_size: None,
            allow_duplicates: false,
            compress: Codec::None,
            block_size: None,
            dedup: false,
        }
    }
}

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportStats {
    /// Packets stored.
    pub packets: u64,
    /// Packets left out because an interrupted import of the same trace had stored them (the import resumed).
    pub already_stored: u64,
    /// Segments written.
    pub segments: u32,
    /// Segments removed for `max_size`.
    pub removed: u32,
    /// The store's size after the import, when it is still over `max_size` (the segments just written are
    /// never removed for it).
    pub over_max_size: Option<u64>,
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

/// A segment that cannot be read: its index or data is damaged, or a file cannot be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedSegment {
    /// Its number.
    pub number: u32,
    /// The damaged file.
    pub path: PathBuf,
    /// Where in it.
    pub offset: u64,
    /// What does not hold.
    pub why: String,
}

impl DamagedSegment {
    pub(crate) fn of(number: u32, err: &StoreError, fallback: &Path) -> DamagedSegment {
        let (path, offset, why) = match err {
            StoreError::Corrupt { path, offset, why } => (path.clone(), *offset, why.clone()),
            StoreError::DataChecksum { path, start, end, stored, computed } => (
                path.clone(),
                *start,
                format!(
                    "bytes {start}..{end} do not match their checksum (stored {stored:08x}, computed {computed:08x})"
                ),
            ),
            StoreError::BlockChecksum { path, block, start, end, stored, computed } => (
                path.clone(),
                *start,
                format!(
                    "block {block} (bytes {start}..{end}) does not match its checksum (stored {stored:08x}, computed \
                     {computed:08x})"
                ),
            ),
            StoreError::Io { path, source } => (path.clone(), 0, format!("cannot be read: {source}")),
            other => (fallback.to_path_buf(), 0, other.to_string()),
        };
        DamagedSegment { number, path, offset, why }
    }

    /// The damage as an error.
    pub fn to_error(&self) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), offset: self.offset, why: self.why.clone() }
    }
}

impl std::fmt::Display for DamagedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is damaged at byte {}: {}", self.path.display(), self.offset, self.why)
    }
}

/// An open store.
#[derive(Debug)]
pub struct Store {
    pub(crate) dir: PathBuf,
    pub(crate) segments: Vec<Segment>,
    /// Held while the store is open for writing.
    pub(crate) lock: Option<WriterLock>,
    /// What opening for writing repaired.
    repairs: Vec<String>,
    /// Files of unfinished segments a reader saw and left alone.
    leftovers: Vec<PathBuf>,
    /// Segments that could not be opened.
    damaged: Vec<DamagedSegment>,
    /// Segments in the quarantine folder.
    quarantined: u32,
    /// The number the next segment written gets.
    pub(crate) next_number: u32,
    /// Whether reads leave damaged segments out (else they fail), and those they left out.
    skip_damaged: bool,
    skipped: Mutex<Vec<DamagedSegment>>,
}

/// What a directory listing holds of a store: by segment number, the names of its data files (one, or two while a
/// recompression is under way) and whether its index exists under its final name; the files of unfinished
/// segments.
#[derive(Debug, Default)]
struct Listing {
    numbers: BTreeMap<u32, (Vec<String>, bool)>,
    tmp: Vec<PathBuf>,
}

impl Listing {
    fn of(dir: &Path) -> Result<Listing, StoreError> {
        let mut l = Listing::default();
        for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))? {
            let entry = entry.map_err(|e| StoreError::io(dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((n, ext)) = segment_number(name) else { continue };
            if ext == "ptsx" {
                l.numbers.entry(n).or_default().1 = true;
            } else if is_data_ext(ext) {
                l.numbers.entry(n).or_default().0.push(name.to_string());
            } else if ext.strip_suffix(".tmp").is_some_and(|e| e == "ptsx" || is_data_ext(e)) {
                l.tmp.push(entry.path());
            }
        }
        for v in l.numbers.values_mut() {
            v.0.sort();
        }
        l.tmp.sort();
        Ok(l)
    }

    fn complete(&self) -> impl Iterator<Item = u32> + '_ {
        self.numbers.iter().filter(|(_, f)| !f.0.is_empty() && f.1).map(|(&n, _)| n)
    }
}

/// The number of a segment's file and what follows it (`seg-000012.ptsx`: 12 and `ptsx`).
fn segment_number(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("seg-")?;
    let (num, ext) = rest.split_once('.')?;
    (num.len() == 6 && num.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (num.parse().ok(), ext))
        .and_then(|(n, e)| Some((n?, e)))
}

/// The data files of segment `n` of `dir` (one, or two while a recompression is under way), by name.
pub(crate) fn data_files(dir: &Path, n: u32) -> Result<Vec<PathBuf>, StoreError> {
    Ok(Listing::of(dir)?.numbers.remove(&n).map_or_else(Vec::new, |(d, _)| d.iter().map(|d| dir.join(d)).collect()))
}

/// Opens segment `n` of `dir`: `Ok(Ok(None))` if one of its files is gone (a writer's retention removed it since
/// the listing), `Ok(Err)` with the damage if it cannot be read, `Err` when the process may open no more files.
fn open_segment(dir: &Path, n: u32) -> Result<Result<Option<Segment>, DamagedSegment>, StoreError> {
    let index = segment_paths(dir, n).1;
    let open = |p: &Path| match File::open(p) {
        Ok(f) => Ok(Ok(Some(f))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Ok(None)),
        // EMFILE, ENFILE: no damage of the store's.
        Err(e) if matches!(e.raw_os_error(), Some(24 | 23)) => {
            Err(StoreError::TooManyFiles { path: p.to_path_buf(), source: e })
        }
        Err(e) => Ok(Err(DamagedSegment::of(n, &StoreError::io(p, e), p))),
    };
    // The index names the data file. A recompression replaces both: its new data file first, then the index,
    // then the old data file goes; an index read just before that finds its data file gone, and is read again.
    let mut missing: Option<PathBuf> = None;
    let seg = loop {
        let index_file = match open(&index)? {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(Ok(None)),
            Err(d) => return Ok(Err(d)),
        };
        let stage1 = match Segment::read_stage1(&index, &index_file) {
            Ok(s) => s,
            Err(e) => return Ok(Err(DamagedSegment::of(n, &e, &index))),
        };
        let data = dir.join(stage1.data_file_name());
        match open(&data)? {
            Ok(Some(f)) => break Segment::from_parts(data, index.clone(), stage1, f, index_file),
            // Removed by retention (data first), or by a recompression since the index was read.
            Ok(None) if missing.as_ref() == Some(&data) => return Ok(Ok(None)),
            Ok(None) => missing = Some(data),
            Err(d) => return Ok(Err(d)),
        }
    };
    // A segment's files copied or renamed to another number would give its packets twice, or out of place.
    if seg.stage1.number != n {
        return Ok(Err(DamagedSegment {
            number: n,
            path: index,
            offset: 24,
            why: format!("its index says it is segment {}: a file copied or renamed into the store", seg.stage1.number),
        }));
    }
    Ok(Ok(Some(seg)))
}

impl Store {
    /// Opens the store in `dir` for writing, creating the directory if it does not exist (see
    /// [`open_writer`](Self::open_writer)).
    pub fn create(dir: &Path) -> Result<Store, StoreError> {
        if dir.exists() && !dir.is_dir() {
            return Err(StoreError::NotADirectory { path: dir.to_path_buf() });
        }
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        Store::open_writer(dir)
    }

    /// Opens the store in `dir`, which must exist, for writing: takes its writer lock (refused at once, with who
    /// holds it, while another process writes the store) and repairs what an interrupted writer left (files of
    /// unfinished segments are removed, said in [`repairs`](Self::repairs)). Segments become visible only once
    /// complete, so no completed one is lost. The lock is held until the store is dropped.
    pub fn open_writer(dir: &Path) -> Result<Store, StoreError> {
        check_dir(dir)?;
        if let StoreDir::Foreign(first) = StoreDir::of(dir)? {
            return Err(StoreError::ForeignDirectory { dir: dir.to_path_buf(), first });
        }
        let lock = WriterLock::acquire(dir)?;
        let listing = Listing::of(dir)?;
        let mut repairs = Vec::new();
        for t in &listing.tmp {
            std::fs::remove_file(t).map_err(|e| StoreError::io(t, e))?;
            repairs.push(format!("removed {}, left by an interrupted segment", file_name(t)));
        }
        for (&n, (data, index)) in &listing.numbers {
            let index_path = segment_paths(dir, n).1;
            match (data.is_empty(), index) {
                (true, true) => {
                    std::fs::remove_file(&index_path).map_err(|e| StoreError::io(&index_path, e))?;
                    repairs.push(format!(
                        "removed {}: its segment was interrupted before its data file was complete",
                        file_name(&index_path)
                    ));
                }
                (false, false) => {
                    for d in data {
                        repairs.push(format!(
                            "left {d} out: it has no index (it was not written by pcaptool, or its removal was \
                             interrupted)"
                        ));
                    }
                }
                _ => {}
            }
        }
        let mut store = Store::empty(dir);
        store.lock = Some(lock);
        store.load(&listing)?;
        // A recompression interrupted after its new data file was in place leaves two data files: the one the
        // index names is the segment's, the other goes. An index naming a data file that is gone (its removal
        // interrupted) goes too.
        for (&n, (data, _)) in listing.numbers.iter().filter(|(_, f)| f.1 && !f.0.is_empty()) {
            let seg = store.segments.iter().find(|s| s.stage1.number == n);
            let damaged = store.damaged.iter().any(|d| d.number == n);
            match seg {
                Some(seg) => {
                    let keep = seg.stage1.data_file_name();
                    for d in data.iter().filter(|d| **d != keep) {
                        let p = dir.join(d);
                        std::fs::remove_file(&p).map_err(|e| StoreError::io(&p, e))?;
                        repairs.push(format!("removed {d}, left by an interrupted recompression of its segment"));
                    }
                }
                None if !damaged => {
                    let index_path = segment_paths(dir, n).1;
                    std::fs::remove_file(&index_path).map_err(|e| StoreError::io(&index_path, e))?;
                    repairs.push(format!(
                        "removed {}: the data file it names is gone (its removal was interrupted)",
                        file_name(&index_path)
                    ));
                }
                None => {}
            }
        }
        store.repairs = repairs;
        Ok(store)
    }

    /// Opens the store in `dir`, which must exist, for reading. Reading changes nothing: no lock is taken, no
    /// file is written or removed, so it works on read-only media and beside a running writer, whose unfinished
    /// segments it leaves alone ([`leftovers`](Self::leftovers)). It sees the segments complete when it opened
    /// the store, each with its files open, so a writer's retention removing one does not disturb it.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        check_dir(dir)?;
        match StoreDir::of(dir)? {
            StoreDir::Store => {}
            StoreDir::Empty => return Err(StoreError::NotAStore { dir: dir.to_path_buf(), holds: None }),
            StoreDir::Foreign(f) => return Err(StoreError::NotAStore { dir: dir.to_path_buf(), holds: Some(f) }),
        }
        let mut store = Store::empty(dir);
        // A directory listed while segments are renamed into place may show a newer segment and not an older
        // one; listed again, anything complete below the newest seen must have been seen.
        for _ in 0..10 {
            let first = Listing::of(dir)?;
            store.load(&first)?;
            let again = Listing::of(dir)?;
            let newest = first.complete().max().unwrap_or(0);
            let seen: Vec<u32> = first.complete().collect();
            if again.complete().filter(|&n| n < newest).all(|n| seen.binary_search(&n).is_ok()) {
                break;
            }
        }
        Ok(store)
    }

    fn empty(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            lock: None,
            repairs: Vec::new(),
            leftovers: Vec::new(),
            damaged: Vec::new(),
            quarantined: 0,
            next_number: 0,
            skip_damaged: false,
            skipped: Mutex::new(Vec::new()),
        }
    }

    /// Opens the complete segments of `listing` (and notes the rest).
    fn load(&mut self, listing: &Listing) -> Result<(), StoreError> {
        self.segments.clear();
        self.damaged.clear();
        self.leftovers = listing.tmp.clone();
        // Newest first: retention removes the oldest first, so once a segment has been opened every newer one was
        // (a reader never holds an older segment without the newer ones retention removed in the meantime), and
        // what it sees is a stretch of whole segments.
        for (&n, (data, index)) in listing.numbers.iter().rev() {
            if data.is_empty() || !index {
                if *index {
                    self.leftovers.push(segment_paths(&self.dir, n).1);
                }
                self.leftovers.extend(data.iter().map(|d| self.dir.join(d)));
                continue;
            }
            match open_segment(&self.dir, n)? {
                Ok(Some(s)) => self.segments.push(s),
                Ok(None) => {}
                Err(d) => self.damaged.push(d),
            }
        }
        self.segments.reverse();
        self.damaged.reverse();
        self.leftovers.sort();
        let quarantine = quarantined_numbers(&self.dir);
        self.quarantined = quarantine.len() as u32;
        self.next_number = listing
            .numbers
            .keys()
            .chain(&quarantine)
            .map(|&n| n.saturating_add(1))
            .chain(self.segments.iter().map(|s| s.stage1.number.saturating_add(1)))
            .max()
            .unwrap_or(0);
        Ok(())
    }

    /// Whether the store is open for writing (it holds the writer lock).
    pub fn is_writer(&self) -> bool {
        self.lock.is_some()
    }

    pub(crate) fn writable(&self) -> Result<(), StoreError> {
        if self.lock.is_none() {
            return Err(StoreError::ReadOnly { dir: self.dir.clone() });
        }
        Ok(())
    }

    /// What opening the store for writing repaired.
    pub fn repairs(&self) -> &[String] {
        &self.repairs
    }

    /// Files of unfinished segments a reader left alone: segments being written, or left by a writer that
    /// was interrupted (the next writer, or `pcaptool repair`, removes those).
    pub fn leftovers(&self) -> &[PathBuf] {
        &self.leftovers
    }

    /// Segments that could not be opened (a damaged index, a file that cannot be read): set aside, not part of
    /// [`segments`](Self::segments). Reads fail while there are any, unless they
    /// [skip damaged segments](Self::set_skip_damaged).
    pub fn damaged(&self) -> &[DamagedSegment] {
        &self.damaged
    }

    /// After a repair moved the damaged segments into the quarantine folder.
    pub(crate) fn forget_damaged(&mut self) {
        self.damaged.clear();
        self.quarantined = quarantined_numbers(&self.dir).len() as u32;
    }

    /// Segments in the store's quarantine folder (set aside by a repair).
    pub fn quarantined(&self) -> u32 {
        self.quarantined
    }

    /// Makes reads leave damaged segments out (recorded in [`skipped`](Self::skipped)) instead of failing: the
    /// answer is then exact for the other segments.
    pub fn set_skip_damaged(&mut self, skip: bool) {
        self.skip_damaged = skip;
    }

    /// Keeps what reads decode of the segments' second stages (address dictionaries, posting lists, flow table
    /// blocks) for the reads after them, within `budget` heap bytes, first come first kept: for a store that
    /// answers many requests (a service), where decoding them again for each would be most of a needle's time.
    /// A part the budget refuses is decoded for each read, as before. It applies to the segments the store
    /// holds now.
    pub fn keep_indexes(&mut self, budget: u64) {
        let keep = Arc::new(Keep::new(budget));
        for seg in &mut self.segments {
            seg.set_keep(&keep);
        }
    }

    /// The damaged segments reads have left out so far.
    pub fn skipped(&self) -> Vec<DamagedSegment> {
        self.skipped.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// A damaged segment met by a read: left out (and recorded) when reads skip damaged segments, else the
    /// read's error.
    fn damage(&self, number: u32, err: StoreError, fallback: &Path) -> Result<(), StoreError> {
        if !self.skip_damaged || !err.is_damage() {
            return Err(err);
        }
        let d = DamagedSegment::of(number, &err, fallback);
        if let Ok(mut v) = self.skipped.lock()
            && !v.iter().any(|x| x.number == number)
        {
            v.push(d);
        }
        Ok(())
    }

    /// Before a read: fails on the segments that could not be opened, or skips them.
    fn check_damaged(&self) -> Result<(), StoreError> {
        for d in &self.damaged {
            self.damage(d.number, d.to_error(), &d.path)?;
        }
        Ok(())
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segments, oldest first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// What the store's packets are: each distinct kind (link type, snapshot length, precision, byte order,
    /// interface) of its segments' interfaces, in order of first appearance (empty while the store is), with the
    /// name its interface was first given.
    pub fn metas(&self) -> Vec<(StoreMeta, String)> {
        let mut v: Vec<(StoreMeta, String)> = Vec::new();
        let mut seen = rustc_hash::FxHashSet::default();
        for s in &self.segments {
            for (m, name) in s.stage1.metas() {
                if seen.insert(m) {
                    v.push((m, name.to_string()));
                }
            }
        }
        v
    }

    /// Packets stored.
    pub fn packets(&self) -> u64 {
        self.segments.iter().map(|s| s.stage1.packets).sum()
    }

    /// The position the next packet gets and the id the next flow gets.
    pub(crate) fn next_seq_and_flow(&self) -> (u64, u64) {
        let seq = self.segments.iter().map(|s| s.stage1.seq_max + 1).max().unwrap_or(0);
        let flow = self.segments.iter().map(|s| s.stage1.flow_max.wrapping_add(1)).filter(|&f| f != 0).max();
        (seq, flow.unwrap_or(0))
    }

    /// Bytes segment `s` takes on disk (data and index).
    fn size_of(s: &Segment) -> u64 {
        s.stage1.stored_bytes + s.stage1.index_bytes()
    }

    /// Bytes the store's segments take.
    pub fn size(&self) -> u64 {
        self.segments.iter().map(Store::size_of).sum()
    }

    /// Removes the oldest segments whole until the store's files take at most `max` bytes, but never a segment
    /// numbered `keep_from` or later; returns how many it removed and the store's size after. Needs the store
    /// open for writing.
    pub fn retain_size(&mut self, max: u64, keep_from: u32) -> Result<(u32, u64), StoreError> {
        self.writable()?;
        let mut total = self.size();
        let mut removed = 0;
        while total > max && self.segments.first().is_some_and(|s| s.stage1.number < keep_from) {
            let s = self.segments.remove(0);
            total -= Store::size_of(&s);
            // Data first: the segment leaves the store at once; an index left alone by a crash here is removed
            // by the next writer. Readers that opened the segment keep reading it through their open files.
            std::fs::remove_file(&s.data).map_err(|e| StoreError::io(&s.data, e))?;
            std::fs::remove_file(&s.index).map_err(|e| StoreError::io(&s.index, e))?;
            removed += 1;
        }
        if removed > 0
            && let Ok(d) = File::open(&self.dir)
        {
            let _ = d.sync_all();
        }
        Ok((removed, total))
    }

    /// The lock file of a store (for messages).
    pub fn lock_path(dir: &Path) -> PathBuf {
        dir.join(LOCK_FILE)
    }

    /// The records of segment `seg` that may satisfy `need` (each flow's span checked against its checksums),
    /// with the data that holds them; `None` if stage 2 rules it out.
    fn read_candidates(&self, seg: &Segment, need: &Need, st: &mut QueryStats) -> Result<Option<SegData>, StoreError> {
        let s2 = seg.stage2_kept()?;
        let entries = s2.candidates(need)?;
        if entries.iter().all(|e| e.packets == 0) {
            return Ok(None);
        }
        // Each flow is one sequential stretch of the data file; the packets are then visited in original order.
        let entries: Vec<&FlowEntry> = entries.iter().filter(|e| e.packets > 0).collect();
        st.flows_read += entries.len() as u64;
        st.bytes_read += entries.iter().map(|e| e.data_len).sum::<u64>();
        Ok(Some(seg.read_entries(&s2, &entries)?))
    }

    /// Adds what was read of segment `seg` (its data and records) to `maps` and `got`; a read that failed on
    /// damage is left out or fails the read (see [`damage`](Self::damage)).
    fn gather<'a>(
        &self,
        seg: &'a Segment,
        read: Result<Option<SegData>, StoreError>,
        maps: &mut Vec<(&'a Segment, SegBytes)>,
        got: &mut Vec<(u32, Record)>,
    ) -> Result<(), StoreError> {
        match read {
            Ok(None) => Ok(()),
            Ok(Some(d)) => {
                let m = maps.len() as u32;
                got.extend(d.records.into_iter().map(|r| (m, r)));
                maps.push((seg, d.bytes));
                Ok(())
            }
            Err(e) => self.damage(seg.stage1.number, e, &seg.index),
        }
    }

    /// Calls `f` with every packet that may satisfy `need`, in the original order. Stage 1 rules segments out,
    /// stage 2 picks the flows, each flow is one read, checked against its data checksums; `f` returns false to
    /// stop. A damaged segment fails the query, or is left out when reads [skip damaged
    /// segments](Self::set_skip_damaged): no packet of it is given then.
    pub fn query(&self, need: &Need, f: &mut dyn FnMut(&StoredPacket<'_>) -> bool) -> Result<QueryStats, StoreError> {
        self.check_damaged()?;
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
            let mut maps: Vec<(&Segment, SegBytes)> = Vec::new();
            let mut got: Vec<(u32, Record)> = Vec::new();
            for seg in &order[i..j] {
                if !seg.stage1.may_match(need) {
                    continue;
                }
                st.stage1_passed += 1;
                let read = self.read_candidates(seg, need, &mut st);
                self.gather(seg, read, &mut maps, &mut got)?;
            }
            st.packets_read += got.len() as u64;
            if !in_order(&maps, got, f) {
                return Ok(st);
            }
            i = j;
        }
        Ok(st)
    }

    /// Calls `f` with the packets of flow `id` in order (one read per segment the flow spans, checked against
    /// its data checksums); false if the store has no such flow.
    pub fn flow(&self, id: u64, f: &mut dyn FnMut(&StoredPacket<'_>)) -> Result<bool, StoreError> {
        self.check_damaged()?;
        let mut maps: Vec<(&Segment, SegBytes)> = Vec::new();
        let mut got: Vec<(u32, Record)> = Vec::new();
        for seg in self.segments.iter().filter(|s| s.stage1.may_hold_flow(id)) {
            let read = || -> Result<Option<SegData>, StoreError> {
                let Some((entry, s2)) = seg.find_flow(id)? else { return Ok(None) };
                Ok(Some(seg.read_entries(&s2, &[&entry])?))
            };
            self.gather(seg, read(), &mut maps, &mut got)?;
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
        self.check_damaged()?;
        let mut by_id: FxHashMap<u64, Flow> = FxHashMap::default();
        for seg in self.segments.iter().filter(|s| s.stage1.may_match(need)) {
            let entries = match seg.stage2_kept().and_then(|s2| s2.candidates(need)) {
                Ok(e) => e,
                Err(e) => {
                    self.damage(seg.stage1.number, e, &seg.index)?;
                    continue;
                }
            };
            for e in entries {
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

/// Whether `dir` is a flow store's directory: it holds a store's files (its writer lock, a segment, its
/// quarantine). An empty directory is not one yet.
pub fn is_store_dir(dir: &Path) -> bool {
    dir.is_dir() && matches!(StoreDir::of(dir), Ok(StoreDir::Store))
}

/// What a directory holds, as a store sees it.
#[derive(Debug, PartialEq, Eq)]
enum StoreDir {
    /// A store's files: its writer lock (every writer makes it), a segment's file, or its quarantine.
    Store,
    /// Nothing: a store can be made in it.
    Empty,
    /// Other files (one of them named), and nothing of a store's.
    Foreign(String),
}

impl StoreDir {
    fn of(dir: &Path) -> Result<StoreDir, StoreError> {
        let mut other = None;
        for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))? {
            let name = entry.map_err(|e| StoreError::io(dir, e))?.file_name().to_string_lossy().into_owned();
            if name == LOCK_FILE || name == QUARANTINE || segment_number(&name).is_some() {
                return Ok(StoreDir::Store);
            }
            other.get_or_insert(name);
        }
        Ok(other.map_or(StoreDir::Empty, StoreDir::Foreign))
    }
}

/// Refuses a path that is not a directory.
fn check_dir(dir: &Path) -> Result<(), StoreError> {
    if !dir.is_dir() {
        return Err(StoreError::NotAStore { dir: dir.to_path_buf(), holds: None });
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// The segment numbers in a store's quarantine folder.
pub(crate) fn quarantined_numbers(dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir.join(QUARANTINE)) else { return Vec::new() };
    let mut v: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| segment_number(n).map(|x| x.0)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Calls `f` with the records `got` (each the index of its segment's mapped data in `maps`) in the store's order;
/// false if `f` asked to stop.
fn in_order(
    maps: &[(&Segment, SegBytes)],
    mut got: Vec<(u32, Record)>,
    f: &mut dyn FnMut(&StoredPacket<'_>) -> bool,
) -> bool {
    got.sort_unstable_by_key(|g| g.1.seq);
    for (m, r) in &got {
        let (seg, data) = &maps[*m as usize];
        let data = &data.bytes()[r.at..r.at + r.len];
        let meta = seg.stage1.meta(r.iface);
        if !f(&StoredPacket { seq: r.seq, ts_ns: r.ts_ns, wirelen: r.wirelen, data, meta }) {
            return false;
        }
    }
    true
}
