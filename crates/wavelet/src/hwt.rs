//! The Huffman-shaped wavelet tree: each symbol's path is its canonical Huffman code, so a sequence of `n` symbols
//! costs about `n·(H0 + 1)` bits of bit vectors (less with [`RrrBitVector`](crate::RrrBitVector)), and frequent
//! symbols are answered in few levels.
//!
//! Layout: the bits of all internal nodes are concatenated in breadth-first order in one bit vector; a node table
//! gives each node's range, the ones before it, its children and the smallest and largest symbol below it; a symbol
//! table (sorted by symbol) gives each symbol's code, code length and count.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::BitBuf;
use crate::error::Error;
use crate::format::{BitVectorCodec, DecodeBitVector, Encode, Reader, Writer, array_words, kind};
use crate::huffman::{canonical_codes, code_lengths};
use crate::rank_select::{BitVector, BuildBitVector};
use crate::words::{LeBytes, Words};

const NODE_WORDS: usize = 7;
const SYM_WORDS: usize = 4;
const LEAF: u64 = 1 << 63;
const MAX_DEPTH: usize = 64;

// Node fields.
const START: usize = 0;
const LEN: usize = 1;
const ONES_BEFORE: usize = 2;
const LEFT: usize = 3;
const RIGHT: usize = 4;
const MIN: usize = 5;
const MAX: usize = 6;
// Symbol fields.
const SYMBOL: usize = 0;
const CODE: usize = 1;
const CODE_LEN: usize = 2;
const COUNT: usize = 3;

/// A Huffman-shaped wavelet tree over `u32` symbols, generic over its bit vector `B` and word storage `W`.
#[derive(Clone, Debug)]
pub struct HuffmanWaveletTree<B = crate::RsBitVector, W = Vec<u64>> {
    n: usize,
    bv: B,
    nodes: W,
    syms: W,
}

impl<B: BuildBitVector> HuffmanWaveletTree<B> {
    /// Builds from a sequence with the bit vector's default parameters.
    pub fn from_symbols(symbols: impl IntoIterator<Item = u32>) -> HuffmanWaveletTree<B> {
        HuffmanWaveletTree::build(symbols, B::Params::default())
    }

