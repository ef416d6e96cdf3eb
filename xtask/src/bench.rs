//! `cargo xtask bench`: pcaptool beside tcpdump (and a bare record walk) on the same generated, page-cached trace.
//! Prints one table of rates and ratios; compare ratios from one run (the machine is small and noisy).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use pcaptool_packet::{Records, TraceReader, decode};
use xtask::tracegen::GenOptions;

use crate::{build_pcaptool, gen_file, parse_size, root};

/// Best of `runs` wall-clock times of `f`.
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut out = None;
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        out = Some(v);
    }
    (best, out.expect("runs > 0"))
}

fn command_time(runs: usize, cmd: &mut Command) -> anyhow::Result<Duration> {
    let mut best_t = Duration::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        let st = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().with_context(|| format!("{cmd:?}"))?;
        let e = t.elapsed();
        if !st.success() {
            bail!("{cmd:?} failed: {st}");
        }
        best_t = best_t.min(e);
    }
    Ok(best_t)
}

/// The physical limit of a record walk: follow the 16-byte legacy pcap headers and nothing else.
fn bare_walk(d: &[u8]) -> (u64, u64) {
    let mut p = 24;
    let (mut n, mut bytes) = (0u64, 0u64);
    while p + 16 <= d.len() {
        let caplen = u32::from_le_bytes([d[p + 8], d[p + 9], d[p + 10], d[p + 11]]) as usize;
        n += 1;
        bytes += caplen as u64;
        p += 16 + caplen;
    }
    (n, bytes)
}

/// Reads one byte of every cache line in order: the memory-bandwidth limit of anything that walks the whole map.
fn touch_every_line(d: &[u8]) -> u64 {
    let mut acc = 0u64;
    for chunk in d.chunks(64) {
        acc = acc.wrapping_add(u64::from(chunk[0]));
    }
    acc
}

/// The bare walk with a demand load 4 KiB ahead (safe code's stand-in for a prefetch): the stricter limit.
fn bare_walk_touch_ahead(d: &[u8]) -> (u64, u64) {
    let mut p = 24;
    let (mut n, mut bytes) = (0u64, 0u64);
    while p + 16 <= d.len() {
        black_box(d.get(p + 4096).copied());
        let caplen = u32::from_le_bytes([d[p + 8], d[p + 9], d[p + 10], d[p + 11]]) as usize;
        n += 1;
        bytes += caplen as u64;
        p += 16 + caplen;
    }
    (n, bytes)
}

fn records_walk(d: &[u8]) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    for r in Records::new(d) {
        let r = r.expect("generated trace is valid");
        n += 1;
        bytes += u64::from(r.caplen()) ^ (r.ts_ns & 1);
    }
    (n, bytes)
}

fn decode_walk(d: &[u8]) -> u64 {
    let mut ports = 0u64;
    for r in Records::new(d) {
        let r = r.expect("generated trace is valid");
        let x = decode(r.linktype, r.data);
        ports += x.transport.and_then(|t| t.ports()).map_or(0, |p| u64::from(p.0));
    }
    ports
}

