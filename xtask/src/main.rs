//! `cargo xtask`: project automation. Subcommands: `gen` (deterministic trace), `demo` (the README's example),
//! `bench` (pcaptool beside tcpdump on a generated trace).

#![forbid(unsafe_code)]

mod bench;
mod capbench;
mod floor;
mod servebench;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use pcaptool_tests::tracegen::{GenOptions, generate};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  gen OUT [--packets N] [--size BYTES[K|M|G]] [--seed S] [--clients N] [--servers N]
                  write a deterministic Ethernet trace (pcap, ns) to OUT
  demo            generate a small trace in example/ and run `pcaptool info`, `query`, `index`, `import` and
                  `flows` on it
  fuzz-seeds [DIR]
                  seed corpora for the fuzz targets from testdata/ and small files of ../shared/corpus
  bench [--size BYTES[K|M|G]] [--packets N]
        [--only walk|commands|query|index|store|compress|export|serve|capture|pipeline|compress-pipeline
                |compress-long]
                  side-by-side benchmark of pcaptool and tcpdump on a generated trace and the real-traffic
                  trace (compress-pipeline: the capture pipeline into plain, LZ4 and Zstandard stores alone,
                  fed generated 64-byte frames and the real-traffic trace's first 2,000,000 packets;
                  compress-long: only its long capture, plain against LZ4)
  real-trace [OUT] [--copies N] [--seed S]
                  the benchmark trace of real traffic: the corpus's Ethernet captures merged by time and
                  repeated with checksum-neutral address rewrites (needs ../shared/corpus)
  faults [--tries N] [--packets N] [--seed S]
                  fault injection against a flow store and a trace index (byte flips, truncations, kill -9 of
                  writers): the table of docs/guarantees.md";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo xtask help`, or `--help` / `-h` anywhere (`cargo xtask bench --help`): the usage, and nothing run.
    if args.first().is_some_and(|a| a == "help") || args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    match args.first().map(String::as_str) {
        Some("gen") => gen_cmd(&args[1..]),
        Some("demo") => demo(),
        Some("bench") => bench::run(&args[1..]),
        Some("faults") => faults_cmd(&args[1..]),
        Some("real-trace") => real_trace_cmd(&args[1..]),
        Some("fuzz-seeds") => fuzz_seeds(args.get(1).map(PathBuf::from).unwrap_or_else(|| root().join("fuzz/seeds"))),
        _ => {
            eprintln!("{USAGE}");
            bail!("unknown or missing command")
        }
    }
}

/// Parses "3G", "500M", "64K" or a plain number of bytes.
pub(crate) fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num.parse::<u64>().with_context(|| format!("bad size {s:?}"))? * mul)
}

pub(crate) fn gen_options(args: &[String]) -> anyhow::Result<(Option<PathBuf>, GenOptions)> {
    let mut opt = GenOptions::default();
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--packets" => opt.packets = val()?.parse()?,
            "--size" => {
                opt.max_bytes = parse_size(val()?)?;
                if opt.packets == GenOptions::default().packets {
                    opt.packets = u64::MAX;
                }
            }
            "--seed" => opt.seed = val()?.parse()?,
            "--clients" => opt.clients = val()?.parse()?,
            "--servers" => opt.servers = val()?.parse()?,
            s if !s.starts_with('-') && out.is_none() => out = Some(PathBuf::from(s)),
            s => bail!("unknown argument {s:?}\n{USAGE}"),
        }
    }
    Ok((out, opt))
}

