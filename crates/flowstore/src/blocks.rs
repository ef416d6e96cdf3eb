//! Compressed packet data (docs/format/segment.md, "Compressed data"): a segment's data file as a run of
//! independently compressed blocks, each a standard frame (LZ4 or Zstandard), so that the file is also what
//! `lz4 -d` or `zstd -d` turn back into the plain segment. Blocks end between flows where they can: a flow
//! smaller than a block lies in one block, and a larger one in consecutive blocks, so that a flow is still one
//! read and a needle decompresses only the blocks that hold its packets.
//!
//! The block directory (in the segment's index) gives each block's raw and stored length and the CRC-32C of
//! both; a reader checks the stored bytes before it decompresses them and the raw bytes after, so damage is an
//! error naming the block, never packets.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, mpsc};

use crate::dedup::{Elision, ElisionError, Elisions};
use crate::error::StoreError;

/// How a segment's packet data is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Codec {
    /// As a pcap file (tcpdump and Wireshark open it as it is).
    #[default]
    None,
    /// LZ4 blocks: fast enough to compress at capture's rate.
    Lz4,
    /// Zstandard blocks at a level (1 to 22): smaller, for archives.
    Zstd {
        /// The compression level.
        level: u8,
    },
}

/// Zstandard's level when none is given (the `zstd` tool's default).
pub const ZSTD_DEFAULT_LEVEL: u8 = 3;
/// The smallest block size taken.
pub const MIN_BLOCK_SIZE: usize = 4 << 10;
/// The largest block size taken: a block holds less than twice the size and one record, within an LZ4 frame's
/// largest block (4 MiB).
pub const MAX_BLOCK_SIZE: usize = 1 << 20;
/// The most raw bytes a block may hold (an LZ4 frame's largest block).
pub(crate) const MAX_RAW: usize = 4 << 20;
/// Bytes of a block's directory entry.
pub(crate) const ENTRY_BYTES: usize = 16;

impl Codec {
    /// Its code in a segment's stage 1 (0 none, 1 LZ4, 2 Zstandard).
    pub(crate) fn id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd { .. } => 2,
        }
    }

    /// The level byte of stage 1 (Zstandard's level, else 0).
    pub(crate) fn level(self) -> u8 {
        match self {
            Codec::Zstd { level } => level,
            _ => 0,
        }
    }

    /// The codec of stage 1's codec and level bytes.
    pub(crate) fn from_parts(id: u8, level: u8) -> Result<Codec, String> {
        match (id, level) {
            (0, 0) => Ok(Codec::None),
            (1, 0) => Ok(Codec::Lz4),
            (2, 1..=22) => Ok(Codec::Zstd { level }),
            _ => Err(format!("codec {id} at level {level}")),
        }
    }

    /// Raw bytes a block aims at when none is given: 64 KiB for LZ4, 256 KiB for Zstandard (whose larger window
    /// pays: on the real-traffic bench trace, a store of 0.460 of the trace in blocks of 64 KiB, 0.442 in blocks of
    /// 256 KiB, where level 9 in blocks of 64 KiB makes 0.451 in three times the time).
    pub fn default_block_size(self) -> usize {
        match self {
            Codec::Zstd { .. } => 256 << 10,
            _ => 64 << 10,
        }
    }

    /// Raw bytes a block of a deduplicated segment aims at when none is given, once the segment's `elided` bytes
    /// of its `raw` ones are known: 64 KiB when an eighth or more was left out, else the codec's default. A read of
    /// an elided payload also decompresses the block that holds its source, elsewhere in the segment, whole for a
    /// few hundred bytes; where much is elided that is most reads, and the store's size is then mostly what was
    /// left out (the real-traffic bench trace's zstd store: 0.156 of the trace in blocks of 256 KiB, 0.162 in 64
    /// KiB, its needle `host 224.0.0.25` 1.49 and 0.92 times the plain store's), where little is, larger blocks
    /// compress better (the generated trace's: 0.294 in 256 KiB, 0.601 in 64 KiB).
    pub fn deduplicated_block_size(self, elided: u64, raw: u64) -> usize {
        if elided >= raw / 8 { 64 << 10 } else { self.default_block_size() }
    }

    /// Whether data is stored in compressed blocks.
    pub fn is_compressed(self) -> bool {
        self != Codec::None
    }

    /// What the data file's name ends with after `.pcap`: the suffix of the tool that decompresses it.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Codec::None => "",
            Codec::Lz4 => ".lz4",
            Codec::Zstd { .. } => ".zst",
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Codec {
    type Err = String;

    /// `none`, `lz4`, `zstd` or `zstd:LEVEL` (1 to 22).
    fn from_str(s: &str) -> Result<Codec, String> {
        let bad = || format!("unknown compression {s:?}: use none, lz4, zstd or zstd:LEVEL (LEVEL 1 to 22)");
        match s.split_once(':') {
            None => match s {
                "none" => Ok(Codec::None),
                "lz4" => Ok(Codec::Lz4),
                "zstd" => Ok(Codec::Zstd { level: ZSTD_DEFAULT_LEVEL }),
                _ => Err(bad()),
            },
            Some(("zstd", level)) => match level.parse::<u8>() {
                Ok(level @ 1..=22) => Ok(Codec::Zstd { level }),
                _ => Err(format!("zstd level {level:?}: take 1 (fastest) to 22 (smallest)")),
            },
            Some(_) => Err(bad()),
        }
    }
}

