//! Recompression of closed segments (`pcaptool compact`): each segment's data rewritten with another codec (or
//! back to plain pcap), atomically per segment, beside readers.
//!
//! A segment is rewritten as a new generation: its new data file (`seg-N.G.pcap.zst`) is written and synced under
//! a temporary name and renamed into place, then its new index (which names the new data file) replaces the old
//! one by a rename, and only then is the old data file removed. A reader that opened the segment before keeps
//! reading its old files; one that opens it after sees the new ones; one that read the old index just before the
//! old data file went finds it gone and reads the index again (`Store::open`). A crash at any point leaves
//! either version whole: a new data file without the index naming it, or an old one beside the new index, is
//! removed by the next writer.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::blocks::{Codec, Helper, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use crate::codec::seal;
use crate::dataout::{DataOut, Stage};
use crate::dedup::{Deduper, MIN_PIECE, Piece};
use crate::error::StoreError;
use crate::format::{data_file_name, segment_paths};
use crate::segment::Segment;
use crate::store::Store;
use crate::sums::BLOCK_LOG2;
use crate::writer::{DEDUP_MAGIC, Sink, write_index};

/// What a compaction did.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactStats {
    /// Segments rewritten.
    pub rewritten: u32,
    /// Segments already stored with the codec asked for, left as they are.
    pub kept: u32,
    /// Segments of a format before version 6, left as they are (version 6 has version 7's stage 2: its segments
    /// are rewritten as version 7; later versions keep theirs).
    pub old_format: u32,
    /// Raw bytes of the segments rewritten.
    pub raw_bytes: u64,
    /// Their data files' bytes before and after.
    pub before: u64,
    /// See `before`.
    pub after: u64,
}

impl Store {
    /// Rewrites the data of every segment not stored with `codec` and `dedup` (in blocks of about `block_size`
    /// raw bytes; `None`: the codec's default; `dedup` for compressed data only),
    /// one segment at a time, each atomically (see the module documentation); `progress` gets the raw bytes of
    /// the segments done so far. Every block read is checked first: a damaged segment stops the compaction with
    /// its error, the segments done before it rewritten. Needs the store open for writing.
    pub fn compact(
        &mut self,
        codec: Codec,
        block_size: Option<usize>,
        dedup: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<CompactStats, StoreError> {
        self.writable()?;
        let dedup = dedup && codec.is_compressed();
        let block_size = block_size.map(|b| b.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE));
        let mut st = CompactStats::default();
        let mut done = 0u64;
        for i in 0..self.segments.len() {
            let seg = &self.segments[i];
            let s1 = &seg.stage1;
            done += s1.bytes;
            if s1.version < 6 {
                st.old_format += 1;
            } else if s1.codec == codec && s1.dedup == dedup {
                st.kept += 1;
            } else {
                let new = recompress(&self.dir, seg, codec, block_size, dedup)?;
                st.rewritten += 1;
                st.raw_bytes += s1.bytes;
                st.before += s1.stored_bytes;
                st.after += new.stage1.stored_bytes;
                self.segments[i] = new;
            }
            progress(done);
        }
        Ok(st)
    }
}

/// `path` with `.tmp` after its name.
fn tmp_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// What a segment is rewritten as.
#[derive(Clone, Copy)]
struct Target {
    codec: Codec,
    /// `None`: the codec's default, or deduplicated as [`Codec::deduplicated_block_size`] says.
    block_size: Option<usize>,
    dedup: bool,
    generation: u32,
}

