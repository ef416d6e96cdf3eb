//! `cargo xtask bench --only capture`: live capture side by side with tcpdump on a veth pair between two
//! namespaces (pcaptool_tests::netns), and the writing and indexing pipeline fed from memory.
//!
//! - The pipeline from memory: 64-byte frames of many flows pushed into the flow store (`Store::ingest`: flow
//!   tracking, flow-clustered segments, their indexes, fsync at each close), and for comparison only dumped to a
//!   pcap file; CPU time per packet, in cycles at the nominal clock (this machine has no cycle counter), against
//!   n2disk's 149 cycles per packet to dump and 264 to dump and index, and 10GbE line rate (14.88 Mpps); once
//!   with one segment per pass, once closing a segment every 500,000 packets (as a capture at 100,000
//!   packets/s does every 5 s). Beside each, the same frames through a bare model of the store's layout with
//!   no index (crate::floor): the floor of the design on this machine.
//! - Zero drops at the generator's highest rate: tcpreplay --topspeed of 64-byte and 512-byte frames into the
//!   veth pair, `pcaptool capture` (AF_PACKET, indexing on) and `tcpdump -w` on the other end.
//! - Whole-machine CPU time per captured packet at a fixed rate, from /proc/stat (most of the work is the
//!   kernel's): pcaptool capture and tcpdump -w, each minus the replay alone, and each capturer's own CPU time
//!   (its threads' schedstat); the two in turn for three rounds, with the least and the median of each.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use pcaptool_flowstore::{Codec, ImportOptions, Incoming, Ingest, Store, StoreMeta};
use pcaptool_packet::{LinkType, PcapWriter, TsPrecision};
use pcaptool_tests::netns::{Pair, udp_frames};

use crate::{build_pcaptool, root};

/// CPU seconds (user + system) this process has used, its ended threads' included (a store's data-file writer
/// and compressing threads end before a pass is read): `CLOCK_PROCESS_CPUTIME_ID`, in nanoseconds
/// (`/proc/self/stat` counts in ticks of 10 ms, 3% of a pass here).
pub(crate) fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// CPU seconds the live threads of process `pid` have used, from each one's /proc schedstat (nanoseconds on the
/// CPU): another process's clock, read while its threads run.
fn threads_cpu_seconds(pid: &str) -> f64 {
    let ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// Busy and total jiffies of the whole machine, from /proc/stat.
fn machine_jiffies() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> =
        s.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// CPU and wall seconds since `c0` (from [`cpu_seconds`]) and `t0`.
pub(crate) fn since(c0: f64, t0: Instant) -> (f64, f64) {
    (cpu_seconds() - c0, t0.elapsed().as_secs_f64())
}

fn mhz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("cpu MHz")).and_then(|l| l.split(':').nth(1)?.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

fn write_frames(path: &Path, frames: &[Vec<u8>]) -> anyhow::Result<()> {
    let mut w = PcapWriter::new(std::fs::File::create(path)?, LinkType::ETHERNET, 65535, TsPrecision::Micro)?;
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(1_700_000_000_000_000_000 + i as u64 * 1000, f.len() as u32, f)?;
    }
    w.finish()?.flush()?;
    Ok(())
}

