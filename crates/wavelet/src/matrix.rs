//! The wavelet matrix: the balanced wavelet structure over `u32` symbols, one level per bit of the largest symbol.
//! Level `l` holds bit `w-1-l` of every symbol in the order the previous levels sorted them (zeros first, stably).
//!
//! All levels are concatenated in one bit vector (level `l` at `[l·n, (l+1)·n)`); per level the ones before it and
//! its number of zeros are kept.

use std::io::{self, Write};

use crate::BitBuf;
use crate::error::Error;
use crate::format::{BitVectorCodec, DecodeBitVector, Encode, Reader, Writer, array_words, kind};
use crate::rank_select::{BitVector, BuildBitVector};
use crate::words::{LeBytes, Words};

/// A wavelet matrix generic over its bit vector `B` and word storage `W`.
#[derive(Clone, Debug)]
pub struct WaveletMatrix<B = crate::RsBitVector, W = Vec<u64>> {
    n: usize,
    width: u32,
    bv: B,
    /// Per level: ones before the level, zeros in the level.
    meta: W,
}

impl<B: BuildBitVector> WaveletMatrix<B> {
    /// Builds from a sequence with the bit vector's default parameters.
    pub fn from_symbols(symbols: impl IntoIterator<Item = u32>) -> WaveletMatrix<B> {
        WaveletMatrix::build(symbols, B::Params::default())
    }

    /// Builds in time `O(n·w)`; extra memory is two `u32` per symbol.
    pub fn build(symbols: impl IntoIterator<Item = u32>, params: B::Params) -> WaveletMatrix<B> {
        let mut cur: Vec<u32> = symbols.into_iter().collect();
        let n = cur.len();
        let max = cur.iter().copied().max().unwrap_or(0);
        let width = (32 - max.leading_zeros()).max(1);
        let mut bits = BitBuf::with_capacity(n * width as usize);
        let mut meta = Vec::with_capacity(2 * width as usize);
        let mut ones_total = 0u64;
        let mut zeros_v = Vec::with_capacity(n);
        let mut ones_v = Vec::with_capacity(n);
        for l in 0..width {
            let shift = width - 1 - l;
            // Branch-free: bits gathered a word at a time, every symbol written to both sides and kept by the
            // side its bit chooses (the bits are data, so branches on them mispredict half the time).
            zeros_v.clear();
            ones_v.clear();
            zeros_v.resize(cur.len(), 0);
            ones_v.resize(cur.len(), 0);
            let (mut zn, mut on) = (0usize, 0usize);
            for part in cur.chunks(64) {
                let mut word = 0u64;
                for (i, &s) in part.iter().enumerate() {
                    let bit = (s >> shift & 1) as usize;
                    word |= (bit as u64) << i;
                    zeros_v[zn] = s;
                    ones_v[on] = s;
                    zn += bit ^ 1;
                    on += bit;
                }
                bits.push_bits(word, part.len() as u32);
            }
            zeros_v.truncate(zn);
            ones_v.truncate(on);
            meta.push(ones_total);
            meta.push(zeros_v.len() as u64);
            ones_total += ones_v.len() as u64;
            cur.clear();
            cur.extend_from_slice(&zeros_v);
            cur.extend_from_slice(&ones_v);
        }
        let (words, len) = bits.into_parts();
        WaveletMatrix { n, width, bv: B::build(words, len, params), meta }
    }
}

impl<B: BitVector, W: Words> WaveletMatrix<B, W> {
    /// Length of the sequence.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Levels: the bit width of the largest symbol (at least 1).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Bytes used.
    pub fn size_in_bytes(&self) -> usize {
        self.bv.size_in_bytes() + self.meta.size_in_bytes() + 16
    }

    #[inline(always)]
    fn ones_before(&self, l: u32) -> usize {
        self.meta.word(2 * l as usize) as usize
    }

    #[inline(always)]
    fn zeros(&self, l: u32) -> usize {
        self.meta.word(2 * l as usize + 1) as usize
    }

    #[inline(always)]
    fn rank1_at(&self, l: u32, i: usize) -> usize {
        self.bv.rank1(l as usize * self.n + i) - self.ones_before(l)
    }

    /// The symbol at position `i` (panics when `i >= len`).
    pub fn access(&self, mut i: usize) -> u32 {
        assert!(i < self.n, "access({i}) on a sequence of {}", self.n);
        let mut c = 0u32;
        for l in 0..self.width {
            let (bit, r) = self.bv.access_rank1(l as usize * self.n + i);
            let r1 = r - self.ones_before(l);
            c <<= 1;
            if bit {
                c |= 1;
                i = self.zeros(l) + r1;
            } else {
                i -= r1;
            }
        }
        c
    }

