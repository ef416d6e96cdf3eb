//! Whole-flow deduplication (after FloSIS, §5): within a segment, a flow direction whose payload bytes are those of
//! an earlier flow direction is stored without them, and refers to them instead.
//!
//! A direction's payload is the concatenation of its packets' payload pieces in order; a piece is the last
//! `payload` bytes of a packet captured whole (its wire length), when that is at least [`MIN_PIECE`] bytes.
//! Directions of at least [`MIN_DIRECTION`] bytes are fingerprinted with SHA-256; a direction whose fingerprint and
//! length match an earlier one's is compared with it byte for byte, and only when every byte is equal are its
//! pieces left out of the stored data, each replaced by an *elision*: raw bytes `raw..raw + len` are the raw bytes
//! `src..src + len`, earlier in the same segment and stored. The references never leave the segment, so
//! retention, which removes segments whole, never leaves one dangling. Which bytes count as payload decides only
//! how much is saved, never what is read back: an elision is exact by construction.

use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};

use crate::codec::{get_varint, put_varint};

/// Payload bytes of a packet below which it is kept whole (the headers around it weigh as much).
pub(crate) const MIN_PIECE: u32 = 64;
/// Payload bytes of a direction below which it is not fingerprinted.
pub(crate) const MIN_DIRECTION: u64 = 2048;

/// A payload piece of a packet: where its bytes are in the caller's buffer, and where they are in the raw data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub at: u64,
    pub raw: u64,
    pub len: u32,
}

/// Raw bytes `raw..raw + len` are the raw bytes `src..src + len` (stored), which come before them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Elision {
    pub raw: u64,
    pub len: u64,
    pub src: u64,
}

/// The flow directions seen so far in a segment, by fingerprint, and the elisions made.
#[derive(Debug, Default)]
pub(crate) struct Deduper {
    sources: FxHashMap<[u8; 32], Vec<(u64, Vec<Piece>)>>,
    pub elisions: Vec<Elision>,
    pub elided: u64,
}

impl Deduper {
    /// Considers a flow direction of payload `pieces` (bytes in `buf`): true if its bytes are an earlier
    /// direction's, whose elisions are then added; else it becomes a source for later directions.
    pub(crate) fn consider(&mut self, buf: &[u8], pieces: &[Piece]) -> bool {
        let total: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
        if total < MIN_DIRECTION {
            return false;
        }
        let bytes = |p: &Piece| buf.get(p.at as usize..p.at as usize + p.len as usize);
        let mut h = Sha256::new();
        for p in pieces {
            let Some(b) = bytes(p) else { return false };
            h.update(b);
        }
        let fp: [u8; 32] = h.finalize().into();
        let candidates = self.sources.entry(fp).or_default();
        // The fingerprint names candidates; only equal bytes make an elision.
        let Some(source) = candidates.iter().find(|(t, src)| *t == total && same_bytes(buf, src, pieces)) else {
            candidates.push((total, pieces.to_vec()));
            return false;
        };
        // Walk both piece lists at once: each stretch of a piece of ours within one piece of the source's is an
        // elision.
        let src = &source.1;
        let (mut i, mut i_off) = (0usize, 0u64);
        for p in pieces {
            let mut done = 0u64;
            while done < u64::from(p.len) {
                let s = &src[i];
                let n = (u64::from(p.len) - done).min(u64::from(s.len) - i_off);
                push(&mut self.elisions, Elision { raw: p.raw + done, len: n, src: s.raw + i_off });
                done += n;
                i_off += n;
                if i_off == u64::from(s.len) {
                    i += 1;
                    i_off = 0;
                }
            }
        }
        self.elided += total;
        true
    }

    /// The elisions in raw order, encoded (see [`decode`]).
    pub(crate) fn encode(&mut self) -> Vec<u8> {
        self.elisions.sort_unstable_by_key(|e| e.raw);
        encode(&self.elisions)
    }
}

/// Adds an elision, joined to the one before when both continue each other.
fn push(elisions: &mut Vec<Elision>, e: Elision) {
    if let Some(last) = elisions.last_mut()
        && last.raw + last.len == e.raw
        && last.src + last.len == e.src
    {
        last.len += e.len;
        return;
    }
    elisions.push(e);
}

/// Whether the bytes of `a`'s pieces equal those of `b`'s (the same total length), compared as two streams.
fn same_bytes(buf: &[u8], a: &[Piece], b: &[Piece]) -> bool {
    let (mut ia, mut oa, mut ib, mut ob) = (0usize, 0usize, 0usize, 0usize);
    let piece = |p: &Piece| buf.get(p.at as usize..p.at as usize + p.len as usize);
    while ia < a.len() && ib < b.len() {
        let (Some(x), Some(y)) = (piece(&a[ia]), piece(&b[ib])) else { return false };
        let n = (x.len() - oa).min(y.len() - ob);
        if x[oa..oa + n] != y[ob..ob + n] {
            return false;
        }
        oa += n;
        ob += n;
        if oa == x.len() {
            ia += 1;
            oa = 0;
        }
        if ob == y.len() {
            ib += 1;
            ob = 0;
        }
    }
    ia == a.len() && ib == b.len()
}