/// Writes segment `seg` (of `dir`) again with `codec` as its next generation, and returns it opened.
fn recompress(
    dir: &Path,
    seg: &Segment,
    codec: Codec,
    block_size: Option<usize>,
    dedup: bool,
) -> Result<Segment, StoreError> {
    let s1 = &seg.stage1;
    let generation = s1.generation.checked_add(1).ok_or_else(|| StoreError::Corrupt {
        path: seg.index.clone(),
        offset: 0,
        why: "recompressed 2^32 times".into(),
    })?;
    let data_path = dir.join(data_file_name(s1.number, generation, codec));
    let index_path = segment_paths(dir, s1.number).1;
    let (data_tmp, index_tmp) = (tmp_of(&data_path), tmp_of(&index_path));
    let target = Target { codec, block_size, dedup, generation };
    if let Err(e) = write_new(seg, target, &data_tmp, &index_tmp) {
        let _ = std::fs::remove_file(&data_tmp);
        let _ = std::fs::remove_file(&index_tmp);
        return Err(e);
    }
    // The new data file, then the index that names it (the switch), then the old data file goes.
    std::fs::rename(&data_tmp, &data_path).map_err(|e| StoreError::io(&data_path, e))?;
    sync_dir(dir);
    std::fs::rename(&index_tmp, &index_path).map_err(|e| StoreError::io(&index_path, e))?;
    sync_dir(dir);
    std::fs::remove_file(&seg.data).map_err(|e| StoreError::io(&seg.data, e))?;
    sync_dir(dir);
    Segment::open(index_path)
}

/// Writes segment `seg`'s data as `t` says into `data_tmp`, and its index naming it into `index_tmp`.
fn write_new(seg: &Segment, t: Target, data_tmp: &Path, index_tmp: &Path) -> Result<(), StoreError> {
    let s1 = &seg.stage1;
    let raw = seg.read_all()?;
    let raw = raw.bytes();
    let entries = seg.stage2()?.check_all()?;
    let corrupt = |offset: u64, why: String| StoreError::Corrupt { path: seg.data.clone(), offset, why };
    let io = |e| StoreError::io(data_tmp, e);
    // Deduplicated, what each flow leaves out is decided first, so that the block size can follow how much was
    // found: the raw byte ranges left out, in order.
    let mut dd = t.dedup.then(Deduper::default);
    let mut cuts: Vec<Range<usize>> = Vec::new();
    let mut at = 24usize;
    let mut spans = Vec::with_capacity(entries.len());
    for e in &entries {
        let span = usize::try_from(e.data_offset)
            .ok()
            .filter(|&from| from == at)
            .and_then(|from| Some(from..from.checked_add(usize::try_from(e.data_len).ok()?)?))
            .filter(|r| r.end <= raw.len())
            .ok_or_else(|| {
                corrupt(e.data_offset, format!("flow {} does not follow the flow before it in the data", e.flow.id))
            })?;
        if let Some(dd) = dd.as_mut().filter(|_| !e.is_no_flow()) {
            elide_in(raw, span.clone(), s1.linktype, dd, &mut cuts).map_err(io)?;
        }
        at = span.end;
        spans.push(span);
    }
    if at != raw.len() {
        return Err(corrupt(at as u64, format!("the flows end at byte {at} of {}", raw.len())));
    }
    let block_size = match (t.block_size, &dd) {
        (Some(b), _) => b,
        (None, Some(dd)) => t.codec.deduplicated_block_size(dd.elided, raw.len() as u64),
        (None, None) => t.codec.default_block_size(),
    };
    let mut w = Sink::new(
        DataOut::create(data_tmp, Stage::default()).map_err(io)?,
        t.codec,
        block_size,
        Vec::new(),
        Helper::default(),
    );
    let mut head = [0u8; 24];
    head.copy_from_slice(raw.get(..24).ok_or_else(|| corrupt(0, "no pcap header".into()))?);
    if t.dedup {
        head[..4].copy_from_slice(&DEDUP_MAGIC);
    }
    w.put(&head).map_err(io)?;
    // The raw data as the writer lays it out: the pcap header, then each slot's packets (but those left out), a
    // block boundary allowed after each.
    let mut cut = cuts.iter().peekable();
    for span in spans {
        let mut p = span.start;
        while let Some(c) = cut.next_if(|c| c.start < span.end) {
            w.put(&raw[p..c.start]).map_err(io)?;
            p = c.end;
        }
        w.put(&raw[p..span.end]).map_err(io)?;
        w.flow_end().map_err(io)?;
    }
    let (_, map) = w.finish().map_err(io)?;
    let too_many = |_| corrupt(0, "more than 2^32 blocks or elisions".into());
    let (mut part, n_blocks, stored_bytes) = map.into_part_of(raw.len() as u64).map_err(too_many)?;
    let mut stage1 = s1.clone();
    // Stage 2 is copied as it is: a version 6 segment becomes version 7 (the same stage 2, data that may be
    // compressed), a version 8 one version 9 (the same stage 2, elisions with checkpoints); version 7 and 9 keep
    // theirs (version 8 grouped the packets of no flow in stage 2).
    stage1.version = match s1.version {
        ..=6 => 7,
        8 => 9,
        v => v,
    };
    (stage1.elided_bytes, stage1.n_elisions, stage1.elisions_len) = (0, 0, 0);
    if let Some(mut dd) = dd {
        let e = dd.encode(stage1.checkpointed());
        stage1.elided_bytes = dd.elided;
        stage1.n_elisions = u32::try_from(dd.elisions.len()).map_err(too_many)?;
        stage1.elisions_len = u32::try_from(e.len()).map_err(too_many)?;
        part.extend_from_slice(&e);
    }
    stage1.codec = t.codec;
    stage1.dedup = t.dedup;
    stage1.generation = t.generation;
    stage1.n_blocks = n_blocks;
    stage1.stored_bytes = stored_bytes;
    stage1.block_log2 = BLOCK_LOG2;
    stage1.sums_crc = stage1.part_crc(&part);
    let mut body = stage1.encode();
    seal(&mut body);
    // Stage 2 and the positions are the same: their offsets are in the raw data.
    let mut rest = vec![0u8; usize::try_from(s1.stage2_len + s1.positions_len).unwrap_or(0)];
    let f = File::open(&seg.index).map_err(|e| StoreError::io(&seg.index, e))?;
    f.read_exact_at(&mut rest, s1.stage2_at).map_err(|e| StoreError::io(&seg.index, e))?;
    write_index(index_tmp, stage1.version, Stage::default(), &[&body, &rest, &[], &part])?;
    Ok(())
}

