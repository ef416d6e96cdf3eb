//! The bodies of the fuzz targets (fuzz/fuzz_targets/), here so that `cargo test` replays every saved crash input
//! (fuzz/regressions/) through exactly the code the fuzzer ran. Not part of the stable API.

use crate::{LinkType, Records, TraceReader, decode};

/// Link types the decoder target chooses from (the first two input bytes pick one).
pub const LINKTYPES: [u32; 27] = [
    0, 1, 7, 8, 9, 12, 14, 50, 51, 101, 104, 105, 107, 108, 113, 127, 129, 192, 226, 228, 229, 239, 258, 276, 6, 10,
    122,
];

fn w32(be: bool, v: u32) -> [u8; 4] {
    if be { v.to_be_bytes() } else { v.to_le_bytes() }
}

fn w16(be: bool, v: u16) -> [u8; 2] {
    if be { v.to_be_bytes() } else { v.to_le_bytes() }
}

/// Legacy pcap reader on arbitrary records behind a valid header; the first byte picks byte order and format.
pub fn pcap_reader(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    let magic: u32 = match sel % 3 {
        0 => 0xa1b2_c3d4,
        1 => 0xa1b2_3c4d,
        _ => 0xa1b2_cd34,
    };
    let be = sel & 0x80 != 0;
    let mut file = Vec::with_capacity(24 + rest.len());
    file.extend_from_slice(&w32(be, magic));
    file.extend_from_slice(&w16(be, 2));
    file.extend_from_slice(&w16(be, 4));
    file.extend_from_slice(&[0; 8]);
    file.extend_from_slice(&w32(be, 65535));
    file.extend_from_slice(&w32(be, u32::from(sel >> 3)));
    file.extend_from_slice(rest);
    let mut last_end = 24u64;
    for rec in Records::new(&file) {
        match rec {
            Ok(r) => {
                assert!(r.offset >= last_end, "records move forward");
                last_end = r.offset + u64::from(r.record_len);
                assert!(last_end <= file.len() as u64);
                let _ = decode(r.linktype, r.data);
            }
            Err(e) => {
                assert!(e.offset <= file.len() as u64);
                let _ = e.to_string();
                break;
            }
        }
    }
}

/// pcapng reader on arbitrary blocks behind a valid section header (and, if bit 1 of the first byte is set, an
/// Ethernet interface); bit 0 picks the byte order.
pub fn pcapng_reader(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else { return };
    let be = sel & 1 == 1;
    let mut file = Vec::with_capacity(48 + rest.len());
    file.extend_from_slice(&[0x0a, 0x0d, 0x0d, 0x0a]);
    file.extend_from_slice(&w32(be, 28));
    file.extend_from_slice(&w32(be, 0x1a2b_3c4d));
    file.extend_from_slice(&w16(be, 1));
    file.extend_from_slice(&w16(be, 0));
    file.extend_from_slice(&[0xff; 8]);
    file.extend_from_slice(&w32(be, 28));
    if sel & 2 == 2 {
        file.extend_from_slice(&w32(be, 1));
        file.extend_from_slice(&w32(be, 20));
        file.extend_from_slice(&w16(be, 1));
        file.extend_from_slice(&w16(be, 0));
        file.extend_from_slice(&w32(be, 0));
        file.extend_from_slice(&w32(be, 20));
    }
    file.extend_from_slice(rest);
    let mut r = Records::new(&file);
    for rec in r.by_ref() {
        match rec {
            Ok(rec) => {
                assert!(rec.offset + u64::from(rec.record_len) <= file.len() as u64);
                let _ = decode(rec.linktype, rec.data);
            }
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
    assert!(r.interfaces().len() <= file.len() / 20 + 1);
}

/// The streaming reader on arbitrary bytes; on uncompressed input it must agree with the slice reader.
pub fn stream_reader(data: &[u8]) {
    let Ok(mut s) = TraceReader::from_reader(Box::new(std::io::Cursor::new(data.to_vec())), None) else { return };
    let compressed = s.compression().is_some();
    let mut slice = Records::new(data);
    loop {
        let a =
            s.next_record().map(|r| r.map(|r| (r.ts_ns, r.offset, r.wirelen, r.data.to_vec())).map_err(|e| e.offset));
        let end = a.is_none() || matches!(a, Some(Err(_)));
        if !compressed {
            let b =
                slice.next().map(|r| r.map(|r| (r.ts_ns, r.offset, r.wirelen, r.data.to_vec())).map_err(|e| e.offset));
            assert_eq!(a, b, "stream and slice readers disagree");
        }
        if end {
            break;
        }
    }
}

/// The decoder on an arbitrary packet of a link type picked by the first two bytes.
pub fn decode_packet(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let lt = LINKTYPES[usize::from(u16::from_le_bytes([data[0], data[1]])) % LINKTYPES.len()];
    let pkt = &data[2..];
    let d = decode(LinkType(lt), pkt);
    for off in [d.l3_offset, d.l4_offset].into_iter().flatten() {
        assert!(off as usize <= pkt.len());
    }
    if let Some(inner) = d.decode_inner(pkt) {
        let _ = inner.flow();
    }
    let flow = d.flow();
    if let Some(s) = d.stop {
        let _ = s.to_string();
    }
    // The fast path of flow tracking reads what the decoder reads, whenever it reads a packet at all.
    if let Some(p) = crate::plain_flow(LinkType(lt), pkt) {
        let (key, dir) = flow.expect("the fast path read a flow the decoder did not");
        assert_eq!(crate::FlowKey::from(p.tuple), key);
        assert_eq!(p.dir, dir);
    }
}

/// A directory of this process's own for a fuzz target's files, `NAME-PID` in the temporary directory, made
/// empty. A fuzzer ends its process without running destructors, so the directories of processes that have
/// ended (`NAME-PID` with no `/proc/PID`) are removed first: every run would otherwise leave its fixtures behind.
pub fn scratch_dir(name: &str) -> std::io::Result<std::path::PathBuf> {
    let tmp = std::env::temp_dir();
    let prefix = format!("{name}-");
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for e in entries.flatten() {
            let file_name = e.file_name();
            let Some(pid) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else { continue };
            if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = tmp.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dirs_of_ended_processes_are_removed() {
        let name = "pcaptool-scratch-test";
        let tmp = std::env::temp_dir();
        // No process has this number (Linux's largest is 2^22).
        let ended = tmp.join(format!("{name}-999999999"));
        std::fs::create_dir_all(ended.join("sub")).unwrap();
        // Not a process's directory: kept.
        let other = tmp.join(format!("{name}-keep"));
        std::fs::create_dir_all(&other).unwrap();
        let mine = tmp.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("old"), b"x").unwrap();
        let dir = scratch_dir(name).unwrap();
        assert_eq!(dir, mine);
        assert!(!ended.exists());
        assert!(other.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "made empty");
        std::fs::remove_dir_all(&other).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
