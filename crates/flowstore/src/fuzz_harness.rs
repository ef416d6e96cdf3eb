//! The bodies of the fuzz targets of the store's readers, shared with the regression replay test.
//!
//! `segment_from_bytes` takes the index of a valid segment built once, applies the fuzz input as byte edits, seals
//! it again (header, stage 1, stage 2 and positions checksums recomputed, as far as the edited lengths locate
//! them), so that the structure checks behind the checksums are what gets exercised, and opens and queries the
//! segment: every outcome must be an error or an answer, never a panic or an allocation the file cannot back.
//!
//! `store_from_bytes` damages a whole segment, data and index, as storage does (edits of either file, unsealed,
//! and cuts), then reads the store as every command does (open, query, a flow, the flow list, verify): never a
//! panic, and when only the data was damaged, any answer given is the undamaged store's answer (the data
//! checksums let no damaged byte through).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pcaptool_packet::{Field, LinkType, Need, PcapWriter, Pred, TsPrecision};

use crate::format::segment_paths;
use crate::segment::Segment;
use crate::{Codec, ImportOptions, Store};

struct Fixture {
    dir: PathBuf,
    data: PathBuf,
    index: Vec<u8>,
    /// The data file's bytes, and every packet the undamaged store gives, in order (position, bytes).
    data_bytes: Vec<u8>,
    answer: Vec<(u64, Vec<u8>)>,
}

/// This process's directory for the fixtures and the files made from them (see
/// [`scratch_dir`](pcaptool_packet::fuzz_harness::scratch_dir)).
fn scratch() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| pcaptool_packet::fuzz_harness::scratch_dir("pcaptool-store-fuzz").expect("temporary directory"))
}

/// A 1500-packet Ethernet trace (TCP with handshakes and FINs, UDP, ARP) imported into a one-segment store.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| make_fixture(Codec::None, false))
}

/// The fixture's trace imported compressed (LZ4, or Zstandard at level 3) in blocks of 4 KiB, deduplicated or
/// not (its payloads are zeros: many flow directions are copies of another).
fn compressed_fixture(zstd: bool, dedup: bool) -> &'static Fixture {
    static F: [OnceLock<Fixture>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    F[usize::from(zstd) + 2 * usize::from(dedup)]
        .get_or_init(|| make_fixture(if zstd { Codec::Zstd { level: 3 } } else { Codec::Lz4 }, dedup))
}

/// The store of a compressed fixture (see [`compressed_fixture`]), for the readers' own tests.
#[cfg(test)]
pub(crate) fn compressed_store(zstd: bool, dedup: bool) -> PathBuf {
    compressed_fixture(zstd, dedup).dir.join("store")
}

