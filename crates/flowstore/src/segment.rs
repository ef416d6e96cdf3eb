//! A segment read back: its files kept open, stage 1 read when opened, stage 2 and the data checksums when first
//! needed; every block of data checked against its checksum before its bytes are given out
//! (docs/format/segment.md).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use pcaptool_packet::MappedFile;

use crate::blocks::{BlockMap, ENTRY_BYTES};
use crate::codec::unseal;
use crate::dedup::{self, ElisionError, Elisions, Varints};
use crate::error::StoreError;
use crate::stage1::{Stage1, StoreMeta};
use crate::stage2::{Bytes, Frame, Keep};
pub use crate::stage2::{FlowEntry, Stage2};
use crate::sums::Checked;

use crate::format::*;
pub use crate::format::{ADDR_BLOOM_FPR, BLOOM_FPR, MAGIC, MAX_IFACES, VERSION, segment_paths};
pub use crate::writer::{PacketIn, SegmentWriter};

/// A packet read back from a store.
#[derive(Clone, Copy, Debug)]
pub struct StoredPacket<'a> {
    /// Its position in the store's original order.
    pub seq: u64,
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Length on the wire.
    pub wirelen: u32,
    /// Captured bytes.
    pub data: &'a [u8],
    /// What it is: link type, snapshot length, precision, byte order and interface.
    pub meta: StoreMeta,
}

/// A segment of a store: its files, open, and its stage 1. The files stay open while the segment is, so a
/// segment that a writer's retention removes stays readable to a reader that opened it before.
#[derive(Debug)]
pub struct Segment {
    /// Its data file.
    pub data: PathBuf,
    /// Its index file.
    pub index: PathBuf,
    /// Its first stage.
    pub stage1: Stage1,
    data_file: File,
    index_file: Arc<File>,
    /// The data file's block checksums (plain data), read when first needed.
    sums: OnceLock<Vec<u32>>,
    /// The data file's block directory (compressed data), read when first needed.
    blocks: OnceLock<BlockMap>,
    /// The blocks decompressed last (compressed data).
    recent: Mutex<RecentBlocks>,
    /// In a long-lived store ([`Store::keep_indexes`](crate::Store::keep_indexes)): the budget its second
    /// stage is kept within, and the second stage once read.
    keep: Option<Arc<Keep>>,
    kept: OnceLock<Arc<Stage2>>,
    /// The data file's mapping, made once, in a long-lived store (each answer would otherwise map it again and
    /// fault in the pages it reads) and for compressed data (read block by block, flow after flow).
    kept_map: OnceLock<Arc<MappedFile>>,
    /// This process's name for this segment, never another's (its files never change while it is open): what
    /// a thread's scratch block is known by.
    uid: u64,
}

/// The last few blocks a segment decompressed whole, so that reading its flows one after another (an export, a
/// flow list's packets) or an elision's source decompresses each block once, not once per flow. (A block a read
/// wants little of is not kept here but in the thread's scratch block, which the next read takes from.)
#[derive(Debug, Default)]
struct RecentBlocks {
    blocks: std::collections::VecDeque<(usize, Recent)>,
}

/// The union of `ranges`: the non-empty ones sorted, those that meet or touch joined.
fn union(ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut merged: Vec<Range<u64>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
    merged.sort_unstable_by_key(|r| r.start);
    merged.dedup_by(|b, a| {
        let joined = b.start <= a.end;
        if joined {
            a.end = a.end.max(b.end);
        }
        joined
    });
    merged
}

thread_local! {
    /// Where `Segment::read_stream` decompresses a block of which a read wants little, kept for this thread's
    /// next: memory already faulted in, where a new buffer would fault in its pages again for each block (a
    /// needle reads a few blocks of each of many segments).
    static SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new(Scratch { holds: None, bytes: Vec::new() }) };
}

/// A thread's scratch block: the bytes of the block it holds, named by its segment's [`Segment::uid`] and its
/// number, so that small flows read one after another (an export's packets) decompress their block once.
#[derive(Default)]
struct Scratch {
    holds: Option<(u64, usize)>,
    bytes: Vec<u8>,
}

