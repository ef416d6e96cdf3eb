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

    /// The elisions in raw order, encoded (see [`encode`]; with checkpoints from format 9 on).
    pub(crate) fn encode(&mut self, checkpoints: bool) -> Vec<u8> {
        self.elisions.sort_unstable_by_key(|e| e.raw);
        encode(&self.elisions, checkpoints)
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

/// Elisions between two checkpoints of the encoded list (see [`encode`]).
pub(crate) const CHUNK: usize = 256;
/// Bytes of a checkpoint: where its elision's varints start, the raw end of the elision before it, the raw bytes
/// elided before it, and the CRC-32 of its chunk's varints.
pub(crate) const CHECKPOINT_BYTES: usize = 4 + 8 + 8 + 4;

/// Elisions as varints, each `raw` less the end of the one before (0 for the first), `len` less 1, and `raw`
/// less `src` (wrapping, so that elisions out of order encode to what a reader refuses); then, with
/// `checkpoints` (format 9 on), for every [`CHUNK`]th elision from the first, a checkpoint (where its varints
/// start, the end of the elision before it, the bytes elided before it, the CRC-32 of the chunk's varints), so
/// that a reader reads and decodes only the chunks it needs.
pub(crate) fn encode(elisions: &[Elision], checkpoints: bool) -> Vec<u8> {
    let mut o = Vec::with_capacity(elisions.len() * 6 + elisions.len().div_ceil(CHUNK) * CHECKPOINT_BYTES);
    let mut checks = Vec::with_capacity(elisions.len().div_ceil(CHUNK));
    let (mut end, mut elided) = (0u64, 0u64);
    for (i, e) in elisions.iter().enumerate() {
        if i % CHUNK == 0 {
            checks.push((o.len(), end, elided));
        }
        put_varint(&mut o, e.raw.wrapping_sub(end));
        put_varint(&mut o, e.len.wrapping_sub(1));
        put_varint(&mut o, e.raw.wrapping_sub(e.src));
        end = e.raw.wrapping_add(e.len);
        elided = elided.wrapping_add(e.len);
    }
    if checkpoints {
        let varints = o.len();
        for (k, &(at, end, elided)) in checks.iter().enumerate() {
            let stop = checks.get(k + 1).map_or(varints, |c| c.0);
            let crc = crc32fast::hash(&o[at..stop]);
            o.extend_from_slice(&(at as u32).to_le_bytes());
            o.extend_from_slice(&end.to_le_bytes());
            o.extend_from_slice(&elided.to_le_bytes());
            o.extend_from_slice(&crc.to_le_bytes());
        }
    }
    o
}

/// The bytes of an encoded list (see [`encode`]) that checkpoint `n` elisions: the last ones, none without
/// `checkpoints`.
pub(crate) fn checkpoint_bytes(n: usize, checkpoints: bool) -> usize {
    if checkpoints { n.div_ceil(CHUNK) * CHECKPOINT_BYTES } else { 0 }
}

/// Where a chunk of the encoded list starts: the offset of its first varint, the raw end of the elision before
/// it (0 for the first), the raw bytes elided before it, and (format 9 on) the CRC-32 of its varints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Checkpoint {
    at: usize,
    end: u64,
    elided: u64,
    crc: Option<u32>,
}

/// A chunk's elisions, decoded and checked, and the raw bytes elided before each (and after the last, last).
#[derive(Clone, Debug)]
struct Chunk {
    list: Vec<Elision>,
    before: Vec<u64>,
}

/// Where the elisions' varints are: held, or in a file, read a chunk at a time as a read needs them.
#[derive(Clone, Debug)]
pub(crate) enum Varints {
    /// The varints themselves.
    Held(Vec<u8>),
    /// `len` bytes of `file` from `at`.
    File { file: std::sync::Arc<std::fs::File>, at: u64, len: usize },
}

impl Varints {
    fn len(&self) -> usize {
        match self {
            Varints::Held(b) => b.len(),
            Varints::File { len, .. } => *len,
        }
    }
}

/// Why elisions could not be read: what is wrong with them, or the error reading their file.
#[derive(Debug)]
pub(crate) enum ElisionError {
    /// The elisions are damaged: which, and how.
    Bad(String),
    /// Reading their varints failed.
    Io(std::io::Error),
}

impl From<String> for ElisionError {
    fn from(why: String) -> ElisionError {
        ElisionError::Bad(why)
    }
}