fn make_fixture(codec: Codec, dedup: bool) -> Fixture {
    {
        let dir = scratch().join(format!("{codec}-{dedup}"));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let trace = dir.join("fixture.pcap");
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).expect("writer");
        for i in 0u32..1500 {
            let mut f = vec![0u8; 60 + (i as usize * 37) % 700];
            f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, (i % 7) as u8]);
            if i % 97 == 0 {
                f[12..14].copy_from_slice(&[0x08, 0x06]);
                f[28..32].copy_from_slice(&[10, 0, 0, (i % 5) as u8]);
            } else {
                let total = (f.len() - 14) as u16;
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[16..18].copy_from_slice(&total.to_be_bytes());
                f[23] = if i % 3 == 0 { 17 } else { 6 };
                let (c, s) = ([10, 0, (i % 11) as u8, (i % 13) as u8], [192, 168, 0, (i % 17) as u8]);
                let (src, dst) = if i % 2 == 0 { (c, s) } else { (s, c) };
                f[26..30].copy_from_slice(&src);
                f[30..34].copy_from_slice(&dst);
                let (sp, dp) = (1024 + (i % 50) as u16, 80u16);
                let (sp, dp) = if i % 2 == 0 { (sp, dp) } else { (dp, sp) };
                f[34..36].copy_from_slice(&sp.to_be_bytes());
                f[36..38].copy_from_slice(&dp.to_be_bytes());
                f[46] = 5 << 4;
                f[47] = [0x02, 0x12, 0x10, 0x18, 0x11, 0x04][i as usize % 6];
            }
            let len = f.len() as u32;
            w.write_packet(1_700_000_000_000_000_000 + u64::from(i) * 1_000_000, len, &f).expect("write");
        }
        if dedup {
            // Six TCP flows carrying the same 100 KB, one of them a byte apart: five copies to store once.
            for i in 0u32..900 {
                let (flow, k) = (i % 6, i / 6);
                let mut f = vec![0u8; 54 + 800];
                f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[16..18].copy_from_slice(&(840u16).to_be_bytes());
                f[23] = 6;
                f[26..30].copy_from_slice(&[10, 9, 0, flow as u8]);
                f[30..34].copy_from_slice(&[192, 168, 9, 1]);
                f[34..36].copy_from_slice(&(40_000 + flow as u16).to_be_bytes());
                f[36..38].copy_from_slice(&443u16.to_be_bytes());
                f[46] = 5 << 4;
                f[47] = 0x18;
                for (j, b) in f[54..].iter_mut().enumerate() {
                    *b = (k as usize * 31 + j * 7) as u8;
                }
                if flow == 5 && k == 10 {
                    f[100] ^= 1;
                }
                w.write_packet(1_700_000_002_000_000_000 + u64::from(i) * 1_000_000, f.len() as u32, &f)
                    .expect("write");
            }
        }
        std::fs::write(&trace, w.finish().expect("finish")).expect("write the fixture trace");
        let store_dir = dir.join("store");
        let mut store = Store::create(&store_dir).expect("store");
        let opts = ImportOptions { compress: codec, block_size: Some(4096), dedup, ..ImportOptions::default() };
        store.import(&trace, &opts, &mut |_| {}).expect("import");
        let index = segment_paths(&store_dir, 0).1;
        let data = store.segments()[0].data.clone();
        let index = std::fs::read(index).expect("read the fixture index");
        let data_bytes = std::fs::read(&data).expect("read the fixture data");
        let reader = Store::open(&store_dir).expect("open the fixture store");
        let mut answer = Vec::new();
        reader
            .query(&Need::All, &mut |p| {
                answer.push((p.seq, p.data.to_vec()));
                true
            })
            .expect("query the fixture store");
        Fixture { dir, data, index, data_bytes, answer }
    }
}

fn le32(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}

