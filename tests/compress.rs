//! Compressed stores (`import --compress lz4|zstd[:LEVEL] --block-size N`): every query answers byte for byte as
//! on a plain store of the same traces (both codecs, several block sizes), on a generated trace, testdata/ and a
//! sample of the corpus (../shared/corpus, real captures from public projects; skipped with a message when
//! absent); a segment's data file is what `zstd -d`, `lz4 -d` and `pcaptool convert` turn back into the plain
//! segment; a damaged block is an error naming the segment's file and the block, never packets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, repo_root, tool};
use pcaptool_tests::{generated_trace as gen_trace, path_arg as p, pcaptool, stderr_of as err};

/// The compressed forms tested: codec, block size, deduplicated.
const FORMS: [(&str, &str, bool); 6] = [
    ("lz4", "4K", false),
    ("lz4", "64K", false),
    ("zstd:1", "16K", false),
    ("zstd:19", "4K", false),
    ("lz4", "4K", true),
    ("zstd", "64K", true),
];

/// A trace whose flows come three times, each packet followed by its copies: the generated trace; a copy with
/// other addresses (the same payloads: whole flows to deduplicate); and a copy with other addresses again in which
/// the last byte of every 50th packet differs (near-identical flows, of the same sizes: never stored as copies).
fn repeating_trace(dir: &TempDir, name: &str, packets: u64, seed: u64) -> PathBuf {
    use pcaptool_packet::{LinkType, PcapWriter, TraceReader, TsPrecision};
    let base = gen_trace(dir, &format!("{name}.base.pcap"), packets, seed);
    let mut r = TraceReader::open(&base).unwrap();
    let path = dir.join(name);
    let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut w = PcapWriter::new(file, LinkType::ETHERNET, 262_144, TsPrecision::Nano).unwrap();
    let mut i = 0usize;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        w.write_packet(rec.ts_ns, rec.wirelen, rec.data).unwrap();
        for k in 1..=2u16 {
            let mut d = rec.data.to_vec();
            pcaptool_tests::realtrace::rewrite_addresses(&mut d, k);
            if k == 2 && i.is_multiple_of(50) && d.len() > 100 {
                let n = d.len();
                d[n - 1] ^= 0x01;
            }
            w.write_packet(rec.ts_ns + u64::from(k) * 1000, rec.wirelen, &d).unwrap();
        }
        i += 1;
    }
    w.finish().unwrap();
    path
}

/// Imports `traces` into a new store `dir` with `extra` options; small segments, so that flows span several.
fn import(traces: &[&Path], dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["import"];
    args.extend(traces.iter().map(|t| p(t)));
    args.extend(["--store", p(dir), "--segment-size", "96K", "--allow-duplicates"]);
    args.extend(extra);
    pcaptool(&args)
}

/// The bytes `pcaptool query STORE FILTER` writes (pcapng when the store holds several kinds of packet).
fn answer(store: &Path, args: &[&str], out: &Path) -> Result<Vec<u8>, String> {
    let mut a = vec!["query", p(store)];
    a.extend(args);
    a.extend(["-w", p(out), "--format", "pcapng"]);
    let o = pcaptool(&a);
    if !o.status.success() {
        return Err(err(&o));
    }
    Ok(std::fs::read(out).unwrap())
}

