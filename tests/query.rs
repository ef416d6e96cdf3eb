//! `pcaptool query` through the binary: outputs against tcpdump's on generated and testdata traces, every output
//! option, the time extension, and errors. Outputs are opened with the real tcpdump and tshark (skipped with a
//! message where they are not installed; CI has them).

use std::path::{Path, PathBuf};
use std::process::Command;

use pcaptool_packet::{FileFormat, TraceReader, TsPrecision};
use pcaptool_tests::tracegen::GenOptions;
use pcaptool_tests::{TempDir, repo_root, tool};
use pcaptool_tests::{generated_trace, path_arg as p, pcaptool, stderr_of as err};
use serde_json::Value;

fn generated(dir: &TempDir, packets: u64) -> PathBuf {
    generated_trace(dir, "gen.pcap", packets, GenOptions::default().seed)
}

/// (timestamp in µs, wire length, bytes) of every record: what tcpdump -w keeps (it writes microseconds).
fn records_us(path: &Path) -> Vec<(u64, u32, Vec<u8>)> {
    records(path).into_iter().map(|(t, w, d)| (t / 1000, w, d)).collect()
}

/// (timestamp ns, wire length, bytes) of every record.
fn records(path: &Path) -> Vec<(u64, u32, Vec<u8>)> {
    let mut r = TraceReader::open(path).unwrap();
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        v.push((rec.ts_ns, rec.wirelen, rec.data.to_vec()));
    }
    v
}

const FILTERS: &[&str] = &[
    "tcp port 80",
    "udp and not port 53",
    "host 10.0.0.1 or net 10.1.0.0/16",
    "tcp[tcpflags] & (tcp-syn|tcp-fin) != 0",
    "ip6 and tcp",
    "vlan and ip",
    "greater 1000",
    "icmp or arp",
];

#[test]
fn query_writes_exactly_what_tcpdump_writes_and_counts_alike() {
    let Some(tcpdump) = tool("tcpdump") else { return };
    let dir = TempDir::new("query-vs-tcpdump");
    let src = generated(&dir, 30_000);
    for f in FILTERS {
        let ours = dir.join("ours.pcap");
        let theirs = dir.join("theirs.pcap");
        let out = pcaptool(&["query", p(&src), f, "-w", p(&ours)]);
        assert!(out.status.success(), "`{f}`: {}", err(&out));
        let t = Command::new(&tcpdump).args(["-r", p(&src), "-w", p(&theirs), f]).output().unwrap();
        assert!(t.status.success(), "tcpdump `{f}`: {}", err(&t));
        // The generated trace has nanosecond timestamps, which pcaptool keeps and tcpdump -w cuts to microseconds.
        let (a, b) = (records_us(&ours), records_us(&theirs));
        assert!(
            a == b,
            "`{f}`: {} packets, tcpdump {}; first difference at {:?}",
            a.len(),
            b.len(),
            a.iter().zip(&b).position(|(x, y)| x != y)
        );
        let count = pcaptool(&["query", p(&src), f, "--count"]);
        let n: usize = String::from_utf8_lossy(&count.stdout).trim().parse().unwrap();
        assert_eq!(n, records(&theirs).len(), "`{f}`: --count");
        // One thread gives the same file as all of them.
        let one = dir.join("one.pcap");
        assert!(pcaptool(&["query", p(&src), f, "-w", p(&one), "--threads", "1"]).status.success());
        assert!(std::fs::read(&one).unwrap() == std::fs::read(&ours).unwrap(), "`{f}`: --threads 1 differs");
    }
}

