//! Round trips through `pcaptool convert`: pcap → pcapng → pcap keeps every record byte for byte; ns ↔ µs gives
//! exactly the file tcpdump writes. Uses generated traces, testdata/, and ../shared/corpus when present.

use std::path::{Path, PathBuf};
use std::process::Command;

use pcaptool_packet::{FileFormat, TraceReader};
use pcaptool_tests::generated_trace;
use pcaptool_tests::tracegen::GenOptions;
use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, tool};

/// (ts_ns, wirelen, data) of every record, and the damage that ended reading, if any.
fn records(path: &Path) -> Recs {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(rec) => v.push((rec.ts_ns, rec.wirelen, rec.data.to_vec())),
            Err(e) => return (v, Some(e.kind.to_string())),
        }
    }
    (v, None)
}

/// Whether a legacy pcap file has a record whose sub-second field is a second or more (an independent walk over
/// the raw record headers).
fn has_out_of_range_subsecond(path: &Path) -> bool {
    let b = std::fs::read(path).unwrap();
    if b.len() < 24 {
        return false;
    }
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let (be, limit) = match magic {
        0xa1b2_c3d4 => (false, 1_000_000),
        0xa1b2_3c4d => (false, 1_000_000_000),
        0xd4c3_b2a1 => (true, 1_000_000),
        0x4d3c_b2a1 => (true, 1_000_000_000),
        _ => return false,
    };
    let rd = |at: usize| {
        let a = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if be { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) }
    };
    let mut p = 24;
    while p + 16 <= b.len() {
        if rd(p + 4) >= limit {
            return true;
        }
        p += 16 + rd(p + 8) as usize;
    }
    false
}

type Recs = (Vec<(u64, u32, Vec<u8>)>, Option<String>);

/// Asserts two record lists are equal, printing the first difference compactly.
#[track_caller]
fn same(a: &Recs, b: &Recs, what: &str) {
    if a == b {
        return;
    }
    let i = a.0.iter().zip(&b.0).position(|(x, y)| x != y).unwrap_or(a.0.len().min(b.0.len()));
    let show = |r: Option<&(u64, u32, Vec<u8>)>| r.map(|r| format!("ts {} wirelen {} caplen {}", r.0, r.1, r.2.len()));
    panic!(
        "{what}: {} vs {} records, errors {:?} vs {:?}; first difference at record {i}: {:?} vs {:?}",
        a.0.len(),
        b.0.len(),
        a.1,
        b.1,
        show(a.0.get(i)),
        show(b.0.get(i))
    );
}

fn convert(input: &Path, output: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(pcaptool_bin()).arg("convert").arg(input).arg(output).args(extra).output().expect("run pcaptool")
}

fn generated(dir: &TempDir, packets: u64) -> PathBuf {
    generated_trace(dir, "gen.pcap", packets, GenOptions::default().seed)
}

#[test]
fn pcap_to_pcapng_to_pcap_is_lossless_on_generated_traffic() {
    let dir = TempDir::new("rt-gen");
    let src = generated(&dir, 5000);
    let ng = dir.join("a.pcapng");
    let back = dir.join("b.pcap");
    assert!(convert(&src, &ng, &[]).status.success());
    assert!(convert(&ng, &back, &[]).status.success());
    same(&records(&src), &records(&ng), "pcap -> pcapng");
    // Same header fields and records: the file comes back byte for byte.
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap());
    for c in ["gz", "zst", "lz4"] {
        let z = dir.join(&format!("c.pcapng.{c}"));
        assert!(convert(&src, &z, &[]).status.success());
        let raw = std::fs::read(&z).unwrap();
        assert!(pcaptool_packet::Compression::detect(&raw).is_some(), "{c} output is compressed");
        same(&records(&src), &records(&z), c);
    }
}