    /// Builds from a sequence in time linear in its total code length; extra memory is two `u32` per symbol.
    pub fn build(symbols: impl IntoIterator<Item = u32>, params: B::Params) -> HuffmanWaveletTree<B> {
        let seq: Vec<u32> = symbols.into_iter().collect();
        let n = seq.len();
        let mut freq: HashMap<u32, u64> = HashMap::new();
        for &s in &seq {
            *freq.entry(s).or_default() += 1;
        }
        let mut alphabet: Vec<(u32, u64)> = freq.into_iter().collect();
        alphabet.sort_unstable();
        let sigma = alphabet.len();
        let counts: Vec<u64> = alphabet.iter().map(|a| a.1).collect();
        let lengths = code_lengths(&counts);
        assert!(lengths.iter().all(|&l| l as usize <= MAX_DEPTH), "Huffman code longer than 64 bits");
        let codes = canonical_codes(&lengths);
        let index_of: HashMap<u32, u32> = alphabet.iter().enumerate().map(|(i, a)| (a.0, i as u32)).collect();

        // The trie of codes, nodes numbered breadth-first: children of node k come after all nodes before k.
        // children[k] = [left, right] as LEAF|symbol or node id.
        let mut children: Vec<[u64; 2]> = Vec::with_capacity(sigma.saturating_sub(1));
        let mut depth_of: Vec<usize> = Vec::new();
        if sigma >= 2 {
            // Build with temporary ids, then renumber breadth-first.
            let mut tmp: Vec<[u64; 2]> = vec![[u64::MAX; 2]];
            for (i, (&code, &len)) in codes.iter().zip(&lengths).enumerate() {
                let mut node = 0usize;
                for d in 0..len {
                    let bit = (code >> (len - 1 - d) & 1) as usize;
                    if d + 1 == len {
                        tmp[node][bit] = LEAF | i as u64;
                    } else {
                        if tmp[node][bit] == u64::MAX {
                            tmp.push([u64::MAX; 2]);
                            tmp[node][bit] = (tmp.len() - 1) as u64;
                        }
                        node = tmp[node][bit] as usize;
                    }
                }
            }
            let mut order = vec![0usize];
            let mut new_id = vec![0usize; tmp.len()];
            let mut depth = vec![0usize];
            let mut k = 0;
            while k < order.len() {
                let t = order[k];
                new_id[t] = k;
                for c in tmp[t] {
                    if c & LEAF == 0 {
                        order.push(c as usize);
                        depth.push(depth[k] + 1);
                    }
                }
                k += 1;
            }
            for &t in &order {
                children.push(tmp[t].map(|c| if c & LEAF != 0 { c } else { new_id[c as usize] as u64 }));
            }
            depth_of = depth;
        }

        // Bits, level by level: `cur` holds the symbol indices of the current level's nodes, in node order.
        let inner = children.len();
        let mut start = vec![0u64; inner];
        let mut len = vec![0u64; inner];
        let mut ones_before = vec![0u64; inner];
        let mut bits = BitBuf::with_capacity(lengths.iter().zip(&counts).map(|(&l, &c)| l as usize * c as usize).sum());
        let mut ones = 0u64;
        let mut cur: Vec<u32> = seq.iter().map(|s| index_of[s]).collect();
        drop(seq);
        let mut next: Vec<u32> = Vec::with_capacity(cur.len());
        let mut node = 0usize;
        let mut level = 0usize;
        while node < inner {
            // Nodes of this level: node..level_end.
            let mut level_end = node;
            while level_end < inner && depth_of[level_end] == level {
                level_end += 1;
            }
            let mut pos = 0usize;
            let mut node_len = vec![0usize; level_end - node];
            // Element counts per node: sum of the counts of the symbols below; computed from the previous split.
            if level == 0 {
                node_len[0] = cur.len();
            } else {
                node_len.copy_from_slice(&len[node..level_end].iter().map(|&l| l as usize).collect::<Vec<_>>());
            }
            next.clear();
            for (j, id) in (node..level_end).enumerate() {
                let range = &cur[pos..pos + node_len[j]];
                pos += node_len[j];
                start[id] = bits.len() as u64;
                len[id] = range.len() as u64;
                ones_before[id] = ones;
                let (mut zeros_n, mut ones_n) = (0u64, 0u64);
                for &si in range {
                    let l = lengths[si as usize];
                    let bit = codes[si as usize] >> (l as usize - 1 - level) & 1 == 1;
                    bits.push(bit);
                    if bit {
                        ones_n += 1;
                    } else {
                        zeros_n += 1;
                    }
                }
                ones += ones_n;
                for (b, cnt) in [(0usize, zeros_n), (1, ones_n)] {
                    let c = children[id][b];
                    if c & LEAF == 0 {
                        len[c as usize] = cnt;
                        for &si in range {
                            let l = lengths[si as usize];
                            if (codes[si as usize] >> (l as usize - 1 - level) & 1) as usize == b {
                                next.push(si);
                            }
                        }
                    }
                }
            }
            std::mem::swap(&mut cur, &mut next);
            node = level_end;
            level += 1;
        }
        let (words, nbits) = bits.into_parts();
        let bv = B::build(words, nbits, params);

        // Smallest and largest symbol below each node, children before parents (reverse breadth-first order).
        let mut min = vec![u64::MAX; inner];
        let mut max = vec![0u64; inner];
        for id in (0..inner).rev() {
            for c in children[id] {
                let (lo, hi) = if c & LEAF != 0 {
                    let s = u64::from(alphabet[(c & !LEAF) as usize].0);
                    (s, s)
                } else {
                    (min[c as usize], max[c as usize])
                };
                min[id] = min[id].min(lo);
                max[id] = max[id].max(hi);
            }
        }
        let mut nodes = Vec::with_capacity(inner * NODE_WORDS);
        for id in 0..inner {
            nodes.extend_from_slice(&[
                start[id],
                len[id],
                ones_before[id],
                children[id][0],
                children[id][1],
                min[id],
                max[id],
            ]);
        }
        let mut syms = Vec::with_capacity(sigma * SYM_WORDS);
        for (i, &(s, c)) in alphabet.iter().enumerate() {
            syms.extend_from_slice(&[u64::from(s), codes[i], u64::from(lengths[i]), c]);
        }
        HuffmanWaveletTree { n, bv, nodes, syms }
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
        self.syms.num_words() / SYM_WORDS
    }

