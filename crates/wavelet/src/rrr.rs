//! A compressed bit vector (Raman, Raman and Rao): blocks of `b` bits stored as a class (their popcount) and an
//! offset (their rank among the blocks of that class), about `n·H0(B) + o(n)` bits.
//!
//! Every `sample` blocks a sample holds the ones before the block and the bit position of its offset, so access
//! and rank decode at most `sample` classes and one block; select binary-searches the samples first. In memory
//! (not in the file) every [`FINE`] blocks within a sample also hold both, relative to the sample, computed when
//! the vector is built or loaded, so that access and rank walk fewer than [`FINE`] classes whatever the sample
//! rate the file chose for its size.

use std::io::{self, Write};

use crate::bits::{BitBuf, read_bits, select_in_word};
use crate::error::Error;
use crate::format::{BitVectorCodec, DecodeBitVector, Reader, Writer, array_words, kind};
use crate::rank_select::{BitVector, BuildBitVector};
use crate::words::{LeBytes, Words};

const fn binomials() -> [[u64; 65]; 65] {
    let mut c = [[0u64; 65]; 65];
    let mut n = 0;
    while n <= 64 {
        c[n][0] = 1;
        let mut k = 1;
        while k <= n {
            c[n][k] = c[n - 1][k - 1].wrapping_add(if k < n { c[n - 1][k] } else { 0 });
            k += 1;
        }
        n += 1;
    }
    c
}

/// `BINOM[n][k]` = C(n, k) for n ≤ 64 (C(64, 32) < 2^64).
static BINOM: [[u64; 65]; 65] = binomials();

/// Bits needed for an offset of a block of `b` bits holding `c` ones: ⌈log2 C(b, c)⌉.
fn offset_width(b: u32, c: u32) -> u32 {
    let v = BINOM[b as usize][c as usize];
    if v <= 1 { 0 } else { 64 - (v - 1).leading_zeros() }
}

/// The rank of block `x` (b bits, c ones) among all such blocks: Σ C(p_i, i) over its set bits p_1 < … < p_c.
fn encode_block(x: u64) -> u64 {
    let mut off = 0;
    let mut i = 1;
    let mut w = x;
    while w != 0 {
        let p = w.trailing_zeros() as usize;
        off += BINOM[p][i];
        i += 1;
        w &= w - 1;
    }
    off
}

/// Inverse of [`encode_block`].
fn decode_block(b: u32, c: u32, mut off: u64) -> u64 {
    let mut x = 0u64;
    let mut p = b as usize;
    let mut i = c as usize;
    while i > 0 {
        // Largest p' < p with C(p', i) <= off.
        p -= 1;
        while BINOM[p][i] > off {
            p -= 1;
        }
        off -= BINOM[p][i];
        x |= 1 << p;
        i -= 1;
    }
    x
}

/// Bit `k` of the block of `b` bits with `c` ones whose offset is `off`, and its ones below `k`: the ones are
/// decoded from the top as [`decode_block`] does, stopping once the walk passes below `k`.
fn bit_and_rank_in_block(b: u32, c: u32, mut off: u64, k: u32) -> (bool, u32) {
    let (mut p, k, mut i) = (b as usize, k as usize, c as usize);
    while i > 0 {
        // Largest p' < p with C(p', i) <= off, searched no lower than k.
        loop {
            if p <= k {
                // The remaining ones all lie below k (position k was passed without one).
                return (false, i as u32);
            }
            p -= 1;
            if BINOM[p][i] <= off {
                break;
            }
        }
        if p == k {
            return (true, i as u32 - 1);
        }
        off -= BINOM[p][i];
        i -= 1;
    }
    (false, 0)
}

/// Parameters of [`RrrBitVector`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RrrParams {
    /// Bits per block, 1 to 63 (larger compresses better and decodes slower).
    pub block: u32,
    /// Blocks per sample.
    pub sample: u32,
}