fn le64(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

fn seal(b: &mut [u8], start: usize, len: usize) -> bool {
    let Some(end) = start.checked_add(len).filter(|&e| len >= 4 && e <= b.len()) else { return false };
    let crc = crc32fast::hash(&b[start..end - 4]);
    b[end - 4..end].copy_from_slice(&crc.to_le_bytes());
    true
}

/// Recomputes the checksums of the header, stage 1 and stage 2 (its head, posting lists, and each block with its
/// positions), as far as the bytes locate them.
fn reseal(b: &mut [u8]) {
    const H: usize = 24;
    if let Some(s1) = le32(b, 8) {
        if let (Some(s2), Some(sp)) = (le64(b, H + 88), le64(b, H + 96)) {
            let _ = reseal_stage2(b, H + s1, s2, sp);
        }
        seal(b, H, s1);
    }
    if b.len() >= H {
        let crc = crc32fast::hash(&b[..20]);
        b[20..24].copy_from_slice(&crc.to_le_bytes());
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) -> Option<()> {
    b.get_mut(at..at.checked_add(4)?)?.copy_from_slice(&v.to_le_bytes());
    Some(())
}

/// The checksums of stage 2 at `at2` (`len2` bytes, then `lenp` bytes of positions): see docs/format/segment.md.
fn reseal_stage2(b: &mut [u8], at2: usize, len2: usize, lenp: usize) -> Option<()> {
    let (n_blocks, dict_z, post_z) = (le32(b, at2 + 12)?, le32(b, at2 + 16)?, le32(b, at2 + 24)?);
    let no_flow_len = le32(b, at2 + 36)?;
    let dir_at = at2.checked_add(40)?.checked_add(dict_z)?;
    let head_end = dir_at.checked_add(n_blocks.checked_mul(40)?)?.checked_add(no_flow_len)?;
    let post_at = head_end.checked_add(4)?;
    let end2 = at2.checked_add(len2)?;
    let end_p = end2.checked_add(lenp)?;
    let mut blk = post_at.checked_add(post_z)?;
    for i in 0..n_blocks {
        let e = dir_at + 40 * i;
        let zlen = le32(b, e + 24)?;
        let pos_from = end2.checked_add(le64(b, e + 16)?)?;
        let pos_to = if i + 1 < n_blocks { end2.checked_add(le64(b, e + 40 + 16)?)? } else { end_p };
        let crc = crc32fast::hash(b.get(blk..blk.checked_add(zlen)?)?);
        put32(b, e + 32, crc)?;
        let crc = crc32fast::hash(b.get(pos_from..pos_to)?);
        put32(b, e + 36, crc)?;
        blk = blk.checked_add(zlen)?;
    }
    let crc = crc32fast::hash(b.get(post_at..post_at.checked_add(post_z)?)?);
    put32(b, at2 + 32, crc)?;
    let crc = crc32fast::hash(b.get(at2..head_end)?);
    put32(b, head_end, crc)
}

fn exercise(index: &Path, data: &Path) {
    let (Ok(fi), Ok(fd)) = (std::fs::File::open(index), std::fs::File::open(data)) else { return };
    let Ok(s1) = Segment::read_stage1(index, &fi) else { return };
    let seg = Segment::from_parts(data.to_path_buf(), index.to_path_buf(), s1, fd, fi);
    let needs = [
        Need::All,
        Need::Pred(Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff)),
        Need::Pred(Pred::range(Field::Ip4Dst, 0xc0a8_0003, 0xc0a8_0003)),
        Need::and(vec![Need::Pred(Pred::range(Field::DstPort, 80, 80)), Need::Pred(Pred::range(Field::IpProto, 6, 6))]),
        Need::or(vec![
            Need::Pred(Pred::range(Field::SrcPort, 1030, 1031)),
            Need::Pred(Pred::range(Field::Time, 1_700_000_000_000_500_000, 1_700_000_000_002_000_000)),
        ]),
    ];
    for id in [0u64, 1, 7, 500, u64::MAX] {
        let _ = seg.stage1.may_hold_flow(id);
        if let Ok(Some((e, s2))) = seg.find_flow(id) {
            let _ = seg.read_flow(&s2, &e, &mut Vec::new(), &mut |_| {});
        }
    }
    let Ok(s2) = seg.stage2() else { return };
    let mut buf = Vec::new();
    for need in &needs {
        let _ = seg.stage1.may_match(need);
        for e in s2.candidates(need).unwrap_or_default() {
            let _ = seg.read_flow(&s2, &e, &mut buf, &mut |_| {});
        }
    }
}

/// Fuzz target `segment_from_bytes`: byte edits of a valid segment index, sealed again, then opened and queried.
pub fn segment_from_bytes(input: &[u8]) {
    let fx = fixture();
    let mut bytes = fx.index.clone();
    // Edits: 4-byte offset (modulo the index length), 1-byte value to XOR there; inputs starting with the magic
    // are taken as a whole index.
    if input.starts_with(b"PTSG") {
        bytes = input.to_vec();
    } else {
        for e in input.chunks_exact(5) {
            let at = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize % bytes.len();
            bytes[at] ^= e[4];
        }
        reseal(&mut bytes);
    }
    let path = fx.dir.join(format!("fuzz-{:?}.ptsx", std::thread::current().id()).replace(['(', ')'], ""));
    if std::fs::write(&path, &bytes).is_ok() {
        exercise(&path, &fx.data);
    }
}

/// Fuzz target `store_from_bytes`: a segment damaged as storage damages it, read through a store.
///
/// Input: a mode byte (bits 0-1: 0 edits the data file, 1 the index, 2 both; bit 2: then cut the damaged file
/// at the length in the next 4 bytes), then edits of 5 bytes each (a 4-byte offset modulo the file's length, a
/// byte to XOR there).
pub fn store_from_bytes(input: &[u8]) {
    let fx = fixture();
    let Some((&mode, rest)) = input.split_first() else { return };
    let (mut data, mut index) = (fx.data_bytes.clone(), fx.index.clone());
    let (edit_data, edit_index) = match mode & 3 {
        0 => (true, false),
        1 => (false, true),
        _ => (true, true),
    };
    let (cut, edits) = match (mode & 4 != 0, rest) {
        (true, [a, b, c, d, tail @ ..]) => (Some(u32::from_le_bytes([*a, *b, *c, *d]) as usize), tail),
        _ => (None, rest),
    };
    for (i, e) in edits.chunks_exact(5).enumerate() {
        let at = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
        let file = if edit_data && (!edit_index || i % 2 == 0) { &mut data } else { &mut index };
        let n = file.len();
        file[at % n] ^= e[4];
    }
    if let Some(cut) = cut {
        let file = if edit_data { &mut data } else { &mut index };
        let n = file.len();
        file.truncate(cut % (n + 1));
    }
    // Only the data damaged: the index is intact, so an answer is the undamaged one.
    read_damaged(fx, "store", &data, &index, &mut |answered, got| {
        assert!(
            !(answered && edit_data && !edit_index) || got == fx.answer,
            "a damaged data file answered {} packets ({} undamaged) with success",
            got.len(),
            fx.answer.len()
        );
    });
}

/// A packet read back: its position and bytes.
type Packet = (u64, Vec<u8>);

/// Puts the segment of `data` (named as the fixture's data file) and `index` in a store of its own, reads it as
/// every command does (open, query, flows, a flow list, verify, a query skipping damage) and hands the first
/// query's outcome and packets to `check`. Never a panic of its own.
fn read_damaged(fx: &Fixture, tag: &str, data: &[u8], index: &[u8], check: &mut dyn FnMut(bool, &[Packet])) {
    let dir = fx.dir.join(format!("fuzz-{tag}-{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let name = fx.data.file_name().unwrap_or_default();
    if std::fs::write(dir.join(name), data).is_err() || std::fs::write(segment_paths(&dir, 0).1, index).is_err() {
        return;
    }
    let Ok(mut store) = Store::open(&dir) else { return };
    let mut got = Vec::new();
    let answered = store
        .query(&Need::All, &mut |p| {
            got.push((p.seq, p.data.to_vec()));
            true
        })
        .is_ok();
    check(answered, &got);
    for id in [0u64, 1, 7, 500] {
        let _ = store.flow(id, &mut |_| {});
    }
    let _ = store.flows(&Need::Pred(Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff)));
    let _ = store.verify(&mut |_| {});
    store.set_skip_damaged(true);
    let _ = store.query(&Need::All, &mut |_| true);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fuzz target `block_reader`: a compressed segment's data file damaged, read through a store.
///
/// Input: a mode byte (bit 0: LZ4 or Zstandard; bit 1: then give every block the checksum of its damaged bytes,
/// so that the decompressor meets the damage; bit 2: cut the file at the length in the next 4 bytes; bit 3: a
/// deduplicated segment, whose raw data is rebuilt from its elisions), then edits
/// of 5 bytes each (a 4-byte offset modulo the file's length, a byte to XOR there). Never a panic; any answer is
/// the undamaged one (the raw bytes' checksums let no wrong byte through).
pub fn block_reader(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else { return };
    let fx = compressed_fixture(mode & 1 != 0, mode & 8 != 0);
    let mut data = fx.data_bytes.clone();
    let mut index = fx.index.clone();
    let (cut, edits) = match (mode & 4 != 0, rest) {
        (true, [a, b, c, d, tail @ ..]) => (Some(u32::from_le_bytes([*a, *b, *c, *d]) as usize), tail),
        _ => (None, rest),
    };
    for e in edits.chunks_exact(5) {
        let at = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
        let n = data.len();
        data[at % n] ^= e[4];
    }
    if let Some(cut) = cut {
        let n = data.len();
        data.truncate(cut % (n + 1));
    }
    if mode & 2 != 0 {
        reseal_blocks(&mut index, &data);
    }
    read_damaged(fx, "blocks", &data, &index, &mut |answered, got| {
        assert!(!answered || got == fx.answer, "a damaged block answered {} packets with success", got.len());
    });
}

/// Gives every block of the index `index` the checksum of its stored bytes in `data` (as far as the data
/// reaches), and seals the block directory and stage 1 again.
fn reseal_blocks(index: &mut [u8], data: &[u8]) {
    let Ok(f) = tempfile_with(index) else { return };
    let Ok(mut s1) = Segment::read_stage1(&f.0, &f.1) else { return };
    let _ = std::fs::remove_file(&f.0);
    let at = (s1.stage2_at + s1.stage2_len + s1.positions_len) as usize;
    let Some(map) = index.get_mut(at..) else { return };
    let mut from = 0usize;
    for e in map.chunks_exact_mut(crate::blocks::ENTRY_BYTES).take(s1.n_blocks as usize) {
        let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]) as usize;
        let end = from.saturating_add(len).min(data.len());
        let crc = crc32c::crc32c(data.get(from.min(end)..end).unwrap_or_default());
        e[8..12].copy_from_slice(&crc.to_le_bytes());
        from = end;
    }
    s1.sums_crc = s1.part_crc(map.get(..s1.map_bytes() as usize).unwrap_or(map));
    let mut body = s1.encode();
    crate::codec::seal(&mut body);
    if body.len() == s1.stage2_at as usize - crate::format::HEADER_LEN {
        index[crate::format::HEADER_LEN..s1.stage2_at as usize].copy_from_slice(&body);
    }
}

/// `bytes` written to a temporary file, and the file open.
fn tempfile_with(bytes: &[u8]) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = scratch()
        .join(format!("index-{:?}", std::thread::current().id()).replace(['(', ')'], ""))
        .with_extension("ptsx");
    std::fs::write(&path, bytes)?;
    Ok((path.clone(), std::fs::File::open(&path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_is_valid_and_edits_are_caught_or_harmless() {
        let fx = fixture();
        let mut copy = fx.index.clone();
        reseal(&mut copy);
        assert_eq!(copy, fx.index, "resealing a valid index changes nothing");
        segment_from_bytes(&[]);
        for at in (0..fx.index.len()).step_by(fx.index.len() / 150 + 1) {
            let mut e = (at as u32).to_le_bytes().to_vec();
            e.push(0x5a);
            segment_from_bytes(&e);
        }
    }

    /// Damage of every kind to a whole segment, through the store target: flips of the data at every 997th byte
    /// (each must be caught: the answers are compared inside), of the index, of both, and cuts.
    #[test]
    fn damaged_segments_never_answer_wrongly() {
        let fx = fixture();
        store_from_bytes(&[0]);
        for at in (0..fx.data_bytes.len()).step_by(997) {
            let mut e = vec![0u8];
            e.extend_from_slice(&(at as u32).to_le_bytes());
            e.push(0x10);
            store_from_bytes(&e);
        }
        for mode in [1u8, 2, 4, 5, 6] {
            for at in [0u32, 5, 24, 100, 1000, 4000] {
                let mut e = vec![mode];
                e.extend_from_slice(&at.to_le_bytes());
                e.extend_from_slice(&(at * 7).to_le_bytes());
                e.push(0x80);
                store_from_bytes(&e);
            }
        }
    }

    /// Damage to compressed blocks: flips caught by the stored checksums, and flips behind resealed checksums
    /// caught by the decompressor or the raw checksums; never a wrong answer.
    #[test]
    fn damaged_blocks_never_answer_wrongly() {
        let dedup = Store::open(&compressed_fixture(true, true).dir.join("store")).expect("the fixture store");
        assert!(dedup.segments()[0].stage1.elided_bytes > 0, "the deduplicated fixture elides bytes");
        for zstd in [0u8, 1, 8, 9] {
            let fx = compressed_fixture(zstd & 1 == 1, zstd & 8 != 0);
            assert!(fx.data.to_string_lossy().ends_with(if zstd & 1 == 1 { ".pcap.zst" } else { ".pcap.lz4" }));
            block_reader(&[zstd]);
            for reseal in [0u8, 2] {
                for at in (0..fx.data_bytes.len()).step_by(509) {
                    let mut e = vec![zstd | reseal];
                    e.extend_from_slice(&(at as u32).to_le_bytes());
                    e.push(0x08);
                    block_reader(&e);
                }
                for cut in [0u32, 10, 4000, 9000] {
                    let mut e = vec![zstd | reseal | 4];
                    e.extend_from_slice(&cut.to_le_bytes());
                    block_reader(&e);
                }
            }
        }
    }
}
