//! Building an index: one pass over the trace, chunk by chunk, chunks encoded in parallel, written in order to a
//! temporary file that is renamed into place when complete (a failed build leaves no index behind).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pcaptool_packet::{Compression, Record, Records, TraceError, TraceReader};
use pcaptool_wavelet::{Encode, HuffmanWaveletTree, RrrBitVector, RrrParams, RsBitVector, RsParams, WaveletMatrix};
use rustc_hash::FxHashMap;

use crate::IndexError;
use crate::chunk::{CHUNK_HEAD, PARTS, shape_of};
use crate::format::identity;
use crate::format::{BLOCK, HEADER_LEN, Header, Out, PAGE, Reading, VERSION, crc32, write_ef};
use crate::keys::{KEY_FIELDS, Key, key_and_flags, len_class, pair_keys, shape_rank, write_column};
use crate::lanes::{assign, write_flows};
use crate::shapes::group_by_lane;

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Packets per chunk (a positive multiple of 1024; default 1,048,576).
    pub chunk_packets: u32,
    /// Cut every packet to this many bytes before reading its fields, as the filters that will use the index
    /// see it (libpcap's snapshot length; `u32::MAX`: no cut).
    pub snap: u32,
}

impl Default for BuildOptions {
    fn default() -> BuildOptions {
        BuildOptions { chunk_packets: 1 << 20, snap: u32::MAX }
    }
}

/// What a build did.
#[derive(Debug)]
pub struct BuildStats {
    /// Packets indexed.
    pub packets: u64,
    /// Chunks written.
    pub chunks: u32,
    /// Distinct keys, summed over chunks.
    pub keys: u64,
    /// Bytes of the index file.
    pub index_bytes: u64,
    /// Bytes of the trace file.
    pub trace_bytes: u64,
    /// Damage that ended the trace early (the index covers the packets before it).
    pub damage: Option<TraceError>,
}

pub(crate) fn compression_code(c: Option<Compression>) -> u8 {
    match c {
        None => 0,
        Some(Compression::Gzip) => 1,
        Some(Compression::Zstd) => 2,
        Some(Compression::Lz4) => 3,
    }
}

/// The packets of one chunk, reduced to what the index keeps.
#[derive(Debug, Default)]
struct ChunkInput {
    first_packet: u64,
    /// Key id of every packet.
    ids: Vec<u32>,
    /// Distinct keys, by id.
    keys: Vec<Key>,
    /// Shape (TCP flags code and wire-length class, see `shape_of`) of every packet.
    shapes: Vec<u32>,
    /// Earliest and latest timestamp of every page.
    pages: Vec<(u64, u64)>,
    /// Stream offset of the first record of every block.
    blocks: Vec<u64>,
    /// Stream offset just past the last record.
    reached: u64,
}