impl Default for RrrParams {
    fn default() -> RrrParams {
        RrrParams { block: 31, sample: 32 }
    }
}

/// Blocks between the in-memory directory's entries (2 bits a block of memory).
const FINE: usize = 16;

/// The in-memory directory: for every [`FINE`]-th block of each sample, the ones and offset bits from the sample's
/// start to the block (16 bits each, `ones | bits << 16`); empty when samples are at most 32 blocks apart (the
/// default: a walk is short anyway) or span too many bits for 16.
fn fine_directory(nblocks: usize, block: u32, sample: u32, mut class: impl FnMut(usize) -> u32) -> Vec<u32> {
    let sr = sample as usize;
    if sr * block as usize >= 1 << 16 || sr <= 32 {
        return Vec::new();
    }
    let per = sr.div_ceil(FINE);
    let mut fine = Vec::with_capacity(nblocks.div_ceil(sr) * per);
    let (mut ones, mut bits) = (0u32, 0u32);
    for blk in 0..nblocks {
        let k = blk % sr;
        if k == 0 {
            (ones, bits) = (0, 0);
        }
        if k.is_multiple_of(FINE) {
            fine.push(ones | bits << 16);
        }
        let c = class(blk);
        ones += c;
        bits += offset_width(block, c);
    }
    fine
}

/// An RRR-compressed bit vector over owned words or borrowed bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RrrBitVector<W = Vec<u64>> {
    len: usize,
    ones: usize,
    block: u32,
    sample: u32,
    class_width: u32,
    /// Packed classes, `class_width` bits each.
    classes: W,
    /// Packed offsets, variable width.
    offsets: W,
    /// Per sample: ones before it, then the bit position of its first offset (two words per sample).
    samples: W,
    /// See [`fine_directory`].
    fine: Vec<u32>,
}

fn class_width(b: u32) -> u32 {
    32 - b.leading_zeros()
}

impl BuildBitVector for RrrBitVector {
    type Params = RrrParams;

    fn build(words: Vec<u64>, len: usize, p: RrrParams) -> RrrBitVector {
        assert!((1..=63).contains(&p.block), "block size must be 1 to 63 bits");
        assert!(p.sample >= 1, "sample must be at least 1 block");
        assert_eq!(words.len(), len.div_ceil(64), "words and length disagree");
        let b = p.block;
        let cw = class_width(b);
        let nblocks = len.div_ceil(b as usize);
        let mut classes = BitBuf::with_capacity(nblocks * cw as usize);
        let mut offsets = BitBuf::new();
        let mut samples = Vec::with_capacity(2 * (nblocks / p.sample as usize + 1));
        let mut ones = 0usize;
        let src = &words;
        for blk in 0..nblocks {
            if blk % p.sample as usize == 0 {
                samples.push(ones as u64);
                samples.push(offsets.len() as u64);
            }
            let start = blk * b as usize;
            let width = (b as usize).min(len - start) as u32;
            let x = read_bits(src, start, width);
            let c = x.count_ones();
            classes.push_bits(u64::from(c), cw);
            offsets.push_bits(encode_block(x), offset_width(b, c));
            ones += c as usize;
        }
        // A final sample so that every block has a sample at or before it and rank(len) works.
        samples.push(ones as u64);
        samples.push(offsets.len() as u64);
        let (classes, _) = classes.into_parts();
        let (offsets, _) = offsets.into_parts();
        let fine = fine_directory(nblocks, b, p.sample, |blk| read_bits(&classes, blk * cw as usize, cw) as u32);
        RrrBitVector { len, ones, block: b, sample: p.sample, class_width: cw, classes, offsets, samples, fine }
    }
}

impl RrrBitVector {
    /// Builds from bits with the default parameters.
    pub fn from_bits(bits: impl IntoIterator<Item = bool>) -> RrrBitVector {
        let (words, len) = BitBuf::from_bits(bits).into_parts();
        RrrBitVector::build(words, len, RrrParams::default())
    }
}

