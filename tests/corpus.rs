//! Every file of ../shared/corpus (real captures from public projects; skipped with a message when absent) read by
//! pcaptool and compared with Wireshark's `capinfos`: packet count and earliest/latest timestamps must agree; where
//! capinfos fails too, pcaptool must give a clear error and not panic. Also: the memory-mapped, streamed and
//! compressed paths give identical records for every file.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use pcaptool_packet::{
    Compression, Compressor, FileFormat, Peek, ReadOptions, Records, Seeker, TraceReader, TsPrecision,
};
use pcaptool_tests::{corpus_dir, corpus_files, tool};

#[derive(Debug, Default, Clone)]
struct Ours {
    packets: u64,
    earliest: Option<u64>,
    latest: Option<u64>,
    error: Option<String>,
    digest: u64,
    digits: u32,
}

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

fn read_all(mut r: TraceReader) -> Ours {
    let mut o = Ours { digest: 0xcbf2_9ce4_8422_2325, ..Ours::default() };
    let _ = r.read_header();
    o.digits = precision_digits(&r);
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(rec) => {
                o.packets += 1;
                if rec.has_ts {
                    o.earliest = Some(o.earliest.map_or(rec.ts_ns, |e| e.min(rec.ts_ns)));
                    o.latest = Some(o.latest.map_or(rec.ts_ns, |l| l.max(rec.ts_ns)));
                }
                fnv(&mut o.digest, &rec.ts_ns.to_le_bytes());
                fnv(&mut o.digest, &rec.wirelen.to_le_bytes());
                fnv(&mut o.digest, &rec.iface.to_le_bytes());
                fnv(&mut o.digest, &rec.offset.to_le_bytes());
                fnv(&mut o.digest, rec.data);
            }
            Err(e) => {
                o.error = Some(e.to_string());
                break;
            }
        }
    }
    o
}

/// Parses a time printed as "SECONDS.FRACTION" by capinfos `-S` or tcpdump `-tt`, where FRACTION is a count of
/// units of 10^-`digits` seconds. Both tools print the sub-second field of the record as it is, so a field that
/// is out of range (1418145370.2147483648 for a microsecond file) shows more digits; it is normalised here the way
/// pcaptool stores instants (nanoseconds since the epoch). Returns nanoseconds truncated to `digits`.
fn parse_secs(s: &str, digits: u32) -> Option<u64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, "0"));
    let secs: u64 = int.parse().ok()?;
    let units: u64 = frac.parse().ok()?;
    Some(secs * 1_000_000_000 + units * 10u64.pow(9 - digits))
}

fn truncate_to(ns: u64, digits: u32) -> u64 {
    let unit = 10u64.pow(9 - digits.min(9));
    ns / unit * unit
}

/// The number of fractional digits capinfos prints for a legacy pcap file (the precision of its timestamps); 0 when
/// the format does not say (pcapng: then the digits capinfos printed are taken).
fn precision_digits(r: &TraceReader) -> u32 {
    match r.format() {
        Some(FileFormat::Pcap { precision: TsPrecision::Micro, .. }) => 6,
        Some(FileFormat::Pcap { precision: TsPrecision::Nano, .. }) => 9,
        _ => 0,
    }
}

/// Earliest and latest packet times, truncated to microseconds, as tcpdump (libpcap) prints them (`-tt`; it prints
/// no time for records it calls invalid) or as tshark prints them per packet (`frame.time_epoch`).
fn tool_span(tool: &Path, args: &[&str], file: &Path, digits: u32) -> Option<(u64, u64)> {
    let out = Command::new(tool).args(args).arg(file).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut span: Option<(u64, u64)> = None;
    for line in text.lines() {
        let Some(tok) = line.split(' ').next() else { continue };
        if !tok.contains('.') || !tok.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            continue;
        }
        let Some(t) = parse_secs(tok, digits) else { continue };
        let t = truncate_to(t, 6);
        span = Some(span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
    }
    span
}