impl ChunkInput {
    fn new(first_packet: u64) -> ChunkInput {
        ChunkInput { first_packet, ..ChunkInput::default() }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Adds the position and time of the next packet (its key id is pushed by the caller).
    fn place(&mut self, offset: u64, ts: u64) {
        let i = self.ids.len();
        if i.is_multiple_of(BLOCK) {
            self.blocks.push(offset);
        }
        if i.is_multiple_of(PAGE) {
            self.pages.push((ts, ts));
        } else if let Some(p) = self.pages.last_mut() {
            p.0 = p.0.min(ts);
            p.1 = p.1.max(ts);
        }
    }
}

/// Interns keys into ids in order of first appearance.
#[derive(Default)]
struct Interner {
    map: FxHashMap<Key, u32>,
    keys: Vec<Key>,
}

impl Interner {
    fn id(&mut self, k: &Key) -> u32 {
        if let Some(&id) = self.map.get(k) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.map.insert(*k, id);
        self.keys.push(*k);
        id
    }
}

/// A packet's key and shape (TCP flags code and wire-length class).
fn facts_of_record(rec: &Record<'_>, how: Reading) -> (Key, u32) {
    let fields = how.fields(rec);
    let (key, flags) = key_and_flags(&fields);
    (key, shape_of(flags, len_class(rec.wirelen)))
}

/// How many records ahead of the one being read the key extraction prefetches headers.
const PREFETCH_RECORDS: usize = 16;

/// Batches of records the walk may have handed on and not had back.
const MAX_BATCHES: usize = 16;

/// Records per batch: the walk hands the records on in batches whose facts are read in parallel. A batch is a
/// whole number of pages (so of blocks) and divides the chunk, so that batches tile chunks.
fn batch_len(chunk: usize) -> usize {
    let pages = chunk / PAGE;
    PAGE * (1usize << pages.trailing_zeros().min(3))
}

/// The facts of a batch of consecutive records, keys numbered in order of first appearance within the batch.
fn batch_of(recs: &[Record<'_>], how: Reading) -> ChunkInput {
    let mut input = ChunkInput::new(0);
    let mut int = Interner::default();
    input.ids.reserve(recs.len());
    input.shapes.reserve(recs.len());
    for (i, r) in recs.iter().enumerate() {
        // The records were walked a while ago: their headers are loaded again, a few records ahead.
        if let Some(ahead) = recs.get(i + PREFETCH_RECORDS) {
            ahead.prefetch_headers();
        }
        input.place(r.offset, r.ts_ns);
        let (k, shape) = facts_of_record(r, how);
        input.ids.push(int.id(&k));
        input.shapes.push(shape);
    }
    input.reached = recs.last().map_or(0, |r| r.offset + u64::from(r.record_len));
    input.keys = int.keys;
    input
}

/// A chunk from its batches in order (batches tile pages, so their pages and blocks concatenate).
fn chunk_of_batches(first_packet: u64, batches: Vec<ChunkInput>) -> ChunkInput {
    let mut input = ChunkInput::new(first_packet);
    let n = batches.iter().map(ChunkInput::len).sum();
    input.ids.reserve(n);
    input.shapes.reserve(n);
    let mut int = Interner::default();
    for b in batches {
        let global: Vec<u32> = b.keys.iter().map(|k| int.id(k)).collect();
        input.ids.extend(b.ids.iter().map(|&id| global[id as usize]));
        input.shapes.extend_from_slice(&b.shapes);
        input.blocks.extend_from_slice(&b.blocks);
        input.pages.extend_from_slice(&b.pages);
        input.reached = input.reached.max(b.reached);
    }
    input.keys = int.keys;
    input
}

/// What the build's jobs hand back to the walking thread.
enum Done<'a> {
    /// Batch `seq`'s facts, and its record list to reuse.
    Batch(usize, ChunkInput, Vec<Record<'a>>),
    /// Chunk `seq` encoded, and the stream offset it reaches.
    Chunk(usize, Encoded, u64),
    /// A job panicked (a bug): the walking thread, which would otherwise wait for its result forever, panics too.
    Panicked(Box<dyn std::any::Any + Send>),
}

/// Runs `job` and sends what it returns (`done` makes the message), or its panic.
fn send_done<'a, T>(tx: &std::sync::mpsc::Sender<Done<'a>>, job: impl FnOnce() -> T, done: impl FnOnce(T) -> Done<'a>) {
    let msg = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(v) => done(v),
        Err(p) => Done::Panicked(p),
    };
    // The receiver lives until every job has ended; a send fails only after the build gave up on an error.
    let _ = tx.send(msg);
}

