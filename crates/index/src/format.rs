//! The index file format (docs/format/index.md): little-endian fields, a fixed header naming the trace, chunks,
//! a directory, each with a CRC-32.

use std::fs::File;
use std::path::Path;

use crate::IndexError;
use pcaptool_packet::{PacketFields, Record};
use pcaptool_wavelet::Crc32;

/// The first four bytes of an index.
pub const MAGIC: [u8; 4] = *b"PTIX";
/// The format version this crate writes.
pub const VERSION: u16 = 7;
/// The oldest format version this crate reads: version 4 differs from 5 only in storing the rank and select
/// directories of its sequences and Elias-Fano high bits, which a reader rebuilds either way, and in having no raw
/// key columns; both keep the shape sequence in time order, where version 6 groups it by lane symbol. Versions
/// before 7 read header fields on Ethernet packets only (every other link type's are unknown).
pub const OLDEST_READ: u16 = 4;
/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 96;
/// Bytes of the trace's start and end whose checksums identify it (with its length and modification time).
pub(crate) const IDENTITY_SPAN: u64 = 1 << 16;

/// CRC-32 (IEEE) of `bytes`.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(bytes);
    c.finish()
}

/// Damage found in an index: where (a byte offset in the index file) and what does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    pub offset: u64,
    pub why: String,
}

impl Damage {
    pub(crate) fn new(offset: u64, why: impl Into<String>) -> Damage {
        Damage { offset, why: why.into() }
    }
}

/// One checksummed part of a chunk: its bytes, where they are in the file, and their CRC-32, checked the first
/// time the part is used (a query touches only the parts it needs, so it checks only those).
#[derive(Debug)]
pub(crate) struct Part<'a> {
    bytes: &'a [u8],
    offset: u64,
    crc: u32,
    /// Whether the bytes carry their own checksum over all of them, which their parser checks.
    own_checksum: bool,
    checked: std::sync::OnceLock<bool>,
}

impl<'a> Part<'a> {
    pub(crate) fn new(bytes: &'a [u8], offset: u64, crc: u32) -> Part<'a> {
        Part { bytes, offset, crc, own_checksum: false, checked: std::sync::OnceLock::new() }
    }

    /// The same part, its bytes a structure whose own checksum covers every byte of it (a PTWV structure:
    /// header and body by its CRC, the trailer by the stored CRC and zero padding), which its parser checks:
    /// [`get`](Self::get) then does not compute the part table's checksum of the same bytes as well.
    pub(crate) fn with_own_checksum(self) -> Part<'a> {
        Part { own_checksum: true, ..self }
    }

    /// The part's bytes, once their checksum has been found right (or, for a part with its own checksum, for
    /// its parser to check).
    pub(crate) fn get(&self, what: &str) -> Result<&'a [u8], Damage> {
        if self.own_checksum || *self.checked.get_or_init(|| crc32(self.bytes) == self.crc) {
            Ok(self.bytes)
        } else {
            Err(Damage::new(self.offset, format!("{what} checksum mismatch")))
        }
    }

    /// A failure to read the part's structure, at the part's offset.
    pub(crate) fn damage(&self, what: &str, why: String) -> Damage {
        Damage::new(self.offset, format!("{what}: {why}"))
    }
}

/// A growable little-endian byte writer.
#[derive(Default, Debug)]
pub(crate) struct Out(Vec<u8>);

