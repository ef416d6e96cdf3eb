//! The Huffman-shaped wavelet tree, laid out as a wavelet matrix (Claude, Navarro and Ordóñez): each symbol's path
//! is a Huffman code of its frequency, so a sequence of `n` symbols costs about `n·(H0 + ε)` bits of bit vectors
//! (less with [`RrrBitVector`](crate::RrrBitVector)), and frequent symbols are answered in few levels.
//!
//! Level `d` holds bit `d` of the code of every element whose code is longer than `d`, in wavelet-matrix order.
//! The codes are assigned so that the elements whose code ends at a level sort after all others at the next level
//! ([`matrix_codes`](crate::huffman::matrix_codes)); the next level then simply covers fewer positions, and no node
//! table is needed. Per symbol: its value, code, code length and the range its occurrences occupy at the level
//! where its code ends (its "slot"); per level: offset, length, ones before it and zeros in it.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::BitBuf;
use crate::error::Error;
use crate::format::{BitVectorCodec, DecodeBitVector, Encode, Reader, Writer, array_words, kind};
use crate::huffman::{code_lengths, matrix_codes};
use crate::rank_select::{BitVector, BuildBitVector};
use crate::words::{LeBytes, Words};

const MAX_DEPTH: usize = 64;
/// Largest number of distinct symbols (slot indices are 24 bits).
pub const MAX_SIGMA: usize = 1 << 24;
/// Largest sequence length (slot starts are 40 bits).
pub const MAX_LEN: usize = 1 << 40;

// Level table, LEVEL_WORDS words per level.
const LEVEL_WORDS: usize = 5;
const L_OFFSET: usize = 0; // bit offset of the level in the bit vector
const L_LEN: usize = 1; // elements at this level (n_d)
const L_ONES_BEFORE: usize = 2; // ones in the bit vector before the level
const L_ZEROS: usize = 3; // zeros in the level
const L_FIRST_SLOT: usize = 4; // index of the first slot of the codes ending at this level

/// Working memory for [`HuffmanWaveletTree::for_each_symbol_in`]: two arrays of positions, grown as needed.
#[derive(Clone, Debug, Default)]
pub struct DecodeScratch {
    at: Vec<u32>,
    next: Vec<u32>,
}

/// A Huffman-shaped wavelet tree over `u32` symbols, generic over its bit vector `B` and word storage `W`.
#[derive(Clone, Debug)]
pub struct HuffmanWaveletTree<B = crate::RsBitVector, W = Vec<u64>> {
    n: usize,
    bv: B,
    /// Per level: see `L_*`; one more entry at the end holds the total slot count in `L_FIRST_SLOT`.
    levels: W,
    /// Per symbol, sorted by value: `value | len << 32 | slot << 40`, then the code.
    syms: W,
    /// Per symbol in slot order (by level, then code order): `start << 24 | symbol index`; `start` is the first
    /// position of its occurrences at the level after its code ends.
    slots: W,
}

impl<B: BuildBitVector> HuffmanWaveletTree<B> {
    /// Builds from a sequence with the bit vector's default parameters.
    pub fn from_symbols(symbols: impl IntoIterator<Item = u32>) -> HuffmanWaveletTree<B> {
        HuffmanWaveletTree::build(symbols, B::Params::default())
    }