impl<W: Words> RrrBitVector<W> {
    /// The parameters it was built with.
    pub fn params(&self) -> RrrParams {
        RrrParams { block: self.block, sample: self.sample }
    }

    #[inline]
    fn class(&self, blk: usize) -> u32 {
        read_bits(&self.classes, blk * self.class_width as usize, self.class_width) as u32
    }

    /// Ones before block `blk` and the bit position of its offset.
    #[inline]
    fn locate(&self, blk: usize) -> (usize, usize) {
        let sr = self.sample as usize;
        let s = blk / sr;
        let mut ones = self.samples.word(2 * s) as usize;
        let mut pos = self.samples.word(2 * s + 1) as usize;
        let mut from = s * sr;
        let k = (blk - from) / FINE;
        // (No entry for `blk` = the block count, when that starts a stretch: the walk from the sample is exact.)
        if let Some(&f) = self.fine.get(s * sr.div_ceil(FINE) + k).filter(|_| k > 0) {
            ones += (f & 0xffff) as usize;
            pos += (f >> 16) as usize;
            from += k * FINE;
        }
        for j in from..blk {
            let c = self.class(j);
            ones += c as usize;
            pos += offset_width(self.block, c) as usize;
        }
        (ones, pos)
    }

    /// Ones before position `i` (< len) and bit `i`, decoding only what lies above `i` in its block.
    #[inline]
    fn rank_at(&self, i: usize) -> (usize, bool) {
        let b = self.block as usize;
        let blk = i / b;
        let (ones, pos) = self.locate(blk);
        let c = self.class(blk);
        let off = read_bits(&self.offsets, pos, offset_width(self.block, c));
        let (bit, below) = bit_and_rank_in_block(self.block, c, off, (i % b) as u32);
        (ones + below as usize, bit)
    }

    fn select(&self, k: usize, ones: bool) -> Option<usize> {
        let total = if ones { self.ones } else { self.len - self.ones };
        if k >= total {
            return None;
        }
        let b = self.block as usize;
        let sr = self.sample as usize;
        let nsamples = self.samples.num_words() / 2;
        let before = |s: usize| -> usize {
            let o = self.samples.word(2 * s) as usize;
            if ones { o } else { (s * sr * b).min(self.len) - o }
        };
        // Last sample with before(s) <= k.
        let (mut lo, mut hi) = (0, nsamples);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if before(mid) <= k {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let mut rem = k - before(lo);
        let mut pos = self.samples.word(2 * lo + 1) as usize;
        let mut blk = lo * sr;
        loop {
            let c = self.class(blk);
            let width = (b.min(self.len - blk * b)) as u32;
            let cnt = if ones { c as usize } else { width as usize - c as usize };
            let w = offset_width(self.block, c);
            if rem < cnt {
                let x = decode_block(self.block, c, read_bits(&self.offsets, pos, w));
                let x = if ones { x } else { !x & ((1u64 << width) - 1) };
                return Some(blk * b + select_in_word(x, rem as u32) as usize);
            }
            rem -= cnt;
            pos += w as usize;
            blk += 1;
        }
    }
}

impl<W: Words> BitVector for RrrBitVector<W> {
    fn len(&self) -> usize {
        self.len
    }

    fn count_ones(&self) -> usize {
        self.ones
    }

    fn access(&self, i: usize) -> bool {
        assert!(i < self.len, "access({i}) on {} bits", self.len);
        self.rank_at(i).1
    }

    fn rank1(&self, i: usize) -> usize {
        assert!(i <= self.len, "rank1({i}) on {} bits", self.len);
        if i == self.len {
            return self.ones;
        }
        self.rank_at(i).0
    }

    fn access_rank1(&self, i: usize) -> (bool, usize) {
        assert!(i < self.len, "access({i}) on {} bits", self.len);
        let (rank, bit) = self.rank_at(i);
        (bit, rank)
    }

    fn select1(&self, k: usize) -> Option<usize> {
        self.select(k, true)
    }