    /// The distinct symbols in increasing order, with their counts.
    pub fn symbols(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        (0..self.sigma()).map(|i| (self.sym(i, SYMBOL) as u32, self.sym(i, COUNT) as usize))
    }

    /// Bytes used: bit vector, node and symbol tables.
    pub fn size_in_bytes(&self) -> usize {
        self.bv.size_in_bytes() + self.nodes.size_in_bytes() + self.syms.size_in_bytes() + 8
    }

    /// The bit vector holding every node's bits.
    pub fn bit_vector(&self) -> &B {
        &self.bv
    }

    #[inline(always)]
    fn node(&self, id: usize, field: usize) -> u64 {
        self.nodes.word(id * NODE_WORDS + field)
    }

    #[inline(always)]
    fn sym(&self, i: usize, field: usize) -> u64 {
        self.syms.word(i * SYM_WORDS + field)
    }

    fn find(&self, c: u32) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.sigma());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let s = self.sym(mid, SYMBOL) as u32;
            if s < c {
                lo = mid + 1;
            } else if s > c {
                hi = mid;
            } else {
                return Some(mid);
            }
        }
        None
    }

    /// Ones before position `i` of node `id` (relative to the node).
    #[inline(always)]
    fn node_rank1(&self, id: usize, i: usize) -> usize {
        self.bv.rank1(self.node(id, START) as usize + i) - self.node(id, ONES_BEFORE) as usize
    }

    /// The symbol at position `i` (panics when `i >= len`).
    pub fn access(&self, mut i: usize) -> u32 {
        assert!(i < self.n, "access({i}) on a sequence of {}", self.n);
        if self.nodes.num_words() == 0 {
            return self.sym(0, SYMBOL) as u32;
        }
        let mut id = 0usize;
        loop {
            let start = self.node(id, START) as usize;
            let (bit, r) = self.bv.access_rank1(start + i);
            let r1 = r - self.node(id, ONES_BEFORE) as usize;
            let c = if bit {
                i = r1;
                self.node(id, RIGHT)
            } else {
                i -= r1;
                self.node(id, LEFT)
            };
            if c & LEAF != 0 {
                return self.sym((c & !LEAF) as usize, SYMBOL) as u32;
            }
            id = c as usize;
        }
    }

    /// Occurrences of `c` in positions `[0, i)` (panics when `i > len`).
    pub fn rank(&self, c: u32, mut i: usize) -> usize {
        assert!(i <= self.n, "rank(_, {i}) on a sequence of {}", self.n);
        let Some(si) = self.find(c) else { return 0 };
        let (code, len) = (self.sym(si, CODE), self.sym(si, CODE_LEN) as usize);
        let mut id = 0usize;
        for d in 0..len {
            let r1 = self.node_rank1(id, i);
            let bit = code >> (len - 1 - d) & 1 == 1;
            let child;
            if bit {
                i = r1;
                child = self.node(id, RIGHT);
            } else {
                i -= r1;
                child = self.node(id, LEFT);
            }
            id = (child & !LEAF) as usize;
        }
        i
    }

    /// Occurrences of `c` in the whole sequence.
    pub fn count(&self, c: u32) -> usize {
        self.find(c).map_or(0, |si| self.sym(si, COUNT) as usize)
    }

    /// The internal nodes on the path of symbol index `si`, root first; returns the path length.
    fn path(&self, si: usize, out: &mut [u32; MAX_DEPTH]) -> usize {
        let (code, len) = (self.sym(si, CODE), self.sym(si, CODE_LEN) as usize);
        let mut id = 0u64;
        for (d, slot) in out.iter_mut().enumerate().take(len) {
            *slot = id as u32;
            let bit = code >> (len - 1 - d) & 1;
            id = self.node(id as usize, if bit == 1 { RIGHT } else { LEFT }) & !LEAF;
        }
        len
    }

    fn select_on_path(&self, si: usize, path: &[u32], mut k: usize) -> usize {
        let (code, len) = (self.sym(si, CODE), self.sym(si, CODE_LEN) as usize);
        for d in (0..len).rev() {
            let id = path[d] as usize;
            let start = self.node(id, START) as usize;
            let ob = self.node(id, ONES_BEFORE) as usize;
            let p =
                if code >> (len - 1 - d) & 1 == 1 { self.bv.select1(ob + k) } else { self.bv.select0(start - ob + k) };
            k = p.expect("validated tree: the occurrence exists") - start;
        }
        k
    }

    /// Position of the `k`-th occurrence of `c` (from 0), `None` when there are not that many.
    pub fn select(&self, c: u32, k: usize) -> Option<usize> {
        let si = self.find(c)?;
        if k >= self.sym(si, COUNT) as usize {
            return None;
        }
        let mut path = [0u32; MAX_DEPTH];
        let len = self.path(si, &mut path);
        Some(self.select_on_path(si, &path[..len], k))
    }

    /// The positions of `c` in `[l, r)`, in increasing order; each costs one `select` (not a scan of the range).
    pub fn positions(&self, c: u32, l: usize, r: usize) -> Positions<'_, B, W> {
        let r = r.min(self.n);
        let l = l.min(r);
        let mut path = [0u32; MAX_DEPTH];
        match self.find(c) {
            Some(si) => {
                let depth = self.path(si, &mut path);
                Positions { wt: self, si, path, depth, k: self.rank(c, l), end: self.rank(c, r) }
            }
            None => Positions { wt: self, si: 0, path, depth: 0, k: 0, end: 0 },
        }
    }

    /// Number of positions in `[l, r)` whose symbol lies in `[c1, c2]`.
    pub fn count_range(&self, l: usize, r: usize, c1: u32, c2: u32) -> usize {
        let r = r.min(self.n);
        if l >= r || c1 > c2 {
            return 0;
        }
        let (c1, c2) = (u64::from(c1), u64::from(c2));
        if self.nodes.num_words() == 0 {
            let s = self.sym(0, SYMBOL);
            return if (c1..=c2).contains(&s) { r - l } else { 0 };
        }
        let mut total = 0;
        let mut stack: Vec<(usize, usize, usize)> = vec![(0, l, r)];
        while let Some((id, l, r)) = stack.pop() {
            if l >= r {
                continue;
            }
            let (lo, hi) = (self.node(id, MIN), self.node(id, MAX));
            if hi < c1 || lo > c2 {
                continue;
            }
            if c1 <= lo && hi <= c2 {
                total += r - l;
                continue;
            }
            let (rl, rr) = (self.node_rank1(id, l), self.node_rank1(id, r));
            for (child, cl, cr) in [(self.node(id, LEFT), l - rl, r - rr), (self.node(id, RIGHT), rl, rr)] {
                if child & LEAF != 0 {
                    let s = self.sym((child & !LEAF) as usize, SYMBOL);
                    if (c1..=c2).contains(&s) {
                        total += cr - cl;
                    }
                } else {
                    stack.push((child as usize, cl, cr));
                }
            }
        }
        total
    }
}

