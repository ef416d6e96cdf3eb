//! The trace tools: `merge`, `split`, `sort`, `dedup`, `anonymise` and `stats` (pcaptool_tools does the work;
//! merging is the engine's). Each streams with bounded memory, keeps nanoseconds and interfaces, writes its
//! output atomically enough that a failure leaves no partial file, and says what it did on standard error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use pcaptool_engine::{Request, TraceSink, WriteOptions};
use pcaptool_packet::Chain;
use pcaptool_tools::anon::{AnonOptions, Anonymizer, parse_key};
use pcaptool_tools::dedup::{Dedup, Window};
use pcaptool_tools::split::Rule;
use pcaptool_tools::{Copied, copy_through};

use crate::args::{Compress, Format, parse_size};
use crate::cmd::same_file;
use crate::progress;

/// Where and how an output is written.
#[derive(Debug, clap::Args)]
pub(crate) struct Output {
    /// The output file (`-` for standard output); its extension (`.pcap`, `.pcapng`, `.gz`, `.zst`, `.lz4`)
    /// decides the format and compression unless --format/--compress do.
    #[arg(short = 'w', long = "write", value_name = "OUT")]
    write: PathBuf,
    /// The output container (default: from the name, else the input's; pcap holds one link type).
    #[arg(long, short = 'F', value_enum)]
    format: Option<Format>,
    /// The output compression (default: from the name, else none).
    #[arg(long, value_enum)]
    compress: Option<Compress>,
}

impl Output {
    fn sink(&self, inputs: &[&Path]) -> anyhow::Result<TraceSink> {
        if self.write.as_os_str() != "-"
            && let Some(i) = inputs.iter().find(|i| same_file(i, &self.write))
        {
            bail!("{} is both an input and the output: choose another output file", i.display());
        }
        let mut o = WriteOptions::new();
        if let Some(f) = self.format {
            o = o.container(f.container());
        }
        if let Some(c) = self.compress {
            o = o.compression(c.compression());
        }
        Ok(match self.write.as_os_str() == "-" {
            true => TraceSink::stdout(o),
            false => TraceSink::create(&self.write, o)?,
        })
    }

    fn name(&self) -> String {
        match self.write.as_os_str() == "-" {
            true => "standard output".into(),
            false => self.write.display().to_string(),
        }
    }
}

/// Says what a copy did; a damaged input is an error after the packets before the damage were written.
fn report(input: &Path, out: &str, c: &Copied, what: &str) -> ExitCode {
    eprintln!("{}: {} packets read, {} written to {out}{what}", input.display(), c.read, c.written);
    match &c.damage {
        Some(d) => {
            eprintln!("pcaptool: error: {}; the packets before it were written", Chain(d));
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    }
}

fn total(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len())
}

/// Arguments of `pcaptool merge`.
#[derive(Debug, clap::Args)]
pub(crate) struct MergeArgs {
    /// The traces to merge (files, directories of captures, patterns such as `'dir/*.pcap'`).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    #[command(flatten)]
    out: Output,
}

