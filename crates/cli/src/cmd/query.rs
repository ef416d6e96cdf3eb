//! `pcaptool query SOURCE FILTER`: the packets of a trace or a flow store that a tcpdump filter selects, written
//! (`-w`), counted (`--count`) or explained (`--explain`). The engine (`pcaptool_engine`) plans and answers;
//! this file turns flags into a request and the outcome into lines.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use pcaptool_engine::{OpenOptions, Outcome, Request, Source, SourceKind, TraceSink, WriteOptions};
use pcaptool_packet::Chain;

use crate::args::{Compress, Format, parse_time_arg};
use crate::cmd::{same_file, warn_skipped};

/// Arguments of `pcaptool query`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The source, then the filter: the capture to search (pcap or pcapng, possibly compressed; `-` for standard
    /// input), a flow store's directory, a directory of captures, a pattern (`'dir/*.pcap'`), a sensor's address
    /// (`https://HOST:PORT`, a `pcaptool serve`), `@FILE` for a file of sensors, or several of these separated by
    /// commas. The words after it are the filter, in tcpdump's language (joined with spaces, as tcpdump does).
    /// Several sources: name them all before `--` and put the filter after it (`pcaptool query a.pcap b.pcapng
    /// -- tcp port 80`), or give each with -r; their answers are merged by timestamp into one.
    #[arg(value_name = "SOURCE [FILTER]", required_unless_present = "read")]
    words: Vec<String>,
    /// The filter, when the words before `--` are all sources.
    #[arg(last = true, value_name = "FILTER")]
    after: Vec<String>,
    /// A source to read (repeat for several, as tcpdump's -r; the words are then all filter).
    #[arg(short = 'r', long = "read", value_name = "SOURCE")]
    read: Vec<PathBuf>,
    /// Write the matching packets here (`-` for standard output): pcap when they have one link type, pcapng
    /// when they have several; the name's extension (`.pcapng`, `.pcap`, `.gz`, `.zst`, `.lz4`) decides the
    /// format and compression unless --format/--compress do.
    #[arg(short = 'w', long = "write", value_name = "OUT")]
    write: Option<PathBuf>,
    /// The output container (default: from the name, else the source's; pcap holds one link type).
    #[arg(long, short = 'F', value_enum, requires = "write")]
    format: Option<Format>,
    /// The output compression (default: from the name, else none).
    #[arg(long, value_enum, requires = "write")]
    compress: Option<Compress>,
    /// Print the number of matching packets.
    #[arg(long)]
    count: bool,
    /// Stop after this many matching packets.
    #[arg(long, short = 'c', value_name = "N")]
    limit: Option<u64>,
    /// Accepted for tcpdump's habit: the listing is numeric already.
    #[arg(short = 'n', hide = true)]
    numeric: bool,
    /// Show how the filter is evaluated (parsed form, plan, what the index or the store's stages read, the tests
    /// per link type) without running it.
    #[arg(long)]
    explain: bool,
    /// Scan the trace even if an index exists (and do not check the index).
    #[arg(long)]
    scan: bool,
    /// Print counts and explanations as JSON, and list packets as JSON lines (their decoded fields).
    #[arg(long)]
    json: bool,
    /// Only packets at or after this time (RFC 3339 or epoch seconds).
    #[arg(long = "after", value_parser = parse_time_arg)]
    after_time: Option<u64>,
    /// Only packets before this time.
    #[arg(long, value_parser = parse_time_arg)]
    before: Option<u64>,
    /// With a flow store: the packets of this flow (an id from `pcaptool flows`), in order, with one read per
    /// segment it spans.
    #[arg(long, value_name = "ID")]
    flow: Option<u64>,
    /// Threads for the scan (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// With a flow store: answer from the undamaged segments when some are damaged, with a warning and exit
    /// status 3 (by default a damaged segment fails the query).
    #[arg(long)]
    skip_damaged: bool,
    #[command(flatten)]
    remote: crate::sources::RemoteArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (sources, words) = crate::inputs::split_words(&args.words, &args.after, &args.read);
    if let Some(w) = &args.write
        && w.as_os_str() != "-"
        && let Some(s) = sources.iter().find(|s| same_file(s, w))
    {
        bail!("{} is both a source and the output: choose another output file", s.display());
    }
    if let Some(n) = args.threads {
        // A second call (tests run several queries in one process) keeps the first pool.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build_global();
    }
    let text = words.join(" ");
    let mut req = Request::new();
    if !text.is_empty() || !sources.iter().all(|s| s.is_dir()) {
        let filter = crate::inputs::parse_filter(&words)?;
        req = req.with_filter(filter);
    }
    req.after = args.after_time;
    req.before = args.before;
    req.limit = args.limit;
    req.flow = args.flow;
    req.count_only = args.count && args.write.is_none();
    let opts = OpenOptions::new().use_index(!args.scan).skip_damaged(args.skip_damaged);
    let source = crate::sources::open(&sources, &opts, &args.remote)?;
    if args.explain {
        crate::explain::print(&source.plan(&req)?, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let to_stdout = args.write.as_ref().is_some_and(|w| w.as_os_str() == "-");
    let mut wopts = WriteOptions::new();
    if let Some(f) = args.format {
        wopts = wopts.container(f.container());
    }
    if let Some(c) = args.compress {
        wopts = wopts.compression(c.compression());
    }
    let progress = crate::progress::Bar::new("query");
    let outcome = match &args.write {
        Some(_) if to_stdout => source.run_with_progress(&req, &mut TraceSink::stdout(wopts), &progress)?,
        Some(w) => source.run_with_progress(&req, &mut TraceSink::create(w, wopts)?, &progress)?,
        None if args.count => source.run_with_progress(&req, &mut pcaptool_engine::Counter::default(), &progress)?,
        None => {
            let mut listing =
                crate::listing::Listing::new(std::io::BufWriter::new(std::io::stdout().lock()), args.json);
            source.run_with_progress(&req, &mut listing, &progress)?
        }
    };
    if args.count {
        let msg = count_line(&source, &text, &outcome, args.json);
        if to_stdout {
            eprintln!("{msg}");
        } else {
            outln!("{msg}");
        }
    }
    Ok(finish(&source, &outcome))
}

/// The `--count` line: the number, or JSON with what the index did.
fn count_line(source: &Source, filter: &str, o: &Outcome, json: bool) -> String {
    if !json {
        return o.matched.to_string();
    }
    let key = match source.kind() {
        SourceKind::Store => "store",
        SourceKind::Trace | SourceKind::IndexedTrace => "trace",
        _ => "source",
    };
    let mut v = serde_json::json!({ key: source.path(), "filter": filter, "packets": o.packets, "matched": o.matched });
    if let Some(c) = o.candidates {
        v["index_candidates"] = c.into();
    }
    if let Some(c) = o.counted_from_index {
        v["counted_from_index"] = c.into();
    }
    if !o.skipped.is_empty() {
        v["skipped_segments"] = o.skipped.iter().map(|d| d.number).collect::<Vec<_>>().into();
    }
    if !o.failed.is_empty() {
        v["failed"] = o.failed.iter().map(|(name, why)| serde_json::json!({ "source": name, "error": why })).collect();
    }
    v.to_string()
}

/// Warnings for what the answer had to leave out, and the exit status that says so.
pub(crate) fn finish(source: &Source, o: &Outcome) -> ExitCode {
    if let Some(e) = &o.damage {
        eprintln!("pcaptool: error: {}; the {} matching packets before it were kept", Chain(e), o.matched);
        return ExitCode::FAILURE;
    }
    for (name, why) in &o.failed {
        eprintln!("pcaptool: warning: left out {name}: {why}");
    }
    let code = warn_skipped(source.path(), &o.skipped);
    if o.failed.is_empty() {
        return code;
    }
    eprintln!("pcaptool: warning: the answer is from the sources that answered only ({} left out)", o.failed.len());
    ExitCode::from(crate::cmd::EXIT_DAMAGED)
}
