//! Packet core: record iteration (pcap and pcapng, against pcap-parser), decoding and writing, on a 64 MiB
//! generated trace held in memory (fixed seed). Throughput is reported in bytes of trace per second.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pcaptool_packet::{OutputFormat, Records, TraceReader, TraceWriter, TsPrecision, decode};
use pcaptool_tests::tracegen::{GenOptions, generate};

fn trace() -> Vec<u8> {
    let opt = GenOptions { packets: u64::MAX, max_bytes: 64 << 20, ..GenOptions::default() };
    generate(Vec::new(), &opt).expect("generate").0
}

fn to_pcapng(pcap: &[u8]) -> Vec<u8> {
    let mut r = TraceReader::from_bytes(pcap.to_vec(), None);
    let mut w = TraceWriter::new(Vec::new(), OutputFormat::PcapNg(Some(TsPrecision::Nano))).unwrap();
    while let Some(x) = r.next_with_interfaces() {
        let (rec, ifaces) = x.unwrap();
        w.write(&rec, ifaces).unwrap();
    }
    w.finish(&[]).unwrap()
}

fn bench(c: &mut Criterion) {
    let pcap = trace();
    let ng = to_pcapng(&pcap);
    let n = Records::new(&pcap).count() as u64;

    let mut g = c.benchmark_group("read");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(pcap.len() as u64));
    g.bench_function("bare_header_walk", |b| {
        b.iter(|| {
            let d = black_box(&pcap[..]);
            let (mut p, mut k) = (24, 0u64);
            while p + 16 <= d.len() {
                k += 1;
                p += 16 + u32::from_le_bytes([d[p + 8], d[p + 9], d[p + 10], d[p + 11]]) as usize;
            }
            k
        })
    });
    g.bench_function("records_pcap", |b| b.iter(|| Records::new(black_box(&pcap)).filter(|r| r.is_ok()).count()));
    g.bench_function("pcap_parser_legacy", |b| {
        use pcap_parser::traits::PcapReaderIterator;
        b.iter(|| {
            let mut r = pcap_parser::LegacyPcapReader::new(1 << 20, black_box(&pcap[..])).unwrap();
            let mut k = 0u64;
            loop {
                match r.next() {
                    Ok((off, _)) => {
                        k += 1;
                        r.consume(off);
                    }
                    Err(pcap_parser::PcapError::Eof) => break,
                    Err(pcap_parser::PcapError::Incomplete(_)) => r.refill().unwrap(),
                    Err(e) => panic!("{e:?}"),
                }
            }
            k
        })
    });
    g.throughput(Throughput::Bytes(ng.len() as u64));
    g.bench_function("records_pcapng", |b| b.iter(|| Records::new(black_box(&ng)).filter(|r| r.is_ok()).count()));
    g.bench_function("stream_pcapng", |b| {
        b.iter(|| {
            let mut r = TraceReader::from_reader(Box::new(std::io::Cursor::new(ng.clone())), None).unwrap();
            let mut k = 0;
            while let Some(Ok(_)) = r.next_record() {
                k += 1;
            }
            k
        })
    });
    g.finish();

    let mut g = c.benchmark_group("decode");
    g.sample_size(20);
    g.throughput(Throughput::Elements(n));
    g.bench_function("decode_all", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for r in Records::new(&pcap) {
                let r = r.unwrap();
                let d = decode(r.linktype, r.data);
                acc += d.flow().map_or(0, |(k, _)| u64::from(k.lo_port));
            }
            acc
        })
    });
    g.finish();

    let mut g = c.benchmark_group("write");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(pcap.len() as u64));
    g.bench_function("pcapng_from_pcap", |b| b.iter(|| to_pcapng(black_box(&pcap)).len()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