impl From<&str> for ElisionError {
    fn from(why: &str) -> ElisionError {
        ElisionError::Bad(why.into())
    }
}

/// A segment's elisions as its index holds them (see [`encode`]), read and decoded a chunk at a time as they
/// are asked for, and checked as they are: the chunk's varints against its checkpoint's CRC, then in raw order,
/// apart, within the data, none in the pcap header, each source before its elision, and each chunk ending where
/// the next one's checkpoint says. That a source is stored (meets no elision) is checked where it is used
/// ([`Elisions::source_is_stored`]). A lookup reads a few of a segment's many elisions.
#[derive(Clone, Debug)]
pub(crate) struct Elisions {
    varints: Varints,
    n: usize,
    raw_len: u64,
    checks: Vec<Checkpoint>,
    chunks: Vec<std::sync::OnceLock<Chunk>>,
}

impl Elisions {
    /// No elisions.
    pub(crate) fn none() -> Elisions {
        Elisions { varints: Varints::Held(Vec::new()), n: 0, raw_len: 0, checks: Vec::new(), chunks: Vec::new() }
    }

    /// `n` elisions of raw data of `raw_len` bytes, `elided` of them elided: their varints, and their
    /// checkpoints as `table` holds them (format 9 on, checked by the caller against stage 1), or, without,
    /// made by reading the varints (`Held`) through once. Checks the checkpoints and the last chunk.
    pub(crate) fn new(
        varints: Varints,
        table: Option<&[u8]>,
        n: usize,
        raw_len: u64,
        elided: u64,
    ) -> Result<Elisions, ElisionError> {
        let count = n.div_ceil(CHUNK);
        let mut checks: Vec<Checkpoint> = Vec::with_capacity(count);
        let len = varints.len();
        match (table, &varints) {
            (Some(table), _) => {
                if table.len() != count * CHECKPOINT_BYTES {
                    return Err("checkpoints for another count of elisions".into());
                }
                for (k, c) in table.chunks_exact(CHECKPOINT_BYTES).enumerate() {
                    let le = |r: std::ops::Range<usize>| {
                        let mut w = [0u8; 8];
                        w[..r.len()].copy_from_slice(&c[r]);
                        u64::from_le_bytes(w)
                    };
                    let p = Checkpoint { at: le(0..4) as usize, end: le(4..12), elided: le(12..20), crc: None };
                    // In order, each chunk of at least one elision of a byte or more; elided bytes never more
                    // than the raw bytes past the header before them.
                    let ok = match checks.last() {
                        None => p == Checkpoint { at: 0, end: 0, elided: 0, crc: None },
                        Some(q) => {
                            p.at > q.at && p.end > q.end && p.elided > q.elided && p.elided - q.elided <= p.end - q.end
                        }
                    };
                    if !ok || p.at >= len || p.end > raw_len || (k > 0 && p.elided.saturating_add(24) > p.end) {
                        return Err(format!("checkpoint {k}").into());
                    }
                    checks.push(Checkpoint { crc: Some(le(20..24) as u32), ..p });
                }
            }
            (None, Varints::Held(bytes)) => {
                // Read through once, keeping only the checkpoints.
                let (mut at, mut end, mut total) = (0usize, 0u64, 0u64);
                for i in 0..n {
                    if i % CHUNK == 0 {
                        checks.push(Checkpoint { at, end, elided: total, crc: None });
                    }
                    let e = next(bytes, &mut at, &mut end, raw_len, i)?;
                    total += e.len;
                }
                if at != bytes.len() {
                    return Err("bytes after the elisions".into());
                }
            }
            (None, Varints::File { .. }) => return Err("elisions in a file without checkpoints".into()),
        }
        let chunks = (0..count).map(|_| std::sync::OnceLock::new()).collect();
        let me = Elisions { varints, n, raw_len, checks, chunks };
        // The last chunk ends the list, and the bytes elided are stage 1's.
        let total = match count.checked_sub(1) {
            Some(last) => *me.chunk(last)?.before.last().unwrap_or(&0),
            None if len == 0 => 0,
            None => return Err("bytes after the elisions".into()),
        };
        if total != elided {
            return Err(format!("elisions of {total} bytes, stage 1 says {elided}").into());
        }
        Ok(me)
    }