/// `cargo xtask real-trace [OUT] [--copies N] [--seed S]`: the benchmark trace built from the real captures of
/// ../shared/corpus (`pcaptool_tests::realtrace`); default `target/bench/real-21.pcap`, 21 copies, seed 1.
fn real_trace_cmd(args: &[String]) -> anyhow::Result<()> {
    let (mut out, mut copies, mut seed) = (None, 21u32, 1u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--copies" => copies = it.next().context("--copies needs a number")?.parse()?,
            "--seed" => seed = it.next().context("--seed needs a number")?.parse()?,
            other => out = Some(PathBuf::from(other)),
        }
    }
    let out = out.unwrap_or_else(|| root().join(format!("target/bench/real-{copies}.pcap")));
    let corpus = root().join("../shared/corpus");
    let sources = pcaptool_tests::realtrace::sources(&corpus);
    if sources.is_empty() {
        bail!("{} is absent: the real-traffic trace is built from its captures", corpus.display());
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = File::create(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let stats = pcaptool_tests::realtrace::build(&sources, copies, seed, BufWriter::with_capacity(1 << 20, f))?;
    eprintln!(
        "wrote {}: {} copies of {} packets from {} captures ({} packets, {} bytes; a copy spans {:.1} s)",
        out.display(),
        copies,
        stats.packets_per_copy,
        stats.files,
        stats.packets,
        stats.bytes,
        stats.span_ns as f64 / 1e9
    );
    Ok(())
}

fn gen_cmd(args: &[String]) -> anyhow::Result<()> {
    let (out, opt) = gen_options(args)?;
    let out = out.context("gen needs an output file")?;
    let stats = gen_file(&out, &opt)?;
    eprintln!(
        "wrote {}: {} packets, {} bytes, {} flows (seed {})",
        out.display(),
        stats.packets,
        stats.bytes,
        stats.flows,
        opt.seed
    );
    Ok(())
}

pub(crate) fn gen_file(out: &Path, opt: &GenOptions) -> anyhow::Result<pcaptool_tests::tracegen::GenStats> {
    let f = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let (_, stats) = generate(BufWriter::with_capacity(1 << 20, f), opt)?;
    Ok(stats)
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent").to_path_buf()
}

/// Builds the release binary and returns its path.
/// Builds the release `pcaptool` (with the cargo features in `PCAPTOOL_FEATURES`, such as `xdp`).
pub(crate) fn build_pcaptool() -> anyhow::Result<PathBuf> {
    // A given binary (to compare two builds with the same harness) is used as it is.
    if let Some(bin) = std::env::var_os("PCAPTOOL_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let features = std::env::var("PCAPTOOL_FEATURES").unwrap_or_default();
    let mut args = vec!["build", "--release", "--quiet", "-p", "pcaptool"];
    if !features.is_empty() {
        args.extend(["--features", features.as_str()]);
    }
    let status = Command::new(env!("CARGO")).args(&args).current_dir(root()).status()?;
    if !status.success() {
        bail!("cargo build --release -p pcaptool failed");
    }
    // Where cargo put it: CARGO_TARGET_DIR (relative to the root, where that build ran) or target/.
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |d| root().join(d));
    Ok(target.join("release/pcaptool"))
}

fn faults_cmd(args: &[String]) -> anyhow::Result<()> {
    let mut cfg = pcaptool_tests::faults::FaultConfig {
        pcaptool: build_pcaptool()?,
        work: root().join("target/faults"),
        tries: 200,
        seed: 29,
        packets: 30_000,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--tries" => cfg.tries = v.parse()?,
            "--packets" => cfg.packets = v.parse()?,
            "--seed" => cfg.seed = v.parse()?,
            _ => bail!("unknown argument {a:?}"),
        }
    }
    let started = std::time::Instant::now();
    let tallies = pcaptool_tests::faults::run(&cfg).map_err(|e| anyhow::anyhow!(e))?;
    println!("{}", pcaptool_tests::faults::table(&tallies));
    for t in &tallies {
        for d in &t.defects {
            println!("defect ({}): {d}", t.kind);
        }
    }
    println!(
        "{} tries of each kind, {} packets, seed {}, in {:.0} s",
        cfg.tries,
        cfg.packets,
        cfg.seed,
        started.elapsed().as_secs_f64()
    );
    if tallies.iter().any(|t| t.silent_wrong + t.crashes > 0) {
        bail!("silent wrong answers or crashes");
    }
    Ok(())
}