/// The mapped trace's chunks, encoded and handed to `sink` in order. The walk over the records is serial (one
/// record's length finds the next); it runs on the calling thread and hands batches of records to the pool, which
/// reads their facts and encodes chunks meanwhile. Memory is bounded: at most [`MAX_BATCHES`] batches of records
/// and one chunk per thread (2 to 8) are in flight.
fn build_mapped<'a>(
    recs: &mut Records<'a>,
    chunk: usize,
    how: Reading,
    sink: &mut Sink,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Option<TraceError>, IndexError> {
    use std::collections::BTreeMap;
    use std::sync::mpsc;
    let batch = batch_len(chunk);
    let max_batches = MAX_BATCHES;
    let max_chunks = rayon::current_num_threads().clamp(2, 8);
    let (tx, rx) = mpsc::channel::<Done<'a>>();
    rayon::in_place_scope(|s| {
        let mut damage = None;
        let mut walked_all = false;
        let mut pool: Vec<Vec<Record<'a>>> = Vec::new();
        let (mut walked, mut batches_out) = (0usize, 0usize);
        // Batches whose facts are back, by sequence number, and the chunk being gathered.
        let mut facts: BTreeMap<usize, ChunkInput> = BTreeMap::new();
        let (mut next_batch, mut gathered, mut gathered_len) = (0usize, Vec::new(), 0usize);
        let (mut chunks, mut chunks_out, mut next_packet) = (0usize, 0usize, 0u64);
        let mut encoded: BTreeMap<usize, (Encoded, u64)> = BTreeMap::new();
        let mut next_chunk = 0usize;
        loop {
            // Walk the next batch while there is room for it.
            if !walked_all && batches_out < max_batches && chunks_out < max_chunks {
                let mut v = pool.pop().unwrap_or_else(|| Vec::with_capacity(batch));
                v.clear();
                for r in recs.by_ref() {
                    match r {
                        Ok(r) => {
                            v.push(r);
                            if v.len() == batch {
                                break;
                            }
                        }
                        Err(e) => {
                            damage = Some(e);
                            break;
                        }
                    }
                }
                walked_all = v.len() < batch || damage.is_some();
                if !v.is_empty() {
                    let (tx, seq) = (tx.clone(), walked);
                    walked += 1;
                    batches_out += 1;
                    s.spawn(move |_| {
                        send_done(&tx, move || (batch_of(&v, how), v), |(f, v)| Done::Batch(seq, f, v));
                    });
                }
            }
            // Take what is back; wait only when nothing else can be done.
            let can_walk = !walked_all && batches_out < max_batches && chunks_out < max_chunks;
            let got = if can_walk {
                rx.try_recv().ok()
            } else if batches_out + chunks_out > 0 {
                rx.recv().ok()
            } else {
                None
            };
            match got {
                Some(Done::Batch(seq, f, v)) => {
                    batches_out -= 1;
                    pool.push(v);
                    facts.insert(seq, f);
                }
                Some(Done::Chunk(seq, e, reached)) => {
                    chunks_out -= 1;
                    encoded.insert(seq, (e, reached));
                }
                Some(Done::Panicked(p)) => std::panic::resume_unwind(p),
                None => {}
            }
            // Gather batches into chunks in order; encode each full chunk, and the last one.
            loop {
                let all_in = walked_all && next_batch == walked;
                if gathered_len == chunk || (all_in && gathered_len > 0) {
                    let (tx, seq, first) = (tx.clone(), chunks, next_packet);
                    let parts = std::mem::take(&mut gathered);
                    chunks += 1;
                    chunks_out += 1;
                    next_packet += gathered_len as u64;
                    gathered_len = 0;
                    s.spawn(move |_| {
                        send_done(
                            &tx,
                            || {
                                let input = chunk_of_batches(first, parts);
                                let reached = input.reached;
                                (encode_chunk(input), reached)
                            },
                            |(e, reached)| Done::Chunk(seq, e, reached),
                        );
                    });
                }
                let Some(f) = facts.remove(&next_batch) else { break };
                next_batch += 1;
                gathered_len += f.len();
                gathered.push(f);
            }
            while let Some((e, reached)) = encoded.remove(&next_chunk) {
                next_chunk += 1;
                sink.put(e)?;
                progress(reached);
            }
            if walked_all && next_batch == walked && gathered.is_empty() && next_chunk == chunks {
                return Ok(damage);
            }
        }
    })
}

/// A chunk's bytes and what the directory says of it.
struct Encoded {
    bytes: Vec<u8>,
    /// CRC-32 of the chunk's head (its parts carry their own).
    head_crc: u32,
    packets: u32,
    keys: u32,
    first_packet: u64,
    t_min: u64,
    t_max: u64,
}

