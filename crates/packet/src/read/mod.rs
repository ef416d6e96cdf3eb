//! Reading traces: legacy pcap and pcapng from a memory map, a byte slice, a compressed file or standard input.
//!
//! [`TraceReader::open`] finds the format from the first bytes, never from the file name. An uncompressed regular
//! file is memory-mapped and iterated without copying; a compressed file (gzip, zstd, lz4 frame) is decompressed on a
//! thread of its own; standard input (`-`) and pipes are read as a stream. Every path yields the same [`Record`]s.
//!
//! Damage is reported, never hidden: every complete record before it is delivered, then one [`TraceError`] naming
//! the file, the byte offset and what was wrong, and then the iteration ends.

mod parser;
mod stream;

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub use parser::{FileFormat, Interface, MAX_SNAPLEN, TsResolution, max_caplen};
pub use stream::Compression;

use crate::error::{ErrorKind, TraceError};
use crate::sys::{Mapped, prefetch};
use crate::types::LinkType;
use parser::{Parser, RecordMeta, State, Step};
use stream::ThreadedReader;

/// How far ahead of the current record the slice readers prefetch. Measured on a page-cached 1.5 GB trace
/// (docs/BENCHMARKS.md): a bare record walk is bound by memory latency on large records.
const PREFETCH_DISTANCE: usize = 8192;
const CACHE_LINE: usize = 64;

/// Prefetches every cache line up to `PREFETCH_DISTANCE` bytes ahead of the read position, so that the walk over
/// record headers looks like a sequential stream to the memory system instead of one miss per record.
#[derive(Clone, Copy, Debug, Default)]
struct Prefetcher {
    next: usize,
}

impl Prefetcher {
    #[inline(always)]
    fn advance(&mut self, data: &[u8], pos: usize) {
        let target = (pos + PREFETCH_DISTANCE).min(data.len());
        if self.next < pos {
            self.next = pos & !(CACHE_LINE - 1);
        }
        while self.next < target {
            prefetch(data, self.next);
            self.next += CACHE_LINE;
        }
    }
}

/// One captured packet and where it came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Record<'a> {
    /// Timestamp in nanoseconds since the Unix epoch (0 for pcapng simple packet blocks, see `has_ts`).
    pub ts_ns: u64,
    /// Whether the record carries a timestamp (pcapng simple packet blocks do not).
    pub has_ts: bool,
    /// Length on the wire; may exceed `data.len()` when the capture was cut by the snapshot length.
    pub wirelen: u32,
    /// Interface index: 0 for pcap; for pcapng the index of the interface among all interface description blocks
    /// of the file, counted across sections (see [`TraceReader::interfaces`]).
    pub iface: u32,
    /// Link type of the packet.
    pub linktype: LinkType,
    /// Byte offset of the record (pcap record header or pcapng block) in the capture stream.
    pub offset: u64,
    /// Bytes the record occupies in the stream, header and padding included.
    pub record_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

impl Record<'_> {
    /// Captured length (`data.len()`).
    #[inline]
    pub fn caplen(&self) -> u32 {
        self.data.len() as u32
    }

    /// Whether the snapshot length cut the packet (`caplen < wirelen`).
    #[inline]
    pub fn is_truncated(&self) -> bool {
        self.caplen() < self.wirelen
    }

    /// Asks the CPU to start loading the packet's first 128 bytes (where its headers are) into the cache: a hint
    /// for code that reads the headers of many records some time after the walk that found them (a record in a
    /// large mapped trace is otherwise one miss to memory each). Never faults, changes nothing observable.
    #[inline(always)]
    pub fn prefetch_headers(&self) {
        prefetch(self.data, 0);
        prefetch(self.data, 64);
    }
}

#[inline]
fn make_record<'a>(m: &RecordMeta, offset: u64, block: &'a [u8]) -> Record<'a> {
    Record {
        ts_ns: m.ts_ns,
        has_ts: m.has_ts,
        wirelen: m.wirelen,
        iface: m.iface,
        linktype: m.linktype,
        offset,
        record_len: m.consumed as u32,
        data: &block[m.data_start..m.data_start + m.caplen as usize],
    }
}