/// Iterator over the positions of one symbol in a range, from [`HuffmanWaveletTree::positions`].
#[derive(Debug)]
pub struct Positions<'a, B, W> {
    wt: &'a HuffmanWaveletTree<B, W>,
    si: usize,
    path: [u32; MAX_DEPTH],
    depth: usize,
    k: usize,
    end: usize,
}

impl<B: BitVector, W: Words> Iterator for Positions<'_, B, W> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.k >= self.end {
            return None;
        }
        let p = if self.wt.nodes.num_words() == 0 {
            self.k
        } else {
            self.wt.select_on_path(self.si, &self.path[..self.depth], self.k)
        };
        self.k += 1;
        Some(p)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.k;
        (n, Some(n))
    }
}

impl<B: BitVectorCodec, W: Words> Encode for HuffmanWaveletTree<B, W> {
    fn body_words(&self) -> u64 {
        2 + self.bv.encoded_words() + array_words(self.nodes.num_words()) + array_words(self.syms.num_words())
    }

    fn encode_body<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        w.word(self.n as u64)?;
        w.word(B::KIND)?;
        self.bv.encode_into(w)?;
        for a in [&self.nodes, &self.syms] {
            w.array((0..a.num_words()).map(|i| a.word(i)), a.num_words())?;
        }
        Ok(())
    }

    fn kind(&self) -> u64 {
        kind::HUFFMAN_WT
    }
}

