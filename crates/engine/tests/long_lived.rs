//! A long-lived source (`OpenOptions::long_lived`, as the service opens its sources) shares one mapping between
//! answers and reads an index's candidates through it, and a long-lived store keeps its decoded flow tables and
//! data mappings: their answers are byte for byte those of a source opened for one answer, the first time and
//! every time after, whatever the budget for what a store keeps.

mod common;

use std::path::{Path, PathBuf};

use common::Dir;
use pcaptool_engine::{OpenOptions, Request, Source, Strategy, TraceSink, WriteOptions};
use pcaptool_flowstore::{Codec, ImportOptions, Store};
use pcaptool_packet::{LinkType, PcapWriter, TsPrecision};

/// 200,000 UDP and TCP packets among 5,000 hosts, of varied lengths.
fn trace(dir: &Path) -> PathBuf {
    let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
    for i in 0..200_000u32 {
        let len = 64 + (i * 7919 % 900) as usize;
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
        f[22] = 64;
        f[23] = if i % 3 == 0 { 6 } else { 17 };
        let host = i.wrapping_mul(2_654_435_761) % 5000;
        f[26..30].copy_from_slice(&[10, 1, (host >> 8) as u8, host as u8]);
        f[30..34].copy_from_slice(&[192, 168, 0, (i % 7) as u8]);
        f[34..36].copy_from_slice(&(1024 + (i % 5000) as u16).to_be_bytes());
        f[36..38].copy_from_slice(&[0, 53]);
        w.write_packet(1_700_000_000_000_000_000 + u64::from(i) * 1000, len as u32, &f).unwrap();
    }
    let path = dir.join("t.pcap");
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

fn answer(source: &Source, req: &Request, out: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(out);
    source.run(req, &mut TraceSink::create(out, WriteOptions::new()).unwrap()).unwrap();
    std::fs::read(out).unwrap()
}

#[test]
fn a_long_lived_source_answers_as_a_source_opened_once() {
    let dir = Dir::new("long-lived");
    let path = trace(&dir.0);
    pcaptool_engine::index_trace(&path, None, &|_| ()).unwrap();
    let once = Source::open(&path).unwrap();
    let kept = Source::open_with(&path, &OpenOptions::new().long_lived(true)).unwrap();
    let out = dir.0.join("out.pcap");
    let mut indexed = 0;
    for filter in [
        "host 10.1.0.17",
        "host 10.1.19.136 or host 10.1.3.3",
        "src host 10.1.4.4 and tcp",
        "host 203.0.113.9",
        "udp and src port 1100",
        "tcp",
        "",
    ] {
        let req = Request::filter(filter).unwrap();
        if once.plan(&req).unwrap().strategy == Strategy::Index {
            indexed += 1;
        }
        let want = answer(&once, &req, &out);
        for round in 0..3 {
            assert!(answer(&kept, &req, &out) == want, "`{filter}`, round {round}: the answers differ");
            assert_eq!(kept.count(&req).unwrap(), once.count(&req).unwrap(), "`{filter}`");
        }
        let limited = req.clone().limit(3);
        assert!(answer(&kept, &limited, &out) == answer(&once, &limited, &out), "`{filter}` limited");
    }
    assert!(indexed >= 4, "only {indexed} filters went through the index");
}

#[test]
fn a_long_lived_store_answers_as_a_store_opened_once() {
    let dir = Dir::new("long-lived-store");
    let path = trace(&dir.0);
    let out = dir.0.join("out.pcap");
    for (name, compress) in [("plain", Codec::None), ("lz4", Codec::Lz4)] {
        let store = dir.0.join(name);
        let opts = ImportOptions { segment_bytes: 8 << 20, compress, ..ImportOptions::default() };
        let stats = Store::create(&store).unwrap().import(&path, &opts, &mut |_| ()).unwrap();
        assert!(stats.segments >= 5, "{} segments", stats.segments);
        let once = Source::open(&store).unwrap();
        // Room for everything; for a few blocks of the flow table (the rest decoded for each answer); none.
        let kept: Vec<Source> = [pcaptool_engine::DEFAULT_INDEX_MEMORY, 1 << 20, 0]
            .into_iter()
            .map(|budget| Source::open_with(&store, &OpenOptions::new().long_lived(true).index_memory(budget)).unwrap())
            .collect();
        for filter in [
            "host 10.1.0.17",
            "host 10.1.19.136 or host 10.1.3.3",
            "src host 10.1.4.4 and tcp",
            "net 10.1.3.0/24 and udp",
            "host 192.168.0.3 and src port 1100",
            "host 203.0.113.9",
            "udp and src port 1100",
            "ip6",
            "",
        ] {
            let req = Request::filter(filter).unwrap();
            let want = answer(&once, &req, &out);
            for (k, source) in kept.iter().enumerate() {
                for round in 0..3 {
                    assert!(answer(source, &req, &out) == want, "{name} `{filter}`, budget {k}, round {round}");
                }
            }
        }
        let flow = Request::filter("").unwrap().flow(7);
        assert!(answer(&kept[0], &flow, &out) == answer(&once, &flow, &out), "{name} flow 7");
    }
}