fn demo() -> anyhow::Result<()> {
    let dir = root().join("example");
    std::fs::create_dir_all(&dir)?;
    let trace = dir.join("example.pcap");
    let opt = GenOptions { packets: 20_000, ..GenOptions::default() };
    let stats = gen_file(&trace, &opt)?;
    eprintln!("generated {} ({} packets, {} flows)", trace.display(), stats.packets, stats.flows);
    let bin = build_pcaptool()?;
    let ng = dir.join("example.pcapng.zst");
    run(Command::new(&bin).arg("convert").arg(&trace).arg(&ng))?;
    eprintln!("converted it to {} (pcapng, zstd); `pcaptool info` on it:\n", ng.display());
    run(Command::new(&bin).arg("info").arg(&ng))?;
    let web = dir.join("web.pcapng");
    let filter = "tcp dst port 80 or 443 and tcp[tcpflags] & tcp-syn != 0";
    eprintln!(
        "\nthe connection attempts to web servers (`pcaptool query ... '{filter}' -w {}`), counted:",
        web.display()
    );
    run(Command::new(&bin).arg("query").arg(&ng).arg(filter).arg("-w").arg(&web).arg("--count"))?;
    eprintln!("\nhow that filter is evaluated (`--explain`):");
    run(Command::new(&bin).arg("query").arg(&ng).arg(filter).arg("--explain"))?;
    eprintln!("\nindexing {} (`pcaptool index`), then one host's packets read through the index:", trace.display());
    run(Command::new(&bin).arg("index").arg(&trace))?;
    let host = dir.join("host.pcap");
    run(Command::new(&bin).arg("query").arg(&trace).arg("host 10.0.3.130").arg("-w").arg(&host).arg("--count"))?;
    run(Command::new(&bin).arg("query").arg(&trace).arg("host 10.0.3.130").arg("--explain"))?;
    let store = dir.join("store");
    let _ = std::fs::remove_dir_all(&store);
    eprintln!(
        "\nimporting {} into a flow store (`pcaptool import`), then the same host's packets and flows from it:",
        trace.display()
    );
    run(Command::new(&bin).arg("import").arg(&trace).arg("--store").arg(&store).args(["--segment-size", "1M"]))?;
    run(Command::new(&bin).arg("query").arg(&store).arg("host 10.0.3.130").arg("-w").arg(&host).arg("--count"))?;
    run(Command::new(&bin).arg("query").arg(&store).arg("host 10.0.3.130").arg("--explain"))?;
    run(Command::new(&bin).arg("flows").arg(&store).arg("host 10.0.3.130"))?;
    run(Command::new(&bin).arg("info").arg(&store))?;
    Ok(())
}

/// Seeds for the filter targets: every filter of tests/filters.txt, and for `filter_eval` the filter with
/// packets of testdata/tunnels.pcap (selector byte 0 = Ethernet, then a wire-length extra, the filter, NUL, the packet).
fn filter_seeds(dir: &Path) -> anyhow::Result<usize> {
    let table = std::fs::read_to_string(root().join("tests/filters.txt"))?;
    let filters: Vec<&str> = table.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let pcap = std::fs::read(root().join("testdata/tunnels.pcap"))?;
    let packets: Vec<Vec<u8>> =
        pcaptool_packet::Records::new(&pcap).filter_map(Result::ok).map(|r| r.data.to_vec()).collect();
    for t in ["filter_parse", "filter_eval", "serve_request"] {
        std::fs::create_dir_all(dir.join(t))?;
    }
    for (i, f) in filters.iter().enumerate() {
        std::fs::write(dir.join("filter_parse").join(format!("f{i}")), f)?;
        // Query bodies of the service: the filter, with a time window, a limit or a format in turn.
        let extra = match i % 4 {
            0 => serde_json::json!({ "filter": f }),
            1 => serde_json::json!({ "filter": f, "after": "2024-01-01T00:00:00Z", "before": 1_800_000_000 }),
            2 => serde_json::json!({ "filter": f, "limit": 10, "max_bytes": 4096, "source": "a.pcap" }),
            _ => serde_json::json!({ "filter": f, "format": "pcapng", "flow": 7 }),
        };
        std::fs::write(dir.join("serve_request").join(format!("f{i}")), extra.to_string())?;
        // And as the query string of `GET /v1/flows`.
        let qs = format!("source=st&filter={}", f.replace('%', "%25").replace('&', "%26").replace(' ', "+"));
        std::fs::write(dir.join("serve_request").join(format!("q{i}")), qs)?;
        let mut seed = vec![0u8, 4];
        seed.extend_from_slice(f.as_bytes());
        seed.push(0);
        if !packets.is_empty() {
            seed.extend_from_slice(&packets[i % packets.len()]);
        }
        std::fs::write(dir.join("filter_eval").join(format!("f{i}")), seed)?;
    }
    Ok(filters.len())
}