    /// Builds from a sequence in time linear in its total code length; extra memory is two `u32` per symbol.
    ///
    /// Panics if the sequence has more than 2^40 symbols or more than 2^24 distinct ones.
    pub fn build(symbols: impl IntoIterator<Item = u32>, params: B::Params) -> HuffmanWaveletTree<B> {
        let seq: Vec<u32> = symbols.into_iter().collect();
        let n = seq.len();
        assert!(n <= MAX_LEN, "sequence longer than 2^40");
        // Symbol counts: in an array when the symbols are small (the common case, and many times faster than
        // hashing every symbol), else in a map.
        let max = seq.iter().copied().max().unwrap_or(0) as usize;
        let dense = max <= 4 * n + 1024;
        let mut alphabet: Vec<(u32, u64)> = if dense {
            let mut freq = vec![0u64; max + 1];
            for &s in &seq {
                freq[s as usize] += 1;
            }
            freq.iter().enumerate().filter(|(_, c)| **c > 0).map(|(s, &c)| (s as u32, c)).collect()
        } else {
            let mut freq: HashMap<u32, u64> = HashMap::new();
            for &s in &seq {
                *freq.entry(s).or_default() += 1;
            }
            freq.into_iter().collect()
        };
        alphabet.sort_unstable();
        let sigma = alphabet.len();
        assert!(sigma <= MAX_SIGMA, "more than 2^24 distinct symbols");
        let counts: Vec<u64> = alphabet.iter().map(|a| a.1).collect();
        let lengths = code_lengths(&counts);
        assert!(lengths.iter().all(|&l| l as usize <= MAX_DEPTH), "Huffman code longer than 64 bits");
        let (codes, order) = matrix_codes(&lengths).expect("Huffman lengths form a complete code");
        let depth = lengths.iter().copied().max().unwrap_or(0) as usize;

        // Bits, level by level, with the wavelet-matrix stable partition; ended elements drop out.
        let total_bits: usize = lengths.iter().zip(&counts).map(|(&l, &c)| l as usize * c as usize).sum();
        let mut bits = BitBuf::with_capacity(total_bits);
        let mut cur: Vec<u32> = if dense {
            let mut index_of = vec![0u32; max + 1];
            alphabet.iter().enumerate().for_each(|(i, a)| index_of[a.0 as usize] = i as u32);
            seq.iter().map(|&s| index_of[s as usize]).collect()
        } else {
            let index_of: HashMap<u32, u32> = alphabet.iter().enumerate().map(|(i, a)| (a.0, i as u32)).collect();
            seq.iter().map(|s| index_of[s]).collect()
        };
        drop(seq);
        let mut zeros_v: Vec<u32> = Vec::with_capacity(n);
        let mut ones_v: Vec<u32> = Vec::with_capacity(n);
        let mut levels = Vec::with_capacity((depth + 1) * LEVEL_WORDS);
        let mut ones_total = 0u64;
        let mut slot = 0u64;
        for d in 0..depth {
            zeros_v.clear();
            ones_v.clear();
            let offset = bits.len() as u64;
            let n_d = cur.len() as u64;
            // Branch-free, as in `WaveletMatrix::build`: bits a word at a time, each symbol written to both sides
            // and kept by the one its bit chooses if its code goes on.
            zeros_v.resize(cur.len(), 0);
            ones_v.resize(cur.len(), 0);
            let (mut zn, mut on, mut zeros) = (0usize, 0usize, 0u64);
            for part in cur.chunks(64) {
                let mut word = 0u64;
                for (i, &si) in part.iter().enumerate() {
                    let len = lengths[si as usize] as usize;
                    let bit = (codes[si as usize] >> (len - 1 - d) & 1) as usize;
                    word |= (bit as u64) << i;
                    let goes_on = usize::from(len > d + 1);
                    zeros_v[zn] = si;
                    ones_v[on] = si;
                    zn += goes_on & (bit ^ 1);
                    on += goes_on & bit;
                    zeros += (bit ^ 1) as u64;
                }
                bits.push_bits(word, part.len() as u32);
            }
            zeros_v.truncate(zn);
            ones_v.truncate(on);
            levels.extend_from_slice(&[offset, n_d, ones_total, zeros, slot]);
            ones_total += n_d - zeros;
            slot += lengths.iter().filter(|&&l| l as usize == d + 1).count() as u64;
            cur.clear();
            cur.extend_from_slice(&zeros_v);
            cur.extend_from_slice(&ones_v);
        }
        levels.extend_from_slice(&[bits.len() as u64, 0, ones_total, 0, sigma as u64]);
        debug_assert!(sigma <= 1 || slot == sigma as u64);

        // Slots: at the level after a code ends, its occurrences follow the elements that go on, in code order.
        let mut slot_of = vec![0u64; sigma];
        let mut slots = Vec::with_capacity(sigma);
        let mut d_prev = usize::MAX;
        let mut start = 0u64;
        for (k, &si) in order.iter().enumerate() {
            let len = lengths[si] as usize;
            if len != d_prev {
                d_prev = len;
                // Elements going on past this level come first.
                start = if len == 0 { 0 } else { levels.get(len * LEVEL_WORDS + L_LEN).copied().unwrap_or(0) };
                if len == depth {
                    start = 0;
                }
            }
            slot_of[si] = k as u64;
            slots.push(start << 24 | si as u64);
            start += counts[si];
        }
        let mut syms = Vec::with_capacity(2 * sigma);
        for (i, &(s, _)) in alphabet.iter().enumerate() {
            syms.push(u64::from(s) | u64::from(lengths[i]) << 32 | slot_of[i] << 40);
            syms.push(codes[i]);
        }
        let (words, nbits) = bits.into_parts();
        HuffmanWaveletTree { n, bv: B::build(words, nbits, params), levels, syms, slots }
    }
}

impl<B: BitVector, W: Words> HuffmanWaveletTree<B, W> {
    /// Length of the sequence.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Number of distinct symbols.
    pub fn sigma(&self) -> usize {
        self.syms.num_words() / 2
    }

    /// Levels (the longest code).
    pub fn depth(&self) -> usize {
        self.levels.num_words() / LEVEL_WORDS - 1
    }

    /// The distinct symbols in increasing order, with their counts.
    pub fn symbols(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        (0..self.sigma()).map(|i| (self.value(i), self.slot_range(self.slot_index(i)).1))
    }

    /// Bytes used: bit vector, level, symbol and slot tables.
    pub fn size_in_bytes(&self) -> usize {
        self.bv.size_in_bytes()
            + self.levels.size_in_bytes()
            + self.syms.size_in_bytes()
            + self.slots.size_in_bytes()
            + 8
    }

    /// The bit vector holding every level.
    pub fn bit_vector(&self) -> &B {
        &self.bv
    }

    #[inline(always)]
    fn level(&self, d: usize, field: usize) -> usize {
        self.levels.word(d * LEVEL_WORDS + field) as usize
    }

    #[inline(always)]
    fn value(&self, i: usize) -> u32 {
        self.syms.word(2 * i) as u32
    }

