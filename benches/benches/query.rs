//! Filter evaluation: pcaptool's compiled matcher (jump-threaded bytecode), its reference tree evaluator, and
//! libpcap's `pcap_offline_filter` (the BPF interpreter tcpdump runs, optimised program), on the same 200,000
//! packets of a generated trace (fixed seed, group `filter/`, about 140 MB: memory-bound), and on the first 2,000
//! of them (group `hot/`, in cache: the cost of evaluating). Throughput is in packets per second. Group `compile/`:
//! parsing and compiling long `or` lists (the optimiser's cost), pcaptool against libpcap's `pcap_compile` where
//! libpcap takes less than a few seconds.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pcaptool_packet::{LinkType, Records};
use pcaptool_query::prog::Packet;
use pcaptool_query::{Filter, Target};
use pcaptool_tests::libpcap::Handle;
use pcaptool_tests::tracegen::{GenOptions, generate};

const FILTERS: &[(&str, &str)] = &[
    ("ip", "ip"),
    ("host", "host 10.0.1.25"),
    ("tcp_port", "tcp port 80"),
    ("net_and_udp", "net 198.18.0.0/24 and udp"),
    ("port_list", "tcp port 80 or 443 or 8080 or 22"),
    ("tcp_syn", "tcp[tcpflags] & tcp-syn != 0"),
    ("ip6_portrange", "ip6 and tcp dst portrange 1000-2000"),
    ("not_tcp_udp", "not (tcp or udp)"),
    ("vlan_host", "vlan and host 10.0.1.25"),
    ("complex", "(tcp and (port 80 or port 443) and not net 10.0.1.0/24) or (udp and port 53 and greater 200)"),
];

fn bench(c: &mut Criterion) {
    let opt = GenOptions { packets: 200_000, ..GenOptions::default() };
    let trace = generate(Vec::new(), &opt).expect("generate").0;
    let packets: Vec<(&[u8], u32)> =
        Records::new(&trace).map(|r| r.expect("record")).map(|r| (r.data, r.wirelen)).collect();
    let dead = Handle::dead(1);
    for (name, text) in FILTERS {
        let f = Filter::new(text).expect("filter parses");
        let target = Target::new(LinkType(1));
        let m = f.compile(target).expect("filter compiles");
        let tree = f.cond(target).expect("filter compiles");
        let bpf = dead.compile(text).expect("libpcap compiles");
        // All three agree on every packet before they are timed.
        for (d, w) in &packets {
            let p = Packet { data: d, wirelen: *w, ts_ns: 0 };
            assert_eq!(m.matches(d, *w, 0), bpf.matches(d, *w), "{text}");
            assert_eq!(tree.eval(&p) == Some(true), bpf.matches(d, *w), "{text}");
        }
        let mut g = c.benchmark_group(format!("filter/{name}"));
        g.sample_size(20);
        g.throughput(Throughput::Elements(packets.len() as u64));
        g.bench_function("pcaptool_bytecode", |b| {
            b.iter(|| packets.iter().filter(|(d, w)| m.matches(black_box(d), *w, 0)).count())
        });
        g.bench_function("pcaptool_tree", |b| {
            b.iter(|| {
                packets
                    .iter()
                    .filter(|(d, w)| tree.eval(&Packet { data: black_box(d), wirelen: *w, ts_ns: 0 }) == Some(true))
                    .count()
            })
        });
        g.bench_function("libpcap_offline_filter", |b| {
            b.iter(|| packets.iter().filter(|(d, w)| bpf.matches(black_box(d), *w)).count())
        });
        g.finish();
        // The same filter on 2,000 packets (about 1.4 MB, in cache): the cost of evaluating, not of memory.
        let hot = &packets[..2000];
        let mut g = c.benchmark_group(format!("hot/{name}"));
        g.sample_size(20);
        g.throughput(Throughput::Elements(hot.len() as u64));
        g.bench_function("pcaptool_bytecode", |b| {
            b.iter(|| hot.iter().filter(|(d, w)| m.matches(black_box(d), *w, 0)).count())
        });
        g.bench_function("libpcap_offline_filter", |b| {
            b.iter(|| hot.iter().filter(|(d, w)| bpf.matches(black_box(d), *w)).count())
        });
        g.finish();
    }
}

/// Parsing and compiling `or` lists of `port` and `host` terms.
fn compile(c: &mut Criterion) {
    let ports = |n: usize| (0..n).map(|i| format!("port {}", i + 1)).collect::<Vec<_>>().join(" or ");
    let hosts =
        |n: usize| (0..n).map(|i| format!("host 10.0.{}.{}", i / 256, i % 256)).collect::<Vec<_>>().join(" or ");
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    for (name, text, libpcap_too) in [
        ("port_x40", ports(40), true),
        ("port_x100", ports(100), true),
        ("port_x1000", ports(1000), false),
        ("port_x10000", ports(10_000), false),
        ("host_x10000", hosts(10_000), false),
    ] {
        g.bench_function(format!("{name}/pcaptool"), |b| {
            b.iter(|| Filter::new(black_box(&text)).and_then(|f| f.compile(Target::new(LinkType::ETHERNET))).is_ok())
        });
        if libpcap_too {
            let h = Handle::dead(1);
            g.bench_function(format!("{name}/libpcap"), |b| b.iter(|| h.compile(black_box(&text)).is_ok()));
        }
    }
    g.finish();
}

criterion_group!(benches, bench, compile);
criterion_main!(benches);
