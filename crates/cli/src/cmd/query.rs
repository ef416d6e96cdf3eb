//! `pcaptool query TRACE FILTER`: the packets of a trace that a tcpdump filter selects, written in the trace's own
//! format, counted, or explained. With an index (`TRACE.ptidx`, see `pcaptool index`) and a filter the index
//! narrows, only the packets the index selects are read (in parallel, chunk by chunk) and the filter runs on each;
//! with an index that would select too much, its chunks are scanned in parallel; otherwise the trace is scanned:
//! records are walked in order over a memory map and the filter runs on batches of them in parallel. Either way
//! matches are written in their original order, the same bytes (pcap output with an index: at offsets computed
//! in advance, by every thread at once).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use pcaptool_index::{IndexFile, IndexView, Selection, compression_code, sidecar_path};
use pcaptool_packet::{
    FileFormat, Interface, LinkType, OutputFormat, PacketFields, Record, Records, Seeker, TraceReader, TraceWriter,
    TsPrecision, pcap_record_header, precision_for,
};
use pcaptool_query::plan::{Field, IndexSource, Pred};
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
    #[arg(required_unless_present = "flow", num_args = 1..)]
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
    /// Scan the trace even if an index exists (and do not check the index).
    #[arg(long)]
    scan: bool,
    /// Print counts and explanations as JSON.
    #[arg(long)]
    json: bool,
    /// With a flow store: only packets at or after this time (RFC 3339 or epoch seconds).
    #[arg(long, value_parser = crate::cmd::convert::parse_time_arg)]
    after: Option<u64>,
    /// With a flow store: only packets before this time.
    #[arg(long, value_parser = crate::cmd::convert::parse_time_arg)]
    before: Option<u64>,
    /// With a flow store (TRACE is its directory): the packets of this flow (an id from `pcaptool flows`), in
    /// order, with one read per segment it spans.
    #[arg(long, value_name = "ID")]
    flow: Option<u64>,
    /// Threads for the scan (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// With a flow store: answer from the undamaged segments when some are damaged, with a warning and exit
    /// status 3 (by default a damaged segment fails the query).
    #[arg(long)]
    skip_damaged: bool,
}

impl Args {
    /// The arguments of one query of `pcaptool shell`.
    pub(crate) fn for_shell(trace: PathBuf, filter: &str, write: Option<PathBuf>, explain: bool) -> Args {
        Args {
            trace,
            filter: vec![filter.to_string()],
            write,
            count: true,
            limit: None,
            explain,
            scan: false,
            json: false,
            flow: None,
            after: None,
            before: None,
            threads: None,
            skip_damaged: false,
        }
    }
}

/// Matchers compiled on demand for the link types a trace holds.
pub(crate) struct Matchers<'f> {
    filter: &'f Filter,
    swapped: bool,
    pub(crate) compiled: Vec<(LinkType, Matcher)>,
}

