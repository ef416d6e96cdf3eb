//! A request's cancel flag stops every kind of answer: a scan, an index's chunk scan, candidates read through the
//! index, a piped scan into a file, and a store.

mod common;

use std::path::{Path, PathBuf};

use common::Dir;
use pcaptool_engine::{Cancel, Error, FnSink, OpenOptions, Request, Source, TraceSink, WriteOptions};
use pcaptool_flowstore::{ImportOptions, Store};
use pcaptool_packet::{Interface, LinkType, PcapWriter, Record, TsPrecision};

const PACKETS: u32 = 100_000;

/// UDP packets of 40 flows, one every microsecond.
fn trace(dir: &Path) -> PathBuf {
    let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
    for i in 0..PACKETS {
        let mut f = vec![0u8; 64];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&50u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, (i % 40) as u8]);
        f[30..34].copy_from_slice(&[10, 0, 1, 1]);
        f[34..36].copy_from_slice(&(1000 + (i % 40) as u16).to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        w.write_packet(1_700_000_000_000_000_000 + u64::from(i) * 1000, 64, &f).unwrap();
    }
    let path = dir.join("t.pcap");
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

/// Runs `req` with a sink that sets `cancel` at the first record; the answer must fail as cancelled, having given
/// fewer records than the whole answer.
fn cancelled_at_first_record(source: &Source, filter: &str) {
    let cancel = Cancel::new();
    let req = Request::filter(filter).unwrap().with_cancel(cancel.clone());
    let mut seen = 0u64;
    let result = source.run(
        &req,
        &mut FnSink(|_: &Record<'_>, _: &[Interface]| {
            seen += 1;
            cancel.cancel();
            true
        }),
    );
    assert!(matches!(result, Err(Error::Cancelled)), "{:?} `{filter}`: {result:?}", source.kind());
    let whole = source.count(&Request::filter(filter).unwrap()).unwrap();
    assert!(seen > 0 && seen < whole, "{:?} `{filter}`: {seen} records given of {whole}", source.kind());
}

#[test]
fn a_cancelled_request_stops_a_scan_and_every_indexed_path() {
    let dir = Dir::new("cancel-trace");
    let t = trace(&dir.0);
    let scan = Source::open_with(&t, &OpenOptions::new().use_index(false)).unwrap();
    cancelled_at_first_record(&scan, "udp");
    pcaptool_engine::index_trace(&t, Some(4096), &|_| ()).unwrap();
    let indexed = Source::open(&t).unwrap();
    // Every packet: the index's chunks scanned in parallel; one host of 40: its candidates read.
    cancelled_at_first_record(&indexed, "udp");
    cancelled_at_first_record(&indexed, "src host 10.0.0.7");
    // Into a file (the piped scan, deciders beside one writer), cancelled before it starts: no file is left.
    let out = dir.0.join("out.pcap");
    let cancel = Cancel::new();
    cancel.cancel();
    let req = Request::filter("udp").unwrap().with_cancel(cancel);
    let result = indexed.run(&req, &mut TraceSink::create(&out, WriteOptions::new()).unwrap());
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert!(!out.exists(), "a cancelled answer left {}", out.display());
}

#[test]
fn a_cancelled_request_stops_a_store_answer() {
    let dir = Dir::new("cancel-store");
    let t = trace(&dir.0);
    let store = dir.0.join("store");
    Store::create(&store).unwrap().import(&t, &ImportOptions::default(), &mut |_| ()).unwrap();
    let source = Source::open(&store).unwrap();
    cancelled_at_first_record(&source, "udp");
}