#[test]
fn outputs_keep_the_input_format_and_open_in_tcpdump_and_tshark() {
    let dir = TempDir::new("query-formats");
    // pcapng with several interfaces and link types stays pcapng; a nanosecond pcap stays nanosecond.
    let ng = repo_root().join("testdata/pcapng-two-sections.pcapng");
    let out_ng = dir.join("out.pcapng");
    let out = pcaptool(&["query", p(&ng), "len > 0", "-w", p(&out_ng)]);
    assert!(out.status.success(), "{}", err(&out));
    let mut r = TraceReader::open(&out_ng).unwrap();
    r.read_header().unwrap();
    assert!(matches!(r.format(), Some(FileFormat::PcapNg { .. })));
    assert!(records(&out_ng) == records(&ng), "every packet of the pcapng, in order");
    let ns = repo_root().join("testdata/pcap-be-ns.pcap");
    let out_ns = dir.join("out-ns.pcap");
    assert!(pcaptool(&["query", p(&ns), "ip or not ip", "-w", p(&out_ns)]).status.success());
    let mut r = TraceReader::open(&out_ns).unwrap();
    r.read_header().unwrap();
    assert!(matches!(r.format(), Some(FileFormat::Pcap { precision: TsPrecision::Nano, .. })));
    assert!(records(&out_ns) == records(&ns), "every packet of the ns pcap");
    // The real tools open the outputs.
    let src = generated(&dir, 5000);
    let sel = dir.join("sel.pcap");
    assert!(pcaptool(&["query", p(&src), "tcp", "-w", p(&sel)]).status.success());
    let n = records(&sel).len();
    if let Some(tcpdump) = tool("tcpdump") {
        let t = Command::new(tcpdump).args(["-nn", "-r", p(&sel)]).output().unwrap();
        assert!(t.status.success());
        assert_eq!(String::from_utf8_lossy(&t.stdout).lines().count(), n);
    }
    if let Some(tshark) = tool("tshark") {
        let t = Command::new(tshark).args(["-r", p(&sel), "-T", "fields", "-e", "frame.number"]).output().unwrap();
        assert!(t.status.success(), "{}", err(&t));
        assert_eq!(String::from_utf8_lossy(&t.stdout).lines().count(), n);
    }
}

#[test]
fn standard_output_limit_and_compressed_input() {
    let Some(tcpdump) = tool("tcpdump") else { return };
    let dir = TempDir::new("query-stdout");
    let src = generated(&dir, 8000);
    // -w - writes the pcap to standard output.
    let out = pcaptool(&["query", p(&src), "udp", "-w", "-"]);
    assert!(out.status.success());
    let piped = dir.join("piped.pcap");
    std::fs::write(&piped, &out.stdout).unwrap();
    let file = dir.join("file.pcap");
    assert!(pcaptool(&["query", p(&src), "udp", "-w", p(&file)]).status.success());
    assert!(out.stdout == std::fs::read(&file).unwrap(), "-w - and -w FILE differ");
    // --limit keeps the first N matches, as tcpdump -c N.
    let lim = dir.join("lim.pcap");
    assert!(pcaptool(&["query", p(&src), "udp", "--limit", "7", "-w", p(&lim)]).status.success());
    let t = dir.join("t.pcap");
    assert!(Command::new(&tcpdump).args(["-r", p(&src), "-c", "7", "-w", p(&t), "udp"]).status().unwrap().success());
    let (a, b) = (records_us(&lim), records_us(&t));
    assert!(a == b && a.len() == 7, "--limit 7: {} packets, tcpdump -c 7: {}", a.len(), b.len());
    // A gzip-compressed trace is read as a stream, with the same result.
    let gz = dir.join("src.pcap.gz");
    assert!(pcaptool(&["convert", p(&src), p(&gz)]).status.success());
    let from_gz = dir.join("gz.pcap");
    assert!(pcaptool(&["query", p(&gz), "udp", "-w", p(&from_gz)]).status.success());
    assert!(std::fs::read(&from_gz).unwrap() == std::fs::read(&file).unwrap(), "the stream path differs");
}