    #[inline(always)]
    fn code_len(&self, i: usize) -> usize {
        (self.syms.word(2 * i) >> 32 & 0xff) as usize
    }

    #[inline(always)]
    fn code(&self, i: usize) -> u64 {
        self.syms.word(2 * i + 1)
    }

    #[inline(always)]
    fn slot_index(&self, i: usize) -> usize {
        (self.syms.word(2 * i) >> 40) as usize
    }

    /// Start and size of slot `k`.
    #[inline]
    fn slot_range(&self, k: usize) -> (usize, usize) {
        let w = self.slots.word(k);
        let start = (w >> 24) as usize;
        let si = (w & 0xff_ffff) as usize;
        let len = self.code_len(si);
        let end =
            if k + 1 < self.slots.num_words() && self.code_len((self.slots.word(k + 1) & 0xff_ffff) as usize) == len {
                (self.slots.word(k + 1) >> 24) as usize
            } else if len == 0 {
                self.n
            } else {
                self.level(len - 1, L_LEN)
            };
        (start, end.saturating_sub(start))
    }

    /// Index of symbol `c`: a branch-free binary search (the comparisons compile to conditional moves, so a
    /// query does not pay for mispredicted branches).
    #[inline]
    fn find(&self, c: u32) -> Option<usize> {
        let mut size = self.sigma();
        if size == 0 {
            return None;
        }
        let mut base = 0usize;
        while size > 1 {
            let half = size / 2;
            let mid = base + half;
            base = if self.value(mid) <= c { mid } else { base };
            size -= half;
        }
        (self.value(base) == c).then_some(base)
    }

    /// The first symbol index whose value satisfies `pred` (monotone), or `sigma`.
    fn first_index(&self, pred: impl Fn(u32) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.sigma());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if pred(self.value(mid)) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// Ones before position `p` of level `d`.
    #[inline(always)]
    fn rank1_at(&self, d: usize, p: usize) -> usize {
        self.bv.rank1(self.level(d, L_OFFSET) + p) - self.level(d, L_ONES_BEFORE)
    }

    /// The symbol at position `i` (panics when `i >= len`).
    pub fn access(&self, i: usize) -> u32 {
        self.access_rank(i).0
    }

    /// The symbol `c` at position `i` and its occurrences before `i` (`rank(c, i)`), in one walk down the tree
    /// (panics when `i >= len`).
    pub fn access_rank(&self, i: usize) -> (u32, usize) {
        assert!(i < self.n, "access({i}) on a sequence of {}", self.n);
        if self.depth() == 0 {
            return (self.value(0), i);
        }
        let mut p = i;
        for d in 0..self.depth() {
            let (bit, r) = self.bv.access_rank1(self.level(d, L_OFFSET) + p);
            let r1 = r - self.level(d, L_ONES_BEFORE);
            p = if bit { self.level(d, L_ZEROS) + r1 } else { p - r1 };
            let goes_on = self.level(d + 1, L_LEN);
            if p >= goes_on {
                // The code ended here: find the slot holding p among the codes ending at this level.
                let mut base = self.level(d, L_FIRST_SLOT);
                let mut size = self.level(d + 1, L_FIRST_SLOT) - base;
                while size > 1 {
                    let half = size / 2;
                    let mid = base + half;
                    base = if (self.slots.word(mid) >> 24) as usize <= p { mid } else { base };
                    size -= half;
                }
                let w = self.slots.word(base);
                // The slot's elements are the symbol's occurrences in order, from the slot's start.
                return (self.value((w & 0xff_ffff) as usize), p - (w >> 24) as usize);
            }
        }
        unreachable!("validated tree: every code ends by the last level")
    }