pub(crate) fn pipeline_from_memory(dir: &Path) -> anyhow::Result<()> {
    let n = 4_000_000usize;
    let frames = Frames::generated(n, 20_000);
    let mhz = mhz();
    println!(
        "pipeline fed from memory: {n} frames of 64 bytes (60 without FCS), 20,000 flows; cycles = CPU time × {mhz:.0} MHz"
    );
    println!();
    println!("| pipeline | packets/s | CPU cycles per packet | vs n2disk | vs 14.88 Mpps |");
    println!("|---|---|---|---|---|");
    // One row: rate and CPU cycles per packet from a pass's CPU and wall seconds, against n2disk's figure and
    // 10GbE line rate.
    let row = |what: &str, (cpu, wall): (f64, f64), n2disk: f64| {
        let cyc = cpu * mhz * 1e6 / n as f64;
        println!(
            "| {what} | {:.2} M | {cyc:.0} | {:.2}× n2disk's {n2disk} | {:.2}× |",
            n as f64 / wall / 1e6,
            cyc / n2disk,
            n as f64 / wall / 14.88e6
        );
    };
    // Dump only: a pcap file (what tcpdump -w does with a packet after the kernel).
    let dump = dir.join("dump.pcap");
    let (c0, t0) = (cpu_seconds(), Instant::now());
    {
        let mut w = PcapWriter::new(std::fs::File::create(&dump)?, LinkType::ETHERNET, 262_144, TsPrecision::Nano)?;
        for (i, f) in frames.data.iter().enumerate() {
            w.write_packet(1_700_000_000_000_000_000 + frames.ts[i], frames.wirelen[i], f)?;
        }
        w.finish()?.sync_all()?;
    }
    row("dump to a pcap file (no index)", since(c0, t0), 149.0);
    let _ = std::fs::remove_file(&dump);
    // Dump and index: the flow store, one segment per pass (4M packets, 200 of each flow), and then a segment
    // closed every 500,000 packets, as a capture at 100,000 packets/s closes one every 5 s (25 packets of each
    // flow: the work a close does per flow weighs eight times as much per packet).
    // PCAPTOOL_PIPELINE_EVERY=N runs only the row closing a segment every N packets (for profiling one of them).
    let store_dir = dir.join("mem-store");
    let only = std::env::var("PCAPTOOL_PIPELINE_EVERY").ok().and_then(|v| v.parse::<usize>().ok());
    let rows = [("one segment per pass", n), ("a segment every 500,000 packets", 500_000)];
    for (what, every) in rows.into_iter().filter(|r| only.is_none_or(|o| o == r.1)) {
        let passes = store_passes(&store_dir, &frames, every)?;
        row(&format!("dump and index into the flow store, {what} (first pass: buffers allocated)"), passes[0], 264.0);
        let mut reused = passes[1..].to_vec();
        reused.sort_by(|a, b| a.0.total_cmp(&b.0));
        let k = reused.len();
        row(&format!("dump and index into the flow store, {what} (buffers reused: best of {k})"), reused[0], 264.0);
        row(
            &format!("dump and index into the flow store, {what} (buffers reused: median of {k})"),
            reused[k / 2],
            264.0,
        );
        // The design's floor beside it: the same layout with no index at all (crate::floor), so against
        // n2disk's figure to dump only.
        let mut floor = crate::floor::passes(&store_dir, &frames.data, every, REUSED as usize)?[1..].to_vec();
        let _ = std::fs::remove_dir_all(&store_dir);
        floor.sort_by(|a, b| a.0.total_cmp(&b.0));
        let k = floor.len();
        row(&format!("floor model: the same layout, no index, {what} (best of {k})"), floor[0], 149.0);
        row(&format!("floor model: the same layout, no index, {what} (median of {k})"), floor[k / 2], 149.0);
    }
    println!();
    Ok(())
}

/// Passes over reused buffers after the first, in each row of the pipeline from memory.
const REUSED: u64 = 5;

/// Passes over the frames into each kind of store in [`compressed_pipeline`], after a first that allocates.
const COMPRESSED_PASSES: usize = 9;

/// Packets handed to a capture's store, kept in memory: each packet's bytes, its time from the first packet's
/// and its length on the wire; `span` is the last packet's time.
pub(crate) struct Frames {
    data: Vec<Vec<u8>>,
    ts: Vec<u64>,
    wirelen: Vec<u32>,
    span: u64,
}

impl Frames {
    /// 64-byte frames of `flows` UDP flows (60 bytes without the FCS), 67 ns apart: line rate at 10 Gb/s.
    fn generated(n: usize, flows: usize) -> Frames {
        let data = udp_frames(n, 60, flows);
        let ts: Vec<u64> = (0..n as u64).map(|i| i * 67).collect();
        Frames { wirelen: vec![64; n], span: ts.last().copied().unwrap_or(0), ts, data }
    }

    /// The first `n` packets of the pcap file `path` (one link type: the real-traffic bench trace's Ethernet),
    /// at their own times.
    fn from_trace(path: &Path, n: usize) -> anyhow::Result<Frames> {
        let reader = pcaptool_packet::TraceReader::open(path)?;
        let bytes = reader.as_bytes().with_context(|| format!("{} is not memory-mapped", path.display()))?;
        let mut f =
            Frames { data: Vec::with_capacity(n), ts: Vec::with_capacity(n), wirelen: Vec::with_capacity(n), span: 0 };
        let mut first = None;
        for rec in pcaptool_packet::Records::new(bytes).take(n) {
            let rec = rec?;
            if rec.linktype != LinkType::ETHERNET {
                bail!("{}: a packet of link type {:?}, not Ethernet", path.display(), rec.linktype);
            }
            let t0 = *first.get_or_insert(rec.ts_ns);
            // (The trace is in time order; a packet out of it is taken at the time before it.)
            let t = rec.ts_ns.saturating_sub(t0).max(f.span);
            f.span = t;
            f.ts.push(t);
            f.wirelen.push(rec.wirelen);
            f.data.push(rec.data.to_vec());
        }
        Ok(f)
    }