    /// Start of the range of symbol `c` at the bottom level, and the end for prefix `[0, i)`.
    fn descend(&self, c: u32, mut s: usize, mut e: usize) -> (usize, usize) {
        for l in 0..self.width {
            let bit = c >> (self.width - 1 - l) & 1 == 1;
            let (rs, re) = (self.rank1_at(l, s), self.rank1_at(l, e));
            if bit {
                s = self.zeros(l) + rs;
                e = self.zeros(l) + re;
            } else {
                s -= rs;
                e -= re;
            }
        }
        (s, e)
    }

    fn fits(&self, c: u32) -> bool {
        self.width >= 32 || c >> self.width == 0
    }

    /// Occurrences of `c` in `[0, i)` (panics when `i > len`).
    pub fn rank(&self, c: u32, i: usize) -> usize {
        assert!(i <= self.n, "rank(_, {i}) on a sequence of {}", self.n);
        if !self.fits(c) || self.n == 0 {
            return 0;
        }
        let (s, e) = self.descend(c, 0, i);
        e - s
    }

    /// Occurrences of `c` in the whole sequence.
    pub fn count(&self, c: u32) -> usize {
        self.rank(c, self.n)
    }

    /// Occurrences of every symbol below `limit` (entry `c` for symbol `c`), in one walk of the matrix as a trie:
    /// two ranks per node with occurrences, instead of one descent per symbol.
    pub fn counts_below(&self, limit: u32) -> Vec<usize> {
        let mut out = vec![0usize; limit as usize];
        if self.n == 0 || limit == 0 {
            return out;
        }
        // (level, prefix, range start, range end): the symbols with this prefix occupy [s, e) at this level.
        let mut stack = vec![(0u32, 0u64, 0usize, self.n)];
        while let Some((l, prefix, s, e)) = stack.pop() {
            if s == e {
                continue;
            }
            let rest = self.width - l;
            if prefix << rest >= u64::from(limit) {
                continue;
            }
            if l == self.width {
                out[prefix as usize] += e - s;
                continue;
            }
            let (rs, re) = (self.rank1_at(l, s), self.rank1_at(l, e));
            stack.push((l + 1, prefix << 1, s - rs, e - re));
            stack.push((l + 1, prefix << 1 | 1, self.zeros(l) + rs, self.zeros(l) + re));
        }
        out
    }

    /// Position of the `k`-th occurrence of `c` (from 0).
    pub fn select(&self, c: u32, k: usize) -> Option<usize> {
        if !self.fits(c) || self.n == 0 {
            return None;
        }
        let (s, e) = self.descend(c, 0, self.n);
        if k >= e - s {
            return None;
        }
        let mut pos = s + k;
        for l in (0..self.width).rev() {
            let bit = c >> (self.width - 1 - l) & 1 == 1;
            let base = l as usize * self.n;
            pos = if bit {
                self.bv.select1(self.ones_before(l) + pos - self.zeros(l))
            } else {
                self.bv.select0(base - self.ones_before(l) + pos)
            }
            .expect("the occurrence exists")
                - base;
        }
        Some(pos)
    }

    /// Positions of `c` in `[l, r)`, one `select` each.
    pub fn positions(&self, c: u32, l: usize, r: usize) -> impl ExactSizeIterator<Item = usize> + '_ {
        let r = r.min(self.n);
        let l = l.min(r);
        let (k0, k1) = (self.rank(c, l), self.rank(c, r));
        (k0..k1).map(move |k| self.select(c, k).expect("within the count"))
    }

    /// Positions in `[l, r)` whose symbol is below `x`.
    fn count_less(&self, mut l: usize, mut r: usize, x: u64) -> usize {
        if x >= 1u64 << self.width {
            return r - l;
        }
        let mut total = 0;
        for lv in 0..self.width {
            let bit = x >> (self.width - 1 - lv) & 1 == 1;
            let (rl, rr) = (self.rank1_at(lv, l), self.rank1_at(lv, r));
            if bit {
                total += (r - l) - (rr - rl);
                l = self.zeros(lv) + rl;
                r = self.zeros(lv) + rr;
            } else {
                l -= rl;
                r -= rr;
            }
        }
        total
    }

    /// Number of positions in `[l, r)` whose symbol lies in `[c1, c2]`.
    pub fn count_range(&self, l: usize, r: usize, c1: u32, c2: u32) -> usize {
        let r = r.min(self.n);
        if l >= r || c1 > c2 {
            return 0;
        }
        self.count_less(l, r, u64::from(c2) + 1) - self.count_less(l, r, u64::from(c1))
    }
}

impl<B: BitVectorCodec, W: Words> Encode for WaveletMatrix<B, W> {
    fn body_words(&self) -> u64 {
        3 + self.bv.encoded_words() + array_words(self.meta.num_words())
    }