fn pcap_parser_walk(d: &[u8]) -> u64 {
    use pcap_parser::traits::PcapReaderIterator;
    let _ = &d;
    let mut n = 0u64;
    let mut reader = pcap_parser::LegacyPcapReader::new(1 << 20, std::io::Cursor::new(d)).expect("pcap-parser reader");
    loop {
        match reader.next() {
            Ok((off, block)) => {
                if let pcap_parser::PcapBlockOwned::Legacy(b) = block {
                    n += 1;
                    black_box(b.data.len());
                }
                reader.consume(off);
            }
            Err(pcap_parser::PcapError::Eof) => break,
            Err(pcap_parser::PcapError::Incomplete(_)) => reader.refill().expect("refill"),
            Err(e) => panic!("pcap-parser: {e:?}"),
        }
    }
    n
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut size = 1536u64 << 20;
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--size" => size = parse_size(it.next().context("--size needs a value")?)?,
            "--only" => only = Some(it.next().context("--only needs walk, commands or query")?.clone()),
            s => bail!("unknown argument {s:?}"),
        }
    }
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let trace: PathBuf = dir.join(format!("trace-{}M.pcap", size >> 20));
    let opt = GenOptions { packets: u64::MAX, max_bytes: size, ..GenOptions::default() };
    if !trace.exists() {
        eprintln!("generating {} (seed {})...", trace.display(), opt.seed);
        let t = Instant::now();
        let s = gen_file(&trace, &opt)?;
        eprintln!("  {} packets, {} bytes in {:.1?}", s.packets, s.bytes, t.elapsed());
    }
    let bin = build_pcaptool()?;
    let tcpdump = which("tcpdump");
    // Warm the page cache.
    let _ = std::fs::read(&trace)?;

    let reader = TraceReader::open(&trace)?;
    let map = reader.as_bytes().context("trace is memory-mapped")?;
    let gb = map.len() as f64 / 1e9;
    println!("trace: {} ({:.2} GB, page-cached)", trace.display(), gb);
    println!();
    let want = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let n = Records::new(map).count() as u64;
    if want("query") {
        query_section(&bin, tcpdump.as_deref(), &trace, n, gb)?;
    }
    if !want("walk") && !want("commands") {
        return Ok(());
    }
    println!("| what | time | packets/s | GB/s | ratio |");
    println!("|---|---|---|---|---|");
    let (t_bare, (n, _)) = best(5, || black_box(bare_walk(black_box(map))));
    let row = |name: &str, t: Duration, base: Duration| {
        let s = t.as_secs_f64();
        println!(
            "| {name} | {:.3} s | {:.1} M | {:.2} | {:.2} |",
            s,
            n as f64 / s / 1e6,
            gb / s,
            base.as_secs_f64() / s
        );
    };
    row("bare walk over 16-byte record headers (the issue's physical limit)", t_bare, t_bare);
    let (t_touch, (m, _)) = best(5, || black_box(bare_walk_touch_ahead(black_box(map))));
    assert_eq!(m, n);
    row("bare walk + load 4 KiB ahead (a stricter limit)", t_touch, t_bare);
    let (t_bw, _) = best(5, || black_box(touch_every_line(black_box(map))));
    row("read one byte of every 64-byte line in order (memory bandwidth)", t_bw, t_bare);
    let (t_rec, (m, _)) = best(5, || black_box(records_walk(black_box(map))));
    assert_eq!(m, n);
    row("pcaptool_packet::Records (mmap, zero-copy; ratio = share of the bare walk)", t_rec, t_bare);
    let (t_pp, m) = best(3, || black_box(pcap_parser_walk(black_box(map))));
    assert_eq!(m, n);
    row("pcap-parser 0.17 LegacyPcapReader over the same bytes", t_pp, t_bare);
    let (t_dec, _) = best(3, || black_box(decode_walk(black_box(map))));
    row("Records + decode (link to transport, realistic mix)", t_dec, t_bare);
    println!();
    println!("| command | time | packets/s | GB/s | ratio to tcpdump |");
    println!("|---|---|---|---|---|");
    let t_info = command_time(3, Command::new(&bin).args(["info", "--no-protocols"]).arg(&trace))?;
    let t_info_p = command_time(3, Command::new(&bin).args(["info"]).arg(&trace))?;
    let t_conv =
        command_time(3, Command::new(&bin).arg("convert").arg(&trace).arg("/dev/null").args(["--format", "pcap"]))?;
    let cmd_row = |name: &str, t: Duration, base: Option<Duration>| {
        let s = t.as_secs_f64();
        let ratio = base.map_or("n/a".to_string(), |b| format!("{:.2}", b.as_secs_f64() / s));
        println!("| {name} | {:.3} s | {:.1} M | {:.2} | {ratio} |", s, n as f64 / s / 1e6, gb / s);
    };
    let t_tcpdump = match &tcpdump {
        Some(t) => Some(command_time(3, Command::new(t).arg("-r").arg(&trace).args(["-w", "/dev/null"]))?),
        None => {
            eprintln!("tcpdump not installed: its rows are missing");
            None
        }
    };
    if let Some(t) = t_tcpdump {
        cmd_row("tcpdump -r FILE -w /dev/null", t, t_tcpdump);
    }
    cmd_row("pcaptool convert FILE /dev/null (read + write pcap)", t_conv, t_tcpdump);
    cmd_row("pcaptool info --no-protocols FILE (read, count, time span)", t_info, t_tcpdump);
    cmd_row("pcaptool info FILE (also decodes every packet)", t_info_p, t_tcpdump);
    println!();
    println!(
        "records/s Records vs bare walk: {:.1}% (goal >= 90%)",
        t_bare.as_secs_f64() / t_rec.as_secs_f64() * 100.0
    );
    println!(
        "records/s Records vs bare walk + load ahead: {:.1}%",
        t_touch.as_secs_f64() / t_rec.as_secs_f64() * 100.0
    );
    println!("Records vs reading every cache line: {:.1}%", t_bw.as_secs_f64() / t_rec.as_secs_f64() * 100.0);
    Ok(())
}

/// Filters for the query rows: selective and broad, on addresses, ports, flags and lengths of the generated trace.
const QUERY_FILTERS: &[&str] = &[
    "host 10.0.1.25",
    "tcp port 80",
    "net 198.18.0.0/24 and udp",
    "tcp[tcpflags] & tcp-syn != 0",
    "ip6 and tcp dst portrange 1000-2000",
    "not (tcp or udp)",
    "greater 1400",
];

/// `pcaptool query --scan FILE FILTER -w /dev/null` beside `tcpdump -r FILE -w /dev/null FILTER`.
fn query_section(bin: &Path, tcpdump: Option<&Path>, trace: &Path, n: u64, gb: f64) -> anyhow::Result<()> {
    println!(
        "| filter | tcpdump -r -w /dev/null | pcaptool query --scan -w /dev/null | matches | ratio (tcpdump time / pcaptool time) |"
    );
    println!("|---|---|---|---|---|");
    for f in QUERY_FILTERS {
        let ours =
            command_time(3, Command::new(bin).arg("query").arg("--scan").arg(trace).arg(f).args(["-w", "/dev/null"]))?;
        let count = Command::new(bin).arg("query").arg(trace).arg(f).arg("--count").output()?;
        let matched = String::from_utf8_lossy(&count.stdout).trim().to_string();
        let theirs = match tcpdump {
            Some(t) => Some(command_time(3, Command::new(t).arg("-r").arg(trace).args(["-w", "/dev/null"]).arg(f))?),
            None => None,
        };
        let rate = |t: Duration| {
            format!(
                "{:.3} s ({:.1} M pkt/s, {:.2} GB/s)",
                t.as_secs_f64(),
                n as f64 / t.as_secs_f64() / 1e6,
                gb / t.as_secs_f64()
            )
        };
        println!(
            "| `{f}` | {} | {} | {matched} | {} |",
            theirs.map_or("n/a".to_string(), rate),
            rate(ours),
            theirs.map_or("n/a".to_string(), |t| format!("{:.2}", t.as_secs_f64() / ours.as_secs_f64()))
        );
    }
    println!();
    Ok(())
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| Path::is_file(p)))
}