/// Steps the parser over `data` from `*pos` to the next record. `Err` carries the offset of the damage.
#[inline(always)]
fn slice_next(
    parser: &mut Parser,
    pf: &mut Prefetcher,
    data: &[u8],
    pos: &mut usize,
    mut structure: Option<&mut Vec<u64>>,
) -> Option<Result<RecordMeta, (usize, ErrorKind)>> {
    loop {
        let at = *pos;
        pf.advance(data, at);
        let structural = structure.is_some() && parser.is_structure(&data[at..]);
        match parser.step(&data[at..]) {
            Ok(Step::Record(m)) => {
                *pos = at + m.consumed;
                return Some(Ok(m));
            }
            Ok(Step::Skip(n)) => {
                if structural && let Some(s) = structure.as_deref_mut() {
                    s.push(at as u64);
                }
                *pos = at + n;
            }
            Ok(Step::End) => return None,
            Ok(Step::Need { needed, what }) => {
                let available = (data.len() - at) as u64;
                return Some(Err((at, ErrorKind::Truncated { what, needed: needed as u64, available })));
            }
            Err(kind) => return Some(Err((at, kind))),
        }
    }
}

/// Zero-copy iterator over the records of a capture held in memory (a slice or a memory map).
///
/// ```
/// use pcaptool_packet::{Records, PcapWriter, LinkType, TsPrecision};
/// let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Micro).unwrap();
/// w.write_packet(1_500_000_000, 60, &[0u8; 60]).unwrap();
/// let bytes = w.finish().unwrap();
/// let recs: Vec<_> = Records::new(&bytes).collect::<Result<_, _>>().unwrap();
/// assert_eq!(recs.len(), 1);
/// assert_eq!(recs[0].ts_ns, 1_500_000_000);
/// assert_eq!(recs[0].offset, 24);
/// ```
#[derive(Debug, Clone)]
pub struct Records<'a> {
    data: &'a [u8],
    pos: usize,
    parser: Parser,
    pf: Prefetcher,
    path: Option<PathBuf>,
    done: bool,
    structure: Option<Vec<u64>>,
}

impl<'a> Records<'a> {
    /// Iterates the records of a whole capture file held in `data`.
    pub fn new(data: &'a [u8]) -> Records<'a> {
        Records {
            data,
            pos: 0,
            parser: Parser::new(),
            pf: Prefetcher::default(),
            path: None,
            done: false,
            structure: None,
        }
    }

    /// Also collects the offsets of the structures that are not packets but that reading a packet depends on
    /// (the pcap file header; pcapng section headers and interface descriptions), for [`Seeker::new`].
    pub fn track_structure(mut self) -> Records<'a> {
        self.structure = Some(Vec::new());
        self
    }

    /// The structure offsets collected so far (see [`track_structure`](Self::track_structure)).
    pub fn structure(&self) -> &[u64] {
        self.structure.as_deref().unwrap_or(&[])
    }