    fn len(&self) -> usize {
        self.data.len()
    }
}

/// The capture pipeline fed from memory into a plain store, an LZ4 store and a Zstandard store, a segment every
/// 500,000 packets: the rate with each codec against the rate without (goal for LZ4, on real traffic: at least
/// 90%), on the generated 64-byte frames and, when `real` names the real-traffic bench trace, on its first
/// 2,000,000 packets at their own times. The stores' passes take turns (plain, LZ4, Zstandard, plain, ...), so
/// that the machine's noise, which moves a pass by a tenth and drifts over seconds, falls on all three alike;
/// each pass ends when its last segment is written. Two rates, each the median pass's: the pipeline's sustained
/// rate, from the first segment's hand-over to its close to the last's (every segment filled meanwhile while the
/// one before it was written, and waiting for that close if it caught up with it, as a capture's does), and the
/// rate of the whole pass, to its last segment written (which adds a first filling no close overlaps, and a last
/// close that no filling does: a capture waits for that one only when it stops, and it is heavier with
/// compression: an eighth of a pass here).
pub(crate) fn compressed_pipeline(dir: &Path, real: Option<&Path>) -> anyhow::Result<()> {
    let every = SEGMENT_EVERY;
    let generated = Frames::generated(4_000_000, 20_000);
    pipeline_rows(dir, "4M 64-byte frames, 20,000 flows", &generated, every)?;
    drop(generated);
    if let Some(path) = real {
        let (frames, what) = real_frames(path)?;
        pipeline_rows(dir, &what, &frames, every)?;
        continuous_rows(dir, &what, &frames, every)?;
    }
    Ok(())
}

/// The long capture of [`compressed_pipeline`] alone (`--only compress-long`): the LZ4 goal's measure.
pub(crate) fn long_capture(dir: &Path, real: &Path) -> anyhow::Result<()> {
    let (frames, what) = real_frames(real)?;
    continuous_rows(dir, &what, &frames, SEGMENT_EVERY)
}

/// The compressed pipelines' real frames: the first 2,000,000 packets of the real-traffic trace, and what they are.
fn real_frames(path: &Path) -> anyhow::Result<(Frames, String)> {
    let frames = Frames::from_trace(path, 2_000_000)?;
    let what = format!("the first {} packets of {}, at their own times", frames.len(), path.display());
    Ok((frames, what))
}

/// Packets a segment of the compressed pipelines holds.
const SEGMENT_EVERY: usize = 500_000;