impl Out {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    /// Pads with zeros to a multiple of 8 bytes.
    pub(crate) fn align8(&mut self) {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
    pub(crate) fn into_inner(self) -> Vec<u8> {
        self.0
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

/// A bounds-checked little-endian reader; errors say what was being read and where.
#[derive(Clone, Debug)]
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes, without moving past them.
    pub(crate) fn peek(&self, n: usize) -> Result<&'a [u8], String> {
        self.clone().bytes(n)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
                format!("{n} bytes needed at byte {} of a {}-byte structure", self.pos, self.data.len())
            })?;
        let b = &self.data[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let b = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn align8(&mut self) -> Result<(), String> {
        let pad = (8 - self.pos % 8) % 8;
        let b = self.bytes(pad)?;
        if b.iter().any(|&x| x != 0) {
            return Err(format!("non-zero padding at byte {}", self.pos - pad));
        }
        Ok(())
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.data.len()
    }
}

/// How an index reads a packet's fields, the same when it is built and when a packet read through it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Packets are cut to this many bytes first (`u32::MAX`: not cut).
    pub snap: u32,
    /// Whether the trace's byte order is not the host's (a null header's address family is in the trace's).
    pub swapped: bool,
    /// Whether link types other than Ethernet have header fields (format 7 on).
    pub link_keys: bool,
}

impl Reading {
    /// The fields of `rec` as the index defines them.
    #[inline]
    pub(crate) fn fields<'a>(&self, rec: &Record<'a>) -> PacketFields<'a> {
        let data = &rec.data[..rec.data.len().min(self.snap as usize)];
        let f = PacketFields::new(rec.linktype, data, rec.wirelen, rec.ts_ns).swapped(self.swapped);
        if self.link_keys { f } else { f.ethernet_only() }
    }
}

/// Header flag: the trace's byte order is not the host's.
const FLAG_SWAPPED: u16 = 1;

/// What the index knows of its trace and of itself (the header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The format version (the encoder writes [`VERSION`] whatever this says).
    pub version: u16,
    /// Whether the trace's byte order is not the host's ([`Reading::swapped`]).
    pub swapped: bool,
    pub trace_len: u64,
    pub head_crc: u32,
    pub tail_crc: u32,
    /// 0 none, 1 gzip, 2 zstd, 3 lz4.
    pub compression: u8,
    /// Snapshot length the packets were cut to before their fields were read (`u32::MAX`: none).
    pub snap: u32,
    pub packets: u64,
    pub stream_len: u64,
    pub chunk_packets: u32,
    pub chunks: u32,
    pub dir_offset: u64,
    pub dir_len: u64,
    /// Offset in the capture stream of the damage that ended the indexing (`u64::MAX`: none).
    pub damage: u64,
    /// The trace's modification time, ns since the epoch (0: unknown).
    pub mtime_ns: u64,
}

impl Header {
    /// How this index reads packets' fields.
    pub(crate) fn reading(&self) -> Reading {
        Reading { snap: self.snap, swapped: self.swapped, link_keys: self.version >= 7 }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        o.bytes(&MAGIC);
        o.u16(VERSION);
        o.u16(if self.swapped { FLAG_SWAPPED } else { 0 });
        o.u32(HEADER_LEN as u32);
        o.u64(self.trace_len);
        o.u32(self.head_crc);
        o.u32(self.tail_crc);
        o.u8(self.compression);
        o.bytes(&[0; 3]);
        o.u32(self.snap);
        o.u64(self.packets);
        o.u64(self.stream_len);
        o.u32(self.chunk_packets);
        o.u32(self.chunks);
        o.u64(self.dir_offset);
        o.u64(self.dir_len);
        o.u64(self.damage);
        o.u64(self.mtime_ns);
        let crc = crc32(&o.0);
        o.u32(crc);
        debug_assert_eq!(o.len(), HEADER_LEN);
        o.into_inner()
    }

