//! The flow store's commands: `pcaptool import TRACE... --store DIR`, `pcaptool flows DIR [FILTER]`, and the
//! store side of `pcaptool info DIR`.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;

use pcaptool_flowstore::{Flow, ImportOptions, Store, StoreError};
use pcaptool_packet::Chain;
use pcaptool_packet::Need;
use pcaptool_query::plan::necessary;

use crate::inputs::Input;
use crate::progress;

/// Arguments of `pcaptool import`.
#[derive(Debug, clap::Args)]
pub(crate) struct ImportArgs {
    /// Captures to import, in order (pcap or pcapng, possibly compressed).
    #[arg(required = true, num_args = 1..)]
    traces: Vec<PathBuf>,
    /// The store directory (created if missing).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Close a segment at this many bytes of data (or once its packets take twice that in memory).
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = crate::args::parse_size)]
    segment_size: u64,
    /// After importing, remove the oldest segments whole until the store takes at most this much.
    #[arg(long, value_name = "BYTES", value_parser = crate::args::parse_size)]
    max_size: Option<u64>,
    /// Import a trace the store already holds whole again, as new packets (by default it is refused; an
    /// interrupted import of a trace resumes after what it stored).
    #[arg(long)]
    allow_duplicates: bool,
    #[command(flatten)]
    storage: crate::args::Storage,
    /// Print what was imported as JSON lines.
    #[arg(long)]
    json: bool,
}

/// Opens a store for reading (which changes nothing in it); `skip_damaged` makes its reads leave damaged
/// segments out instead of failing.
pub(crate) fn open_store(dir: &Path, skip_damaged: bool) -> anyhow::Result<Store> {
    let mut store =
        Store::open(dir).map_err(|e| about_store(e, || format!("cannot open the store {}", dir.display())))?;
    store.set_skip_damaged(skip_damaged);
    Ok(store)
}

/// An import's error: one about the trace names the trace (its own message does), any other says which trace
/// was being imported into which store.
fn import_error(e: StoreError, trace: &Path, store: &Path) -> anyhow::Error {
    match e {
        StoreError::Trace(_) => anyhow::Error::from(e).context(format!("cannot import into {}", store.display())),
        e => anyhow::Error::from(e).context(format!("cannot import {} into {}", trace.display(), store.display())),
    }
}

/// A store's error with `context`, unless it is about the directory itself (which it names, with what to do).
fn about_store(e: StoreError, context: impl FnOnce() -> String) -> anyhow::Error {
    match e {
        StoreError::NotAStore { .. } | StoreError::NotADirectory { .. } | StoreError::ForeignDirectory { .. } => {
            e.into()
        }
        e => anyhow::Error::from(e).context(context()),
    }
}

/// Opens a store for writing (taking its writer lock) and says what opening it repaired.
pub(crate) fn open_writer(dir: &Path, create: bool) -> anyhow::Result<Store> {
    let store = if create { Store::create(dir) } else { Store::open_writer(dir) }
        .map_err(|e| about_store(e, || format!("cannot open the store {} for writing", dir.display())))?;
    for r in store.repairs() {
        eprintln!("pcaptool: store {}: {r}", dir.display());
    }
    Ok(store)
}

/// A read's error, with what to do when it is damage.
pub(crate) fn read_error(dir: &Path, e: StoreError) -> anyhow::Error {
    if e.is_damage() {
        anyhow::anyhow!(
            "{}; the answer would miss packets: --skip-damaged answers from the other segments, `pcaptool verify {}` \
             checks the whole store, `pcaptool repair {}` sets damaged segments aside",
            Chain(&e),
            dir.display(),
            dir.display()
        )
    } else {
        anyhow::Error::from(e)
    }
}

/// Warns of the damaged segments a read of `store` left out; the exit status that says so.
pub(crate) fn warn_skipped(store: &Store) -> ExitCode {
    crate::cmd::warn_skipped(store.dir(), &store.skipped())
}