/// A block of a compressed data file, as its directory entry gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockEntry {
    /// Bytes it holds decompressed.
    pub raw_len: u32,
    /// Bytes it takes in the data file.
    pub stored_len: u32,
    /// CRC-32C of its stored bytes.
    pub stored_crc: u32,
    /// CRC-32C of its raw bytes.
    pub raw_crc: u32,
}

/// The block directory of a compressed data file: each block's entry, and where it starts raw and stored.
#[derive(Clone, Debug)]
pub(crate) struct BlockMap {
    pub codec: Codec,
    pub entries: Vec<BlockEntry>,
    /// Where each block starts in the raw data, and the raw length last.
    raw_at: Vec<u64>,
    /// Where each block starts in the data file, and its length last.
    stored_at: Vec<u64>,
    /// Deduplicated data: the raw bytes left out of the blocks.
    elisions: Elisions,
    /// The raw bytes of the largest block.
    largest: usize,
}

impl BlockMap {
    /// Reads a directory of `n` entries from `bytes` and checks it against the lengths stage 1 gives: `raw`
    /// bytes decompressed, `stored` bytes in the data file.
    pub(crate) fn decode(codec: Codec, bytes: &[u8], n: usize, raw: u64, stored: u64) -> Result<BlockMap, String> {
        if bytes.len() != n.checked_mul(ENTRY_BYTES).ok_or("block count")? {
            return Err(format!("a block directory of {} bytes for {n} blocks", bytes.len()));
        }
        let mut entries = Vec::with_capacity(n);
        let (mut raw_at, mut stored_at) = (Vec::with_capacity(n + 1), Vec::with_capacity(n + 1));
        let (mut r, mut s) = (0u64, 0u64);
        for (i, c) in bytes.chunks_exact(ENTRY_BYTES).enumerate() {
            let le = |k: usize| u32::from_le_bytes([c[k], c[k + 1], c[k + 2], c[k + 3]]);
            let e = BlockEntry { raw_len: le(0), stored_len: le(4), stored_crc: le(8), raw_crc: le(12) };
            if e.raw_len == 0 || e.raw_len as usize > MAX_RAW || e.stored_len == 0 {
                return Err(format!("block {i}: {} bytes raw, {} stored", e.raw_len, e.stored_len));
            }
            raw_at.push(r);
            stored_at.push(s);
            r += u64::from(e.raw_len);
            s += u64::from(e.stored_len);
            entries.push(e);
        }
        if (r, s) != (raw, stored) {
            return Err(format!(
                "the blocks hold {r} bytes raw in {s} stored, and the segment {raw} raw in a data file of {stored}"
            ));
        }
        raw_at.push(r);
        stored_at.push(s);
        let largest = entries.iter().map(|e| e.raw_len as usize).max().unwrap_or(0);
        Ok(BlockMap { codec, entries, raw_at, stored_at, elisions: Elisions::none(), largest })
    }

    /// The directory of deduplicated data whose raw bytes `elisions` are left out of the blocks: the blocks'
    /// bytes are then the raw data less those.
    pub(crate) fn with_elisions(mut self, elisions: Elisions) -> BlockMap {
        self.elisions = elisions;
        self
    }

    /// Where raw byte `x` is in the blocks' bytes (an elided byte: where its elision would be).
    pub(crate) fn to_stream(&self, x: u64) -> Result<u64, ElisionError> {
        self.elisions.to_stream(x)
    }

    /// Whether elision `e`'s source is stored bytes (see [`Elisions::source_is_stored`]).
    pub(crate) fn source_is_stored(&self, e: &Elision) -> Result<bool, ElisionError> {
        self.elisions.source_is_stored(e)
    }

    /// The elisions that meet the raw bytes `r`, in order.
    pub(crate) fn elisions_in(&self, r: Range<u64>) -> Result<Vec<Elision>, ElisionError> {
        self.elisions.meeting(r)
    }

    /// The directory's bytes.
    pub(crate) fn encode(entries: &[BlockEntry]) -> Vec<u8> {
        let mut o = Vec::with_capacity(entries.len() * ENTRY_BYTES);
        for e in entries {
            for v in [e.raw_len, e.stored_len, e.stored_crc, e.raw_crc] {
                o.extend_from_slice(&v.to_le_bytes());
            }
        }
        o
    }