/// Every filter of a sample of the table, flow lookups and flow listings answer byte for byte on compressed stores
/// as on the plain store.
#[test]
fn compressed_stores_answer_byte_for_byte_as_plain_ones() {
    let tmp = TempDir::new("compress-diff");
    let trace = repeating_trace(&tmp, "gen.pcap", 12_000, 11);
    let mut testdata: Vec<PathBuf> = std::fs::read_dir(repo_root().join("testdata"))
        .expect("testdata/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    testdata.sort();
    let mut sets: Vec<(String, Vec<PathBuf>, Vec<String>)> = Vec::new();
    let table = pcaptool_tests::filter_table();
    let mut filters: Vec<String> = vec![String::new()];
    filters.extend(table.iter().step_by(6).cloned());
    sets.push(("generated".into(), vec![trace], filters));
    let few: Vec<String> = ["", "tcp", "udp port 53", "ip6", "arp or icmp", "tcp[tcpflags] & tcp-syn != 0"]
        .into_iter()
        .map(String::from)
        .collect();
    sets.push(("testdata".into(), testdata, few.clone()));
    match corpus_dir() {
        Some(c) => {
            let sample: Vec<PathBuf> = corpus_files(&c).iter().step_by(25).map(|f| c.join(f)).collect();
            sets.push(("corpus".into(), sample, few));
        }
        None => println!("../shared/corpus is absent: compressed stores are tested on generated traces and testdata/"),
    }
    let mut compared = 0;
    for (name, traces, filters) in &sets {
        // Corpus traces that cannot be read are left out (the store refuses them alike, plain or compressed).
        let traces: Vec<&Path> = traces
            .iter()
            .map(PathBuf::as_path)
            .filter(|t| import(&[t], &tmp.join("probe"), &[]).status.success())
            .collect();
        let _ = std::fs::remove_dir_all(tmp.join("probe"));
        let plain = tmp.join(&format!("{name}-plain"));
        let o = import(&traces, &plain, &[]);
        assert!(o.status.success(), "{name}: {}", err(&o));
        let flows = pcaptool(&["flows", p(&plain), "--json"]);
        assert!(flows.status.success(), "{}", err(&flows));
        let ids: Vec<u64> = String::from_utf8_lossy(&flows.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["id"].as_u64())
            .collect();
        let info = pcaptool(&["info", p(&plain), "--json"]);
        let want_packets =
            serde_json::from_slice::<serde_json::Value>(&info.stdout).unwrap()["packets"].as_u64().unwrap();
        let mut queries: Vec<Vec<String>> = filters.iter().map(|f| vec![f.clone()]).collect();
        queries.extend(ids.iter().step_by(ids.len() / 7 + 1).map(|id| vec!["--flow".into(), id.to_string()]));
        let want: Vec<Result<Vec<u8>, String>> = queries
            .iter()
            .enumerate()
            .map(|(k, q)| {
                let q: Vec<&str> = q.iter().map(String::as_str).collect();
                answer(&plain, &q, &tmp.join(&format!("{name}-{k}-plain.pcapng")))
            })
            .collect();
        for (codec, block, dedup) in FORMS {
            let dir = tmp.join(&format!("{name}-{}-{block}-{dedup}", codec.replace(':', "")));
            let mut opts = vec!["--compress", codec, "--block-size", block];
            if dedup {
                opts.push("--dedup");
            }
            let o = import(&traces, &dir, &opts);
            assert!(o.status.success(), "{name} {codec}: {}", err(&o));
            let ext = if codec == "lz4" { ".pcap.lz4" } else { ".pcap.zst" };
            let data: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).collect();
            assert!(data.iter().any(|e| e.file_name().to_string_lossy().ends_with(ext)), "{codec}: {ext} files");
            assert!(!data.iter().any(|e| e.file_name().to_string_lossy().ends_with(".pcap")), "{codec}: plain files");
            for (k, (q, want)) in queries.iter().zip(&want).enumerate() {
                let qs: Vec<&str> = q.iter().map(String::as_str).collect();
                let got = answer(&dir, &qs, &tmp.join(&format!("{name}-{k}.pcapng")));
                match (want, &got) {
                    (Ok(a), Ok(b)) => assert!(a == b, "{name} {codec} {block}: {q:?}: not the plain store's bytes"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{name} {codec} {block}: {q:?}: plain {want:?}, compressed {got:?}"),
                }
                compared += 1;
            }
            let f = pcaptool(&["flows", p(&dir), "--json"]);
            assert_eq!(f.stdout, flows.stdout, "{name} {codec} {block}: flows");
            let v = pcaptool(&["verify", p(&dir)]);
            assert!(v.status.success(), "{name} {codec}: verify: {}", err(&v));
            // The packets' rows of an export: as many as the plain store's.
            if name == "generated" {
                let out = tmp.join(&format!("export-{codec}-{block}-{dedup}"));
                let e = pcaptool(&["export", p(&dir), "--to", "parquet", "--packets", "--out", p(&out), "--json"]);
                assert!(e.status.success(), "{}", err(&e));
                let summary: serde_json::Value =
                    serde_json::from_str(String::from_utf8_lossy(&e.stdout).lines().last().unwrap()).unwrap();
                assert_eq!(summary["packets"].as_u64(), Some(want_packets), "{codec}: {summary}");
            }
            let info = pcaptool(&["info", p(&dir), "--json"]);
            let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
            let (raw, stored) = (info["data_bytes"].as_u64().unwrap(), info["stored_bytes"].as_u64().unwrap());
            assert!(stored > 0 && raw > 0, "{info}");
            let codec_name = if codec == "zstd" { "zstd:3" } else { codec };
            assert_eq!(info["codecs"].as_object().unwrap().keys().collect::<Vec<_>>(), [codec_name]);
            let elided = info["deduplicated_bytes"].as_u64().unwrap();
            assert_eq!(elided > 0, dedup && name == "generated", "{name} {codec} {dedup}: {info}");
            if elided > 0 {
                println!("{name} {codec} {block} --dedup: {elided} of {raw} raw bytes stored once, {stored} stored");
            }
        }
    }
    println!("compressed stores: {compared} answers byte-identical to the plain store's ({} forms)", FORMS.len());
    assert!(compared > 100);
}

/// A compressed segment's data file is a run of standard frames: `zstd -d` and `lz4 -d` turn it back into the
/// plain segment's pcap file, byte for byte, and so does `pcaptool convert`.
#[test]
fn segments_decompress_to_the_plain_segment_with_standard_tools() {
    let tmp = TempDir::new("compress-tools");
    let trace = repeating_trace(&tmp, "gen.pcap", 5_000, 5);
    let plain = tmp.join("plain");
    assert!(import(&[&trace], &plain, &[]).status.success());
    let mut segments: Vec<String> = std::fs::read_dir(&plain)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    segments.sort();
    assert!(segments.len() > 3, "{segments:?}");
    let mut checked = 0;
    for (codec, ext, tool_name, dedup) in
        [("lz4", "lz4", "lz4", false), ("zstd:9", "zst", "zstd", false), ("zstd", "zst", "zstd", true)]
    {
        let dir = tmp.join(&format!("{ext}-{dedup}"));
        let mut opts = vec!["--compress", codec, "--block-size", "8K"];
        if dedup {
            opts.push("--dedup");
        }
        let o = import(&[&trace], &dir, &opts);
        assert!(o.status.success(), "{}", err(&o));
        let external = tool(tool_name);
        if external.is_none() {
            println!("{tool_name} is not installed: its check of the {codec} segments is skipped (CI installs it)");
        }
        for seg in &segments {
            let want = std::fs::read(plain.join(seg)).unwrap();
            let data = dir.join(format!("{seg}.{ext}"));
            let stored = std::fs::metadata(&data).unwrap().len();
            assert!(stored < want.len() as u64, "{seg}: {stored} bytes compressed of {}", want.len());
            let out = tmp.join("converted.pcap");
            let o = pcaptool(&["convert", p(&data), p(&out)]);
            assert!(o.status.success(), "{}", err(&o));
            assert!(std::fs::read(&out).unwrap() == want, "{seg}: pcaptool convert");
            if let Some(t) = &external {
                let o = Command::new(t).args(["-d", "-c", "-q"]).arg(&data).output().unwrap();
                assert!(o.status.success(), "{tool_name}: {}", err(&o));
                if !dedup {
                    assert!(o.stdout == want, "{seg}: {tool_name} -d");
                } else {
                    // Deduplicated: not a pcap stream once decompressed, and marked so that readers refuse it.
                    assert!(o.stdout.starts_with(b"PTDD"), "{seg}: deduplicated data's mark");
                    let raw = tmp.join("raw.bin");
                    std::fs::write(&raw, &o.stdout).unwrap();
                    let o = pcaptool(&["info", p(&raw)]);
                    assert!(!o.status.success() && err(&o).contains("pcaptool convert"), "{}", err(&o));
                    if let Some(tcpdump) = tool("tcpdump") {
                        assert!(!Command::new(tcpdump).arg("-r").arg(&raw).output().unwrap().status.success());
                    }
                }
            }
            checked += 1;
        }
    }
    println!("compressed segments: {checked} decompress to their plain segment's bytes");
}

/// A flipped byte in a compressed block, a cut data file or a damaged block directory is an error naming the file
/// and the block; `--skip-damaged` answers from the other segments; `verify` reports it; no packet of a damaged
/// block is ever written.
#[test]
fn damaged_blocks_are_errors_naming_the_block() {
    let tmp = TempDir::new("compress-damage");
    let trace = gen_trace(&tmp, "gen.pcap", 10_000, 9);
    for (codec, ext) in [("lz4", "lz4"), ("zstd", "zst")] {
        let dir = tmp.join(ext);
        let o = import(&[&trace], &dir, &["--compress", codec, "--block-size", "4K"]);
        assert!(o.status.success(), "{}", err(&o));
        let out = tmp.join("out.pcapng");
        let whole = answer(&dir, &[""], &out).unwrap();
        let name = format!("seg-000001.pcap.{ext}");
        let data = dir.join(&name);
        let good = std::fs::read(&data).unwrap();
        for at in [10, good.len() / 2, good.len() - 3] {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            std::fs::write(&data, &bad).unwrap();
            let _ = std::fs::remove_file(&out);
            let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
            assert_eq!(o.status.code(), Some(1), "{codec} byte {at}: {}", err(&o));
            let e = err(&o);
            assert!(e.contains(&name) && e.contains("damaged in block") && e.contains("checksum"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
            let o = pcaptool(&["verify", p(&dir)]);
            assert_eq!(o.status.code(), Some(3), "{}", err(&o));
            assert!(String::from_utf8_lossy(&o.stdout).contains("block"), "{}", String::from_utf8_lossy(&o.stdout));
            let o = pcaptool(&["query", p(&dir), "", "-w", p(&out), "--skip-damaged", "--format", "pcapng"]);
            assert_eq!(o.status.code(), Some(3), "{}", err(&o));
            let partial = std::fs::read(&out).unwrap();
            assert!(partial.len() < whole.len(), "the damaged segment is left out");
        }
        // Cut short: the file's length disagrees with its index.
        std::fs::write(&data, &good[..good.len() - 1]).unwrap();
        let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
        assert_eq!(o.status.code(), Some(1));
        assert!(err(&o).contains(&name), "{}", err(&o));
        std::fs::write(&data, &good).unwrap();
        assert!(answer(&dir, &[""], &out).unwrap() == whole, "restored");
        // The block directory (the index's last part) damaged: its checksum.
        let index = dir.join("seg-000001.ptsx");
        let mut ix = std::fs::read(&index).unwrap();
        let n = ix.len();
        ix[n - 5] ^= 1;
        std::fs::write(&index, &ix).unwrap();
        let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
        assert_eq!(o.status.code(), Some(1));
        assert!(err(&o).contains("seg-000001.ptsx") && err(&o).contains("checksum"), "{}", err(&o));
    }
}

/// The data files of each segment of `dir`, by segment number.
fn data_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.starts_with("seg-") && !name.ends_with(".ptsx") {
            m.entry(name[4..10].to_string()).or_default().push(name);
        }
    }
    m
}

/// `compact` rewrites segments one at a time, each atomically: queries run beside it answer exactly as before it,
/// and a `kill -9` at any moment leaves a store that answers exactly as before; the next writer removes what the
/// killed one left, and the data of every segment is in one file again.
#[test]
fn compaction_is_atomic_beside_readers_and_when_killed() {
    let tmp = TempDir::new("compress-compact");
    let trace = repeating_trace(&tmp, "gen.pcap", 14_000, 21);
    let dir = tmp.join("store");
    assert!(import(&[&trace], &dir, &[]).status.success());
    let segments = data_files(&dir).len();
    assert!(segments > 20, "{segments} segments");
    let out = tmp.join("out.pcapng");
    let want = answer(&dir, &[""], &out).unwrap();
    let want_tcp = answer(&dir, &["tcp"], &out).unwrap();
    assert!(want_tcp.len() < want.len());

    // Beside readers: every answer while it runs is the store's answer.
    let mut child = Command::new(pcaptool_bin())
        .args(["compact", p(&dir), "--compress", "zstd:19", "--block-size", "4K"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut during = 0;
    loop {
        let finished = child.try_wait().unwrap().is_some();
        for (k, (args, want)) in [(&[""][..], &want), (&["tcp"][..], &want_tcp)].into_iter().enumerate() {
            let got = answer(&dir, args, &tmp.join(&format!("during{k}.pcapng")));
            assert!(got.as_ref() == Ok(want), "a query beside compact: {:?}", got.err());
        }
        if finished {
            break;
        }
        during += 1;
    }
    assert!(child.wait().unwrap().success());
    println!("compact: {during} rounds of queries ran beside it, each answered exactly");
    let files = data_files(&dir);
    assert!(files.values().all(|v| v.len() == 1 && v[0].ends_with(".1.pcap.zst")), "{files:?}");
    assert!(pcaptool(&["verify", p(&dir)]).status.success());

    // Killed at moments spread over its run, alternating codecs.
    let mut left_behind = 0;
    for (round, delay) in [3u64, 15, 40, 90, 150, 250, 400, 700].into_iter().enumerate() {
        let codec = ["lz4", "zstd:3", "none", "zstd"][round % 4];
        let mut args = vec!["compact", p(&dir), "--compress", codec, "--block-size", "8K"];
        // Deduplicated as it is recompressed, once.
        if round == 3 {
            args.push("--dedup");
        }
        let mut child = Command::new(pcaptool_bin())
            .args(&args)
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        // A reader answers exactly, whatever was left.
        assert!(answer(&dir, &[""], &out).unwrap() == want, "after a kill at {delay} ms");
        let files = data_files(&dir);
        let tmp_files = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"));
        if files.values().any(|v| v.len() > 1) || tmp_files.count() > 0 {
            left_behind += 1;
        }
        // The next writer finishes the job and leaves one data file per segment.
        let o = pcaptool(&args);
        assert!(o.status.success(), "{}", err(&o));
        if round == 3 {
            let info = pcaptool(&["info", p(&dir), "--json"]);
            let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
            assert!(info["deduplicated_bytes"].as_u64().unwrap() > 0, "compact --dedup: {info}");
        }
        let files = data_files(&dir);
        assert_eq!(files.len(), segments);
        assert!(files.values().all(|v| v.len() == 1), "{files:?}");
        assert!(answer(&dir, &[""], &out).unwrap() == want, "after the next compact ({codec})");
        assert!(answer(&dir, &["tcp"], &out).unwrap() == want_tcp);
        assert!(pcaptool(&["verify", p(&dir)]).status.success());
    }
    println!("compact killed 8 times: {left_behind} left files for the next writer, every answer exact");
}

/// Every filter of the table (tests/filters.txt) writes the same bytes from compressed stores (LZ4 and
/// Zstandard, deduplicated or not) as from the plain store, each store answering in one `pcaptool shell`.
#[test]
fn the_whole_filter_table_answers_alike_on_compressed_stores() {
    let tmp = TempDir::new("compress-table");
    let trace = repeating_trace(&tmp, "gen.pcap", 6_000, 17);
    let table = pcaptool_tests::filter_table();
    let answers = |dir: &Path, tag: &str| -> Vec<Option<Vec<u8>>> {
        let out = tmp.join(&format!("answers-{tag}"));
        std::fs::create_dir_all(&out).unwrap();
        let script: String = table
            .iter()
            .enumerate()
            .map(|(k, f)| format!("write {} {f}\n", p(&out.join(format!("{k}.pcap")))))
            .collect();
        let mut child = Command::new(pcaptool_bin())
            .args(["shell", p(dir)])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        (0..table.len()).map(|k| std::fs::read(out.join(format!("{k}.pcap"))).ok()).collect()
    };
    let plain = tmp.join("plain");
    assert!(import(&[&trace], &plain, &[]).status.success());
    let want = answers(&plain, "plain");
    let written = want.iter().filter(|a| a.is_some()).count();
    assert!(written > table.len() / 2, "{written} of {} filters answered", table.len());
    for (tag, opts) in [
        ("lz4-dedup", &["--compress", "lz4", "--block-size", "4K", "--dedup"][..]),
        ("zstd", &["--compress", "zstd:1", "--block-size", "16K"][..]),
    ] {
        let dir = tmp.join(tag);
        assert!(import(&[&trace], &dir, opts).status.success());
        let got = answers(&dir, tag);
        for (k, (a, b)) in want.iter().zip(&got).enumerate() {
            assert!(a == b, "{tag}: `{}`: not the plain store's answer", table[k]);
        }
    }
    println!(
        "the filter table on compressed stores: {written} answers of {} filters, each byte-identical",
        table.len()
    );
}