/// Writes seeds for each fuzz target in the shape that target expects (see fuzz/fuzz_targets/).
fn fuzz_seeds(dir: PathBuf) -> anyhow::Result<()> {
    use pcaptool_packet::{FileFormat, Records};
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(root().join("testdata"))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let corpus = root().join("../shared/corpus");
    if let Ok(cat) = std::fs::read_to_string(corpus.join("CATALOGUE.tsv")) {
        for line in cat.lines().skip(1) {
            let mut f = line.split('\t');
            let (Some(path), Some(bytes)) = (f.next(), f.next()) else { continue };
            if bytes.parse::<u64>().is_ok_and(|b| b <= 4096) {
                files.push(corpus.join(path));
            }
        }
    } else {
        eprintln!("note: ../shared/corpus is absent; seeds come from testdata/ only");
    }
    for t in ["pcap_reader", "pcapng_reader", "stream_reader", "decode"] {
        std::fs::create_dir_all(dir.join(t))?;
    }
    let mut n = [0usize; 4];
    for (i, path) in files.iter().enumerate() {
        let Ok(data) = std::fs::read(path) else { continue };
        std::fs::write(dir.join("stream_reader").join(format!("s{i}")), &data)?;
        n[2] += 1;
        let mut recs = Records::new(&data);
        let first = recs.next();
        match recs.format() {
            Some(FileFormat::Pcap { big_endian, precision, modified, .. }) if data.len() >= 24 => {
                let sel = match (precision, modified) {
                    (_, true) => 2u8,
                    (pcaptool_packet::TsPrecision::Nano, _) => 1,
                    _ => 0,
                } | if big_endian { 0x80 } else { 0 };
                let mut seed = vec![sel];
                seed.extend_from_slice(&data[24..]);
                std::fs::write(dir.join("pcap_reader").join(format!("s{i}")), seed)?;
                n[0] += 1;
            }
            Some(FileFormat::PcapNg { big_endian }) if data.len() >= 28 => {
                let shb = if big_endian {
                    u32::from_be_bytes(data[4..8].try_into()?)
                } else {
                    u32::from_le_bytes(data[4..8].try_into()?)
                } as usize;
                let mut seed = vec![u8::from(big_endian)];
                seed.extend_from_slice(&data[shb.min(data.len())..]);
                std::fs::write(dir.join("pcapng_reader").join(format!("s{i}")), seed)?;
                n[1] += 1;
            }
            _ => {}
        }
        for (j, rec) in first.into_iter().chain(recs).take(4).enumerate() {
            let Ok(rec) = rec else { break };
            // The decode target reads its link type as an index into the harness's list.
            let linktypes = pcaptool_packet::fuzz_harness::LINKTYPES;
            let Some(k) = linktypes.iter().position(|&l| l == rec.linktype.base().0) else { break };
            let mut seed = (k as u16).to_le_bytes().to_vec();
            seed.extend_from_slice(rec.data);
            std::fs::write(dir.join("decode").join(format!("s{i}-{j}")), seed)?;
            n[3] += 1;
        }
    }
    let filters = filter_seeds(&dir)?;
    eprintln!("fuzz seeds in {}: filter_parse, filter_eval and serve_request {filters}", dir.display());
    // Addresses and files of sensors, as docs/service.md shows them.
    let sensors = dir.join("remote_sensors");
    std::fs::create_dir_all(&sensors)?;
    for (i, seed) in [
        "https://sensor1:8443",
        "http://[::1]:8740/?source=store",
        "# sensors\neast https://10.0.0.1:8443 token-file=east.token ca=ca.pem\nwest http://127.0.0.1/?source=st cert=c.pem key=k.pem\n",
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(sensors.join(format!("s{i}")), seed)?;
    }
    // An export's manifest: empty, and one of two segments (one of them in two hours' files).
    let manifest = dir.join("export_manifest");
    std::fs::create_dir_all(&manifest)?;
    let segment = |n: u32, files: &[&str]| pcaptool_export::ExportedSegment {
        sensor: "east-1".into(),
        store: "st".into(),
        segment: n,
        flows: Some(pcaptool_export::Written {
            rows: 1000 + u64::from(n),
            files: files.iter().map(|f| f.to_string()).collect(),
            bytes: 40_000,
        }),
        packets: (n == 1).then(|| pcaptool_export::Written {
            rows: 9000,
            files: vec!["packets/sensor=east-1/date=2026-01-01/hour=00/part-st-000001.parquet".into()],
            bytes: 90_000,
        }),
    };
    let seeds = [
        pcaptool_export::Manifest::default(),
        pcaptool_export::Manifest::from_segments(vec![
            segment(0, &["flows/sensor=east-1/date=2026-01-01/hour=00/part-st-000000.parquet"]),
            segment(
                1,
                &[
                    "flows/sensor=east-1/date=2026-01-01/hour=00/part-st-000001.parquet",
                    "flows/sensor=east-1/date=2026-01-01/hour=01/part-st-000001.parquet",
                ],
            ),
        ]),
    ];
    for (i, m) in seeds.iter().enumerate() {
        std::fs::write(manifest.join(format!("s{i}")), m.to_bytes())?;
    }
    // The index target edits a valid index it builds itself: its seeds are a few edit lists.
    let index = dir.join("index_from_bytes");
    std::fs::create_dir_all(&index)?;
    for (i, seed) in
        [&[][..], &[0x40, 0, 0, 0, 0xff], &[0x00, 0x02, 0, 0, 0x01, 0x10, 0x03, 0, 0, 0x80]].iter().enumerate()
    {
        std::fs::write(index.join(format!("s{i}")), seed)?;
    }
    // So does the segment target.
    let segment = dir.join("segment_from_bytes");
    std::fs::create_dir_all(&segment)?;
    for (i, seed) in
        [&[][..], &[0x30, 0, 0, 0, 0x01], &[0x10, 0x01, 0, 0, 0x04, 0x60, 0, 0, 0, 0x80]].iter().enumerate()
    {
        std::fs::write(segment.join(format!("s{i}")), seed)?;
    }
    // The store target damages a whole segment: a mode byte, then edits (and a cut length).
    let store = dir.join("store_from_bytes");
    std::fs::create_dir_all(&store)?;
    for (i, seed) in [&[0u8][..], &[0, 0x40, 0, 0, 0, 0x01], &[1, 0x30, 0, 0, 0, 0x80], &[6, 0x00, 0x10, 0, 0, 0x02]]
        .iter()
        .enumerate()
    {
        std::fs::write(store.join(format!("s{i}")), seed)?;
    }
    // The compressed block reader: a mode byte (codec, resealed checksums, a cut), then edits of the data file.
    let blocks = dir.join("block_reader");
    std::fs::create_dir_all(&blocks)?;
    for (i, seed) in [
        &[0u8][..],
        &[1],
        &[2, 0x40, 0, 0, 0, 0x01],
        &[3, 0x00, 0x02, 0, 0, 0x80],
        &[5, 0x00, 0x10, 0, 0],
        &[8],
        &[11, 0, 3, 0, 0, 0x40],
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(blocks.join(format!("s{i}")), seed)?;
    }
    // Capture ring blocks as the kernel lays them out.
    let ring = dir.join("ring_block");
    std::fs::create_dir_all(&ring)?;
    let frame: Vec<u8> = (0..60).collect();
    for (i, pkts) in [
        vec![(&frame[..], 60u32, None)],
        vec![(&frame[..14], 60, Some(0x0064)), (&frame[..], 1514, None), (&frame[..3], 3, Some(7))],
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(ring.join(format!("s{i}")), pcaptool_capture::fuzz_harness::block(pkts))?;
    }
    eprintln!(
        "fuzz seeds in {}: pcap_reader {}, pcapng_reader {}, stream_reader {}, decode {}, wavelet {}",
        dir.display(),
        n[0],
        n[1],
        n[2],
        n[3],
        wavelet_seeds(&dir)?
    );
    Ok(())
}

