//! Storage of 64-bit words: owned (`Vec<u64>`) or borrowed little-endian bytes (`LeBytes`, e.g. from an mmap).
//!
//! Every structure of this crate keeps its arrays in a [`Words`] implementation, so the same code answers queries
//! over data built in memory and over bytes loaded without copying.

/// Read access to an array of `u64` words.
pub trait Words {
    /// Number of words.
    fn num_words(&self) -> usize;
    /// Word `i` (panics when out of bounds, like slice indexing; validated structures never are).
    fn word(&self, i: usize) -> u64;
    /// Bytes of storage.
    fn size_in_bytes(&self) -> usize {
        self.num_words() * 8
    }
    /// Ones in words `from..to` (`to <= num_words`).
    fn count_ones_in(&self, from: usize, to: usize) -> usize {
        (from..to).map(|i| self.word(i).count_ones() as usize).sum()
    }
}

impl Words for Vec<u64> {
    #[inline(always)]
    fn num_words(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        self[i]
    }
}

impl Words for &[u64] {
    #[inline(always)]
    fn num_words(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        self[i]
    }
}

/// Borrowed little-endian `u64` words; any alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeBytes<'a>(&'a [u8]);

impl<'a> LeBytes<'a> {
    /// Wraps `bytes`, whose length must be a multiple of 8 (checked by the loaders before calling this).
    pub(crate) fn new(bytes: &'a [u8]) -> LeBytes<'a> {
        debug_assert!(bytes.len().is_multiple_of(8));
        LeBytes(bytes)
    }
}

impl Words for LeBytes<'_> {
    #[inline(always)]
    fn num_words(&self) -> usize {
        self.0.len() / 8
    }
    fn count_ones_in(&self, from: usize, to: usize) -> usize {
        self.0[from * 8..to * 8]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]).count_ones() as usize)
            .sum()
    }
    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        let b: [u8; 8] = self.0[i * 8..i * 8 + 8].try_into().expect("8 bytes");
        u64::from_le_bytes(b)
    }
}
