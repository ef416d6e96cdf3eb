//! A per-packet sequence's wavelet structure: a Huffman-shaped tree or a wavelet matrix, whichever the builder
//! found smaller, read in place from the index's bytes.

use pcaptool_wavelet::{HuffmanWaveletTree, LeBytes, RsBitVector, WaveletMatrix};

pub(crate) type Huffman<'a> = HuffmanWaveletTree<RsBitVector<LeBytes<'a>>, LeBytes<'a>>;
pub(crate) type Matrix<'a> = WaveletMatrix<RsBitVector<LeBytes<'a>>, LeBytes<'a>>;

/// A per-packet sequence's wavelet structure: whichever the builder found smaller.
#[derive(Debug)]
pub(crate) enum Tree<'a> {
    Huffman(Huffman<'a>),
    Matrix(Matrix<'a>),
}

impl<'a> Tree<'a> {
    /// Loads either structure, by the kind in its PTWV header.
    pub(crate) fn from_bytes(b: &'a [u8]) -> Result<Tree<'a>, pcaptool_wavelet::Error> {
        match b.get(6..8).map(|k| u16::from_le_bytes([k[0], k[1]])) {
            Some(4) => Ok(Tree::Matrix(Matrix::from_bytes(b)?)),
            _ => Ok(Tree::Huffman(Huffman::from_bytes(b)?)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Tree::Huffman(t) => t.len(),
            Tree::Matrix(t) => t.len(),
        }
    }

    pub(crate) fn access(&self, i: usize) -> u32 {
        match self {
            Tree::Huffman(t) => t.access(i),
            Tree::Matrix(t) => t.access(i),
        }
    }

    /// The symbol at `i` and its occurrences before `i` (one walk for a Huffman-shaped tree).
    pub(crate) fn access_rank(&self, i: usize) -> (u32, usize) {
        match self {
            Tree::Huffman(t) => t.access_rank(i),
            Tree::Matrix(t) => {
                let s = t.access(i);
                (s, t.rank(s, i))
            }
        }
    }

    pub(crate) fn rank(&self, s: u32, i: usize) -> usize {
        match self {
            Tree::Huffman(t) => t.rank(s, i),
            Tree::Matrix(t) => t.rank(s, i),
        }
    }

    /// Every symbol, in order.
    pub(crate) fn decode(&self) -> Vec<u32> {
        match self {
            Tree::Huffman(t) => t.decode(),
            Tree::Matrix(t) => (0..t.len()).map(|i| t.access(i)).collect(),
        }
    }

    /// Position of the `k`-th occurrence of `s` (from 0).
    pub(crate) fn select(&self, s: u32, k: usize) -> Option<usize> {
        match self {
            Tree::Huffman(t) => t.select(s, k),
            Tree::Matrix(t) => t.select(s, k),
        }
    }

    pub(crate) fn positions(&self, s: u32, l: usize, r: usize) -> Box<dyn ExactSizeIterator<Item = usize> + '_> {
        self.ranked_positions(s, l, r).1
    }

    /// [`positions`](Self::positions), and the occurrences of `s` before `l` (the first position's rank).
    pub(crate) fn ranked_positions(
        &self,
        s: u32,
        l: usize,
        r: usize,
    ) -> (usize, Box<dyn ExactSizeIterator<Item = usize> + '_>) {
        match self {
            Tree::Huffman(t) => {
                let p = t.positions(s, l, r);
                (p.rank(), Box::new(p))
            }
            Tree::Matrix(t) => (t.rank(s, l.min(t.len())), Box::new(t.positions(s, l, r))),
        }
    }

    /// The occurrences of every symbol below `alphabet` (a Huffman-shaped tree's slot table; a matrix walked
    /// once as a trie).
    pub(crate) fn symbol_counts(&self, alphabet: usize) -> Vec<u32> {
        let mut counts = vec![0u32; alphabet];
        match self {
            Tree::Huffman(t) => {
                for (s, c) in t.symbols() {
                    if let Some(x) = counts.get_mut(s as usize) {
                        *x = c as u32;
                    }
                }
            }
            Tree::Matrix(t) => {
                for (x, c) in counts.iter_mut().zip(t.counts_below(alphabet as u32)) {
                    *x = c as u32;
                }
            }
        }
        counts
    }

    /// The largest symbol the structure can hold (a matrix's width bounds it).
    pub(crate) fn max_symbol(&self) -> u64 {
        match self {
            Tree::Huffman(t) => t.symbols().map(|(s, _)| u64::from(s)).max().unwrap_or(0),
            Tree::Matrix(t) => (1u64 << t.width()) - 1,
        }
    }
}

/// The symbols `truth` accepts (indexes of its true entries).
pub(crate) fn members(truth: &[bool]) -> impl Iterator<Item = u32> + '_ {
    truth.iter().enumerate().filter(|(_, t)| **t).map(|(s, _)| s as u32)
}
