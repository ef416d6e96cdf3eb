//! The common interface of bit vectors with rank and select, so that wavelet trees are generic over it.

/// A bit vector answering `access`, `rank` and `select`.
///
/// Conventions (as in the succinct-data-structure literature and sucds): `rank1(i)` counts the ones in positions
/// `[0, i)` for `i <= len`; `select1(k)` is the position of the `k`-th one counting from 0, `None` when there are
/// not that many.
pub trait BitVector {
    /// Number of bits.
    fn len(&self) -> usize;
    /// Whether the vector has no bits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Number of ones.
    fn count_ones(&self) -> usize;
    /// Number of zeros.
    fn count_zeros(&self) -> usize {
        self.len() - self.count_ones()
    }
    /// Bit `i` (`i < len`; panics otherwise).
    fn access(&self, i: usize) -> bool;
    /// Ones in `[0, i)`, `i <= len` (panics otherwise).
    fn rank1(&self, i: usize) -> usize;
    /// Zeros in `[0, i)`, `i <= len`.
    fn rank0(&self, i: usize) -> usize {
        i - self.rank1(i)
    }
    /// Bit `i` and the ones in `[0, i)` together (one directory lookup where the vector allows).
    fn access_rank1(&self, i: usize) -> (bool, usize) {
        (self.access(i), self.rank1(i))
    }
    /// Position of the `k`-th one (from 0).
    fn select1(&self, k: usize) -> Option<usize>;
    /// Position of the `k`-th zero (from 0).
    fn select0(&self, k: usize) -> Option<usize>;
    /// Position of the `k`-th one (`ones`) or zero, given that the `j`-th (`j < k`) is at `at`: the same answer as
    /// [`select1`](Self::select1)/[`select0`](Self::select0), which a vector may find by scanning forward from
    /// `at` when `k` is near `j` (iterating over consecutive occurrences).
    fn select_after(&self, ones: bool, j: usize, at: usize, k: usize) -> Option<usize> {
        let _ = (j, at);
        if ones { self.select1(k) } else { self.select0(k) }
    }
    /// Many selects of one kind at once: `ks` holds ascending arguments, each replaced by its answer (the
    /// position of the `k`-th one when `ones`, else of the `k`-th zero). `cursor` is an earlier argument and its
    /// answer (`usize::MAX` as the answer: none), from which a vector may scan forward as
    /// [`select_after`](Self::select_after) does; the last argument and answer are returned to be the next call's
    /// cursor. `None` when an occurrence is missing (the arguments then hold some answers and some arguments).
    fn select_run(&self, ones: bool, cursor: (usize, usize), ks: &mut [usize]) -> Option<(usize, usize)> {
        let mut cursor = cursor;
        for k in ks.iter_mut() {
            let q = match cursor {
                (j, at) if at != usize::MAX && j < *k => self.select_after(ones, j, at, *k),
                _ if ones => self.select1(*k),
                _ => self.select0(*k),
            }?;
            cursor = (*k, q);
            *k = q;
        }
        Some(cursor)
    }
    /// Bits `[l, r)` (`l <= r <= len`, panics otherwise) packed into words, bit `l` first: for reading a stretch in
    /// one pass instead of one `access` per bit.
    fn bits(&self, l: usize, r: usize) -> crate::BitBuf {
        assert!(l <= r && r <= self.len(), "bits({l}, {r}) on {} bits", self.len());
        crate::BitBuf::from_bits((l..r).map(|i| self.access(i)))
    }
    /// Bytes used, directories included.
    fn size_in_bytes(&self) -> usize;
}

/// A bit vector that can be built from packed bits; `Params` are its tuning knobs.
pub trait BuildBitVector: BitVector + Sized {
    /// Tuning parameters (sampling rate, block size).
    type Params: Copy + Default + std::fmt::Debug;
    /// Builds from `len` bits packed in `words` (bits past `len` must be zero).
    fn build(words: Vec<u64>, len: usize, params: Self::Params) -> Self;
}
