//! A benchmark trace built from real captures: the well-formed Ethernet captures of tcpdump's and
//! suricata-verify's test suites in `../shared/corpus`, each re-timed to start at a fixed epoch plus a seeded
//! offset within 300 s with its gaps clamped to 10 s, merged by time, then repeated: copy k shifted by
//! k × (span + 1 s), its unicast IPv4/IPv6 addresses rewritten by a checksum-neutral bijection (one 16-bit word
//! +k, another −k, in ones' complement), so that every checksum stays valid and each copy's flows are new.
//! Deterministic for a given corpus and seed.

use std::io::Write;
use std::path::{Path, PathBuf};

use pcaptool_packet::{LinkType, PcapWriter, TraceReader, TsPrecision};

use crate::tracegen::Rng;

/// The first copy's epoch: 2024-01-01T00:00:00Z.
pub const EPOCH_NS: u64 = 1_704_067_200_000_000_000;
const SPREAD_NS: u64 = 300_000_000_000;
const MAX_GAP_NS: u64 = 10_000_000_000;

/// What went into a real-traffic trace.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealStats {
    /// Captures taken from the corpus.
    pub files: usize,
    /// Packets of one copy.
    pub packets_per_copy: u64,
    /// Packets written.
    pub packets: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Time span of one copy, ns.
    pub span_ns: u64,
}

/// The corpus captures the trace is made of: every Ethernet capture of tcpdump's and suricata-verify's tests that
/// the tools that catalogued them read without a record issue or an error. Packets cut by a snapshot length or
/// malformed are kept: real traces have them.
pub fn sources(corpus: &Path) -> Vec<PathBuf> {
    let Ok(cat) = std::fs::read_to_string(corpus.join("CATALOGUE.tsv")) else { return Vec::new() };
    let mut out: Vec<PathBuf> = cat
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let ok = f.len() >= 10
                && ["tcpdump/", "suricata-verify/"].iter().any(|d| f[0].starts_with(d))
                && f[3] == "ether"
                && f[7].is_empty()
                && f[9].is_empty();
            ok.then(|| corpus.join(f[0]))
        })
        .collect();
    out.sort();
    out
}

/// `a + b` in ones' complement (16 bits, end-around carry).
fn oc_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// Rewrites the 16-bit words `hi` and `lo` at `at` and `at + 2` of `d`: `hi + k`, `lo - k` in ones' complement,
/// which leaves their ones'-complement sum, and so every checksum over them, unchanged.
fn shift_words(d: &mut [u8], hi: usize, lo: usize, k: u16) {
    let w = |d: &[u8], i: usize| u16::from_be_bytes([d[i], d[i + 1]]);
    let (a, b) = (oc_add(w(d, hi), k), oc_add(w(d, lo), !k));
    d[hi..hi + 2].copy_from_slice(&a.to_be_bytes());
    d[lo..lo + 2].copy_from_slice(&b.to_be_bytes());
}

fn v4_unicast(a: &[u8]) -> bool {
    a[0] != 0 && a[0] < 224 && a != [255, 255, 255, 255]
}

fn v6_unicast(a: &[u8]) -> bool {
    a[0] != 0xff && a.iter().any(|&b| b != 0)
}

/// Rewrites the unicast source and destination addresses of the outer IPv4 or IPv6 header of an Ethernet frame
/// (behind up to two VLAN tags) for copy `k`; other frames, and addresses cut off by the snapshot length, are left.
pub fn rewrite_addresses(d: &mut [u8], k: u16) {
    if k == 0 {
        return;
    }
    let mut at = 12;
    let mut ethertype = match d.get(at..at + 2) {
        Some(e) => u16::from_be_bytes([e[0], e[1]]),
        None => return,
    };
    for _ in 0..2 {
        if ethertype != 0x8100 && ethertype != 0x88a8 {
            break;
        }
        at += 4;
        ethertype = match d.get(at..at + 2) {
            Some(e) => u16::from_be_bytes([e[0], e[1]]),
            None => return,
        };
    }
    let ip = at + 2;
    match ethertype {
        0x0800 if d.len() >= ip + 20 && d[ip] >> 4 == 4 => {
            for a in [ip + 12, ip + 16] {
                if v4_unicast(&d[a..a + 4]) {
                    shift_words(d, a, a + 2, k);
                }
            }
        }
        0x86dd if d.len() >= ip + 40 && d[ip] >> 4 == 6 => {
            for a in [ip + 8, ip + 24] {
                if v6_unicast(&d[a..a + 16]) {
                    // The interface identifier's last two words: the prefix (and so the address's scope) stays.
                    shift_words(d, a + 12, a + 14, k);
                }
            }
        }
        _ => {}
    }
}