    /// The blocks that hold the raw bytes `range` (empty for an empty range).
    pub(crate) fn covering(&self, range: Range<u64>) -> Range<usize> {
        if range.start >= range.end {
            return 0..0;
        }
        // The last block starting at or before each end.
        let first = self.raw_at.partition_point(|&a| a <= range.start).saturating_sub(1);
        let last = self.raw_at.partition_point(|&a| a < range.end).saturating_sub(1);
        first..(last + 1).min(self.entries.len())
    }

    /// Where block `b` lies in the raw data.
    pub(crate) fn raw_range(&self, b: usize) -> Range<u64> {
        self.raw_at[b]..self.raw_at[b + 1]
    }

    /// Where blocks `bs` lie in the data file.
    pub(crate) fn stored_range(&self, bs: Range<usize>) -> Range<u64> {
        self.stored_at[bs.start]..self.stored_at[bs.end]
    }

    /// The raw bytes of the largest block.
    pub(crate) fn largest_block(&self) -> usize {
        self.largest
    }

    /// Raw bytes in all.
    pub(crate) fn raw_len(&self) -> u64 {
        self.raw_at.last().copied().unwrap_or(0)
    }

    /// Checks block `b`'s stored bytes `stored` and decompresses them onto `out`, checking what comes out; the
    /// errors name the data file `path`, the block and its bytes.
    pub(crate) fn decompress(&self, path: &Path, b: usize, stored: &[u8], out: &mut Vec<u8>) -> Result<(), StoreError> {
        #[cfg(test)]
        DECOMPRESSED.set(DECOMPRESSED.get() + 1);
        let e = self.entries[b];
        let at = self.stored_at[b];
        let bad = |why: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: at,
            why: format!("block {b} (bytes {at}..{}): {why}", at + u64::from(e.stored_len)),
        };
        let computed = crc32c::crc32c(stored);
        if computed != e.stored_crc || stored.len() != e.stored_len as usize {
            return Err(StoreError::BlockChecksum {
                path: path.to_path_buf(),
                block: b as u64,
                start: at,
                end: at + u64::from(e.stored_len),
                stored: e.stored_crc,
                computed,
            });
        }
        let from = out.len();
        let n = e.raw_len as usize;
        match self.codec {
            Codec::None => return Err(bad("a plain segment has no blocks".into())),
            Codec::Lz4 => {
                out.resize(from + n, 0);
                lz4_frame_decode(stored, &mut out[from..]).map_err(bad)?;
            }
            Codec::Zstd { .. } => zstd_decompress(stored, out, n).map_err(bad)?,
        }
        if crc32c::crc32c(&out[from..]) != e.raw_crc {
            return Err(bad("its decompressed bytes do not match their checksum".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    /// Blocks this thread decompressed (for the readers' tests).
    pub(crate) static DECOMPRESSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A Zstandard compression context, made when first needed and kept for the next block.
#[derive(Default)]
pub(crate) struct Zstd {
    c: Option<(u8, zstd::bulk::Compressor<'static>)>,
}

impl fmt::Debug for Zstd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Zstd").finish_non_exhaustive()
    }
}

impl Zstd {
    fn compress(&mut self, level: u8, raw: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        if self.c.as_ref().is_none_or(|c| c.0 != level) {
            self.c = Some((level, zstd::bulk::Compressor::new(i32::from(level))?));
        }
        let Some((_, c)) = &mut self.c else { unreachable!("made above") };
        out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
        c.compress_to_buffer(raw, out)?;
        Ok(())
    }
}

/// Calls `f` with this thread's Zstandard decompression context, made when first needed and kept: a needle
/// decompresses a few blocks and index parts of each of many segments, and making a context each time showed.
pub(crate) fn with_zstd_decompressor<R>(
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<R>,
) -> std::io::Result<R> {
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    DCTX.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        let Some(d) = slot.as_mut() else { unreachable!("made above") };
        f(d)
    })
}

/// Decompresses the Zstandard frame `stored`, which must hold `n` bytes, onto the end of `out`, writing them
/// once (into `out`'s spare room: not zeroed first).
fn zstd_decompress(stored: &[u8], out: &mut Vec<u8>, n: usize) -> Result<(), String> {
    // A frame must be whole and give exactly the block's bytes.
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(len)) if len == n as u64 => {}
        Ok(len) => return Err(format!("a Zstandard frame of {len:?} bytes for a block of {n}")),
        Err(_) => return Err("not a Zstandard frame".into()),
    }
    let from = out.len();
    out.reserve(n);
    let got = with_zstd_decompressor(|d| {
        // A cursor at the end of `out`: zstd writes after it and sets the length to its end.
        let mut at = std::io::Cursor::new(&mut *out);
        at.set_position(from as u64);
        d.decompress_to_buffer(stored, &mut at)
    })
    .map_err(|e| format!("Zstandard: {e}"))?;
    if got != n || out.len() != from + n {
        out.truncate(from);
        return Err(format!("{got} bytes decompressed, {n} expected"));
    }
    Ok(())
}