    /// Reads a header.
    pub(crate) fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        if b.len() < 8 || b[..4] != MAGIC {
            return Err(HeaderError::Foreign("no PTIX magic at its start".into()));
        }
        let mut c = Cursor::new(b);
        let ver = |c: &mut Cursor<'_>| -> Result<u16, String> {
            c.bytes(4)?;
            c.u16()
        };
        let version = ver(&mut c).map_err(HeaderError::Foreign)?;
        if !(OLDEST_READ..=VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        if b.len() < HEADER_LEN {
            return Err(HeaderError::Damaged(format!("the header needs {HEADER_LEN} bytes, the file has {}", b.len())));
        }
        let stored = u32::from_le_bytes([b[HEADER_LEN - 4], b[HEADER_LEN - 3], b[HEADER_LEN - 2], b[HEADER_LEN - 1]]);
        if crc32(&b[..HEADER_LEN - 4]) != stored {
            return Err(HeaderError::Damaged("header checksum mismatch".into()));
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        let parse = || -> Result<Header, String> {
            if flags & !FLAG_SWAPPED != 0 {
                return Err(format!("unknown header flags {flags:#06x}"));
            }
            let mut c = Cursor::new(&b[8..HEADER_LEN]);
            let header_len = c.u32()?;
            if header_len as usize != HEADER_LEN {
                return Err(format!("header length {header_len}, expected {HEADER_LEN}"));
            }
            let trace_len = c.u64()?;
            let head_crc = c.u32()?;
            let tail_crc = c.u32()?;
            let compression = c.u8()?;
            c.bytes(3)?;
            let h = Header {
                version,
                swapped: flags & FLAG_SWAPPED != 0,
                trace_len,
                head_crc,
                tail_crc,
                compression,
                snap: c.u32()?,
                packets: c.u64()?,
                stream_len: c.u64()?,
                chunk_packets: c.u32()?,
                chunks: c.u32()?,
                dir_offset: c.u64()?,
                dir_len: c.u64()?,
                damage: c.u64()?,
                mtime_ns: c.u64()?,
            };
            if h.compression > 3 {
                return Err(format!("unknown compression code {}", h.compression));
            }
            if h.chunk_packets == 0 || !h.chunk_packets.is_multiple_of(PAGE as u32) {
                return Err(format!("chunk size {} is not a positive multiple of {PAGE}", h.chunk_packets));
            }
            if u64::from(h.chunks) != h.packets.div_ceil(u64::from(h.chunk_packets)) {
                return Err(format!("{} chunks cannot hold {} packets", h.chunks, h.packets));
            }
            Ok(h)
        };
        parse().map_err(HeaderError::Damaged)
    }
}

/// Why a header was refused.
#[derive(Debug)]
pub(crate) enum HeaderError {
    /// Not an index.
    Foreign(String),
    /// An index of another format version.
    Version(u16),
    /// An index whose header is damaged.
    Damaged(String),
}

/// Packets per offset block: the index keeps the offset of every block's first record (Elias-Fano coded), and a
/// packet is read by walking from its block's first record: 16 keeps that walk within about one 4 KiB read on
/// traces of a few hundred bytes a packet.
pub const BLOCK: usize = 16;
/// Packets per time page: the index keeps every page's earliest and latest timestamp.
pub const PAGE: usize = 1024;

/// Packs unsigned values of a fixed bit width, least significant bit first.
pub(crate) struct BitPacker {
    bits: u32,
    out: Vec<u8>,
    acc: u64,
    fill: u32,
}

impl BitPacker {
    /// A packer of `bits`-bit values (at most 56).
    pub(crate) fn new(bits: u32) -> BitPacker {
        debug_assert!(bits <= 56);
        BitPacker { bits, out: Vec::new(), acc: 0, fill: 0 }
    }

    pub(crate) fn push(&mut self, v: u64) {
        debug_assert!(self.bits == 64 || v >> self.bits == 0);
        self.acc |= v << self.fill;
        self.fill += self.bits;
        while self.fill >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.fill -= 8;
        }
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        if self.fill > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// Bytes of `n` packed `bits`-bit values.
pub(crate) fn packed_len(n: usize, bits: u32) -> usize {
    (n * bits as usize).div_ceil(8)
}

/// `len` values of `bits` bits (at most 56) packed by [`BitPacker`], read in place: each by one unaligned
/// 8-byte load, with no data-dependent branch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed<'a> {
    bytes: &'a [u8],
    bits: u32,
    len: usize,
}

