//! Criterion benchmarks of the pcaptool crates live in `benches/`; the side-by-side harness against tcpdump is
//! `cargo xtask bench`. Results and commands: docs/BENCHMARKS.md. This library holds the data sets they share.

#![forbid(unsafe_code)]

use std::path::Path;

/// SplitMix64 from the trace generator, started from a raw state so the data sets stay those of docs/BENCHMARKS.md.
pub use pcaptool_tests::tracegen::Rng;

/// Empirical entropy H0 in bits per symbol.
pub fn h0(seq: &[u32]) -> f64 {
    let mut counts = std::collections::HashMap::new();
    for &s in seq {
        *counts.entry(s).or_insert(0u64) += 1;
    }
    let n = seq.len() as f64;
    counts.values().map(|&c| c as f64 / n).map(|p| -p * p.log2()).sum()
}

/// Samples from a distribution given by cumulative weights.
fn sample(cdf: &[f64], rng: &mut Rng) -> u32 {
    let u = rng.unit() * cdf[cdf.len() - 1];
    cdf.partition_point(|&c| c <= u).min(cdf.len() - 1) as u32
}

/// `n` symbols over 256 values with geometric frequencies tuned so that H0 is about `target` bits.
pub fn skewed8(n: usize, target: f64, seed: u64) -> Vec<u32> {
    let weights = |r: f64| (0..256).map(|k| r.powi(k)).collect::<Vec<f64>>();
    let entropy = |w: &[f64]| {
        let t: f64 = w.iter().sum();
        w.iter().map(|x| x / t).filter(|&p| p > 0.0).map(|p| -p * p.log2()).sum::<f64>()
    };
    let (mut lo, mut hi) = (0.01f64, 0.999f64);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if entropy(&weights(mid)) < target { lo = mid } else { hi = mid }
    }
    let w = weights(lo);
    let mut cdf = Vec::with_capacity(256);
    let mut acc = 0.0;
    for x in w {
        acc += x;
        cdf.push(acc);
    }
    let mut rng = Rng::from_state(seed);
    (0..n).map(|_| sample(&cdf, &mut rng)).collect()
}

/// `n` symbols uniform over `0..sigma`.
pub fn uniform(n: usize, sigma: u32, seed: u64) -> Vec<u32> {
    let mut rng = Rng::from_state(seed);
    (0..n).map(|_| rng.below(u64::from(sigma)) as u32).collect()
}

/// `n` symbols Zipf-distributed (s = 1) over `0..sigma`.
pub fn zipf(n: usize, sigma: u32, seed: u64) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(sigma as usize);
    let mut acc = 0.0;
    for k in 1..=sigma {
        acc += 1.0 / f64::from(k);
        cdf.push(acc);
    }
    let mut rng = Rng::from_state(seed);
    (0..n).map(|_| sample(&cdf, &mut rng)).collect()
}

/// Header-field columns of real traffic: destination ports, IPv4 source addresses and wire lengths of the packets
/// of `../shared/corpus` (up to `max` packets), or `None` when the corpus is absent.
pub fn corpus_columns(root: &Path, max: usize) -> Option<[(&'static str, Vec<u32>); 3]> {
    let corpus = root.join("../shared/corpus");
    let cat = std::fs::read_to_string(corpus.join("CATALOGUE.tsv")).ok()?;
    let (mut ports, mut addrs, mut lens) = (Vec::new(), Vec::new(), Vec::new());
    'files: for line in cat.lines().skip(1) {
        let Some(path) = line.split('\t').next() else { continue };
        let Ok(mut r) = pcaptool_packet::TraceReader::open(corpus.join(path)) else { continue };
        while let Some(Ok(rec)) = r.next_record() {
            let d = pcaptool_packet::decode(rec.linktype, rec.data);
            lens.push(rec.wirelen);
            if let Some((_, dp)) = d.transport.and_then(|t| t.ports()) {
                ports.push(u32::from(dp));
            }
            if let Some(std::net::IpAddr::V4(a)) = d.ip.map(|ip| ip.src) {
                addrs.push(u32::from(a));
            }
            if lens.len() >= max {
                break 'files;
            }
        }
    }
    Some([("corpus dst ports", ports), ("corpus IPv4 src", addrs), ("corpus wire lengths", lens)])
}