/// The next [`Segment::uid`].
static NEXT_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A block kept: its bytes copied, or where they lie in a window a read returned (shared, not copied: a needle's
/// blocks would otherwise be copied once more each, into memory never touched before).
#[derive(Debug)]
enum Recent {
    Copied(Vec<u8>),
    Shared(Arc<Vec<u8>>, Range<usize>),
}

/// Blocks kept: at most this many, holding no more bytes than this many of them (a shared window counted
/// whole, once); 2 MiB of Zstandard's default blocks, 32 MiB of the largest.
const RECENT: usize = 8;

impl RecentBlocks {
    fn get(&self, b: usize) -> Option<&[u8]> {
        self.blocks.iter().find(|x| x.0 == b).map(|x| match &x.1 {
            Recent::Copied(v) => v.as_slice(),
            Recent::Shared(w, r) => &w[r.clone()],
        })
    }

    /// Bytes held: each copy, and each window shared once.
    fn held(&self) -> usize {
        let mut windows: Vec<*const Vec<u8>> = Vec::new();
        let mut n = 0;
        for (_, x) in &self.blocks {
            match x {
                Recent::Copied(v) => n += v.len(),
                Recent::Shared(w, _) if !windows.contains(&Arc::as_ptr(w)) => {
                    windows.push(Arc::as_ptr(w));
                    n += w.len();
                }
                Recent::Shared(..) => {}
            }
        }
        n
    }

    /// Keeps block `b`, whose bytes are `r` of window `w`: shared if the window fits in what the cache may
    /// hold (`RECENT` blocks of `block` bytes, the segment's largest), else copied; the oldest go while the cache
    /// holds too much.
    fn put(&mut self, b: usize, w: &Arc<Vec<u8>>, r: Range<usize>, block: usize) {
        let budget = RECENT * block.max(r.len());
        let mut spare = None;
        if self.blocks.len() >= RECENT {
            spare = self.blocks.pop_front().map(|x| x.1);
        }
        let kept = if w.len() <= budget {
            Recent::Shared(Arc::clone(w), r)
        } else {
            let mut buf = match spare {
                Some(Recent::Copied(v)) => v,
                _ => Vec::new(),
            };
            buf.clear();
            buf.extend_from_slice(&w[r]);
            Recent::Copied(buf)
        };
        self.blocks.push_back((b, kept));
        while self.blocks.len() > 1 && self.held() > budget {
            self.blocks.pop_front();
        }
    }
}

impl Segment {
    /// Opens the segment whose index file is `index`: reads the index's header and stage 1, and opens the data
    /// file it names, beside it.
    pub fn open(index: PathBuf) -> Result<Segment, StoreError> {
        let index_file = File::open(&index).map_err(|e| StoreError::io(&index, e))?;
        let stage1 = Segment::read_stage1(&index, &index_file)?;
        let data = index.with_file_name(stage1.data_file_name());
        let data_file = File::open(&data).map_err(|e| StoreError::io(&data, e))?;
        Ok(Segment::from_parts(data, index, stage1, data_file, index_file))
    }

    /// The segment whose data file is `path`, if it is one: a file named as a segment's data in a directory that
    /// holds the segment's index, which names it. `None` for any other file.
    pub fn of_data_file(path: &Path) -> Result<Option<Segment>, StoreError> {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
        let Some(num) = name.strip_prefix("seg-").and_then(|r| r.split_once('.')) else { return Ok(None) };
        let (Ok(number), true) = (num.0.parse::<u32>(), num.0.len() == 6 && is_data_ext(num.1)) else {
            return Ok(None);
        };
        let index = path.with_file_name(format!("seg-{number:06}.ptsx"));
        if !index.is_file() {
            return Ok(None);
        }
        let seg = Segment::open(index)?;
        Ok((seg.stage1.data_file_name() == name).then_some(seg))
    }

    /// The segment's data as a plain pcap file (what a plain segment's data file holds), every block checked,
    /// elided bytes filled in: `pcaptool convert` of a compressed segment.
    pub fn plain_data(&self) -> Result<Vec<u8>, StoreError> {
        Ok(match self.read_all()? {
            SegBytes::Mapped(m) => m.bytes().to_vec(),
            SegBytes::Raw(v) => Arc::try_unwrap(v).unwrap_or_else(|v| v.to_vec()),
        })
    }

    /// A segment of its files, open, and its stage 1 (read by [`read_stage1`](Self::read_stage1)).
    pub(crate) fn from_parts(
        data: PathBuf,
        index: PathBuf,
        stage1: Stage1,
        data_file: File,
        index_file: File,
    ) -> Segment {
        Segment {
            data,
            index,
            stage1,
            data_file,
            index_file: Arc::new(index_file),
            sums: OnceLock::new(),
            blocks: OnceLock::new(),
            recent: Mutex::new(RecentBlocks::default()),
            keep: None,
            kept: OnceLock::new(),
            kept_map: OnceLock::new(),
            uid: NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Keeps the segment's second stage, once read, within `keep`'s budget.
    pub(crate) fn set_keep(&mut self, keep: &Arc<Keep>) {
        self.keep = Some(Arc::clone(keep));
    }

    /// Stage 2 as [`stage2`](Self::stage2) reads it; in a long-lived store, read once and kept (with the
    /// blocks its lookups decode) while the store's budget allows.
    pub fn stage2_kept(&self) -> Result<Arc<Stage2>, StoreError> {
        if let Some(s2) = self.kept.get() {
            return Ok(Arc::clone(s2));
        }
        let mut s2 = self.stage2()?;
        let Some(keep) = &self.keep else { return Ok(Arc::new(s2)) };
        let bytes = s2.head_bytes();
        if !keep.take(bytes) {
            return Ok(Arc::new(s2));
        }
        s2.keep_blocks(Arc::clone(keep));
        Ok(Arc::clone(keep.put(&self.kept, Arc::new(s2), bytes)))
    }

    /// Reads the header and stage 1 of the index file `index` (open as `f`), checking their checksums and that
    /// the file is as long as they say.
    pub(crate) fn read_stage1(index: &Path, f: &File) -> Result<Stage1, StoreError> {
        let corrupt = |offset: u64, why: String| StoreError::Corrupt { path: index.to_path_buf(), offset, why };
        let mut h = [0u8; HEADER_LEN];
        f.read_exact_at(&mut h, 0).map_err(|_| corrupt(0, "shorter than its header".into()))?;
        if h[0..4] != MAGIC {
            return Err(corrupt(0, "no PTSG magic".into()));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if !(2..=VERSION).contains(&version) {
            return Err(corrupt(
                4,
                format!(
                    "segment format version {version}; this pcaptool reads versions 2 to {VERSION}: import the \
                     traces again into a new store"
                ),
            ));
        }
        if crc32fast::hash(&h[..20]) != u32::from_le_bytes([h[20], h[21], h[22], h[23]]) {
            return Err(corrupt(0, "header checksum mismatch".into()));
        }
        let s1_len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let have = f.metadata().map_err(|e| StoreError::io(index, e))?.len();
        if (HEADER_LEN + s1_len) as u64 > have {
            return Err(corrupt(HEADER_LEN as u64, format!("stage 1 of {s1_len} bytes does not fit in the file")));
        }
        let mut s1 = vec![0u8; s1_len];
        f.read_exact_at(&mut s1, HEADER_LEN as u64)
            .map_err(|_| corrupt(HEADER_LEN as u64, "stage 1 truncated".into()))?;
        let body = unseal(&s1, index, HEADER_LEN as u64, "stage 1")?;
        let mut stage1 =
            Stage1::decode(body, version).map_err(|why| corrupt(HEADER_LEN as u64, format!("stage 1: {why}")))?;
        let want = (HEADER_LEN as u64 + s1_len as u64)
            .checked_add(stage1.stage2_len)
            .and_then(|w| w.checked_add(stage1.positions_len))
            .and_then(|w| w.checked_add(stage1.map_bytes()))
            .unwrap_or(u64::MAX);
        if have != want {
            return Err(corrupt(have.min(want), format!("{have} bytes, its stages say {want}")));
        }
        stage1.stage2_at = (HEADER_LEN + s1_len) as u64;
        Ok(stage1)
    }

    /// Reads stage 2 (the flow table, sorted arrays and positions), checking its checksums and the structure of
    /// its fixed part, address dictionary and block directory; blocks and posting lists are checked when decoded.
    pub fn stage2(&self) -> Result<Stage2, StoreError> {
        let s1 = &self.stage1;
        let at2 = s1.stage2_at;
        let bad = |why: &str| self.corrupt(at2, why);
        // The data file bounds what stage 1 may claim (and so what decoding may allocate): compressed, through its
        // block directory (each block at most 4 MiB raw).
        self.check_data_len()?;
        if s1.codec.is_compressed() {
            self.blocks()?;
        }
        if s1.packets > s1.bytes.saturating_sub(24) / 16 || u64::from(s1.flows) > s1.packets {
            return Err(bad("more packets or flows than the data file can hold"));
        }
        let len2 = usize::try_from(s1.stage2_len).map_err(|_| bad("stage 2 size"))?;
        let lenp = usize::try_from(s1.positions_len).map_err(|_| bad("positions size"))?;
        // Mapped, not read: a lookup touches the dictionary, the directory and a block or two.
        let map = MappedFile::map(&self.index_file).map_err(|e| StoreError::io(&self.index, e))?;
        let b = map.bytes();
        let at2u = usize::try_from(at2).map_err(|_| bad("stage 2 offset"))?;
        let end2 = at2u.checked_add(len2).ok_or_else(|| bad("stage sizes"))?;
        let endp = end2.checked_add(lenp).filter(|&e| e <= b.len()).ok_or_else(|| bad("stages past the file"))?;
        let frame = Frame {
            version: s1.version,
            unknown_fields: s1.unknown_fields,
            slots: s1.flows as usize + 1,
            t_min: s1.t_min,
            data_bytes: s1.bytes,
            packets: s1.packets,
            positions_len: lenp,
            iface_bits: s1.iface_bits(),
            ifaces: s1.ifaces.len(),
        };
        Stage2::parse(&self.index, at2, frame, Bytes::Mapped(map), at2u..end2, end2..endp)
    }

    /// Checks that the data file is as long as stage 1 says.
    fn check_data_len(&self) -> Result<(), StoreError> {
        let len = self.data_file.metadata().map_err(|e| StoreError::io(&self.data, e))?.len();
        let want = self.stage1.stored_bytes;
        if len != want {
            return Err(StoreError::Corrupt {
                path: self.data.clone(),
                offset: len.min(want),
                why: format!("{len} bytes, its index says {want}"),
            });
        }
        Ok(())
    }

    fn corrupt(&self, offset: u64, why: &str) -> StoreError {
        StoreError::Corrupt { path: self.index.clone(), offset, why: why.to_string() }
    }

    /// The index's last part (the data checksums or the block directory), checked against stage 1's checksum.
    fn map_part(&self) -> Result<Vec<u8>, StoreError> {
        let s1 = &self.stage1;
        let at = s1.stage2_at + s1.stage2_len + s1.positions_len;
        let n = usize::try_from(s1.map_bytes()).map_err(|_| self.corrupt(HEADER_LEN as u64, "checksum count"))?;
        let mut bytes = vec![0u8; n];
        self.index_file.read_exact_at(&mut bytes, at).map_err(|e| StoreError::io(&self.index, e))?;
        if s1.block_log2 != 0 && crc32fast::hash(&bytes) != s1.sums_crc {
            return Err(self.corrupt(at, "the data checksums' checksum does not match"));
        }
        Ok(bytes)
    }

    /// The data file's block checksums (plain data; empty for a version 2 segment), read from the index and
    /// checked against stage 1 when first asked for.
    pub(crate) fn sums(&self) -> Result<&[u32], StoreError> {
        if let Some(s) = self.sums.get() {
            return Ok(s);
        }
        let bytes = if self.stage1.codec.is_compressed() { Vec::new() } else { self.map_part()? };
        let sums = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(self.sums.get_or_init(|| sums))
    }

    /// The block directory of compressed data, read from the index and checked against stage 1 when first asked
    /// for.
    pub(crate) fn blocks(&self) -> Result<&BlockMap, StoreError> {
        if let Some(b) = self.blocks.get() {
            return Ok(b);
        }
        let s1 = &self.stage1;
        let at = s1.stage2_at + s1.stage2_len + s1.positions_len;
        let (n, elided) = (s1.n_elisions as usize, s1.elided_bytes);
        let bad = |why: ElisionError| self.elisions_error(at, why);
        let (dir, elisions) = if s1.checkpointed() && s1.dedup {
            // The block directory and the checkpoints, checked against stage 1; the varints between them are
            // read a chunk at a time as reads need them, each chunk checked against its checkpoint.
            let dir_len = s1.n_blocks as usize * ENTRY_BYTES;
            let table_len = dedup::checkpoint_bytes(n, true);
            let varints = (s1.elisions_len as usize)
                .checked_sub(table_len)
                .ok_or_else(|| self.corrupt(at, "elisions: fewer bytes than their checkpoints"))?;
            let mut dir = vec![0u8; dir_len];
            let mut table = vec![0u8; table_len];
            let table_at = at + (dir_len + varints) as u64;
            self.index_file.read_exact_at(&mut dir, at).map_err(|e| StoreError::io(&self.index, e))?;
            self.index_file.read_exact_at(&mut table, table_at).map_err(|e| StoreError::io(&self.index, e))?;
            if Stage1::directory_crc(&dir, &table) != s1.sums_crc {
                return Err(self.corrupt(at, "the block directory's checksum does not match"));
            }
            let file = Varints::File { file: self.index_file.clone(), at: at + dir_len as u64, len: varints };
            (dir, Elisions::new(file, Some(&table), n, s1.bytes, elided).map_err(bad)?)
        } else {
            let mut part = self.map_part()?;
            let varints = part.split_off((s1.n_blocks as usize * ENTRY_BYTES).min(part.len()));
            (part, Elisions::new(Varints::Held(varints), None, n, s1.bytes, elided).map_err(bad)?)
        };
        let stream = s1.bytes.checked_sub(elided).ok_or_else(|| self.corrupt(at, "more bytes elided than held"))?;
        let map = BlockMap::decode(s1.codec, &dir, s1.n_blocks as usize, stream, s1.stored_bytes)
            .map_err(|why| self.corrupt(at, &format!("block directory: {why}")))?
            .with_elisions(elisions);
        Ok(self.blocks.get_or_init(|| map))
    }

    /// The error of elisions (of the index part at `at`) that could not be read.
    fn elisions_error(&self, at: u64, e: ElisionError) -> StoreError {
        match e {
            ElisionError::Bad(why) => self.corrupt(at, &format!("elisions: {why}")),
            ElisionError::Io(e) => StoreError::io(&self.index, e),
        }
    }

    /// Reads the raw data `ranges` of compressed data: the blocks that hold them (and, deduplicated, the bytes
    /// their elisions refer to) decompressed and checked, consecutive blocks one read; elided bytes filled in
    /// from their sources.
    pub(crate) fn read_raw(&self, ranges: &[Range<u64>]) -> Result<RawWindow, StoreError> {
        self.check_data_len()?;
        let map = self.blocks()?;
        if let Some(r) = ranges.iter().find(|r| r.end > self.stage1.bytes || r.start > r.end) {
            return Err(StoreError::Corrupt {
                path: self.data.clone(),
                offset: r.start,
                why: format!("raw bytes {}..{} lie past the data's {}", r.start, r.end, self.stage1.bytes),
            });
        }
        if !self.stage1.dedup {
            // The stored stream is the raw data.
            return self.read_stream(map, ranges);
        }
        let merged = union(ranges);
        let at = self.stage1.stage2_at + self.stage1.stage2_len + self.stage1.positions_len;
        let elisions_bad = |why| self.elisions_error(at, why);
        let to_stream = |x: u64| map.to_stream(x).map_err(elisions_bad);
        // Per merged range, the elisions that meet it.
        let mut meeting = Vec::with_capacity(merged.len());
        let mut wanted: Vec<Range<u64>> = Vec::new();
        for r in &merged {
            wanted.push(to_stream(r.start)?..to_stream(r.end)?);
            let es = map.elisions_in(r.clone()).map_err(elisions_bad)?;
            for e in &es {
                if !map.source_is_stored(e).map_err(elisions_bad)? {
                    let why = format!("the source of raw bytes {}..{} is elided itself", e.raw, e.raw + e.len);
                    return Err(elisions_bad(why.into()));
                }
                wanted.push(to_stream(e.src)?..to_stream(e.src + e.len)?);
            }
            meeting.push(es);
        }
        let stream = self.read_stream(map, &wanted)?;
        let bad = |at: u64| StoreError::Corrupt {
            path: self.data.clone(),
            offset: at,
            why: format!("raw byte {at} is in no block read"),
        };
        let mut buf =
            Vec::with_capacity(usize::try_from(merged.iter().map(|r| r.end - r.start).sum::<u64>()).unwrap_or(0));
        let mut pieces = Vec::with_capacity(merged.len());
        for (r, es) in merged.into_iter().zip(meeting) {
            pieces.push((r.start, buf.len()));
            let mut p = r.start;
            let copy = |from: u64, to: u64, src: u64, out: &mut Vec<u8>| -> Result<(), StoreError> {
                let s = to_stream(src)?;
                out.extend_from_slice(stream.get(s, to - from).ok_or_else(|| bad(from))?.1);
                Ok(())
            };
            for e in es {
                let lit = e.raw.clamp(p, r.end);
                if p < lit {
                    copy(p, lit, p, &mut buf)?;
                    p = lit;
                }
                let el = (e.raw + e.len).min(r.end);
                if p < el {
                    copy(p, el, e.src + (p - e.raw), &mut buf)?;
                    p = el;
                }
            }
            if p < r.end {
                copy(p, r.end, p, &mut buf)?;
            }
            // The stored data begins with the mark of deduplicated data where the raw data has the pcap magic.
            if r.start < 4 {
                let at = pieces.last().map_or(0, |x| x.1);
                let magic = 0xa1b2_3c4du32.to_le_bytes();
                for k in r.start..r.end.min(4) {
                    buf[at + (k - r.start) as usize] = magic[k as usize];
                }
            }
        }
        Ok(RawWindow { buf: Arc::new(buf), pieces })
    }

    /// Reads and decompresses the blocks that hold the stored data `ranges`, checking each block before and after
    /// it is decompressed. The stored bytes come from the mapped data file: consecutive blocks are one sequential
    /// pass, and no buffer is faulted in and zeroed before a `pread` fills it (a `--flow` read of 969 packets of
    /// the real-traffic bench trace's LZ4 store in a new process: 1,437 page faults so, 1,264 from the mapping). A
    /// block of which the ranges want less than half (a needle's packet or two) is decompressed into this
    /// thread's scratch buffer and only the wanted bytes are kept: a needle meets a few blocks of each of many
    /// segments, and holding them whole faulted in fresh memory for each (on that trace's Zstandard store, `host
    /// 224.0.0.25` decompresses 22 blocks of 256 KiB for 30 KB of packets: 1.45-1.62 times the plain store's time
    /// so, 1.15-1.21 times through the scratch buffer). The scratch block stays for the thread's next read, which
    /// takes it if it wants the same block (the next small flow).
    fn read_stream(&self, map: &BlockMap, ranges: &[Range<u64>]) -> Result<RawWindow, StoreError> {
        if let Some(r) = ranges.iter().find(|r| r.end > map.raw_len()) {
            return Err(StoreError::Corrupt {
                path: self.data.clone(),
                offset: r.start,
                why: format!("raw bytes {}..{} lie past the data's {}", r.start, r.end, map.raw_len()),
            });
        }
        let merged = union(ranges);
        // Runs of consecutive blocks.
        let mut wanted: Vec<Range<usize>> = Vec::new();
        for bs in merged.iter().map(|r| map.covering(r.clone())).filter(|bs| !bs.is_empty()) {
            match wanted.last_mut() {
                Some(last) if bs.start <= last.end => last.end = last.end.max(bs.end),
                _ => wanted.push(bs),
            }
        }
        // The wanted parts of block `k` (the merged ranges from `*next` on that meet it), in order.
        let parts = |k: usize, next: &mut usize| -> Vec<Range<u64>> {
            let br = map.raw_range(k);
            while *next < merged.len() && merged[*next].end <= br.start {
                *next += 1;
            }
            merged[*next..]
                .iter()
                .take_while(|r| r.start < br.end)
                .map(|r| r.start.max(br.start)..r.end.min(br.end))
                .collect()
        };
        // Per block: its wanted parts, whether it is taken whole (else only those parts, from the scratch
        // buffer), and whether a neighbouring read may share it (a run's ends: its inner blocks are its own).
        let mut plan: Vec<(usize, Vec<Range<u64>>, bool, bool)> = Vec::new();
        let mut next = 0;
        for run in &wanted {
            for k in run.clone() {
                let ps = parts(k, &mut next);
                let br = map.raw_range(k);
                let whole = 2 * ps.iter().map(|p| p.end - p.start).sum::<u64>() >= br.end - br.start;
                plan.push((k, ps, whole, k == run.start || k + 1 == run.end));
            }
        }
        let size = |(k, ps, whole, _): &(usize, Vec<Range<u64>>, bool, bool)| match whole {
            true => map.raw_range(*k).end - map.raw_range(*k).start,
            false => ps.iter().map(|p| p.end - p.start).sum::<u64>(),
        };
        let mut buf = Vec::with_capacity(usize::try_from(plan.iter().map(size).sum::<u64>()).unwrap_or(0));
        let mut pieces = Vec::new();
        // Appends the `parts` of block `k`, whose bytes are `bytes`.
        let take = |k: usize, parts: &[Range<u64>], bytes: &[u8], buf: &mut Vec<u8>, pieces: &mut Vec<(u64, usize)>| {
            let base = map.raw_range(k).start;
            for p in parts {
                pieces.push((p.start, buf.len()));
                buf.extend_from_slice(&bytes[(p.start - base) as usize..(p.end - base) as usize]);
            }
        };
        // The blocks to keep for a neighbouring read, and where they are in `buf`.
        let mut keep: Vec<(usize, Range<usize>)> = Vec::new();
        // The stored bytes are read from the mapped file (kept: an export reads each flow of a segment in turn,
        // and mapping and unmapping the file for each stopped every other thread of the process each time), its
        // length checked by `read_raw`.
        let data = self.mapping()?;
        let mut scratch = SCRATCH.take();
        let mut cache = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        for (k, ps, whole, edge) in plan {
            let br = map.raw_range(k);
            // Blocks decompressed lately (a flow read after flow, an elision's source) are copied.
            if let Some(bytes) = cache.get(k) {
                take(k, if whole { std::slice::from_ref(&br) } else { &ps }, bytes, &mut buf, &mut pieces);
                continue;
            }
            let sr = map.stored_range(k..k + 1);
            let frame = data.bytes().get(sr.start as usize..sr.end as usize).ok_or_else(|| StoreError::Corrupt {
                path: self.data.clone(),
                offset: sr.start,
                why: format!("block {k} (bytes {}..{}) lies past the file's end", sr.start, sr.end),
            })?;
            if !whole {
                if scratch.holds != Some((self.uid, k)) {
                    scratch.holds = None;
                    scratch.bytes.clear();
                    map.decompress(&self.data, k, frame, &mut scratch.bytes)?;
                    scratch.holds = Some((self.uid, k));
                }
                take(k, &ps, &scratch.bytes, &mut buf, &mut pieces);
                continue;
            }
            let from = buf.len();
            pieces.push((br.start, from));
            map.decompress(&self.data, k, frame, &mut buf)?;
            if edge {
                keep.push((k, from..buf.len()));
            }
        }
        SCRATCH.set(scratch);
        let w = RawWindow { buf: Arc::new(buf), pieces };
        for (k, r) in keep {
            cache.put(k, &w.buf, r, map.largest_block());
        }
        Ok(w)
    }

    /// Reads the packets of `entries` of stage 2 `s2`: the data that holds them (mapped if plain, decompressed
    /// if compressed) and their records, each checked against its flow and the data checksums.
    pub(crate) fn read_entries(&self, s2: &Stage2, entries: &[&FlowEntry]) -> Result<SegData, StoreError> {
        let entries: Vec<&FlowEntry> = entries.iter().copied().filter(|e| e.packets > 0).collect();
        let mut records = Vec::new();
        if self.stage1.codec.is_compressed() {
            let ranges: Vec<Range<u64>> = entries.iter().map(|e| e.data_offset..e.data_offset + e.data_len).collect();
            let w = self.read_raw(&ranges)?;
            for e in entries {
                let (seqs, ifaces) = s2.positions_and_ifaces(e)?;
                let (at, span) = w.get(e.data_offset, e.data_len).ok_or_else(|| self.past_end(e))?;
                records
                    .extend(self.records(e, &seqs, &ifaces, span)?.into_iter().map(|r| Record { at: at + r.at, ..r }));
            }
            return Ok(SegData { bytes: SegBytes::Raw(w.buf), records });
        }
        let data = self.map_data()?;
        let mut checked = Checked::default();
        for e in entries {
            let span = self.span(&data, e, &mut checked)?;
            let (seqs, ifaces) = s2.positions_and_ifaces(e)?;
            let base = e.data_offset as usize;
            records.extend(self.records(e, &seqs, &ifaces, span)?.into_iter().map(|r| Record { at: base + r.at, ..r }));
        }
        Ok(SegData { bytes: SegBytes::Mapped(data), records })
    }

    /// The whole raw data, every block checked: mapped if plain, decompressed if compressed.
    pub(crate) fn read_all(&self) -> Result<SegBytes, StoreError> {
        if self.stage1.codec.is_compressed() {
            let w = self.read_raw(std::slice::from_ref(&(0..self.stage1.bytes)))?;
            return Ok(SegBytes::Raw(w.buf));
        }
        let data = self.map_data()?;
        self.check(data.bytes(), 0..data.bytes().len() as u64, &mut Checked::default())?;
        Ok(SegBytes::Mapped(data))
    }

    fn past_end(&self, e: &FlowEntry) -> StoreError {
        StoreError::Corrupt {
            path: self.data.clone(),
            offset: self.stage1.bytes,
            why: format!("flow {} lies past the end of the data", e.flow.id),
        }
    }

    /// Checks the data of `range` of the data file (whose bytes are `data`) against its block checksums, each
    /// block once per `checked` (a version 2 segment has none: nothing to check).
    pub(crate) fn check(&self, data: &[u8], range: Range<u64>, checked: &mut Checked) -> Result<(), StoreError> {
        if self.stage1.block_log2 == 0 {
            return Ok(());
        }
        let sums = self.sums()?;
        checked.check(&self.data, data, 0, sums, self.stage1.block_log2, range)
    }

    /// Reads the packets of entry `e` of `s2`, checked, with one read of the data file; calls `f` with each, in
    /// the flow's order.
    pub fn read_flow(
        &self,
        s2: &Stage2,
        e: &FlowEntry,
        buf: &mut Vec<u8>,
        f: &mut dyn FnMut(&StoredPacket<'_>),
    ) -> Result<(), StoreError> {
        if e.packets == 0 {
            return Ok(());
        }
        if self.stage1.codec.is_compressed() {
            let got = self.read_entries(s2, &[e])?;
            for r in &got.records {
                let data = &got.bytes.bytes()[r.at..r.at + r.len];
                let meta = self.stage1.meta(r.iface);
                f(&StoredPacket { seq: r.seq, ts_ns: r.ts_ns, wirelen: r.wirelen, data, meta });
            }
            return Ok(());
        }
        let (seqs, ifaces) = s2.positions_and_ifaces(e)?;
        let (lo, hi) = self.read_span(e, buf)?;
        for r in self.records(e, &seqs, &ifaces, &buf[lo..hi])? {
            let data = &buf[lo + r.at..lo + r.at + r.len];
            f(&StoredPacket { seq: r.seq, ts_ns: r.ts_ns, wirelen: r.wirelen, data, meta: self.stage1.meta(r.iface) });
        }
        Ok(())
    }

    /// Finds flow `id`: stage 2's block directory binary-searched, one block and the flow's positions decoded.
    /// `None` if the segment has no part of the flow.
    pub fn find_flow(&self, id: u64) -> Result<Option<(FlowEntry, Arc<Stage2>)>, StoreError> {
        let s2 = self.stage2_kept()?;
        Ok(s2.find(id)?.map(|e| (e, s2)))
    }

    /// Reads the bytes of entry `e`'s packets with the whole checksum blocks around them into `buf`, checks
    /// them, and returns where in `buf` the entry's bytes are.
    fn read_span(&self, e: &FlowEntry, buf: &mut Vec<u8>) -> Result<(usize, usize), StoreError> {
        let file_len = self.stage1.bytes;
        let end = e.data_offset.checked_add(e.data_len).filter(|&end| end <= file_len).ok_or_else(|| {
            StoreError::Corrupt {
                path: self.data.clone(),
                offset: file_len,
                why: format!("flow {} lies past the end of the data file", e.flow.id),
            }
        })?;
        let (from, to) = match self.stage1.checksum_block() {
            Some(b) => (e.data_offset / b * b, end.div_ceil(b).saturating_mul(b).min(file_len)),
            None => (e.data_offset, end),
        };
        let len = usize::try_from(to - from).map_err(|_| self.corrupt(0, "flow length"))?;
        buf.resize(len, 0);
        self.data_file.read_exact_at(buf, from).map_err(|err| StoreError::io(&self.data, err))?;
        if self.stage1.block_log2 != 0 {
            let sums = self.sums()?;
            Checked::default().check(&self.data, buf, from, sums, self.stage1.block_log2, from..to)?;
        }
        Ok(((e.data_offset - from) as usize, (end - from) as usize))
    }

    /// Maps the data file (segments are written once and replaced only by removal, so the map stays valid): a
    /// plain segment's packets, or a compressed one's stored blocks.
    pub(crate) fn map_data(&self) -> Result<Arc<MappedFile>, StoreError> {
        // (Checked each time, kept mapping or not: a file cut short fails the read rather than faulting it.)
        self.check_data_len()?;
        self.mapping()
    }

    /// [`map_data`](Self::map_data) once the data file's length is checked.
    fn mapping(&self) -> Result<Arc<MappedFile>, StoreError> {
        if let Some(m) = self.kept_map.get() {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(MappedFile::map(&self.data_file).map_err(|e| StoreError::io(&self.data, e))?);
        if self.keep.is_some() || self.stage1.codec.is_compressed() {
            return Ok(Arc::clone(self.kept_map.get_or_init(|| m)));
        }
        Ok(m)
    }

    /// The bytes of entry `e`'s packets in the mapped data file `data`, checked against their checksums (each
    /// block once per `checked`).
    pub(crate) fn span<'m>(
        &self,
        data: &'m MappedFile,
        e: &FlowEntry,
        checked: &mut Checked,
    ) -> Result<&'m [u8], StoreError> {
        let b = data.bytes();
        let range = usize::try_from(e.data_offset)
            .ok()
            .and_then(|from| Some(from..from.checked_add(usize::try_from(e.data_len).ok()?)?))
            .filter(|r| r.end <= b.len())
            .ok_or_else(|| StoreError::Corrupt {
                path: self.data.clone(),
                offset: b.len() as u64,
                why: format!("flow {} lies past the end of the data file", e.flow.id),
            })?;
        self.check(b, range.start as u64..range.end as u64, checked)?;
        Ok(&b[range])
    }

    /// The records of entry `e` in `span` (its bytes), checked to fill it exactly, with positions `seqs` and
    /// interfaces `ifaces` (empty: the segment's only one).
    pub(crate) fn records(
        &self,
        e: &FlowEntry,
        seqs: &[u64],
        ifaces: &[u16],
        span: &[u8],
    ) -> Result<Vec<Record>, StoreError> {
        let bad = |why: &str| StoreError::Corrupt { path: self.data.clone(), offset: e.data_offset, why: why.into() };
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0usize;
        for (i, &seq) in seqs.iter().enumerate() {
            let h = span.get(at..at + 16).ok_or_else(|| bad("a flow's records end early"))?;
            let le = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
            let ts_ns = u64::from(le(0)) * 1_000_000_000 + u64::from(le(4));
            let (len, wirelen) = (le(8) as usize, le(12));
            if span.len() - (at + 16) < len {
                return Err(bad("a record runs past its flow"));
            }
            let iface = ifaces.get(i).map_or(0, |&x| usize::from(x));
            out.push(Record { seq, ts_ns, wirelen, at: at + 16, len, iface });
            at += 16 + len;
        }
        if at != span.len() {
            return Err(bad("a flow's records do not fill its span"));
        }
        Ok(out)
    }
}

/// Raw data decompressed from some of a segment's blocks: their bytes one after another, and where each block
/// starts in the raw data and in `buf`.
#[derive(Debug, Default)]
pub(crate) struct RawWindow {
    pub buf: Arc<Vec<u8>>,
    pub pieces: Vec<(u64, usize)>,
}

impl RawWindow {
    /// The raw bytes `at..at + len` (within consecutive blocks read), and where they start in `buf`.
    pub(crate) fn get(&self, at: u64, len: u64) -> Option<(usize, &[u8])> {
        let i = self.pieces.partition_point(|p| p.0 <= at).checked_sub(1)?;
        let (raw, start) = self.pieces[i];
        let from = start + usize::try_from(at - raw).ok()?;
        let to = from.checked_add(usize::try_from(len).ok()?)?;
        // Blocks after piece `i` follow it in `buf`; they must follow it in the raw data too, up to `to`.
        let mut j = i;
        while j + 1 < self.pieces.len() && self.pieces[j + 1].1 < to {
            let (r0, s0) = self.pieces[j];
            let (r1, s1) = self.pieces[j + 1];
            if r1 - r0 != (s1 - s0) as u64 {
                return None;
            }
            j += 1;
        }
        Some((from, self.buf.get(from..to)?))
    }
}

/// A segment's data as read for a query: mapped (plain) or decompressed (compressed).
#[derive(Debug)]
pub(crate) enum SegBytes {
    Mapped(Arc<MappedFile>),
    Raw(Arc<Vec<u8>>),
}

impl SegBytes {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            SegBytes::Mapped(m) => m.bytes(),
            SegBytes::Raw(v) => v,
        }
    }
}

/// Packets read from a segment: the bytes that hold them, and their records (each `at` an offset in them).
#[derive(Debug)]
pub(crate) struct SegData {
    pub bytes: SegBytes,
    pub records: Vec<Record>,
}

/// A record of a flow's span: its position in the original order, timestamp, wire length, where its bytes are
/// in the span, and its interface (an index into its segment's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    pub seq: u64,
    pub ts_ns: u64,
    pub wirelen: u32,
    pub at: usize,
    pub len: usize,
    pub iface: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Reads of any ranges of compressed data (both codecs, deduplicated or not, blocks of 4 KiB), two one
        /// after the other so that the second meets blocks the first kept, give the bytes of the whole data
        /// decompressed: ranges within a block, across blocks, overlapping, wanting a little or most of a block.
        #[test]
        fn reads_of_compressed_data_give_its_bytes(
            kind in 0u8..4,
            reads in proptest::collection::vec(
                proptest::collection::vec((0u32..u32::MAX, proptest::prop_oneof![0u64..300, 0u64..20_000]), 1..12),
                2,
            ),
        ) {
            let dir = crate::fuzz_harness::compressed_store(kind & 1 == 1, kind & 2 == 2);
            let store = crate::Store::open(&dir).unwrap();
            let seg = &store.segments()[0];
            let whole = match seg.read_all().unwrap() {
                SegBytes::Raw(v) => v,
                SegBytes::Mapped(_) => unreachable!("a compressed segment is decompressed"),
            };
            let n = seg.stage1.bytes;
            proptest::prop_assert_eq!(whole.len() as u64, n);
            // A new store: its blocks kept only by the reads below.
            let store = crate::Store::open(&dir).unwrap();
            let seg = &store.segments()[0];
            for read in reads {
                let ranges: Vec<Range<u64>> = read
                    .iter()
                    .map(|&(at, len)| {
                        let at = u64::from(at) * n / (1 << 32);
                        at..(at + len).min(n)
                    })
                    .collect();
                let w = seg.read_raw(&ranges).unwrap();
                // (An empty range is never asked for.)
                for r in ranges.into_iter().filter(|r| !r.is_empty()) {
                    let (_, got) = w.get(r.start, r.end - r.start).unwrap();
                    proptest::prop_assert!(got == &whole[r.start as usize..r.end as usize], "{r:?}");
                }
            }
        }
    }

    /// Flows read one after another, as an export reads a segment's packets, decompress each block about once
    /// (a block read in part, then whole by the next flow, twice), not once per flow, and give the packets the
    /// whole segment holds.
    #[test]
    fn flows_read_one_after_another_decompress_each_block_about_once() {
        for (zstd, dedup) in [(false, false), (true, false), (false, true), (true, true)] {
            let store = crate::Store::open(&crate::fuzz_harness::compressed_store(zstd, dedup)).unwrap();
            let seg = &store.segments()[0];
            let s2 = seg.stage2().unwrap();
            let entries = s2.entries().unwrap();
            let blocks = seg.blocks().unwrap().entries.len();
            let before = crate::blocks::DECOMPRESSED.get();
            let mut packets = 0u64;
            for e in &entries {
                seg.read_flow(&s2, e, &mut Vec::new(), &mut |_| packets += 1).unwrap();
            }
            let decompressed = crate::blocks::DECOMPRESSED.get() - before;
            assert_eq!(packets, seg.stage1.packets);
            assert!(entries.len() > 4 * blocks, "{} flows in {blocks} blocks: too few to tell", entries.len());
            assert!(decompressed <= 2 * blocks, "{decompressed} blocks decompressed of {blocks} ({zstd}, {dedup})");
        }
    }

    #[test]
    fn recent_blocks_share_small_windows_and_copy_large_ones() {
        let mut recent = RecentBlocks::default();
        let window = |n: usize| Arc::new((0..n).map(|i| i as u8).collect::<Vec<u8>>());
        // A window of four blocks of 10 bytes: shared.
        let small = window(40);
        recent.put(1, &small, 10..20, 10);
        assert!(matches!(recent.blocks[0].1, Recent::Shared(..)));
        assert_eq!(recent.get(1), Some(&small[10..20]));
        // A window of more than RECENT blocks: the block copied, the window not held.
        let large = window(10 * (RECENT + 1));
        recent.put(2, &large, 30..40, 10);
        assert!(matches!(recent.blocks[1].1, Recent::Copied(..)));
        assert_eq!(recent.get(2), Some(&large[30..40]));
        assert_eq!(Arc::strong_count(&large), 1);
        assert_eq!(recent.held(), 50);
        // Blocks of one window count it once.
        recent.put(3, &small, 0..10, 10);
        assert_eq!(recent.held(), 50);
        // A second window of four blocks would hold 90 bytes > 80: the oldest go until it fits.
        let other = window(40);
        recent.put(4, &other, 0..10, 10);
        assert_eq!(recent.held(), 80);
        assert_eq!((recent.get(1), recent.get(2)), (None, None));
        assert_eq!(recent.get(3), Some(&small[0..10]));
        assert_eq!(recent.get(4), Some(&other[0..10]));
        assert_eq!(Arc::strong_count(&small), 2);
        // Never more than RECENT blocks.
        let tiny = window(10);
        for b in 10..10 + 2 * RECENT {
            recent.put(b, &tiny, 0..10, 10);
        }
        assert_eq!((recent.blocks.len(), recent.held()), (RECENT, 10));
        for b in 100..100 + 2 * RECENT {
            recent.put(b, &window(10), 0..10, 10);
        }
        assert_eq!(recent.blocks.len(), RECENT);
        assert_eq!(recent.held(), RECENT * 10);
        // A short block (a segment's last) is held to the segment's budget, not its own.
        recent.put(200, &window(2), 0..2, 10);
        assert_eq!((recent.blocks.len(), recent.held()), (RECENT, (RECENT - 1) * 10 + 2));
    }
}