    /// Elisions encoded whole as [`encode`] makes them (with `checkpoints` or without), held.
    #[cfg(test)]
    fn of_encoded(
        mut bytes: Vec<u8>,
        n: usize,
        raw_len: u64,
        elided: u64,
        checkpoints: bool,
    ) -> Result<Elisions, ElisionError> {
        let table = bytes.split_off(bytes.len().saturating_sub(checkpoint_bytes(n, checkpoints)));
        Elisions::new(Varints::Held(bytes), checkpoints.then_some(&table[..]), n, raw_len, elided)
    }

    /// Chunk `k`, read, decoded and checked the first time it is asked for.
    fn chunk(&self, k: usize) -> Result<&Chunk, ElisionError> {
        if let Some(c) = self.chunks[k].get() {
            return Ok(c);
        }
        let p = self.checks[k];
        let stop = self.checks.get(k + 1).map_or(self.varints.len(), |q| q.at);
        let first = k * CHUNK;
        let upto = (first + CHUNK).min(self.n);
        let read;
        let bytes = match &self.varints {
            Varints::Held(b) => b.get(p.at..stop).ok_or_else(|| format!("elision {first}"))?,
            Varints::File { file, at, .. } => {
                let mut b = vec![0u8; stop - p.at];
                std::os::unix::fs::FileExt::read_exact_at(&**file, &mut b, at + p.at as u64)
                    .map_err(ElisionError::Io)?;
                read = b;
                &read[..]
            }
        };
        if p.crc.is_some_and(|crc| crc != crc32fast::hash(bytes)) {
            return Err(format!("elisions {first}..{upto}: the checksum does not match").into());
        }
        let (mut at, mut end, mut elided) = (0, p.end, p.elided);
        let mut list = Vec::with_capacity(upto - first);
        let mut before = Vec::with_capacity(upto - first + 1);
        for i in first..upto {
            before.push(elided);
            let e = next(bytes, &mut at, &mut end, self.raw_len, i)?;
            elided = elided.checked_add(e.len).ok_or_else(|| format!("elision {i}"))?;
            list.push(e);
        }
        before.push(elided);
        // The chunk ends where the next begins (or the list does).
        let fits = at == bytes.len() && self.checks.get(k + 1).is_none_or(|q| (end, elided) == (q.end, q.elided));
        if !fits {
            return Err(format!("elisions {first}..{upto} do not end where the next begin").into());
        }
        Ok(self.chunks[k].get_or_init(|| Chunk { list, before }))
    }

    /// The chunk whose elisions hold or follow raw byte `x` first: the last whose checkpoint's end is at or before
    /// `x` (`None` with no elisions).
    fn chunk_of(&self, x: u64) -> Option<usize> {
        self.checks.partition_point(|c| c.end <= x).checked_sub(1)
    }

    /// The elisions that meet the raw bytes `r`, in order.
    pub(crate) fn meeting(&self, r: std::ops::Range<u64>) -> Result<Vec<Elision>, ElisionError> {
        let mut out = Vec::new();
        let Some(first) = self.chunk_of(r.start) else { return Ok(out) };
        // A chunk's elisions lie at or after its checkpoint's end.
        let mut k = first;
        while k < self.checks.len() && (k == first || self.checks[k].end < r.end) {
            let c = self.chunk(k)?;
            let i = c.list.partition_point(|e| e.raw + e.len <= r.start);
            out.extend(c.list[i..].iter().take_while(|e| e.raw < r.end));
            k += 1;
        }
        Ok(out)
    }

    /// Where raw byte `x` is in the blocks' bytes (an elided byte: where its elision would be).
    pub(crate) fn to_stream(&self, x: u64) -> Result<u64, ElisionError> {
        let Some(k) = self.chunk_of(x) else { return Ok(x) };
        let c = self.chunk(k)?;
        let i = c.list.partition_point(|e| e.raw + e.len <= x);
        let mut s = x.checked_sub(c.before[i]);
        if let Some(e) = c.list.get(i).filter(|e| e.raw < x) {
            s = s.and_then(|s| s.checked_sub(x - e.raw));
        }
        Ok(s.ok_or_else(|| format!("raw byte {x} before the bytes elided"))?)
    }

    /// Whether elision `e`'s source is stored bytes, meeting no elision.
    pub(crate) fn source_is_stored(&self, e: &Elision) -> Result<bool, ElisionError> {
        Ok(self.meeting(e.src..e.src + e.len)?.is_empty())
    }
}

