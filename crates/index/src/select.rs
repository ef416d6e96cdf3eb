//! Loading an index and answering field conditions with it: key tables say which keys may satisfy a condition,
//! time pages which packets may be in a window, and the wavelet tree where those keys occur (rank/select).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pcaptool_packet::{Field, MappedFile, Need, PacketFields, Pred, Record, Seeker};
use pcaptool_wavelet::{HuffmanWaveletTree, LeBytes, RsBitVector, WaveletMatrix};
use rayon::prelude::*;

use crate::IndexError;
use crate::build::identity;
use crate::format::{BLOCK, Cursor, HEADER_LEN, Header, HeaderError, PAGE, crc32};
use crate::keys::{KEY_FIELDS, KeyTable, LEN_BOUNDS, class_decided, class_may, code_may, flags_code, len_class};
use crate::keyseq::KeySeq;

#[derive(Clone, Copy, Debug)]
struct DirEntry {
    offset: u64,
    len: u64,
    crc: u32,
    packets: u32,
    first_packet: u64,
    t_min: u64,
    t_max: u64,
}

/// An index's bytes: mapped from its file, or given.
#[derive(Debug)]
enum Bytes {
    Mapped(MappedFile),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.bytes(),
            Bytes::Owned(v) => v,
        }
    }
}

/// An index file read into memory, its header and directory checked.
#[derive(Debug)]
pub struct IndexFile {
    path: PathBuf,
    bytes: Bytes,
    header: Header,
    structure: Vec<u64>,
    dir: Vec<DirEntry>,
}

impl IndexFile {
    /// Maps the index at `path` into memory and checks its header and directory (chunks are checked by
    /// [`view`](Self::view)).
    pub fn open(path: &Path) -> Result<IndexFile, IndexError> {
        let map = MappedFile::open(path).map_err(|e| IndexError::io(path, e))?;
        IndexFile::load(path, Bytes::Mapped(map))
    }