impl Matchers<'_> {
    /// Whether a record matches, by the filter compiled for its link type (compile every link type first).
    fn decider(&self) -> impl Fn(&Record<'_>) -> bool + Sync + '_ {
        let compiled = &self.compiled;
        move |r: &Record<'_>| {
            let lt = r.linktype.base();
            compiled.iter().find(|(l, _)| *l == lt).is_some_and(|(_, m)| m.matches(r.data, r.wirelen, r.ts_ns))
        }
    }

    pub(crate) fn get(&mut self, lt: LinkType) -> anyhow::Result<&Matcher> {
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
pub(crate) fn snapshot(reader: &TraceReader) -> usize {
    let Some(first) = reader.interfaces().first() else { return usize::MAX };
    snap_for(first.linktype, first.snaplen)
}

/// The bytes of a packet libpcap's filters and output see, for a capture of this link type and snapshot length.
pub(crate) fn snap_for(linktype: LinkType, snaplen: u32) -> usize {
    let max = max_snaplen(linktype);
    (if snaplen == 0 || snaplen > max { max } else { snaplen }) as usize
}

fn cut(rec: Record<'_>, snap: usize) -> Record<'_> {
    if rec.data.len() > snap { Record { data: &rec.data[..snap], ..rec } } else { rec }
}

fn output_format(reader: &TraceReader) -> OutputFormat {
    match reader.format() {
        Some(FileFormat::Pcap { precision, .. }) => OutputFormat::Pcap(precision),
        Some(FileFormat::PcapNg { .. }) => OutputFormat::PcapNg(None),
        None => {
            OutputFormat::Pcap(reader.interfaces().first().map_or(TsPrecision::Micro, |i| precision_for(i.tsresol)))
        }
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let out = args
        .write
        .as_ref()
        .map(|w| if w.as_os_str() == "-" { "standard output".into() } else { w.display().to_string() });
    run_inner(args).map_err(|e| crate::cmd::name_output(e, out))
}

fn run_inner(args: Args) -> anyhow::Result<ExitCode> {
    let text = args.filter.join(" ");
    if args.trace.is_dir() {
        let filter = if text.is_empty() {
            None
        } else {
            Some(Filter::new(&text).map_err(|e| anyhow::anyhow!("invalid filter: {e}"))?)
        };
        if args.write.is_none() && !args.count && !args.explain {
            bail!(
                "say what to do with the matches: -w FILE to write them (- for standard output), --count, or --explain"
            );
        }
        if let (Some(a), Some(b)) = (args.after, args.before)
            && a >= b
        {
            bail!("--after must be earlier than --before: the window is empty");
        }
        return crate::cmd::store::query(
            &args.trace,
            filter.as_ref(),
            &crate::cmd::store::QueryOpts {
                flow: args.flow,
                write: args.write.as_deref(),
                count: args.count,
                limit: args.limit,
                explain: args.explain,
                after: args.after,
                before: args.before,
                skip_damaged: args.skip_damaged,
            },
        );
    }
    if args.flow.is_some() {
        bail!("--flow needs a flow store: {} is not a directory (see `pcaptool import`)", args.trace.display());
    }
    if args.after.is_some() || args.before.is_some() {
        bail!(
            "--after/--before select a time window of a flow store; for a trace, cut it with `pcaptool convert --after/--before` or use tcpdump's time-free filter"
        );
    }
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
    if let Some(n) = args.threads {
        // A second call (tests run several queries in one process) keeps the first pool.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build_global();
    }
    let index_file = if args.scan || args.trace.as_os_str() == "-" { None } else { open_index(&args.trace, &reader)? };
    let view = match &index_file {
        Some(f) => Some(f.view().map_err(index_error)?),
        None => None,
    };
    execute(&args, &filter, reader, view.as_ref())
}

/// Runs a parsed query on an opened trace, with its checked index if it has one (`pcaptool shell` keeps both
/// loaded between queries).
pub(crate) fn execute(
    args: &Args,
    filter: &Filter,
    mut reader: TraceReader,
    view: Option<&IndexView<'_>>,
) -> anyhow::Result<ExitCode> {
    let text = filter.text();
    let mut matchers = Matchers { filter, swapped: swapped(&reader), compiled: Vec::new() };
    // Like tcpdump, refuse a filter that is invalid for the link types declared before the first packet.
    let declared: Vec<LinkType> = reader.interfaces().iter().map(|i| i.linktype).collect();
    for lt in &declared {
        matchers.get(*lt)?;
    }
    let view = if args.scan { None } else { view };
    let source = view.map(Source);
    let plan = pcaptool_query::plan::plan(filter, source.as_ref().map(|s| s as &dyn IndexSource));
    // Counting an exact condition: the index decides every packet whose fields it knows; only the others are read
    // (and the selection is not needed).
    let counting = args.count && args.write.is_none() && plan.exact && !args.explain;
    let selection = match (view, &plan.index) {
        (Some(v), Some(part)) if plan.use_index && !counting => Some(v.select(part).map_err(index_error)?),
        _ => None,
    };
    if args.explain {
        if declared.is_empty() {
            // A stream whose first interface is not known yet: explain for Ethernet.
            matchers.get(LinkType::ETHERNET)?;
        }
        let index = match view {
            Some(v) => Some(crate::cmd::explain::IndexFacts::of(v, &plan, selection.as_ref())?),
            None => None,
        };
        crate::cmd::explain::print(filter, &plan, index.as_ref(), &mut matchers, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }

    let to_stdout = args.write.as_ref().is_some_and(|w| w.as_os_str() == "-");
    let format = output_format(&reader);
    // With an index over a mapped pcap of one interface, matches are written at offsets computed in advance, by
    // every thread at once (pcapWT's parallel extraction); the bytes are those the writer would write.
    let ifaces = reader.interfaces();
    let file = match &args.write {
        Some(w) if !to_stdout => Some(File::create(w).with_context(|| format!("cannot create {}", w.display()))?),
        _ => None,
    };
    // Writing at offsets needs a file that takes them: a regular file or a device such as /dev/null, not a pipe.
    let positional_file = file.as_ref().and_then(|f| f.metadata().ok()).is_some_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_file() || m.file_type().is_char_device()
    });
    let (mut positional, mut out) = match (file, format, view) {
        (Some(f), OutputFormat::Pcap(precision), Some(v))
            if positional_file
                && reader.as_bytes().is_some()
                && !v.file().compressed()
                && ifaces.len() == 1
                && ifaces[0].fcs_len.is_none() =>
        {
            let shown = args.write.as_deref().map(|w| w.display().to_string()).unwrap_or_default();
            let p = Positional::start(f, precision, ifaces).with_context(|| format!("cannot write {shown}"))?;
            (Some(p), None)
        }
        (Some(f), ..) => {
            (None, Some(TraceWriter::new(Box::new(BufWriter::with_capacity(1 << 20, f)) as Box<dyn Write>, format)?))
        }
        (None, ..) if to_stdout => {
            let sink: Box<dyn Write> = Box::new(BufWriter::with_capacity(1 << 20, io::stdout().lock()));
            (None, Some(TraceWriter::new(sink, format)?))
        }
        (None, ..) => (None, None),
    };
    let counted = match (view, &plan.index) {
        (Some(v), Some(part)) if counting => Some(v.count(part).map_err(index_error)?),
        _ => None,
    };
    let result = match (view, &counted, &selection) {
        (Some(v), Some((sure, undecided)), _) => indexed(&mut reader, v, undecided, &mut matchers, None, None, args)
            .map(|mut s| {
                s.matched = (s.matched + sure).min(args.limit.unwrap_or(u64::MAX));
                s.from_index = Some(*sure);
                s
            }),
        (Some(v), None, Some(sel)) => {
            indexed(&mut reader, v, sel, &mut matchers, out.as_mut(), positional.as_mut(), args)
        }
        // A scan with an index over a mapped trace: chunks read in parallel from their first records.
        (Some(v), None, None) if reader.as_bytes().is_some() && !v.file().compressed() && args.limit.is_none() => {
            scan_chunks(&mut reader, v, &mut matchers, out.as_mut(), positional.as_mut(), args)
        }
        _ => scan(&mut reader, &mut matchers, out.as_mut(), args),
    };
    let finish = |out: Option<TraceWriter<Box<dyn Write>>>, ifaces: &[Interface]| -> anyhow::Result<()> {
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
                drop(positional);
                let _ = std::fs::remove_file(w);
            }
            return Err(e);
        }
    };
    finish(out, reader.interfaces())?;
    if args.count {
        let msg = if args.json {
            let mut v = serde_json::json!({ "trace": args.trace, "filter": text, "packets": stats.scanned, "matched": stats.matched });
            if let Some(c) = stats.candidates {
                v["index_candidates"] = c.into();
            }
            if let Some(c) = stats.from_index {
                v["counted_from_index"] = c.into();
            }
            v.to_string()
        } else {
            stats.matched.to_string()
        };
        if to_stdout {
            eprintln!("{msg}");
        } else {
            outln!("{msg}");
        }
    }
    if let Some(e) = stats.damage {
        eprintln!("pcaptool: error: {e}; the {} matching packets before it were kept", stats.matched);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

struct Stats {
    /// Packets in the trace (scanned, or described by the index).
    scanned: u64,
    matched: u64,
    /// Packets the index selected and the filter ran on.
    candidates: Option<u64>,
    /// Matches the index counted without reading them.
    from_index: Option<u64>,
    damage: Option<pcaptool_packet::TraceError>,
}

/// Records per batch handed to the thread pool.
const BATCH: usize = 16_384;

fn scan(
    reader: &mut TraceReader,
    matchers: &mut Matchers<'_>,
    mut out: Option<&mut TraceWriter<Box<dyn Write>>>,
    args: &Args,
) -> anyhow::Result<Stats> {
    let limit = args.limit.unwrap_or(u64::MAX);
    let snap = snapshot(reader);

    let mut stats = Stats { scanned: 0, matched: 0, candidates: None, from_index: None, damage: None };
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
            let decide = matchers.decider();
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

/// Writes the matches of consecutive chunks, in order, up to `limit` matches in all (counted in `stats`);
/// true when the limit is reached.
fn emit(
    mut lists: Vec<Vec<Record<'_>>>,
    out: Option<&mut TraceWriter<Box<dyn Write>>>,
    positional: Option<&mut Positional>,
    ifaces: &[Interface],
    limit: u64,
    stats: &mut Stats,
) -> anyhow::Result<bool> {
    let done = keep_first(&mut lists, limit, stats, |l, n| {
        l.truncate(n);
        l.len()
    });
    if let Some(p) = positional {
        p.write(&lists).context("cannot write the output")?;
    } else if let Some(w) = out {
        for rec in lists.iter().flatten() {
            w.write(rec, ifaces).context("cannot write the output")?;
        }
    }
    Ok(done)
}

/// Cuts consecutive lists of matches to `limit` matches in all, counted in `stats` (`keep` keeps a list's first
/// `n` and says how many it holds); true when the limit is reached.
fn keep_first<T>(lists: &mut [T], limit: u64, stats: &mut Stats, mut keep: impl FnMut(&mut T, usize) -> usize) -> bool {
    let mut left = limit - stats.matched;
    for l in lists {
        left -= keep(l, usize::try_from(left).unwrap_or(usize::MAX)) as u64;
    }
    stats.matched = limit - left;
    left == 0
}

/// Records copied out of a reused read buffer, kept until they are written. For a [`Positional`] output each
/// record's data follows 16 bytes left for its pcap record header, so that the arena's bytes become the output's
/// bytes in place and go out in one write (a second buffer would cost a copy and its fresh pages).
struct Arena {
    data: Vec<u8>,
    records: Vec<(Record<'static>, std::ops::Range<usize>)>,
    /// Whether each record has room for its header before it.
    headed: bool,
}

impl Arena {
    fn new(headed: bool) -> Arena {
        Arena { data: Vec::new(), records: Vec::new(), headed }
    }

    fn push(&mut self, rec: &Record<'_>) {
        if self.headed {
            self.data.extend_from_slice(&[0; 16]);
        }
        let start = self.data.len();
        self.data.extend_from_slice(rec.data);
        let meta = Record {
            ts_ns: rec.ts_ns,
            has_ts: rec.has_ts,
            wirelen: rec.wirelen,
            iface: rec.iface,
            linktype: rec.linktype,
            offset: rec.offset,
            record_len: rec.record_len,
            data: &[],
        };
        self.records.push((meta, start..self.data.len()));
    }

    /// Keeps the first `n` records; returns how many it holds.
    fn truncate(&mut self, n: usize) -> usize {
        self.records.truncate(n);
        self.data.truncate(self.records.last().map_or(0, |(_, r)| r.end));
        self.records.len()
    }

    fn records(&self) -> Vec<Record<'_>> {
        self.records.iter().map(|(m, r)| Record { data: &self.data[r.clone()], ..*m }).collect()
    }
}

/// [`emit`] for arenas: those of a [`Positional`] output are written as they are, with their headers filled in.
fn emit_arenas(
    mut arenas: Vec<Arena>,
    out: Option<&mut TraceWriter<Box<dyn Write>>>,
    positional: Option<&mut Positional>,
    ifaces: &[Interface],
    limit: u64,
    stats: &mut Stats,
) -> anyhow::Result<bool> {
    let Some(p) = positional else {
        let lists = arenas.iter().map(Arena::records).collect();
        return emit(lists, out, None, ifaces, limit, stats);
    };
    let done = keep_first(&mut arenas, limit, stats, Arena::truncate);
    p.write_arenas(&mut arenas).context("cannot write the output")?;
    Ok(done)
}

/// A pcap output written at precomputed offsets: each wave of chunks' matches is sized first, then every chunk's
/// records are encoded and written at their place by its own thread.
pub(crate) struct Positional {
    file: File,
    precision: TsPrecision,
    /// Where the next record goes.
    next: u64,
}

impl Positional {
    /// Writes the file header, the one [`TraceWriter`] writes for a trace of these interfaces.
    fn start(file: File, precision: TsPrecision, ifaces: &[Interface]) -> anyhow::Result<Positional> {
        let header = TraceWriter::new(Vec::new(), OutputFormat::Pcap(precision))?.finish(ifaces)?;
        file.write_all_at(&header, 0)?;
        Ok(Positional { file, precision, next: header.len() as u64 })
    }

    /// Writes headed arenas (see [`Arena`]) one after another, each in one write by its own thread.
    fn write_arenas(&mut self, arenas: &mut [Arena]) -> anyhow::Result<()> {
        let mut starts = Vec::with_capacity(arenas.len());
        for a in arenas.iter() {
            starts.push(self.next);
            self.next += a.data.len() as u64;
        }
        let file = &self.file;
        let precision = self.precision;
        arenas.par_iter_mut().zip(starts).try_for_each(|(a, at)| -> anyhow::Result<()> {
            anyhow::ensure!(a.headed, "an arena without room for its records' headers");
            for (m, r) in &a.records {
                let h = pcap_record_header(precision, m.ts_ns, m.wirelen, r.len())?;
                a.data[r.start - 16..r.start].copy_from_slice(&h);
            }
            file.write_all_at(&a.data, at)?;
            Ok(())
        })
    }

    fn write(&mut self, lists: &[Vec<Record<'_>>]) -> anyhow::Result<()> {
        let mut starts = Vec::with_capacity(lists.len());
        for l in lists {
            starts.push(self.next);
            self.next += l.iter().map(|r| 16 + r.data.len() as u64).sum::<u64>();
        }
        let file = &self.file;
        let precision = self.precision;
        lists.par_iter().zip(starts).try_for_each(|(l, mut at)| -> anyhow::Result<()> {
            let mut buf = Vec::with_capacity(1 << 20);
            for r in l {
                buf.extend_from_slice(&pcap_record_header(precision, r.ts_ns, r.wirelen, r.data.len())?);
                buf.extend_from_slice(r.data);
                if buf.len() >= 1 << 20 {
                    file.write_all_at(&buf, at)?;
                    at += buf.len() as u64;
                    buf.clear();
                }
            }
            file.write_all_at(&buf, at)?;
            Ok(())
        })
    }
}

/// A scan split by the index: every chunk read from its first record, chunks in parallel (in waves, so memory
/// holds a few chunks' matches), matches written in order.
fn scan_chunks(
    reader: &mut TraceReader,
    view: &IndexView<'_>,
    matchers: &mut Matchers<'_>,
    mut out: Option<&mut TraceWriter<Box<dyn Write>>>,
    mut positional: Option<&mut Positional>,
    args: &Args,
) -> anyhow::Result<Stats> {
    let snap = snapshot(reader);
    let bytes = reader.as_bytes().context("a mapped trace")?;
    let mut stats = Stats { scanned: view.packets(), matched: 0, candidates: None, from_index: None, damage: None };
    let seeker = index_seeker(bytes, view, &args.trace, matchers)?;
    let decide = matchers.decider();
    let total = std::fs::metadata(&args.trace).ok().map(|m| m.len());
    let pb = progress::bytes(total, "query");
    let all: Vec<usize> = (0..view.chunks().len()).collect();
    for wave in all.chunks(rayon::current_num_threads().max(1)) {
        let lists = wave
            .par_iter()
            .map(|&ci| {
                let mut hits = Vec::new();
                view.walk_chunk(bytes, &seeker, &args.trace, ci, &mut |_, rec| {
                    let rec = cut(rec, snap);
                    if decide(&rec) {
                        hits.push(rec);
                    }
                    Ok(())
                })?;
                pb.inc(view.chunk_bytes(ci)?);
                Ok(hits)
            })
            .collect::<Result<Vec<Vec<Record<'_>>>, pcaptool_index::IndexError>>()?;
        emit(lists, out.as_deref_mut(), positional.as_deref_mut(), seeker.interfaces(), u64::MAX, &mut stats)?;
    }
    pb.finish_and_clear();
    stats.damage = index_damage(view, bytes, &seeker)?;
    Ok(stats)
}

/// A reader of the records of the mapped trace `bytes` at the offsets the index gives, with the filter compiled
/// for every link type of the trace.
fn index_seeker(
    bytes: &[u8],
    view: &IndexView<'_>,
    trace: &std::path::Path,
    matchers: &mut Matchers<'_>,
) -> anyhow::Result<Seeker> {
    let file = view.file();
    let seeker = Seeker::new(bytes, file.structure())
        .map_err(|e| {
            anyhow::anyhow!(
                "{} does not describe {}: {e}; rebuild it with `pcaptool index`",
                file.path().display(),
                trace.display()
            )
        })?
        .with_path(trace);
    for i in seeker.interfaces() {
        matchers.get(i.linktype)?;
    }
    Ok(seeker)
}

/// The damage the index says ended the trace, read again from the trace (an index claiming damage the trace
/// does not have is refused).
fn index_damage(
    view: &IndexView<'_>,
    bytes: &[u8],
    seeker: &Seeker,
) -> anyhow::Result<Option<pcaptool_packet::TraceError>> {
    let file = view.file();
    let Some(off) = file.damage() else { return Ok(None) };
    match seeker.next_record_at(bytes, off) {
        Err(e) => Ok(Some(e)),
        Ok(_) => bail!(
            "{} says the trace is damaged at byte {off}, but it is not: rebuild it with `pcaptool index`",
            file.path().display()
        ),
    }
}

/// An index error as the CLI reports it: with the way out.
pub(crate) fn index_error(e: pcaptool_index::IndexError) -> anyhow::Error {
    anyhow::anyhow!("{e}; or query with --scan")
}

/// The index as the planner sees it.
struct Source<'a, 'b>(&'a IndexView<'b>);

impl IndexSource for Source<'_, '_> {
    fn packets(&self) -> u64 {
        self.0.packets()
    }
    fn has_field(&self, field: Field) -> bool {
        self.0.has_field(field)
    }
    fn estimate(&self, pred: &Pred) -> Option<u64> {
        // A damaged part gives no estimate here; selecting then reports the damage.
        self.0.estimate(pred).ok()
    }
    fn estimate_need(&self, need: &pcaptool_packet::Need) -> Option<u64> {
        self.0.estimate_need(need).ok()
    }
}

/// The trace's index, if it has one, checked against the trace as it is now.
pub(crate) fn open_index(trace: &std::path::Path, reader: &TraceReader) -> anyhow::Result<Option<IndexFile>> {
    let path = sidecar_path(trace);
    if !path.exists() {
        return Ok(None);
    }
    let file = IndexFile::open(&path).map_err(index_error)?;
    let snap = u32::try_from(snapshot(reader)).unwrap_or(u32::MAX);
    file.check_trace(trace, Some(compression_code(reader.compression())), snap).map_err(index_error)?;
    Ok(Some(file))
}

thread_local! {
    /// A thread's buffer for reading the trace's blocks with `pread` ([`IndexView::read_packets_at`]).
    static WINDOW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads the packets the index selected and writes those the filter matches, in trace order.
fn indexed(
    reader: &mut TraceReader,
    view: &IndexView<'_>,
    sel: &Selection,
    matchers: &mut Matchers<'_>,
    mut out: Option<&mut TraceWriter<Box<dyn Write>>>,
    mut positional: Option<&mut Positional>,
    args: &Args,
) -> anyhow::Result<Stats> {
    let limit = args.limit.unwrap_or(u64::MAX);
    let snap = snapshot(reader);
    let mut stats =
        Stats { scanned: view.packets(), matched: 0, candidates: Some(sel.count()), from_index: None, damage: None };
    let file = view.file();
    if let Some(bytes) = reader.as_bytes() {
        // Few candidates over a large trace are read with `pread` from their blocks' first records (a read of a
        // few KiB costs less than a page fault of the mapping, measured on the needle benchmark); many are read
        // through the mapping.
        let sparse = view.blocks_to_read(sel).saturating_mul(8) < view.blocks();
        let trace_file = match sparse {
            true => Some(File::open(&args.trace).with_context(|| format!("cannot open {}", args.trace.display()))?),
            false => None,
        };
        let seeker = index_seeker(bytes, view, &args.trace, matchers)?;
        let decide = matchers.decider();
        // The candidates in pieces of at most PIECE packets, read in parallel in waves of a bounded number of
        // packets (so that memory holds a few pieces' matches) and written in order: pieces, not whole chunks, so
        // that both threads have work when one chunk holds most candidates.
        const PIECE: usize = 512;
        let pieces: Vec<(usize, &[u32])> =
            sel.chunks.iter().flat_map(|(ci, positions)| positions.chunks(PIECE).map(move |p| (*ci, p))).collect();
        let per_wave = (rayon::current_num_threads().max(1) * 64).max(1);
        for wave in pieces.chunks(per_wave) {
            let done = if let Some(tf) = &trace_file {
                let headed = positional.is_some();
                let arenas = wave
                    .par_iter()
                    .map(|(ci, positions)| {
                        let mut arena = Arena::new(headed);
                        let mut read = |window: &mut Vec<u8>| {
                            view.read_packets_at(tf, &seeker, &args.trace, *ci, positions, window, &mut |_, rec| {
                                let rec = cut(rec, snap);
                                if decide(&rec) {
                                    arena.push(&rec);
                                }
                                Ok(())
                            })
                        };
                        // Each thread keeps its read buffer from piece to piece (fresh pages cost more than the
                        // reads they would hold); a fresh one should the thread's be in use already.
                        WINDOW.with(|w| match w.try_borrow_mut() {
                            Ok(mut window) => read(&mut window),
                            Err(_) => read(&mut Vec::new()),
                        })?;
                        Ok(arena)
                    })
                    .collect::<Result<Vec<Arena>, pcaptool_index::IndexError>>()?;
                let (out, positional) = (out.as_deref_mut(), positional.as_deref_mut());
                emit_arenas(arenas, out, positional, seeker.interfaces(), limit, &mut stats)?
            } else {
                let lists = wave
                    .par_iter()
                    .map(|(ci, positions)| {
                        let mut hits = Vec::new();
                        view.read_packets(bytes, &seeker, &args.trace, *ci, positions, &mut |_, rec| {
                            let rec = cut(rec, snap);
                            if decide(&rec) {
                                hits.push(rec);
                            }
                            Ok(())
                        })?;
                        Ok(hits)
                    })
                    .collect::<Result<Vec<Vec<Record<'_>>>, pcaptool_index::IndexError>>()?;
                emit(lists, out.as_deref_mut(), positional.as_deref_mut(), seeker.interfaces(), limit, &mut stats)?
            };
            if done {
                break;
            }
        }
        if stats.matched < limit {
            stats.damage = index_damage(view, bytes, &seeker)?;
        }
        return Ok(stats);
    }
    // A compressed trace: stream it, and run the filter on the selected packets only.
    let mut wanted = sel.chunks.iter().flat_map(|(ci, v)| {
        let first = view.chunks()[*ci].first_packet();
        v.iter().map(move |&i| (*ci, i as usize, first + u64::from(i)))
    });
    let mut next = wanted.next();
    let mut at = 0u64;
    while next.is_some() || file.damage().is_some() {
        let (rec, ifaces) = match reader.next_with_interfaces() {
            None => break,
            Some(Err(e)) => {
                stats.damage = Some(e);
                break;
            }
            Some(Ok((rec, ifaces))) => (cut(rec, snap), ifaces),
        };
        if let Some((ci, i, global)) = next
            && global == at
        {
            let fields = PacketFields::new(rec.linktype, rec.data, rec.wirelen, rec.ts_ns);
            if !view.is_packet(ci, i, &fields, rec.wirelen, rec.ts_ns).map_err(index_error)? {
                bail!(
                    "{} does not describe {} as it is now (packet {at} differs); rebuild it with `pcaptool index`",
                    file.path().display(),
                    args.trace.display()
                );
            }
            next = wanted.next();
            if matchers.get(rec.linktype)?.matches(rec.data, rec.wirelen, rec.ts_ns) && stats.matched < limit {
                stats.matched += 1;
                if let Some(w) = out.as_deref_mut() {
                    w.write(&rec, ifaces).context("cannot write the output")?;
                }
                if stats.matched >= limit {
                    break;
                }
            }
        }
        at += 1;
    }
    if let Some((_, _, global)) = next
        && stats.damage.is_none()
        && stats.matched < limit
    {
        bail!(
            "{} describes packet {global}, but {} ends after {at} packets; rebuild it with `pcaptool index`",
            file.path().display(),
            args.trace.display()
        );
    }
    Ok(stats)
}