    fn encode_body<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        w.word(self.n as u64)?;
        w.word(u64::from(self.width))?;
        w.word(BitVectorCodec::kind(&self.bv))?;
        self.bv.encode_into(w)?;
        w.array((0..self.meta.num_words()).map(|i| self.meta.word(i)), self.meta.num_words())
    }

    fn kind(&self) -> u64 {
        kind::WAVELET_MATRIX
    }
}

impl<'a, B: BitVector + DecodeBitVector<'a>> WaveletMatrix<B, LeBytes<'a>> {
    /// Loads a file written by [`Encode::write_to`] without copying its arrays (the directories of an
    /// [`RsBitVector`](crate::RsBitVector) are computed), validating every field.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<WaveletMatrix<B, LeBytes<'a>>, Error> {
        let mut r = Reader::open(bytes, kind::WAVELET_MATRIX)?;
        let at = r.offset();
        let n = r.count("sequence length", u64::MAX)?;
        let width = r.count("width", 32)? as u32;
        let k = r.word("bit vector kind")?;
        if !B::KINDS.contains(&k) {
            return Err(Error::Kind { found: k, expected: B::KINDS[0] });
        }
        let bv = B::decode_nested(&mut r, k)?;
        let meta = r.array("level table")?;
        r.finish()?;
        let bad = |why| Error::Invalid { what: "wavelet matrix", offset: at, why };
        if width == 0 {
            return Err(bad("zero levels"));
        }
        if n.checked_mul(width as usize) != Some(bv.len()) || meta.num_words() != 2 * width as usize {
            return Err(bad("bit vector or level table size does not match length and width"));
        }
        for l in 0..width as usize {
            let ob = bv.rank1(l * n);
            let ones = bv.rank1((l + 1) * n) - ob;
            if meta.word(2 * l) != ob as u64 || meta.word(2 * l + 1) != (n - ones) as u64 {
                return Err(bad("level table does not match the bits"));
            }
        }
        Ok(WaveletMatrix { n, width, bv, meta })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RrrBitVector, RsBitVector};
    use proptest::prelude::*;

    fn check<B: BitVector, W: Words>(wm: &WaveletMatrix<B, W>, seq: &[u32]) {
        assert_eq!(wm.len(), seq.len());
        for (i, &s) in seq.iter().enumerate() {
            assert_eq!(wm.access(i), s);
        }
        let limit = seq.iter().copied().max().unwrap_or(0).saturating_add(3).min(1 << 16);
        let counts = wm.counts_below(limit);
        for (c, &n) in counts.iter().enumerate() {
            assert_eq!(n, seq.iter().filter(|&&s| s as usize == c).count(), "counts_below: symbol {c}");
        }
        let mut distinct: Vec<u32> = seq.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        for c in distinct.iter().copied().chain([0, 3, u32::MAX]) {
            let occ: Vec<usize> = (0..seq.len()).filter(|&i| seq[i] == c).collect();
            for i in (0..=seq.len()).step_by((seq.len() / 40).max(1)) {
                assert_eq!(wm.rank(c, i), occ.iter().filter(|&&p| p < i).count());
            }
            for (k, &p) in occ.iter().enumerate() {
                assert_eq!(wm.select(c, k), Some(p));
            }
            assert_eq!(wm.select(c, occ.len()), None);
            let (l, r) = (seq.len() / 4, seq.len() * 3 / 4);
            let want: Vec<usize> = occ.iter().copied().filter(|&p| p >= l && p < r).collect();
            assert_eq!(wm.positions(c, l, r).collect::<Vec<_>>(), want);
        }
        for (c1, c2) in [(0, u32::MAX), (0, 10), (7, 7), (1000, 2_000_000), (u32::MAX, u32::MAX)] {
            let want = seq.iter().filter(|&&x| x >= c1 && x <= c2).count();
            assert_eq!(wm.count_range(0, seq.len(), c1, c2), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_naive_model(seq in prop_oneof![
            proptest::collection::vec(0u32..16, 0..400),
            proptest::collection::vec(any::<u32>(), 0..200),
            (any::<u32>(), 0usize..100).prop_map(|(s, n)| vec![s; n]),
        ]) {
            let wm = WaveletMatrix::<RsBitVector>::from_symbols(seq.iter().copied());
            check(&wm, &seq);
            let bytes = wm.to_bytes();
            check(&WaveletMatrix::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&bytes).unwrap(), &seq);
            let wr = WaveletMatrix::<RrrBitVector>::from_symbols(seq.iter().copied());
            check(&wr, &seq);
            let bytes = wr.to_bytes();
            check(&WaveletMatrix::<RrrBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&bytes).unwrap(), &seq);
        }
    }
}