fn encode_chunk(input: ChunkInput) -> Encoded {
    let n = input.len();
    // Keys paired into flows (rows by class, then first packet); each packet's key `2·row + direction`.
    let (rows, key_of_id) = pair_keys(&input.keys);
    let mut first = vec![u32::MAX; rows.len()];
    let mut last = vec![0u32; rows.len()];
    let mut packets = vec![0u32; rows.len()];
    for (i, &id) in input.ids.iter().enumerate() {
        let row = key_of_id[id as usize] as usize / 2;
        if first[row] == u32::MAX {
            first[row] = i as u32;
        }
        last[row] = i as u32;
        packets[row] += 1;
    }
    let class: Vec<u8> = rows.iter().map(shape_rank).collect();
    let lanes = assign(&class, &first, &last, &packets);
    let symbols: Vec<u32> = input
        .ids
        .iter()
        .map(|&id| {
            let k = key_of_id[id as usize];
            2 * lanes.lane[k as usize / 2] + k % 2
        })
        .collect();
    let base = input.blocks.first().copied().unwrap_or(0);
    let span = input.blocks.last().map_or(0, |l| l - base);
    let mut parts: Vec<Vec<u8>> = Vec::with_capacity(PARTS);
    let mut o = Out::default();
    for &(lo, hi) in &input.pages {
        o.u64(lo);
        o.u64(hi);
    }
    parts.push(o.into_inner());
    let mut o = Out::default();
    let relative: Vec<u64> = input.blocks.iter().map(|&b| b - base).collect();
    write_ef(&mut o, &relative, span + 1);
    parts.push(o.into_inner());
    for i in 0..KEY_FIELDS.len() {
        let mut o = Out::default();
        write_column(&mut o, &rows, i);
        parts.push(o.into_inner());
    }
    let mut o = Out::default();
    write_flows(&mut o, &lanes, &class, n);
    parts.push(o.into_inner());
    parts.push(encode_sequence(&symbols));
    parts.push(encode_shapes(&group_by_lane(&input.shapes, &symbols)));
    debug_assert_eq!(parts.len(), PARTS);
    let mut head = Out::default();
    head.u32(n as u32);
    head.u32(rows.len() as u32);
    head.u64(input.first_packet);
    head.u64(base);
    head.u32(0);
    head.u32(PARTS as u32);
    let mut at = CHUNK_HEAD;
    for p in &parts {
        head.u32(at as u32);
        head.u32(p.len() as u32);
        head.u32(crc32(p));
        head.u32(0);
        at = (at + p.len()).next_multiple_of(8);
    }
    debug_assert_eq!(head.len(), CHUNK_HEAD);
    let head_crc = crc32(head_bytes(&head));
    let mut o = head;
    for p in &parts {
        o.bytes(p);
        o.align8();
    }
    Encoded {
        bytes: o.into_inner(),
        head_crc,
        packets: n as u32,
        keys: input.keys.len() as u32,
        first_packet: input.first_packet,
        t_min: input.pages.iter().map(|p| p.0).min().unwrap_or(0),
        t_max: input.pages.iter().map(|p| p.1).max().unwrap_or(0),
    }
}

fn head_bytes(o: &Out) -> &[u8] {
    o.as_slice()
}

/// Words per rank sample of the sequences' bit vectors, which a reader computes when it loads them (they are not
/// written): 16 keeps the samples in memory at 6.25% of the bits, for at most 15 popcounts per rank; 8 (rank9, 25%)
/// measured no faster on a needle query (docs/BENCHMARKS.md).
const RANK_RATE: usize = 16;

/// A per-packet sequence as the smaller wavelet structure, by the sizes both would have: a Huffman-shaped tree
/// costs the Huffman code's bits (the sum of the weights merged while building the code) plus 24 bytes per
/// distinct symbol, a wavelet matrix `n·⌈log2(max + 1)⌉` bits and no table (with the same rank samples on both).
pub(crate) fn encode_sequence(seq: &[u32]) -> Vec<u8> {
    let max = seq.iter().copied().max().unwrap_or(0);
    let mut counts = vec![0u64; max as usize + 1];
    for &s in seq {
        counts[s as usize] += 1;
    }
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<u64>> =
        counts.iter().filter(|&&c| c > 0).map(|&c| std::cmp::Reverse(c)).collect();
    let sigma = heap.len() as u64;
    let mut code_bits = 0u64;
    while heap.len() > 1 {
        let (std::cmp::Reverse(a), std::cmp::Reverse(b)) =
            (heap.pop().unwrap_or_default(), heap.pop().unwrap_or_default());
        code_bits += a + b;
        heap.push(std::cmp::Reverse(a + b));
    }
    let huffman_bits = code_bits + 192 * sigma;
    let matrix_bits = seq.len() as u64 * u64::from((32 - max.leading_zeros()).max(1));
    // The rank and select directories are not written: a reader computes them in the one pass over the bits that
    // checking stored ones would cost (a tenth of a sequence's bytes saved).
    let params = RsParams { rate: RANK_RATE, store_directories: false };
    if matrix_bits < huffman_bits {
        WaveletMatrix::<RsBitVector>::build(seq.iter().copied(), params).to_bytes()
    } else {
        HuffmanWaveletTree::<RsBitVector>::build(seq.iter().copied(), params).to_bytes()
    }
}

