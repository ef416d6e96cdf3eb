//! A plain bit vector with sampled rank and select directories (González et al.'s "RG", the paper's default).
//!
//! Rank: a cumulative count every `rate` words; for `rate <= 8` also the in-block counts of each word (rank9's
//! layout: rank is two sample loads and one popcount), for larger rates popcounts of at most `rate - 1` words.
//! Select: the rank samples
//! are binary-searched between hints kept every 4096 ones (and zeros). Space: `n` bits plus `n / rate` bits of rank
//! samples (`rate` = 8: 25%, `rate` = 16: 6.25%) plus 2 words per 4096 ones and zeros.
//!
//! A loaded bit vector borrows its bits and holds its directories in memory: a loader computes them from the bits
//! in one pass (which is what checking stored ones costs), and compares them with the stored ones when the file
//! has them. A file can leave them out ([`RsParams::store_directories`]): it is then only the bits.

use std::io::{self, Write};

use crate::bits::{BitBuf, read_bits, select_in_word};
use crate::error::Error;
use crate::format::{BitVectorCodec, DecodeBitVector, Reader, Writer, array_words, kind};
use crate::rank_select::{BitVector, BuildBitVector};
use crate::words::{LeBytes, Words};

/// Every this many ones (zeros) a select hint is kept.
const SELECT_SAMPLE: usize = 4096;

/// Parameters of [`RsBitVector`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RsParams {
    /// Words per rank sample: a power of two from 1 to 64 (the paper's RG sampling factor counts 32-bit words;
    /// here 64-bit). Space overhead of the rank samples is `1/rate`.
    pub rate: usize,
    /// Whether a written file holds the directories (kind 1) or only the bits (kind 5: smaller by the directories'
    /// share, and loading costs the same one pass either way).
    pub store_directories: bool,
}

impl Default for RsParams {
    fn default() -> RsParams {
        RsParams { rate: 8, store_directories: true }
    }
}

impl RsParams {
    /// `rate` words per rank sample, directories stored.
    pub fn with_rate(rate: usize) -> RsParams {
        RsParams { rate, ..RsParams::default() }
    }
}

/// A plain bit vector with rank/select directories, over owned words or borrowed bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsBitVector<W = Vec<u64>> {
    len: usize,
    ones: usize,
    rate: usize,
    /// `log2(rate)`: block index = word index >> shift (no division on the query path).
    shift: u32,
    /// Whether a written file holds the directories.
    store_directories: bool,
    bits: W,
    /// Per block of `rate` words: the ones before it (and, when `rate <= 8`, a second word packing the ones
    /// before each word of the block, 9 bits each: rank9's layout, no popcount loop); one more block at the end.
    samples: Vec<u64>,
    /// `hints1[t]` = index of the rank sample block holding the `(t * SELECT_SAMPLE)`-th one.
    hints1: Vec<u64>,
    /// Same for zeros.
    hints0: Vec<u64>,
}

/// Words [`RsBitVector`]'s `select_after` scans before it answers with a select instead.
const SCAN_AFTER_WORDS: usize = 8;

/// Words per rank sample: 2 (absolute count, packed in-block counts) when `rate <= 8`, else 1.
#[inline(always)]
fn stride(rate: usize) -> usize {
    if rate <= 8 { 2 } else { 1 }
}

/// Where the directory values of a bit vector go, in order: rank sample words, select1 hints, select0 hints. A
/// sink returns `false` to stop the walk (a stored directory that differs).
trait DirSink {
    fn sample(&mut self, v: u64) -> bool;
    fn hint1(&mut self, block: u64) -> bool;
    fn hint0(&mut self, block: u64) -> bool;
}

/// Directories being built.
#[derive(Default)]
struct Build {
    samples: Vec<u64>,
    hints1: Vec<u64>,
    hints0: Vec<u64>,
}

impl DirSink for Build {
    fn sample(&mut self, v: u64) -> bool {
        self.samples.push(v);
        true
    }
    fn hint1(&mut self, block: u64) -> bool {
        self.hints1.push(block);
        true
    }
    fn hint0(&mut self, block: u64) -> bool {
        self.hints0.push(block);
        true
    }
}

