//! The retrieval engine as a library and the one output path of `pcaptool query`:
//!
//! - a program outside the workspace that depends only on `pcaptool-engine` (tests/external) answers a filter
//!   over a trace, an indexed trace and a store with the bytes `pcaptool query` writes;
//! - outputs take their format and compression from their name, a store answer of one link type is pcap that
//!   tcpdump reads (whatever the snapshot lengths), an empty pcapng answer is a file tcpdump opens, `--json` holds
//!   on stores, and a closed pipe ends every output quietly.
//!
//! Outputs are opened with the real tcpdump (skipped with a message where it is not installed; CI has it).

use std::path::{Path, PathBuf};
use std::process::Command;

use pcaptool_packet::{FileFormat, TraceReader};
use pcaptool_tests::{TempDir, pcaptool_bin, repo_root, tool};
use pcaptool_tests::{generated_trace as generated, path_arg as p, pcaptool, stderr_of as err};

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

fn format_of(path: &Path) -> Option<FileFormat> {
    let mut r = TraceReader::open(path).unwrap();
    r.read_header().unwrap();
    r.format()
}

/// Builds tests/external (a crate of its own that depends on `pcaptool-engine` by path and nothing else) and
/// returns its binary.
fn engine_user() -> PathBuf {
    let root = repo_root();
    let target = root.join("target/external");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--quiet", "--locked", "--manifest-path"])
        .arg(root.join("tests/external/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .expect("run cargo");
    assert!(out.status.success(), "building tests/external: {}", err(&out));
    target.join("debug/engine-user")
}

#[test]
fn a_program_depending_only_on_the_engine_answers_as_pcaptool_query() {
    let tmp = TempDir::new("engine-external");
    let user = engine_user();
    let plain = generated(&tmp, "plain.pcap", 20_000, 30);
    let indexed = tmp.join("indexed.pcap");
    std::fs::copy(&plain, &indexed).unwrap();
    let o = pcaptool(&["index", p(&indexed), "--chunk-packets", "4096"]);
    assert!(o.status.success(), "{}", err(&o));
    let store = tmp.join("store");
    let o = pcaptool(&["import", p(&plain), "--store", p(&store), "--segment-size", "1M"]);
    assert!(o.status.success(), "{}", err(&o));
    let tunnels = repo_root().join("testdata/tunnels.pcap");
    let sources = [(&plain, "Trace"), (&indexed, "IndexedTrace"), (&store, "Store"), (&tunnels, "Trace")];
    let mut compared = 0;
    for (source, kind) in sources {
        for f in ["tcp port 443", "host 10.0.1.5", "udp and port 53", "ip6", "vlan and tcp", "arp or icmp", "ip"] {
            let (a, b) = (tmp.join("engine.pcap"), tmp.join("cli.pcap"));
            let ours = Command::new(&user).arg(source).arg(f).arg(&a).output().unwrap();
            assert!(ours.status.success(), "{}: `{f}`: {}", source.display(), err(&ours));
            let said = String::from_utf8_lossy(&ours.stdout).into_owned();
            assert!(said.split_whitespace().nth(1) == Some(kind), "{}: kind {said}", source.display());
            let cli = pcaptool(&["query", p(source), f, "-w", p(&b)]);
            assert!(cli.status.success(), "{}: `{f}`: {}", source.display(), err(&cli));
            let (ea, eb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
            assert!(ea == eb, "{}: `{f}`: the engine's output differs from pcaptool query's", source.display());
            let matched: usize = said.split_whitespace().next().unwrap().parse().unwrap();
            assert_eq!(matched, records(&a).len(), "{}: `{f}`: count", source.display());
            compared += 1;
        }
    }
    // The three kinds answer alike: the store and the index give the trace's packets.
    for f in ["tcp port 443", "udp and port 53"] {
        let outs: Vec<_> = [&plain, &indexed, &store]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let out = tmp.join(&format!("same-{i}.pcap"));
                assert!(pcaptool(&["query", p(s), f, "-w", p(&out)]).status.success());
                records(&out)
            })
            .collect();
        assert!(!outs[0].is_empty());
        assert!(outs[0] == outs[1] && outs[0] == outs[2], "`{f}`: trace, index and store differ");
    }
    eprintln!("{compared} answers of a program outside the workspace equal pcaptool query's, byte for byte");
}

/// A store filled from traces of one link type but different snapshot lengths answers in pcap (at the largest
/// snapshot length), which tcpdump reads; link types that differ give pcapng, and a `.pcap` name for them is
/// refused with a clear message and no file left.
#[test]
fn store_answers_are_pcap_for_one_link_type_and_pcapng_for_several() {
    let tmp = TempDir::new("engine-store-format");
    let a = generated(&tmp, "a.pcap", 3_000, 31);
    let b = tmp.join("b.pcapng");
    let o = pcaptool(&["convert", p(&generated(&tmp, "b.pcap", 3_000, 32)), p(&b), "--snaplen", "1500"]);
    assert!(o.status.success(), "{}", err(&o));
    let store = tmp.join("store");
    assert!(pcaptool(&["import", p(&a), p(&b), "--store", p(&store)]).status.success());
    let out = tmp.join("answer.pcap");
    let o = pcaptool(&["query", p(&store), "tcp", "-w", p(&out)]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(matches!(format_of(&out), Some(FileFormat::Pcap { .. })), "one link type: pcap");
    let n = records(&out).len();
    assert!(n > 0);
    // Standard output, read by tcpdump as the user did.
    if let Some(tcpdump) = tool("tcpdump") {
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{} query {} tcp -w - | {} -nr - | wc -l",
                pcaptool_bin().display(),
                p(&store),
                tcpdump.display()
            ))
            .output()
            .unwrap();
        let lines: usize = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        assert_eq!(lines, n, "tcpdump reads every packet of the store's pcap: {}", err(&o));
    }
    // Asked for pcapng by name: pcapng, the same packets.
    let ng = tmp.join("answer.pcapng");
    assert!(pcaptool(&["query", p(&store), "tcp", "-w", p(&ng)]).status.success());
    assert!(matches!(format_of(&ng), Some(FileFormat::PcapNg { .. })));
    assert_eq!(records(&ng), records(&out));

    // Several link types.
    let multi = tmp.join("multi");
    let two = repo_root().join("testdata/pcapng-two-sections.pcapng");
    assert!(pcaptool(&["import", p(&two), "--store", p(&multi)]).status.success());
    let bad = tmp.join("multi.pcap");
    let o = pcaptool(&["query", p(&multi), "ip", "-w", p(&bad)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("pcapng") && err(&o).lines().count() == 1, "{}", err(&o));
    assert!(!bad.exists(), "no file left behind");
    let good = tmp.join("multi.out");
    assert!(pcaptool(&["query", p(&multi), "ip", "-w", p(&good)]).status.success());
    assert!(matches!(format_of(&good), Some(FileFormat::PcapNg { .. })), "several link types: pcapng");
}

/// `-w` takes the format and the compression from the name as `convert` does; `--format` and `--compress`
/// override; the packets are the same.
#[test]
fn query_outputs_take_their_format_and_compression_from_the_name() {
    let tmp = TempDir::new("engine-names");
    let trace = generated(&tmp, "t.pcap", 3_000, 33);
    let base = tmp.join("base.pcap");
    assert!(pcaptool(&["query", p(&trace), "tcp", "-w", p(&base)]).status.success());
    let want = records(&base);
    for (name, extra, compressed, ng) in [
        ("o.pcap.gz", &[][..], true, false),
        ("o.pcapng", &[][..], false, true),
        ("o.pcapng.zst", &[][..], true, true),
        ("o.lz4", &["--format", "pcapng"][..], true, true),
        ("o.pcapng", &["--format", "pcap", "--compress", "none"][..], false, false),
    ] {
        let out = tmp.join(name);
        let o = pcaptool(&[&["query", p(&trace), "tcp", "-w", p(&out)][..], extra].concat());
        assert!(o.status.success(), "{name}: {}", err(&o));
        let raw = std::fs::read(&out).unwrap();
        assert_eq!(pcaptool_packet::Compression::detect(&raw).is_some(), compressed, "{name} {extra:?}: compression");
        assert_eq!(matches!(format_of(&out), Some(FileFormat::PcapNg { .. })), ng, "{name} {extra:?}: container");
        assert_eq!(records(&out), want, "{name} {extra:?}: packets");
    }
}

/// An answer with no packet is still a file every tool opens: a pcapng one has its interfaces.
#[test]
fn an_empty_answer_is_a_file_tcpdump_opens() {
    let tmp = TempDir::new("engine-empty");
    let two = repo_root().join("testdata/pcapng-two-sections.pcapng");
    let trace = generated(&tmp, "t.pcap", 1_000, 34);
    let ng = tmp.join("t.pcapng");
    assert!(pcaptool(&["convert", p(&trace), p(&ng)]).status.success());
    for (source, out) in [(&two, "e1.pcapng"), (&ng, "e2.pcapng"), (&trace, "e3.pcap"), (&ng, "e4.pcap")] {
        let out = tmp.join(out);
        let o = pcaptool(&["query", p(source), "host 192.0.2.222", "-w", p(&out)]);
        assert!(o.status.success(), "{}", err(&o));
        assert!(records(&out).is_empty());
        let Some(tcpdump) = tool("tcpdump") else { continue };
        let o = Command::new(tcpdump).arg("-nr").arg(&out).output().unwrap();
        assert!(o.status.success(), "tcpdump opens the empty answer {}: {}", out.display(), err(&o));
    }
}

/// `--json` holds on stores: the count and the plan are JSON; the plan is the same data for traces and stores.
#[test]
fn json_counts_and_plans_on_stores_and_traces() {
    let tmp = TempDir::new("engine-json");
    let trace = generated(&tmp, "t.pcap", 5_000, 35);
    let store = tmp.join("store");
    assert!(pcaptool(&["import", p(&trace), "--store", p(&store)]).status.success());
    let count = |source: &Path| {
        let o = pcaptool(&["query", p(source), "tcp port 443", "--count", "--json"]);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (s, t) = (count(&store), count(&trace));
    assert_eq!(s["matched"], t["matched"]);
    assert!(s["matched"].as_u64().unwrap() > 0);
    assert_eq!(s["store"], p(&store));
    for source in [&store, &trace] {
        let o = pcaptool(&["query", p(source), "tcp port 443", "--explain", "--json"]);
        assert!(o.status.success(), "{}", err(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["parsed"], "tcp port 443");
        assert_eq!(v["link_types"][0]["linktype"], 1);
        assert!(v["strategy"].is_string() && v["index_condition"].is_string());
    }
    let o = pcaptool(&["query", p(&store), "tcp port 443", "--explain", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kind"], "store");
    assert!(v["store"]["stage1_passed"].as_u64().is_some());
}

/// Every output ends quietly when its reader goes away after one line, as ripgrep does: exit 0, no panic.
#[test]
fn outputs_end_quietly_on_a_closed_pipe() {
    let tmp = TempDir::new("engine-pipe");
    let trace = generated(&tmp, "t.pcap", 20_000, 36);
    let store = tmp.join("store");
    assert!(pcaptool(&["import", p(&trace), "--store", p(&store)]).status.success());
    for args in [
        format!("query {} tcp --explain", p(&trace)),
        format!("query {} tcp --explain --json", p(&store)),
        format!("query {} tcp -w -", p(&trace)),
        format!("query {} tcp -w -", p(&store)),
        format!("flows {}", p(&store)),
    ] {
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail; {} {args} | head -1 > /dev/null", pcaptool_bin().display()))
            .output()
            .unwrap();
        assert!(o.status.success(), "`pcaptool {args} | head -1`: {} {}", o.status, err(&o));
        assert!(!err(&o).contains("panicked"), "{}", err(&o));
    }
}

/// With an index, a bulk filter and `--limit`, `-w FILE` holds the first matches (an older binary set up its
/// positional writer and then scanned into nothing, leaving only the file header).
#[test]
fn a_limited_bulk_answer_over_an_index_is_written() {
    let tmp = TempDir::new("engine-limit");
    let trace = generated(&tmp, "t.pcap", 20_000, 37);
    let scan = tmp.join("scan.pcap");
    assert!(pcaptool(&["query", "--scan", p(&trace), "tcp", "-w", p(&scan)]).status.success());
    let all = records(&scan);
    assert!(pcaptool(&["index", p(&trace), "--chunk-packets", "4096"]).status.success());
    for (f, n) in [("tcp", "7"), ("ip", "1000"), ("tcp", "100000")] {
        let out = tmp.join("limited.pcap");
        let o = pcaptool(&["query", p(&trace), f, "--limit", n, "-w", p(&out)]);
        assert!(o.status.success(), "{}", err(&o));
        let want = tmp.join("want.pcap");
        assert!(pcaptool(&["query", "--scan", p(&trace), f, "--limit", n, "-w", p(&want)]).status.success());
        let got = records(&out);
        assert_eq!(got, records(&want), "`{f}` --limit {n}");
        let n: usize = n.parse().unwrap();
        assert!(!got.is_empty() && got.len() <= n, "`{f}` --limit {n}: {} packets", got.len());
        if f == "tcp" {
            assert_eq!(got.len(), n.min(all.len()), "`tcp` --limit {n}");
        }
    }
}

/// A bulk answer over an index goes to `-w FILE` by the positional writer, which writes runs of records straight
/// from the mapped trace when their bytes are already the output's: its file is byte for byte the one the
/// streaming writer of `--scan` makes, for microsecond and nanosecond traces, for answers of long runs (`ip`, every
/// packet) and of short ones (`udp`, `port 80`), and where the trace's snapshot length cuts packets.
#[test]
fn positional_outputs_equal_the_streaming_writers_byte_for_byte() {
    let tmp = TempDir::new("engine-positional");
    let micro = generated(&tmp, "micro.pcap", 30_000, 41);
    let nano = tmp.join("nano.pcap");
    let o = pcaptool(&["convert", p(&micro), p(&nano), "--precision", "ns"]);
    assert!(o.status.success(), "{}", err(&o));
    // The same packets in a trace whose header says a snapshot length of 100: libpcap cuts longer records to it.
    let mut bytes = std::fs::read(&micro).unwrap();
    bytes[16..20].copy_from_slice(&100u32.to_le_bytes());
    let snapped = tmp.join("snapped.pcap");
    std::fs::write(&snapped, bytes).unwrap();
    for trace in [&micro, &nano, &snapped] {
        assert!(pcaptool(&["index", p(trace), "--chunk-packets", "4096"]).status.success());
        for f in ["", "ip", "tcp", "udp", "port 80", "not port 80"] {
            let (ours, want) = (tmp.join("ours.pcap"), tmp.join("want.pcap"));
            let o = pcaptool(&["query", p(trace), f, "-w", p(&ours)]);
            assert!(o.status.success(), "{}", err(&o));
            let o = pcaptool(&["query", "--scan", p(trace), f, "-w", p(&want)]);
            assert!(o.status.success(), "{}", err(&o));
            let (a, b) = (std::fs::read(&ours).unwrap(), std::fs::read(&want).unwrap());
            assert!(b.len() > 24, "{}: `{f}` matches nothing", trace.display());
            assert!(a == b, "{}: `{f}`: {} bytes against the streaming writer's {}", trace.display(), a.len(), b.len());
        }
    }
}