/// Decodes elision `i` at `at` of the varints `b`, after an elision ending at `end`, and checks it (see
/// [`Elisions`]); moves `at` and `end` past it.
fn next(b: &[u8], at: &mut usize, end: &mut u64, raw_len: u64, i: usize) -> Result<Elision, String> {
    let bad = || format!("elision {i}");
    let gap = get_varint(b, at).ok_or_else(bad)?;
    let len = get_varint(b, at).ok_or_else(bad)?.checked_add(1).ok_or_else(bad)?;
    let back = get_varint(b, at).ok_or_else(bad)?;
    let raw = end.checked_add(gap).ok_or_else(bad)?;
    let stop = raw.checked_add(len).filter(|&s| s <= raw_len).ok_or_else(|| format!("elision {i} past the data"))?;
    let src = raw.checked_sub(back).ok_or_else(bad)?;
    if raw < 24 {
        return Err(format!("elision {i} in the pcap header"));
    }
    if back < len || src < 24 {
        return Err(format!("elision {i}: a source that is not before it"));
    }
    *end = stop;
    Ok(Elision { raw, len, src })
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
        for checkpoints in [false, true] {
            let bytes = d.encode(checkpoints);
            let list = Elisions::of_encoded(bytes, d.elisions.len(), 20_000, 4000, checkpoints).unwrap();
            assert_eq!(list.meeting(0..20_000).unwrap(), d.elisions);
            assert!(d.elisions.iter().all(|e| list.source_is_stored(e).unwrap()));
        }
        // One byte apart: a source of its own.
        buf[12_345] ^= 1;
        let mut d2 = Deduper::default();
        assert!(!d2.consider(&buf, &src));
        assert!(!d2.consider(&buf, &dup));
        // Too small to consider.
        assert!(!d2.consider(&buf, &pieces(&[(0, 50, 100)])));
        // Decoding refuses disorder and sources after their elision; a source that is elided itself is found
        // where it is used.
        let read = |es: &[Elision], c: bool| {
            let elided = es.iter().map(|e| e.len).sum();
            Elisions::of_encoded(encode(es, c), es.len(), 1000, elided, c)
        };
        for c in [false, true] {
            assert!(read(&[Elision { raw: 100, len: 10, src: 200 }], c).is_err());
            let chained = [Elision { raw: 100, len: 10, src: 30 }, Elision { raw: 200, len: 10, src: 105 }];
            let v = read(&chained, c).unwrap();
            assert!(v.source_is_stored(&chained[0]).unwrap() && !v.source_is_stored(&chained[1]).unwrap());
            assert!(read(&[Elision { raw: 900, len: 200, src: 30 }], c).is_err());
        }
    }

    /// Elisions in raw order, apart, each source before it and past the header: `n` of them in `raw_len` bytes.
    fn valid(seed: &[(u16, u16, u16)]) -> (Vec<Elision>, u64) {
        let mut v = Vec::new();
        let mut end = 24u64;
        for &(gap, len, back) in seed {
            let raw = end + u64::from(gap);
            let len = u64::from(len) + 1;
            let src = raw.saturating_sub(len + u64::from(back)).max(24);
            if src + len <= raw {
                v.push(Elision { raw, len, src });
                end = raw + len;
            }
        }
        (v, end + 10)
    }

    /// Held in a file, elisions are read a chunk at a time, each checked against its checkpoint's CRC: a damaged
    /// chunk fails the reads that meet it, and only those.
    #[test]
    fn a_damaged_chunk_fails_only_the_reads_that_meet_it() {
        let seed: Vec<(u16, u16, u16)> = (0..1000u16).map(|i| (50 + i % 7, 20 + i % 13, 100)).collect();
        let (all, raw_len) = valid(&seed);
        let elided: u64 = all.iter().map(|e| e.len).sum();
        let mut bytes = encode(&all, true);
        let table = checkpoint_bytes(all.len(), true);
        let len = bytes.len() - table;
        let at2 = u32::from_le_bytes(bytes[len + 2 * CHECKPOINT_BYTES..][..4].try_into().unwrap()) as usize;
        bytes[at2 + 1] ^= 0x40;
        let path = std::env::temp_dir().join(format!("pcaptool-elisions-{}", std::process::id()));
        std::fs::write(&path, [&b"prefix!"[..], &bytes[..len]].concat()).unwrap();
        let file = std::sync::Arc::new(std::fs::File::open(&path).unwrap());
        let _ = std::fs::remove_file(&path);
        let varints = Varints::File { file, at: 7, len };
        let list = Elisions::new(varints, Some(&bytes[len..]), all.len(), raw_len, elided).unwrap();
        let meets = |r: std::ops::Range<u64>| -> Vec<Elision> {
            all.iter().filter(|e| e.raw < r.end && e.raw + e.len > r.start).copied().collect()
        };
        for r in [0..all[10].raw, all[CHUNK + 5].raw..all[2 * CHUNK - 1].raw, all[3 * CHUNK].raw..raw_len] {
            assert_eq!(list.meeting(r.clone()).unwrap(), meets(r));
        }
        let damaged = all[2 * CHUNK].raw..all[2 * CHUNK + 1].raw + 1;
        match list.meeting(damaged) {
            Err(ElisionError::Bad(why)) => assert_eq!(why, "elisions 512..768: the checksum does not match"),
            other => panic!("{other:?}"),
        }
        // A checkpoint that is wrong (the caller checks them against stage 1) fails the chunks it bounds.
        let mut wrong = bytes[len..].to_vec();
        wrong[CHECKPOINT_BYTES + 4] ^= 1;
        let varints = Varints::Held(bytes[..len].to_vec());
        let list = Elisions::new(varints, Some(&wrong), all.len(), raw_len, elided).unwrap();
        assert!(list.meeting(0..all[10].raw).is_err());
        assert!(list.meeting(all[CHUNK + 5].raw..all[CHUNK + 6].raw).is_err());
        assert_eq!(list.meeting(all[3 * CHUNK + 5].raw..all[3 * CHUNK + 6].raw).unwrap(), vec![all[3 * CHUNK + 5]]);
    }

    proptest::proptest! {
        /// Read a chunk at a time, with checkpoints or without, elisions answer as the whole list does: the
        /// elisions meeting a range, where a raw byte is in the stored stream, and whether a source is stored.
        #[test]
        fn chunked_elisions_answer_as_the_whole_list(
            seed in proptest::collection::vec((0u16..300, 0u16..200, 0u16..2000), 0..1500),
            probes in proptest::collection::vec((0u64..400_000, 0u64..3000), 1..40),
        ) {
            let (all, raw_len) = valid(&seed);
            let elided: u64 = all.iter().map(|e| e.len).sum();
            for c in [false, true] {
                let list = Elisions::of_encoded(encode(&all, c), all.len(), raw_len, elided, c).unwrap();
                for &(from, len) in &probes {
                    let (from, to) = (from % raw_len, (from % raw_len + len).min(raw_len));
                    let want: Vec<Elision> =
                        all.iter().filter(|e| e.raw < to && e.raw + e.len > from).copied().collect();
                    proptest::prop_assert_eq!(list.meeting(from..to).unwrap(), want);
                    // The stream position: the raw bytes before `from` less the elided ones among them.
                    let gone: u64 = all.iter().map(|e| (e.raw + e.len).min(from).saturating_sub(e.raw)).sum();
                    proptest::prop_assert_eq!(list.to_stream(from).unwrap(), from - gone);
                }
                for e in &all {
                    let stored = all.iter().all(|x| x.raw >= e.src + e.len || x.raw + x.len <= e.src);
                    proptest::prop_assert_eq!(list.source_is_stored(e).unwrap(), stored);
                }
            }
        }

        /// Damaged elision bytes (checkpoints among them) are refused or read as something, never a panic.
        #[test]
        fn damaged_elisions_never_panic(
            seed in proptest::collection::vec((0u16..300, 0u16..200, 0u16..2000), 1..700),
            flips in proptest::collection::vec((0usize..100_000, 1u8..=255), 1..8),
            probes in proptest::collection::vec(0u64..400_000, 1..20),
        ) {
            let (all, raw_len) = valid(&seed);
            let elided: u64 = all.iter().map(|e| e.len).sum();
            let mut bytes = encode(&all, true);
            proptest::prop_assume!(!bytes.is_empty());
            for &(at, x) in &flips {
                let n = bytes.len();
                bytes[at % n] ^= x;
            }
            if let Ok(list) = Elisions::of_encoded(bytes, all.len(), raw_len, elided, true) {
                for &x in &probes {
                    let x = x % raw_len;
                    let _ = list.meeting(x..(x + 5000).min(raw_len));
                    let _ = list.to_stream(x);
                }
            }
        }
    }
}