/// Walks the directories of `bits` (`len` bits, `rate` words per sample) in order into `out`; returns the number
/// of ones, or `None` when `out` stopped the walk.
fn walk_directories(bits: &impl Words, len: usize, rate: usize, out: &mut impl DirSink) -> Option<usize> {
    let nwords = bits.num_words();
    let nblocks = nwords.div_ceil(rate);
    let st = stride(rate);
    let (mut hints1, mut hints0) = (0usize, 0usize);
    let mut ones = 0usize;
    for b in 0..nblocks {
        if !out.sample(ones as u64) {
            return None;
        }
        let zeros_before = (b * rate * 64).min(len) - ones;
        let mut block_ones = 0;
        let mut sub = 0u64;
        if st == 2 {
            for (j, w) in (b * rate..((b + 1) * rate).min(nwords)).enumerate() {
                if j > 0 {
                    sub |= (block_ones as u64) << (9 * (j - 1));
                }
                block_ones += bits.word(w).count_ones() as usize;
            }
        } else {
            block_ones = bits.count_ones_in(b * rate, ((b + 1) * rate).min(nwords));
        }
        if st == 2 {
            // Past the last word of a short final block the in-block count stays the block's total, so that
            // rank(len) works when `len` ends that block.
            let present = ((b + 1) * rate).min(nwords) - b * rate;
            for j in present.max(1)..rate {
                sub |= (block_ones as u64) << (9 * (j - 1));
            }
            if !out.sample(sub) {
                return None;
            }
        }
        let block_bits = (((b + 1) * rate * 64).min(len)).saturating_sub(b * rate * 64);
        let block_zeros = block_bits - block_ones;
        // Hints for every multiple of SELECT_SAMPLE that falls inside this block.
        while hints1 * SELECT_SAMPLE < ones + block_ones {
            hints1 += 1;
            if !out.hint1(b as u64) {
                return None;
            }
        }
        while hints0 * SELECT_SAMPLE < zeros_before + block_zeros {
            hints0 += 1;
            if !out.hint0(b as u64) {
                return None;
            }
        }
        ones += block_ones;
    }
    if !out.sample(ones as u64) || (st == 2 && !out.sample(0)) {
        return None;
    }
    Some(ones)
}

fn directories(bits: &impl Words, len: usize, rate: usize) -> (Vec<u64>, Vec<u64>, Vec<u64>, usize) {
    let mut d = Build::default();
    let ones = walk_directories(bits, len, rate, &mut d).unwrap_or(0);
    (d.samples, d.hints1, d.hints0, ones)
}

impl BuildBitVector for RsBitVector {
    type Params = RsParams;

    fn build(words: Vec<u64>, len: usize, params: RsParams) -> RsBitVector {
        assert!(params.rate.is_power_of_two() && params.rate <= 64, "rate must be a power of two from 1 to 64 words");
        assert_eq!(words.len(), len.div_ceil(64), "words and length disagree");
        let (samples, hints1, hints0, ones) = directories(&words, len, params.rate);
        RsBitVector {
            len,
            ones,
            rate: params.rate,
            shift: params.rate.trailing_zeros(),
            store_directories: params.store_directories,
            bits: words,
            samples,
            hints1,
            hints0,
        }
    }
}

impl RsBitVector {
    /// Builds from bits with the default parameters.
    pub fn from_bits(bits: impl IntoIterator<Item = bool>) -> RsBitVector {
        let (words, len) = BitBuf::from_bits(bits).into_parts();
        RsBitVector::build(words, len, RsParams::default())
    }
}

impl<W: Words> RsBitVector<W> {
    /// Words per rank sample.
    pub fn rate(&self) -> usize {
        self.rate
    }

    #[inline]
    fn word(&self, i: usize) -> u64 {
        self.bits.word(i)
    }