/// The shape sequence grouped by lane symbol (`shapes.rs`): a Huffman-shaped tree of RRR bit vectors, blocks of 63
/// bits (each flow's few shapes make long runs there: 0.29 B a packet against 0.41 for the same shapes in time order
/// in plain bit vectors) and a sample every 64 blocks.
fn encode_shapes(grouped: &[u32]) -> Vec<u8> {
    let params = RrrParams { block: 63, sample: SHAPE_SAMPLE };
    HuffmanWaveletTree::<RrrBitVector>::build(grouped.iter().copied(), params).to_bytes()
}

/// Blocks of 63 bits per sample of the shape sequence's bit vectors.
const SHAPE_SAMPLE: u32 = 64;

/// Writes encoded chunks in order and remembers their directory entries.
struct Sink {
    w: BufWriter<File>,
    path: PathBuf,
    pos: u64,
    dir: Out,
    chunks: u32,
    packets: u64,
    keys: u64,
}

impl Sink {
    fn put(&mut self, e: Encoded) -> Result<(), IndexError> {
        self.w.write_all(&e.bytes).map_err(|err| IndexError::io(&self.path, err))?;
        self.dir.u64(self.pos);
        self.dir.u64(e.bytes.len() as u64);
        self.dir.u32(e.head_crc);
        self.dir.u32(e.packets);
        self.dir.u64(e.first_packet);
        self.dir.u64(e.t_min);
        self.dir.u64(e.t_max);
        self.pos += e.bytes.len() as u64;
        self.chunks += 1;
        self.packets += u64::from(e.packets);
        self.keys += u64::from(e.keys);
        Ok(())
    }
}