    fn select0(&self, k: usize) -> Option<usize> {
        self.select(k, false)
    }

    fn bits(&self, l: usize, r: usize) -> BitBuf {
        assert!(l <= r && r <= self.len, "bits({l}, {r}) on {} bits", self.len);
        let mut out = BitBuf::with_capacity(r - l);
        if l == r {
            return out;
        }
        // One lookup for the first block, then the blocks in order, each decoded once.
        let b = self.block as usize;
        let mut blk = l / b;
        let mut pos = self.locate(blk).1;
        let mut i = l;
        while i < r {
            let c = self.class(blk);
            let w = offset_width(self.block, c);
            let x = decode_block(self.block, c, read_bits(&self.offsets, pos, w));
            pos += w as usize;
            let (from, to) = (i - blk * b, (r - blk * b).min(b));
            out.push_bits(x >> from, (to - from) as u32);
            i = blk * b + to;
            blk += 1;
        }
        out
    }

    fn size_in_bytes(&self) -> usize {
        self.classes.size_in_bytes()
            + self.offsets.size_in_bytes()
            + self.samples.size_in_bytes()
            + 4 * self.fine.len()
            + 5 * 8
    }
}

impl<W: Words> BitVectorCodec for RrrBitVector<W> {
    fn kind(&self) -> u64 {
        kind::RRR_BIT_VECTOR
    }

    fn encoded_words(&self) -> u64 {
        4 + array_words(self.classes.num_words())
            + array_words(self.offsets.num_words())
            + array_words(self.samples.num_words())
    }

    fn encode_into<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        w.word(self.len as u64)?;
        w.word(self.ones as u64)?;
        w.word(u64::from(self.block))?;
        w.word(u64::from(self.sample))?;
        for a in [&self.classes, &self.offsets, &self.samples] {
            w.array((0..a.num_words()).map(|i| a.word(i)), a.num_words())?;
        }
        Ok(())
    }
}

impl<'a> DecodeBitVector<'a> for RrrBitVector<LeBytes<'a>> {
    const KINDS: &'static [u64] = &[kind::RRR_BIT_VECTOR];
    fn decode_nested(r: &mut Reader<'a>, _kind: u64) -> Result<Self, Error> {
        RrrBitVector::decode(r)
    }
}