    /// The positions of the ones, in increasing order (one pass over the words: cheaper than a `select1` per one
    /// when all are wanted).
    pub fn ones(&self) -> Ones<'_, W> {
        Ones { bv: self, word: 0, bits: if self.bits.num_words() > 0 { self.word(0) } else { 0 } }
    }

    /// Ones in the words before word `w`.
    #[inline(always)]
    fn ones_before_word(&self, w: usize) -> usize {
        let b = w >> self.shift;
        if self.rate <= 8 {
            // rank9: the in-block count of the words before `w` is packed in the second sample word.
            let j = w - (b << self.shift);
            let abs = self.samples.word(2 * b) as usize;
            if j == 0 { abs } else { abs + (self.samples.word(2 * b + 1) >> (9 * (j - 1)) & 0x1ff) as usize }
        } else {
            let mut r = self.samples.word(b) as usize;
            for j in b << self.shift..w {
                r += self.word(j).count_ones() as usize;
            }
            r
        }
    }

    /// Binary search in the rank samples for the block holding the k-th one (ones = true) or zero.
    #[inline]
    fn find_block(&self, k: usize, ones: bool) -> usize {
        let hints = if ones { &self.hints1 } else { &self.hints0 };
        let t = k / SELECT_SAMPLE;
        let mut lo = hints.word(t) as usize;
        let st = stride(self.rate);
        let mut hi =
            if t + 1 < hints.num_words() { hints.word(t + 1) as usize + 1 } else { self.samples.num_words() / st - 1 };
        // Invariant: count_before(lo) <= k < count_before(hi).
        let count_before = |b: usize| -> usize {
            let s = self.samples.word(b * st) as usize;
            if ones { s } else { (b * self.rate * 64).min(self.len) - s }
        };
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if count_before(mid) <= k {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn select(&self, k: usize, ones: bool) -> Option<usize> {
        let total = if ones { self.ones } else { self.len - self.ones };
        if k >= total {
            return None;
        }
        let b = self.find_block(k, ones);
        let s = self.samples.word(b * stride(self.rate)) as usize;
        let mut rem = k - if ones { s } else { b * self.rate * 64 - s };
        let mut w = b * self.rate;
        loop {
            let x = if ones { self.word(w) } else { !self.word(w) };
            let c = x.count_ones() as usize;
            if rem < c {
                return Some(w * 64 + select_in_word(x, rem as u32) as usize);
            }
            rem -= c;
            w += 1;
        }
    }
}

/// Iterator over the positions of the ones of an [`RsBitVector`], from [`RsBitVector::ones`].
#[derive(Debug)]
pub struct Ones<'a, W> {
    bv: &'a RsBitVector<W>,
    word: usize,
    bits: u64,
}

impl<W: Words> Iterator for Ones<'_, W> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.bits == 0 {
            self.word += 1;
            if self.word >= self.bv.bits.num_words() {
                return None;
            }
            self.bits = self.bv.word(self.word);
        }
        let b = self.bits.trailing_zeros() as usize;
        self.bits &= self.bits - 1;
        Some(self.word * 64 + b)
    }
}

impl<W: Words> BitVector for RsBitVector<W> {
    fn len(&self) -> usize {
        self.len
    }

    fn count_ones(&self) -> usize {
        self.ones
    }

    #[inline]
    fn access(&self, i: usize) -> bool {
        assert!(i < self.len, "access({i}) on {} bits", self.len);
        self.word(i / 64) >> (i % 64) & 1 == 1
    }

    #[inline]
    fn rank1(&self, i: usize) -> usize {
        assert!(i <= self.len, "rank1({i}) on {} bits", self.len);
        let w = i / 64;
        let bit = i % 64;
        let partial = if bit > 0 { (self.word(w) & ((1u64 << bit) - 1)).count_ones() as usize } else { 0 };
        self.ones_before_word(w) + partial
    }

    #[inline]
    fn access_rank1(&self, i: usize) -> (bool, usize) {
        assert!(i < self.len, "access({i}) on {} bits", self.len);
        let w = i / 64;
        let x = self.word(w);
        let bit = i % 64;
        let r = self.ones_before_word(w) + (x & ((1u64 << bit) - 1)).count_ones() as usize;
        (x >> bit & 1 == 1, r)
    }

    fn select1(&self, k: usize) -> Option<usize> {
        self.select(k, true)
    }

    fn select0(&self, k: usize) -> Option<usize> {
        self.select(k, false)
    }

    /// Scans at most 8 words forward from `at`, then falls back to a select.
    fn select_after(&self, ones: bool, j: usize, at: usize, k: usize) -> Option<usize> {
        let nwords = self.bits.num_words();
        if j >= k || at >= self.len {
            return self.select(k, ones);
        }
        let mut rem = k - j;
        let mut w = at / 64;
        let word = |w: usize| if ones { self.word(w) } else { !self.word(w) };
        // The bits after `at` in its word.
        let mut x = if at % 64 == 63 { 0 } else { word(w) & (!0u64 << (at % 64 + 1)) };
        for _ in 0..SCAN_AFTER_WORDS {
            let c = x.count_ones() as usize;
            if rem <= c {
                let p = w * 64 + select_in_word(x, (rem - 1) as u32) as usize;
                // Past `len` only zeros of the last word's padding can be found: those are not bits.
                return if p < self.len { Some(p) } else { None };
            }
            rem -= c;
            w += 1;
            if w >= nwords {
                return None;
            }
            x = word(w);
        }
        self.select(k, ones)
    }