    /// Names the file in errors.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Records<'a> {
        self.path = Some(path.into());
        self
    }

    /// The format, once the header has been read.
    pub fn format(&self) -> Option<FileFormat> {
        self.parser.format()
    }

    /// The interfaces declared so far.
    pub fn interfaces(&self) -> &[Interface] {
        self.parser.interfaces()
    }

    /// Byte offset of the next structure to read.
    pub fn position(&self) -> u64 {
        self.pos as u64
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, TraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let at = self.pos;
        match slice_next(&mut self.parser, &mut self.pf, self.data, &mut self.pos, self.structure.as_mut()) {
            Some(Ok(m)) => {
                let off = self.pos - m.consumed;
                debug_assert!(off >= at);
                Some(Ok(make_record(&m, off as u64, &self.data[off..])))
            }
            Some(Err((off, kind))) => {
                self.done = true;
                Some(Err(TraceError::new(self.path.clone(), off as u64, kind)))
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

/// Reads single records at known offsets of a capture held in memory, with the format state (byte order,
/// precision, interfaces of the section) that a sequential reader has there: how an index reads the packets it
/// selects without walking the file.
///
/// ```
/// use pcaptool_packet::{LinkType, PcapWriter, Records, Seeker, TsPrecision};
/// let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano)?;
/// w.write_packet(5, 60, &[1u8; 60])?;
/// w.write_packet(9, 60, &[2u8; 60])?;
/// let file = w.finish()?;
/// let mut records = Records::new(&file).track_structure();
/// let offsets: Vec<u64> = records.by_ref().map(|r| r.map(|r| r.offset)).collect::<Result<_, _>>()?;
/// let seeker = Seeker::new(&file, records.structure())?;
/// assert_eq!(seeker.record_at(&file, offsets[1])?.ts_ns, 9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Seeker {
    /// The parser after every structure: it answers for any section.
    parser: Parser,
    /// From each offset on, the state in effect there and how many interfaces were declared by then (one entry
    /// per section; one for pcap).
    states: Vec<(u64, State, u32)>,
    path: Option<PathBuf>,
}

impl Seeker {
    /// Replays the structures at `structure` (offsets in file order, as [`Records::structure`] collected them)
    /// of the capture `data`.
    pub fn new(data: &[u8], structure: &[u64]) -> Result<Seeker, TraceError> {
        let mut parser = Parser::new();
        let mut states: Vec<(u64, State, u32)> = Vec::new();
        for &off in structure {
            let err = |kind| TraceError::new(None, off, kind);
            let buf = usize::try_from(off).ok().and_then(|o| data.get(o..)).ok_or_else(|| {
                err(ErrorKind::Truncated { what: "a file structure", needed: off, available: data.len() as u64 })
            })?;
            let new_section = parser.is_section_start(buf);
            match parser.step(buf).map_err(err)? {
                Step::Skip(_) => {}
                _ => return Err(err(ErrorKind::NotStructure)),
            }
            let now = (parser.state(), parser.interfaces().len() as u32);
            match states.last_mut() {
                Some(last) if !new_section => (last.1, last.2) = now,
                _ => states.push((off, now.0, now.1)),
            }
        }
        if states.is_empty() {
            return Err(TraceError::new(None, 0, ErrorKind::NotStructure));
        }
        Ok(Seeker { parser, states, path: None })
    }

    /// Names the file in errors.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Seeker {
        self.path = Some(path.into());
        self
    }

    /// The capture's format.
    pub fn format(&self) -> Option<FileFormat> {
        self.parser.format()
    }

    /// Every interface of the capture.
    pub fn interfaces(&self) -> &[Interface] {
        self.parser.interfaces()
    }

    /// What the parser answers at `buf`, which starts at stream offset `offset`, in the section holding it.
    fn peek_at(&self, offset: u64, buf: &[u8]) -> Result<Step, ErrorKind> {
        let i = self.states.partition_point(|s| s.0 <= offset).saturating_sub(1);
        let (_, state, interfaces) = self.states[i];
        self.parser.peek_record_in(state, interfaces, buf)
    }

    /// The packet record at `offset` of `data` (the same bytes given to [`new`](Self::new)).
    pub fn record_at<'a>(&self, data: &'a [u8], offset: u64) -> Result<Record<'a>, TraceError> {
        let err = |kind| TraceError::new(self.path.clone(), offset, kind);
        let buf = usize::try_from(offset).ok().and_then(|o| data.get(o..)).unwrap_or(&[]);
        match self.peek_at(offset, buf).map_err(err)? {
            Step::Record(m) => Ok(make_record(&m, offset, buf)),
            Step::Need { needed, what } => {
                Err(err(ErrorKind::Truncated { what, needed: needed as u64, available: buf.len() as u64 }))
            }
            Step::Skip(_) | Step::End => Err(err(ErrorKind::NotRecord)),
        }
    }

    /// What lies at stream offset `offset`, read from `window`, which holds the stream's bytes from
    /// `window_start` on (a buffer filled by `pread`, say, instead of a mapping of the whole file). `offset` must be
    /// inside the window or at its end.
    ///
    /// ```
    /// use pcaptool_packet::{LinkType, Peek, PcapWriter, Records, Seeker, TsPrecision};
    /// let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano)?;
    /// w.write_packet(5, 60, &[1u8; 60])?;
    /// let file = w.finish()?;
    /// let mut records = Records::new(&file).track_structure();
    /// records.by_ref().for_each(drop);
    /// let seeker = Seeker::new(&file, records.structure())?;
    /// // A window holding the stream from byte 24 (the first record) on, cut short, then whole.
    /// assert_eq!(seeker.peek_in(&file[24..50], 24, 24)?, Peek::Beyond(16 + 60));
    /// match seeker.peek_in(&file[24..], 24, 24)? {
    ///     Peek::Record(r) => assert_eq!((r.ts_ns, r.offset, r.data.len()), (5, 24, 60)),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_in<'a>(&self, window: &'a [u8], window_start: u64, offset: u64) -> Result<Peek<'a>, TraceError> {
        let err = |kind| TraceError::new(self.path.clone(), offset, kind);
        let buf = offset
            .checked_sub(window_start)
            .and_then(|d| usize::try_from(d).ok())
            .and_then(|d| window.get(d..))
            .unwrap_or(&[]);
        match self.peek_at(offset, buf).map_err(err)? {
            Step::Record(m) => Ok(Peek::Record(make_record(&m, offset, buf))),
            Step::Skip(n) => Ok(Peek::Skip(n as u64)),
            Step::Need { needed, .. } => Ok(Peek::Beyond(needed as u64)),
            Step::End => Ok(Peek::Beyond(1)),
        }
    }

    /// The `n`-th packet record after the one at `offset` (the 0th: the first packet record at or after
    /// `offset`, as [`next_record_at`](Self::next_record_at) finds it), and the offset after it. In a pcap
    /// file the records before it are only measured (their headers' lengths checked), not decoded.
    pub fn nth_record_at<'a>(&self, data: &'a [u8], offset: u64, n: usize) -> Result<(Record<'a>, u64), TraceError> {
        let mut off = offset;
        let mut left = n;
        if let [(_, State::Pcap(p), _)] = self.states.as_slice()
            && let Some(o) = parser::skip_pcap_records(p, data, offset, n)
        {
            (off, left) = (o, 0);
        }
        // (pcapng, or a record on the way that is not whole: read record by record, which says what is wrong.)
        loop {
            let rec = self.next_record_at(data, off)?;
            off = rec.offset + u64::from(rec.record_len);
            if left == 0 {
                return Ok((rec, off));
            }
            left -= 1;
        }
    }

    /// Many of [`nth_record_at`](Self::nth_record_at)'s walks at once: each `(offset, n)` of `walks` steps over
    /// whole pcap records until `n` is 0 and `offset` that of the record it named. The walks step in turn, one
    /// record each, so that their reads of record headers (on a large memory-mapped trace, each a wait for memory)
    /// overlap rather than follow one another. A walk stops where a record is not whole or too long, with `n` what
    /// is left, for `nth_record_at` to go on from there (and say what is wrong). Returns `false`, every walk
    /// untouched, unless the capture is one pcap stream (pcapng blocks are walked by `nth_record_at` alone).
    ///
    /// ```
    /// use pcaptool_packet::{LinkType, PcapWriter, Records, Seeker, TsPrecision};
    /// let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano)?;
    /// for len in [60, 70, 80] {
    ///     w.write_packet(5, len, &vec![1u8; len as usize])?;
    /// }
    /// let file = w.finish()?;
    /// let mut records = Records::new(&file).track_structure();
    /// records.by_ref().for_each(drop);
    /// let seeker = Seeker::new(&file, records.structure())?;
    /// let mut walks = [(24, 2), (24 + 16 + 60, 0), (24, 5)];
    /// assert!(seeker.skip_records_many(&file, &mut walks));
    /// // Past the third record the walk of 5 stopped: there is no whole record at the end of the file.
    /// assert_eq!(walks, [(24 + 16 + 60 + 16 + 70, 0), (24 + 16 + 60, 0), (file.len() as u64, 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn skip_records_many(&self, data: &[u8], walks: &mut [(u64, usize)]) -> bool {
        let [(_, State::Pcap(p), _)] = self.states.as_slice() else { return false };
        for group in walks.chunks_mut(64) {
            // Walks that met a record they cannot step over.
            let mut stuck = 0u64;
            loop {
                let mut moved = false;
                for (k, (offset, n)) in group.iter_mut().enumerate() {
                    if *n == 0 || stuck >> k & 1 != 0 {
                        continue;
                    }
                    match parser::skip_pcap_records(p, data, *offset, 1) {
                        Some(next) => {
                            (*offset, *n) = (next, *n - 1);
                            moved = true;
                        }
                        None => stuck |= 1 << k,
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        true
    }

    /// The first packet record at or after `offset`, skipping blocks that are not packets (statistics, name
    /// resolution, interface descriptions, a new section).
    pub fn next_record_at<'a>(&self, data: &'a [u8], offset: u64) -> Result<Record<'a>, TraceError> {
        let mut off = offset;
        loop {
            match self.record_at(data, off) {
                Err(e) if matches!(e.kind, ErrorKind::NotRecord) => {
                    let buf = usize::try_from(off).ok().and_then(|o| data.get(o..)).unwrap_or(&[]);
                    match self.peek_at(off, buf) {
                        Ok(Step::Skip(n)) => off += n as u64,
                        _ => return Err(e),
                    }
                }
                r => return r,
            }
        }
    }
}