/// Writes the real-traffic trace of `copies` copies to `w` (nanosecond pcap, Ethernet).
pub fn build(sources: &[PathBuf], copies: u32, seed: u64, w: impl Write) -> std::io::Result<RealStats> {
    let mut rng = Rng::new(seed);
    // (time, file, position in file, wire length, bytes)
    let mut packets: Vec<(u64, usize, usize, u32, Vec<u8>)> = Vec::new();
    let mut files = 0;
    for (fi, path) in sources.iter().enumerate() {
        let Ok(mut r) = TraceReader::open(path) else { continue };
        let mut mine = Vec::new();
        let mut bad = false;
        while let Some(rec) = r.next_record() {
            match rec {
                Ok(rec) if rec.linktype.base() == LinkType::ETHERNET && rec.has_ts => {
                    mine.push((rec.ts_ns, rec.wirelen, rec.data.to_vec()))
                }
                _ => {
                    bad = true;
                    break;
                }
            }
        }
        if bad || mine.is_empty() {
            continue;
        }
        files += 1;
        // Offsets in whole microseconds: a trace of microsecond precision keeps its precision.
        let mut t = EPOCH_NS + rng.below(SPREAD_NS / 1000) * 1000;
        let mut prev = mine[0].0;
        for (i, (ts, wirelen, data)) in mine.into_iter().enumerate() {
            t += ts.saturating_sub(prev).min(MAX_GAP_NS);
            prev = ts.max(prev);
            packets.push((t, fi, i, wirelen, data));
        }
    }
    packets.sort_by_key(|p| (p.0, p.1, p.2));
    let span = packets.last().map_or(0, |p| p.0) - packets.first().map_or(0, |p| p.0);
    let mut out = PcapWriter::new(w, LinkType::ETHERNET, 262_144, TsPrecision::Nano).map_err(std::io::Error::other)?;
    let mut stats = RealStats { files, packets_per_copy: packets.len() as u64, span_ns: span, ..RealStats::default() };
    let mut buf = Vec::new();
    for k in 0..copies {
        let shift = u64::from(k) * (span.div_ceil(1000) * 1000 + 1_000_000_000);
        for (t, _, _, wirelen, data) in &packets {
            buf.clear();
            buf.extend_from_slice(data);
            rewrite_addresses(&mut buf, k as u16);
            out.write_packet(t + shift, *wirelen, &buf).map_err(std::io::Error::other)?;
            stats.packets += 1;
            stats.bytes += 16 + buf.len() as u64;
        }
    }
    out.finish().map_err(std::io::Error::other)?.flush()?;
    stats.bytes += 24;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ones'-complement sum of 16-bit words, as the IP, TCP and UDP checksums take it.
    fn oc_sum(b: &[u8]) -> u16 {
        b.chunks(2).fold(0u16, |s, c| oc_add(s, u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
    }

    #[test]
    fn rewriting_keeps_every_sum_and_is_a_bijection_per_copy() {
        let mut rng = Rng::new(5);
        // Rewritten address -> original: two originals may not share one (the words 0x0000 and 0xffff, both a
        // ones'-complement zero, are the only exception, and a low word of x.y.0.0 or x.y.255.255 names a network
        // or a broadcast, not a host).
        let mut seen: std::collections::HashMap<Vec<u8>, [u8; 4]> = std::collections::HashMap::new();
        for _ in 0..20_000 {
            let mut f = vec![0u8; 14 + 20];
            f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            f[14] = 0x45;
            let a = (rng.next_u64() as u32).to_be_bytes();
            f[26..30].copy_from_slice(&a);
            f[30..34].copy_from_slice(&[10, 0, 0, 1]);
            let before = oc_sum(&f[26..34]);
            let mut g = f.clone();
            rewrite_addresses(&mut g, 7);
            assert_eq!(oc_sum(&g[26..34]), before, "the checksum over the addresses is unchanged");
            if v4_unicast(&a) {
                assert_ne!(g[26..30], a[..], "a unicast address is rewritten");
                let low = u16::from_be_bytes([a[2], a[3]]);
                if low != 0 && low != 0xffff {
                    let was = *seen.entry(g[26..30].to_vec()).or_insert(a);
                    assert_eq!(was, a, "two addresses rewritten to one");
                }
            } else {
                assert_eq!(g[26..30], a[..], "other addresses stay");
            }
        }
        // IPv6: the prefix stays, the sum too.
        let mut f = vec![0u8; 14 + 40];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[22..38].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let before = oc_sum(&f[22..54]);
        let mut g = f.clone();
        rewrite_addresses(&mut g, 3);
        assert_eq!(oc_sum(&g[22..54]), before);
        assert_eq!(g[22..34], f[22..34]);
        assert_ne!(g[34..38], f[34..38]);
    }

    #[test]
    fn distinct_copies_give_distinct_addresses() {
        let base = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0x45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 168, 1, 7];
        let mut all = std::collections::HashSet::new();
        for k in 0..21u16 {
            let mut f = base.to_vec();
            f.resize(34, 0);
            rewrite_addresses(&mut f, k);
            assert!(all.insert(f[26..30].to_vec()), "copy {k}");
        }
    }
}
