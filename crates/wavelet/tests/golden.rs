//! Format stability: golden files of format version 1 (tests/golden/v1/) load and answer as they did when written,
//! and today's writer still produces them byte for byte. Regenerate only with a version bump:
//! `PCAPTOOL_WRITE_GOLDEN=1 cargo test -p pcaptool-wavelet --test golden`.

use std::path::PathBuf;

use pcaptool_wavelet::{
    BitBuf, BitVector, BuildBitVector, Encode, HuffmanWaveletTree, LeBytes, RrrBitVector, RsBitVector, RsParams,
    WaveletMatrix,
};

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1").join(name)
}

fn seq() -> Vec<u32> {
    (0..5000u32).map(|i| [443, 80, 53, 443, 22, 443, 8080, 80, 3_000_000_000][(i * 7 + i / 13) as usize % 9]).collect()
}

fn bits() -> Vec<bool> {
    (0..5000u32).map(|i| i % 3 == 0 || i % 29 == 0).collect()
}

fn check_file(name: &str, bytes: Vec<u8>) -> Vec<u8> {
    let path = golden(name);
    if std::env::var_os("PCAPTOOL_WRITE_GOLDEN").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(stored == bytes, "{name}: the writer no longer produces the version-1 golden file");
    stored
}

#[test]
fn version_1_golden_files() {
    let s = seq();
    let b = bits();
    let f = check_file("rs.bin", RsBitVector::from_bits(b.iter().copied()).to_bytes());
    let ones: Vec<usize> = (0..b.len()).filter(|&i| b[i]).collect();
    let zeros: Vec<usize> = (0..b.len()).filter(|&i| !b[i]).collect();
    let rank4000 = ones.iter().filter(|&&p| p < 4000).count();
    let v = RsBitVector::<LeBytes<'_>>::from_bytes(&f).unwrap();
    assert_eq!((v.len(), v.count_ones(), v.rank1(4000), v.select1(100)), (5000, ones.len(), rank4000, Some(ones[100])));

    // Kind 5: the same bits without their directories.
    let buf = BitBuf::from_bits(b.iter().copied());
    let bare = RsParams { rate: 8, store_directories: false };
    let f = check_file("rs-bare.bin", RsBitVector::build(buf.words().to_vec(), buf.len(), bare).to_bytes());
    let v = RsBitVector::<LeBytes<'_>>::from_bytes(&f).unwrap();
    assert_eq!((v.len(), v.count_ones(), v.rank1(4000), v.select1(100)), (5000, ones.len(), rank4000, Some(ones[100])));
    let bare16 = RsParams { rate: 16, store_directories: false };
    let f =
        check_file("hwt-rs-bare.bin", HuffmanWaveletTree::<RsBitVector>::build(s.iter().copied(), bare16).to_bytes());
    let w = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f).unwrap();
    for (i, &x) in s.iter().enumerate() {
        assert_eq!(w.access(i), x);
    }

    let f = check_file("rrr.bin", RrrBitVector::from_bits(b.iter().copied()).to_bytes());
    let v = RrrBitVector::<LeBytes<'_>>::from_bytes(&f).unwrap();
    assert_eq!((v.count_ones(), v.rank1(4000), v.select0(100)), (ones.len(), rank4000, Some(zeros[100])));

    let f = check_file("hwt-rs.bin", HuffmanWaveletTree::<RsBitVector>::from_symbols(s.iter().copied()).to_bytes());
    let w = HuffmanWaveletTree::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f).unwrap();
    for (i, &x) in s.iter().enumerate() {
        assert_eq!(w.access(i), x);
    }
    assert_eq!(w.rank(443, 5000), s.iter().filter(|&&x| x == 443).count());

    let f = check_file("hwt-rrr.bin", HuffmanWaveletTree::<RrrBitVector>::from_symbols(s.iter().copied()).to_bytes());
    let w = HuffmanWaveletTree::<RrrBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f).unwrap();
    assert_eq!(w.select(3_000_000_000, 0), s.iter().position(|&x| x == 3_000_000_000));

    let f = check_file("wm-rs.bin", WaveletMatrix::<RsBitVector>::from_symbols(s.iter().copied()).to_bytes());
    let w = WaveletMatrix::<RsBitVector<LeBytes<'_>>, LeBytes<'_>>::from_bytes(&f).unwrap();
    assert_eq!(w.count_range(0, 5000, 50, 500), s.iter().filter(|&&x| (50..=500).contains(&x)).count());
}
