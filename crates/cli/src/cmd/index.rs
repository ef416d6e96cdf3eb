//! `pcaptool index TRACE...`: writes the sidecar index (`TRACE.ptidx`) of each trace, in parallel, chunk by
//! chunk; `pcaptool query` then uses it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use pcaptool_index::{PAGE, sidecar_path};
use pcaptool_packet::Chain;

use crate::progress;

/// Arguments of `pcaptool index`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The captures to index (pcap or pcapng, possibly compressed; a directory of captures or a pattern such as
    /// `'dir/*.pcap'` gives its files); each gets `TRACE.ptidx` beside it.
    #[arg(required = true, num_args = 1..)]
    traces: Vec<PathBuf>,
    /// Threads (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Packets per chunk (a multiple of 1024): memory use grows with it, index size shrinks a little.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    chunk_packets: u32,
    /// Print what was built as JSON lines.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.chunk_packets == 0 || !(args.chunk_packets as usize).is_multiple_of(PAGE) {
        bail!("--chunk-packets must be a positive multiple of {PAGE}");
    }
    if let Some(n) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build_global();
    }
    let mut traces = Vec::new();
    for input in crate::inputs::expand(&args.traces)? {
        match input {
            crate::inputs::Input::Trace(t) => traces.push(t),
            crate::inputs::Input::Store(d) => {
                bail!("{} is a flow store, which keeps its own indexes: index traces", d.display())
            }
        }
    }
    let mut code = ExitCode::SUCCESS;
    for trace in &traces {
        let out = sidecar_path(trace);
        let total = std::fs::metadata(trace).ok().map(|m| m.len());
        let pb = progress::bytes(total, "index");
        let started = Instant::now();
        let stats = pcaptool_engine::index_trace(trace, Some(args.chunk_packets), &|at| pb.set_position(at))?;
        pb.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        let per_packet = stats.index_bytes as f64 / stats.packets.max(1) as f64;
        let share = 100.0 * stats.index_bytes as f64 / stats.trace_bytes.max(1) as f64;
        if args.json {
            outln!(
                "{}",
                serde_json::json!({
                    "trace": trace, "index": out, "packets": stats.packets, "chunks": stats.chunks,
                    "keys": stats.keys, "index_bytes": stats.index_bytes, "trace_bytes": stats.trace_bytes,
                    "bytes_per_packet": per_packet, "percent_of_trace": share, "seconds": secs,
                    "damage": stats.damage.as_ref().map(|d| Chain(d).to_string()),
                })
            );
        } else {
            outln!(
                "{}: {} packets, {} chunks, {} keys; index {} bytes ({per_packet:.3} B/packet, {share:.3}% of the trace) in {secs:.2} s",
                out.display(),
                stats.packets,
                stats.chunks,
                stats.keys,
                stats.index_bytes,
            );
        }
        if let Some(d) = &stats.damage {
            eprintln!("pcaptool: error: {}; the {} packets before it were indexed", Chain(d), stats.packets);
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}
