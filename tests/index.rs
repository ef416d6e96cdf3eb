//! The index (`pcaptool index`, indexed `pcaptool query`): on every trace of the corpus (../shared/corpus, real
//! captures from public projects; skipped with a message when absent) and of testdata/, the packets the index
//! selects for a filter's condition include every packet the filter matches; through the binary, indexed queries
//! write the same bytes as the scan (which tests/filters.rs holds equal to libpcap) and as tcpdump; stale,
//! damaged and foreign indexes are refused with a clear error.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcaptool_index::{BuildOptions, IndexFile, build};
use pcaptool_packet::{Compression, Compressor, LinkType, PacketFields, TraceReader};
use pcaptool_query::{Filter, Target, plan};
use pcaptool_tests::tracegen::{GenOptions, generate};
use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, repo_root, tool};
use pcaptool_tests::{generated_trace as gen_packets, path_arg as p, pcaptool, stderr_of as err};

fn table() -> Vec<String> {
    pcaptool_tests::filter_table()
}

fn traces(step: usize) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("testdata"))
        .expect("testdata/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    if let Some(c) = corpus_dir() {
        files.extend(corpus_files(&c).iter().step_by(step).map(|f| c.join(f)));
    }
    files
}

/// For every trace and every filter of the table: every packet the filter matches is among the packets the index
/// selects for the filter's condition (chunks of 1024 packets, so that many traces have several).
#[test]
fn index_selects_every_match_on_every_trace() {
    let filters: Vec<(String, Filter)> =
        table().into_iter().filter_map(|f| Some((f.clone(), Filter::new(&f).ok()?))).collect();
    let tmp = TempDir::new("index-superset");
    let (mut files, mut matches, mut candidates, mut decisions) = (0u64, 0u64, 0u64, 0u64);
    let (mut exact_counts, mut from_index, mut cut_traces) = (0u64, 0u64, 0u64);
    for (n, trace) in traces(1).iter().enumerate() {
        let idx = tmp.join(&format!("{n}.ptidx"));
        let opts = BuildOptions { chunk_packets: 1024, snap: u32::MAX };
        if build(trace, &idx, &opts, &|_| {}).is_err() {
            continue; // unreadable from the start: nothing to index (the corpus test covers the error)
        }
        let file = IndexFile::open(&idx).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
        file.check_trace(trace, None, u32::MAX, None).unwrap();
        let view = file.view().unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
        view.check().unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
        let mut r = TraceReader::open(trace).unwrap();
        let _ = r.read_header(); // (a header it cannot read leaves no packet: the index has none either)
        let swapped = r.format().is_some_and(|f| f.swapped());
        let mut packets = Vec::new();
        while let Some(Ok(rec)) = r.next_record() {
            packets.push((rec.linktype.base(), rec.data.to_vec(), rec.wirelen, rec.ts_ns));
        }
        assert_eq!(packets.len() as u64, view.packets(), "{}: packets indexed", trace.display());
        files += 1;
        // As the engine opens a pcap of a link type with header fields: unknown values are cut ones, which fail
        // the predicates that load them whole. Every match must still be selected, and counts stay exact.
        let cut = matches!(r.format(), Some(pcaptool_packet::FileFormat::Pcap { .. }))
            && r.interfaces().iter().all(|i| PacketFields::new(i.linktype, &[], 0, 0).has_header_fields());
        let mut views = vec![("", view)];
        if cut {
            views.push((" (cut fields fail)", file.view().unwrap().cut_fields_fail()));
            cut_traces += 1;
        }
        for ((text, f), (how, view)) in filters.iter().flat_map(|f| views.iter().map(move |v| (f, v))) {
            let need = plan::necessary(f);
            let sel = view.select(&need).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
            let chosen: HashSet<u64> = sel
                .chunks
                .iter()
                .flat_map(|(ci, v)| {
                    let first = view.chunks()[*ci].first_packet();
                    v.iter().map(move |&i| first + u64::from(i))
                })
                .collect();
            candidates += chosen.len() as u64;
            let counted =
                plan::exact(f).then(|| view.count(&need).unwrap_or_else(|e| panic!("{}: {e}", trace.display())));
            let undecided: HashSet<u64> = counted
                .iter()
                .flat_map(|(_, sel)| sel.chunks.iter())
                .flat_map(|(ci, v)| {
                    let first = view.chunks()[*ci].first_packet();
                    v.iter().map(move |&i| first + u64::from(i))
                })
                .collect();
            let (mut hits, mut undecided_hits) = (0u64, 0u64);
            let mut compiled: Vec<(LinkType, Option<pcaptool_query::Matcher>)> = Vec::new();
            for (i, (lt, data, wirelen, ts)) in packets.iter().enumerate() {
                let m = match compiled.iter().find(|(l, _)| l == lt) {
                    Some((_, m)) => m,
                    None => {
                        compiled.push((*lt, f.compile(Target { linktype: *lt, swapped }).ok()));
                        &compiled.last().expect("pushed").1
                    }
                };
                let Some(m) = m else { continue };
                decisions += 1;
                if m.matches(data, *wirelen, *ts) {
                    matches += 1;
                    hits += 1;
                    undecided_hits += u64::from(undecided.contains(&(i as u64)));
                    assert!(
                        chosen.contains(&(i as u64)),
                        "{}: `{text}` matches packet {i}, which the index{how} does not select for `{need}`",
                        trace.display()
                    );
                }
            }
            if let Some((sure, _)) = counted
                && compiled.iter().all(|(_, m)| m.is_some())
            {
                assert_eq!(sure + undecided_hits, hits, "{}: `{text}`: counted from the index{how}", trace.display());
                exact_counts += 1;
                from_index += sure;
            }
        }
    }
    println!(
        "index: {files} traces ({cut_traces} also with cut fields failing), {decisions} packet decisions: all {matches} matches among the {candidates} packets the index selected; {exact_counts} exact counts equal the filter's ({from_index} matches counted without reading)"
    );
    assert!(files > 0 && matches > 0 && from_index > 0 && cut_traces > 0);
}