    /// Checks the header and directory of index bytes read from `path` (named in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<IndexFile, IndexError> {
        IndexFile::load(path, Bytes::Owned(bytes))
    }

    fn load(path: &Path, owned: Bytes) -> Result<IndexFile, IndexError> {
        let bytes = owned.as_slice();
        let corrupt = |offset: u64, why: String| IndexError::Corrupt { path: path.to_path_buf(), offset, why };
        let header = Header::decode(bytes).map_err(|e| match e {
            HeaderError::Foreign(why) => IndexError::NotIndex { path: path.to_path_buf(), why },
            HeaderError::Version(found) => IndexError::Version { path: path.to_path_buf(), found },
            HeaderError::Damaged(why) => corrupt(0, why),
        })?;
        let dir_start = header.dir_offset;
        let dir_bytes = usize::try_from(dir_start)
            .ok()
            .zip(usize::try_from(header.dir_len).ok())
            .and_then(|(s, l)| bytes.get(s..s.checked_add(l)?))
            .filter(|d| d.len() >= 12 && dir_start >= HEADER_LEN as u64)
            .ok_or_else(|| {
                corrupt(dir_start, format!("the directory ({} bytes) is not inside the file", header.dir_len))
            })?;
        if dir_start + header.dir_len != bytes.len() as u64 {
            return Err(corrupt(dir_start + header.dir_len, "bytes after the directory".into()));
        }
        let (body, stored) = dir_bytes.split_at(dir_bytes.len() - 4);
        if crc32(body) != u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]) {
            return Err(corrupt(dir_start, "directory checksum mismatch".into()));
        }
        let parse = || -> Result<(Vec<u64>, Vec<DirEntry>), String> {
            let mut c = Cursor::new(body);
            let n = c.u32()? as usize;
            c.u32()?;
            let structure = (0..n).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let mut dir = Vec::with_capacity(header.chunks as usize);
            let mut next_offset = HEADER_LEN as u64;
            let mut next_packet = 0u64;
            for i in 0..header.chunks {
                let e = DirEntry {
                    offset: c.u64()?,
                    len: c.u64()?,
                    crc: c.u32()?,
                    packets: c.u32()?,
                    first_packet: c.u64()?,
                    t_min: c.u64()?,
                    t_max: c.u64()?,
                };
                let last = i + 1 == header.chunks;
                if e.offset != next_offset
                    || e.first_packet != next_packet
                    || e.packets == 0
                    || e.packets > header.chunk_packets
                    || (!last && e.packets != header.chunk_packets)
                {
                    return Err(format!("directory entry {i} does not follow the previous chunk"));
                }
                next_offset = e.offset.checked_add(e.len).ok_or("chunk length overflows")?;
                next_packet += u64::from(e.packets);
                dir.push(e);
            }
            if next_offset != dir_start || next_packet != header.packets || !c.is_empty() {
                return Err("the chunks do not tile the file up to the directory".into());
            }
            Ok((structure, dir))
        };
        let (structure, dir) = parse().map_err(|why| corrupt(dir_start, why))?;
        Ok(IndexFile { path: path.to_path_buf(), bytes: owned, header, structure, dir })
    }

    /// The index file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Packets indexed.
    pub fn packets(&self) -> u64 {
        self.header.packets
    }

    /// Bytes of the index file.
    pub fn size_bytes(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Whether the trace is compressed (its packets are then read by streaming it).
    pub fn compressed(&self) -> bool {
        self.header.compression != 0
    }

    /// The snapshot length packets were cut to before their fields were read (`u32::MAX`: none).
    pub fn snap(&self) -> u32 {
        self.header.snap
    }

    /// Offset in the capture stream of the damage that ended indexing, if the trace is damaged.
    pub fn damage(&self) -> Option<u64> {
        (self.header.damage != u64::MAX).then_some(self.header.damage)
    }

    /// Offsets of the trace's structures (for [`Seeker::new`]).
    pub fn structure(&self) -> &[u64] {
        &self.structure
    }

    /// Checks that `trace` is the file this index describes, unchanged (length, modification time, the checksums
    /// of its first and last MiB, compression) and that packets are cut to the same snapshot length `snap`.
    pub fn check_trace(&self, trace: &Path, compressed_code: Option<u8>, snap: u32) -> Result<(), IndexError> {
        let stale = |why: String| IndexError::Stale { index: self.path.clone(), trace: trace.to_path_buf(), why };
        let (len, mtime, head, tail) = identity(trace)?;
        let h = &self.header;
        if len != h.trace_len {
            return Err(stale(format!("the trace has {len} bytes, the index was built on {}", h.trace_len)));
        }
        if mtime != h.mtime_ns {
            return Err(stale("the trace was modified after it was indexed".into()));
        }
        if head != h.head_crc || tail != h.tail_crc {
            return Err(stale("the trace's first or last MiB differs from what was indexed".into()));
        }
        if let Some(c) = compressed_code
            && c != h.compression
        {
            return Err(stale("the trace's compression differs".into()));
        }
        if snap != h.snap {
            return Err(stale(format!("packets are cut to {snap} bytes now, to {} when indexed", h.snap)));
        }
        Ok(())
    }

    /// Checks every chunk (checksum and structure) and returns the queryable view.
    pub fn view(&self) -> Result<IndexView<'_>, IndexError> {
        let chunks = self
            .dir
            .par_iter()
            .map(|e| {
                let corrupt = |why: String| IndexError::Corrupt { path: self.path.clone(), offset: e.offset, why };
                let b = &self.bytes.as_slice()[e.offset as usize..(e.offset + e.len) as usize];
                if crc32(b) != e.crc {
                    return Err(corrupt("chunk checksum mismatch".into()));
                }
                ChunkView::parse(b, e).map_err(|why| corrupt(format!("chunk of packet {}: {why}", e.first_packet)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IndexView { file: self, chunks })
    }
}

type Huffman<'a> = HuffmanWaveletTree<RsBitVector<LeBytes<'a>>, LeBytes<'a>>;
type Matrix<'a> = WaveletMatrix<RsBitVector<LeBytes<'a>>, LeBytes<'a>>;

/// A per-packet sequence's wavelet structure: whichever the builder found smaller.
#[derive(Debug)]
pub(crate) enum Tree<'a> {
    Huffman(Huffman<'a>),
    Matrix(Matrix<'a>),
}

impl<'a> Tree<'a> {
    /// Loads either structure, by the kind in its PTWV header.
    pub(crate) fn from_bytes(b: &'a [u8]) -> Result<Tree<'a>, pcaptool_wavelet::Error> {
        match b.get(6..8).map(|k| u16::from_le_bytes([k[0], k[1]])) {
            Some(4) => Ok(Tree::Matrix(Matrix::from_bytes(b)?)),
            _ => Ok(Tree::Huffman(Huffman::from_bytes(b)?)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Tree::Huffman(t) => t.len(),
            Tree::Matrix(t) => t.len(),
        }
    }

    pub(crate) fn access(&self, i: usize) -> u32 {
        match self {
            Tree::Huffman(t) => t.access(i),
            Tree::Matrix(t) => t.access(i),
        }
    }

    pub(crate) fn rank(&self, s: u32, i: usize) -> usize {
        match self {
            Tree::Huffman(t) => t.rank(s, i),
            Tree::Matrix(t) => t.rank(s, i),
        }
    }

    pub(crate) fn positions(&self, s: u32, l: usize, r: usize) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            Tree::Huffman(t) => Box::new(t.positions(s, l, r)),
            Tree::Matrix(t) => Box::new(t.positions(s, l, r)),
        }
    }

    /// The occurrences of every symbol below `alphabet` (a Huffman-shaped tree's slot table; a matrix walked
    /// once as a trie).
    fn symbol_counts(&self, alphabet: usize) -> Vec<u32> {
        let mut counts = vec![0u32; alphabet];
        match self {
            Tree::Huffman(t) => {
                for (s, c) in t.symbols() {
                    if let Some(x) = counts.get_mut(s as usize) {
                        *x = c as u32;
                    }
                }
            }
            Tree::Matrix(t) => {
                for (x, c) in counts.iter_mut().zip(t.counts_below(alphabet as u32)) {
                    *x = c as u32;
                }
            }
        }
        counts
    }

    /// The largest symbol the structure can hold (a matrix's width bounds it).
    fn max_symbol(&self) -> u64 {
        match self {
            Tree::Huffman(t) => t.symbols().map(|(s, _)| u64::from(s)).max().unwrap_or(0),
            Tree::Matrix(t) => (1u64 << t.width()) - 1,
        }
    }
}

/// One per-packet sequence of a chunk: its wavelet structure and, where the structure keeps them, the number of
/// occurrences of every symbol (so that counting a set of symbols over the chunk is a sum).
#[derive(Debug)]
struct Seq<'a> {
    tree: Tree<'a>,
    counts: Vec<u32>,
}

impl<'a> Seq<'a> {
    fn new(tree: Tree<'a>, alphabet: usize) -> Seq<'a> {
        let counts = tree.symbol_counts(alphabet);
        Seq { tree, counts }
    }

    fn access(&self, i: usize) -> u32 {
        self.tree.access(i)
    }

    /// Occurrences of `s` in `[l, r)`.
    fn count_between(&self, s: u32, l: usize, r: usize) -> usize {
        if l == 0 && r == self.tree.len() {
            self.counts.get(s as usize).map_or(0, |&c| c as usize)
        } else {
            self.tree.rank(s, r) - self.tree.rank(s, l)
        }
    }

    /// Occurrences in `[l, r)` of the symbols `truth` accepts.
    fn count_in(&self, truth: &[bool], l: usize, r: usize) -> usize {
        if l == 0 && r == self.tree.len() {
            return truth.iter().zip(&self.counts).filter(|(t, _)| **t).map(|(_, &c)| c as usize).sum();
        }
        members(truth).map(|s| self.count_between(s, l, r)).sum()
    }

    /// Appends the positions in `[l, r)` whose symbol `truth` accepts, ascending: by `select` for few of them,
    /// by one pass of `access` for many.
    fn positions(&self, truth: &[bool], l: usize, r: usize, out: &mut Vec<u32>) {
        let ok = |s: u32| truth.get(s as usize).copied().unwrap_or(false);
        let total = self.count_in(truth, l, r);
        if total == 0 {
            return;
        }
        let start = out.len();
        if total.saturating_mul(8) > r - l {
            out.extend((l..r).filter(|&i| ok(self.tree.access(i))).map(|i| i as u32));
        } else {
            for k in members(truth) {
                if self.count_between(k, l, r) > 0 {
                    out.extend(self.tree.positions(k, l, r).map(|i| i as u32));
                }
            }
            out[start..].sort_unstable();
        }
    }
}

/// One chunk of an index.
#[derive(Debug)]
pub struct ChunkView<'a> {
    n: usize,
    first_packet: u64,
    base: u64,
    wide: bool,
    pages: &'a [u8],
    blocks: &'a [u8],
    keys: KeyTable<'a>,
    /// Key id of every packet.
    tree: KeySeq<'a>,
    /// TCP flags code of every packet.
    flags: Seq<'a>,
    /// Wire-length class of every packet.
    lens: Seq<'a>,
    t_min: u64,
    t_max: u64,
    /// Key truth tables of recent predicates (planning and selecting ask for the same ones).
    cache: Mutex<Vec<(Pred, Arc<Vec<bool>>)>>,
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl<'a> ChunkView<'a> {
    fn parse(b: &'a [u8], e: &DirEntry) -> Result<ChunkView<'a>, String> {
        let mut c = Cursor::new(b);
        let n = c.u32()? as usize;
        let rows = c.u32()? as usize;
        let first_packet = c.u64()?;
        let base = c.u64()?;
        let width = c.u32()?;
        c.u32()?;
        if n != e.packets as usize || first_packet != e.first_packet {
            return Err("chunk header differs from the directory".into());
        }
        if width != 4 && width != 8 {
            return Err(format!("offset width {width}, expected 4 or 8"));
        }
        let pages = c.bytes(n.div_ceil(PAGE) * 16)?;
        let blocks = c.bytes(n.div_ceil(BLOCK) * width as usize)?;
        c.align8()?;
        let table = KeyTable::read(&mut c, rows)?;
        c.align8()?;
        if rows > n {
            return Err(format!("{rows} key table rows for {n} packets"));
        }
        let key_seq = KeySeq::read(&mut c, n, table.len())?;
        let mut tree = |what: &str, limit: usize| -> Result<Tree<'a>, String> {
            let len = c.u64()? as usize;
            let t = Tree::from_bytes(c.bytes(len)?).map_err(|e| format!("{what} wavelet tree: {e}"))?;
            c.align8()?;
            if t.len() != n {
                return Err(format!("the {what} wavelet tree has {} symbols for {n} packets", t.len()));
            }
            // A matrix may hold symbols up to its width: each access is checked against the limit instead.
            if matches!(t, Tree::Huffman(_)) && t.max_symbol() >= limit as u64 {
                return Err(format!("{what} symbol {} is out of range (below {limit})", t.max_symbol()));
            }
            Ok(t)
        };
        let flags = tree("TCP flags", FLAG_CODES as usize)?;
        let lens = tree("length class", LEN_BOUNDS.len())?;
        if !c.is_empty() {
            return Err(format!("{} bytes after the wavelet trees", b.len() - c.pos()));
        }
        let v = ChunkView {
            n,
            first_packet,
            base,
            wide: width == 8,
            pages,
            blocks,
            keys: table,
            tree: key_seq,
            flags: Seq::new(flags, FLAG_CODES as usize),
            lens: Seq::new(lens, LEN_BOUNDS.len()),
            cache: Mutex::new(Vec::new()),
            t_min: e.t_min,
            t_max: e.t_max,
        };
        for p in 0..v.pages() {
            let (lo, hi) = v.page(p);
            if lo > hi || lo < v.t_min || hi > v.t_max {
                return Err(format!("time page {p} is outside the chunk's time range"));
            }
        }
        Ok(v)
    }

    /// Whether packet `i` has the key, flags, length class and time the index gives it.
    fn is_packet(&self, i: usize, fields: &PacketFields<'_>, wirelen: u32, ts: u64) -> bool {
        let (lo, hi) = self.page(i / PAGE);
        self.keys.is_key_of(self.tree.access(i) as usize, fields)
            && self.flags.access(i) == flags_code(fields)
            && self.lens.access(i) == u32::from(len_class(wirelen))
            && (lo..=hi).contains(&ts)
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

    fn pages(&self) -> usize {
        self.n.div_ceil(PAGE)
    }

    fn page(&self, p: usize) -> (u64, u64) {
        (le64(self.pages, p * 16), le64(self.pages, p * 16 + 8))
    }

    /// Stream offset of the first record of block `b`.
    fn block_offset(&self, b: usize) -> u64 {
        if self.wide {
            self.base + le64(self.blocks, b * 8)
        } else {
            let o = b * 4;
            self.base
                + u64::from(u32::from_le_bytes([
                    self.blocks[o],
                    self.blocks[o + 1],
                    self.blocks[o + 2],
                    self.blocks[o + 3],
                ]))
        }
    }

    /// Which keys may satisfy `p`, remembered for the next asks.
    fn key_truth(&self, p: &Pred) -> Arc<Vec<bool>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = cache.iter().find(|(q, _)| q == p) {
            return t.clone();
        }
        let t = Arc::new(self.keys.eval(p));
        if cache.len() >= 64 {
            cache.remove(0);
        }
        cache.push((*p, t.clone()));
        t
    }

    /// `need` prepared for this chunk: truth tables per key, flags code and length class; time predicates by
    /// their index in `time_preds`.
    fn prepare(&self, need: &Need, time_preds: &[Pred]) -> Prep {
        match need {
            Need::All => Prep::All,
            Need::Pred(p) => match p.field {
                Field::Time => Prep::Time(time_preds.iter().position(|t| t == p).unwrap_or(usize::MAX)),
                Field::TcpFlags => Prep::Flags((0..FLAG_CODES).map(|c| code_may(c, p)).collect()),
                Field::WireLen => Prep::Lens((0..LEN_BOUNDS.len() as u32).map(|c| class_may(c, p)).collect()),
                f if KEY_FIELDS.contains(&f) => Prep::Keys(self.key_truth(p)),
                _ => Prep::All,
            },
            Need::And(v) => fold(v.iter().map(|n| self.prepare(n, time_preds)).collect(), true),
            Need::Or(v) => fold(v.iter().map(|n| self.prepare(n, time_preds)).collect(), false),
        }
    }

    /// An upper bound of the packets of `[l, r)` that may satisfy `prep` (rank counts; `truth` answers time).
    fn estimate_in(&self, prep: &Prep, l: usize, r: usize, truth: &[bool]) -> usize {
        match prep {
            Prep::All => r - l,
            Prep::Time(i) => truth.get(*i).is_none_or(|t| *t) as usize * (r - l),
            Prep::Keys(t) => self.tree.count_in(t, l, r),
            Prep::Flags(t) => self.flags.count_in(t, l, r),
            Prep::Lens(t) => self.lens.count_in(t, l, r),
            Prep::And(v) => v.iter().map(|p| self.estimate_in(p, l, r, truth)).min().unwrap_or(r - l),
            Prep::Or(v) => v.iter().map(|p| self.estimate_in(p, l, r, truth)).sum::<usize>().min(r - l),
        }
    }

    /// A superset of the packets of `[l, r)` satisfying `prep`, ascending (`None`: all of them).
    fn drive(&self, prep: &Prep, l: usize, r: usize, truth: &[bool]) -> Option<Vec<u32>> {
        let from = |seq: &Seq<'_>, t: &[bool]| {
            let mut out = Vec::new();
            seq.positions(t, l, r, &mut out);
            Some(out)
        };
        match prep {
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
                self.tree.positions(t, l, r, &mut out);
                Some(out)
            }
            Prep::Flags(t) => from(&self.flags, t),
            Prep::Lens(t) => from(&self.lens, t),
            Prep::And(v) => {
                let best = v.iter().min_by_key(|p| self.estimate_in(p, l, r, truth))?;
                self.drive(best, l, r, truth)
            }
            Prep::Or(v) => {
                let mut out = Vec::new();
                for p in v {
                    out.extend(self.drive(p, l, r, truth)?);
                }
                out.sort_unstable();
                out.dedup();
                Some(out)
            }
        }
    }

    /// Whether packet `i` may satisfy `prep` (`truth` answers time predicates for its page).
    fn may(&self, prep: &Prep, i: usize, truth: &[bool], key: &mut Option<u32>) -> bool {
        match prep {
            Prep::All => true,
            Prep::Time(t) => truth.get(*t).is_none_or(|t| *t),
            // A key id past the table (only a damaged matrix could hold one) selects the packet: it is read and
            // then refused as not the packet the index describes.
            Prep::Keys(t) => t.get(*key.get_or_insert_with(|| self.tree.access(i)) as usize).copied().unwrap_or(true),
            Prep::Flags(t) => t.get(self.flags.access(i) as usize).copied().unwrap_or(false),
            Prep::Lens(t) => t.get(self.lens.access(i) as usize).copied().unwrap_or(false),
            Prep::And(v) => v.iter().all(|p| self.may(p, i, truth, key)),
            Prep::Or(v) => v.iter().any(|p| self.may(p, i, truth, key)),
        }
    }

    /// The packets (indexes in the chunk, ascending) that may satisfy `need`.
    fn select(&self, need: &Need, time_preds: &[Pred]) -> Vec<u32> {
        let prep = self.prepare(need, time_preds);
        let leaf = !matches!(prep, Prep::And(_) | Prep::Or(_));
        let overlaps = page_may;
        // Pages with the same answers to the time predicates form ranges, each selected at once.
        let mut out = Vec::new();
        let mut p = 0;
        while p < self.pages() {
            let truth: Vec<bool> = time_preds.iter().map(|t| overlaps(self.page(p), t)).collect();
            let mut q = p + 1;
            while q < self.pages() && time_preds.iter().map(|t| overlaps(self.page(q), t)).eq(truth.iter().copied()) {
                q += 1;
            }
            let (l, r) = (p * PAGE, (q * PAGE).min(self.n));
            match self.drive(&prep, l, r, &truth) {
                Some(v) if leaf => out.extend(v),
                Some(v) => out.extend(v.into_iter().filter(|&i| self.may(&prep, i as usize, &truth, &mut None))),
                None => out.extend((l..r).filter(|&i| self.may(&prep, i, &truth, &mut None)).map(|i| i as u32)),
            }
            p = q;
        }
        out
    }

    /// The key-level truth of `prep`, when it reads key fields only.
    fn key_level(&self, prep: &Prep) -> Option<Vec<bool>> {
        let n = self.keys.len();
        Some(match prep {
            Prep::All => vec![true; n],
            Prep::Keys(t) => t.to_vec(),
            Prep::Flags(_) | Prep::Lens(_) | Prep::Time(_) => return None,
            Prep::And(v) => {
                let mut acc = vec![true; n];
                for p in v {
                    acc.iter_mut().zip(self.key_level(p)?).for_each(|(a, b)| *a &= b);
                }
                acc
            }
            Prep::Or(v) => {
                let mut acc = vec![false; n];
                for p in v {
                    acc.iter_mut().zip(self.key_level(p)?).for_each(|(a, b)| *a |= b);
                }
                acc
            }
        })
    }

    /// Packets known from the index to satisfy `need` (an exact condition), and the candidates whose fields the
    /// index does not know, to be read.
    fn count(&self, need: &Need, time_preds: &[Pred]) -> (u64, Vec<u32>) {
        // Keys whose fields the condition reads are all known.
        let mut known = vec![true; self.keys.len()];
        let mut fields = Vec::new();
        need.any_pred(&mut |p| {
            if KEY_FIELDS.contains(&p.field) && !fields.contains(&p.field) {
                fields.push(p.field);
            }
            false
        });
        for f in fields {
            known.iter_mut().zip(self.keys.known(f)).for_each(|(a, b)| *a &= b);
        }
        let prep = self.prepare(need, time_preds);
        if let Some(may) = self.key_level(&prep) {
            let sure: Vec<bool> = may.iter().zip(&known).map(|(m, k)| *m && *k).collect();
            let unsure: Vec<bool> = may.iter().zip(&known).map(|(m, k)| *m && !*k).collect();
            let mut maybe = Vec::new();
            self.tree.positions(&unsure, 0, self.n, &mut maybe);
            return (self.tree.count_sure(&sure, 0, self.n) as u64, maybe);
        }
        // Mixed conditions: decide each candidate from its key, flags, length class and page.
        let mut lens_preds = Vec::new();
        need.any_pred(&mut |p| {
            if p.field == Field::WireLen {
                lens_preds.push(*p);
            }
            false
        });
        let reads_flags = need.any_pred(&mut |p| p.field == Field::TcpFlags);
        let decided_page = |pg: usize| {
            let (lo, hi) = self.page(pg);
            time_preds.iter().all(|p| {
                let (lo, hi) = (u128::from(lo), u128::from(hi));
                p.mask == u128::MAX && ((p.lo <= lo && hi <= p.hi) || hi < p.lo || p.hi < lo)
            })
        };
        let (mut sure, mut maybe) = (0u64, Vec::new());
        for i in self.select(need, time_preds) {
            let i_us = i as usize;
            let ok = known.get(self.tree.access(i_us) as usize).copied().unwrap_or(false)
                && (!reads_flags || self.flags.access(i_us) != 1)
                && lens_preds.iter().all(|p| class_decided(self.lens.access(i_us), p))
                && decided_page(i_us / PAGE);
            if ok { sure += 1 } else { maybe.push(i) }
        }
        (sure, maybe)
    }

    /// Packets of the chunk that may satisfy `pred` (for planning).
    fn estimate(&self, pred: &Pred) -> u64 {
        if pred.field == Field::Time {
            let hit = (0..self.pages()).filter(|&p| page_may(self.page(p), pred)).count();
            return (hit * PAGE).min(self.n) as u64;
        }
        let prep = self.prepare(&Need::Pred(*pred), &[]);
        self.estimate_in(&prep, 0, self.n, &[]) as u64
    }
}

/// Whether a page whose timestamps span `[lo, hi]` may hold a packet satisfying the time predicate `p`.
fn page_may((lo, hi): (u64, u64), p: &Pred) -> bool {
    p.mask != u128::MAX || (u128::from(lo) <= p.hi && p.lo <= u128::from(hi))
}

/// Flags codes: missing, unknown, and the 256 flag bytes.
const FLAG_CODES: u32 = 2 + 256;

/// A condition prepared for one chunk.
#[derive(Debug)]
enum Prep {
    All,
    /// Truth per key id.
    Keys(Arc<Vec<bool>>),
    /// Truth per TCP flags code.
    Flags(Vec<bool>),
    /// Truth per wire-length class.
    Lens(Vec<bool>),
    /// The time predicate with this index.
    Time(usize),
    And(Vec<Prep>),
    Or(Vec<Prep>),
}

/// A conjunction (`and`) or disjunction of prepared conditions, with its key conditions merged into one truth
/// table (a packet's key satisfies them all, or one of them, exactly when it satisfies the merged one), so that
/// the key sequence is walked once instead of once per field (`host X` is four key conditions).
fn fold(parts: Vec<Prep>, and: bool) -> Prep {
    let mut merged: Option<Vec<bool>> = None;
    let mut rest = Vec::new();
    for p in parts {
        match p {
            Prep::Keys(t) => match &mut merged {
                None => merged = Some(t.to_vec()),
                Some(m) => m.iter_mut().zip(t.iter()).for_each(|(a, b)| if and { *a &= *b } else { *a |= *b }),
            },
            p => rest.push(p),
        }
    }
    if let Some(m) = merged {
        rest.insert(0, Prep::Keys(Arc::new(m)));
    }
    match (rest.len(), and) {
        (1, _) => rest.pop().unwrap_or(Prep::All),
        (_, true) => Prep::And(rest),
        (_, false) => Prep::Or(rest),
    }
}

/// The symbols `truth` accepts (indexes of its true entries).
fn members(truth: &[bool]) -> impl Iterator<Item = u32> + '_ {
    truth.iter().enumerate().filter(|(_, t)| **t).map(|(s, _)| s as u32)
}

