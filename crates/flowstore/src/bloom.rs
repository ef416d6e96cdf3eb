//! A Bloom filter with a fixed, documented hash (the bits are stored in segment indexes, so the hash may never
//! change within a format version): 64-bit FNV-1a of the key, then `k` probes by double hashing.

/// A Bloom filter over byte strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloom {
    k: u32,
    bits: Vec<u64>,
}

fn fnv1a(key: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Final mix (SplitMix64's), so that the two halves used for double hashing are independent enough.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl Bloom {
    /// A filter sized for `n` keys at false-positive rate `fpr` (0 < fpr < 1): `m = -n·ln(fpr)/ln(2)²` bits
    /// (at least 64), `k = round(m/n · ln 2)` probes.
    pub fn with_rate(n: usize, fpr: f64) -> Bloom {
        let n = n.max(1) as f64;
        let m = (-n * fpr.ln() / (2f64.ln() * 2f64.ln())).ceil().max(64.0);
        let words = (m / 64.0).ceil() as usize;
        let k = ((words * 64) as f64 / n * 2f64.ln()).round().clamp(1.0, 16.0) as u32;
        Bloom { k, bits: vec![0; words] }
    }

    /// A filter from its parts (as stored); `None` if they are not a filter (no words, or no probe).
    pub fn from_parts(k: u32, bits: Vec<u64>) -> Option<Bloom> {
        (k > 0 && k <= 64 && !bits.is_empty()).then_some(Bloom { k, bits })
    }

    /// Probes per key.
    pub fn k(&self) -> u32 {
        self.k
    }

    /// The bit words.
    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    /// The bits key `key` sets: probe `i` is `(h1 + i·h2) mod m`. `h1` and `h2` are below 2^32 and `i` below
    /// 2^6, so the sum never wraps and each probe is the last plus `h2 mod m`, taken mod `m` by one subtraction
    /// (one division per key instead of one per probe).
    fn probes(&self, key: &[u8]) -> impl Iterator<Item = usize> + use<> {
        let h = fnv1a(key);
        let (h1, h2) = (h & 0xffff_ffff, (h >> 32) | 1);
        let m = self.bits.len() as u64 * 64;
        let step = h2 % m;
        let mut p = h1 % m;
        (0..self.k).map(move |_| {
            let b = p;
            p += step;
            if p >= m {
                p -= m;
            }
            b as usize
        })
    }

    /// Adds `key`.
    pub fn insert(&mut self, key: &[u8]) {
        for b in self.probes(key) {
            self.bits[b / 64] |= 1 << (b % 64);
        }
    }

    /// Whether `key` may have been added (never false for a key that was).
    pub fn may_contain(&self, key: &[u8]) -> bool {
        self.probes(key).all(|b| self.bits[b / 64] >> (b % 64) & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_about_the_rate() {
        let mut b = Bloom::with_rate(10_000, 0.01);
        for i in 0u32..10_000 {
            b.insert(&i.to_be_bytes());
        }
        assert!((0u32..10_000).all(|i| b.may_contain(&i.to_be_bytes())));
        let fp = (10_000u32..110_000).filter(|i| b.may_contain(&i.to_be_bytes())).count();
        assert!(fp < 2_000, "{fp} false positives in 100,000 (1% asked)");
        let c = Bloom::from_parts(b.k(), b.words().to_vec()).unwrap();
        assert_eq!(c, b);
    }

    proptest::proptest! {
        /// The probes are the documented `(h1 + i·h2) mod m`, computed one division per probe.
        #[test]
        fn probes_are_the_documented_ones(key: Vec<u8>, words in 1usize..5000, k in 1u32..=64) {
            let b = Bloom::from_parts(k, vec![0; words]).unwrap();
            let h = fnv1a(&key);
            let (h1, h2) = (h & 0xffff_ffff, (h >> 32) | 1);
            let m = words as u64 * 64;
            let want: Vec<usize> = (0..u64::from(k)).map(|i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize).collect();
            proptest::prop_assert_eq!(b.probes(&key).collect::<Vec<_>>(), want);
        }
    }
}