    /// Every symbol, in order: one pass over each level's bits (read with [`BitVector::bits`]), moving each
    /// element to its place at the next level as `access` would, so decoding a whole sequence costs a few
    /// nanoseconds a symbol and level instead of a rank per level and symbol.
    pub fn decode(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.n];
        self.for_each_symbol(|c, positions| {
            for &p in positions {
                out[p as usize] = c;
            }
        });
        out
    }

    /// Calls `f(c, positions)` once for every symbol `c` that occurs, with its positions in ascending order (the
    /// symbols in the tree's order, not by value). The same passes as [`decode`](Self::decode): each level's
    /// elements are partitioned stably by their bits, so the elements of a code that ends at a level lie together
    /// there, in their original order. This is a decode without the sequence's own array: a caller that wants a
    /// permutation (the positions of each symbol in turn) gets it directly.
    pub fn for_each_symbol(&self, f: impl FnMut(u32, &[u32])) {
        self.for_each_symbol_in(&mut DecodeScratch::default(), f);
    }

    /// [`for_each_symbol`](Self::for_each_symbol) with its working memory in `scratch`, which keeps it for the
    /// next call (decoding several sequences of one length then takes fresh memory once).
    pub fn for_each_symbol_in(&self, scratch: &mut DecodeScratch, mut f: impl FnMut(u32, &[u32])) {
        let n = self.n;
        if n == 0 {
            return;
        }
        let DecodeScratch { at, next } = scratch;
        if self.depth() == 0 {
            next.clear();
            next.extend(0..n as u32);
            f(self.value(0), next);
            return;
        }
        // `at[p]`: the original position of the element at position p of level d (the identity at level 0,
        // which is not read); `next`: level d + 1.
        next.resize(n, 0);
        for d in 0..self.depth() {
            let len = self.level(d, L_LEN);
            let off = self.level(d, L_OFFSET);
            let bits = self.bv.bits(off, off + len);
            let words = bits.words();
            // A stable partition, zeros first; branch-free (the bits are as good as random to a predictor).
            let (mut zeros, mut ones) = (0usize, self.level(d, L_ZEROS));
            let mut place = |q: usize, e: u32| {
                let b = (words[q / 64] >> (q % 64)) as usize & 1;
                next[zeros + ((ones - zeros) & b.wrapping_neg())] = e;
                ones += b;
                zeros += 1 - b;
            };
            if d == 0 {
                (0..len).for_each(|q| place(q, q as u32));
            } else {
                at[..len].iter().enumerate().for_each(|(q, &e)| place(q, e));
            }
            // Positions from the next level's length on hold the codes that end here, slot by slot.
            for k in self.level(d, L_FIRST_SLOT)..self.level(d + 1, L_FIRST_SLOT) {
                let (start, count) = self.slot_range(k);
                let v = self.value((self.slots.word(k) & 0xff_ffff) as usize);
                f(v, &next[start.min(len)..(start + count).min(len)]);
            }
            if d == 0 {
                at.resize(n, 0);
            }
            std::mem::swap(at, next);
        }
    }

    /// Occurrences of `c` in positions `[0, i)` (panics when `i > len`).
    pub fn rank(&self, c: u32, i: usize) -> usize {
        assert!(i <= self.n, "rank(_, {i}) on a sequence of {}", self.n);
        let Some(si) = self.find(c) else { return 0 };
        let (code, len) = (self.code(si), self.code_len(si));
        // Only the end of the range needs mapping: the start of the symbol's range at the last level is the start
        // of its slot (validated on load), so one rank per level suffices.
        let mut e = i;
        for d in 0..len {
            let re = self.rank1_at(d, e);
            e = if code >> (len - 1 - d) & 1 == 1 { self.level(d, L_ZEROS) + re } else { e - re };
        }
        e - (self.slots.word(self.slot_index(si)) >> 24) as usize
    }

    /// Occurrences of `c` in the whole sequence.
    pub fn count(&self, c: u32) -> usize {
        self.find(c).map_or(0, |si| self.slot_range(self.slot_index(si)).1)
    }

    /// Position at level 0 of the element at position `p` of the level after `si`'s code ends.
    fn lift(&self, si: usize, mut p: usize) -> usize {
        let (code, len) = (self.code(si), self.code_len(si));
        for d in (0..len).rev() {
            let off = self.level(d, L_OFFSET);
            let ob = self.level(d, L_ONES_BEFORE);
            let q = if code >> (len - 1 - d) & 1 == 1 {
                self.bv.select1(ob + p - self.level(d, L_ZEROS))
            } else {
                self.bv.select0(off - ob + p)
            };
            p = q.expect("validated tree: the occurrence exists") - off;
        }
        p
    }

    /// Position of the `k`-th occurrence of `c` (from 0), `None` when there are not that many.
    pub fn select(&self, c: u32, k: usize) -> Option<usize> {
        let si = self.find(c)?;
        let (start, count) = self.slot_range(self.slot_index(si));
        (k < count).then(|| self.lift(si, start + k))
    }

    /// The positions of `c` in `[l, r)`, in increasing order; each costs one select a level (not a scan of the
    /// range), taken in batches a level at a time (see [`Positions`]). The walk that ranks `l` also tells each
    /// level's select where to start scanning: the occurrences after `l` lie after `l`'s place at every level, so
    /// the first one is found by scanning forward from there (usually a few words) instead of by a select from the
    /// directories.
    pub fn positions(&self, c: u32, l: usize, r: usize) -> Positions<'_, B, W> {
        let r = r.min(self.n);
        let l = l.min(r);
        let mut prev = [(0, usize::MAX); MAX_DEPTH];
        let Some(si) = self.find(c) else {
            return Positions { wt: self, si: 0, start: 0, k: 0, end: 0, prev, from: 0, done: 0, batch: [0; BATCH] };
        };
        let (code, len) = (self.code(si), self.code_len(si));
        let slot_start = (self.slots.word(self.slot_index(si)) >> 24) as usize;
        // `l` and `r` walked down the levels as `rank` walks them; at each level, the bits before `l`'s place
        // that equal the code's bit, counted over the whole bit vector, seed that level's select.
        let (mut a, mut e) = (l, r);
        for (d, seed) in prev.iter_mut().enumerate().take(len) {
            let (off, ob) = (self.level(d, L_OFFSET), self.level(d, L_ONES_BEFORE));
            let ra = self.rank1_at(d, a);
            let re = self.rank1_at(d, e);
            let one = code >> (len - 1 - d) & 1 == 1;
            let before = if one { ob + ra } else { off - ob + (a - ra) };
            if before > 0 && a > 0 {
                *seed = (before - 1, off + a - 1);
            }
            let zeros = self.level(d, L_ZEROS);
            (a, e) = if one { (zeros + ra, zeros + re) } else { (a - ra, e - re) };
        }
        let k = a - slot_start;
        Positions { wt: self, si, start: slot_start, k, end: e - slot_start, prev, from: k, done: k, batch: [0; BATCH] }
    }

    /// Number of positions in `[l, r)` whose symbol lies in `[c1, c2]`: the sum of `rank` differences over the
    /// distinct symbols in the range (or over those outside it, whichever are fewer). For wide symbol ranges over
    /// large alphabets, [`WaveletMatrix::count_range`](crate::WaveletMatrix::count_range) is O(log max).
    pub fn count_range(&self, l: usize, r: usize, c1: u32, c2: u32) -> usize {
        let r = r.min(self.n);
        if l >= r || c1 > c2 {
            return 0;
        }
        let lo = self.first_index(|v| v >= c1);
        let hi = self.first_index(|v| v > c2);
        let span = |i: usize| self.rank(self.value(i), r) - self.rank(self.value(i), l);
        if hi - lo <= self.sigma() / 2 {
            (lo..hi).map(span).sum()
        } else {
            (r - l) - (0..lo).chain(hi..self.sigma()).map(span).sum::<usize>()
        }
    }
}

