//! Bodies of the fuzz targets (fuzz/fuzz_targets/wavelet_*.rs), here so that `cargo test` replays saved inputs
//! (fuzz/regressions/) through exactly the code the fuzzer ran. Not part of the stable API.

use crate::format::{Crc32, MAGIC, VERSION, kind};
use crate::{BitVector, Encode, HuffmanWaveletTree, LeBytes, RrrBitVector, RsBitVector, WaveletMatrix};

/// Wraps `body` in a valid header and checksum for structure `kind` (so the fuzzer reaches validation).
pub fn seal(kind: u16, body: &[u8]) -> Vec<u8> {
    let body_len = body.len() / 8 * 8;
    let mut f = Vec::with_capacity(24 + body_len);
    f.extend_from_slice(&MAGIC);
    f.extend_from_slice(&VERSION.to_le_bytes());
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&(body_len as u64).to_le_bytes());
    f.extend_from_slice(&body[..body_len]);
    let mut crc = Crc32::new();
    crc.update(&f);
    f.extend_from_slice(&crc.finish().to_le_bytes());
    f.extend_from_slice(&[0; 4]);
    f
}

/// The body of a structure's file (what [`seal`] wraps), for seeding.
pub fn body_of(file: &[u8]) -> &[u8] {
    &file[16..file.len() - 8]
}

fn exercise<B: BitVector>(b: &B) {
    let n = b.len();
    let mut r = 0;
    for i in 0..n.min(2000) {
        assert_eq!(b.rank1(i), r);
        let (bit, rr) = b.access_rank1(i);
        assert_eq!((bit, rr), (b.access(i), r));
        r += usize::from(bit);
    }
    for k in 0..b.count_ones().min(200) {
        let p = b.select1(k).expect("k < ones");
        assert!(b.access(p) && b.rank1(p) == k);
    }
    for k in 0..b.count_zeros().min(200) {
        let p = b.select0(k).expect("k < zeros");
        assert!(!b.access(p) && b.rank0(p) == k);
    }
}

fn exercise_seq(
    access: impl Fn(usize) -> u32,
    rank: impl Fn(u32, usize) -> usize,
    select: impl Fn(u32, usize) -> Option<usize>,
    n: usize,
) {
    for i in 0..n.min(500) {
        let c = access(i);
        let k = rank(c, i);
        assert_eq!(select(c, k), Some(i), "select(access(i), rank(access(i), i)) == i");
    }
}

/// `from_bytes` of every structure on a sealed arbitrary body (first byte picks the structure); anything accepted
/// must answer consistently.
pub fn from_bytes(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else { return };
    match sel % 6 {
        0 => {
            for k in [kind::RS_BIT_VECTOR, kind::RS_BIT_VECTOR_BARE] {
                if let Ok(b) = RsBitVector::<LeBytes<'_>>::from_bytes(&seal(k as u16, body)) {
                    exercise(&b);
                }
            }
        }
        1 => {
            if let Ok(b) = RrrBitVector::<LeBytes<'_>>::from_bytes(&seal(kind::RRR_BIT_VECTOR as u16, body)) {
                exercise(&b);
            }
        }
        2 | 3 => {
            let f = seal(kind::HUFFMAN_WT as u16, body);
            if sel % 6 == 2 {
                if let Ok(w) = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f) {
                    exercise_seq(|i| w.access(i), |c, i| w.rank(c, i), |c, k| w.select(c, k), w.len());
                    let _ = w.count_range(0, w.len(), 0, u32::MAX / 2);
                }
            } else if let Ok(w) = HuffmanWaveletTree::<RrrBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f) {
                exercise_seq(|i| w.access(i), |c, i| w.rank(c, i), |c, k| w.select(c, k), w.len());
            }
        }
        _ => {
            let f = seal(kind::WAVELET_MATRIX as u16, body);
            if let Ok(w) = WaveletMatrix::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f) {
                exercise_seq(|i| w.access(i), |c, i| w.rank(c, i), |c, k| w.select(c, k), w.len());
                let _ = w.count_range(0, w.len(), 0, u32::MAX / 2);
            }
        }
    }
}

/// Every operation of every wavelet structure against a naive model, on a sequence and queries read from the
/// input: byte 0 sets the alphabet size, the rest are symbols.
pub fn ops_vs_naive(data: &[u8]) {
    let Some((&a, rest)) = data.split_first() else { return };
    // The naive model is quadratic: keep sequences short enough for many runs per second.
    let rest = &rest[..rest.len().min(1024)];
    let alphabet = u32::from(a).max(1);
    let seq: Vec<u32> = rest.iter().map(|&b| (u32::from(b) % alphabet).wrapping_mul(0x9e37_79b9)).collect();
    let hwt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
    let hrr = HuffmanWaveletTree::<RrrBitVector>::from_symbols(seq.iter().copied());
    let wm = WaveletMatrix::<RsBitVector>::from_symbols(seq.iter().copied());
    let bytes = hwt.to_bytes();
    let view =
        HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&bytes).expect("own output loads");
    for (i, &c) in seq.iter().enumerate() {
        assert_eq!(hwt.access(i), c);
        assert_eq!(hrr.access(i), c);
        assert_eq!(wm.access(i), c);
        assert_eq!(view.access(i), c);
        let k = seq[..i].iter().filter(|&&x| x == c).count();
        assert_eq!(hwt.rank(c, i), k);
        assert_eq!(hrr.rank(c, i), k);
        assert_eq!(wm.rank(c, i), k);
        assert_eq!(hwt.select(c, k), Some(i));
        assert_eq!(wm.select(c, k), Some(i));
    }
    if let (Some(&lo), Some(&hi)) = (seq.first(), seq.last()) {
        let (c1, c2) = (lo.min(hi), lo.max(hi));
        let (l, r) = (seq.len() / 4, seq.len());
        let want = seq[l..r].iter().filter(|&&x| x >= c1 && x <= c2).count();
        assert_eq!(hwt.count_range(l, r, c1, c2), want);
        assert_eq!(wm.count_range(l, r, c1, c2), want);
        let pos: Vec<usize> = (l..r).filter(|&i| seq[i] == lo).collect();
        assert_eq!(hwt.positions(lo, l, r).collect::<Vec<_>>(), pos);
    }
}