#[test]
fn time_extension_is_packet_exact() {
    let dir = TempDir::new("query-time");
    let src = generated(&dir, 4000);
    let all = records(&src);
    let (a, b) = (all[1000].0, all[3000].0);
    let ours = dir.join("win.pcap");
    let f = format!(
        "after {}.{:09} and before {}.{:09} and tcp",
        a / 1_000_000_000,
        a % 1_000_000_000,
        b / 1_000_000_000,
        b % 1_000_000_000
    );
    let out = pcaptool(&["query", p(&src), &f, "-w", p(&ours)]);
    assert!(out.status.success(), "{}", err(&out));
    let tcp = dir.join("tcp.pcap");
    assert!(pcaptool(&["query", p(&src), "tcp", "-w", p(&tcp)]).status.success());
    let want: Vec<_> = records(&tcp).into_iter().filter(|r| r.0 >= a && r.0 < b).collect();
    assert!(!want.is_empty());
    assert!(records(&ours) == want, "the time window is not packet-exact");
    // RFC 3339 spelling of the same instant.
    let rfc = format!("after {} and before {} and tcp", pcaptool_packet::Rfc3339(a), pcaptool_packet::Rfc3339(b));
    let ours2 = dir.join("win2.pcap");
    assert!(pcaptool(&["query", p(&src), &rfc, "-w", p(&ours2)]).status.success());
    assert!(std::fs::read(&ours2).unwrap() == std::fs::read(&ours).unwrap(), "RFC 3339 and epoch spellings differ");
}

#[test]
fn explain_shows_the_plan_and_the_tests() {
    let dir = TempDir::new("query-explain");
    let src = generated(&dir, 100);
    let out = pcaptool(&["query", p(&src), "tcp dst port 80 or 443", "--explain"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("parsed:    (tcp dst port 80 or tcp dst port 443)"), "{text}");
    assert!(text.contains("port.dst = 80"), "{text}");
    assert!(text.contains("scan every packet (no index)"), "{text}");
    assert!(text.contains("link type ether (1)"), "{text}");
    let out = pcaptool(&["query", p(&src), "host 10.0.0.1", "--explain", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["parsed"], "host 10.0.0.1");
    assert_eq!(v["link_types"][0]["linktype"], 1);
    assert!(v["link_types"][0]["operations"].as_u64().unwrap() > 2);
    assert!(v["link_types"][0]["program"].as_array().unwrap().len() > 2);
    let out = pcaptool(&["query", p(&src), "udp", "--count", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["packets"], 100);
    assert!(v["matched"].as_u64().unwrap() > 0);
}

#[test]
fn errors_are_clear_and_leave_no_output() {
    let dir = TempDir::new("query-errors");
    let src = generated(&dir, 100);
    let out_file = dir.join("out.pcap");
    // A filter error: one message line, the filter, a caret; exit 1; no output file.
    let out = pcaptool(&["query", p(&src), "tcp and gateway x", "-w", p(&out_file)]);
    assert_eq!(out.status.code(), Some(1));
    let e = err(&out);
    assert!(e.starts_with("pcaptool: error: invalid filter: 'gateway' is not supported by pcaptool\n"), "{e}");
    assert!(e.contains("\n  tcp and gateway x\n          ^^^^^^^\n"), "{e}");
    assert!(!out_file.exists());
    // Without -w, --count or --explain the matches are listed, one line each (tests/everyday.rs holds them to
    // tcpdump's list).
    let out = pcaptool(&["query", p(&src), "tcp"]);
    assert_eq!(out.status.code(), Some(0), "{}", err(&out));
    let count = pcaptool(&["query", p(&src), "tcp", "--count"]);
    let n: usize = String::from_utf8_lossy(&count.stdout).trim().parse().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), n);
    // A filter that means nothing on the trace's link type: refused before any output.
    let sll = repo_root().join("testdata/pcapng-two-sections.pcapng");
    let out = pcaptool(&["query", p(&sll), "vlan 5 and ether broadcast", "-w", p(&out_file)]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(!out_file.exists());
    // Like tcpdump, a filter that can match nothing is an error.
    let out = pcaptool(&["query", p(&src), "tcp and udp", "--count"]);
    assert!(err(&out).contains("expression rejects all packets"), "{}", err(&out));
    // Damage: the matches before it are kept, then one error line and exit 1.
    let bad = repo_root().join("testdata/truncated-last-record.pcap");
    let out = pcaptool(&["query", p(&bad), "len > 0", "-w", p(&out_file)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(err(&out).contains("matching packets before it were kept"), "{}", err(&out));
    assert!(!records(&out_file).is_empty());
    // The trace as output is refused.
    let out = pcaptool(&["query", p(&src), "tcp", "-w", p(&src)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(TraceReader::open(&src).is_ok());
}