impl<'a> Packed<'a> {
    /// The values in `bytes`, which must hold `packed_len(len, bits)` bytes (the caller took exactly those).
    pub(crate) fn new(bytes: &'a [u8], bits: u32, len: usize) -> Packed<'a> {
        Packed { bytes, bits, len }
    }

    /// Value `i` (0 past the end).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u64 {
        if i >= self.len || self.bits == 0 {
            return 0;
        }
        let bit = i * self.bits as usize;
        let (byte, shift) = (bit / 8, bit % 8);
        let word = match self.bytes.get(byte..byte + 8) {
            Some(w) => u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
            None => {
                let mut w = [0u8; 8];
                let tail = self.bytes.get(byte..).unwrap_or(&[]);
                let k = tail.len().min(8);
                w[..k].copy_from_slice(&tail[..k]);
                u64::from_le_bytes(w)
            }
        };
        (word >> shift) & (u64::MAX >> (64 - self.bits))
    }

    /// The values from `i` on, in order: one 8-byte load per value, no bounds check past the first.
    pub(crate) fn iter_from(&self, i: usize) -> impl Iterator<Item = u64> + '_ {
        let (bits, bytes) = (self.bits as usize, self.bytes);
        let mask = if self.bits == 0 { 0 } else { u64::MAX >> (64 - self.bits) };
        let from = i.min(self.len);
        // Values whose 8-byte load stays inside the bytes; the last few (all of them for 0-bit values) go
        // through `get`.
        let fast_end = (bytes.len().saturating_sub(8) * 8).checked_div(bits).map_or(from, |e| e.min(self.len));
        (from..fast_end.max(from))
            .map(move |j| {
                let bit = j * bits;
                let w = &bytes[bit / 8..bit / 8 + 8];
                (u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) >> (bit % 8)) & mask
            })
            .chain((fast_end.max(from)..self.len).map(move |j| self.get(j)))
    }
}

/// Bits needed to write every value up to `max`.
pub(crate) fn bits_for(max: u64) -> u32 {
    64 - max.leading_zeros()
}

/// A set of small integers (keys of a chunk) as a bitset: eight times smaller than a `Vec<bool>`, which matters
/// to a cold query (every fresh page of memory costs a page fault).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeySet {
    words: Vec<u64>,
    len: usize,
}

impl KeySet {
    /// The empty set (`full`: every member) over `0..len`.
    pub(crate) fn new(len: usize, full: bool) -> KeySet {
        let mut words = vec![if full { u64::MAX } else { 0 }; len.div_ceil(64)];
        if full
            && !len.is_multiple_of(64)
            && let Some(w) = words.last_mut()
        {
            *w = u64::MAX >> (64 - len % 64);
        }
        KeySet { words, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn contains(&self, i: usize) -> bool {
        i < self.len && self.words[i / 64] >> (i % 64) & 1 == 1
    }

    #[inline]
    pub(crate) fn insert(&mut self, i: usize) {
        if i < self.len {
            self.words[i / 64] |= 1 << (i % 64);
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, i: usize) {
        if i < self.len {
            self.words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// `self ∩ other` (`and`) or `self ∪ other`.
    pub(crate) fn combine(&mut self, other: &KeySet, and: bool) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            if and { *a &= *b } else { *a |= *b }
        }
    }

    /// `self \ other`.
    pub(crate) fn subtract(&mut self, other: &KeySet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !*b;
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The members, ascending (a set of a few keys among many costs a test per empty word).
    pub(crate) fn iter(&self) -> Members<'_> {
        Members { words: &self.words, at: 0, word: self.words.first().copied().unwrap_or(0) }
    }
}

/// The members of a [`KeySet`], ascending.
#[derive(Debug)]
pub(crate) struct Members<'a> {
    words: &'a [u64],
    /// The word `word` holds what is left of.
    at: usize,
    word: u64,
}

impl Iterator for Members<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.word == 0 {
            self.at += 1;
            self.word = *self.words.get(self.at)?;
        }
        let b = self.word.trailing_zeros() as usize;
        self.word &= self.word - 1;
        Some(self.at * 64 + b)
    }
}