/// The packets an index selected: per chunk, the positions in the chunk, ascending.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `(chunk, positions)` for every chunk with candidates.
    pub chunks: Vec<(usize, Vec<u32>)>,
}

impl Selection {
    /// Packets selected.
    pub fn count(&self) -> u64 {
        self.chunks.iter().map(|(_, v)| v.len() as u64).sum()
    }
}

/// A checked index, ready to answer conditions.
#[derive(Debug)]
pub struct IndexView<'a> {
    file: &'a IndexFile,
    chunks: Vec<ChunkView<'a>>,
}

fn time_preds(need: &Need, out: &mut Vec<Pred>) {
    match need {
        Need::Pred(p) if p.field == Field::Time && !out.contains(p) => out.push(*p),
        Need::And(v) | Need::Or(v) => v.iter().for_each(|n| time_preds(n, out)),
        _ => {}
    }
}

impl<'a> IndexView<'a> {
    /// The index file.
    pub fn file(&self) -> &'a IndexFile {
        self.file
    }

    /// Packets indexed.
    pub fn packets(&self) -> u64 {
        self.file.packets()
    }

    /// The chunks.
    pub fn chunks(&self) -> &[ChunkView<'a>] {
        &self.chunks
    }

    /// Whether the index answers predicates on `field`.
    pub fn has_field(&self, field: Field) -> bool {
        KEY_FIELDS.contains(&field) || matches!(field, Field::TcpFlags | Field::WireLen | Field::Time)
    }

    /// Packets that may satisfy `pred`, from the key tables' counts and the time pages.
    pub fn estimate(&self, pred: &Pred) -> u64 {
        self.chunks.par_iter().map(|c| c.estimate(pred)).sum()
    }

    /// For an exact condition (one that equals the filter where fields are known, see `pcaptool_query::plan::exact`):
    /// the packets the index alone shows to satisfy it, and the candidates it cannot decide (their fields unknown to
    /// it, a length class or time page across a bound), which the caller reads and filters.
    pub fn count(&self, need: &Need) -> (u64, Selection) {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let per: Vec<(usize, u64, Vec<u32>)> = self
            .chunks
            .par_iter()
            .enumerate()
            .map(|(i, c)| {
                let (sure, maybe) = c.count(need, &tp);
                (i, sure, maybe)
            })
            .collect();
        let sure = per.iter().map(|p| p.1).sum();
        let chunks = per.into_iter().filter(|p| !p.2.is_empty()).map(|(i, _, v)| (i, v)).collect();
        (sure, Selection { chunks })
    }

    /// Every packet that may satisfy `need` (a superset of the packets that do; never fewer).
    pub fn select(&self, need: &Need) -> Selection {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let chunks = self
            .chunks
            .par_iter()
            .enumerate()
            .map(|(i, c)| (i, c.select(need, &tp)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        Selection { chunks }
    }

    /// Bytes of the trace that reading `sel` touches (the blocks holding its packets).
    pub fn bytes_to_read(&self, sel: &Selection) -> u64 {
        let stream_end = self.file.header.stream_len;
        sel.chunks
            .iter()
            .map(|(ci, v)| {
                let c = &self.chunks[*ci];
                let end_of = |b: usize| {
                    if (b + 1) * BLOCK < c.n {
                        c.block_offset(b + 1)
                    } else {
                        self.chunks.get(ci + 1).map_or(stream_end, |n| n.block_offset(0))
                    }
                };
                let mut last = usize::MAX;
                let mut sum = 0;
                for &i in v {
                    let b = i as usize / BLOCK;
                    if b != last {
                        sum += end_of(b).saturating_sub(c.block_offset(b));
                        last = b;
                    }
                }
                sum
            })
            .sum()
    }

    /// Reads the packets of chunk `ci` at `positions` from the trace held in `data` (memory-mapped), checking
    /// that each is the packet the index describes. `f` gets each packet's index in the trace and its record.
    pub fn read_packets(
        &self,
        data: &'a [u8],
        seeker: &Seeker,
        trace: &Path,
        ci: usize,
        positions: &[u32],
        f: &mut dyn FnMut(u64, Record<'a>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let c = &self.chunks[ci];
        let stale = |why: String| IndexError::Stale { index: self.file.path.clone(), trace: trace.to_path_buf(), why };
        let snap = self.file.header.snap as usize;
        // The walk: the next record's offset and its position in the chunk.
        let mut at: Option<(u64, usize)> = None;
        for &i in positions {
            let i = i as usize;
            let b = i / BLOCK;
            let (mut off, mut j) = match at {
                Some((off, j)) if j <= i && j / BLOCK == b => (off, j),
                _ => (c.block_offset(b), b * BLOCK),
            };
            let rec = loop {
                let rec = seeker.next_record_at(data, off).map_err(|e| {
                    stale(format!("no packet {} where the index places it ({e})", c.first_packet + j as u64))
                })?;
                off = rec.offset + u64::from(rec.record_len);
                j += 1;
                if j > i {
                    break rec;
                }
            };
            at = Some((off, j));
            let data_cut = &rec.data[..rec.data.len().min(snap)];
            let fields = PacketFields::new(rec.linktype, data_cut, rec.wirelen, rec.ts_ns);
            if !c.is_packet(i, &fields, rec.wirelen, rec.ts_ns) {
                return Err(stale(format!(
                    "packet {} at byte {} is not the packet the index describes",
                    c.first_packet + i as u64,
                    rec.offset
                )));
            }
            f(c.first_packet + i as u64, rec)?;
        }
        Ok(())
    }

    /// Reads every packet of chunk `ci` in order from the trace held in `data` (memory-mapped), starting at the
    /// chunk's first record, so that chunks can be read in parallel (a scan split by the index). The first and
    /// last packets are checked against the index, and the walk must find exactly the chunk's packets, so a
    /// stale index gives an error, not other packets. `f` gets each packet's index in the trace and its record.
    pub fn walk_chunk(
        &self,
        data: &'a [u8],
        seeker: &Seeker,
        trace: &Path,
        ci: usize,
        f: &mut dyn FnMut(u64, Record<'a>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let c = &self.chunks[ci];
        let stale = |why: String| IndexError::Stale { index: self.file.path.clone(), trace: trace.to_path_buf(), why };
        let snap = self.file.header.snap as usize;
        let check = |i: usize, rec: &Record<'_>| {
            let fields = PacketFields::new(rec.linktype, &rec.data[..rec.data.len().min(snap)], rec.wirelen, rec.ts_ns);
            if c.is_packet(i, &fields, rec.wirelen, rec.ts_ns) {
                Ok(())
            } else {
                Err(stale(format!(
                    "packet {} at byte {} is not the packet the index describes",
                    c.first_packet + i as u64,
                    rec.offset
                )))
            }
        };
        let mut off = c.block_offset(0);
        for i in 0..c.n {
            let rec = seeker.next_record_at(data, off).map_err(|e| {
                stale(format!("no packet {} where the index places it ({e})", c.first_packet + i as u64))
            })?;
            if i == 0 || i + 1 == c.n {
                check(i, &rec)?;
            }
            off = rec.offset + u64::from(rec.record_len);
            f(c.first_packet + i as u64, rec)?;
        }
        if let Some(next) = self.chunks.get(ci + 1)
            && off > next.block_offset(0)
        {
            return Err(stale(format!("chunk of packet {} runs past the next chunk's start", c.first_packet)));
        }
        Ok(())
    }

    /// Bytes of the capture stream chunk `ci` spans (from its first record to the next chunk's, or to the end of
    /// what was indexed).
    pub fn chunk_bytes(&self, ci: usize) -> u64 {
        let end = self.chunks.get(ci + 1).map_or(self.file.header.stream_len, |n| n.block_offset(0));
        end.saturating_sub(self.chunks[ci].block_offset(0))
    }

    /// Whether packet `i` of chunk `ci` has the key the index gives it, seen as `fields` (for streamed traces).
    pub fn is_packet(&self, ci: usize, i: usize, fields: &PacketFields<'_>, wirelen: u32, ts: u64) -> bool {
        self.chunks[ci].is_packet(i, fields, wirelen, ts)
    }
}