/// Seeds for the wavelet targets: bodies of small valid structures (behind the selector byte of
/// `fuzz_harness::from_bytes`) and short symbol strings.
fn wavelet_seeds(dir: &Path) -> anyhow::Result<usize> {
    use pcaptool_wavelet::fuzz_harness::body_of;
    use pcaptool_wavelet::{Encode, HuffmanWaveletTree, RrrBitVector, RsBitVector, WaveletMatrix};
    for t in ["wavelet_from_bytes", "wavelet_ops"] {
        std::fs::create_dir_all(dir.join(t))?;
    }
    let seqs: Vec<Vec<u32>> = vec![
        vec![],
        vec![7],
        vec![1, 2, 1, 3, 1, 2, 1, 4, 1, 1],
        (0..300).map(|i| (i * i % 17) as u32).collect(),
        (0..200).map(|i| if i % 9 == 0 { 80 } else { 443 }).collect(),
    ];
    let mut n = 0;
    for (i, s) in seqs.iter().enumerate() {
        let bits = s.iter().map(|x| x % 3 == 1);
        let files: [(u8, Vec<u8>); 5] = [
            (0, RsBitVector::from_bits(bits.clone()).to_bytes()),
            (1, RrrBitVector::from_bits(bits).to_bytes()),
            (2, HuffmanWaveletTree::<RsBitVector>::from_symbols(s.iter().copied()).to_bytes()),
            (3, HuffmanWaveletTree::<RrrBitVector>::from_symbols(s.iter().copied()).to_bytes()),
            (4, WaveletMatrix::<RsBitVector>::from_symbols(s.iter().copied()).to_bytes()),
        ];
        for (sel, f) in files {
            let mut seed = vec![sel];
            seed.extend_from_slice(body_of(&f));
            std::fs::write(dir.join("wavelet_from_bytes").join(format!("s{i}-{sel}")), seed)?;
            n += 1;
        }
        let mut ops = vec![(s.len() % 200 + 2) as u8];
        ops.extend(s.iter().map(|&x| x as u8));
        std::fs::write(dir.join("wavelet_ops").join(format!("s{i}")), ops)?;
        n += 1;
    }
    Ok(n)
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
