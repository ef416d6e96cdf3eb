//! Succinct structures: ns per access/rank/select of the bit vectors on 10^8 bits and of the wavelet trees on 10M
//! symbols of a skewed 8-bit column (H0 ≈ 1.9), beside sucds's `WaveletMatrix` and qwt's Huffman-shaped `HWT`; and a
//! memory report (bits per symbol against H0) on uniform, Zipf and real header-field sequences. Fixed seeds.
//! Each benchmark runs a batch of 10,000 random queries; criterion's "elements" throughput is queries per second.

use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pcaptool_benches::{Rng, corpus_columns, h0, skewed8, uniform, zipf};
use pcaptool_wavelet::{
    BitBuf, BitVector, BuildBitVector, HuffmanWaveletTree, RrrBitVector, RrrParams, RsBitVector, RsParams,
    WaveletMatrix,
};
use qwt::{AccessUnsigned, RankUnsigned, SelectUnsigned};

const QUERIES: usize = 10_000;

fn bits(n: usize, density: f64, seed: u64) -> (Vec<u64>, usize) {
    let mut rng = Rng::from_state(seed);
    let mut b = BitBuf::with_capacity(n);
    for _ in 0..n {
        b.push(rng.unit() < density);
    }
    let w = b.words().to_vec();
    (w, n)
}

fn bench_bit_vector<B: BitVector>(c: &mut Criterion, name: &str, bv: &B) {
    let mut rng = Rng::from_state(7);
    let pos: Vec<usize> = (0..QUERIES).map(|_| rng.below(bv.len() as u64) as usize).collect();
    let ks: Vec<usize> = (0..QUERIES).map(|_| rng.below(bv.count_ones() as u64) as usize).collect();
    let mut g = c.benchmark_group(format!("bitvector/{name}"));
    g.throughput(Throughput::Elements(QUERIES as u64));
    g.sample_size(20);
    g.bench_function("access", |b| b.iter(|| pos.iter().filter(|&&p| bv.access(black_box(p))).count()));
    g.bench_function("rank1", |b| b.iter(|| pos.iter().map(|&p| bv.rank1(black_box(p))).sum::<usize>()));
    g.bench_function("select1", |b| b.iter(|| ks.iter().map(|&k| bv.select1(black_box(k)).unwrap()).sum::<usize>()));
    g.finish();
    println!(
        "memory: {name}: {:.4} bits per bit ({} bytes for {} bits)",
        bv.size_in_bytes() as f64 * 8.0 / bv.len() as f64,
        bv.size_in_bytes(),
        bv.len()
    );
}

fn bit_vectors(c: &mut Criterion) {
    let n = 100_000_000;
    let (w, len) = bits(n, 0.5, 1);
    bench_bit_vector(c, "rs-rate8-dense", &RsBitVector::build(w.clone(), len, RsParams::with_rate(8)));
    bench_bit_vector(c, "rs-rate32-dense", &RsBitVector::build(w.clone(), len, RsParams::with_rate(32)));
    bench_bit_vector(c, "rrr-b31-dense", &RrrBitVector::build(w, len, RrrParams { block: 31, sample: 32 }));
    let (w, len) = bits(n, 0.05, 2);
    bench_bit_vector(c, "rs-rate8-sparse5%", &RsBitVector::build(w.clone(), len, RsParams::with_rate(8)));
    bench_bit_vector(c, "rrr-b31-sparse5%", &RrrBitVector::build(w.clone(), len, RrrParams { block: 31, sample: 32 }));
    bench_bit_vector(c, "rrr-b63-sparse5%", &RrrBitVector::build(w, len, RrrParams { block: 63, sample: 16 }));
}

/// One wavelet structure behind closures, so ours and the other crates' run the same queries.
struct Ops<'a> {
    name: &'a str,
    access: Box<dyn Fn(usize) -> u32 + 'a>,
    rank: Box<dyn Fn(u32, usize) -> usize + 'a>,
    select: Box<dyn Fn(u32, usize) -> usize + 'a>,
    bytes: usize,
}