/// What [`Seeker::peek_in`] found at an offset of a window of the capture stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek<'a> {
    /// A packet record, whole inside the window.
    Record(Record<'a>),
    /// A structure that is not a packet (a pcapng statistics, name resolution or interface block, a new section):
    /// the next structure starts this many bytes further.
    Skip(u64),
    /// The structure continues past the window: it needs this many bytes from the offset (read more and ask
    /// again; at the end of the stream this is a truncated capture).
    Beyond(u64),
}

/// Options for [`TraceReader::open_with`].
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    no_mmap: bool,
}

impl ReadOptions {
    /// Options with defaults (memory-map uncompressed regular files).
    pub fn new() -> ReadOptions {
        ReadOptions::default()
    }

    /// Reads files through `read(2)` instead of a memory map, for files another process may truncate.
    pub fn no_mmap(&mut self, yes: bool) -> &mut ReadOptions {
        self.no_mmap = yes;
        self
    }
}

#[derive(Debug)]
enum Bytes {
    /// Shared by the readers [`TraceReader::share`] makes.
    Mapped(std::sync::Arc<Mapped>),
    Owned(Vec<u8>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.bytes(),
            Bytes::Owned(v) => v,
        }
    }
}

struct Stream {
    src: Box<dyn Read + Send>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// Stream offset of `buf[0]`.
    base: u64,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("base", &self.base).field("eof", &self.eof).finish_non_exhaustive()
    }
}