/// Adds to `cuts` the payloads of the flow of raw bytes `span` of `raw` (its records) to leave out: those of a
/// direction whose bytes an earlier one of the segment carried (see the `dedup` module), in order. Which bytes
/// are payload is read from each packet as the writer read it when it stored it.
fn elide_in(
    raw: &[u8],
    span: Range<usize>,
    linktype: pcaptool_packet::LinkType,
    dd: &mut Deduper,
    cuts: &mut Vec<Range<usize>>,
) -> std::io::Result<()> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a record runs past its flow");
    let le = |b: &[u8], k: usize| u32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]) as usize;
    // Each payload piece: its raw bytes and its direction.
    let mut pieces: Vec<(Range<usize>, usize)> = Vec::new();
    let mut dirs: [Vec<Piece>; 2] = [Vec::new(), Vec::new()];
    let mut p = span.start;
    while p < span.end {
        let h = raw.get(p..p + 16).ok_or_else(bad)?;
        let (caplen, wirelen) = (le(h, 8), le(h, 12));
        let data = raw.get(p + 16..p + 16 + caplen).filter(|_| p + 16 + caplen <= span.end).ok_or_else(bad)?;
        let f = crate::flow::read_flow(linktype, data);
        let payload = usize::try_from(f.payload).unwrap_or(usize::MAX);
        let dir = usize::from(matches!(f.flow, Some((_, pcaptool_packet::Direction::LoToHi))));
        if payload >= MIN_PIECE as usize && caplen == wirelen && payload <= caplen {
            let o = p + 16 + caplen - payload;
            dirs[dir].push(Piece { at: o as u64, raw: o as u64, len: payload as u32 });
            pieces.push((o..o + payload, dir));
        }
        p += 16 + caplen;
    }
    let dup = [dd.consider(raw, &dirs[0]), dd.consider(raw, &dirs[1])];
    cuts.extend(pieces.into_iter().filter(|x| dup[x.1]).map(|x| x.0));
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ImportOptions;
    use pcaptool_packet::{LinkType, Need, PcapWriter, TsPrecision};

    /// The packets of a store, in order, as (position, bytes).
    fn answer(store: &Store) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        store
            .query(&Need::All, &mut |p| {
                v.push((p.seq, p.data.to_vec()));
                true
            })
            .expect("query");
        v
    }

    /// A segment of format version 6 (written before data could be compressed) is read as it is, and compaction
    /// rewrites it as version 7, compressed, with the same answer; a version 5 one is left as it is.
    #[test]
    fn version_6_segments_are_compacted_to_version_7() {
        let dir = std::env::temp_dir().join(format!("pcaptool-compact-v6-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
        for i in 0u32..600 {
            let mut f = vec![0u8; 54 + (i as usize * 13) % 900];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14] = 0x45;
            let total = (f.len() - 14) as u16;
            f[16..18].copy_from_slice(&total.to_be_bytes());
            f[23] = 6;
            f[26..30].copy_from_slice(&[10, 0, 0, (i % 9) as u8]);
            f[30..34].copy_from_slice(&[192, 168, 0, 1]);
            f[34..36].copy_from_slice(&(2000 + (i % 9) as u16).to_be_bytes());
            f[36..38].copy_from_slice(&80u16.to_be_bytes());
            f[46] = 5 << 4;
            for (j, b) in f[54..].iter_mut().enumerate() {
                *b = (i as usize + j) as u8;
            }
            w.write_packet(1_700_000_000_000_000_000 + u64::from(i) * 1000, f.len() as u32, &f).unwrap();
        }
        let trace = dir.join("t.pcap");
        std::fs::write(&trace, w.finish().unwrap()).unwrap();
        let store_dir = dir.join("store");
        let mut store = Store::create(&store_dir).unwrap();
        store.import(&trace, &ImportOptions::default(), &mut |_| {}).unwrap();
        drop(store);
        let want = answer(&Store::open(&store_dir).unwrap());
        // The index as version 6 wrote it: stage 1 without its last 35 bytes (how the data is stored).
        let index = segment_paths(&store_dir, 0).1;
        // Its stage 2 as version 7 wrote it: one summary of the packets of no flow.
        let downgrade = |version: u16| {
            let b = std::fs::read(&index).unwrap();
            let s1_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
            let mut s1 = crate::stage1::Stage1::decode(&b[24..24 + s1_len - 4], 8).unwrap();
            let s2_at = 24 + s1_len;
            let s2_end = s2_at + s1.stage2_len as usize;
            let s2 = crate::stage2::as_format_7(&b[s2_at..s2_end]);
            s1.stage2_len = s2.len() as u64;
            let body = s1.encode();
            let mut s1 = body[..body.len() - 35].to_vec();
            seal(&mut s1);
            let mut h = b[..24].to_vec();
            h[4..6].copy_from_slice(&version.to_le_bytes());
            h[8..12].copy_from_slice(&(s1.len() as u32).to_le_bytes());
            let crc = crc32fast::hash(&h[..20]);
            h[20..24].copy_from_slice(&crc.to_le_bytes());
            [h, s1, s2, b[s2_end..].to_vec()].concat()
        };
        // A copy as version 5 (whose flow table says less of IPv6 extension headers): left as it is.
        let store5 = dir.join("store5");
        std::fs::create_dir_all(&store5).unwrap();
        std::fs::copy(store_dir.join("seg-000000.pcap"), store5.join("seg-000000.pcap")).unwrap();
        std::fs::write(store5.join("seg-000000.ptsx"), downgrade(5)).unwrap();
        std::fs::write(&index, downgrade(6)).unwrap();
        let old = Store::open(&store_dir).unwrap();
        assert_eq!(old.segments()[0].stage1.version, 6);
        assert_eq!(answer(&old), want, "version 6 read as it is");
        drop(old);
        let mut store = Store::open_writer(&store_dir).unwrap();
        let st = store.compact(Codec::Zstd { level: 3 }, None, false, &mut |_| {}).unwrap();
        assert_eq!((st.rewritten, st.old_format), (1, 0));
        drop(store);
        let new = Store::open(&store_dir).unwrap();
        let s1 = &new.segments()[0].stage1;
        assert_eq!((s1.version, s1.codec, s1.generation), (7, Codec::Zstd { level: 3 }, 1));
        assert_eq!(answer(&new), want, "compacted to version 7");
        let mut five = Store::open_writer(&store5).unwrap();
        assert_eq!(answer(&five), want, "version 5 read as it is");
        let st = five.compact(Codec::Lz4, None, false, &mut |_| {}).unwrap();
        assert_eq!((st.rewritten, st.old_format), (0, 1));
        assert_eq!(five.segments()[0].stage1.version, 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A trace of `conns` TCP connections of 30 packets of 400 bytes of payload each: the same payloads in every
    /// connection if `same`, else each connection's its own.
    fn tcp_trace(conns: u16, same: bool) -> Vec<u8> {
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
        let mut t = 1_700_000_000_000_000_000u64;
        for c in 0..conns {
            for k in 0..30usize {
                let mut f = vec![0u8; 54 + 400];
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[16..18].copy_from_slice(&(440u16).to_be_bytes());
                f[23] = 6;
                f[26..30].copy_from_slice(&[10, 0, 0, 1]);
                f[30..34].copy_from_slice(&[192, 168, 0, 1]);
                f[34..36].copy_from_slice(&(3000 + c).to_be_bytes());
                f[36..38].copy_from_slice(&80u16.to_be_bytes());
                f[38..42].copy_from_slice(&(1000 + 400 * k as u32).to_be_bytes());
                f[46] = 5 << 4;
                f[47] = 0x18;
                let salt = if same { 0 } else { usize::from(c) * 7919 };
                for (j, b) in f[54..].iter_mut().enumerate() {
                    *b = ((k * 7 + j * 13 + salt) ^ (salt >> 3)) as u8;
                }
                w.write_packet(t, f.len() as u32, &f).unwrap();
                t += 1000;
            }
        }
        w.finish().unwrap()
    }

    /// The largest raw block of the store's first segment.
    fn largest_block(store: &Store) -> u32 {
        let map = store.segments()[0].blocks().unwrap();
        map.entries.iter().map(|e| e.raw_len).max().unwrap()
    }

    /// Without a block size given, a deduplicated segment's blocks follow what was left out: 64 KiB where an
    /// eighth of its data or more was elided, the codec's default (256 KiB for Zstandard) where less was, as
    /// imported and as compacted; a size given is kept. Answers are the same every way.
    #[test]
    fn deduplicated_blocks_follow_what_was_elided() {
        let dir = std::env::temp_dir().join(format!("pcaptool-compact-blocks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let zstd = Codec::Zstd { level: 3 };
        for same in [true, false] {
            let trace = dir.join(format!("t-{same}.pcap"));
            std::fs::write(&trace, tcp_trace(150, same)).unwrap();
            let want = {
                let d = dir.join("plain");
                let _ = std::fs::remove_dir_all(&d);
                let mut store = Store::create(&d).unwrap();
                store.import(&trace, &ImportOptions::default(), &mut |_| {}).unwrap();
                answer(&store)
            };
            for given in [None, Some(32 << 10)] {
                let d = dir.join(format!("store-{same}-{given:?}"));
                let mut store = Store::create(&d).unwrap();
                let opts = ImportOptions { compress: zstd, dedup: true, block_size: given, ..ImportOptions::default() };
                store.import(&trace, &opts, &mut |_| {}).unwrap();
                let s1 = &store.segments()[0].stage1;
                assert_eq!(s1.elided_bytes * 8 >= s1.bytes, same, "{same}: elided {} of {}", s1.elided_bytes, s1.bytes);
                let most = |store: &Store| match (given, same) {
                    (Some(b), _) => largest_block(store) < b as u32 + 20_000,
                    (None, true) => largest_block(store) < (64 << 10) + 20_000,
                    (None, false) => largest_block(store) >= 256 << 10,
                };
                assert!(most(&store), "{same} {given:?}: imported in blocks of up to {}", largest_block(&store));
                assert_eq!(answer(&store), want, "{same} {given:?}: imported");
                // Compacted into LZ4 and back: the same rule.
                store.compact(Codec::Lz4, given, true, &mut |_| {}).unwrap();
                store.compact(zstd, given, true, &mut |_| {}).unwrap();
                assert!(most(&store), "{same} {given:?}: compacted in blocks of up to {}", largest_block(&store));
                assert_eq!(answer(&store), want, "{same} {given:?}: compacted");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A deduplicated segment of format version 8 (elisions without checkpoints) is read as it is, and
    /// compaction into another codec rewrites it as version 9, with checkpoints, and the same answer.
    #[test]
    fn version_8_elisions_are_read_and_compacted_to_version_9() {
        let dir = std::env::temp_dir().join(format!("pcaptool-compact-v8-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 40 TCP connections, each sending the same 30 payloads of 400 bytes: every one but the first elided,
        // 1,170 elisions (more than one chunk of checkpoints).
        let trace = dir.join("t.pcap");
        std::fs::write(&trace, tcp_trace(40, true)).unwrap();
        let store_dir = dir.join("store");
        let mut store = Store::create(&store_dir).unwrap();
        let opts = ImportOptions { compress: Codec::Zstd { level: 3 }, dedup: true, ..ImportOptions::default() };
        store.import(&trace, &opts, &mut |_| {}).unwrap();
        drop(store);
        let want = answer(&Store::open(&store_dir).unwrap());
        assert_eq!(want.len(), 1200);
        // The index as version 8 wrote it: the elisions without their checkpoints.
        let index = segment_paths(&store_dir, 0).1;
        let b = std::fs::read(&index).unwrap();
        let s1_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
        let mut s1 = crate::stage1::Stage1::decode(&b[24..24 + s1_len - 4], 9).unwrap();
        assert_eq!((s1.version, s1.n_elisions), (9, 1170));
        let table = crate::dedup::checkpoint_bytes(s1.n_elisions as usize, true);
        // (Stage 2 follows stage 1; the positions follow stage 2.)
        let part_at = 24 + s1_len + (s1.stage2_len + s1.positions_len) as usize;
        let whole = s1.map_bytes() as usize;
        assert_eq!(s1.part_crc(&b[part_at..part_at + whole]), s1.sums_crc, "the part read as the reader does");
        let part = &b[part_at..part_at + whole - table];
        s1.elisions_len -= table as u32;
        s1.sums_crc = crc32fast::hash(part);
        let mut body = s1.encode();
        seal(&mut body);
        assert_eq!(body.len(), s1_len);
        let mut h = b[..24].to_vec();
        h[4..6].copy_from_slice(&8u16.to_le_bytes());
        let crc = crc32fast::hash(&h[..20]);
        h[20..24].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&index, [&h[..], &body, &b[24 + s1_len..part_at], part, &b[part_at + whole..]].concat())
            .unwrap();
        let old = Store::open(&store_dir).unwrap();
        assert_eq!(old.segments()[0].stage1.version, 8);
        assert_eq!(answer(&old), want, "version 8 read as it is");
        drop(old);
        let mut store = Store::open_writer(&store_dir).unwrap();
        let st = store.compact(Codec::Lz4, None, true, &mut |_| {}).unwrap();
        assert_eq!((st.rewritten, st.old_format), (1, 0));
        drop(store);
        let new = Store::open(&store_dir).unwrap();
        let s1 = &new.segments()[0].stage1;
        assert_eq!((s1.version, s1.codec, s1.n_elisions, s1.generation), (9, Codec::Lz4, 1170, 1));
        assert_eq!(answer(&new), want, "compacted to version 9");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