/// Positions a [`Positions`] iterator lifts at once, level by level.
const BATCH: usize = 32;

/// Iterator over the positions of one symbol in a range, from [`HuffmanWaveletTree::positions`]. Positions are
/// lifted in batches, a level at a time for the whole batch ([`BitVector::select_run`]): consecutive occurrences
/// lie close together at every level, so each level's select scans on from the previous answer in the same words.
#[derive(Debug)]
pub struct Positions<'a, B, W> {
    wt: &'a HuffmanWaveletTree<B, W>,
    si: usize,
    start: usize,
    /// Rank of the next position given.
    k: usize,
    end: usize,
    /// Per level, the select argument and answer of the last element lifted (`usize::MAX`: none yet).
    prev: [(usize, usize); MAX_DEPTH],
    /// Ranks `[from, done)` are lifted, into `batch[..done - from]`.
    from: usize,
    done: usize,
    batch: [usize; BATCH],
}

impl<B, W> Positions<'_, B, W> {
    /// The occurrences of the symbol before the next position this iterator gives (its rank there).
    pub fn rank(&self) -> usize {
        self.k
    }
}

impl<B: BitVector, W: Words> Positions<'_, B, W> {
    /// Lifts the next batch of ranks from `done` on (at least one; the caller checks `done < end`).
    fn lift_batch(&mut self) {
        let wt = self.wt;
        let n = (self.end - self.done).min(BATCH);
        let batch = &mut self.batch[..n];
        for (i, x) in batch.iter_mut().enumerate() {
            *x = self.start + self.done + i;
        }
        let (code, len) = (wt.code(self.si), wt.code_len(self.si));
        for d in (0..len).rev() {
            let (off, ob) = (wt.level(d, L_OFFSET), wt.level(d, L_ONES_BEFORE));
            let one = code >> (len - 1 - d) & 1 == 1;
            // The select arguments of `lift`, ascending as the positions are.
            if one {
                let zeros = wt.level(d, L_ZEROS);
                batch.iter_mut().for_each(|x| *x = ob + *x - zeros);
            } else {
                batch.iter_mut().for_each(|x| *x += off - ob);
            }
            self.prev[d] = wt.bv.select_run(one, self.prev[d], batch).expect("validated tree: the occurrence exists");
            batch.iter_mut().for_each(|x| *x -= off);
        }
        self.from = self.done;
        self.done += n;
    }
}

impl<B: BitVector, W: Words> Iterator for Positions<'_, B, W> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.k >= self.end {
            return None;
        }
        if self.k >= self.done {
            self.lift_batch();
        }
        let p = self.batch[self.k - self.from];
        self.k += 1;
        Some(p)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.k;
        (n, Some(n))
    }
}

impl<B: BitVector, W: Words> ExactSizeIterator for Positions<'_, B, W> {}

impl<B: BitVectorCodec, W: Words> Encode for HuffmanWaveletTree<B, W> {
    fn body_words(&self) -> u64 {
        2 + self.bv.encoded_words()
            + array_words(self.levels.num_words())
            + array_words(self.syms.num_words())
            + array_words(self.slots.num_words())
    }

    fn encode_body<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        w.word(self.n as u64)?;
        w.word(BitVectorCodec::kind(&self.bv))?;
        self.bv.encode_into(w)?;
        for a in [&self.levels, &self.syms, &self.slots] {
            w.array((0..a.num_words()).map(|i| a.word(i)), a.num_words())?;
        }
        Ok(())
    }

    fn kind(&self) -> u64 {
        kind::HUFFMAN_WT
    }
}