const STREAM_READ: usize = 1 << 18;

impl Stream {
    /// Makes `buf[start..end]` hold at least `needed` bytes, or reaches the end of input.
    fn fill(&mut self, needed: usize) -> io::Result<()> {
        if self.start > 0 && self.buf.len() - self.start < needed.max(STREAM_READ) {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        let want = needed.max(STREAM_READ);
        if self.buf.len() < self.start + want {
            self.buf.resize(self.start + want, 0);
        }
        while self.end - self.start < needed && !self.eof {
            if self.end == self.buf.len() {
                let n = self.buf.len() + STREAM_READ;
                self.buf.resize(n, 0);
            }
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
enum Source {
    Bytes { data: Bytes, pos: usize, pf: Prefetcher },
    Stream(Stream),
}

/// A reader over one trace from any source; records borrow from the reader (see [`TraceReader::next_record`]).
///
/// ```no_run
/// # fn main() -> Result<(), pcaptool_packet::TraceError> {
/// let mut r = pcaptool_packet::TraceReader::open("trace.pcap.gz")?;
/// while let Some(rec) = r.next_record() {
///     let rec = rec?;
///     println!("{} {} bytes", rec.ts_ns, rec.wirelen);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TraceReader {
    source: Source,
    parser: Parser,
    path: Option<PathBuf>,
    compression: Option<Compression>,
    done: bool,
}

impl TraceReader {
    /// Opens `path` (`-` is standard input) with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceReader, TraceError> {
        TraceReader::open_with(path, &ReadOptions::default())
    }

    /// Opens `path` (`-` is standard input).
    pub fn open_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<TraceReader, TraceError> {
        let path = path.as_ref();
        if path.as_os_str() == "-" {
            return TraceReader::from_reader(Box::new(io::stdin()), None);
        }
        let owned = Some(path.to_path_buf());
        let open = |e| TraceError::new(owned.clone(), 0, ErrorKind::Open(e));
        let mut file = File::open(path).map_err(open)?;
        let meta = file.metadata().map_err(open)?;
        if meta.is_dir() {
            return Err(open(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory")));
        }
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut file, &mut magic).map_err(|e| TraceError::io(owned.clone(), 0, e))?;
        let magic = &magic[..got];
        if meta.is_file() && Compression::detect(magic).is_none() {
            let data = if opts.no_mmap || meta.len() == 0 {
                let mut v = magic.to_vec();
                file.read_to_end(&mut v).map_err(|e| TraceError::io(owned.clone(), 0, e))?;
                Bytes::Owned(v)
            } else {
                Bytes::Mapped(std::sync::Arc::new(Mapped::map(&file).map_err(open)?))
            };
            return Ok(TraceReader::with_source(
                Source::Bytes { data, pos: 0, pf: Prefetcher::default() },
                owned,
                None,
            ));
        }
        let prefix = io::Cursor::new(magic.to_vec());
        TraceReader::from_reader(Box::new(prefix.chain(file)), owned)
    }

    /// Reads a capture from a stream, detecting compression from its first bytes; `path` names it in errors.
    pub fn from_reader(mut src: Box<dyn Read + Send>, path: Option<PathBuf>) -> Result<TraceReader, TraceError> {
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut src, &mut magic).map_err(|e| TraceError::io(path.clone(), 0, e))?;
        let magic = magic[..got].to_vec();
        let compression = Compression::detect(&magic);
        let mut src: Box<dyn Read + Send> = Box::new(io::Cursor::new(magic).chain(src));
        if let Some(c) = compression {
            let dec = c.decoder(src).map_err(|e| TraceError::io(path.clone(), 0, e))?;
            src = Box::new(ThreadedReader::spawn(dec).map_err(|e| TraceError::io(path.clone(), 0, e))?);
        }
        let stream = Stream { src, buf: Vec::new(), start: 0, end: 0, eof: false, base: 0 };
        Ok(TraceReader::with_source(Source::Stream(stream), path, compression))
    }

    /// Reads a capture held in memory.
    pub fn from_bytes(data: Vec<u8>, path: Option<PathBuf>) -> TraceReader {
        TraceReader::with_source(
            Source::Bytes { data: Bytes::Owned(data), pos: 0, pf: Prefetcher::default() },
            path,
            None,
        )
    }

    fn with_source(source: Source, path: Option<PathBuf>, compression: Option<Compression>) -> TraceReader {
        TraceReader { source, parser: Parser::new(), path, compression, done: false }
    }

    /// Another reader of the same mapped file, at its start (its header not yet read), sharing the mapping: the
    /// pages one reader touched are mapped for the other, so a program answering many requests over one trace pays
    /// each page fault once. `None` for a stream or bytes in memory.
    pub fn share(&self) -> Option<TraceReader> {
        match &self.source {
            Source::Bytes { data: Bytes::Mapped(m), .. } => Some(TraceReader::with_source(
                Source::Bytes { data: Bytes::Mapped(m.clone()), pos: 0, pf: Prefetcher::default() },
                self.path.clone(),
                None,
            )),
            _ => None,
        }
    }

    /// The compression of the input, if any.
    pub fn compression(&self) -> Option<Compression> {
        self.compression
    }

    /// The file name given to `open`, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The container format; `None` until the first record (or header) has been read.
    pub fn format(&self) -> Option<FileFormat> {
        self.parser.format()
    }

    /// The interfaces declared so far (one for pcap; every interface description block for pcapng).
    pub fn interfaces(&self) -> &[Interface] {
        self.parser.interfaces()
    }

    /// The whole uncompressed capture when it is memory-mapped or in memory; `None` for streams. Parallel readers
    /// split work with [`Records`] over these bytes.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.source {
            Source::Bytes { data, .. } => Some(data.get()),
            Source::Stream(_) => None,
        }
    }

