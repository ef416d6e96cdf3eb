//! `pcaptool query TRACE FILTER`: the packets of a trace that a tcpdump filter selects, written in the trace's own
//! format, counted, or explained. Without an index the trace is scanned: records are walked in order over a
//! memory map and the filter runs on batches of them in parallel; matches are written in their original order.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use pcaptool_packet::{FileFormat, Interface, LinkType, OutputFormat, Record, Records, TraceReader, precision_for};
use pcaptool_query::{Filter, Matcher, Target};
use rayon::prelude::*;

use crate::cmd::same_file;
use crate::progress;

/// Arguments of `pcaptool query`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The capture to search (pcap or pcapng, possibly compressed; `-` for standard input).
    trace: PathBuf,
    /// The filter, in tcpdump's language (several words are joined with spaces, as tcpdump does; put it after
    /// `--` if it starts with '-').
    #[arg(required = true, num_args = 1..)]
    filter: Vec<String>,
    /// Write the matching packets here, in the trace's format (`-` for standard output).
    #[arg(short = 'w', long = "write", value_name = "OUT")]
    write: Option<PathBuf>,
    /// Print the number of matching packets.
    #[arg(long)]
    count: bool,
    /// Stop after this many matching packets.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Show how the filter is evaluated (parsed form, plan, the tests per link type) without running it.
    #[arg(long)]
    explain: bool,
    /// Scan the trace even if an index exists.
    #[arg(long)]
    scan: bool,
    /// Print counts and explanations as JSON.
    #[arg(long)]
    json: bool,
    /// Threads for the scan (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// Matchers compiled on demand for the link types a trace holds.
pub(crate) struct Matchers<'f> {
    filter: &'f Filter,
    swapped: bool,
    pub(crate) compiled: Vec<(LinkType, Matcher)>,
}

impl Matchers<'_> {
    fn get(&mut self, lt: LinkType) -> anyhow::Result<&Matcher> {
        let lt = lt.base();
        if let Some(i) = self.compiled.iter().position(|(l, _)| *l == lt) {
            return Ok(&self.compiled[i].1);
        }
        let m = self
            .filter
            .compile(Target { linktype: lt, swapped: self.swapped })
            .map_err(|e| anyhow::anyhow!("invalid filter for link type {lt}: {e}"))?;
        self.compiled.push((lt, m));
        Ok(&self.compiled.last().expect("just pushed").1)
    }
}

fn swapped(reader: &TraceReader) -> bool {
    match reader.format() {
        Some(FileFormat::Pcap { big_endian, .. }) | Some(FileFormat::PcapNg { big_endian }) => {
            big_endian != cfg!(target_endian = "big")
        }
        _ => false,
    }
}

/// libpcap's `max_snaplen_for_dlt`.
fn max_snaplen(lt: LinkType) -> u32 {
    match lt.base().0 {
        231 => 128 * 1024 * 1024, // D-Bus
        279 => 8 * 1024 * 1024,   // EBHSCR
        249 => 1024 * 1024,       // USBPcap
        _ => pcaptool_packet::MAX_SNAPLEN,
    }
}

/// The most bytes of a packet tcpdump sees: libpcap cuts a record longer than the capture's snapshot length
/// (the pcap header's, or the first pcapng interface's) to that length, so filters and output do too.
fn snapshot(reader: &TraceReader) -> usize {
    let Some(first) = reader.interfaces().first() else { return usize::MAX };
    let max = max_snaplen(first.linktype);
    let snap = if first.snaplen == 0 || first.snaplen > max { max } else { first.snaplen };
    snap as usize
}