/// [`compressed_pipeline`]'s table for one set of frames.
fn pipeline_rows(dir: &Path, what: &str, frames: &Frames, every: usize) -> anyhow::Result<()> {
    let n = frames.len();
    let codecs = [Codec::None, Codec::Lz4, Codec::Zstd { level: 3 }];
    println!(
        "capture pipeline fed from memory: {what}; a segment every {every} packets; {COMPRESSED_PASSES} passes into \
         each store, taking turns"
    );
    println!();
    let mut stores = Vec::new();
    for (i, _) in codecs.iter().enumerate() {
        let d = dir.join(format!("mem-store-{i}"));
        let _ = std::fs::remove_dir_all(&d);
        stores.push((Store::create(&d)?, d));
    }
    // Per store and pass: (wall seconds to the last segment written, CPU seconds, wall seconds from the first
    // segment's hand-over to the last's).
    let mut walls: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); codecs.len()];
    {
        let mut ingests = Vec::new();
        for ((store, _), codec) in stores.iter_mut().zip(codecs) {
            ingests.push(store.ingest(&ImportOptions { compress: codec, ..ImportOptions::default() })?);
        }
        for pass in 0..=COMPRESSED_PASSES {
            for (k, ingest) in ingests.iter_mut().enumerate() {
                let (c0, t0) = (cpu_seconds(), Instant::now());
                let first = push_pass(ingest, frames, every, pass as u64)?;
                let pushed = first.elapsed().as_secs_f64();
                ingest.flush()?;
                if pass > 0 {
                    walls[k].push((t0.elapsed().as_secs_f64(), cpu_seconds() - c0, pushed));
                }
            }
        }
        for ingest in ingests {
            ingest.finish()?;
        }
    }
    for (_, d) in &stores {
        let _ = std::fs::remove_dir_all(d);
    }
    println!(
        "| store | sustained: packets/s from the first segment's hand-over to the last's (median pass) | vs plain \
         | whole pass, to the last segment written: packets/s (median pass) | vs plain | processors busy | goal |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut plain, mut plain_pushed) = (0.0, 0.0);
    for (codec, mut w) in codecs.into_iter().zip(walls) {
        w.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (wall, cpu, _) = w[w.len() / 2];
        w.sort_by(|a, b| a.2.total_cmp(&b.2));
        let pushed = w[w.len() / 2].2;
        let (rate, rate_pushed) = (n as f64 / wall, n.saturating_sub(every) as f64 / pushed);
        if codec == Codec::None {
            (plain, plain_pushed) = (rate, rate_pushed);
        }
        let goal = if codec == Codec::Lz4 { "≥ 90%" } else { "" };
        println!(
            "| {codec} | {:.2} M | {:.0}% | {:.2} M | {:.0}% | {:.2} | {goal} |",
            rate_pushed / 1e6,
            100.0 * rate_pushed / plain_pushed,
            rate / 1e6,
            100.0 * rate / plain,
            cpu / wall
        );
    }
    println!();
    Ok(())
}

/// Rounds of [`continuous_rows`]: each a plain and an LZ4 capture, one after the other.
const CONTINUOUS_ROUNDS: usize = 7;
/// Passes over the frames in each capture of [`continuous_rows`], after a first that allocates.
const CONTINUOUS_PASSES: u64 = 5;