/// The corpus traces the catalogue gives link type `name`, read without damage, the largest first.
fn traces_of(corpus: &Path, name: &str) -> Vec<PathBuf> {
    let cat = std::fs::read_to_string(corpus.join("CATALOGUE.tsv")).expect("read CATALOGUE.tsv");
    let mut v: Vec<(u64, PathBuf)> = cat
        .lines()
        .skip(1)
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|c| c.len() >= 10 && c[3] == name && c[7].is_empty() && c[9].is_empty())
        .map(|c| (c[4].parse::<u64>().unwrap_or(0), corpus.join(c[0])))
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    v.into_iter().map(|(_, p)| p).collect()
}

/// A needle filter for `trace`: `host` of the IPv4 or IPv6 address that the fewest packets hold (as source or
/// destination), or `port` of the rarest port when every packet holds every address, or IPv4 TCP SYNs when every
/// packet holds every port too; how many packets hold it, and the trace's packets.
fn rarest_needle(trace: &Path) -> Option<(String, usize, u64)> {
    use pcaptool_packet::{Field, FieldValue, PacketFields};
    let mut r = TraceReader::open(trace).ok()?;
    r.read_header().ok()?;
    let swapped = r.format().is_some_and(|f| f.swapped());
    let (mut hosts, mut ports): (HashMap<String, HashSet<u64>>, HashMap<String, HashSet<u64>>) = Default::default();
    let (mut n, mut f_syn) = (0u64, 0usize);
    while let Some(Ok(rec)) = r.next_record() {
        let f = PacketFields::new(rec.linktype, rec.data, rec.wirelen, rec.ts_ns).swapped(swapped);
        if f.get(Field::LinkProto) == FieldValue::Value(0x0800)
            && matches!(f.get(Field::TcpFlags), FieldValue::Value(v) if v & 2 != 0)
        {
            f_syn += 1;
        }
        for field in [Field::Ip4Src, Field::Ip4Dst, Field::Ip6Src, Field::Ip6Dst, Field::SrcPort, Field::DstPort] {
            if let FieldValue::Value(v) = f.get(field) {
                let to = if matches!(field, Field::SrcPort | Field::DstPort) { &mut ports } else { &mut hosts };
                to.entry(field.format(v).to_string()).or_default().insert(n);
            }
        }
        n += 1;
    }
    let rarest = |m: HashMap<String, HashSet<u64>>, what: &str| {
        m.into_iter()
            .map(|(a, p)| (format!("{what} {a}"), p.len(), n))
            .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
    };
    let syn = (f_syn > 0).then(|| ("tcp[tcpflags] & tcp-syn != 0".to_string(), f_syn, n));
    rarest(hosts, "host")
        .filter(|h| (h.1 as u64) < n)
        .or_else(|| rarest(ports, "port").filter(|h| (h.1 as u64) < n))
        .or(syn)
}

/// Every packet of link type `lt` in the corpus traces the catalogue names `name` (whole traces of that link
/// type alone, in the host's byte order, read up to any damage), written one after another into `out`.
fn gathered(corpus: &Path, name: &str, lt: u32, out: &Path) -> PathBuf {
    use pcaptool_packet::{PcapWriter, TsPrecision};
    let file = std::io::BufWriter::new(std::fs::File::create(out).unwrap());
    let mut w = PcapWriter::new(file, LinkType(lt), 262_144, TsPrecision::Nano).unwrap();
    for trace in traces_of(corpus, name) {
        let Ok(mut r) = TraceReader::open(&trace) else { continue };
        if r.read_header().is_err() || r.format().is_some_and(|f| f.swapped()) {
            continue;
        }
        let mut recs = Vec::new();
        while let Some(Ok(rec)) = r.next_record() {
            recs.push((rec.linktype.0, rec.ts_ns, rec.wirelen, rec.data.to_vec()));
        }
        if recs.iter().all(|r| r.0 == lt) {
            for (_, ts, wire, data) in recs {
                w.write_packet(ts, wire, &data).unwrap();
            }
        }
    }
    w.finish().unwrap();
    out.to_path_buf()
}