/// The LZ4 frame header of every block: LZ4's magic, then FLG (version 1, independent blocks, no checksums, no
/// content size), BD (blocks of up to 4 MiB) and the header's checksum (the second byte of XXH32 of FLG and BD).
const LZ4_HEADER: [u8; 7] = [0x04, 0x22, 0x4d, 0x18, 0x60, 0x70, 0x73];
/// liblz4's acceleration (`LZ4_compress_fast`): 1 is LZ4's default, each step trades a little size for speed.
/// On the real-traffic bench trace (64 KiB blocks): a store of 0.529 of the trace at 1 (lz4_flex, which has no
/// acceleration, 0.532), 0.548 at 4, 0.570 at 8, 0.584 at 12, 0.596 at 16 (the goal is 0.6). Once the ingest got
/// faster, the close (compressing) became the slower side of an import and of a capture on two processors: a
/// long capture of real traffic at 97-98% of a plain one's rate at 8, 102-106% at 12 (`cargo xtask bench --only
/// compress-long`, docs/BENCHMARKS.md).
const LZ4_ACCELERATION: i32 = 12;
/// The end mark of an LZ4 frame.
const LZ4_END: [u8; 4] = [0; 4];
/// An LZ4 frame's block size word: this bit set says the block is stored uncompressed.
const LZ4_RAW_BIT: u32 = 1 << 31;

/// Writes `raw` as one LZ4 frame of one block (uncompressed within the frame if LZ4 would not make it smaller)
/// at the start of `out`, which it grows if it must (and never shrinks, so that a reused buffer is not zeroed
/// again); returns the frame's length.
fn lz4_frame_encode(raw: &[u8], out: &mut Vec<u8>) -> usize {
    let h = LZ4_HEADER.len();
    let from = h + 4;
    let max = from + lz4_flex::block::get_maximum_output_size(raw.len()).max(raw.len()) + LZ4_END.len();
    if out.len() < max {
        out.resize(max, 0);
    }
    out[..h].copy_from_slice(&LZ4_HEADER);
    let fast = Some(lz4::block::CompressionMode::FAST(LZ4_ACCELERATION));
    let (n, word) = match lz4::block::compress_to_buffer(raw, fast, false, &mut out[from..]) {
        Ok(n) if n < raw.len() => (n, n as u32),
        _ => {
            out[from..from + raw.len()].copy_from_slice(raw);
            (raw.len(), raw.len() as u32 | LZ4_RAW_BIT)
        }
    };
    out[h..from].copy_from_slice(&word.to_le_bytes());
    out[from + n..from + n + LZ4_END.len()].copy_from_slice(&LZ4_END);
    from + n + LZ4_END.len()
}

/// Decodes a frame [`lz4_frame_encode`] wrote into `dst`, which it must fill exactly.
fn lz4_frame_decode(stored: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let body = stored
        .strip_prefix(&LZ4_HEADER[..])
        .and_then(|b| b.strip_suffix(&LZ4_END[..]))
        .ok_or("not an LZ4 frame of pcaptool's")?;
    let (word, data) = body.split_at_checked(4).ok_or("an LZ4 frame without a block")?;
    let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    if (word & !LZ4_RAW_BIT) as usize != data.len() {
        return Err("an LZ4 block whose size is not its frame's".into());
    }
    if word & LZ4_RAW_BIT != 0 {
        if data.len() != dst.len() {
            return Err(format!("a stored LZ4 block of {} bytes for a block of {}", data.len(), dst.len()));
        }
        dst.copy_from_slice(data);
        return Ok(());
    }
    match lz4_flex::block::decompress_into(data, dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(n) => Err(format!("{n} bytes decompressed, {} expected", dst.len())),
        Err(e) => Err(format!("LZ4: {e}")),
    }
}

/// Compresses `raw` as one block with `codec` into `out`, whose first `stored_len` bytes it then is (a buffer
/// kept for the next block may be longer); returns its directory entry.
pub(crate) fn compress(codec: Codec, raw: &[u8], out: &mut Vec<u8>, z: &mut Zstd) -> std::io::Result<BlockEntry> {
    let n = match codec {
        Codec::None => {
            out.clear();
            out.extend_from_slice(raw);
            raw.len()
        }
        Codec::Lz4 => lz4_frame_encode(raw, out),
        Codec::Zstd { level } => {
            out.clear();
            z.compress(level, raw, out)?;
            out.len()
        }
    };
    let stored = &out[..n];
    Ok(BlockEntry {
        raw_len: raw.len() as u32,
        stored_len: stored.len() as u32,
        stored_crc: crc32c::crc32c(stored),
        raw_crc: crc32c::crc32c(raw),
    })
}

/// When [`Batches`] hands a batch to a second thread: always, or (on a machine of two processors) only while the
/// thread that feeds the segments waits for the close. A segment's close runs beside the ingest of the next
/// one; on two processors a second compressing thread would take turns with both, and the ingest, which stops
/// for nothing else, would wait for the close it slowed (an LZ4 import of the real-traffic bench trace took
/// 3.5 s so, against 2.6 s for a plain one).
#[derive(Clone, Debug, Default)]
pub(crate) struct Helper(Option<Arc<AtomicBool>>);