    /// One pass forward for a run of ascending arguments: the word under the last answer stays in hand, so
    /// consecutive occurrences cost a `trailing_zeros` each; a gap of more than 8 words is a select from the
    /// directories, and the pass goes on from its answer.
    fn select_run(&self, ones: bool, cursor: (usize, usize), ks: &mut [usize]) -> Option<(usize, usize)> {
        let nwords = self.bits.num_words();
        let word = |w: usize| if ones { self.word(w) } else { !self.word(w) };
        // The bits of word `w` after position `p`.
        let after = |w: usize, p: usize| if p % 64 == 63 { 0 } else { word(w) & (!0u64 << (p % 64 + 1)) };
        let (mut j, mut at) = cursor;
        // `x`: the bits of word `w` after the cursor's answer, when there is one.
        let mut held = at != usize::MAX && at < self.len;
        let (mut w, mut x) = if held { (at / 64, after(at / 64, at)) } else { (0, 0) };
        for k in ks.iter_mut() {
            let q = 'found: {
                if held && j < *k {
                    let mut rem = *k - j;
                    for _ in 0..SCAN_AFTER_WORDS {
                        let c = x.count_ones() as usize;
                        if rem <= c {
                            let b = if rem == 1 { x.trailing_zeros() } else { select_in_word(x, (rem - 1) as u32) };
                            let p = w * 64 + b as usize;
                            // Past `len` only zeros of the last word's padding can be found: those are not bits.
                            if p >= self.len {
                                return None;
                            }
                            x &= if b == 63 { 0 } else { !0u64 << (b + 1) };
                            break 'found p;
                        }
                        rem -= c;
                        w += 1;
                        if w >= nwords {
                            return None;
                        }
                        x = word(w);
                    }
                }
                let p = self.select(*k, ones)?;
                (w, x, held) = (p / 64, after(p / 64, p), true);
                p
            };
            (j, at) = (*k, q);
            *k = q;
        }
        Some((j, at))
    }

    fn bits(&self, l: usize, r: usize) -> BitBuf {
        assert!(l <= r && r <= self.len, "bits({l}, {r}) on {} bits", self.len);
        let mut out = BitBuf::with_capacity(r - l);
        let mut i = l;
        while i < r {
            let k = (r - i).min(64) as u32;
            out.push_bits(read_bits(&self.bits, i, k), k);
            i += k as usize;
        }
        out
    }

    fn size_in_bytes(&self) -> usize {
        self.bits.size_in_bytes()
            + self.samples.size_in_bytes()
            + self.hints1.size_in_bytes()
            + self.hints0.size_in_bytes()
            + 4 * 8
    }
}

impl<W: Words> BitVectorCodec for RsBitVector<W> {
    fn kind(&self) -> u64 {
        if self.store_directories { kind::RS_BIT_VECTOR } else { kind::RS_BIT_VECTOR_BARE }
    }

    fn encoded_words(&self) -> u64 {
        let dirs = if self.store_directories {
            array_words(self.samples.len()) + array_words(self.hints1.len()) + array_words(self.hints0.len())
        } else {
            0
        };
        3 + array_words(self.bits.num_words()) + dirs
    }

    fn encode_into<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        w.word(self.len as u64)?;
        w.word(self.rate as u64)?;
        w.word(self.ones as u64)?;
        w.array((0..self.bits.num_words()).map(|i| self.bits.word(i)), self.bits.num_words())?;
        if self.store_directories {
            for a in [&self.samples, &self.hints1, &self.hints0] {
                w.array(a.iter().copied(), a.len())?;
            }
        }
        Ok(())
    }
}

impl<'a> DecodeBitVector<'a> for RsBitVector<LeBytes<'a>> {
    const KINDS: &'static [u64] = &[kind::RS_BIT_VECTOR, kind::RS_BIT_VECTOR_BARE];
    fn decode_nested(r: &mut Reader<'a>, kind: u64) -> Result<Self, Error> {
        RsBitVector::decode(r, kind)
    }
}