fn cut(rec: Record<'_>, snap: usize) -> Record<'_> {
    if rec.data.len() > snap { Record { data: &rec.data[..snap], ..rec } } else { rec }
}

fn output_format(reader: &TraceReader) -> OutputFormat {
    match reader.format() {
        Some(FileFormat::Pcap { precision, .. }) => OutputFormat::Pcap(precision),
        Some(FileFormat::PcapNg { .. }) => OutputFormat::PcapNg(None),
        None => OutputFormat::Pcap(
            reader.interfaces().first().map_or(pcaptool_packet::TsPrecision::Micro, |i| precision_for(i.tsresol)),
        ),
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = args.filter.join(" ");
    let filter = Filter::new(&text).map_err(|e| anyhow::anyhow!("invalid filter: {e}"))?;
    if args.write.is_none() && !args.count && !args.explain {
        bail!("say what to do with the matches: -w FILE to write them (- for standard output), --count, or --explain");
    }
    if let Some(w) = &args.write
        && w.as_os_str() != "-"
        && same_file(&args.trace, w)
    {
        bail!("{} is both the trace and the output: choose another output file", w.display());
    }
    let mut reader = TraceReader::open(&args.trace).with_context(|| format!("cannot open {}", args.trace.display()))?;
    reader.read_header()?;
    let mut matchers = Matchers { filter: &filter, swapped: swapped(&reader), compiled: Vec::new() };
    // Like tcpdump, refuse a filter that is invalid for the link types declared before the first packet.
    let declared: Vec<LinkType> = reader.interfaces().iter().map(|i| i.linktype).collect();
    for lt in &declared {
        matchers.get(*lt)?;
    }
    if args.explain {
        if declared.is_empty() {
            // A stream whose first interface is not known yet: explain for Ethernet.
            matchers.get(LinkType::ETHERNET)?;
        }
        crate::cmd::explain::print(&filter, &mut matchers, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = args.threads {
        // A second call (tests run several queries in one process) keeps the first pool.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build_global();
    }

    let to_stdout = args.write.as_ref().is_some_and(|w| w.as_os_str() == "-");
    let format = output_format(&reader);
    let mut out = match &args.write {
        None => None,
        Some(w) => {
            let sink: Box<dyn Write> = if to_stdout {
                Box::new(BufWriter::with_capacity(1 << 20, io::stdout().lock()))
            } else {
                let f = File::create(w).with_context(|| format!("cannot create {}", w.display()))?;
                Box::new(BufWriter::with_capacity(1 << 20, f))
            };
            Some(pcaptool_packet::TraceWriter::new(sink, format)?)
        }
    };
    let result = scan(&mut reader, &mut matchers, out.as_mut(), &args);
    let finish =
        |out: Option<pcaptool_packet::TraceWriter<Box<dyn Write>>>, ifaces: &[Interface]| -> anyhow::Result<()> {
            if let Some(w) = out {
                let mut sink = w.finish(ifaces).context("cannot write the output")?;
                sink.flush().context("cannot write the output")?;
            }
            Ok(())
        };
    let stats = match result {
        Ok(s) => s,
        Err(e) => {
            if let Some(w) = &args.write
                && !to_stdout
            {
                drop(out);
                let _ = std::fs::remove_file(w);
            }
            return Err(e);
        }
    };
    finish(out, reader.interfaces())?;
    if args.count {
        let msg = if args.json {
            serde_json::json!({ "trace": args.trace, "filter": text, "packets": stats.scanned, "matched": stats.matched })
                .to_string()
        } else {
            stats.matched.to_string()
        };
        if to_stdout {
            eprintln!("{msg}");
        } else {
            println!("{msg}");
        }
    }
    if let Some(e) = stats.damage {
        eprintln!("pcaptool: error: {e}; the {} matching packets before it were kept", stats.matched);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

struct Stats {
    scanned: u64,
    matched: u64,
    damage: Option<pcaptool_packet::TraceError>,
}

/// Records per batch handed to the thread pool.
const BATCH: usize = 16_384;

fn scan(
    reader: &mut TraceReader,
    matchers: &mut Matchers<'_>,
    mut out: Option<&mut pcaptool_packet::TraceWriter<Box<dyn Write>>>,
    args: &Args,
) -> anyhow::Result<Stats> {
    let limit = args.limit.unwrap_or(u64::MAX);
    let snap = snapshot(reader);

    let mut stats = Stats { scanned: 0, matched: 0, damage: None };
    let total = std::fs::metadata(&args.trace).ok().filter(|m| m.is_file()).map(|m| m.len());
    let pb = progress::bytes(total, "query");
    if let Some(bytes) = reader.as_bytes() {
        // Memory-mapped: walk records, decide a batch in parallel, write its matches in order.
        let mut records = Records::new(bytes).with_path(&args.trace);
        let mut batch: Vec<Record<'_>> = Vec::with_capacity(BATCH);
        let mut hits: Vec<bool> = Vec::with_capacity(BATCH);
        'outer: loop {
            batch.clear();
            for r in records.by_ref() {
                match r {
                    Ok(rec) => {
                        batch.push(cut(rec, snap));
                        if batch.len() == BATCH {
                            break;
                        }
                    }
                    Err(e) => {
                        stats.damage = Some(e);
                        break;
                    }
                }
            }
            if batch.is_empty() {
                break;
            }
            // Compile for every link type of the batch first (usually one), then decide in parallel.
            let mut lts: Vec<LinkType> = Vec::new();
            for r in &batch {
                if !lts.contains(&r.linktype.base()) {
                    lts.push(r.linktype.base());
                }
            }
            for lt in &lts {
                matchers.get(*lt)?;
            }
            let compiled = &matchers.compiled;
            let decide = |r: &Record<'_>| {
                let lt = r.linktype.base();
                compiled.iter().find(|(l, _)| *l == lt).is_some_and(|(_, m)| m.matches(r.data, r.wirelen, r.ts_ns))
            };
            batch.par_iter().with_min_len(1024).map(decide).collect_into_vec(&mut hits);
            for (rec, hit) in batch.iter().zip(&hits) {
                stats.scanned += 1;
                if !*hit {
                    continue;
                }
                stats.matched += 1;
                if let Some(w) = out.as_deref_mut() {
                    w.write(rec, records.interfaces()).context("cannot write the output")?;
                }
                if stats.matched >= limit {
                    break 'outer;
                }
            }
            pb.set_position(batch.last().map_or(0, |r| r.offset));
            if stats.damage.is_some() {
                break;
            }
        }
    } else {
        // A stream (standard input, compressed file): one record at a time.
        loop {
            let (rec, ifaces) = match reader.next_with_interfaces() {
                None => break,
                Some(Err(e)) => {
                    stats.damage = Some(e);
                    break;
                }
                Some(Ok((rec, ifaces))) => (cut(rec, snap), ifaces),
            };
            stats.scanned += 1;
            if !matchers.get(rec.linktype)?.matches(rec.data, rec.wirelen, rec.ts_ns) {
                continue;
            }
            stats.matched += 1;
            if let Some(w) = out.as_deref_mut() {
                w.write(&rec, ifaces).context("cannot write the output")?;
            }
            if stats.matched >= limit {
                break;
            }
        }
    }
    pb.finish_and_clear();
    Ok(stats)
}
