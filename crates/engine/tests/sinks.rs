//! The engine's sinks and requests on testdata: every sink sees the same records, a channel stops the answer when
//! its receiver goes, and a request's limit and time window hold on a trace as the filter does.

use std::sync::mpsc::sync_channel;

use pcaptool_engine::{ChannelSink, Counter, FnSink, Request, Source, TraceSink, WriteOptions};
use pcaptool_packet::{Interface, Record, TraceReader};

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tunnels.pcap");

fn times(req: &Request) -> Vec<u64> {
    let mut v = Vec::new();
    Source::open(TRACE)
        .unwrap()
        .run(
            req,
            &mut FnSink(|r: &Record<'_>, _: &[Interface]| {
                v.push(r.ts_ns);
                true
            }),
        )
        .unwrap();
    v
}

#[test]
fn every_sink_sees_the_same_records() {
    let source = Source::open(TRACE).unwrap();
    let req = Request::filter("ip or ip6").unwrap();
    let mut counter = Counter::default();
    let n = source.run(&req, &mut counter).unwrap().matched;
    assert!(n > 1);
    assert_eq!(counter.records, n);
    assert_eq!(source.count(&req).unwrap(), n);
    let (tx, rx) = sync_channel(1024);
    source.run(&req, &mut ChannelSink(tx)).unwrap();
    let sent: Vec<u64> = rx.try_iter().map(|r| r.ts_ns).collect();
    assert_eq!(sent, times(&req));
    let dir = std::env::temp_dir().join(format!("engine-sinks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.pcapng");
    source.run(&req, &mut TraceSink::create(&out, WriteOptions::new()).unwrap()).unwrap();
    let mut r = TraceReader::open(&out).unwrap();
    let mut written = Vec::new();
    while let Some(rec) = r.next_record() {
        written.push(rec.unwrap().ts_ns);
    }
    assert_eq!(written, sent);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_closed_channel_stops_the_answer() {
    let source = Source::open(TRACE).unwrap();
    let (tx, rx) = sync_channel(0);
    drop(rx);
    let out = source.run(&Request::new(), &mut ChannelSink(tx)).unwrap();
    assert!(out.stopped);
    assert!(out.matched <= 1);
}

#[test]
fn limits_and_time_windows_hold_on_a_trace() {
    let all = times(&Request::new());
    assert!(all.len() > 3);
    assert_eq!(times(&Request::new().limit(2)), all[..2].to_vec());
    let (a, b) = (all[1], all[all.len() - 1]);
    let want: Vec<u64> = all.iter().copied().filter(|&t| t >= a && t < b).collect();
    assert_eq!(times(&Request::new().after(a).before(b)), want);
    assert!(Source::open(TRACE).unwrap().run(&Request::new().after(b).before(a), &mut Counter::default()).is_err());
    assert!(Source::open(TRACE).unwrap().run(&Request::new().flow(1), &mut Counter::default()).is_err());
}

#[test]
fn a_plan_is_data() {
    let source = Source::open(TRACE).unwrap();
    let plan = source.plan(&Request::filter("udp port 53").unwrap()).unwrap();
    let v = serde_json::to_value(&plan).unwrap();
    assert_eq!(v["kind"], "trace");
    assert_eq!(v["strategy"], "scan");
    assert_eq!(v["parsed"], "udp port 53");
    assert!(v["link_types"][0]["program"].as_array().is_some_and(|p| !p.is_empty()));
}