/// Through the binary, on corpus traces of each link type whose protocol field the index reads (BSD null, PPP,
/// raw IP, raw IPv4, raw IPv6, Cisco HDLC, Linux SLL and SLL2: every corpus trace of the link type gathered into
/// one, as most are a few packets; and the largest pcapng file mixing link types): the index selects fewer
/// candidates than packets for `host` of the rarest address (SYNs, in the SLL2 traces of one connection), and the
/// indexed answer is the scan's and tcpdump's.
/// (The corpus's PPP-in-HDLC-framing traces have one packet each; tests/filters.rs checks the planner there.)
#[test]
fn the_index_narrows_host_queries_on_every_link_type() {
    let Some(corpus) = corpus_dir() else { return };
    let tcpdump = tool("tcpdump");
    let tmp = TempDir::new("index-links");
    let mut narrowed = Vec::new();
    let kinds = [
        ("null", 0),
        ("ppp", 9),
        ("rawip", 101),
        ("rawip4", 228),
        ("rawip6", 229),
        ("chdlc", 104),
        ("linux-sll", 113),
        ("linux-sll2", 276),
        ("per-packet", u32::MAX),
    ];
    for (name, lt) in kinds {
        let trace = if lt == u32::MAX {
            // The largest with an address that not every packet holds.
            traces_of(&corpus, name)
                .into_iter()
                .find(|t| rarest_needle(t).is_some_and(|h| (h.1 as u64) < h.2))
                .unwrap_or_else(|| panic!("the corpus has no {name} trace with several addresses"))
        } else {
            gathered(&corpus, name, lt, &tmp.join(&format!("gathered-{lt}.pcap")))
        };
        let (filter, holding, _) =
            rarest_needle(&trace).unwrap_or_else(|| panic!("{}: no IP address", trace.display()));
        let name = format!("{name}-{lt}");
        let ext = trace.extension().and_then(|e| e.to_str()).unwrap_or("pcap");
        let copy = tmp.join(&format!("{name}.{ext}"));
        std::fs::copy(&trace, &copy).unwrap();
        let built = pcaptool(&["index", p(&copy)]);
        assert!(built.status.success(), "{}: index: {}", trace.display(), err(&built));
        let plan = pcaptool(&["query", p(&copy), &filter, "--explain", "--json"]);
        assert!(plan.status.success(), "{}: explain: {}", trace.display(), err(&plan));
        let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
        let (estimate, packets) = (&plan["index"]["estimate"], &plan["index"]["packets"]);
        let (estimate, packets) = (estimate.as_u64().unwrap_or(u64::MAX), packets.as_u64().unwrap_or(0));
        // What the index selects (the engine may still scan a trace this small: its cost check weighs blocks).
        let view = IndexFile::open(&copy.with_extension(format!("{ext}.ptidx"))).unwrap();
        let view = view.view().unwrap();
        let cands = view.select(&plan::necessary(&Filter::new(&filter).unwrap())).unwrap().count();
        assert!(
            estimate < packets && cands < packets && cands >= holding as u64,
            "{} ({name}): `{filter}` ({holding} packets hold it): the index expects {estimate} and selects {cands} of {packets}",
            trace.display()
        );
        let (a, b) = (tmp.join(&format!("{name}-index.pcapng")), tmp.join(&format!("{name}-scan.pcapng")));
        let oa = pcaptool(&["query", p(&copy), &filter, "-w", p(&a)]);
        let ob = pcaptool(&["query", "--scan", p(&copy), &filter, "-w", p(&b)]);
        assert!(oa.status.success() && ob.status.success(), "{}: {} {}", trace.display(), err(&oa), err(&ob));
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{}: index vs scan", trace.display());
        let mut with_tcpdump = false;
        if let Some(tcpdump) = &tcpdump {
            let t = tmp.join(&format!("{name}-tcpdump.pcap"));
            if let Some(theirs) = pcaptool_tests::tcpdump_records(tcpdump, &copy, &filter, &t) {
                assert_eq!(records(&a), theirs, "{}: `{filter}`: indexed output vs tcpdump", trace.display());
                with_tcpdump = true;
            }
        }
        narrowed.push(format!("{name} `{filter}`: {cands} of {packets} (tcpdump compared: {with_tcpdump})"));
    }
    println!("the index narrows on every link type: {}", narrowed.join("; "));
}

fn records(path: &Path) -> Vec<(u64, u32, Vec<u8>)> {
    pcaptool_tests::records_us(path)
}