    /// Reads the header (for pcapng, the blocks before the first packet) so that [`format`](Self::format) and
    /// [`interfaces`](Self::interfaces) are known, without consuming a record.
    pub fn read_header(&mut self) -> Result<(), TraceError> {
        // Steps the parser over the structures before the first record. A record's step changes nothing in the
        // parser (only structures do), so the record is left to `next_record`; no copy of the parser is made,
        // which with many interfaces would cost time quadratic in their number.
        loop {
            let (buf, base, eof): (&[u8], u64, bool) = match &mut self.source {
                Source::Bytes { data, pos, .. } => (&data.get()[*pos..], *pos as u64, true),
                Source::Stream(s) => (&s.buf[s.start..s.end], s.base + s.start as u64, s.eof),
            };
            match self.parser.step(buf) {
                Ok(Step::Skip(n)) => match &mut self.source {
                    Source::Bytes { pos, .. } => *pos += n,
                    Source::Stream(s) => s.start += n,
                },
                Ok(Step::Need { needed, .. }) if !eof => {
                    if let Source::Stream(s) = &mut self.source {
                        s.fill(needed).map_err(|e| read_error(&self.path, self.compression, base, e))?;
                    }
                }
                Ok(_) => return Ok(()),
                Err(kind) => return Err(TraceError::new(self.path.clone(), base, kind)),
            }
        }
    }