pub(crate) fn import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    args.storage.check()?;
    let mut store = open_writer(&args.store, true)?;
    let opts = ImportOptions {
        segment_bytes: args.segment_size,
        max_size: args.max_size,
        allow_duplicates: args.allow_duplicates,
        compress: args.storage.compress,
        block_size: args.storage.block_size,
        dedup: args.storage.dedup,
        ..ImportOptions::default()
    };
    let mut code = ExitCode::SUCCESS;
    for trace in &args.traces {
        let total = std::fs::metadata(trace).ok().map(|m| m.len());
        let pb = progress::bytes(total, "import");
        let started = Instant::now();
        let stats = store
            .import(trace, &opts, &mut |at| pb.set_position(at))
            .map_err(|e| import_error(e, trace, &args.store))?;
        pb.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        if args.json {
            outln!(
                "{}",
                serde_json::json!({
                    "trace": trace, "store": args.store, "packets": stats.packets, "segments": stats.segments,
                    "already_stored": stats.already_stored, "removed_segments": stats.removed, "seconds": secs,
                    "over_max_size": stats.over_max_size,
                    "damage": stats.damage.as_ref().map(|d| Chain(d).to_string()),
                })
            );
        } else {
            outln!(
                "{}: {} packets in {} segments of {} in {secs:.2} s{}{}",
                trace.display(),
                stats.packets,
                stats.segments,
                args.store.display(),
                if stats.already_stored > 0 {
                    format!(
                        "; resumed an interrupted import: its first {} packets were stored already",
                        stats.already_stored
                    )
                } else {
                    String::new()
                },
                if stats.removed > 0 {
                    format!("; {} oldest segments removed for --max-size", stats.removed)
                } else {
                    String::new()
                }
            );
        }
        if let Some(d) = &stats.damage {
            eprintln!("pcaptool: error: {}; the {} packets before it were imported", Chain(d), stats.packets);
            code = ExitCode::FAILURE;
        }
        if let (Some(size), Some(max)) = (stats.over_max_size, args.max_size) {
            eprintln!(
                "pcaptool: error: the store {} takes {size} bytes, more than --max-size {max}: the segments just \
                 imported are kept (retention never removes what it was asked to import); give a larger --max-size, \
                 or remove older data with `pcaptool retain`",
                args.store.display()
            );
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

/// Arguments of `pcaptool flows`.
#[derive(Debug, clap::Args)]
pub(crate) struct FlowsArgs {
    /// The source, then the filter: a store directory, or captures (a file, a directory of captures, a pattern
    /// such as `'dir/*.pcap'`), whose flows are found by importing them into a temporary store. The words after
    /// it are a tcpdump filter: only the flows that may hold a packet it matches are listed (by their addresses,
    /// ports, protocol, VLAN and time). Several captures: name them before `--`, the filter after it, or give
    /// each with -r.
    #[arg(value_name = "SOURCE [FILTER]", required_unless_present = "read")]
    words: Vec<String>,
    /// The filter, when the words before `--` are all sources.
    #[arg(last = true, value_name = "FILTER")]
    after: Vec<String>,
    /// A capture to read (repeat for several).
    #[arg(short = 'r', long = "read", value_name = "TRACE")]
    read: Vec<PathBuf>,
    /// Where captures' temporary store goes (default: the system's temporary directory); it takes about their
    /// size, and is removed afterwards.
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// One JSON object per flow, one per line.
    #[arg(long)]
    json: bool,
    /// List the flows of the undamaged segments when some are damaged (with a warning and exit status 3).
    #[arg(long)]
    skip_damaged: bool,
}

pub(crate) fn flows(args: FlowsArgs) -> anyhow::Result<ExitCode> {
    let (sources, words) = crate::inputs::split_words(&args.words, &args.after, &args.read);
    let need = match words.is_empty() {
        true => Need::All,
        false => necessary(&crate::inputs::parse_filter(&words)?),
    };
    // A path that is not there is taken for a store (whose error says how to make one).
    let inputs = match sources.as_slice() {
        [one] if !one.exists() && !crate::inputs::is_pattern(&one.to_string_lossy()) => {
            vec![Input::Store(one.clone())]
        }
        _ => crate::inputs::expand(&sources)?,
    };
    let work;
    let store_dir = match inputs.as_slice() {
        [Input::Store(dir)] => dir.clone(),
        _ => {
            let mut traces = Vec::new();
            for i in &inputs {
                match i {
                    Input::Trace(t) if t.as_os_str() != "-" => traces.push(t.clone()),
                    Input::Trace(_) => anyhow::bail!("flows reads files: save standard input to a file first"),
                    Input::Store(d) => anyhow::bail!(
                        "{} is a flow store: list a store's flows alone (`pcaptool flows {}`)",
                        d.display(),
                        d.display()
                    ),
                }
            }
            let under = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
            work = WorkStore::import(&traces, &under, "listed")?;
            work.dir().to_path_buf()
        }
    };
    let store = open_store(&store_dir, args.skip_damaged)?;
    let flows = store.flows(&need).map_err(|e| read_error(&store_dir, e))?;
    let stdout = io::stdout();
    let mut o = BufWriter::new(stdout.lock());
    if !args.json {
        writeln!(
            o,
            "id\tts\tduration\torig_h\torig_p\tresp_h\tresp_p\tproto\tvlan\tconn_state\torig_pkts\torig_bytes\tresp_pkts\tresp_bytes\torig_payload\tresp_payload"
        )?;
    }
    for f in &flows {
        write_flow(&mut o, f, args.json)?;
    }
    o.flush()?;
    Ok(warn_skipped(&store))
}

fn write_flow(o: &mut dyn Write, f: &Flow, json: bool) -> io::Result<()> {
    let r = pcaptool_engine::FlowRecord::from(f);
    if json {
        writeln!(o, "{}", serde_json::to_string(&r).map_err(io::Error::other)?)
    } else {
        writeln!(
            o,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.id,
            r.ts,
            r.duration,
            r.orig_h,
            r.orig_p,
            r.resp_h,
            r.resp_p,
            r.proto,
            r.vlan,
            r.conn_state,
            r.orig_pkts,
            r.orig_bytes,
            r.resp_pkts,
            r.resp_bytes,
            r.orig_payload,
            r.resp_payload
        )
    }
}

/// `pcaptool info DIR`: the store's segments, time span, packets, bytes, flows and index size, and what it holds
/// that cannot be read (damaged segments, files of unfinished segments, quarantined segments).
pub(crate) fn info(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    // Damaged segments are described, not a failure: the rest is counted.
    let store = open_store(dir, true)?;
    let segs = store.segments();
    let packets: u64 = segs.iter().map(|s| s.stage1.packets).sum();
    let bytes: u64 = segs.iter().map(|s| s.stage1.bytes).sum();
    let flows = store.flows(&Need::All)?.len();
    let index: u64 = segs.iter().map(|s| s.stage1.index_bytes()).sum();
    let stored: u64 = segs.iter().map(|s| s.stage1.stored_bytes).sum();
    let elided: u64 = segs.iter().map(|s| s.stage1.elided_bytes).sum();
    let mut codecs: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for s in segs {
        *codecs.entry(s.stage1.codec.to_string()).or_default() += 1;
    }
    let t_min = segs.iter().filter(|s| s.stage1.packets > 0).map(|s| s.stage1.t_min).min();
    let t_max = segs.iter().map(|s| s.stage1.t_max).max();
    let unchecked = segs.iter().filter(|s| s.stage1.checksum_block().is_none()).count();
    let mut damaged = store.damaged().to_vec();
    damaged.extend(store.skipped().into_iter().filter(|d| !store.damaged().iter().any(|x| x.number == d.number)));
    let leftovers: Vec<String> = store.leftovers().iter().map(|p| p.display().to_string()).collect();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "store": dir, "segments": segs.len(), "packets": packets, "data_bytes": bytes, "flows": flows,
                "index_bytes": index, "stored_bytes": stored, "deduplicated_bytes": elided, "codecs": codecs, "first_ns": t_min, "last_ns": t_max,
                "linktypes": store.metas().iter().map(|m| m.0.linktype.0).collect::<std::collections::BTreeSet<_>>(),
                "segments_without_checksums": unchecked,
                "damaged": damaged.iter().map(|d| serde_json::json!({
                    "segment": d.number, "file": d.path, "offset": d.offset, "why": d.why,
                })).collect::<Vec<_>>(),
                "unfinished_files": leftovers,
                "quarantined": store.quarantined(),
            })
        );
    } else {
        outln!("store:        {}", dir.display());
        outln!("segments:     {}", segs.len());
        outln!("packets:      {packets}");
        outln!("data bytes:   {bytes}");
        if stored != bytes {
            let mix: Vec<String> = codecs.iter().map(|(c, n)| format!("{c} in {n}")).collect();
            outln!(
                "stored bytes: {stored} ({:.3} of the data; segments: {})",
                stored as f64 / bytes.max(1) as f64,
                mix.join(", ")
            );
        }
        if elided > 0 {
            outln!(
                "deduplicated: {elided} bytes of payload ({:.3} of the data) stored once for several flows",
                elided as f64 / bytes.max(1) as f64
            );
        }
        outln!("flows:        {flows}");
        outln!("index bytes:  {index} ({:.3}% of the data)", 100.0 * index as f64 / bytes.max(1) as f64);
        if let (Some(a), Some(b)) = (t_min, t_max) {
            outln!("time span:    {} .. {}", pcaptool_packet::Rfc3339(a), pcaptool_packet::Rfc3339(b));
        }
        if unchecked > 0 {
            outln!("unchecked:    {unchecked} segments of format version 2 have no packet data checksums");
        }
        for d in &damaged {
            outln!("damaged:      segment {}: {d}", d.number);
        }
        if !leftovers.is_empty() {
            outln!(
                "unfinished:   {} files of segments being written, or left by an interrupted writer (the next writer \
                 or `pcaptool repair` removes those)",
                leftovers.len()
            );
        }
        if store.quarantined() > 0 {
            outln!("quarantined:  {} segments set aside by `pcaptool repair`", store.quarantined());
        }
    }
    if damaged.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "pcaptool: warning: {} segments of {} are damaged and not counted: `pcaptool verify {}` tells more, \
             `pcaptool repair {}` sets them aside",
            damaged.len(),
            dir.display(),
            dir.display(),
            dir.display()
        );
        Ok(ExitCode::from(crate::cmd::EXIT_DAMAGED))
    }
}