/// Through the binary: indexed query == scan, byte for byte (and the same errors), on testdata and a sample of
/// the corpus for a sample of the table; and == tcpdump's packets where tcpdump reads the trace.
#[test]
fn indexed_queries_write_what_the_scan_and_tcpdump_write() {
    let tcpdump = tool("tcpdump");
    let tmp = TempDir::new("index-e2e");
    let mut files = vec![gen_packets(&tmp, "gen.pcap", 30_000, 1)];
    files.extend(traces(50));
    let filters: Vec<String> = table().into_iter().step_by(7).collect();
    let (mut compared, mut used_index, mut with_tcpdump, mut counted_from_index) = (0, 0, 0, 0);
    for (n, trace) in files.iter().enumerate() {
        // Index a copy, so that the corpus stays untouched.
        let ext = trace.extension().and_then(|e| e.to_str()).unwrap_or("pcap");
        let copy = tmp.join(&format!("t{n}.{ext}"));
        std::fs::copy(trace, &copy).unwrap();
        let built = pcaptool(&["index", p(&copy), "--chunk-packets", "2048"]);
        if !built.status.success() && !copy.with_extension(format!("{ext}.ptidx")).exists() {
            continue;
        }
        for (k, f) in filters.iter().enumerate() {
            let a = tmp.join(&format!("{n}-{k}-index.out"));
            let b = tmp.join(&format!("{n}-{k}-scan.out"));
            let oa = pcaptool(&["query", p(&copy), f, "-w", p(&a), "--count", "--json"]);
            let ob = pcaptool(&["query", "--scan", p(&copy), f, "-w", p(&b), "--count", "--json"]);
            assert_eq!(oa.status.code(), ob.status.code(), "{}: `{f}`: exit codes: {}", trace.display(), err(&oa));
            let strip = |o: &Output| err(o).replace(p(&copy), "TRACE");
            assert_eq!(strip(&oa), strip(&ob), "{}: `{f}`: errors", trace.display());
            if !oa.status.success() {
                continue;
            }
            let ja: serde_json::Value = serde_json::from_slice(&oa.stdout).unwrap();
            let jb: serde_json::Value = serde_json::from_slice(&ob.stdout).unwrap();
            assert_eq!(ja["matched"], jb["matched"], "{}: `{f}`: counts", trace.display());
            if ja.get("index_candidates").is_some() {
                used_index += 1;
            }
            // Counting alone (exact conditions count from the index) gives the same number.
            let oc = pcaptool(&["query", p(&copy), f, "--count", "--json"]);
            let jc: serde_json::Value = serde_json::from_slice(&oc.stdout).unwrap();
            assert_eq!(jc["matched"], jb["matched"], "{}: `{f}`: --count alone", trace.display());
            if jc.get("counted_from_index").is_some() {
                counted_from_index += 1;
            }
            let (da, db) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
            assert!(da == db, "{}: `{f}`: indexed output differs from the scan's", trace.display());
            compared += 1;
            if let Some(tcpdump) = &tcpdump
                && k % 3 == 0
            {
                let t = tmp.join(&format!("{n}-{k}-tcpdump.pcap"));
                if let Some(theirs) = pcaptool_tests::tcpdump_records(tcpdump, &copy, f, &t) {
                    assert_eq!(records(&a), theirs, "{}: `{f}`: indexed output vs tcpdump", trace.display());
                    with_tcpdump += 1;
                }
            }
            let _ = std::fs::remove_file(&a);
            let _ = std::fs::remove_file(&b);
        }
    }
    println!(
        "indexed query: {compared} outputs identical to the scan's ({used_index} read through the index), {with_tcpdump} also identical to tcpdump's; {counted_from_index} counts taken from the index equal the scan's"
    );
    assert!(compared > 0 && used_index > 0 && counted_from_index > 0);
}

fn gen_trace(dir: &TempDir, name: &str, seed: u64) -> PathBuf {
    gen_packets(dir, name, 5_000, seed)
}

/// An index of format version 4 (testdata/index-v4-seed7.ptidx, written by the version-4 builder of commit
/// bf942d8 for the generated trace of seed 7, chunks of 1024 packets) is still read: its sequences keep their rank
/// and select directories (wavelet kind 1) and its lanes were placed the old way. Indexed queries through it write
/// what the scan writes, and counts from it equal the scan's. (Should the generator ever change that trace, the
/// index is refused as stale: write the golden file again with `pcaptool index --chunk-packets 1024` built at
/// bf942d8, from `cargo xtask gen T --packets 5000 --seed 7`.)
#[test]
fn a_version_4_index_is_still_read() {
    let tmp = TempDir::new("index-v4");
    let trace = gen_trace(&tmp, "seed7.pcap", 7);
    let golden = std::fs::read(repo_root().join("testdata/index-v4-seed7.ptidx")).unwrap();
    assert_eq!(u16::from_le_bytes([golden[4], golden[5]]), 4, "the golden file is a version-4 index");
    // The index names the trace by length, checksums and modification time: give the trace the time it had.
    let mtime_ns = u64::from_le_bytes(golden[84..92].try_into().unwrap());
    let f = std::fs::File::options().write(true).open(&trace).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(mtime_ns)).unwrap();
    drop(f);
    std::fs::write(format!("{}.ptidx", p(&trace)), &golden).unwrap();
    let (mut compared, mut read_through_index) = (0, 0);
    for f in table().iter().step_by(5) {
        let (out_i, out_s) = (tmp.join("i.pcap"), tmp.join("s.pcap"));
        let cs = pcaptool(&["query", p(&trace), f, "--count", "--scan"]);
        if !cs.status.success() {
            continue; // a filter pcaptool refuses (the filter tests cover those)
        }
        let explain = pcaptool(&["query", p(&trace), f, "--explain"]);
        assert!(explain.status.success(), "{f}: {}", err(&explain));
        let plan = String::from_utf8_lossy(&explain.stdout).into_owned();
        assert!(plan.contains("seed7.pcap.ptidx"), "{f}: the index is not used: {plan}");
        let o = pcaptool(&["query", p(&trace), f, "-w", p(&out_i)]);
        assert!(o.status.success(), "{f}: {}", err(&o));
        let o = pcaptool(&["query", p(&trace), f, "--scan", "-w", p(&out_s)]);
        assert!(o.status.success(), "{f}: {}", err(&o));
        assert!(std::fs::read(&out_i).unwrap() == std::fs::read(&out_s).unwrap(), "{f}: index and scan differ");
        let ci = pcaptool(&["query", p(&trace), f, "--count"]);
        assert!(ci.status.success(), "{f}: {}", err(&ci));
        assert_eq!(String::from_utf8_lossy(&ci.stdout), String::from_utf8_lossy(&cs.stdout), "{f}: counts");
        compared += 1;
        read_through_index += usize::from(plan.contains("reads:"));
    }
    eprintln!(
        "version-4 index: {compared} filters, outputs and counts equal to the scan's ({read_through_index} read through the index)"
    );
    assert!(compared > 20 && read_through_index > 0);
}