fn wavelet_trees(c: &mut Criterion) {
    let n = 10_000_000;
    let seq = skewed8(n, 1.9, 3);
    let entropy = h0(&seq);
    println!("skewed 8-bit column: n = {n}, H0 = {entropy:.3} bits");
    let t = std::time::Instant::now();
    let hwt_rs = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
    println!("build: HuffmanWaveletTree<RsBitVector> of 10M symbols in {:.2?}", t.elapsed());
    let hwt_rrr = HuffmanWaveletTree::<RrrBitVector>::from_symbols(seq.iter().copied());
    let wm_rs = WaveletMatrix::<RsBitVector>::from_symbols(seq.iter().copied());
    let mut cv = sucds::int_vectors::CompactVector::new(8).unwrap();
    for &s in &seq {
        cv.push_int(u64::from(s)).unwrap();
    }
    let sucds_wm = sucds::char_sequences::WaveletMatrix::new(cv, |bv| {
        sucds::bit_vectors::Rank9Sel::new(bv).select1_hints().select0_hints()
    })
    .unwrap();
    let mut qseq: Vec<u8> = seq.iter().map(|&s| s as u8).collect();
    let qwt_hwt = qwt::HWT::<u8>::new(&mut qseq);
    use qwt::mem_dbg::{MemSize, SizeFlags};
    use sucds::Serializable;

    let mut rng = Rng::from_state(11);
    let pos: Vec<usize> = (0..QUERIES).map(|_| rng.below(n as u64) as usize).collect();
    // Rank/select symbols drawn from the sequence itself (frequent symbols are queried more, as in practice).
    let syms: Vec<u32> = (0..QUERIES).map(|_| seq[rng.below(n as u64) as usize]).collect();
    let ks: Vec<usize> = syms.iter().map(|&s| rng.below(hwt_rs.count(s) as u64) as usize).collect();

    let all: Vec<Ops<'_>> = vec![
        Ops {
            name: "pcaptool HuffmanWaveletTree<RsBitVector>",
            access: Box::new(|i| hwt_rs.access(i)),
            rank: Box::new(|s, i| hwt_rs.rank(s, i)),
            select: Box::new(|s, k| hwt_rs.select(s, k).unwrap()),
            bytes: hwt_rs.size_in_bytes(),
        },
        Ops {
            name: "pcaptool HuffmanWaveletTree<RrrBitVector>",
            access: Box::new(|i| hwt_rrr.access(i)),
            rank: Box::new(|s, i| hwt_rrr.rank(s, i)),
            select: Box::new(|s, k| hwt_rrr.select(s, k).unwrap()),
            bytes: hwt_rrr.size_in_bytes(),
        },
        Ops {
            name: "pcaptool WaveletMatrix<RsBitVector>",
            access: Box::new(|i| wm_rs.access(i)),
            rank: Box::new(|s, i| wm_rs.rank(s, i)),
            select: Box::new(|s, k| wm_rs.select(s, k).unwrap()),
            bytes: wm_rs.size_in_bytes(),
        },
        Ops {
            name: "sucds WaveletMatrix<Rank9Sel>",
            access: Box::new(|i| sucds_wm.access(i).unwrap() as u32),
            rank: Box::new(|s, i| sucds_wm.rank(i, u64::from(s)).unwrap()),
            select: Box::new(|s, k| sucds_wm.select(k, u64::from(s)).unwrap()),
            bytes: sucds_wm.size_in_bytes(),
        },
        Ops {
            name: "qwt HWT<u8>",
            access: Box::new(|i| u32::from(qwt_hwt.get(i).unwrap())),
            rank: Box::new(|s, i| qwt_hwt.rank(s as u8, i).unwrap()),
            select: Box::new(|s, k| qwt_hwt.select(s as u8, k).unwrap()),
            bytes: qwt_hwt.mem_size(SizeFlags::default()),
        },
    ];
    // Every structure gives the same answers on the query set before anything is timed.
    for o in &all[1..] {
        for q in 0..200 {
            assert_eq!((o.access)(pos[q]), (all[0].access)(pos[q]), "{} access", o.name);
            assert_eq!((o.rank)(syms[q], pos[q]), (all[0].rank)(syms[q], pos[q]), "{} rank", o.name);
            assert_eq!((o.select)(syms[q], ks[q]), (all[0].select)(syms[q], ks[q]), "{} select", o.name);
        }
    }
    let mut g = c.benchmark_group("wavelet/skewed8-10M");
    g.throughput(Throughput::Elements(QUERIES as u64));
    g.sample_size(20);
    for o in &all {
        println!(
            "memory: {}: {:.3} bits per symbol (H0 {:.3}, ratio {:.2})",
            o.name,
            o.bytes as f64 * 8.0 / n as f64,
            entropy,
            o.bytes as f64 * 8.0 / n as f64 / entropy
        );
        g.bench_with_input(BenchmarkId::new("access", o.name), &pos, |b, pos| {
            b.iter(|| pos.iter().map(|&p| (o.access)(black_box(p)) as usize).sum::<usize>())
        });
        g.bench_with_input(BenchmarkId::new("rank", o.name), &pos, |b, pos| {
            b.iter(|| pos.iter().zip(&syms).map(|(&p, &s)| (o.rank)(s, black_box(p))).sum::<usize>())
        });
        g.bench_with_input(BenchmarkId::new("select", o.name), &ks, |b, ks| {
            b.iter(|| ks.iter().zip(&syms).map(|(&k, &s)| (o.select)(s, black_box(k))).sum::<usize>())
        });
    }
    g.finish();
}