impl<'a, B: BitVector + DecodeBitVector<'a>> HuffmanWaveletTree<B, LeBytes<'a>> {
    /// Loads a file written by [`Encode::write_to`] without copying, validating every field: the tree shape,
    /// every node's range and counts against its bit vector, and the symbol table.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<HuffmanWaveletTree<B, LeBytes<'a>>, Error> {
        let mut r = Reader::open(bytes, kind::HUFFMAN_WT)?;
        let at = r.offset();
        let n = r.count("sequence length", u64::MAX)?;
        let k = r.word("bit vector kind")?;
        if k != B::KIND {
            return Err(Error::Kind { found: k, expected: B::KIND });
        }
        let bv = B::decode_nested(&mut r)?;
        let nodes = r.array("node table")?;
        let syms = r.array("symbol table")?;
        r.finish()?;
        let wt = HuffmanWaveletTree { n, bv, nodes, syms };
        wt.validate().map_err(|why| Error::Invalid { what: "wavelet tree", offset: at, why })?;
        Ok(wt)
    }
}

impl<B: BitVector, W: Words> HuffmanWaveletTree<B, W> {
    /// Checks every invariant the queries rely on (linear in the number of nodes, plus one rank per node).
    fn validate(&self) -> Result<(), &'static str> {
        if !self.nodes.num_words().is_multiple_of(NODE_WORDS) || !self.syms.num_words().is_multiple_of(SYM_WORDS) {
            return Err("table sizes are not whole records");
        }
        let sigma = self.sigma();
        let inner = self.nodes.num_words() / NODE_WORDS;
        if sigma == 0 {
            return if self.n == 0 && inner == 0 && self.bv.is_empty() { Ok(()) } else { Err("empty alphabet") };
        }
        if inner != sigma - 1 {
            return Err("node count is not sigma - 1");
        }
        let mut total = 0u64;
        for i in 0..sigma {
            if i > 0 && self.sym(i, SYMBOL) <= self.sym(i - 1, SYMBOL) {
                return Err("symbols not strictly increasing");
            }
            if self.sym(i, SYMBOL) > u64::from(u32::MAX) || self.sym(i, COUNT) == 0 {
                return Err("symbol out of range or with count 0");
            }
            let len = self.sym(i, CODE_LEN);
            if len as usize > MAX_DEPTH || (sigma >= 2) != (len >= 1) || (len < 64 && self.sym(i, CODE) >> len != 0) {
                return Err("code length out of range");
            }
            total = total.checked_add(self.sym(i, COUNT)).ok_or("counts overflow")?;
        }
        if total != self.n as u64 {
            return Err("symbol counts do not add up to the length");
        }
        if inner == 0 {
            return if self.bv.is_empty() { Ok(()) } else { Err("bits without nodes") };
        }
        // Walk the tree breadth-first: every node reached once, ranges exactly tiling the bit vector in order,
        // children's lengths equal to the zeros and ones of their parent's range, leaves matching the symbols.
        let mut seen_leaf = vec![false; sigma];
        let mut queue: Vec<(usize, u64, u64)> = vec![(0, 0, 0)]; // (node, code prefix, depth)
        if self.node(0, LEN) != self.n as u64 {
            return Err("root does not cover the sequence");
        }
        let mut next_start = 0u64;
        let mut qi = 0;
        while qi < queue.len() {
            let (id, prefix, depth) = queue[qi];
            if id != qi {
                return Err("nodes are not in breadth-first order");
            }
            qi += 1;
            let (start, len, ob) = (self.node(id, START), self.node(id, LEN), self.node(id, ONES_BEFORE));
            if start != next_start || start.checked_add(len).is_none_or(|e| e > self.bv.len() as u64) {
                return Err("node ranges do not tile the bit vector");
            }
            next_start = start + len;
            if self.bv.rank1(start as usize) as u64 != ob {
                return Err("ones-before of a node is wrong");
            }
            let ones = self.bv.rank1((start + len) as usize) as u64 - ob;
            for (b, cnt) in [(0u64, len - ones), (1, ones)] {
                let c = self.node(id, if b == 0 { LEFT } else { RIGHT });
                let code = prefix << 1 | b;
                if depth + 1 > MAX_DEPTH as u64 {
                    return Err("tree deeper than 64");
                }
                if c & LEAF != 0 {
                    let si = (c & !LEAF) as usize;
                    if si >= sigma || seen_leaf[si] {
                        return Err("leaf symbol out of range or repeated");
                    }
                    seen_leaf[si] = true;
                    if self.sym(si, CODE) != code || self.sym(si, CODE_LEN) != depth + 1 || self.sym(si, COUNT) != cnt {
                        return Err("leaf does not match its symbol's code or count");
                    }
                } else {
                    if c as usize != queue.len() || c as usize >= inner {
                        return Err("child is not the next node in breadth-first order");
                    }
                    if self.node(c as usize, LEN) != cnt {
                        return Err("child length does not match its parent's bits");
                    }
                    queue.push((c as usize, code, depth + 1));
                }
            }
        }
        if queue.len() != inner || next_start != self.bv.len() as u64 || seen_leaf.iter().any(|s| !s) {
            return Err("tree does not cover every node, bit and symbol");
        }
        for id in (0..inner).rev() {
            let (mut lo, mut hi) = (u64::MAX, 0u64);
            for f in [LEFT, RIGHT] {
                let c = self.node(id, f);
                let (a, b) = if c & LEAF != 0 {
                    let s = self.sym((c & !LEAF) as usize, SYMBOL);
                    (s, s)
                } else {
                    (self.node(c as usize, MIN), self.node(c as usize, MAX))
                };
                lo = lo.min(a);
                hi = hi.max(b);
            }
            if self.node(id, MIN) != lo || self.node(id, MAX) != hi {
                return Err("node symbol bounds are wrong");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RrrBitVector, RsBitVector};
    use proptest::prelude::*;

    /// Every operation against a `Vec<u32>` and linear scans.
    pub(crate) fn check<B: BitVector, W: Words>(wt: &HuffmanWaveletTree<B, W>, seq: &[u32]) {
        assert_eq!(wt.len(), seq.len());
        let mut distinct: Vec<u32> = seq.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(wt.sigma(), distinct.len());
        for (i, &s) in seq.iter().enumerate() {
            assert_eq!(wt.access(i), s, "access({i})");
        }
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
            let (l, r) = (seq.len() / 3, seq.len() - seq.len() / 4);
            let want: Vec<usize> = occ.iter().copied().filter(|&p| p >= l && p < r).collect();
            assert_eq!(wt.positions(c, l, r).collect::<Vec<_>>(), want, "positions({c}, {l}, {r})");
        }
        let ranges = [(0u32, u32::MAX), (0, 0), (5, 10), (100, 1000), (u32::MAX, u32::MAX)];
        for (c1, c2) in ranges.iter().copied().chain(distinct.windows(2).take(5).map(|w| (w[0], w[1]))) {
            for (l, r) in [(0, seq.len()), (seq.len() / 5, seq.len() / 2), (1, 1)] {
                let want = seq.get(l..r.max(l)).map_or(0, |s| s.iter().filter(|&&x| x >= c1 && x <= c2).count());
                assert_eq!(wt.count_range(l, r, c1, c2), want, "count_range({l}, {r}, {c1}, {c2})");
            }
        }
    }