impl Helper {
    /// While `idle` is set, or always on a machine of more than two processors.
    pub(crate) fn while_idle(idle: Arc<AtomicBool>) -> Helper {
        Helper(Some(idle))
    }

    fn now(&self) -> bool {
        static MANY: LazyLock<bool> = LazyLock::new(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 2));
        self.0.as_ref().is_none_or(|idle| *MANY || idle.load(Ordering::Relaxed))
    }
}

/// Blocks compressed in batches and handed on in order. While the [`Helper`] says so, a batch goes to a second
/// thread (kept for the batches' life) and the caller goes on gathering the next: the two overlap, and if the
/// next is ready before the second thread is done, the caller compresses it itself meanwhile.
#[derive(Debug)]
pub(crate) struct Batches {
    codec: Codec,
    helper: Helper,
    /// The batch being gathered: raw blocks waiting (the first `n`), their frames and entries once compressed;
    /// buffers reused.
    now: Batch,
    n: usize,
    /// The batch the worker has (`Some` of its size), or had last (its buffers, for the next one it takes).
    sent: Option<usize>,
    other: Batch,
    /// Started at the first batch it takes: one thread for all the batches, not one each (a thread's start and
    /// end map and unmap its stack, which stops every other thread of the process for a moment).
    worker: Option<Worker>,
}

/// Blocks a batch holds.
const BATCH: usize = 16;

/// The blocks of a batch: raw blocks in, their frames and entries out, and the Zstandard context that
/// compresses them.
#[derive(Debug)]
struct Batch {
    raw: Vec<Vec<u8>>,
    framed: Vec<Vec<u8>>,
    entries: Vec<Option<BlockEntry>>,
    z: Zstd,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            raw: vec![Vec::new(); BATCH],
            framed: vec![Vec::new(); BATCH],
            entries: vec![None; BATCH],
            z: Zstd::default(),
        }
    }

    /// A batch of no buffers, holding a batch's place while the worker has it.
    fn empty() -> Batch {
        Batch { raw: Vec::new(), framed: Vec::new(), entries: Vec::new(), z: Zstd::default() }
    }

    /// Compresses the first `n` raw blocks into their frames, with their entries.
    fn compress(&mut self, codec: Codec, n: usize) -> std::io::Result<()> {
        let Batch { raw, framed, entries, z } = self;
        for ((r, f), e) in raw[..n].iter().zip(&mut framed[..n]).zip(&mut entries[..n]) {
            *e = Some(compress(codec, r, f, z)?);
        }
        Ok(())
    }

    /// Hands the first `n` frames to `emit`, in order.
    fn emit(
        &mut self,
        n: usize,
        emit: &mut dyn FnMut(&[u8], BlockEntry) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        for (f, e) in self.framed[..n].iter().zip(&mut self.entries[..n]) {
            let e = e.take().ok_or_else(|| std::io::Error::other("a block was not compressed"))?;
            emit(&f[..e.stored_len as usize], e)?;
        }
        Ok(())
    }
}