/// Low bits per element of an Elias-Fano code of `m` elements below `universe`.
fn ef_low_bits(universe: u64, m: usize) -> u32 {
    if m == 0 || universe <= m as u64 { 0 } else { 63 - (universe / m as u64).leading_zeros() }
}

/// Writes the non-decreasing `values` (each below `universe`) Elias-Fano coded: about `2 + log2(universe / m)`
/// bits each.
///
/// ```text
/// ef := m:u64 universe:u64 low_bits:u32 zero:u32
///       low: ⌈m·low_bits/8⌉ bytes, every value's low bits packed LSB first; zero padding to 8
///       high: PTWV RsBitVector of m + (universe >> low_bits) + 1 bits, bit (value_i >> low_bits) + i set
/// ```
pub(crate) fn write_ef(out: &mut Out, values: &[u64], universe: u64) {
    use pcaptool_wavelet::{BuildBitVector, Encode, RsBitVector, RsParams};
    let m = values.len();
    let low_bits = ef_low_bits(universe, m);
    out.u64(m as u64);
    out.u64(universe);
    out.u32(low_bits);
    out.u32(0);
    let mask = if low_bits == 0 { 0 } else { u64::MAX >> (64 - low_bits) };
    let mut p = BitPacker::new(low_bits);
    values.iter().for_each(|&v| p.push(v & mask));
    out.bytes(&p.finish());
    out.align8();
    let high_len = m + (universe >> low_bits) as usize + 1;
    let mut words = vec![0u64; high_len.div_ceil(64)];
    for (i, &v) in values.iter().enumerate() {
        debug_assert!(v < universe.max(1) && (i == 0 || values[i - 1] <= v));
        let pos = (v >> low_bits) as usize + i;
        words[pos / 64] |= 1 << (pos % 64);
    }
    out.bytes(&RsBitVector::build(words, high_len, RsParams { rate: 8, store_directories: false }).to_bytes());
}

/// An Elias-Fano coded sequence (see [`write_ef`]), read in place: any element by one `select`, all of them in one
/// pass.
#[derive(Debug)]
pub(crate) struct EliasFano<'a> {
    m: usize,
    universe: u64,
    low_bits: u32,
    low: Packed<'a>,
    high: pcaptool_wavelet::RsBitVector<pcaptool_wavelet::LeBytes<'a>>,
}