    /// The next record; `None` at the end of the trace or after an error has been returned.
    #[inline]
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, TraceError>> {
        match self.advance()? {
            Ok((m, off, begin)) => Some(Ok(self.record_at(&m, off, begin))),
            Err(e) => Some(Err(e)),
        }
    }

    /// Like [`next_record`](Self::next_record), with the interfaces declared so far (which describe
    /// `record.iface`), for code that writes records on.
    #[inline]
    pub fn next_with_interfaces(&mut self) -> Option<Result<(Record<'_>, &[Interface]), TraceError>> {
        match self.advance()? {
            Ok((m, off, begin)) => Some(Ok((self.record_at(&m, off, begin), self.parser.interfaces()))),
            Err(e) => Some(Err(e)),
        }
    }

    #[inline]
    fn record_at(&self, m: &RecordMeta, off: u64, begin: usize) -> Record<'_> {
        let buf = match &self.source {
            Source::Bytes { data, .. } => data.get(),
            Source::Stream(s) => &s.buf,
        };
        make_record(m, off, &buf[begin..])
    }

    /// Moves to the next record: its facts, stream offset and start within the current buffer.
    #[inline]
    fn advance(&mut self) -> Option<Result<(RecordMeta, u64, usize), TraceError>> {
        if self.done {
            return None;
        }
        let res = match &mut self.source {
            Source::Bytes { data, pos, pf } => match slice_next(&mut self.parser, pf, data.get(), pos, None) {
                Some(Ok(m)) => {
                    let begin = *pos - m.consumed;
                    Some(Ok((m, begin as u64, begin)))
                }
                Some(Err((off, kind))) => Some(Err(TraceError::new(self.path.clone(), off as u64, kind))),
                None => None,
            },
            Source::Stream(s) => stream_next(&mut self.parser, s, &self.path, self.compression),
        };
        if !matches!(res, Some(Ok(_))) {
            self.done = true;
        }
        res
    }
}

fn stream_next(
    parser: &mut Parser,
    s: &mut Stream,
    path: &Option<PathBuf>,
    compression: Option<Compression>,
) -> Option<Result<(RecordMeta, u64, usize), TraceError>> {
    loop {
        let off = s.base + s.start as u64;
        match parser.step(&s.buf[s.start..s.end]) {
            Ok(Step::Record(m)) => {
                let begin = s.start;
                s.start += m.consumed;
                return Some(Ok((m, off, begin)));
            }
            Ok(Step::Skip(n)) => s.start += n,
            Ok(Step::End) if s.eof => return None,
            Ok(Step::End) => {
                if let Err(e) = s.fill(1) {
                    return Some(Err(read_error(path, compression, off, e)));
                }
            }
            Ok(Step::Need { needed, what }) => {
                if s.eof {
                    let available = (s.end - s.start) as u64;
                    let kind = ErrorKind::Truncated { what, needed: needed as u64, available };
                    return Some(Err(TraceError::new(path.clone(), off, kind)));
                }
                if let Err(e) = s.fill(needed) {
                    return Some(Err(read_error(path, compression, off, e)));
                }
            }
            Err(kind) => return Some(Err(TraceError::new(path.clone(), off, kind))),
        }
    }
}

fn read_error(path: &Option<PathBuf>, compression: Option<Compression>, offset: u64, e: io::Error) -> TraceError {
    match compression {
        Some(c) => TraceError::new(path.clone(), offset, ErrorKind::Decompress { codec: c.name(), source: e }),
        None => TraceError::io(path.clone(), offset, e),
    }
}

fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests;