pub(crate) fn merge(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let inputs: Vec<PathBuf> = crate::inputs::expand(&args.inputs)?
        .into_iter()
        .map(|i| match i {
            crate::inputs::Input::Trace(p) => Ok(p),
            crate::inputs::Input::Store(d) => {
                bail!(
                    "{} is a flow store: merge traces (`pcaptool query STORE -w OUT` writes a store's packets)",
                    d.display()
                )
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let mut sink = args.out.sink(&inputs.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    // Merged by the engine: by timestamp, ties in the order given, interfaces of every input, pcapng when the
    // link types differ.
    let opts = pcaptool_engine::OpenOptions::new().use_index(false);
    let source = crate::sources::open(&inputs, &opts, &Default::default())?;
    let req = Request::new().with_filter(pcaptool_query::Filter::new("")?);
    let outcome = source
        .run_with_progress(&req, &mut sink, &progress::Bar::new("merge"))
        .map_err(|e| crate::cmd::name_output(e.into(), Some(args.out.name())))?;
    eprintln!("{} traces merged: {} packets written to {}", inputs.len(), outcome.matched, args.out.name());
    Ok(crate::cmd::query::finish(&source, &outcome))
}

/// Arguments of `pcaptool sort`.
#[derive(Debug, clap::Args)]
pub(crate) struct SortArgs {
    /// The trace to sort by time.
    input: PathBuf,
    #[command(flatten)]
    out: Output,
    /// Packet bytes held in memory at most; a larger trace is sorted in runs spilled beside the output.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    memory: u64,
}

pub(crate) fn sort(args: SortArgs) -> anyhow::Result<ExitCode> {
    let mut sink = args.out.sink(&[&args.input])?;
    let work = match args.out.write.parent() {
        Some(p) if !p.as_os_str().is_empty() && args.out.write.as_os_str() != "-" => p.to_path_buf(),
        _ => std::env::temp_dir(),
    };
    let pb = progress::bytes(total(&args.input), "sort");
    let budget = usize::try_from(args.memory).unwrap_or(usize::MAX);
    let s = pcaptool_tools::sort::sort(&args.input, &mut sink, budget, &work, &|at| pb.set_position(at))
        .map_err(|e| crate::cmd::name_output(e.into(), Some(args.out.name())))?;
    pb.finish_and_clear();
    let what = format!(" ({} were out of order; {} runs spilled)", s.out_of_order, s.runs);
    Ok(report(&args.input, &args.out.name(), &s.copied, &what))
}

/// Arguments of `pcaptool dedup`.
#[derive(Debug, clap::Args)]
pub(crate) struct DedupArgs {
    /// The trace.
    input: PathBuf,
    #[command(flatten)]
    out: Output,
    /// Compare each packet with the packets before it, this many in all counting itself (editcap -D; 5 is
    /// editcap -d).
    #[arg(long, value_name = "N", default_value_t = 5, conflicts_with = "time_window")]
    window: usize,
    /// Compare each packet with the packets at most this many seconds before it instead (editcap -w).
    #[arg(long, value_name = "SECONDS")]
    time_window: Option<f64>,
}

pub(crate) fn dedup(args: DedupArgs) -> anyhow::Result<ExitCode> {
    let window = match args.time_window {
        Some(s) if s.is_finite() && s >= 0.0 => Window::Time((s * 1e9).round() as u64),
        Some(_) => bail!("--time-window takes seconds (0 or more)"),
        None => Window::Packets(args.window),
    };
    let mut sink = args.out.sink(&[&args.input])?;
    let mut d = Dedup::new(window);
    let mut removed = 0u64;
    let pb = progress::bytes(total(&args.input), "dedup");
    let c = copy_through(&args.input, &mut sink, &|at| pb.set_position(at), &mut |rec, _, write| {
        if d.is_duplicate(rec.ts_ns, rec.data) {
            removed += 1;
        } else {
            write(rec)?;
        }
        Ok(true)
    })
    .map_err(|e| crate::cmd::name_output(e.into(), Some(args.out.name())))?;
    pb.finish_and_clear();
    Ok(report(&args.input, &args.out.name(), &c, &format!(" ({removed} duplicates removed)")))
}

/// Arguments of `pcaptool anonymise`.
#[derive(Debug, clap::Args)]
pub(crate) struct AnonArgs {
    /// The trace.
    input: PathBuf,
    #[command(flatten)]
    out: Output,
    /// The key: a file holding 64 hexadecimal digits or 32 bytes. The same key maps addresses the same way in
    /// every file; keep it secret (who has it can test guesses).
    #[arg(long, value_name = "FILE", required_unless_present = "key")]
    key_file: Option<PathBuf>,
    /// The key as 64 hexadecimal digits (visible to other users of this machine: prefer --key-file).
    #[arg(long, value_name = "HEX", conflicts_with = "key_file")]
    key: Option<String>,
    /// Map Ethernet addresses too (prefix-preserving; multicast and local bits and broadcast kept).
    #[arg(long)]
    macs: bool,
    /// Cut each packet after its innermost transport header (the wire length is kept).
    #[arg(long)]
    truncate_payload: bool,
}

pub(crate) fn anonymise(args: AnonArgs) -> anyhow::Result<ExitCode> {
    let key = match (&args.key_file, &args.key) {
        (Some(f), _) => {
            parse_key(&std::fs::read(f).with_context(|| format!("cannot read the key file {}", f.display()))?)
                .with_context(|| format!("{} holds no key", f.display()))?
        }
        (None, Some(k)) => parse_key(k.as_bytes())?,
        (None, None) => bail!("give the key with --key-file FILE"),
    };
    let mut sink = args.out.sink(&[&args.input])?;
    let mut a = Anonymizer::new(&key, AnonOptions { macs: args.macs, truncate_payload: args.truncate_payload });
    let mut buf = Vec::new();
    let pb = progress::bytes(total(&args.input), "anonymise");
    let c = copy_through(&args.input, &mut sink, &|at| pb.set_position(at), &mut |rec, _, write| {
        buf.clear();
        buf.extend_from_slice(rec.data);
        let keep = a.packet(rec.linktype, &mut buf);
        write(&pcaptool_packet::Record { data: &buf[..keep], ..*rec })?;
        Ok(true)
    })
    .map_err(|e| crate::cmd::name_output(e.into(), Some(args.out.name())))?;
    pb.finish_and_clear();
    Ok(report(&args.input, &args.out.name(), &c, ""))
}

/// Arguments of `pcaptool split`.
#[derive(Debug, clap::Args)]
pub(crate) struct SplitArgs {
    /// The trace.
    input: PathBuf,
    /// The outputs' name: `out/part.pcap` writes `out/part-00000.pcap`, `out/part-00001.pcap`, ...; the
    /// extension decides format and compression.
    #[arg(short = 'w', long = "write", value_name = "PREFIX.EXT")]
    write: PathBuf,
    /// A new file after this many packets (editcap -c).
    #[arg(long, value_name = "N", group = "rule")]
    packets: Option<u64>,
    /// A new file before the packet that would take one past this size (16 bytes a record and its captured
    /// bytes; K, M, G units).
    #[arg(long, value_name = "SIZE", group = "rule", value_parser = parse_size)]
    bytes: Option<u64>,
    /// A new file every this many seconds from the first packet's time (editcap -i).
    #[arg(long, value_name = "SECONDS", group = "rule")]
    interval: Option<f64>,
    /// This many files, each flow (addresses, protocol and ports, both directions) whole in one of them.
    #[arg(long, value_name = "N", group = "rule", value_parser = clap::value_parser!(u32).range(1..=4096))]
    flows: Option<u32>,
    /// Print the files written as JSON lines.
    #[arg(long)]
    json: bool,
}

pub(crate) fn split(args: SplitArgs) -> anyhow::Result<ExitCode> {
    let rule = match (args.packets, args.bytes, args.interval, args.flows) {
        (Some(n), ..) if n > 0 => Rule::Packets(n),
        (_, Some(b), ..) => Rule::Bytes(b),
        (_, _, Some(s), _) if s.is_finite() && s > 0.0 => Rule::Interval((s * 1e9).round() as u64),
        (_, _, _, Some(k)) => Rule::Flows(k),
        _ => bail!("say how to split: --packets N, --bytes SIZE, --interval SECONDS (more than 0) or --flows N"),
    };
    let name = args.write.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (stem, ext) = match name.split_once('.') {
        Some((s, e)) if !s.is_empty() && !e.is_empty() => (s.to_string(), e.to_string()),
        _ => bail!("-w needs a name with an extension, such as out/part.pcap (files part-00000.pcap, ...)"),
    };
    let prefix = args.write.with_file_name(stem);
    if let Some(dir) = prefix.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let pb = progress::bytes(total(&args.input), "split");
    let (files, c) = pcaptool_tools::split::split(&args.input, &prefix, &ext, rule, &|at| pb.set_position(at))?;
    pb.finish_and_clear();
    if args.json {
        for f in &files {
            outln!("{}", serde_json::json!({ "file": f }));
        }
    }
    let what = format!(" ({} files)", files.len());
    Ok(report(&args.input, &format!("{}-*.{ext}", prefix.display()), &c, &what))
}

/// Arguments of `pcaptool stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatsArgs {
    /// The traces (each counted on its own; directories of captures and patterns give their files).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// A filter to count (repeat for several): `NAME=FILTER`, or the filter alone (then named by itself).
    #[arg(long = "filter", short = 'f', value_name = "[NAME=]FILTER")]
    filters: Vec<String>,
    /// Count per interval of this many seconds from the first packet's time too.
    #[arg(long, value_name = "SECONDS")]
    interval: Option<f64>,
    /// Print JSON (one object a trace, one line each).
    #[arg(long)]
    json: bool,
}

/// `NAME=FILTER` as a name and a filter; anything else (`ip[9]=6` among them: a name is letters, digits, `_`
/// and `-`) is a filter named by itself.
fn named_filter(f: &str) -> (String, String) {
    let is_name = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match f.split_once('=') {
        Some((n, t)) if is_name(n.trim()) && !t.starts_with('=') => (n.trim().to_string(), t.trim().to_string()),
        _ => (f.to_string(), f.to_string()),
    }
}

pub(crate) fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let filters: Vec<(String, String)> = args.filters.iter().map(|f| named_filter(f)).collect();
    let interval = match args.interval {
        Some(s) if s.is_finite() && s > 0.0 => Some((s * 1e9).round() as u64),
        Some(_) => bail!("--interval takes seconds (more than 0)"),
        None => None,
    };
    let mut code = ExitCode::SUCCESS;
    for input in crate::inputs::expand(&args.inputs)? {
        let path = input.path();
        let pb = progress::bytes(total(path), "stats");
        let s = pcaptool_tools::stats::stats(path, &filters, interval, &|at| pb.set_position(at))?;
        pb.finish_and_clear();
        if args.json {
            let mut v = serde_json::to_value(&s)?;
            v["trace"] = serde_json::json!(path);
            v["damage"] = serde_json::json!(s.damage.as_ref().map(|d| Chain(d).to_string()));
            outln!("{v}");
        } else {
            outln!("{}", path.display());
            let head: Vec<String> = std::iter::once("packets\tbytes".to_string())
                .chain(s.names.iter().map(|n| format!("{n}:packets\t{n}:bytes")))
                .collect();
            let row = |i: &pcaptool_tools::stats::Interval| {
                std::iter::once(format!("{}\t{}", i.all.packets, i.all.bytes))
                    .chain(i.filters.iter().map(|c| format!("{}\t{}", c.packets, c.bytes)))
                    .collect::<Vec<_>>()
                    .join("\t")
            };
            if interval.is_some() {
                outln!("start\t{}", head.join("\t"));
                for i in &s.intervals {
                    outln!("{}\t{}", pcaptool_packet::Rfc3339(i.start_ns), row(i));
                }
            }
            outln!("total\t{}", head.join("\t"));
            outln!("\t{}", row(&s.total));
        }
        if let Some(d) = &s.damage {
            eprintln!("pcaptool: error: {}; the packets before it were counted", Chain(d));
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::named_filter;

    #[test]
    fn filters_are_named_only_by_names() {
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(named_filter("web=tcp port 443"), pair("web", "tcp port 443"));
        assert_eq!(named_filter("dns-v4 = udp port 53"), pair("dns-v4", "udp port 53"));
        assert_eq!(named_filter("ip[9]=6"), pair("ip[9]=6", "ip[9]=6"));
        assert_eq!(named_filter("tcp[13]&2!=0"), pair("tcp[13]&2!=0", "tcp[13]&2!=0"));
        assert_eq!(named_filter("len==100"), pair("len==100", "len==100"));
        assert_eq!(named_filter("tcp"), pair("tcp", "tcp"));
    }
}