    fn sequences() -> impl Strategy<Value = Vec<u32>> {
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

    /// Hostile bytes: a valid checksum over altered contents must still be refused or be a consistent tree.
    #[test]
    fn altered_contents_with_a_valid_checksum_never_panic() {
        let seq: Vec<u32> = (0..3000u32).map(|i| [80, 443, 53, 22, 8080][(i * i % 7 % 5) as usize]).collect();
        let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
        let bytes = wt.to_bytes();
        let body_end = bytes.len() - 8;
        for i in 16..body_end {
            for flip in [1u8, 0x80] {
                let mut c = bytes.clone();
                c[i] ^= flip;
                let mut crc = crate::Crc32::new();
                crc.update(&c[..body_end]);
                let sum = crc.finish().to_le_bytes();
                c[body_end..body_end + 4].copy_from_slice(&sum);
                if let Ok(v) = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&c) {
                    // Accepted only if it is a consistent tree: then every query works.
                    for p in 0..v.len() {
                        let _ = v.access(p);
                    }
                    for (s, _) in v.symbols().collect::<Vec<_>>() {
                        let _ = v.select(s, 0);
                        let _ = v.rank(s, v.len());
                    }
                    let _ = v.count_range(0, v.len(), 0, u32::MAX);
                }
            }
        }
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
    }
}