impl<'a> RsBitVector<LeBytes<'a>> {
    /// Loads a file written by [`Encode::write_to`](crate::Encode::write_to), validating every field: the bits are
    /// borrowed, the directories computed from them (and compared with the stored ones when the file has them).
    pub fn from_bytes(bytes: &'a [u8]) -> Result<RsBitVector<LeBytes<'a>>, Error> {
        let (mut r, kind) = Reader::open_any(bytes, <Self as DecodeBitVector<'a>>::KINDS)?;
        let v = RsBitVector::decode(&mut r, kind)?;
        r.finish()?;
        Ok(v)
    }

    pub(crate) fn decode(r: &mut Reader<'a>, kind: u64) -> Result<RsBitVector<LeBytes<'a>>, Error> {
        let at = r.offset();
        let len = r.count("bit length", u64::MAX)?;
        let rate = r.count("rate", 64)?;
        let ones = r.count("ones", len as u64)?;
        let bits = r.array("bits")?;
        let store_directories = kind == kind::RS_BIT_VECTOR;
        let stored = if store_directories {
            Some([r.array("rank samples")?, r.array("select1 hints")?, r.array("select0 hints")?])
        } else {
            None
        };
        let bad = |what, why| Error::Invalid { what, offset: at, why };
        if !rate.is_power_of_two() {
            return Err(bad("rate", "not a power of two"));
        }
        if bits.num_words() != len.div_ceil(64) {
            return Err(bad("bits", "word count does not match the bit length"));
        }
        if len % 64 != 0 && bits.word(bits.num_words() - 1) >> (len % 64) != 0 {
            return Err(bad("bits", "bits set past the end"));
        }
        // One pass computes the directories; stored ones must be exactly these.
        let (samples, hints1, hints0, n1) = directories(&bits, len, rate);
        if n1 != ones {
            return Err(bad("ones", "does not match the bits"));
        }
        if let Some(stored) = stored {
            let same = |s: &LeBytes<'_>, v: &[u64]| s.num_words() == v.len() && (0..v.len()).all(|i| s.word(i) == v[i]);
            if !(same(&stored[0], &samples) && same(&stored[1], &hints1) && same(&stored[2], &hints0)) {
                return Err(bad("directories", "rank samples or select hints do not match the bits"));
            }
        }
        Ok(RsBitVector {
            len,
            ones,
            rate,
            shift: rate.trailing_zeros(),
            store_directories,
            bits,
            samples,
            hints1,
            hints0,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Encode;
    use proptest::prelude::*;

    pub(crate) fn check<B: BitVector>(b: &B, bits: &[bool]) {
        assert_eq!(b.len(), bits.len());
        let n = bits.len();
        for (l, r) in [(0, n), (n / 3, n - n / 4), (n / 2, n / 2), (n.saturating_sub(1), n), (n / 7, n / 7 + 130)] {
            let r = r.min(n);
            let got = b.bits(l, r);
            assert_eq!(got.len(), r - l, "bits({l}, {r})");
            assert!((l..r).all(|i| got.get(i - l) == bits[i]), "bits({l}, {r})");
        }
        let ones: Vec<usize> = (0..bits.len()).filter(|&i| bits[i]).collect();
        let zeros: Vec<usize> = (0..bits.len()).filter(|&i| !bits[i]).collect();
        assert_eq!(b.count_ones(), ones.len());
        let mut r = 0;
        for i in 0..=bits.len() {
            assert_eq!(b.rank1(i), r, "rank1({i})");
            assert_eq!(b.rank0(i), i - r, "rank0({i})");
            if i < bits.len() {
                assert_eq!(b.access(i), bits[i]);
                assert_eq!(b.access_rank1(i), (bits[i], r), "access_rank1({i})");
                r += usize::from(bits[i]);
            }
        }
        for (k, &p) in ones.iter().enumerate() {
            assert_eq!(b.select1(k), Some(p), "select1({k})");
        }
        for (k, &p) in zeros.iter().enumerate() {
            assert_eq!(b.select0(k), Some(p), "select0({k})");
        }
        assert_eq!(b.select1(ones.len()), None);
        assert_eq!(b.select0(zeros.len()), None);
        // select_after from every earlier one (zero) at a few distances, past the end included.
        for (is_one, list) in [(true, &ones), (false, &zeros)] {
            for (j, &at) in list.iter().enumerate() {
                for d in [1, 2, 3, 64, 700, 5000] {
                    let k = j + d;
                    assert_eq!(
                        b.select_after(is_one, j, at, k),
                        list.get(k).copied(),
                        "select_after({is_one}, {j}, {at}, {k})"
                    );
                }
            }
            // select_run over runs of arguments with steps from 1 to past the scan's reach, from no cursor and
            // from a cursor; its answers and its returned cursor as select's, or None when one is missing.
            for (start, step) in [(0, 1), (1, 2), (3, 65), (0, 600), (list.len() / 2, 1), (list.len() / 3, 7)] {
                let ks: Vec<usize> = (0..40).map(|i| start + i * step).collect();
                let earlier = start.checked_sub(1).and_then(|j| list.get(j).map(|&at| (j, at)));
                for cur in [(0, usize::MAX)].into_iter().chain(earlier) {
                    let mut got = ks.clone();
                    let end = b.select_run(is_one, cur, &mut got);
                    let want: Option<Vec<usize>> = ks.iter().map(|&k| list.get(k).copied()).collect();
                    match want {
                        Some(want) => {
                            assert_eq!(got, want, "select_run({is_one}, {cur:?}, {ks:?})");
                            assert_eq!(end, Some((ks[39], want[39])));
                        }
                        None => assert_eq!(end, None, "select_run({is_one}, {cur:?}, {ks:?})"),
                    }
                }
            }
        }
    }

    pub(crate) fn bits_strategy() -> impl Strategy<Value = Vec<bool>> {
        prop_oneof![
            proptest::collection::vec(any::<bool>(), 0..3000),
            (0usize..20_000, 0u32..100).prop_map(|(n, density)| {
                let mut x = 0x1234_5678u64 ^ n as u64;
                (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % 100) < u64::from(density)
                    })
                    .collect()
            }),
        ]
    }

    proptest! {
        #[test]
        fn matches_naive_model(bits in bits_strategy(), rate_log in 0u32..=6, store_directories: bool) {
            let rate = 1usize << rate_log;
            let (words, len) = BitBuf::from_bits(bits.iter().copied()).into_parts();
            let b = RsBitVector::build(words, len, RsParams { rate, store_directories });
            check(&b, &bits);
            let bytes = b.to_bytes();
            let dirs = 8 * (b.samples.len() + b.hints1.len() + b.hints0.len() + 3);
            prop_assert_eq!(bytes.len(), 24 + 8 * (3 + 1 + b.bits.len()) + if store_directories { dirs } else { 0 });
            let v = RsBitVector::from_bytes(&bytes).unwrap();
            check(&v, &bits);
            prop_assert_eq!(v.size_in_bytes(), b.size_in_bytes());
            // A loaded vector is written back as it was read.
            prop_assert_eq!(&v.to_bytes(), &bytes);
            let ones: Vec<usize> = (0..bits.len()).filter(|&i| bits[i]).collect();
            prop_assert_eq!(v.ones().collect::<Vec<_>>(), ones);
        }
    }

    #[test]
    fn edge_cases() {
        for n in [0usize, 1, 63, 64, 65, 4095, 4096, 4097, 70_000] {
            check(&RsBitVector::from_bits(vec![false; n]), &vec![false; n]);
            check(&RsBitVector::from_bits(vec![true; n]), &vec![true; n]);
        }
    }

    #[test]
    fn corrupt_bytes_are_errors() {
        for store_directories in [true, false] {
            let (words, len) = BitBuf::from_bits((0..10_000).map(|i| i % 3 == 0)).into_parts();
            let b = RsBitVector::build(words, len, RsParams { rate: 8, store_directories });
            let bytes = b.to_bytes();
            for i in 0..bytes.len() {
                let mut c = bytes.clone();
                c[i] ^= 0x10;
                assert!(RsBitVector::from_bytes(&c).is_err(), "flip at {i} accepted");
            }
            for cut in 0..bytes.len() {
                assert!(RsBitVector::from_bytes(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn wrong_stored_directories_are_refused_and_bare_counts_are_checked() {
        use crate::fuzz_harness::{body_of, seal};
        let (words, len) = BitBuf::from_bits((0..10_000).map(|i| i % 3 == 0)).into_parts();
        let full = RsBitVector::build(words.clone(), len, RsParams::with_rate(8)).to_bytes();
        // Body: len, rate, ones, bits array (length word then words), then the rank samples array.
        let mut body = body_of(&full).to_vec();
        let sample1 = 8 * (3 + 1 + words.len() + 1 + 2);
        body[sample1] ^= 1;
        let e = RsBitVector::from_bytes(&seal(kind::RS_BIT_VECTOR as u16, &body)).unwrap_err();
        assert!(e.to_string().contains("directories"), "{e}");
        let bare = RsBitVector::build(words, len, RsParams { rate: 8, store_directories: false }).to_bytes();
        let mut body = body_of(&bare).to_vec();
        body[16] ^= 1; // ones
        let e = RsBitVector::from_bytes(&seal(kind::RS_BIT_VECTOR_BARE as u16, &body)).unwrap_err();
        assert!(e.to_string().contains("ones"), "{e}");
    }
}
