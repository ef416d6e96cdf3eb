//! Bodies of the fuzz targets of the index loader, shared with the regression replay test.
//!
//! `index_from_bytes` takes a valid index of a small trace built once, applies the fuzz input as byte edits, and
//! seals the result again (header, directory and chunk checksums recomputed), so that the structure checks
//! behind the checksums are what gets exercised; inputs starting with `PTIX` are also loaded as they are. Loading
//! must fail with an error or give a view on which selecting, counting and reading packets never panic.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pcaptool_packet::{Field, LinkType, Need, PcapWriter, Pred, Seeker, TsPrecision};

use crate::chunk::{CHUNK_HEAD, PARTS};
use crate::format::{HEADER_LEN, crc32};
use crate::{BuildOptions, IndexFile, build};

struct Fixture {
    trace: PathBuf,
    trace_bytes: Vec<u8>,
    index: Vec<u8>,
}

/// A 1500-packet Ethernet trace with varied addresses, ports, flags, lengths and a few ARP frames, and its
/// index in chunks of 1024 packets (whose source port column is raw, the others dictionaries).
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = pcaptool_packet::fuzz_harness::scratch_dir("pcaptool-index-fuzz").expect("temporary directory");
        let trace = dir.join("fixture.pcap");
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).expect("writer");
        for i in 0u32..1500 {
            let mut f = vec![0u8; 60 + (i as usize * 37) % 900];
            f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, (i % 7) as u8]);
            if i % 97 == 0 {
                f[12..14].copy_from_slice(&[0x08, 0x06]);
                f[28..32].copy_from_slice(&[10, 0, 0, (i % 5) as u8]);
            } else {
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[23] = if i % 3 == 0 { 17 } else { 6 };
                // 700 flows (times two protocols), each with its own client port: that column is stored raw.
                let flow = i % 700;
                f[26..30].copy_from_slice(&[10, 0, (flow % 11) as u8, (flow % 13) as u8]);
                f[30..34].copy_from_slice(&[192, 168, 0, (flow % 17) as u8]);
                f[34..36].copy_from_slice(&(1024 + flow as u16 * 83).to_be_bytes());
                f[36..38].copy_from_slice(&[0, 80]);
                f[47] = (i % 64) as u8;
            }
            let len = f.len() as u32;
            w.write_packet(1_700_000_000_000_000_000 + u64::from(i) * 1000, len, &f).expect("write");
        }
        let trace_bytes = w.finish().expect("finish");
        std::fs::write(&trace, &trace_bytes).expect("write the fixture trace");
        let index = dir.join("fixture.pcap.ptidx");
        build(&trace, &index, &BuildOptions { chunk_packets: 1024, snap: u32::MAX }, &|_| {}).expect("build");
        let index = std::fs::read(&index).expect("read the fixture index");
        Fixture { trace, trace_bytes, index }
    })
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Recomputes the checksums of every chunk's parts and head (the directory holds the head's), the directory's and
/// the header's (as far as the edited bytes still locate them).
fn reseal(b: &mut [u8]) {
    let (Some(chunks), Some(dir_off), Some(dir_len)) = (le32(b, 56), le64(b, 60), le64(b, 68)) else { return };
    let (Ok(dir_off), Ok(dir_len)) = (usize::try_from(dir_off), usize::try_from(dir_len)) else { return };
    if dir_len < 12 || dir_off.checked_add(dir_len).is_none_or(|e| e > b.len()) {
        return;
    }
    let structures = le32(b, dir_off).unwrap_or(0) as usize;
    let entries = dir_off + 8 + 8 * structures.min(1 << 20);
    for c in 0..chunks.min(1 << 16) as usize {
        let e = entries + 48 * c;
        let (Some(off), Some(len)) = (le64(b, e), le64(b, e + 8)) else { break };
        let (Ok(off), Ok(len)) = (usize::try_from(off), usize::try_from(len)) else { break };
        if e + 20 > dir_off + dir_len - 4 || off.checked_add(len).is_none_or(|end| end > b.len()) {
            break;
        }
        // Every part's checksum (as far as the edited part table still locates them), then the head's.
        if len >= CHUNK_HEAD {
            for p in 0..PARTS {
                let at = off + 32 + 16 * p;
                let (Some(po), Some(pl)) = (le32(b, at), le32(b, at + 4)) else { break };
                let (po, pl) = (po as usize, pl as usize);
                if po.checked_add(pl).is_none_or(|end| end > len) {
                    continue;
                }
                let crc = crc32(&b[off + po..off + po + pl]);
                b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
            }
            let crc = crc32(&b[off..off + CHUNK_HEAD]);
            b[e + 16..e + 20].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let crc = crc32(&b[dir_off..dir_off + dir_len - 4]);
    b[dir_off + dir_len - 4..dir_off + dir_len].copy_from_slice(&crc.to_le_bytes());
    if b.len() >= HEADER_LEN {
        let crc = crc32(&b[..HEADER_LEN - 4]);
        b[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }
}

fn exercise(path: &Path, bytes: Vec<u8>, fx: &Fixture) {
    let Ok(file) = IndexFile::from_bytes(path, bytes) else { return };
    let Ok(view) = file.view() else { return };
    let needs = [
        Need::All,
        Need::Pred(Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff)),
        Need::and(vec![
            Need::Pred(Pred::range(Field::Ip4Dst, 0xc0a8_0000, 0xc0a8_0003)),
            Need::Pred(Pred::range(Field::SrcPort, 2000, 30000)),
        ]),
        Need::and(vec![
            Need::Pred(Pred::range(Field::DstPort, 80, 80)),
            Need::Pred(Pred { field: Field::TcpFlags, lo: 2, hi: 2, mask: 2 }),
        ]),
        Need::or(vec![
            Need::Pred(Pred::range(Field::WireLen, 100, 700)),
            Need::Pred(Pred::range(Field::ArpSpa, 0x0a00_0000, 0x0a00_0003)),
            Need::Pred(Pred::range(Field::Time, 1_700_000_000_000_500_000, 1_700_000_000_002_000_000)),
        ]),
    ];
    let Ok(seeker) = Seeker::new(&fx.trace_bytes, file.structure()) else { return };
    for need in &needs {
        let _ = view.count(need);
        if let Need::Pred(p) = need {
            let _ = view.estimate(p);
        }
        if let Ok(est) = view.estimate_select(need, 50) {
            let _ = view.select_estimated(est, false);
        }
        let Ok(sel) = view.select(need) else { continue };
        let _ = view.bytes_to_read(&sel);
        for (ci, positions) in &sel.chunks {
            let few = &positions[..positions.len().min(40)];
            let _ = view.read_packets(&fx.trace_bytes, &seeker, &fx.trace, *ci, few, &mut |_, _| Ok(()));
        }
    }
}

/// Fuzz target `index_from_bytes`: byte edits of a valid index, sealed again, then loaded and used.
pub fn from_bytes(data: &[u8]) {
    let fx = fixture();
    let path = Path::new("fuzz.ptidx");
    if data.starts_with(b"PTIX") {
        exercise(path, data.to_vec(), fx);
        return;
    }
    // Edits: 4-byte offset (modulo the index length), 1-byte value to XOR there.
    let mut bytes = fx.index.clone();
    for e in data.chunks_exact(5) {
        let at = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize % bytes.len();
        bytes[at] ^= e[4];
    }
    reseal(&mut bytes);
    exercise(path, bytes, fx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_is_valid_and_edits_are_caught_or_harmless() {
        let fx = fixture();
        let file = IndexFile::from_bytes(Path::new("x"), fx.index.clone()).expect("valid");
        assert_eq!(file.packets(), 1500);
        // Both column encodings are there for the edits to reach: a column's `raw` word is its sixth.
        let raw = |part: usize| {
            let at = HEADER_LEN + 32 + 16 * part;
            le32(&fx.index, HEADER_LEN + le32(&fx.index, at).unwrap() as usize + 20).unwrap()
        };
        let columns: Vec<u32> = (2..2 + crate::keys::KEY_FIELDS.len()).map(raw).collect();
        assert!(columns.contains(&1) && columns.contains(&0), "{columns:?}");
        from_bytes(&[]);
        // Every single-byte edit of the fixture, sealed again: an error or a harmless view, never a panic.
        for at in (0..fx.index.len()).step_by(23) {
            let mut e = (at as u32).to_le_bytes().to_vec();
            e.push(0x5a);
            from_bytes(&e);
        }
    }

    /// A value no row of a chunk has is answered from the key columns alone: the chunk's lane sequence is not
    /// loaded (a needle for an absent host costs no lane checksum or rank directory). Shown by damaging the lane
    /// sequence: counting and selecting an absent address still answer 0, a present one is refused.
    #[test]
    fn an_absent_value_does_not_load_the_lane_sequence() {
        let fx = fixture();
        let first_chunk = HEADER_LEN;
        let at = first_chunk + 32 + 16 * (PARTS - 2);
        let (po, pl) = (le32(&fx.index, at).unwrap() as usize, le32(&fx.index, at + 4).unwrap() as usize);
        let mut b = fx.index.clone();
        b[first_chunk + po + pl / 2] ^= 0x10;
        reseal(&mut b);
        let file = IndexFile::from_bytes(Path::new("x"), b).expect("header and directory sealed");
        let view = file.view().expect("view");
        let absent = Need::Pred(Pred::range(Field::Ip4Src, 0xcb00_7101, 0xcb00_7101));
        assert_eq!(view.estimate_need(&absent).expect("absent: estimate"), 0);
        let (sure, maybe) = view.count(&absent).expect("absent: count");
        assert_eq!((sure, maybe.count()), (0, 0));
        assert_eq!(view.select(&absent).expect("absent: select").count(), 0);
        let present = Need::Pred(Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0a00_0000));
        let err = view.select(&present).expect_err("a present address reads the damaged lanes");
        assert!(err.to_string().contains("lane sequence"), "{err}");
    }

    /// Counting the packets of many keys at once (by runs of a lane's flows) gives what selecting them finds, on
    /// a chunk whose lanes each hold many short flows of both protocols: key sets from one key to every key, one
    /// direction or both.
    #[test]
    fn counts_over_many_keys_equal_the_packets_selected() {
        let view = IndexFile::from_bytes(Path::new("x"), fixture().index.clone()).expect("valid");
        let view = view.view().expect("view");
        let p = |field, lo, hi| Need::Pred(Pred::range(field, lo, hi));
        let needs = [
            p(Field::IpProto, 6, 6),
            p(Field::IpProto, 17, 17),
            p(Field::IpProto, 0, 255),
            p(Field::Ip4Src, 0x0a00_0000, 0x0a00_ffff),
            p(Field::Ip4Src, 0x0a00_0000, 0x0a00_0505),
            p(Field::Ip4Dst, 0xc0a8_0000, 0xc0a8_0007),
            p(Field::SrcPort, 1024, 30_000),
            p(Field::DstPort, 80, 80),
            p(Field::Ip4Src, 0x0a00_0304, 0x0a00_0304),
            Need::Or(vec![p(Field::IpProto, 6, 6), p(Field::Ip4Dst, 0xc0a8_0003, 0xc0a8_0003)]),
            Need::And(vec![p(Field::IpProto, 17, 17), p(Field::Ip4Src, 0x0a00_0000, 0x0a00_06ff)]),
        ];
        let mut many = 0;
        for need in &needs {
            let selected = view.select(need).expect("select").count();
            assert_eq!(view.estimate_need(need).expect("estimate"), selected, "{need}");
            let (sure, maybe) = view.count(need).expect("count");
            assert_eq!((sure, maybe.count()), (selected, 0), "{need}");
            many += u64::from(selected > 500);
        }
        assert!(many >= 4, "the key sets are not large enough to count by runs");
    }

    /// Estimating and selecting at once (`estimate_select`, then `select_estimated` for the chunks it left) gives
    /// the estimate and the selection that `estimate_need` and `select` give apart, whatever the bound on the
    /// candidates selected with the estimate, for key conditions from one key to most keys, mixed conditions and
    /// time windows; what it learns of the packets it selects is what the index says of each looked up alone; and
    /// they read back as the packets the index describes.
    #[test]
    fn estimating_while_selecting_equals_estimating_then_selecting() {
        let fx = fixture();
        let file = IndexFile::from_bytes(Path::new("x"), fx.index.clone()).expect("valid");
        let view = file.view().expect("view");
        let p = |field, lo, hi| Need::Pred(Pred::range(field, lo, hi));
        let window = p(Field::Time, 1_700_000_000_000_500_000, 1_700_000_000_002_000_000);
        let needs = [
            p(Field::Ip4Src, 0x0a00_0304, 0x0a00_0304),
            p(Field::Ip4Src, 0x0a00_0000, 0x0a00_0505),
            p(Field::DstPort, 80, 80),
            p(Field::IpProto, 6, 6),
            p(Field::Ip4Src, 0xcb00_7101, 0xcb00_7101),
            Need::Or(vec![p(Field::Ip4Src, 0x0a00_0304, 0x0a00_0304), p(Field::Ip4Dst, 0x0a00_0304, 0x0a00_0304)]),
            Need::And(vec![
                p(Field::DstPort, 80, 80),
                Need::Pred(Pred { field: Field::TcpFlags, lo: 2, hi: 2, mask: 2 }),
            ]),
            Need::And(vec![p(Field::Ip4Src, 0x0a00_0000, 0x0a00_0505), window.clone()]),
            window,
        ];
        let seeker = Seeker::new(&fx.trace_bytes, file.structure()).expect("seeker");
        let (mut some, mut left, mut checked) = (0, 0, 0);
        for need in &needs {
            let estimate = view.estimate_need(need).expect("estimate");
            let selected = view.select(need).expect("select").chunks;
            for max in [0, 1, 7, 60, 4096, u64::MAX] {
                let est = view.estimate_select(need, max).expect("estimate_select");
                assert_eq!(est.estimate(), estimate, "{need}, at most {max}");
                assert_eq!(est.need(), need);
                some += est.chunks.iter().filter(|c| c.as_ref().is_some_and(|v| !v.is_empty())).count();
                left += est.chunks.iter().filter(|c| c.is_none()).count();
                for parallel in [false, true] {
                    let sel = view.select_estimated(est.clone(), parallel).expect("select_estimated");
                    assert_eq!(sel.chunks, selected, "{need}, at most {max}");
                }
            }
            // What selecting learnt of the packets (their keys, lane symbols and ranks) is what the index says of
            // them: each reads back as the packet it describes.
            let est = view.estimate_select(need, u64::MAX).expect("estimate_select");
            for (ci, positions) in view.select_estimated(est, false).expect("select").chunks {
                // Each fact kept is the index's own, looked up packet by packet: its lane symbol, the occurrences of
                // that symbol before it, its key and its shape.
                let c = &view.chunks()[ci];
                let learnt = c.selected.lock().expect("lock").clone();
                let lanes = c.lanes().expect("lanes");
                for k in &learnt {
                    let i = k.pos as usize;
                    assert_eq!(lanes.access(i), k.sym, "{need}: the lane symbol of packet {i}");
                    assert_eq!(lanes.rank(k.sym, i), k.rank as usize, "{need}: the rank of packet {i}");
                    assert_eq!(c.key_of_packet(i, None).expect("key"), Some(k.key as usize), "{need}: packet {i}");
                    assert_eq!(c.shape_at(i, Some(*k)).expect("shape"), c.shape_at(i, None).expect("shape"));
                }
                checked += learnt.len();
                let mut read = 0;
                view.read_packets(&fx.trace_bytes, &seeker, &fx.trace, ci, &positions, &mut |_, _| {
                    read += 1;
                    Ok(())
                })
                .expect("the selected packets read back");
                assert_eq!(read, positions.len());
            }
        }
        assert!(some > 0 && left > 0, "both ways of selecting were taken ({some} chunks selected early, {left} later)");
        assert!(checked > 100, "what selecting learnt was checked for {checked} packets");
    }

    /// The lane and shape sequences are checked by their own (wavelet format) checksum, not the part table's: a
    /// flipped byte anywhere in either, with every part-table, head, directory and header checksum sealed to match,
    /// is still refused, never answered from.
    #[test]
    fn damaged_sequences_are_refused_though_the_part_table_matches() {
        let fx = fixture();
        let first_chunk = HEADER_LEN;
        let need = Need::Pred(Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff));
        let flags = Need::Pred(Pred { field: Field::TcpFlags, lo: 2, hi: 2, mask: 2 });
        for (part, what, need) in [(PARTS - 2, "lane sequence", &need), (PARTS - 1, "shape sequence", &flags)] {
            let at = first_chunk + 32 + 16 * part;
            let (po, pl) = (le32(&fx.index, at).unwrap() as usize, le32(&fx.index, at + 4).unwrap() as usize);
            for k in [0, 9, pl / 3, pl / 2, pl - 9, pl - 1] {
                let mut b = fx.index.clone();
                b[first_chunk + po + k] ^= 0x10;
                reseal(&mut b);
                let file = IndexFile::from_bytes(Path::new("x"), b).expect("header and directory sealed");
                let err = file.view().and_then(|v| v.select(need).map(|_| ())).expect_err(what);
                assert!(err.to_string().contains(what), "byte {k} of the {what}: {err}");
            }
        }
    }
}