fn build_time(c: &mut Criterion) {
    let seq = zipf(1_000_000, 65_536, 5);
    let mut g = c.benchmark_group("build/1M-zipf-65536");
    g.sample_size(10);
    g.bench_function("HuffmanWaveletTree<RsBitVector>", |b| {
        b.iter(|| HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied()).len())
    });
    g.bench_function("HuffmanWaveletTree<RrrBitVector>", |b| {
        b.iter(|| HuffmanWaveletTree::<RrrBitVector>::from_symbols(seq.iter().copied()).len())
    });
    g.bench_function("WaveletMatrix<RsBitVector>", |b| {
        b.iter(|| WaveletMatrix::<RsBitVector>::from_symbols(seq.iter().copied()).len())
    });
    g.finish();
}

/// Bits per symbol of every structure against H0 (printed; not timed).
fn memory_report(_: &mut Criterion) {
    let n = 1_000_000;
    let mut sets: Vec<(String, Vec<u32>)> = vec![
        ("uniform 256".into(), uniform(n, 256, 1)),
        ("uniform 65536".into(), uniform(n, 65_536, 2)),
        ("zipf 256".into(), zipf(n, 256, 3)),
        ("zipf 65536".into(), zipf(n, 65_536, 4)),
        ("skewed 8-bit, H0 1.9".into(), skewed8(n, 1.9, 5)),
    ];
    match corpus_columns(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), n) {
        Some(cols) => sets.extend(cols.into_iter().map(|(name, v)| (name.to_string(), v))),
        None => println!("memory report: ../shared/corpus absent; real header-field columns skipped"),
    }
    println!("| sequence | n | sigma | H0 | HWT<Rs> | HWT<Rrr> | WM<Rs> | sucds WM | qwt HWT |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, seq) in &sets {
        let n = seq.len();
        let bps = |bytes: usize| bytes as f64 * 8.0 / n as f64;
        let a = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
        let b = HuffmanWaveletTree::<RrrBitVector>::from_symbols(seq.iter().copied());
        let w = WaveletMatrix::<RsBitVector>::from_symbols(seq.iter().copied());
        let width = (32 - seq.iter().max().copied().unwrap_or(0).leading_zeros()).max(1) as usize;
        let mut cv = sucds::int_vectors::CompactVector::new(width).unwrap();
        for &s in seq {
            cv.push_int(u64::from(s)).unwrap();
        }
        let s = sucds::char_sequences::WaveletMatrix::new(cv, |bv| {
            sucds::bit_vectors::Rank9Sel::new(bv).select1_hints().select0_hints()
        })
        .unwrap();
        use sucds::Serializable;
        // qwt sizes tables by the largest symbol: give it dictionary-mapped (dense) symbols, as pcapWT would.
        let mut dict: Vec<u32> = seq.clone();
        dict.sort_unstable();
        dict.dedup();
        let mut q: Vec<u32> = seq.iter().map(|s| dict.binary_search(s).expect("present") as u32).collect();
        let qh = qwt::HWT::<u32>::new(&mut q);
        use qwt::mem_dbg::{MemSize, SizeFlags};
        println!(
            "| {name} | {n} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            a.sigma(),
            h0(seq),
            bps(a.size_in_bytes()),
            bps(b.size_in_bytes()),
            bps(w.size_in_bytes()),
            bps(s.size_in_bytes()),
            bps(qh.mem_size(SizeFlags::default()))
        );
    }
}

criterion_group!(benches, memory_report, build_time, wavelet_trees, bit_vectors);
criterion_main!(benches);