/// A trace's temporary store, removed when dropped (and, if a killed run left one, by the next run under the
/// same directory).
pub(crate) struct WorkStore {
    dir: PathBuf,
}

/// The prefix of a temporary store's directory name; the process id follows.
const WORK_PREFIX: &str = ".pcaptool-work-";

impl WorkStore {
    /// Imports `traces` into a new store under `under`, in order, with the importer's progress bar; says what
    /// a damaged trace lost (the packets before the damage are `used`).
    pub(crate) fn import(traces: &[PathBuf], under: &Path, used: &str) -> anyhow::Result<WorkStore> {
        for trace in traces {
            if !trace.is_file() {
                anyhow::bail!("{} is neither a flow store (a directory) nor a trace file", trace.display());
            }
        }
        std::fs::create_dir_all(under).with_context(|| format!("cannot create {}", under.display()))?;
        // Stores a killed run left: their process is gone.
        for e in std::fs::read_dir(under).with_context(|| format!("cannot read {}", under.display()))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(WORK_PREFIX).and_then(|p| p.parse::<u32>().ok())
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let work = WorkStore { dir: under.join(format!("{WORK_PREFIX}{}", std::process::id())) };
        let _ = std::fs::remove_dir_all(&work.dir);
        let mut store = open_writer(&work.dir, true)?;
        for trace in traces {
            let total = std::fs::metadata(trace).ok().map(|m| m.len());
            let pb = progress::bytes(total, "import");
            let stats =
                store.import(trace, &ImportOptions::default(), &mut |at| pb.set_position(at)).with_context(|| {
                    format!("cannot read {} (into a temporary store in {})", trace.display(), under.display())
                })?;
            pb.finish_and_clear();
            if let Some(d) = &stats.damage {
                eprintln!(
                    "pcaptool: warning: {}: {}; the {} packets before it are {used}",
                    trace.display(),
                    Chain(d),
                    stats.packets
                );
            }
        }
        Ok(work)
    }

    /// The temporary store's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for WorkStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