#[test]
fn pcap_to_pcapng_to_pcap_is_lossless_on_the_corpus() {
    let Some(corpus) = corpus_dir() else { return };
    let dir = TempDir::new("rt-corpus");
    let (mut checked, mut refused) = (0, 0);
    for file in corpus_files(&corpus) {
        let src = corpus.join(&file);
        let (orig, damage) = records(&src);
        let ng = dir.join("a.pcapng");
        let back = dir.join("b.pcap");
        let _ = std::fs::remove_file(&ng);
        let _ = std::fs::remove_file(&back);
        let out = convert(&src, &ng, &["--format", "pcapng"]);
        if !ng.exists() {
            // Unreadable from the first byte: refused before any output is created.
            assert!(orig.is_empty() && damage.is_some(), "{file}: no output although readable");
            continue;
        }
        assert_eq!(out.status.success(), damage.is_none(), "{file}: exit status vs damage {damage:?}");
        same(&(records(&ng).0, None), &(orig.clone(), None), &format!("{file}: pcap -> pcapng"));
        // pcap holds one link type and 32-bit seconds: some pcapng files cannot become pcap.
        let unrepresentable = {
            let mut r = TraceReader::open(&ng).unwrap();
            let mut late = false;
            let mut lts = Vec::new();
            while let Some(Ok(rec)) = r.next_record() {
                late |= rec.ts_ns / 1_000_000_000 > u64::from(u32::MAX);
                lts.push(rec.linktype.base());
            }
            lts.sort();
            lts.dedup();
            lts.len() > 1 || late
        };
        let out = convert(&ng, &back, &["--format", "pcap"]);
        if unrepresentable {
            // A clear refusal that says what to do, and no half-written file left behind.
            assert!(!out.status.success(), "{file}: several link types or post-2106 times into pcap must fail");
            let msg = String::from_utf8_lossy(&out.stderr);
            assert!(msg.contains("pcapng"), "{file}: the error says what to do: {msg}");
            assert!(!back.exists(), "{file}: partial output removed");
            refused += 1;
            continue;
        }
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
        let (again, _) = records(&back);
        same(&(again, None), &(orig, None), &format!("{file}: pcap -> pcapng -> pcap"));
        checked += 1;
    }
    println!(
        "round trip pcap/pcapng -> pcapng -> pcap byte-identical for {checked} corpus files; {refused} that pcap cannot hold (several link types, times past 2106) refused with a clear error"
    );
}

/// A nanosecond pcap from the generator written with a nanosecond header; tcpdump's own conversion is the oracle.
#[test]
fn ns_to_us_and_back_matches_tcpdump() {
    let Some(tcpdump) = tool("tcpdump") else { return };
    let dir = TempDir::new("rt-ns");
    let ns = generated(&dir, 3000);
    let mut inputs = vec![ns];
    if let Some(corpus) = corpus_dir() {
        for f in corpus_files(&corpus) {
            let p = corpus.join(&f);
            if let Ok(r) = TraceReader::open(&p).map(|mut r| {
                let _ = r.read_header();
                r.format()
            }) && matches!(r, Some(FileFormat::Pcap { precision: pcaptool_packet::TsPrecision::Nano, .. }))
            {
                inputs.push(p);
            }
        }
    }
    for input in &inputs {
        if has_out_of_range_subsecond(input) {
            // libpcap reads such fields as signed 32-bit values and writes what that gives; nothing to compare.
            println!("note: {} has sub-second fields of a second or more; not compared", input.display());
            continue;
        }
        for (prec, flag) in [("us", "micro"), ("ns", "nano")] {
            let ours = dir.join(&format!("ours.{prec}.pcap"));
            let theirs = dir.join(&format!("theirs.{prec}.pcap"));
            let out = convert(input, &ours, &["--precision", prec]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let st = Command::new(&tcpdump)
                .args(["-r"])
                .arg(input)
                .arg(format!("--time-stamp-precision={flag}"))
                .arg("-w")
                .arg(&theirs)
                .output()
                .unwrap();
            assert!(st.status.success(), "tcpdump: {}", String::from_utf8_lossy(&st.stderr));
            // The same instants always; the same bytes unless the input has sub-second fields of a second or more
            // (tcpdump copies those as they are, pcaptool writes the same instant normalised).
            same(&records(&ours), &records(&theirs), &format!("{} --precision {prec}", input.display()));
            if !has_out_of_range_subsecond(input) {
                assert!(
                    std::fs::read(&ours).unwrap() == std::fs::read(&theirs).unwrap(),
                    "{} --precision {prec}: pcaptool and tcpdump write different files",
                    input.display()
                );
            }
            // And back: µs -> ns through both tools.
            let ours2 = dir.join("ours.back.pcap");
            let theirs2 = dir.join("theirs.back.pcap");
            assert!(convert(&ours, &ours2, &["--precision", "ns"]).status.success());
            let st = Command::new(&tcpdump)
                .arg("-r")
                .arg(&theirs)
                .arg("--time-stamp-precision=nano")
                .arg("-w")
                .arg(&theirs2)
                .output()
                .unwrap();
            assert!(st.status.success());
            same(&records(&ours2), &records(&theirs2), &format!("{} {prec} -> ns", input.display()));
            if !has_out_of_range_subsecond(input) {
                assert!(std::fs::read(&ours2).unwrap() == std::fs::read(&theirs2).unwrap(), "{prec} -> ns");
            }
        }
    }
    println!("ns <-> us conversions identical to tcpdump's on {} traces", inputs.len());
}
