//! Bit-level helpers: a growable bit buffer and select within a word.

/// Position of the `k`-th (0-based) set bit of `w`; `k < w.count_ones()`.
#[inline]
pub(crate) fn select_in_word(mut w: u64, mut k: u32) -> u32 {
    debug_assert!(k < w.count_ones());
    let mut pos = 0;
    loop {
        let c = (w & 0xff).count_ones();
        if k < c {
            break;
        }
        k -= c;
        w >>= 8;
        pos += 8;
    }
    pos + u32::from(SELECT_IN_BYTE[k as usize][(w & 0xff) as usize])
}

const fn select_in_byte_table() -> [[u8; 256]; 8] {
    let mut t = [[0u8; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        let mut i = 0;
        while i < 8 {
            if b & (1 << i) != 0 {
                t[k][b] = i as u8;
                k += 1;
            }
            i += 1;
        }
        b += 1;
    }
    t
}

static SELECT_IN_BYTE: [[u8; 256]; 8] = select_in_byte_table();

/// A growable sequence of bits, packed little-endian into `u64` words (bit `i` is bit `i % 64` of word `i / 64`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BitBuf {
    words: Vec<u64>,
    len: usize,
}

impl BitBuf {
    /// An empty buffer.
    pub fn new() -> BitBuf {
        BitBuf::default()
    }

    /// An empty buffer with room for `bits` bits.
    pub fn with_capacity(bits: usize) -> BitBuf {
        BitBuf { words: Vec::with_capacity(bits.div_ceil(64)), len: 0 }
    }

    /// `len` zero bits.
    pub fn zeros(len: usize) -> BitBuf {
        BitBuf { words: vec![0; len.div_ceil(64)], len }
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a bit.
    #[inline]
    pub fn push(&mut self, bit: bool) {
        if self.len.is_multiple_of(64) {
            self.words.push(0);
        }
        if bit {
            *self.words.last_mut().expect("a word was pushed") |= 1 << (self.len % 64);
        }
        self.len += 1;
    }

    /// Appends the low `width` bits of `v` (least significant first), `width <= 64`.
    #[inline]
    pub fn push_bits(&mut self, v: u64, width: u32) {
        if width == 0 {
            return;
        }
        let v = if width == 64 { v } else { v & ((1u64 << width) - 1) };
        let off = (self.len % 64) as u32;
        if off == 0 {
            self.words.push(v);
        } else {
            *self.words.last_mut().expect("partial word") |= v << off;
            if off + width > 64 {
                self.words.push(v >> (64 - off));
            }
        }
        self.len += width as usize;
    }

    /// Sets bit `i` (which must exist).
    pub fn set(&mut self, i: usize, bit: bool) {
        assert!(i < self.len, "bit {i} out of {}", self.len);
        if bit {
            self.words[i / 64] |= 1 << (i % 64);
        } else {
            self.words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Bit `i`.
    pub fn get(&self, i: usize) -> bool {
        assert!(i < self.len, "bit {i} out of {}", self.len);
        self.words[i / 64] >> (i % 64) & 1 == 1
    }

    /// The packed words (bits past `len` are zero).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Builds from an iterator of bits.
    pub fn from_bits(bits: impl IntoIterator<Item = bool>) -> BitBuf {
        let mut b = BitBuf::new();
        for x in bits {
            b.push(x);
        }
        b
    }

    pub(crate) fn into_parts(self) -> (Vec<u64>, usize) {
        (self.words, self.len)
    }
}

/// Reads `width` bits at bit position `pos` from packed words.
#[inline]
pub(crate) fn read_bits<W: crate::Words + ?Sized>(w: &W, pos: usize, width: u32) -> u64 {
    if width == 0 {
        return 0;
    }
    let i = pos / 64;
    let off = (pos % 64) as u32;
    let mut v = w.word(i) >> off;
    if off + width > 64 {
        v |= w.word(i + 1) << (64 - off);
    }
    if width == 64 { v } else { v & ((1u64 << width) - 1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_in_word_matches_naive() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let w = x;
            let positions: Vec<u32> = (0..64).filter(|i| w >> i & 1 == 1).collect();
            for (k, p) in positions.iter().enumerate() {
                assert_eq!(select_in_word(w, k as u32), *p);
            }
        }
        assert_eq!(select_in_word(u64::MAX, 63), 63);
        assert_eq!(select_in_word(1 << 63, 0), 63);
    }

    #[test]
    fn push_bits_and_read_back() {
        let mut b = BitBuf::new();
        let items: Vec<(u64, u32)> = (0..300).map(|i| ((i * 7919) as u64, (i % 65) as u32)).collect();
        for &(v, w) in &items {
            b.push_bits(v, w);
        }
        let mut pos = 0;
        for &(v, w) in &items {
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            assert_eq!(read_bits(&b.words().to_vec(), pos, w), v & mask);
            pos += w as usize;
        }
    }
}
