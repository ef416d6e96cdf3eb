//! Quick timing of one filter: `cargo run --release -p pcaptool-benches --example qspeed -- 'tcp port 80'`.
use std::time::Instant;

use pcaptool_packet::{LinkType, Records};
use pcaptool_query::{Filter, Target};
use pcaptool_tests::libpcap::Handle;
use pcaptool_tests::tracegen::{GenOptions, generate};

fn main() {
    let text = std::env::args().nth(1).unwrap_or_else(|| "tcp port 80".into());
    let trace = generate(
        Vec::new(),
        &GenOptions {
            packets: std::env::var("N").ok().and_then(|n| n.parse().ok()).unwrap_or(200_000),
            ..GenOptions::default()
        },
    )
    .unwrap()
    .0;
    let packets: Vec<(&[u8], u32)> = Records::new(&trace).map(|r| r.unwrap()).map(|r| (r.data, r.wirelen)).collect();
    let m = Filter::new(&text).unwrap().compile(Target::new(LinkType(1))).unwrap();
    let bpf = Handle::dead(1).compile(&text).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..(2_000_000 / packets.len()) {
            n += packets.iter().filter(|(d, w)| m.matches(std::hint::black_box(d), *w, 0)).count();
        }
        let a = t.elapsed();
        let t = Instant::now();
        let mut k = 0;
        for _ in 0..(2_000_000 / packets.len()) {
            k += packets.iter().filter(|(d, w)| bpf.matches(std::hint::black_box(d), *w)).count();
        }
        let b = t.elapsed();
        println!(
            "{text}: pcaptool {:.1} ns/pkt, libpcap {:.1} ns/pkt ({n} {k}), ops {}",
            a.as_nanos() as f64 / 2e6,
            b.as_nanos() as f64 / 2e6,
            m.len()
        );
    }
}