/// A changed trace, a damaged index, another trace's index: the query still answers, by the scan, with one warning
/// that names the index, says why and how to rebuild it; its output is the scan's of the trace as it is now. A
/// copy of the trace with a new modification time is recognised by its content and keeps its index.
#[test]
fn stale_damaged_and_foreign_indexes_fall_back_to_the_scan() {
    let tmp = TempDir::new("index-stale");
    let trace = gen_trace(&tmp, "a.pcap", 1);
    let idx = PathBuf::from(format!("{}.ptidx", p(&trace)));
    let (out, scanned) = (tmp.join("out.pcap"), tmp.join("scan.pcap"));
    let query = |extra: &[&str], to: &Path| {
        let mut args = vec!["query", p(&trace), "host 10.0.1.5", "-w", p(to)];
        args.extend_from_slice(extra);
        pcaptool(&args)
    };
    let index = || assert!(pcaptool(&["index", p(&trace)]).status.success());
    let uses_index = || {
        let o = pcaptool(&["query", p(&trace), "host 10.0.1.5", "--explain"]);
        assert!(o.status.success(), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).contains("a.pcap.ptidx")
    };
    // Answers with a warning, and writes what the scan writes.
    let falls_back = |what: &str| -> String {
        let o = query(&[], &out);
        assert!(o.status.success(), "{what}: {}", err(&o));
        let e = err(&o);
        assert_eq!(e.lines().count(), 1, "{what}: one line: {e}");
        assert!(e.starts_with("pcaptool: warning: "), "{what}: {e}");
        assert!(e.contains("a.pcap.ptidx") && e.contains("pcaptool index"), "{what}: says what to do: {e}");
        assert!(e.contains("scanning the trace instead"), "{what}: {e}");
        let s = query(&["--scan"], &scanned);
        assert!(s.status.success() && err(&s).is_empty(), "{what}: --scan ignores the index: {}", err(&s));
        assert!(std::fs::read(&out).unwrap() == std::fs::read(&scanned).unwrap(), "{what}: differs from the scan");
        assert!(!uses_index(), "{what}: the plan does not use the index");
        e
    };
    index();
    let o = query(&[], &out);
    assert!(o.status.success() && err(&o).is_empty(), "{}", err(&o));
    assert!(uses_index());
    let good = std::fs::read(&out).unwrap();

    // The trace grows.
    let original = std::fs::read(&trace).unwrap();
    let mut longer = original.clone();
    let caplen = u32::from_le_bytes([original[32], original[33], original[34], original[35]]) as usize;
    longer.extend_from_slice(&original[24..24 + 16 + caplen]); // the first record again
    std::fs::write(&trace, &longer).unwrap();
    let e = falls_back("appended");
    assert!(e.contains("bytes, the index was built on"), "{e}");

    // Same length, the addresses of packets in the middle changed: the modification time differs, and the
    // sampled blocks' packets are not those the index describes.
    let mut changed = original.clone();
    let mut at = 24;
    let mut n = 0;
    while at + 16 <= changed.len() {
        let cap = u32::from_le_bytes(changed[at + 8..at + 12].try_into().unwrap()) as usize;
        if n % 2 == 0 && cap >= 34 && at > changed.len() / 4 && at + 16 + cap < changed.len() * 3 / 4 {
            changed[at + 16 + 29] ^= 0x55; // the IPv4 source's last byte
        }
        at += 16 + cap;
        n += 1;
    }
    std::fs::write(&trace, &changed).unwrap();
    let e = falls_back("changed in the middle");
    assert!(e.contains("is not the packet the index describes"), "{e}");

    // The original bytes again, with a new modification time (a copy): recognised by content.
    std::fs::write(&trace, &original).unwrap();
    let o = query(&[], &out);
    assert!(o.status.success() && err(&o).is_empty(), "copy: {}", err(&o));
    assert!(uses_index(), "a copy keeps its index");
    assert_eq!(std::fs::read(&out).unwrap(), good);

    // Damaged index: truncated, a flipped byte in a chunk, not an index at all, other format versions.
    index();
    let ix = std::fs::read(&idx).unwrap();
    std::fs::write(&idx, &ix[..ix.len() / 2]).unwrap();
    falls_back("truncated index");
    let mut flipped = ix.clone();
    flipped[200] ^= 0x01;
    std::fs::write(&idx, &flipped).unwrap();
    assert!(falls_back("flipped index byte").contains("checksum"));
    std::fs::write(&idx, b"hello, not an index").unwrap();
    assert!(falls_back("not an index").contains("not a pcaptool index"));
    let mut old = ix.clone();
    old[4..6].copy_from_slice(&1u16.to_le_bytes());
    std::fs::write(&idx, &old).unwrap();
    assert!(falls_back("index of an older format").contains("format version 1"));
    old[4..6].copy_from_slice(&(pcaptool_index::VERSION + 1).to_le_bytes());
    std::fs::write(&idx, &old).unwrap();
    let e = falls_back("index of a newer format");
    assert!(e.contains(&format!("format version {}", pcaptool_index::VERSION + 1)), "{e}");

    // Another trace's index.
    let other = gen_trace(&tmp, "b.pcap", 2);
    assert!(pcaptool(&["index", p(&other)]).status.success());
    std::fs::copy(format!("{}.ptidx", p(&other)), &idx).unwrap();
    falls_back("foreign index");

    // `verify` still reports the stale index as damage.
    let o = pcaptool(&["verify", p(&trace)]);
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stdout));

    // A missing trace.
    let o = pcaptool(&["query", p(&tmp.join("missing.pcap")), "tcp", "--count"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("missing.pcap"), "{}", err(&o));
}