/// Indexes `trace` into `index` (see [`crate::sidecar_path`]). `progress` is called with the stream offset reached.
pub fn build(
    trace: &Path,
    index: &Path,
    opts: &BuildOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BuildStats, IndexError> {
    let chunk = opts.chunk_packets;
    if chunk == 0 || !(chunk as usize).is_multiple_of(PAGE) {
        return Err(IndexError::NotIndex {
            path: index.to_path_buf(),
            why: format!("chunk size {chunk} is not a positive multiple of {PAGE}"),
        });
    }
    let (trace_len, mtime_ns, head_crc, tail_crc) = identity(trace)?;
    let mut reader = TraceReader::open(trace)?;
    // (A header that cannot be read is the walk's damage at offset 0, as before it was read here.)
    let swapped = reader.read_header().ok().and(reader.format()).is_some_and(|f| f.swapped());
    let how = Reading { snap: opts.snap, swapped, link_keys: true };
    let tmp = {
        let mut s = index.as_os_str().to_owned();
        s.push(".tmp");
        PathBuf::from(s)
    };
    let file = File::create(&tmp).map_err(|e| IndexError::io(&tmp, e))?;
    let mut sink = Sink {
        w: BufWriter::with_capacity(1 << 20, file),
        path: tmp.clone(),
        pos: HEADER_LEN as u64,
        dir: Out::default(),
        chunks: 0,
        packets: 0,
        keys: 0,
    };
    let result = (|| -> Result<(Vec<u64>, Option<TraceError>, u64), IndexError> {
        sink.w.write_all(&[0u8; HEADER_LEN]).map_err(|e| IndexError::io(&tmp, e))?;
        if let Some(bytes) = reader.as_bytes() {
            let mut recs = Records::new(bytes).with_path(trace).track_structure();
            let damage = build_mapped(&mut recs, chunk as usize, how, &mut sink, progress)?;
            let stream_len = recs.position();
            Ok((recs.structure().to_vec(), damage, stream_len))
        } else {
            // A compressed trace is read as a stream; its offsets are those of the decompressed stream, and
            // extraction reads it sequentially (see docs/format/index.md).
            let mut input = ChunkInput::new(0);
            let mut int = Interner::default();
            let mut damage = None;
            let mut packets = 0u64;
            let mut end = 0u64;
            loop {
                match reader.next_record() {
                    None => break,
                    Some(Err(e)) => {
                        damage = Some(e);
                        break;
                    }
                    Some(Ok(r)) => {
                        input.place(r.offset, r.ts_ns);
                        let (k, shape) = facts_of_record(&r, how);
                        input.ids.push(int.id(&k));
                        input.shapes.push(shape);
                        end = r.offset + u64::from(r.record_len);
                        packets += 1;
                        if input.len() == chunk as usize {
                            input.keys = std::mem::take(&mut int).keys;
                            sink.put(encode_chunk(std::mem::replace(&mut input, ChunkInput::new(packets))))?;
                            progress(end);
                        }
                    }
                }
            }
            if input.len() > 0 {
                input.keys = int.keys;
                sink.put(encode_chunk(input))?;
            }
            Ok((Vec::new(), damage, end))
        }
    })();
    let (structure, damage, stream_len) = match result {
        Ok(v) => v,
        Err(e) => {
            drop(sink);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let (packets, chunks, keys) = (sink.packets, sink.chunks, sink.keys);
    let header = |dir_offset: u64, dir_len: u64| Header {
        version: VERSION,
        swapped,
        trace_len,
        head_crc,
        tail_crc,
        compression: compression_code(reader.compression()),
        snap: opts.snap,
        packets,
        stream_len,
        chunk_packets: chunk,
        chunks,
        dir_offset,
        dir_len,
        damage: damage.as_ref().map_or(u64::MAX, |d| d.offset),
        mtime_ns,
    };
    let finish = (|| -> Result<u64, IndexError> {
        let mut dir = Out::default();
        dir.u32(structure.len() as u32);
        dir.u32(0);
        for s in &structure {
            dir.u64(*s);
        }
        dir.bytes(&std::mem::take(&mut sink.dir).into_inner());
        let mut dir = dir.into_inner();
        let crc = crc32(&dir);
        dir.extend_from_slice(&crc.to_le_bytes());
        let dir_offset = sink.pos;
        sink.w.write_all(&dir).map_err(|e| IndexError::io(&tmp, e))?;
        let mut f = sink.w.into_inner().map_err(|e| IndexError::io(&tmp, e.into_error()))?;
        f.seek(SeekFrom::Start(0)).map_err(|e| IndexError::io(&tmp, e))?;
        f.write_all(&header(dir_offset, dir.len() as u64).encode()).map_err(|e| IndexError::io(&tmp, e))?;
        f.sync_all().map_err(|e| IndexError::io(&tmp, e))?;
        Ok(dir_offset + dir.len() as u64)
    })();
    let index_bytes = match finish {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, index).map_err(|e| IndexError::io(index, e))?;
    Ok(BuildStats { packets, chunks, keys, index_bytes, trace_bytes: trace_len, damage })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_tile_pages_and_chunks() {
        for pages in 1..=300usize {
            let chunk = pages * PAGE;
            let b = batch_len(chunk);
            assert!(b.is_multiple_of(PAGE) && chunk.is_multiple_of(b) && b <= 8 * PAGE, "chunk {chunk}: batch {b}");
        }
        assert_eq!(batch_len(1 << 20), 8192);
    }

    #[test]
    fn a_job_that_panics_is_reported_not_waited_for() {
        let (tx, rx) = std::sync::mpsc::channel();
        send_done(&tx, || 7u64, |v| Done::Chunk(v as usize, encode_chunk(ChunkInput::new(0)), 0));
        assert!(matches!(rx.recv(), Ok(Done::Chunk(7, ..))));
        send_done(&tx, || -> u64 { panic!("a bug") }, |v| Done::Chunk(v as usize, encode_chunk(ChunkInput::new(0)), 0));
        assert!(matches!(rx.recv(), Ok(Done::Panicked(_))));
    }
}