#[test]
fn corpus_agrees_with_capinfos() {
    let Some(corpus) = corpus_dir() else { return };
    let Some(capinfos) = tool("capinfos") else { return };
    let Some(tcpdump) = tool("tcpdump") else { return };
    let Some(tshark) = tool("tshark") else { return };
    let files = corpus_files(&corpus);
    let out = Command::new(capinfos)
        .args(["-T", "-r", "-c", "-a", "-e", "-S"])
        .args(&files)
        .current_dir(&corpus)
        .output()
        .expect("run capinfos");
    let table = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    let mut rows: HashMap<&str, (u64, &str, &str)> = HashMap::new();
    for line in table.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() == 4
            && let Ok(n) = f[1].parse()
        {
            rows.insert(f[0], (n, f[2], f[3]));
        }
    }
    // capinfos reports damage after a prefix as `An error occurred after reading N packets from "FILE"`.
    let mut damaged_after: HashMap<String, u64> = HashMap::new();
    for line in errors.lines() {
        if let Some(rest) = line.strip_prefix("capinfos: An error occurred after reading ")
            && let Some((n, file)) = rest.split_once(" packets from \"")
        {
            damaged_after.insert(file.trim_end_matches("\".").to_string(), n.parse().unwrap_or(0));
        }
    }

    let (mut agree, mut agree_tcpdump, mut both_fail, mut only_capinfos_fails) = (0, 0, 0, 0);
    let mut disagreements = Vec::new();
    for file in &files {
        let path = corpus.join(file);
        let ours = match TraceReader::open(&path) {
            Ok(r) => read_all(r),
            Err(e) => Ours { error: Some(e.to_string()), ..Ours::default() },
        };
        if let Some(msg) = &ours.error {
            assert!(msg.contains(file.as_str()), "error does not name the file: {msg}");
            assert!(msg.contains("at byte"), "error does not name the offset: {msg}");
        }
        match rows.get(file.as_str()) {
            Some(&(n, earliest, latest)) => {
                let mut why = Vec::new();
                if ours.packets != n {
                    why.push(format!("packets: capinfos {n}, pcaptool {}", ours.packets));
                }
                let digits = if ours.digits == 0 { precision_digits_of(earliest) } else { ours.digits };
                let mut time_why = Vec::new();
                for (name, theirs, mine) in [("earliest", earliest, ours.earliest), ("latest", latest, ours.latest)] {
                    match (parse_secs(theirs, digits), mine) {
                        (Some(t), Some(m)) if truncate_to(m, digits) != t => {
                            time_why.push(format!("{name}: capinfos {theirs}, pcaptool {m} ns"))
                        }
                        (Some(_), None) if n > 0 => time_why.push(format!("{name}: capinfos {theirs}, pcaptool none")),
                        _ => {}
                    }
                }
                // Wireshark 4.0 mishandles sub-second fields of a second or more (its nanoseconds overflow) and then
                // reports an earliest time later than the latest; there the per-packet times of libpcap (tcpdump) or
                // of Wireshark itself (tshark) are the oracle.
                let mut by_tcpdump = false;
                if !time_why.is_empty() {
                    let mine = ours.earliest.zip(ours.latest).map(|(a, b)| (truncate_to(a, 6), truncate_to(b, 6)));
                    let td = tool_span(&tcpdump, &["-tt", "-n", "-r"], &path, 6);
                    let ts = tool_span(&tshark, &["-T", "fields", "-e", "frame.time_epoch", "-r"], &path, 9);
                    if td == mine || ts == mine {
                        by_tcpdump = true;
                    } else {
                        why.extend(time_why);
                        why.push(format!("tcpdump's span {td:?}, tshark's {ts:?}, pcaptool's {mine:?}"));
                    }
                }
                let capinfos_damaged = damaged_after.contains_key(file.as_str());
                if capinfos_damaged && ours.error.is_none() {
                    why.push("capinfos reports damage, pcaptool none".to_string());
                }
                if !capinfos_damaged && let Some(e) = &ours.error {
                    why.push(format!("pcaptool reports damage that capinfos does not: {e}"));
                }
                if why.is_empty() && by_tcpdump {
                    agree_tcpdump += 1;
                    println!(
                        "note: {file}: capinfos' time span is off; per-packet times of tcpdump or tshark agree with pcaptool"
                    );
                } else if why.is_empty() {
                    agree += 1;
                } else {
                    disagreements.push(format!("{file}: {}", why.join("; ")));
                }
            }
            None => {
                if ours.error.is_some() {
                    both_fail += 1;
                } else {
                    only_capinfos_fails += 1;
                    println!("note: capinfos cannot read {file}; pcaptool reads {} packets", ours.packets);
                }
            }
        }
    }
    println!(
        "corpus vs capinfos: {} files; {agree} agree with capinfos; {agree_tcpdump} agree with tcpdump's or tshark's per-packet times where \
         capinfos' time span is off; {both_fail} both fail with an error; {only_capinfos_fails} read by pcaptool where \
         capinfos fails; {} disagree",
        files.len(),
        disagreements.len()
    );
    assert!(
        disagreements.is_empty(),
        "{} files disagree with capinfos:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

fn precision_digits_of(printed: &str) -> u32 {
    printed.split_once('.').map_or(0, |(_, f)| f.len() as u32).min(9)
}

fn stream_of(path: &Path, bytes: Vec<u8>) -> TraceReader {
    TraceReader::from_reader(Box::new(std::io::Cursor::new(bytes)), Some(path.to_path_buf())).expect("stream reader")
}

#[test]
fn mapped_streamed_and_compressed_paths_agree_on_the_corpus() {
    let Some(corpus) = corpus_dir() else { return };
    let mut checked = 0;
    for file in corpus_files(&corpus) {
        let path = corpus.join(&file);
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if Compression::detect(&bytes).is_some() {
            continue;
        }
        let mapped = TraceReader::open(&path)
            .map(read_all)
            .unwrap_or_else(|e| Ours { error: Some(e.to_string()), ..Ours::default() });
        let read = TraceReader::open_with(&path, ReadOptions::new().no_mmap(true)).map(read_all).unwrap();
        let streamed = read_all(stream_of(&path, bytes.clone()));
        let mut variants = vec![("read(2)", read), ("stream", streamed)];
        for c in [Compression::Gzip, Compression::Zstd, Compression::Lz4] {
            let mut w = Compressor::new(Vec::new(), Some(c)).unwrap();
            w.write_all(&bytes).unwrap();
            let z = w.finish().unwrap();
            variants.push((c.name(), read_all(stream_of(&path, z))));
        }
        for (name, v) in variants {
            assert_eq!(mapped.packets, v.packets, "{file}: mmap vs {name}: packet count");
            assert_eq!(mapped.digest, v.digest, "{file}: mmap vs {name}: record contents");
            let strip = |e: &Option<String>| e.as_ref().map(|e| e.split(": ").skip(1).collect::<Vec<_>>().join(": "));
            // A stream cannot tell "truncated" from "ends" any differently, so errors must match exactly.
            assert_eq!(strip(&mapped.error), strip(&v.error), "{file}: mmap vs {name}: error");
        }
        checked += 1;
    }
    println!("mmap, read(2), stream, gzip, zstd and lz4 paths agree on {checked} corpus files");
}

/// The seeker (how an index reads the packets it selects) reads every record of every corpus file exactly as the
/// sequential reader does, from its offset alone: in the whole file, and in windows of the file (as `pread` fills
/// them) that start before the record and end inside it (more is asked for) or after it.
#[test]
fn seeker_reads_every_record_as_the_sequential_reader_does() {
    let Some(corpus) = corpus_dir() else { return };
    let (mut files, mut records) = (0u64, 0u64);
    for file in corpus_files(&corpus) {
        let path = corpus.join(&file);
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if Compression::detect(&bytes).is_some() {
            continue;
        }
        let mut recs = Records::new(&bytes).track_structure();
        let all: Vec<_> = recs.by_ref().map_while(Result::ok).collect();
        if all.is_empty() {
            continue;
        }
        let seeker = Seeker::new(&bytes, recs.structure()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(seeker.interfaces(), recs.interfaces(), "{file}: interfaces");
        for (k, r) in all.iter().enumerate() {
            let s = seeker.record_at(&bytes, r.offset).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(&s, r, "{file}: record at {}", r.offset);
            // A window from up to 100 bytes before the record, cut at several lengths.
            let at = r.offset as usize;
            let start = at.saturating_sub(k % 100);
            let end = at + r.record_len as usize;
            for cut in [at, at + 1, at + 15, end - 1, end, end + 7] {
                let window = &bytes[start..cut.min(bytes.len())];
                match seeker.peek_in(window, start as u64, r.offset).unwrap_or_else(|e| panic!("{file}: {e}")) {
                    Peek::Record(p) => {
                        assert!(cut >= end, "{file}: a record at {} from a window cut at {cut}", r.offset);
                        assert_eq!(&p, r, "{file}: windowed record at {}", r.offset);
                    }
                    Peek::Beyond(need) => {
                        assert!(cut < end, "{file}: record at {} not found in a window to {cut}", r.offset);
                        assert!(at as u64 + need > cut as u64, "{file}: asks for {need} bytes at {}", r.offset);
                    }
                    Peek::Skip(_) => panic!("{file}: a record at {} read as a structure to skip", r.offset),
                }
            }
        }
        files += 1;
        records += all.len() as u64;
    }
    println!(
        "seeker: {records} records of {files} corpus files read from their offsets alone, all identical (also from \
         windows of the file)"
    );
}