/// Compressed traces: indexed, and extraction (which streams them) returns what the scan returns.
#[test]
fn compressed_traces_are_indexed_and_queried() {
    let tmp = TempDir::new("index-compressed");
    let plain = gen_trace(&tmp, "plain.pcap", 3);
    let bytes = std::fs::read(&plain).unwrap();
    for c in [Compression::Gzip, Compression::Zstd, Compression::Lz4] {
        let path = tmp.join(&format!("trace.pcap.{}", c.name()));
        let mut w = Compressor::new(Vec::new(), Some(c)).unwrap();
        std::io::Write::write_all(&mut w, &bytes).unwrap();
        std::fs::write(&path, w.finish().unwrap()).unwrap();
        let o = pcaptool(&["index", p(&path), "--chunk-packets", "1024"]);
        assert!(o.status.success(), "{}: {}", c.name(), err(&o));
        for f in ["host 10.0.1.5", "tcp port 22", "vlan 100", "udp and port 53"] {
            let (a, b) = (tmp.join("a.out"), tmp.join("b.out"));
            let oa = pcaptool(&["query", p(&path), f, "-w", p(&a), "--count", "--json"]);
            let ob = pcaptool(&["query", "--scan", p(&path), f, "-w", p(&b)]);
            assert!(oa.status.success() && ob.status.success(), "{}: {f}: {}", c.name(), err(&oa));
            let ja: serde_json::Value = serde_json::from_slice(&oa.stdout).unwrap();
            assert!(ja.get("index_candidates").is_some(), "{}: `{f}` used the index", c.name());
            assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "{}: `{f}`", c.name());
        }
    }
}

/// Two independent builds agree: the mapped build (a serial walk handing batches of records to the pool) and the
/// streaming build of the same trace gzip-compressed (one record at a time) write the same chunk bytes (the
/// offsets of the decompressed stream are the plain file's), and the number of threads changes no byte.
#[test]
fn mapped_and_streaming_builds_write_the_same_chunks() {
    let tmp = TempDir::new("index-same-chunks");
    // Chunks of 16,384 packets are gathered from two batches of 8,192 (see `build::batch_len`); the last is partial.
    let plain = tmp.join("plain.pcap");
    let opt = GenOptions { packets: 30_000, seed: 4, ..GenOptions::default() };
    std::fs::write(&plain, generate(Vec::new(), &opt).unwrap().0).unwrap();
    let gz = tmp.join("trace.pcap.gz");
    let mut w = Compressor::new(Vec::new(), Some(Compression::Gzip)).unwrap();
    std::io::Write::write_all(&mut w, &std::fs::read(&plain).unwrap()).unwrap();
    std::fs::write(&gz, w.finish().unwrap()).unwrap();
    let chunks = |path: &Path, threads: &str| -> Vec<u8> {
        let o = pcaptool(&["index", p(path), "--chunk-packets", "16384", "--threads", threads]);
        assert!(o.status.success(), "{}", err(&o));
        let b = std::fs::read(format!("{}.ptidx", p(path))).unwrap();
        let dir = u64::from_le_bytes(b[60..68].try_into().unwrap()) as usize;
        b[96..dir].to_vec()
    };
    let (one, many) = (chunks(&plain, "1"), chunks(&plain, "3"));
    assert!(!one.is_empty());
    assert!(one == many, "the thread count changed the index");
    assert!(one == chunks(&gz, "2"), "the mapped and streaming builds differ");
}

/// `pcaptool shell`: loads the index once, then counts, writes and explains query after query; a bad filter is
/// reported and the prompt goes on; answers equal `pcaptool query`'s.
#[test]
fn shell_answers_as_query_does() {
    use std::io::Write as _;
    let tmp = TempDir::new("index-shell");
    let trace = gen_trace(&tmp, "s.pcap", 4);
    assert!(pcaptool(&["index", p(&trace)]).status.success());
    let out = tmp.join("w.pcap");
    let script = format!("host 10.0.1.5\nnot a ( filter\nwrite {} tcp port 22\nexplain vlan 100\nudp\nquit\n", p(&out));
    let mut child = Command::new(pcaptool_bin())
        .args(["shell", p(&trace)])
        .env("HOME", tmp.join("home"))
        .env_remove("XDG_STATE_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pcaptool shell");
    child.stdin.take().expect("stdin").write_all(script.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let count =
        |f: &str| String::from_utf8_lossy(&pcaptool(&["query", p(&trace), f, "--count"]).stdout).trim().to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first().copied(), Some(count("host 10.0.1.5").as_str()), "{stdout}");
    assert!(lines.contains(&count("tcp port 22").as_str()), "{stdout}");
    assert_eq!(lines.last().copied(), Some(count("udp").as_str()), "{stdout}");
    assert!(stdout.contains("indexable: vlan = 100"), "{stdout}");
    assert!(err(&o).contains("index of 5000 packets loaded"), "{}", err(&o));
    assert!(err(&o).contains("error: invalid filter"), "{}", err(&o));
    let expected = tmp.join("e.pcap");
    assert!(pcaptool(&["query", "--scan", p(&trace), "tcp port 22", "-w", p(&expected)]).status.success());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&expected).unwrap());
    assert!(tmp.join("home/.local/state/pcaptool/shell_history").exists(), "history is kept");
}

