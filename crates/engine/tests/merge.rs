//! A merged source answers as one trace holding all its parts' packets would: the same records in the same
//! order, the same pcap bytes, counts and limits; a failing part fails the answer or, with `partial`, is named
//! and left out.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::Dir;
use pcaptool_engine::{Cancel, Error, FnSink, OpenOptions, Request, Source, SourceKind, TraceSink, WriteOptions};
use pcaptool_flowstore::{ImportOptions, Store};
use pcaptool_packet::{Interface, LinkType, PcapWriter, Record, TsPrecision};

/// Packet `i`: UDP or TCP between 40 hosts and a server, one every 1,000 ns plus a jitter.
fn packet(i: u32) -> (u64, Vec<u8>) {
    let mut f = vec![0u8; 60 + (i as usize * 13) % 200];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = if i.is_multiple_of(3) { 6 } else { 17 };
    f[26..30].copy_from_slice(&[10, 0, 0, (i % 40) as u8]);
    f[30..34].copy_from_slice(&[10, 0, 1, 1]);
    f[34..36].copy_from_slice(&(1000 + (i % 40) as u16).to_be_bytes());
    f[36..38].copy_from_slice(&53u16.to_be_bytes());
    (1_700_000_000_000_000_000 + u64::from(i) * 1000 + u64::from(i * 7 % 500), f)
}

fn write(path: &Path, which: impl Fn(u32) -> bool) {
    let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
    for i in (0..30_000).filter(|&i| which(i)) {
        let (ts, f) = packet(i);
        w.write_packet(ts, f.len() as u32, &f).unwrap();
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

fn answer(source: &Source, req: &Request) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    let mut v = Vec::new();
    source.run(
        req,
        &mut FnSink(|r: &Record<'_>, _: &[Interface]| {
            v.push((r.ts_ns, r.data.to_vec()));
            true
        }),
    )?;
    Ok(v)
}

/// The whole trace, and three parts of it (packet i in part i mod 3): a trace, an indexed trace and a store.
fn parts(dir: &Dir) -> (Source, Vec<(String, Arc<Source>)>) {
    let whole = dir.0.join("whole.pcap");
    write(&whole, |_| true);
    let mut parts = Vec::new();
    for k in 0..3u32 {
        let p = dir.0.join(format!("part{k}.pcap"));
        write(&p, |i| i % 3 == k);
        let source = match k {
            0 => Source::open_with(&p, &OpenOptions::new().use_index(false)).unwrap(),
            1 => {
                pcaptool_engine::index_trace(&p, Some(2048), &|_| ()).unwrap();
                Source::open(&p).unwrap()
            }
            _ => {
                let st = dir.0.join("store");
                Store::create(&st).unwrap().import(&p, &ImportOptions::default(), &mut |_| ()).unwrap();
                Source::open(&st).unwrap()
            }
        };
        parts.push((format!("part{k}"), Arc::new(source)));
    }
    (Source::open_with(&whole, &OpenOptions::new().use_index(false)).unwrap(), parts)
}

#[test]
fn a_merged_source_answers_as_the_whole_trace() {
    let dir = Dir::new("merge-whole");
    let (whole, parts) = parts(&dir);
    let merged = Source::merged(parts, false);
    assert_eq!(merged.kind(), SourceKind::Merged);
    assert_eq!(merged.path(), Path::new("part0,part1,part2"));
    for f in ["", "udp", "tcp", "src host 10.0.0.7", "udp and src port 1005", "host 192.0.2.1"] {
        let req = Request::filter(f).unwrap();
        let want = answer(&whole, &req).unwrap();
        assert_eq!(answer(&merged, &req).unwrap(), want, "`{f}`");
        assert_eq!(merged.count(&req).unwrap(), want.len() as u64, "`{f}`: count");
        let limited = req.clone().limit(25);
        assert_eq!(answer(&merged, &limited).unwrap(), want[..want.len().min(25)], "`{f}`: limit");
        // The same pcap bytes as the whole trace's answer.
        let (a, b) = (dir.0.join("a.pcap"), dir.0.join("b.pcap"));
        merged.run(&req, &mut TraceSink::create(&a, WriteOptions::new()).unwrap()).unwrap();
        whole.run(&req, &mut TraceSink::create(&b, WriteOptions::new()).unwrap()).unwrap();
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "`{f}`: the pcap files differ");
    }
    let plan = merged.plan(&Request::filter("udp").unwrap()).unwrap();
    assert_eq!(plan.parts.len(), 3);
    assert_eq!(plan.parts[2].source, "part2");
    // A store's flows, named by their store.
    let flows = merged.flows(&Request::filter("udp").unwrap()).unwrap();
    assert!(!flows.is_empty() && flows.iter().all(|f| f.source.as_deref() == Some("part2")));
}

#[test]
fn a_failing_part_fails_the_answer_unless_partial() {
    let dir = Dir::new("merge-failing");
    let (_, mut parts) = parts(&dir);
    // A raw-IP trace: `ether host` means nothing there, as tcpdump says.
    let raw = dir.0.join("raw.pcap");
    let mut w = PcapWriter::new(Vec::new(), LinkType(101), 65535, TsPrecision::Nano).unwrap();
    let (ts, f) = packet(1);
    w.write_packet(ts, (f.len() - 14) as u32, &f[14..]).unwrap();
    std::fs::write(&raw, w.finish().unwrap()).unwrap();
    parts.push(("raw".into(), Arc::new(Source::open(&raw).unwrap())));
    let req = Request::filter("ether src 00:00:00:00:00:00").unwrap();
    match answer(&Source::merged(parts.clone(), false), &req) {
        Err(Error::Part { name, .. }) => assert_eq!(name, "raw"),
        other => panic!("{other:?}"),
    }
    let partial = Source::merged(parts, true);
    let mut n = 0;
    let out = partial
        .run(
            &req,
            &mut FnSink(|_: &Record<'_>, _: &[Interface]| {
                n += 1;
                true
            }),
        )
        .unwrap();
    assert_eq!((out.matched, n), (30_000, 30_000));
    assert_eq!(out.failed.len(), 1);
    assert_eq!(out.failed[0].0, "raw");
}

#[test]
fn a_cancelled_merged_answer_stops() {
    let dir = Dir::new("merge-cancel");
    let (_, parts) = parts(&dir);
    let merged = Source::merged(parts, false);
    let cancel = Cancel::new();
    let req = Request::filter("").unwrap().with_cancel(cancel.clone());
    let mut seen = 0;
    let r = merged.run(
        &req,
        &mut FnSink(|_: &Record<'_>, _: &[Interface]| {
            seen += 1;
            cancel.cancel();
            true
        }),
    );
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert!(seen < 30_000, "{seen}");
}