impl<'a, B: BitVector + DecodeBitVector<'a>> HuffmanWaveletTree<B, LeBytes<'a>> {
    /// Loads a file written by [`Encode::write_to`] without copying its arrays (the directories of an
    /// [`RsBitVector`](crate::RsBitVector) are computed), validating every field: the codes against the code
    /// lengths, the level table against the bits, and every symbol's path against its slot.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<HuffmanWaveletTree<B, LeBytes<'a>>, Error> {
        let mut r = Reader::open(bytes, kind::HUFFMAN_WT)?;
        let at = r.offset();
        let n = r.count("sequence length", MAX_LEN as u64)?;
        let k = r.word("bit vector kind")?;
        if !B::KINDS.contains(&k) {
            return Err(Error::Kind { found: k, expected: B::KINDS[0] });
        }
        let bv = B::decode_nested(&mut r, k)?;
        let levels = r.array("level table")?;
        let syms = r.array("symbol table")?;
        let slots = r.array("slot table")?;
        r.finish()?;
        let wt = HuffmanWaveletTree { n, bv, levels, syms, slots };
        wt.validate().map_err(|why| Error::Invalid { what: "wavelet tree", offset: at, why })?;
        Ok(wt)
    }
}

impl<B: BitVector, W: Words> HuffmanWaveletTree<B, W> {
    /// Checks every invariant the queries rely on: linear in the alphabet times the depth, plus one pass over the
    /// level table.
    fn validate(&self) -> Result<(), &'static str> {
        if !self.syms.num_words().is_multiple_of(2)
            || !self.levels.num_words().is_multiple_of(LEVEL_WORDS)
            || self.levels.num_words() == 0
        {
            return Err("table sizes are not whole records");
        }
        let sigma = self.sigma();
        let depth = self.depth();
        if sigma > MAX_SIGMA || self.slots.num_words() != sigma || depth > MAX_DEPTH {
            return Err("alphabet or depth out of range");
        }
        if sigma == 0 {
            return if self.n == 0 && depth == 0 && self.bv.is_empty() { Ok(()) } else { Err("empty alphabet") };
        }
        // Symbols strictly increasing, lengths form the codes that building would assign.
        let mut lengths = Vec::with_capacity(sigma);
        for i in 0..sigma {
            let w = self.syms.word(2 * i);
            if i > 0 && self.value(i) <= self.value(i - 1) {
                return Err("symbols not strictly increasing");
            }
            let len = (w >> 32 & 0xff) as usize;
            if len > depth || (sigma >= 2) != (len >= 1) || (w >> 40) as usize >= sigma {
                return Err("code length or slot out of range");
            }
            lengths.push(len as u32);
        }
        if lengths.iter().copied().max().unwrap_or(0) as usize != depth {
            return Err("depth is not the longest code");
        }
        let (codes, order) = matrix_codes(&lengths).ok_or("code lengths do not form a complete code")?;
        for (i, &code) in codes.iter().enumerate() {
            if self.code(i) != code {
                return Err("codes differ from the assignment of their lengths");
            }
        }
        for (k, &si) in order.iter().enumerate() {
            if (self.slots.word(k) & 0xff_ffff) as usize != si || self.slot_index(si) != k {
                return Err("slot order differs from the code order");
            }
        }
        // Level table: offsets tile the bit vector; ones and zeros match the bits; level 0 holds the sequence.
        let mut offset = 0usize;
        let mut ones = 0usize;
        let mut first_slot = 0usize;
        for d in 0..=depth {
            let (off, len, ob, zeros, fs) = (
                self.level(d, L_OFFSET),
                self.level(d, L_LEN),
                self.level(d, L_ONES_BEFORE),
                self.level(d, L_ZEROS),
                self.level(d, L_FIRST_SLOT),
            );
            if off != offset || ob != ones || (d < depth && fs != first_slot) || (d == 0 && depth > 0 && len != self.n)
            {
                return Err("level table does not match the bits");
            }
            if d == depth {
                if len != 0 || zeros != 0 || off != self.bv.len() || fs != sigma {
                    return Err("levels do not cover the bit vector");
                }
                break;
            }
            let end = off.checked_add(len).filter(|&e| e <= self.bv.len()).ok_or("level past the bit vector")?;
            let lvl_ones = self.bv.rank1(end) - ob;
            if zeros != len - lvl_ones {
                return Err("zeros of a level do not match its bits");
            }
            offset = end;
            ones += lvl_ones;
            first_slot += lengths.iter().filter(|&&l| l as usize == d + 1).count();
        }
        // The slots of the codes ending at each level tile the positions past those that go on, in order.
        for d in 0..depth {
            let (lo, hi) = (self.level(d, L_FIRST_SLOT), self.level(d + 1, L_FIRST_SLOT));
            let (goes_on, total) = (self.level(d + 1, L_LEN), self.level(d, L_LEN));
            if lo == hi {
                if goes_on != total {
                    return Err("a level shrinks without codes ending");
                }
                continue;
            }
            let mut expected = goes_on;
            for k in lo..hi {
                let start = (self.slots.word(k) >> 24) as usize;
                let (_, count) = self.slot_range(k);
                if start != expected || count == 0 || start + count > total {
                    return Err("slots do not tile the ended region");
                }
                expected = start + count;
            }
            if expected != total {
                return Err("slots do not tile the ended region");
            }
        }
        if depth == 0 && (sigma != 1 || self.slots.word(0) >> 24 != 0) {
            return Err("a one-symbol sequence has one slot at 0");
        }
        // Every symbol's path leads exactly to its slot: then access, rank and select agree with each other.
        // Walked as a trie in code order, so each prefix is mapped once (two ranks per trie edge, not per symbol
        // and level).
        let mut by_code: Vec<usize> = (0..sigma).collect();
        by_code.sort_unstable_by_key(|&si| {
            let len = self.code_len(si);
            if len == 0 { 0 } else { self.code(si) << (64 - len) }
        });
        let mut stack: Vec<(usize, usize)> = vec![(0, self.n)];
        let mut prev: Option<(u64, usize)> = None;
        for si in by_code {
            let (code, len) = (self.code(si), self.code_len(si));
            let shared = prev.map_or(0, |(pc, pl)| {
                let m = len.min(pl);
                let x = (code >> (len - m)) ^ (pc >> (pl - m));
                if x == 0 { m } else { m - (64 - x.leading_zeros() as usize) }
            });
            stack.truncate(shared + 1);
            let (mut s, mut e) = stack[shared];
            for d in shared..len {
                if s > e || e > self.level(d, L_LEN) {
                    return Err("a symbol's path leaves its level");
                }
                let (rs, re) = (self.rank1_at(d, s), self.rank1_at(d, e));
                if code >> (len - 1 - d) & 1 == 1 {
                    let z = self.level(d, L_ZEROS);
                    s = z + rs;
                    e = z + re;
                } else {
                    s -= rs;
                    e -= re;
                }
                stack.push((s, e));
            }
            let (start, count) = self.slot_range(self.slot_index(si));
            if (s, e) != (start, start + count) {
                return Err("a symbol's path does not lead to its slot");
            }
            prev = Some((code, len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RrrBitVector, RsBitVector};
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Every operation against a `Vec<u32>` and linear scans.
    pub(crate) fn check<B: BitVector, W: Words>(wt: &HuffmanWaveletTree<B, W>, seq: &[u32]) {
        assert_eq!(wt.len(), seq.len());
        let mut distinct: Vec<u32> = seq.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(wt.sigma(), distinct.len());
        let mut seen = HashMap::new();
        for (i, &s) in seq.iter().enumerate() {
            assert_eq!(wt.access(i), s, "access({i})");
            let before = seen.entry(s).or_insert(0usize);
            assert_eq!(wt.access_rank(i), (s, *before), "access_rank({i})");
            *before += 1;
        }
        assert_eq!(wt.decode(), seq, "decode");
        let mut seen = 0;
        wt.for_each_symbol(|c, positions| {
            seen += positions.len();
            let want: Vec<u32> = (0..seq.len() as u32).filter(|&i| seq[i as usize] == c).collect();
            assert_eq!(positions, want, "for_each_symbol({c})");
        });
        assert_eq!(seen, seq.len(), "for_each_symbol: every position once");
        // Reused working memory, left longer and full of other values by an earlier decode, changes nothing.
        let mut scratch = DecodeScratch { at: vec![7; seq.len() + 5], next: vec![9; 2 * seq.len() + 3] };
        let mut again = vec![u32::MAX; seq.len()];
        wt.for_each_symbol_in(&mut scratch, |c, positions| positions.iter().for_each(|&p| again[p as usize] = c));
        assert_eq!(again, seq, "for_each_symbol_in with used scratch");
        let probes: Vec<u32> = distinct.iter().copied().chain([0, 1, u32::MAX, 77]).collect();
        for &c in &probes {
            let occ: Vec<usize> = (0..seq.len()).filter(|&i| seq[i] == c).collect();
            assert_eq!(wt.count(c), occ.len());
            let step = (seq.len() / 50).max(1);
            for i in (0..=seq.len()).step_by(step).chain([seq.len()]) {
                assert_eq!(wt.rank(c, i), occ.iter().filter(|&&p| p < i).count(), "rank({c}, {i})");
            }
            for (k, &p) in occ.iter().enumerate().step_by((occ.len() / 50).max(1)) {
                assert_eq!(wt.select(c, k), Some(p), "select({c}, {k})");
            }
            assert_eq!(wt.select(c, occ.len()), None);
            // Ranges from the start, inside, at an occurrence and just after it (the walk that ranks `l` seeds
            // each level's select: every boundary case of that seed).
            let n = seq.len();
            let mut ranges = vec![(n / 3, n - n / 4), (0, n), (0, 0), (n, n), (n / 2, n / 2 + 1)];
            for &p in occ.iter().step_by((occ.len() / 8).max(1)) {
                ranges.extend([(p, n), (p + 1, n), (p.saturating_sub(1), p + 1), (p, p + 1)]);
            }
            for (l, r) in ranges {
                let want: Vec<usize> = occ.iter().copied().filter(|&p| p >= l && p < r).collect();
                let found = wt.positions(c, l, r);
                assert_eq!(found.rank(), occ.iter().filter(|&&p| p < l).count(), "positions({c}, {l}, {r}).rank()");
                assert_eq!(found.collect::<Vec<_>>(), want, "positions({c}, {l}, {r})");
            }
        }
        let ranges = [(0u32, u32::MAX), (0, 0), (5, 10), (100, 1000), (u32::MAX, u32::MAX)];
        for (c1, c2) in ranges.iter().copied().chain(distinct.windows(2).take(5).map(|w| (w[0], w[1]))) {
            for (l, r) in [(0, seq.len()), (seq.len() / 5, seq.len() / 2), (1, 1)] {
                let want = seq.get(l..r.max(l)).map_or(0, |s| s.iter().filter(|&&x| x >= c1 && x <= c2).count());
                assert_eq!(wt.count_range(l, r, c1, c2), want, "count_range({l}, {r}, {c1}, {c2})");
            }
        }
        let counted: Vec<(u32, usize)> = wt.symbols().collect();
        assert_eq!(counted.len(), distinct.len());
        for (s, c) in counted {
            assert_eq!(c, seq.iter().filter(|&&x| x == s).count());
        }
    }

    pub(crate) fn sequences() -> impl Strategy<Value = Vec<u32>> {
        prop_oneof![
            Just(vec![]),
            any::<u32>().prop_map(|s| vec![s]),
            (any::<u32>(), 1usize..300).prop_map(|(s, n)| vec![s; n]),
            proptest::collection::vec(0u32..4, 0..500),
            proptest::collection::vec(any::<u32>(), 0..300),
            // Few distinct symbols spread over the whole u32 range.
            (
                proptest::collection::vec(any::<u32>(), 1..6),
                proptest::collection::vec(any::<prop::sample::Index>(), 0..600)
            )
                .prop_map(|(alpha, idx)| idx.iter().map(|i| alpha[i.index(alpha.len())]).collect()),
            // Worst-case skew: Fibonacci-like frequencies give the deepest Huffman trees.
            (2usize..25).prop_map(|k| {
                let mut fib = vec![1usize, 1];
                while fib.len() < k {
                    let n = fib[fib.len() - 1] + fib[fib.len() - 2];
                    fib.push(n);
                }
                let mut v = Vec::new();
                for (s, &f) in fib.iter().enumerate() {
                    v.extend(std::iter::repeat_n(s as u32 * 1000, f.min(3000)));
                }
                let mut x = 7u64;
                for i in (1..v.len()).rev() {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    v.swap(i, (x >> 33) as usize % (i + 1));
                }
                v
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_naive_model_rs(seq in sequences()) {
            let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
            check(&wt, &seq);
            let bytes = wt.to_bytes();
            let view = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&bytes).unwrap();
            check(&view, &seq);
            prop_assert_eq!(view.size_in_bytes(), wt.size_in_bytes());
        }

        #[test]
        fn matches_naive_model_rrr(seq in sequences()) {
            let wt = HuffmanWaveletTree::<RrrBitVector>::from_symbols(seq.iter().copied());
            check(&wt, &seq);
            let bytes = wt.to_bytes();
            let view = HuffmanWaveletTree::<RrrBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&bytes).unwrap();
            check(&view, &seq);
        }
    }

    /// Space stays near the entropy: bit vectors within 1.1·H0 + 0.1 bits per symbol on skewed data.
    #[test]
    fn huffman_shape_is_near_entropy() {
        let mut x = 1u64;
        let seq: Vec<u32> = (0..200_000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (-(1.0 - u).ln() * 2.0) as u32
            })
            .collect();
        let mut counts = HashMap::new();
        for &s in &seq {
            *counts.entry(s).or_insert(0usize) += 1;
        }
        let n = seq.len() as f64;
        let h0: f64 = counts.values().map(|&c| c as f64 / n).map(|p| -p * p.log2()).sum();
        let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
        let bits_per_symbol = wt.bit_vector().len() as f64 / n;
        assert!(bits_per_symbol <= 1.1 * h0 + 0.1, "{bits_per_symbol} bits vs H0 {h0}");
    }

    /// Hostile bytes: a valid checksum over altered contents must be refused or be a consistent tree.
    #[test]
    fn altered_contents_with_a_valid_checksum_never_panic() {
        let seq: Vec<u32> = (0..3000u32).map(|i| [80, 443, 53, 22, 8080][(i * i % 7 % 5) as usize]).collect();
        let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
        let bytes = wt.to_bytes();
        let body_end = bytes.len() - 8;
        let mut accepted = 0;
        for i in 16..body_end {
            for flip in [1u8, 0x80] {
                let mut c = bytes.clone();
                c[i] ^= flip;
                let mut crc = crate::Crc32::new();
                crc.update(&c[..body_end]);
                let sum = crc.finish().to_le_bytes();
                c[body_end..body_end + 4].copy_from_slice(&sum);
                if let Ok(v) = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&c) {
                    accepted += 1;
                    // Accepted only if consistent: every query works and they agree with each other.
                    let decoded: Vec<u32> = (0..v.len()).map(|p| v.access(p)).collect();
                    check(&v, &decoded);
                }
            }
        }
        assert!(accepted < 20, "{accepted} altered files accepted");
    }

    #[test]
    fn builds_a_million_symbols() {
        let mut x = 1u64;
        let seq: Vec<u32> = (0..1_000_000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) % 1000) as u32
            })
            .collect();
        let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
        assert_eq!(wt.len(), 1_000_000);
        assert_eq!(wt.access(12345), seq[12345]);
        assert_eq!(wt.select(seq[99], wt.rank(seq[99], 99)), Some(99));
    }
}