/// A long capture's rate, plain and with LZ4: the frames pushed [`CONTINUOUS_PASSES`] times into one store,
/// segments closing behind the ingest, and waited for only at the end (as a capture that goes on, where
/// [`pipeline_rows`] waits for every pass's last segment); each round's LZ4 rate against the plain rate of the same
/// round, so that the machine's drift between rounds cancels.
fn continuous_rows(dir: &Path, what: &str, frames: &Frames, every: usize) -> anyhow::Result<()> {
    let n = frames.len() as f64 * CONTINUOUS_PASSES as f64;
    println!(
        "a long capture fed from memory: {what}, {CONTINUOUS_PASSES} times over ({} packets, a segment every \
         {every}); {CONTINUOUS_ROUNDS} rounds, each a plain and an LZ4 store",
        n as u64
    );
    println!();
    let codecs = [Codec::None, Codec::Lz4];
    // Per round: (rate, processors busy) of each codec.
    let mut rounds: Vec<[(f64, f64); 2]> = Vec::new();
    for _ in 0..CONTINUOUS_ROUNDS {
        let mut round = [(0.0, 0.0); 2];
        for (k, codec) in codecs.into_iter().enumerate() {
            let d = dir.join("mem-store-long");
            let _ = std::fs::remove_dir_all(&d);
            let mut store = Store::create(&d)?;
            {
                let mut ingest = store.ingest(&ImportOptions { compress: codec, ..ImportOptions::default() })?;
                // (The first pass allocates the writers' buffers and is not counted.)
                push_pass(&mut ingest, frames, every, 0)?;
                ingest.flush()?;
                let (c0, t0) = (cpu_seconds(), Instant::now());
                for pass in 1..=CONTINUOUS_PASSES {
                    push_pass(&mut ingest, frames, every, pass)?;
                }
                ingest.flush()?;
                let wall = t0.elapsed().as_secs_f64();
                round[k] = (n / wall, (cpu_seconds() - c0) / wall);
                ingest.finish()?;
            }
            let _ = std::fs::remove_dir_all(&d);
        }
        rounds.push(round);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut ratios: Vec<f64> = rounds.iter().map(|r| r[1].0 / r[0].0).collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "| store | packets/s, to the last segment written (median round) | processors busy | vs plain: median of the rounds' (range) | goal |"
    );
    println!("|---|---|---|---|---|");
    for (k, codec) in codecs.into_iter().enumerate() {
        let (rate, busy) =
            (median(rounds.iter().map(|r| r[k].0).collect()), median(rounds.iter().map(|r| r[k].1).collect()));
        let (vs, goal) = match codec {
            Codec::None => ("100%".to_string(), ""),
            _ => {
                let (lo, mid, hi) = (ratios[0], ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
                (format!("{:.0}% ({:.0}-{:.0}%)", 100.0 * mid, 100.0 * lo, 100.0 * hi), "≥ 90%")
            }
        };
        println!("| {codec} | {:.2} M | {busy:.2} | {vs} | {goal} |", rate / 1e6);
    }
    println!();
    Ok(())
}

/// Pushes `frames` once into `ingest` as a capture hands them over, pass `pass` of several (timestamps going on),
/// closing a segment every `every` packets (not waiting for the last to be written); returns when the first
/// segment was handed to its close.
fn push_pass(ingest: &mut Ingest<'_>, frames: &Frames, every: usize, pass: u64) -> anyhow::Result<Instant> {
    let mut handed = None;
    let meta = StoreMeta {
        linktype: LinkType::ETHERNET,
        snaplen: 262_144,
        precision: TsPrecision::Nano,
        swapped: false,
        iface: 0,
    };
    // Each pass after the one before it, a millisecond later.
    let base = 1_700_000_000_000_000_000 + pass * (frames.span + 1_000_000);
    let every = every.max(1);
    for (j, part) in frames.data.chunks(every).enumerate() {
        let first = j * every;
        // As a capture's writer hands over its batches.
        ingest.push_all(part.iter().enumerate().map(|(i, f)| Incoming {
            meta,
            iface_name: "mem",
            ts_ns: base + frames.ts[first + i],
            wirelen: frames.wirelen[first + i],
            data: f,
        }))?;
        // As a capture's flush: the segment is written while the next fills.
        ingest.close_open()?;
        handed.get_or_insert_with(Instant::now);
    }
    Ok(handed.unwrap_or_else(Instant::now))
}

/// Pushes `frames` into a new store in `dir` (removed afterwards) again and again, timestamps going on, closing
/// the segments every `every` packets; returns each pass's CPU and wall seconds. The first pass also allocates
/// and faults in the writer's buffers, the later ones reuse them, as a capture does after its first segment;
/// this machine's noise moves one pass by a tenth, so there are several.
fn store_passes(dir: &Path, frames: &Frames, every: usize) -> anyhow::Result<Vec<(f64, f64)>> {
    let _ = std::fs::remove_dir_all(dir);
    let mut store = Store::create(dir)?;
    let mut passes = Vec::new();
    {
        let mut ingest = store.ingest(&ImportOptions::default())?;
        for pass in 0..=REUSED {
            let (c0, t0) = (cpu_seconds(), Instant::now());
            push_pass(&mut ingest, frames, every, pass)?;
            passes.push(since(c0, t0));
        }
        ingest.finish()?;
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(passes)
}

/// Starts `cmd` and waits until a line of its standard error contains `ready` (at most 30 s).
fn start(mut cmd: Command, ready: Option<&str>) -> anyhow::Result<Child> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.map(str::to_string);
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && ready.as_deref().is_none_or(|r| line.contains(r)) {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    let _ = rx.recv_timeout(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    Ok(child)
}

fn interrupt(child: &mut Child) -> anyhow::Result<String> {
    Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
    let t = Instant::now();
    while child.try_wait()?.is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            child.kill()?;
            bail!("the capture did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().context("stdout")?, &mut out)?;
    Ok(out)
}

/// Packets tcpreplay says it sent, and at what rate.
fn replay(pair: &Pair, trace: &Path, rate: Option<u32>) -> anyhow::Result<(u64, f64)> {
    let mut c = pair.exec(&pair.a);
    c.args(["tcpreplay", "-q", "-K", "-i", &pair.va]);
    match rate {
        Some(pps) => c.args(["--pps", &pps.to_string()]),
        None => c.arg("--topspeed"),
    };
    let o = c.arg(trace).output()?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        bail!("tcpreplay failed: {out}");
    }
    let num = |key: &str| -> Option<f64> {
        let l = out.lines().find(|l| l.contains(key))?;
        l.split(key).nth(1)?.split_whitespace().next()?.replace(',', "").parse().ok()
    };
    let sent = num("Successful packets:").unwrap_or(0.0) as u64;
    let pps = out
        .lines()
        .find(|l| l.contains("pps"))
        .and_then(|l| l.split(',').find(|p| p.contains("pps"))?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Ok((sent, pps))
}

/// The summary line `pcaptool capture --json` prints last, from its output.
fn summary(out: &str) -> Option<serde_json::Value> {
    out.lines().rev().find(|l| l.contains("\"summary\"")).and_then(|l| serde_json::from_str(l).ok())
}

/// Packets in a pcap file written by tcpdump (its records).
fn pcap_packets(path: &Path) -> u64 {
    pcaptool_packet::TraceReader::open(path)
        .map(|mut r| {
            let mut n = 0;
            while let Some(Ok(_)) = r.next_record() {
                n += 1;
            }
            n
        })
        .unwrap_or(0)
}

pub(crate) fn capture_section() -> anyhow::Result<()> {
    let dir = root().join("target/bench/capture");
    std::fs::create_dir_all(&dir)?;
    pipeline_from_memory(&dir)?;
    let pair = match Pair::new("bn") {
        Ok(p) => p,
        Err(why) => {
            println!("veth benchmarks skipped: {why}");
            return Ok(());
        }
    };
    let bin = build_pcaptool()?;
    let tcpdump = crate::bench::which("tcpdump").context("install tcpdump")?;
    crate::bench::which("tcpreplay").context("install tcpreplay (the capture benchmark's generator)")?;
    println!("zero drops at the generator's highest rate (tcpreplay --topspeed -K, one run each):");
    println!();
    println!("| frames | capturer | sent | rate (pps) | written | dropped (kernel + capturer) |");
    println!("|---|---|---|---|---|---|");
    // AF_XDP too when the binary has it (PCAPTOOL_FEATURES=xdp); on a 1500-byte MTU, where veth runs XDP in
    // driver mode.
    let xdp = std::env::var("PCAPTOOL_FEATURES").is_ok_and(|f| f.split([',', ' ']).any(|x| x == "xdp"));
    let mut backends = vec![("af_packet", "pcaptool capture (AF_PACKET)")];
    if xdp {
        backends.push(("af_xdp", "pcaptool capture (AF_XDP)"));
    }
    for (len, n) in [(60usize, 1_000_000usize), (508, 500_000)] {
        let trace = dir.join(format!("frames-{}.pcap", len + 4));
        write_frames(&trace, &udp_frames(n, len, 20_000))?;
        for (backend, label) in &backends {
            for (ns, dev) in [(&pair.a, &pair.va), (&pair.b, &pair.vb)] {
                let mtu = if *backend == "af_xdp" { "1500" } else { "9000" };
                Command::new("ip").args(["-n", ns, "link", "set", dev, "mtu", mtu]).status()?;
            }
            let store = dir.join("veth-store");
            let _ = std::fs::remove_dir_all(&store);
            let mut c = pair.exec(&pair.b);
            c.arg(&bin).args(["capture", "-i", &pair.vb, "--json", "--backend", backend, "--store"]).arg(&store);
            let mut child = start(c, Some("capturing on"))?;
            let (sent, pps) = replay(&pair, &trace, None)?;
            std::thread::sleep(Duration::from_secs(2));
            let out = interrupt(&mut child)?;
            let s = summary(&out).context("pcaptool's summary")?;
            let drops = s["kernel_drops"].as_u64().unwrap_or(0) + s["pcaptool_drops"].as_u64().unwrap_or(0);
            println!(
                "| {} B | {label} [{}] | {sent} | {pps:.0} | {} | {drops} |",
                len + 4,
                s["backend"].as_str().unwrap_or("?"),
                s["written"].as_u64().unwrap_or(0)
            );
            let _ = std::fs::remove_dir_all(&store);
        }
        for (ns, dev) in [(&pair.a, &pair.va), (&pair.b, &pair.vb)] {
            Command::new("ip").args(["-n", ns, "link", "set", dev, "mtu", "9000"]).status()?;
        }
        // tcpdump -w.
        let out_file = dir.join("tcpdump.pcap");
        let mut c = pair.exec(&pair.b);
        c.arg(&tcpdump).args(["-i", &pair.vb, "-n", "-s", "262144", "-w"]).arg(&out_file);
        let child = start(c, Some("listening on"))?;
        let (sent, pps) = replay(&pair, &trace, None)?;
        std::thread::sleep(Duration::from_secs(2));
        Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
        let o = child.wait_with_output()?;
        let err = String::from_utf8_lossy(&o.stderr);
        let dropped: u64 = err
            .lines()
            .find(|l| l.contains("dropped by kernel"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        println!("| {} B | tcpdump -w | {sent} | {pps:.0} | {} | {dropped} |", len + 4, pcap_packets(&out_file));
        let _ = std::fs::remove_file(&out_file);
    }
    println!();
    // CPU per packet at a fixed rate.
    let rate = 100_000u32;
    let n = 1_000_000usize;
    let trace = dir.join("frames-64-fixed.pcap");
    write_frames(&trace, &udp_frames(n, 60, 20_000))?;
    println!(
        "whole-machine CPU per packet at {rate} packets/s ({n} frames of 64 bytes; /proc/stat, both cores; the \
         capturer's own from its threads' schedstat):"
    );
    println!();
    println!(
        "| capturer | busy CPU per packet | minus the replay alone | the capturer's own CPU per packet | written |"
    );
    println!("|---|---|---|---|---|");
    // Whole-machine busy time per packet, and the capturer's own (the CPU time of its process's threads, in
    // nanoseconds from their schedstat: what it does beyond the kernel's delivery into its ring, which the
    // replay's side pays; its threads run from before the replay to after it).
    let measure = |child: Option<Child>| -> anyhow::Result<(f64, f64, Option<Child>)> {
        let pid = child.as_ref().map(|c| c.id().to_string());
        let own = || pid.as_deref().map_or(0.0, threads_cpu_seconds);
        let (b0, _) = machine_jiffies();
        let p0 = own();
        let (sent, _) = replay(&pair, &trace, Some(rate))?;
        let (b1, _) = machine_jiffies();
        let p1 = own();
        let sent = sent.max(1) as f64;
        Ok(((b1 - b0) as f64 * 10_000.0 / sent, (p1 - p0) * 1e6 / sent, child))
    };
    let (base, _, _) = measure(None)?;
    println!("| (the replay alone) | {base:.2} µs | | | |");
    // The two capturers in turn, several rounds: this VM's figure for one capturer moves by a third from run to
    // run (two modes, ~130 and ~180 ns for the same pcaptool binary), more than the difference measured.
    let mut own_of: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=CPU_ROUNDS {
        let store = dir.join("veth-store");
        let _ = std::fs::remove_dir_all(&store);
        let mut c = pair.exec(&pair.b);
        c.arg(&bin).args(["capture", "-i", &pair.vb, "--json", "--backend", "af_packet", "--store"]).arg(&store);
        let (us, own, child) = measure(Some(start(c, Some("capturing on"))?))?;
        let out = interrupt(&mut child.context("child")?)?;
        let written = summary(&out).and_then(|s| s["written"].as_u64()).unwrap_or(0);
        println!(
            "| pcaptool capture (AF_PACKET, indexing on), round {round} | {us:.2} µs | {:.2} µs | {:.3} µs | {written} |",
            us - base,
            own
        );
        own_of[0].push(own);
        let _ = std::fs::remove_dir_all(&store);
        let out_file = dir.join("tcpdump.pcap");
        let mut c = pair.exec(&pair.b);
        c.arg(&tcpdump).args(["-i", &pair.vb, "-n", "-s", "262144", "-w"]).arg(&out_file);
        let (us, own, child) = measure(Some(start(c, Some("listening on"))?))?;
        let mut child = child.context("child")?;
        Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
        child.wait()?;
        println!(
            "| tcpdump -w, round {round} | {us:.2} µs | {:.2} µs | {own:.3} µs | {} |",
            us - base,
            pcap_packets(&out_file)
        );
        own_of[1].push(own);
        let _ = std::fs::remove_file(&out_file);
    }
    let [p, t] = own_of.map(|mut v| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    });
    println!();
    println!(
        "the capturer's own CPU per packet over {CPU_ROUNDS} rounds, least / median: pcaptool {:.3} / {:.3} µs, \
         tcpdump -w {:.3} / {:.3} µs (pcaptool / tcpdump: {:.2} / {:.2})",
        p.0,
        p.1,
        t.0,
        t.1,
        p.0 / t.0,
        p.1 / t.1
    );
    println!();
    Ok(())
}

/// Rounds of the fixed-rate CPU measurement, each capturer once a round.
const CPU_ROUNDS: usize = 3;