/// A thread that compresses the batches it is sent, one at a time, and sends each back with the outcome.
#[derive(Debug)]
struct Worker {
    jobs: Option<mpsc::SyncSender<(Batch, usize)>>,
    done: mpsc::Receiver<(Batch, std::io::Result<()>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// A worker, or `None` if no thread could start.
    fn start(codec: Codec) -> Option<Worker> {
        let (jobs, todo) = mpsc::sync_channel::<(Batch, usize)>(1);
        let (report, done) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("pcaptool-compress".into())
            .spawn(move || {
                for (mut batch, n) in todo {
                    let result = batch.compress(codec, n);
                    if report.send((batch, result)).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker { jobs: Some(jobs), done, thread: Some(thread) })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Batches {
    pub(crate) fn new(codec: Codec, helper: Helper) -> Batches {
        Batches { codec, helper, now: Batch::new(), n: 0, sent: None, other: Batch::new(), worker: None }
    }

    /// Adds a raw block, taking its buffer (and leaving an empty one in its place); a full batch is compressed and
    /// handed to `emit` (each frame with its entry, in order), now or at a later call.
    pub(crate) fn push(
        &mut self,
        raw: &mut Vec<u8>,
        emit: &mut dyn FnMut(&[u8], BlockEntry) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        std::mem::swap(&mut self.now.raw[self.n], raw);
        raw.clear();
        self.n += 1;
        if self.n == BATCH {
            self.batch(emit, true)?;
        }
        Ok(())
    }

    /// Compresses every block waiting and hands them to `emit`.
    pub(crate) fn flush(
        &mut self,
        emit: &mut dyn FnMut(&[u8], BlockEntry) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.batch(emit, false)?;
        self.take_sent(emit, true)?;
        Ok(())
    }

    /// Sends the batch gathered to the worker if `may_send`, the [`Helper`] says so and the worker is free, or
    /// compresses it here; hands on what is done, in order.
    fn batch(
        &mut self,
        emit: &mut dyn FnMut(&[u8], BlockEntry) -> std::io::Result<()>,
        may_send: bool,
    ) -> std::io::Result<()> {
        let n = std::mem::take(&mut self.n);
        if n == 0 {
            return Ok(());
        }
        if may_send && self.helper.now() {
            // The worker's last batch, if it is done; then this one goes to it.
            self.take_sent(emit, false)?;
            if self.sent.is_none() {
                if self.worker.is_none() {
                    self.worker = Worker::start(self.codec);
                }
                if let Some(jobs) = self.worker.as_ref().and_then(|w| w.jobs.as_ref()) {
                    // The spare buffer gathers the next batch while this one is away.
                    let spare = std::mem::replace(&mut self.other, Batch::empty());
                    let full = std::mem::replace(&mut self.now, spare);
                    match jobs.send((full, n)) {
                        Ok(()) => {
                            self.sent = Some(n);
                            return Ok(());
                        }
                        Err(mpsc::SendError((full, _))) => {
                            // The thread is gone: this batch is compressed here.
                            self.other = std::mem::replace(&mut self.now, full);
                            self.worker = None;
                        }
                    }
                }
            }
        }
        let mine = self.now.compress(self.codec, n);
        // The worker's batch came first.
        self.take_sent(emit, true)?;
        mine?;
        self.now.emit(n, emit)
    }

    /// Hands on the batch the worker has, waiting for it if `wait`, or only if it is done.
    fn take_sent(
        &mut self,
        emit: &mut dyn FnMut(&[u8], BlockEntry) -> std::io::Result<()>,
        wait: bool,
    ) -> std::io::Result<()> {
        let Some(n) = self.sent else { return Ok(()) };
        let stopped = || std::io::Error::other("the compressing thread stopped before its blocks were done");
        let Some(worker) = &self.worker else { return Err(stopped()) };
        let (batch, result) = if wait {
            worker.done.recv().map_err(|_| stopped())?
        } else {
            match worker.done.try_recv() {
                Ok(r) => r,
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => return Err(stopped()),
            }
        };
        self.sent = None;
        self.other = batch;
        result?;
        self.other.emit(n, emit)
    }
}

/// Cuts a segment's raw data into blocks as it is written flow by flow: a block ends at the first end of a flow
/// at or past the block size; a flow that outgrows the block size alone goes out in a block of its own once it
/// does (the flows before it closing a block of theirs), then in blocks of exactly the size, and what is left of
/// it at its end begins the next block. Each block is handed over as the buffer it was gathered in (see
/// [`Emit`]), so that no byte is copied twice.
#[derive(Debug)]
pub(crate) struct Blocker {
    size: usize,
    /// Raw bytes not yet in a block.
    pending: Vec<u8>,
    /// Where the current flow starts in `pending` (0 if it started in an earlier block).
    flow_at: usize,
    /// Whether the current flow has outgrown a block (and `pending` holds only its bytes).
    big: bool,
    /// An empty buffer, for a big flow's bytes when the flows before it leave.
    spare: Vec<u8>,
}

/// Takes a block: the buffer holding exactly its bytes, which it leaves empty (swapped for a buffer of its own).
pub(crate) type Emit<'a> = dyn FnMut(&mut Vec<u8>) -> std::io::Result<()> + 'a;

impl Blocker {
    pub(crate) fn new(size: usize) -> Blocker {
        Blocker { size, pending: Vec::with_capacity(2 * size), flow_at: 0, big: false, spare: Vec::new() }
    }

    /// Adds raw bytes of the current flow; calls `emit` with each block completed.
    pub(crate) fn put(&mut self, mut bytes: &[u8], emit: &mut Emit<'_>) -> std::io::Result<()> {
        while self.big {
            // Only this flow's bytes are pending: fill the block to exactly the size.
            let n = self.size.saturating_sub(self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.pending.len() >= self.size {
                self.hand(emit)?;
            }
            if bytes.is_empty() {
                return Ok(());
            }
        }
        self.pending.extend_from_slice(bytes);
        if self.pending.len() - self.flow_at > self.size {
            if self.flow_at > 0 {
                // The flows before it make a block; its own bytes move to a buffer of their own.
                let mut flow = std::mem::take(&mut self.spare);
                flow.clear();
                flow.extend_from_slice(&self.pending[self.flow_at..]);
                self.pending.truncate(self.flow_at);
                self.hand(emit)?;
                self.spare = std::mem::replace(&mut self.pending, flow);
                self.flow_at = 0;
            }
            self.hand(emit)?;
            self.big = true;
        }
        Ok(())
    }

    /// Marks the end of a flow.
    pub(crate) fn flow_end(&mut self, emit: &mut Emit<'_>) -> std::io::Result<()> {
        self.big = false;
        if self.pending.len() >= self.size {
            self.hand(emit)?;
        }
        self.flow_at = self.pending.len();
        Ok(())
    }

    /// Emits what is left.
    pub(crate) fn finish(&mut self, emit: &mut Emit<'_>) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            self.hand(emit)?;
        }
        self.flow_at = 0;
        self.big = false;
        Ok(())
    }

    /// Hands `pending` over as a block.
    fn hand(&mut self, emit: &mut Emit<'_>) -> std::io::Result<()> {
        emit(&mut self.pending)?;
        self.pending.clear();
        self.flow_at = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codecs_parse_and_print() {
        for (s, c) in [
            ("none", Codec::None),
            ("lz4", Codec::Lz4),
            ("zstd", Codec::Zstd { level: 3 }),
            ("zstd:19", Codec::Zstd { level: 19 }),
        ] {
            assert_eq!(s.parse::<Codec>(), Ok(c));
            assert_eq!(Codec::from_parts(c.id(), c.level()), Ok(c));
        }
        assert_eq!(Codec::Zstd { level: 9 }.to_string(), "zstd:9");
        for bad in ["zstd:0", "zstd:23", "zstd:x", "gzip", "lz4:1", ""] {
            assert!(bad.parse::<Codec>().is_err(), "{bad}");
        }
        assert!(Codec::from_parts(1, 3).is_err());
        assert!(Codec::from_parts(3, 0).is_err());
    }

    /// The LZ4 header is what lz4_flex's frame encoder writes for these settings, and a block frame decodes
    /// with lz4_flex's frame decoder (as with the `lz4` tool).
    #[test]
    fn lz4_frames_are_standard() {
        use lz4_flex::frame::{BlockMode, BlockSize, FrameDecoder, FrameEncoder, FrameInfo};
        use std::io::{Read, Write};
        let info = FrameInfo::new().block_size(BlockSize::Max4MB).block_mode(BlockMode::Independent);
        let mut enc = FrameEncoder::with_frame_info(info, Vec::new());
        enc.write_all(b"x").unwrap();
        let framed = enc.finish().unwrap();
        assert_eq!(framed[..7], LZ4_HEADER);
        let raw: Vec<u8> = (0..100_000u32).map(|i| (i % 251 / 7) as u8).collect();
        let random: Vec<u8> = (0..5000u64).map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8).collect();
        // (lz4_flex's decoder reads one frame; the `lz4` tool reads a file of them: tests/compress.rs.)
        for data in [raw, random] {
            let mut frame = vec![0xee; 3 * data.len() + 100];
            let n = lz4_frame_encode(&data, &mut frame);
            frame.truncate(n);
            let mut back = Vec::new();
            FrameDecoder::new(&frame[..]).read_to_end(&mut back).unwrap();
            assert!(back == data);
        }
    }

    fn roundtrip(codec: Codec, raw: &[u8]) {
        let mut z = Zstd::default();
        // (A reused buffer: longer than the frame.)
        let mut stored = vec![0xee; 2 * raw.len() + 100];
        let e = compress(codec, raw, &mut stored, &mut z).unwrap();
        stored.truncate(e.stored_len as usize);
        let map = BlockMap::decode(codec, &BlockMap::encode(&[e]), 1, raw.len() as u64, stored.len() as u64).unwrap();
        // Onto the end of what `out` holds.
        let mut out = vec![7u8; 3];
        map.decompress(Path::new("d"), 0, &stored, &mut out).unwrap();
        assert_eq!(out[..3], [7, 7, 7]);
        assert_eq!(out[3..], *raw);
        // Every flipped byte of the stored block is caught by its checksum, never decompressed.
        for at in [0, stored.len() / 2, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 1;
            let r = map.decompress(Path::new("d"), 0, &bad, &mut Vec::new());
            assert!(matches!(r, Err(StoreError::BlockChecksum { block: 0, .. })), "{at}: {r:?}");
        }
    }

    #[test]
    fn a_zstd_block_must_be_one_frame_of_its_length() {
        let raw: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut z = Zstd::default();
        let mut one = Vec::new();
        let e = compress(Codec::Zstd { level: 3 }, &raw, &mut one, &mut z).unwrap();
        one.truncate(e.stored_len as usize);
        // Two frames where the directory says one (checksums right): more bytes than the block has.
        let two = [one.clone(), one].concat();
        let entry = BlockEntry { stored_len: two.len() as u32, stored_crc: crc32c::crc32c(&two), ..e };
        let map = BlockMap::decode(
            Codec::Zstd { level: 3 },
            &BlockMap::encode(&[entry]),
            1,
            raw.len() as u64,
            two.len() as u64,
        )
        .unwrap();
        // With room enough for both frames, and with none past the block.
        for spare in [0, 3 * raw.len()] {
            let mut out = Vec::with_capacity(4 + raw.len() + spare);
            out.extend_from_slice(b"keep");
            let r = map.decompress(Path::new("d"), 0, &two, &mut out);
            assert!(matches!(&r, Err(StoreError::Corrupt { why, .. }) if why.contains("block 0")), "{r:?}");
            assert_eq!(out, b"keep");
        }
    }

    #[test]
    fn blocks_round_trip_and_catch_damage() {
        let text: Vec<u8> = (0..70_000u32).map(|i| b"GET /index.html HTTP/1.1\r\n"[i as usize % 26]).collect();
        for codec in [Codec::Lz4, Codec::Zstd { level: 1 }, Codec::Zstd { level: 19 }] {
            roundtrip(codec, &text);
            roundtrip(codec, &[7]);
        }
    }

    /// Batches hand every block on once, in the order pushed, whether each batch goes to the worker or is
    /// compressed by the caller (the helper switching on and off, as the ingest waits and goes on), and a flush in
    /// the middle hands on everything pushed before it.
    #[test]
    fn batches_hand_blocks_on_in_order() {
        for codec in [Codec::Lz4, Codec::Zstd { level: 1 }] {
            for pattern in [0u32, 1, 0b1011, u32::MAX] {
                let idle = Arc::new(AtomicBool::new(false));
                let mut batches = Batches::new(codec, Helper::while_idle(Arc::clone(&idle)));
                let blocks: Vec<Vec<u8>> =
                    (0..150usize).map(|b| (0..500 + b * 37).map(|k| (k / (1 + b % 7) + b) as u8).collect()).collect();
                let mut got: Vec<(Vec<u8>, BlockEntry)> = Vec::new();
                let emitted = std::cell::Cell::new(0usize);
                {
                    let mut emit = |f: &[u8], e: BlockEntry| {
                        got.push((f.to_vec(), e));
                        emitted.set(emitted.get() + 1);
                        Ok(())
                    };
                    for (b, blk) in blocks.iter().enumerate() {
                        idle.store(pattern >> (b / BATCH % 32) & 1 == 1, Ordering::Relaxed);
                        batches.push(&mut blk.clone(), &mut emit).unwrap();
                        if b == 70 {
                            batches.flush(&mut emit).unwrap();
                            assert_eq!(emitted.get(), 71, "{codec} {pattern:b}: a flush hands on all before it");
                        }
                    }
                    batches.flush(&mut emit).unwrap();
                }
                assert_eq!(got.len(), blocks.len(), "{codec} {pattern:b}");
                let entries: Vec<BlockEntry> = got.iter().map(|g| g.1).collect();
                let raw: u64 = blocks.iter().map(|b| b.len() as u64).sum();
                let stored: u64 = got.iter().map(|g| g.0.len() as u64).sum();
                let map = BlockMap::decode(codec, &BlockMap::encode(&entries), entries.len(), raw, stored).unwrap();
                for (b, ((frame, _), want)) in got.iter().zip(&blocks).enumerate() {
                    let mut out = Vec::new();
                    map.decompress(Path::new("d"), b, frame, &mut out).unwrap();
                    assert!(out == *want, "{codec} {pattern:b}: block {b}");
                }
            }
        }
    }

    proptest! {
        /// Blocks cover the data in order, each handed over in the buffer it was gathered in; a block ends at a
        /// flow's end unless the flow is longer than the block size; a flow that fits in a block is in one block.
        #[test]
        fn blocks_keep_flows_together(
            flows in proptest::collection::vec(1usize..20_000, 1..60),
            size in 4096usize..9000,
            piece in 1usize..3000,
        ) {
            let mut b = Blocker::new(size);
            let mut blocks: Vec<Vec<u8>> = Vec::new();
            let mut take = |blk: &mut Vec<u8>| { blocks.push(std::mem::take(blk)); Ok(()) };
            let mut data = Vec::new();
            let mut ends = vec![0usize];
            for (i, &len) in flows.iter().enumerate() {
                let bytes: Vec<u8> = (0..len).map(|k| (i * 31 + k) as u8).collect();
                for p in bytes.chunks(piece) {
                    b.put(p, &mut take).unwrap();
                }
                b.flow_end(&mut take).unwrap();
                data.extend_from_slice(&bytes);
                ends.push(data.len());
            }
            b.finish(&mut take).unwrap();
            prop_assert_eq!(blocks.concat(), data.clone());
            let mut at = 0;
            let mut starts = Vec::new();
            for blk in &blocks {
                prop_assert!(!blk.is_empty() && blk.len() < 2 * size + piece, "a block of {} bytes", blk.len());
                starts.push(at);
                at += blk.len();
            }
            starts.push(at);
            for w in ends.windows(2) {
                let (from, to) = (w[0], w[1]);
                let first = starts.partition_point(|&s| s <= from) - 1;
                let last = starts.partition_point(|&s| s < to) - 1;
                if to - from <= size {
                    prop_assert_eq!(first, last, "a flow of {} bytes in blocks {}..={}", to - from, first, last);
                }
            }
            // A block that does not start at a flow's end starts within a flow longer than the block size.
            for &s in &starts[..blocks.len()] {
                let k = ends.partition_point(|&e| e <= s);
                if ends[k - 1] != s {
                    prop_assert!(ends[k] - ends[k - 1] > size, "a cut at {} in a flow of {} bytes", s, ends[k] - ends[k - 1]);
                }
            }
        }
    }
}