/// Elisions as varints, each `raw` less the end of the one before (0 for the first), `len` less 1, and `raw`
/// less `src` (wrapping, so that elisions out of order encode to what [`decode`] refuses).
pub(crate) fn encode(elisions: &[Elision]) -> Vec<u8> {
    let mut o = Vec::with_capacity(elisions.len() * 6);
    let mut end = 0u64;
    for e in elisions {
        put_varint(&mut o, e.raw.wrapping_sub(end));
        put_varint(&mut o, e.len.wrapping_sub(1));
        put_varint(&mut o, e.raw.wrapping_sub(e.src));
        end = e.raw + e.len;
    }
    o
}

/// Reads `n` elisions of raw data of `raw_len` bytes, and checks them: in order, apart, within the data, each
/// source before its elision and the pcap header (24 bytes) never elided; returns them and the bytes they elide.
/// That each source is stored (overlaps no elision) is checked where one is used ([`source_is_stored`]): a
/// lookup reads a few of a segment's many elisions.
pub(crate) fn decode(b: &[u8], n: usize, raw_len: u64) -> Result<(Vec<Elision>, u64), String> {
    let mut v = Vec::with_capacity(n.min(b.len()));
    let (mut at, mut end, mut elided) = (0usize, 0u64, 0u64);
    for i in 0..n {
        let bad = || format!("elision {i}");
        let gap = get_varint(b, &mut at).ok_or_else(bad)?;
        let len = get_varint(b, &mut at).ok_or_else(bad)?.checked_add(1).ok_or_else(bad)?;
        let back = get_varint(b, &mut at).ok_or_else(bad)?;
        let raw = end.checked_add(gap).ok_or_else(bad)?;
        let stop =
            raw.checked_add(len).filter(|&s| s <= raw_len).ok_or_else(|| format!("elision {i} past the data"))?;
        let src = raw.checked_sub(back).ok_or_else(bad)?;
        if raw < 24 {
            return Err(format!("elision {i} in the pcap header"));
        }
        if back < len || src < 24 {
            return Err(format!("elision {i}: a source that is not before it"));
        }
        v.push(Elision { raw, len, src });
        end = stop;
        elided += len;
    }
    if at != b.len() {
        return Err("bytes after the elisions".into());
    }
    Ok((v, elided))
}

/// Whether the source of `e` is stored bytes, overlapping none of `elisions` (in order, as [`decode`] checks).
pub(crate) fn source_is_stored(elisions: &[Elision], e: &Elision) -> bool {
    let k = elisions.partition_point(|x| x.raw + x.len <= e.src);
    elisions.get(k).is_none_or(|x| x.raw >= e.src + e.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(at: &[(u64, u64, u32)]) -> Vec<Piece> {
        at.iter().map(|&(at, raw, len)| Piece { at, raw, len }).collect()
    }

    /// A direction cut differently into packets is still found equal; a near-identical one (one byte apart) and
    /// one of the same length with a colliding fingerprint bucket are not; elisions round-trip.
    #[test]
    fn equal_bytes_are_elided_and_near_ones_are_not() {
        let mut buf: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 253) as u8).collect();
        // Source: bytes 1000..5000 as pieces of 1000; copy at 10000..14000 as pieces of 1500, 1500, 1000.
        let copy: Vec<u8> = buf[1000..5000].to_vec();
        buf[10_000..14_000].copy_from_slice(&copy);
        let src = pieces(&[(1000, 100, 1000), (2000, 1200, 1000), (3000, 2300, 1000), (4000, 3400, 1000)]);
        let dup = pieces(&[(10_000, 9000, 1500), (11_500, 10_600, 1500), (13_000, 12_200, 1000)]);
        let mut d = Deduper::default();
        assert!(!d.consider(&buf, &src));
        assert!(d.consider(&buf, &dup));
        assert_eq!(d.elided, 4000);
        let covered: u64 = d.elisions.iter().map(|e| e.len).sum();
        assert_eq!(covered, 4000);
        // Every elided byte is its source's byte (raw offsets map back to buffer positions through the pieces).
        let at_of = |ps: &[Piece], raw: u64| {
            ps.iter().find(|p| raw >= p.raw && raw < p.raw + u64::from(p.len)).map(|p| p.at + raw - p.raw).unwrap()
        };
        for e in &d.elisions {
            for k in 0..e.len {
                assert_eq!(buf[at_of(&dup, e.raw + k) as usize], buf[at_of(&src, e.src + k) as usize]);
            }
        }
        let bytes = d.encode();
        let (back, elided) = decode(&bytes, d.elisions.len(), 20_000).unwrap();
        assert_eq!((back, elided), (d.elisions.clone(), 4000));
        // One byte apart: a source of its own.
        buf[12_345] ^= 1;
        let mut d2 = Deduper::default();
        assert!(!d2.consider(&buf, &src));
        assert!(!d2.consider(&buf, &dup));
        // Too small to consider.
        assert!(!d2.consider(&buf, &pieces(&[(0, 50, 100)])));
        // Decoding refuses disorder and sources after their elision; a source that is elided itself is found
        // where it is used.
        assert!(decode(&encode(&[Elision { raw: 100, len: 10, src: 200 }]), 1, 1000).is_err());
        let chained = [Elision { raw: 100, len: 10, src: 30 }, Elision { raw: 200, len: 10, src: 105 }];
        let (v, _) = decode(&encode(&chained), 2, 1000).unwrap();
        assert!(source_is_stored(&v, &v[0]) && !source_is_stored(&v, &v[1]));
        assert!(d.elisions.iter().all(|e| source_is_stored(&d.elisions, e)));
        assert!(decode(&encode(&[Elision { raw: 900, len: 200, src: 30 }]), 1, 1000).is_err());
    }
}
