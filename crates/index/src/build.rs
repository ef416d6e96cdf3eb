//! Building an index: one pass over the trace, chunk by chunk, chunks encoded in parallel, written in order to a
//! temporary file that is renamed into place when complete (a failed build leaves no index behind).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pcaptool_packet::{Compression, PacketFields, Record, Records, TraceError, TraceReader};
use pcaptool_wavelet::{Encode, HuffmanWaveletTree, RsBitVector, RsParams, WaveletMatrix};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::IndexError;
use crate::format::{BLOCK, HEADER_LEN, Header, IDENTITY_SPAN, Out, PAGE, crc32, write_ef};
use crate::keys::{KEY_FIELDS, Key, flags_code, key_of, len_class, pair_keys, shape_rank, write_column};
use crate::lanes::{assign, write_flows};
use crate::select::{CHUNK_HEAD, PARTS, shape_of};

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

/// The identity of a trace file: its length, modification time (ns) and the CRC-32 of its first and last 64 KiB.
pub(crate) fn identity(path: &Path) -> Result<(u64, u64, u32, u32), IndexError> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path).map_err(|e| IndexError::io(path, e))?;
    let meta = f.metadata().map_err(|e| IndexError::io(path, e))?;
    let len = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let span = len.min(IDENTITY_SPAN) as usize;
    let mut buf = vec![0u8; span];
    f.read_exact_at(&mut buf, 0).map_err(|e| IndexError::io(path, e))?;
    let head = crc32(&buf);
    f.read_exact_at(&mut buf, len - span as u64).map_err(|e| IndexError::io(path, e))?;
    Ok((len, mtime, head, crc32(&buf)))
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

fn cut<'a>(rec: &Record<'a>, snap: u32) -> &'a [u8] {
    &rec.data[..rec.data.len().min(snap as usize)]
}

/// A packet's key and shape (TCP flags code and wire-length class).
fn facts_of_record(rec: &Record<'_>, snap: u32) -> (Key, u32) {
    let fields = PacketFields::new(rec.linktype, cut(rec, snap), rec.wirelen, rec.ts_ns);
    (key_of(&fields), shape_of(flags_code(&fields), len_class(rec.wirelen)))
}

/// The chunk of `recs`: keys read in parallel, interned per batch, then merged in packet order.
fn chunk_of_records(first_packet: u64, recs: &[Record<'_>], snap: u32) -> ChunkInput {
    type Part = (Vec<Key>, Vec<(u32, u32)>);
    let parts: Vec<Part> = recs
        .par_chunks(16_384)
        .map(|part| {
            let mut int = Interner::default();
            let facts = part
                .iter()
                .map(|r| {
                    let (k, shape) = facts_of_record(r, snap);
                    (int.id(&k), shape)
                })
                .collect();
            (int.keys, facts)
        })
        .collect();
    let mut input = ChunkInput::new(first_packet);
    input.ids.reserve(recs.len());
    let mut int = Interner::default();
    let mut recs = recs.iter();
    for (keys, facts) in parts {
        let global: Vec<u32> = keys.iter().map(|k| int.id(k)).collect();
        for (id, shape) in facts {
            let r = recs.next().expect("one record per id");
            input.place(r.offset, r.ts_ns);
            input.ids.push(global[id as usize]);
            input.shapes.push(shape);
        }
    }
    input.keys = int.keys;
    input
}

/// Up to `inflight` chunks of `chunk` records from `recs`; fewer at the end of the trace or at damage (kept in
/// `damage`).
fn take_chunks<'a>(
    recs: &mut Records<'a>,
    damage: &mut Option<TraceError>,
    inflight: usize,
    chunk: usize,
) -> Vec<Vec<Record<'a>>> {
    let mut group = Vec::new();
    while group.len() < inflight && damage.is_none() {
        let mut v = Vec::with_capacity(chunk);
        for r in recs.by_ref() {
            match r {
                Ok(r) => {
                    v.push(r);
                    if v.len() == chunk {
                        break;
                    }
                }
                Err(e) => {
                    *damage = Some(e);
                    break;
                }
            }
        }
        if v.is_empty() {
            break;
        }
        let full = v.len() == chunk;
        group.push(v);
        if !full {
            break;
        }
    }
    group
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
    for (i, &id) in input.ids.iter().enumerate() {
        let row = key_of_id[id as usize] as usize / 2;
        if first[row] == u32::MAX {
            first[row] = i as u32;
        }
        last[row] = i as u32;
    }
    let class: Vec<u8> = rows.iter().map(shape_rank).collect();
    let lanes = assign(&class, &first, &last);
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
    parts.push(encode_sequence(&input.shapes));
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

/// Words per rank sample of the sequences' bit vectors: 16 keeps rank samples at 6.25% of the bits (the default
/// 8 takes 25%, 0.4 byte a packet more on the generated trace) for at most 15 popcounts per rank.
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
    let params = RsParams { rate: RANK_RATE };
    if matrix_bits < huffman_bits {
        WaveletMatrix::<RsBitVector>::build(seq.iter().copied(), params).to_bytes()
    } else {
        HuffmanWaveletTree::<RsBitVector>::build(seq.iter().copied(), params).to_bytes()
    }
}

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
            let inflight = rayon::current_num_threads().clamp(1, 8);
            let mut damage = None;
            let mut next_packet = 0u64;
            // The walk over the records is serial; it takes the next chunks while the previous ones are encoded.
            let mut group = take_chunks(&mut recs, &mut damage, inflight, chunk as usize);
            while !group.is_empty() {
                let last = damage.is_some() || group.last().is_some_and(|g| g.len() < chunk as usize);
                let firsts: Vec<u64> = group
                    .iter()
                    .scan(next_packet, |n, g| {
                        let f = *n;
                        *n += g.len() as u64;
                        Some(f)
                    })
                    .collect();
                next_packet += group.iter().map(|g| g.len() as u64).sum::<u64>();
                let (encoded, next) = rayon::join(
                    || -> Vec<Encoded> {
                        group
                            .par_iter()
                            .zip(firsts)
                            .map(|(g, first)| encode_chunk(chunk_of_records(first, g, opts.snap)))
                            .collect()
                    },
                    || if last { Vec::new() } else { take_chunks(&mut recs, &mut damage, inflight, chunk as usize) },
                );
                let reached = group.last().and_then(|g| g.last()).map_or(0, |r| r.offset);
                for e in encoded {
                    sink.put(e)?;
                }
                progress(reached);
                group = next;
            }
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
                        let (k, shape) = facts_of_record(&r, opts.snap);
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