impl<'a> RrrBitVector<LeBytes<'a>> {
    /// Loads a file written by [`Encode::write_to`](crate::Encode::write_to) without copying, validating every field.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<RrrBitVector<LeBytes<'a>>, Error> {
        let mut r = Reader::open(bytes, kind::RRR_BIT_VECTOR)?;
        let v = RrrBitVector::decode(&mut r)?;
        r.finish()?;
        Ok(v)
    }

    pub(crate) fn decode(r: &mut Reader<'a>) -> Result<RrrBitVector<LeBytes<'a>>, Error> {
        let at = r.offset();
        let len = r.count("bit length", u64::MAX)?;
        let ones = r.count("ones", len as u64)?;
        let block = r.count("block size", 63)? as u32;
        let sample = r.count("sample rate", u64::from(u32::MAX))? as u32;
        let classes = r.array("classes")?;
        let offsets = r.array("offsets")?;
        let samples = r.array("samples")?;
        let bad = |what, why| Error::Invalid { what, offset: at, why };
        if block == 0 || sample == 0 {
            return Err(bad("block size or sample rate", "zero"));
        }
        let cw = class_width(block);
        let nblocks = len.div_ceil(block as usize);
        let class_bits = nblocks.checked_mul(cw as usize).ok_or(bad("bit length", "too large"))?;
        if classes.num_words() != class_bits.div_ceil(64) {
            return Err(bad("classes", "word count does not match the bit length"));
        }
        let nsamples = nblocks.div_ceil(sample as usize) + 1;
        if samples.num_words() != 2 * nsamples {
            return Err(bad("samples", "count does not match the bit length"));
        }
        // Walk every block: classes in range, offsets in range and inside the offset bits, samples exact.
        let total_offset_bits = offsets.num_words() * 64;
        let (mut n1, mut pos) = (0usize, 0usize);
        for blk in 0..=nblocks {
            if blk % sample as usize == 0 || blk == nblocks {
                let s = if blk == nblocks { nsamples - 1 } else { blk / sample as usize };
                if samples.word(2 * s) != n1 as u64 || samples.word(2 * s + 1) != pos as u64 {
                    return Err(bad("samples", "do not match the blocks"));
                }
            }
            if blk == nblocks {
                break;
            }
            let c = read_bits(&classes, blk * cw as usize, cw) as u32;
            let width = (block as usize).min(len - blk * block as usize) as u32;
            if c > width {
                return Err(bad("classes", "a class exceeds its block's width"));
            }
            let w = offset_width(block, c);
            if pos + w as usize > total_offset_bits {
                return Err(bad("offsets", "shorter than the classes need"));
            }
            let off = read_bits(&offsets, pos, w);
            if off >= BINOM[block as usize][c as usize] {
                return Err(bad("offsets", "an offset exceeds its class"));
            }
            if width < block && decode_block(block, c, off) >> width != 0 {
                return Err(bad("offsets", "the last block has bits past the end"));
            }
            n1 += c as usize;
            pos += w as usize;
        }
        if n1 != ones {
            return Err(bad("ones", "does not match the classes"));
        }
        if offsets.num_words() != pos.div_ceil(64) {
            return Err(bad("offsets", "longer than the classes need"));
        }
        let fine = fine_directory(nblocks, block, sample, |blk| read_bits(&classes, blk * cw as usize, cw) as u32);
        Ok(RrrBitVector { len, ones, block, sample, class_width: cw, classes, offsets, samples, fine })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encode;
    use proptest::prelude::*;

    #[test]
    fn block_codes_round_trip() {
        for b in [1u32, 2, 7, 15, 31, 63] {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..500 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let v = x & ((1u64 << b) - 1);
                let c = v.count_ones();
                let off = encode_block(v);
                assert!(off < BINOM[b as usize][c as usize]);
                assert_eq!(decode_block(b, c, off), v);
                for k in 0..b {
                    let below = (v & ((1u64 << k) - 1)).count_ones();
                    assert_eq!(bit_and_rank_in_block(b, c, off, k), (v >> k & 1 == 1, below), "block {v:#x}, bit {k}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn matches_naive_model(bits in crate::rs::tests::bits_strategy(), block in 1u32..=63, sample in prop_oneof![1u32..40, 60u32..70, 1030u32..1045]) {
            let (words, len) = BitBuf::from_bits(bits.iter().copied()).into_parts();
            let b = RrrBitVector::build(words, len, RrrParams { block, sample });
            crate::rs::tests::check(&b, &bits);
            let bytes = b.to_bytes();
            let v = RrrBitVector::from_bytes(&bytes).unwrap();
            crate::rs::tests::check(&v, &bits);
        }
    }

    #[test]
    fn compresses_sparse_bits() {
        let bits: Vec<bool> = (0..1_000_000).map(|i| i % 97 == 0).collect();
        let r = RrrBitVector::from_bits(bits.iter().copied());
        let plain = crate::RsBitVector::from_bits(bits.iter().copied());
        assert!(r.size_in_bytes() * 3 < plain.size_in_bytes(), "{} vs {}", r.size_in_bytes(), plain.size_in_bytes());
    }

    #[test]
    fn corrupt_bytes_are_errors() {
        let b = RrrBitVector::from_bits((0..5000).map(|i| i % 7 == 0 || i % 11 == 0));
        let bytes = b.to_bytes();
        for i in 0..bytes.len() {
            let mut c = bytes.clone();
            c[i] ^= 0x04;
            assert!(RrrBitVector::from_bytes(&c).is_err(), "flip at {i} accepted");
        }
    }
}