/// Reading packets by `pread` from their blocks (what a needle query does, one read for a run of adjacent
/// blocks) gives the records that walking the mapped trace gives, for positions that are every packet, scattered
/// ones, runs of adjacent blocks, runs with gaps, and the last packets: on generated traces (whose bulk flows make
/// blocks past 16 KiB, read in part) and every 25th trace of testdata/ and the corpus.
#[test]
fn pread_reads_what_the_mapping_reads() {
    let tmp = TempDir::new("index-pread");
    let mut paths = vec![gen_trace(&tmp, "a.pcap", 3), gen_trace(&tmp, "b.pcap", 11)];
    paths.extend(traces(25));
    let (mut compared, mut big_blocks) = (0u64, 0u64);
    for (n, trace) in paths.iter().enumerate() {
        let idx = tmp.join(&format!("{n}.ptidx"));
        let opts = BuildOptions { chunk_packets: 1024, snap: u32::MAX };
        if build(trace, &idx, &opts, &|_| {}).is_err() {
            continue;
        }
        let reader = TraceReader::open(trace).unwrap();
        let Some(bytes) = reader.as_bytes() else { continue };
        let file = IndexFile::open(&idx).unwrap();
        let view = file.view().unwrap();
        let seeker = pcaptool_packet::Seeker::new(bytes, file.structure()).unwrap();
        let f = std::fs::File::open(trace).unwrap();
        let mut window = Vec::new();
        for (ci, c) in view.chunks().iter().enumerate() {
            let len = c.len() as u32;
            let sets: Vec<Vec<u32>> = vec![
                (0..len).collect(),
                (0..len).step_by(7).collect(),
                (0..len).filter(|i| (i / 16) % 3 != 2 && i % 5 == 1).collect(),
                (0..len).filter(|i| (i / 16) % 4 < 2 && i % 16 == 15).collect(),
                (0..len).filter(|i| i % 97 == 3 || i + 2 >= len).collect(),
            ];
            for positions in sets {
                let mut mapped = Vec::new();
                view.read_packets(bytes, &seeker, trace, ci, &positions, &mut |i, r| {
                    mapped.push((i, r.offset, r.ts_ns, r.wirelen, r.data.to_vec()));
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
                let mut read = Vec::new();
                view.read_packets_at(&f, &seeker, trace, ci, &positions, &mut window, &mut |i, r| {
                    read.push((i, r.offset, r.ts_ns, r.wirelen, r.data.to_vec()));
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
                assert_eq!(read, mapped, "{}: chunk {ci}, {} positions", trace.display(), positions.len());
                compared += read.len() as u64;
                if read.len() == len as usize {
                    // Every packet: blocks of 16 spanning more than 16 KiB (read in part).
                    big_blocks +=
                        read.chunks(16).filter(|b| b.len() == 16 && b[15].1 - b[0].1 > 16 << 10).count() as u64;
                }
            }
        }
    }
    println!("pread and mapping: {compared} packets read both ways, equal ({big_blocks} blocks past 16 KiB)");
    assert!(compared > 10_000);
    // Blocks of 16 packets longer than 16 KiB come from the corpus's big packets; the generated traces have none.
    if corpus_dir().is_some() {
        assert!(big_blocks > 0, "blocks read in part");
    } else {
        println!("../shared/corpus is absent: no block past 16 KiB was read in part");
    }
}

/// Through the binary, a needle query (few packets: read by `pread`, written at precomputed offsets to a file or
/// in order to standard output) writes the scan's packets, and with `--limit N` the first N of them, as `tcpdump
/// -c N` does: limits inside the matches of one piece, at a piece's end, past all of them.
#[test]
fn needle_queries_keep_the_first_matches_under_a_limit() {
    let tcpdump = tool("tcpdump");
    let tmp = TempDir::new("index-needle-limit");
    let trace = gen_packets(&tmp, "gen.pcap", 30_000, 1);
    assert!(pcaptool(&["index", p(&trace), "--chunk-packets", "2048"]).status.success());
    let mut checked = 0;
    for f in ["arp", "icmp", "udp port 123"] {
        let full = tmp.join("scan.pcap");
        assert!(pcaptool(&["query", "--scan", p(&trace), f, "-w", p(&full)]).status.success());
        let all = records(&full);
        // A needle: the index reads fewer than one block in eight (the `pread` path).
        let ex = pcaptool(&["query", p(&trace), f, "--explain", "--json"]);
        let ex: serde_json::Value = serde_json::from_slice(&ex.stdout).unwrap();
        let to_read = ex["index"]["trace_bytes_to_read"].as_u64().unwrap();
        assert!(to_read > 0 && to_read * 8 < std::fs::metadata(&trace).unwrap().len(), "`{f}` is not a needle");
        for limit in [None, Some(1), Some(all.len() / 2), Some(all.len()), Some(all.len() + 10)] {
            let want = &all[..limit.unwrap_or(all.len()).min(all.len())];
            let n = limit.map(|l| l.to_string());
            let mut args = vec!["query", p(&trace), f];
            if let Some(n) = &n {
                args.extend(["--limit", n.as_str()]);
            }
            let file = tmp.join("needle.pcap");
            let out = pcaptool(&[&args[..], &["-w", p(&file)]].concat());
            assert!(out.status.success(), "`{f}` --limit {n:?}: {}", err(&out));
            let got = records(&file);
            assert!(
                got == want,
                "`{f}` --limit {n:?}, -w FILE: {} packets, the scan's first {}",
                got.len(),
                want.len()
            );
            let piped = pcaptool(&[&args[..], &["-w", "-"]].concat());
            assert!(piped.status.success(), "`{f}` --limit {n:?}: {}", err(&piped));
            assert!(piped.stdout == std::fs::read(&file).unwrap(), "`{f}` --limit {n:?}: -w - and -w FILE differ");
            if let (Some(tcpdump), Some(n)) = (&tcpdump, &n) {
                let t = tmp.join("tcpdump.pcap");
                let st = Command::new(tcpdump).args(["-r", p(&trace), "-c", n, "-w", p(&t), f]).output().unwrap();
                assert!(st.status.success());
                let theirs = records(&t);
                assert!(got == theirs, "`{f}` --limit {n}: {} packets, tcpdump -c {n}: {}", got.len(), theirs.len());
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 15);
}

/// A trace whose packets lie on both sides of 4 GiB: indexed queries find the packets past it, and write what the
/// scan and tcpdump write (a file offset cut to 32 bits anywhere would lose or misplace them). The 4 GiB between
/// are records of 256 KiB whose bytes are a hole of the file (no disk space; zeros when read): Ethernet frames of
/// zeros, which carry no address or port a filter below names.
#[test]
fn packets_past_4_gib_are_indexed_and_found() {
    const FILLER: usize = 1 << 18;
    let tmp = TempDir::new("index-4gib");
    let small = gen_packets(&tmp, "gen.pcap", 4_000, 3);
    let mut bytes = std::fs::read(&small).unwrap();
    // (The generator writes little-endian pcap; a record's header is 16 bytes, its captured length at 8.)
    bytes[16..20].copy_from_slice(&(FILLER as u32).to_le_bytes());
    let mut starts = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        starts.push(at);
        at += 16 + u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    }
    let half = starts[starts.len() / 2];
    // The fillers take the time of the record before them, so that time never goes back.
    let before = starts[starts.len() / 2 - 1];
    let mut filler = bytes[before..before + 8].to_vec();
    filler.extend_from_slice(&(FILLER as u32).to_le_bytes());
    filler.extend_from_slice(&(FILLER as u32).to_le_bytes());
    let fillers = (1u64 << 32) / (16 + FILLER) as u64 + 2;
    let big = tmp.join("big.pcap");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&big).unwrap();
        f.write_all_at(&bytes[..half], 0).unwrap();
        for k in 0..fillers {
            f.write_all_at(&filler, half as u64 + k * (16 + FILLER) as u64).unwrap();
        }
        let tail_at = half as u64 + fillers * (16 + FILLER) as u64;
        assert!(tail_at > 1 << 32);
        f.write_all_at(&bytes[half..], tail_at).unwrap();
    }
    let built = pcaptool(&["index", p(&big)]);
    assert!(built.status.success(), "{}", err(&built));
    let verified = pcaptool(&["verify", p(&big)]);
    assert!(verified.status.success(), "{}", err(&verified));
    let second_half: HashSet<_> = records(&small).split_off(starts.len() / 2).into_iter().collect();
    // The last IPv4 packet's source (Ethernet, then IPv4's source at 12 bytes in): a host with packets past 4 GiB.
    let last = *starts.iter().rev().find(|&&s| bytes[s + 16 + 12..s + 16 + 14] == [8, 0]).unwrap();
    let ip = &bytes[last + 16 + 14 + 12..last + 16 + 14 + 16];
    let host = format!("host {}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]);
    let tcpdump = tool("tcpdump");
    for f in [host.as_str(), "tcp and greater 1000", "udp"] {
        let (a, b) = (tmp.join("index.pcap"), tmp.join("scan.pcap"));
        let oa = pcaptool(&["query", p(&big), f, "-w", p(&a), "--count", "--json"]);
        let ob = pcaptool(&["query", "--scan", p(&big), f, "-w", p(&b)]);
        assert!(oa.status.success() && ob.status.success(), "`{f}`: {} {}", err(&oa), err(&ob));
        let j: serde_json::Value = serde_json::from_slice(&oa.stdout).unwrap();
        // (The planner reads a needle through the index and scans for the broad filters.)
        assert!(f != host || j.get("index_candidates").is_some(), "`{f}`: the index was not used: {j}");
        let ours = records(&a);
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "`{f}`: indexed output differs from the scan's"
        );
        // Packets from both sides of 4 GiB (the needle's host may have none before it).
        let past = ours.iter().filter(|r| second_half.contains(*r)).count();
        assert!(past > 0, "`{f}`: no packet past 4 GiB");
        assert!(past < ours.len() || f == host, "`{f}`: no packet before 4 GiB");
        if let Some(tcpdump) = &tcpdump {
            let t = tmp.join("tcpdump.pcap");
            let theirs = pcaptool_tests::tcpdump_records(tcpdump, &big, f, &t).expect("tcpdump reads the trace");
            assert_eq!(ours, theirs, "`{f}`: indexed output vs tcpdump");
        } else {
            println!("tcpdump not found: the outputs past 4 GiB are compared with the scan's only");
        }
    }
}