impl<'a> EliasFano<'a> {
    /// Reads a sequence written by [`write_ef`] from the cursor, checking its shape (an element read from a
    /// damaged sequence may be anything up to `universe`, never past it).
    pub(crate) fn read(c: &mut Cursor<'a>) -> Result<EliasFano<'a>, String> {
        use pcaptool_wavelet::{BitVector, RsBitVector};
        let m = usize::try_from(c.u64()?).map_err(|_| "too many elements")?;
        let universe = c.u64()?;
        let low_bits = c.u32()?;
        c.u32()?;
        if low_bits != ef_low_bits(universe, m) {
            return Err(format!("{low_bits} low bits for {m} elements below {universe}"));
        }
        let low = Packed::new(c.bytes(packed_len(m, low_bits))?, low_bits, m);
        c.align8()?;
        // The high bits are a PTWV structure: 16-byte header (its body length at byte 8), body, 8-byte trailer.
        let body = c.peek(16)?;
        let body_len = usize::try_from(u64::from_le_bytes(body[8..16].try_into().map_err(|_| "header")?))
            .map_err(|_| "high bits too long")?;
        let blob = c.bytes(body_len.checked_add(24).ok_or("high bits too long")?)?;
        let high = RsBitVector::from_bytes(blob).map_err(|e| format!("Elias-Fano high bits: {e}"))?;
        let want = m.checked_add((universe >> low_bits) as usize).and_then(|x| x.checked_add(1));
        if high.count_ones() != m || Some(high.len()) != want {
            return Err("Elias-Fano high bits do not match the elements".into());
        }
        Ok(EliasFano { m, universe, low_bits, low, high })
    }

    /// Elements.
    pub(crate) fn len(&self) -> usize {
        self.m
    }

    /// Element `i` (`i < len`), at most `universe - 1`.
    pub(crate) fn get(&self, i: usize) -> u64 {
        use pcaptool_wavelet::BitVector;
        let high = self.high.select1(i).map_or(0, |p| p.saturating_sub(i)) as u64;
        (high << self.low_bits | self.low.get(i)).min(self.universe.saturating_sub(1))
    }

    /// Every element, in order, in one pass.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let max = self.universe.saturating_sub(1);
        self.high
            .ones()
            .take(self.m)
            .zip(self.low.iter_from(0))
            .enumerate()
            .map(move |(i, (bit, low))| (((bit - i) as u64) << self.low_bits | low).min(max))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn elias_fano_reads_back(mut values in prop::collection::vec(0u64..5000, 0..300), extra in 1u64..3000) {
            values.sort_unstable();
            let universe = values.last().map_or(1, |&v| v + extra);
            let mut o = Out::default();
            write_ef(&mut o, &values, universe);
            o.u32(7); // what follows the sequence is left to the caller
            let bytes = o.into_inner();
            let mut c = Cursor::new(&bytes);
            let ef = EliasFano::read(&mut c).unwrap();
            prop_assert_eq!(c.u32().unwrap(), 7);
            prop_assert_eq!(ef.len(), values.len());
            for (i, &v) in values.iter().enumerate() {
                prop_assert_eq!(ef.get(i), v);
            }
            prop_assert_eq!(ef.iter().collect::<Vec<_>>(), values);
        }

        #[test]
        fn key_sets_are_sets(members in prop::collection::vec(0usize..700, 0..100), other in prop::collection::vec(0usize..700, 0..100), len in 0usize..700) {
            let set = |m: &[usize]| {
                let mut s = KeySet::new(len, false);
                m.iter().for_each(|&i| s.insert(i));
                s
            };
            let model = |m: &[usize]| -> std::collections::BTreeSet<usize> { m.iter().copied().filter(|&i| i < len).collect() };
            let (a, b) = (set(&members), set(&other));
            prop_assert_eq!(a.iter().collect::<Vec<_>>(), model(&members).into_iter().collect::<Vec<_>>(), "ascending");
            prop_assert_eq!(a.count(), model(&members).len());
            let mut and = a.clone();
            and.combine(&b, true);
            prop_assert_eq!(and.iter().collect::<std::collections::BTreeSet<_>>(), &model(&members) & &model(&other));
            let mut or = a.clone();
            or.combine(&b, false);
            prop_assert_eq!(or.iter().collect::<std::collections::BTreeSet<_>>(), &model(&members) | &model(&other));
            let mut minus = a.clone();
            minus.subtract(&b);
            prop_assert_eq!(minus.iter().collect::<std::collections::BTreeSet<_>>(), &model(&members) - &model(&other));
            prop_assert_eq!(KeySet::new(len, true).count(), len);
            prop_assert!((0..len).all(|i| a.contains(i) == model(&members).contains(&i)));
        }
    }

    #[test]
    fn elias_fano_refuses_a_wrong_shape() {
        let mut o = Out::default();
        write_ef(&mut o, &[3, 9, 9, 40], 41);
        let bytes = o.into_inner();
        assert!(EliasFano::read(&mut Cursor::new(&bytes)).is_ok());
        let mut bad = bytes.clone();
        bad[0] = 5; // five elements
        assert!(EliasFano::read(&mut Cursor::new(&bad)).is_err());
        let mut bad = bytes;
        bad[16] ^= 1; // other low bits
        assert!(EliasFano::read(&mut Cursor::new(&bad)).is_err());
    }
}
