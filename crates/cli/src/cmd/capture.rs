//! `pcaptool capture -i IFACE[,IFACE...] --store DIR [FILTER]`: live capture into a flow store.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use pcaptool_capture::{Backend, CaptureConfig, CaptureError, Control, Event, Sink, SinkError, SinkPacket, Summary};
use pcaptool_flowstore::{ImportOptions, Incoming, Ingest, StoreMeta};
use pcaptool_packet::TsPrecision;
use pcaptool_query::Filter;

use crate::args::parse_size;

/// A duration: a number with ms, s, m or h (seconds if bare).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("`{s}` is not a duration (a number with ms, s, m or h)");
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1u64)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (s, 1000)
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(bad());
    }
    Ok(Duration::from_millis((v * mult_ms as f64) as u64))
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    match s {
        "auto" => Ok(Backend::Auto),
        "af_packet" | "af-packet" | "packet" => Ok(Backend::AfPacket),
        "af_xdp" | "af-xdp" | "xdp" => Ok(Backend::AfXdp),
        _ => Err(format!("`{s}` is not a backend: auto, af_packet or af_xdp")),
    }
}

/// Arguments of `pcaptool capture`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Interfaces to capture on, separated by commas; each is recorded as its own interface.
    #[arg(short = 'i', long = "interface", value_name = "IFACE[,IFACE...]", required = true, value_delimiter = ',')]
    interfaces: Vec<String>,
    /// The store directory (created if missing).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Keep only the packets this tcpdump filter matches.
    filter: Vec<String>,
    /// Bytes kept of each packet.
    #[arg(short = 's', long, default_value_t = 262_144)]
    snaplen: u32,
    /// Sockets (and capture threads) per interface, spread by flow hash; their packets are merged back into
    /// the order of arrival.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Close a segment at this many bytes of data (or once its packets take twice that in memory).
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = parse_size)]
    segment_size: u64,
    #[command(flatten)]
    storage: crate::args::Storage,
    /// Remove the oldest segments whole so that the store stays within this size.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_size: Option<u64>,
    /// Stop after this long (ms, s, m, h).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Stop after writing this many packets.
    #[arg(short = 'c', long)]
    packets: Option<u64>,
    /// Make what was captured visible to queries this often (segments close).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    flush_every: Duration,
    /// Kernel ring per socket.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size)]
    ring_size: u64,
    /// Buffers between capture and writing, in all (written once when the capture starts, so resident from
    /// then on; the first segment's 64 MiB of packet data and its per-packet records are too).
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = parse_size)]
    buffer_size: u64,
    /// auto, af_packet or af_xdp.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    backend: Backend,
    /// Print the statistics each second and the summary as JSON lines on standard output.
    #[arg(long)]
    json: bool,
    /// Serve the store while capturing, as `pcaptool serve` does, on this address: segments become queryable as
    /// they close (every --flush-every), and `GET /v1/stats` shows the capture's counters. Anything but loopback
    /// needs TLS and --tokens or --client-ca.
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
    /// Export each segment's flows to Parquet under this directory as it closes (as `pcaptool export --to
    /// parquet --out DIR` does, looking every --flush-every), and the last ones when the capture ends.
    #[arg(long, value_name = "DIR")]
    export: Option<PathBuf>,
    /// With --export: one row per packet too.
    #[arg(long, requires = "export")]
    export_packets: bool,
    /// With --export: the sensor's name, the first partition level (default: this host's name).
    #[arg(long, value_name = "NAME", requires = "export")]
    sensor: Option<String>,
    #[command(flatten)]
    service: crate::cmd::serve::ServiceArgs,
}

/// Memory a capture prepares for each of two segments' packets before it starts (`Ingest::reserve`: one fills
/// while the one before it is written): room for about 1.1 million 60-byte packets with their record headers and
/// what the store keeps beside each, or 64 MiB of 1,514-byte ones. A segment that grows past it faults its pages
/// in as it goes, once: later segments reuse it.
const SEGMENT_RESERVE: u64 = 96 << 20;

/// The flow store as a capture sink: each interface its own kind of segment.
struct StoreSink<'s> {
    ingest: Ingest<'s>,
    kinds: Vec<(StoreMeta, String)>,
    max_size: Option<u64>,
}

impl StoreSink<'_> {
    fn retain(&mut self) -> Result<(), SinkError> {
        if let Some(max) = self.max_size {
            self.ingest.retain_size(max)?;
        }
        Ok(())
    }
}

impl Sink for StoreSink<'_> {
    fn packet(&mut self, iface: u32, ts_ns: u64, wirelen: u32, data: &[u8]) -> Result<(), SinkError> {
        let (meta, name) = &self.kinds[iface as usize];
        self.ingest.push(*meta, name, ts_ns, wirelen, data).map_err(|e| Box::new(e) as SinkError)
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.ingest.flush()?;
        self.retain()
    }

    fn flush_soon(&mut self) -> Result<(), SinkError> {
        // The last segment is written while packets go on coming.
        self.ingest.close_open()?;
        self.retain()
    }

    fn packets(&mut self, packets: &mut dyn Iterator<Item = SinkPacket<'_>>) -> (u64, Result<(), SinkError>) {
        let before = self.ingest.packets();
        let kinds = &self.kinds;
        let r = self.ingest.push_all(packets.map(|p| {
            let (meta, name) = &kinds[p.iface as usize];
            Incoming { meta: *meta, iface_name: name, ts_ns: p.ts_ns, wirelen: p.wirelen, data: p.data }
        }));
        (self.ingest.packets() - before, r.map_err(|e| Box::new(e) as SinkError))
    }

    fn flows(&self) -> u64 {
        self.ingest.flows()
    }

    fn unsaved(&self, iface: u32) -> u64 {
        self.ingest.unsaved(iface)
    }
}

fn stats_json(s: &Summary, event: &str) -> serde_json::Value {
    let t = s.total();
    serde_json::json!({
        "event": event,
        "seconds": s.elapsed.as_secs_f64(),
        "backend": s.backend,
        "fallback": s.fallback,
        "received": t.received,
        "kernel_drops": t.kernel_drops,
        "ring_full": t.ring_full,
        "pcaptool_drops": t.dropped,
        "filtered": t.filtered,
        "written": t.written,
        "bytes": t.bytes,
        "not_written": t.unwritten,
        "malformed": t.malformed,
        "flows": s.flows,
        "interfaces": s.interfaces.iter().zip(&s.stats).map(|(i, st)| serde_json::json!({
            "name": i.name, "id": i.id, "linktype": i.linktype.0, "received": st.received,
            "kernel_drops": st.kernel_drops, "pcaptool_drops": st.dropped, "written": st.written,
        })).collect::<Vec<_>>(),
    })
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    args.storage.check()?;
    let text = args.filter.join(" ");
    let filter = if text.trim().is_empty() {
        None
    } else {
        Some(Filter::new(&text).map_err(|e| anyhow::anyhow!("invalid filter: {e}"))?)
    };
    if args.queues == 0 {
        bail!("--queues must be at least 1");
    }
    // Without the export feature, --export is refused before the store is made or the capture starts.
    #[cfg(not(feature = "export"))]
    if let Some(out) = &args.export {
        crate::cmd::export::CaptureExport::start(&args.store, out, None, false, args.flush_every)?;
    }
    let mut config = CaptureConfig::new(args.interfaces.clone());
    config.snaplen = args.snaplen;
    config.queues = args.queues;
    config.ring_bytes = usize::try_from(args.ring_size).unwrap_or(usize::MAX);
    config.buffer_bytes = usize::try_from(args.buffer_size).unwrap_or(usize::MAX);
    config.filter = filter;
    config.backend = args.backend;
    config.flush_every = args.flush_every;
    if let Some(max) = args.max_size
        && max < args.segment_size.saturating_mul(2)
    {
        bail!(
            "--max-size {max} is less than twice --segment-size {}: retention removes whole segments, so it would \
             remove what was just captured; give a larger --max-size or a smaller --segment-size",
            args.segment_size
        );
    }
    if args.serve.is_none() && args.service.given() {
        bail!("the service's options (TLS, tokens, limits) need --serve ADDR");
    }
    // Checked before the capture starts: a service that cannot start must not leave a capture running alone.
    let service_config = args.serve.map(|addr| args.service.config(addr, vec![args.store.clone()])).transpose()?;
    let ifaces = pcaptool_capture::probe(&config)?;
    let mut store = crate::cmd::store::open_writer(&args.store, true)?;
    let service = match service_config {
        Some(c) => {
            let service = Arc::new(pcaptool_serve::Service::open_with(&c.sources, c.index_memory)?);
            let (bg, addr) = crate::cmd::serve::Background::start(c, service.clone())?;
            eprintln!("pcaptool: serving {} on {addr} while capturing", args.store.display());
            Some((bg, service))
        }
        None => None,
    };
    let counters = service.as_ref().map(|(_, s)| s.clone());
    let exporter = match &args.export {
        Some(out) => Some(crate::cmd::export::CaptureExport::start(
            &args.store,
            out,
            args.sensor.clone(),
            args.export_packets,
            args.flush_every,
        )?),
        None => None,
    };
    let kinds = ifaces
        .iter()
        .map(|i| {
            let meta = StoreMeta {
                linktype: i.linktype,
                snaplen: args.snaplen,
                precision: TsPrecision::Nano,
                swapped: false,
                iface: i.id,
            };
            (meta, i.name.clone())
        })
        .collect();
    let opts = ImportOptions {
        segment_bytes: args.segment_size,
        max_size: args.max_size,
        compress: args.storage.compress,
        block_size: args.storage.block_size,
        dedup: args.storage.dedup,
        ..ImportOptions::default()
    };
    let mut sink = StoreSink { ingest: store.ingest(&opts)?, kinds, max_size: args.max_size };
    // The first segment's memory, written before packets arrive (later segments reuse it).
    sink.ingest.reserve(args.segment_size.min(SEGMENT_RESERVE) as usize);

    // The first SIGINT or SIGTERM asks for a clean stop (flush, close, summary); a second one ends the process at
    // once (exit status 1), for a store that cannot be flushed.
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&flag))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&flag)))
            .context("cannot install the signal handlers")?;
    }
    let control = Control::with_flag(flag);
    if let Some(n) = args.packets {
        control.limit_packets(n);
    }
    if let Some(d) = args.duration {
        control.limit_time(d);
    }
    let names: Vec<String> = ifaces.iter().map(|i| format!("{} ({})", i.name, i.linktype)).collect();
    let auto = args.backend == Backend::Auto;
    let terminal = std::io::stderr().is_terminal();
    let json = args.json;
    let store_dir = args.store.display().to_string();
    let mut events = |e: Event<'_>| match e {
        Event::Started(s) => {
            // Say which backend runs, and why AF_XDP does not when `auto` chose AF_PACKET.
            let why = match &s.fallback {
                Some(f) => format!(" ({f}; fell back to AF_PACKET)"),
                None if auto && !cfg!(feature = "xdp") => " (AF_XDP is not built in)".to_string(),
                None => String::new(),
            };
            eprintln!(
                "pcaptool: capturing on {} with {}{why} into {store_dir}; Ctrl-C stops",
                names.join(", "),
                s.backend
            );
        }
        Event::Stats(s) => {
            if let Some(service) = &counters {
                service.set_capture_stats(stats_json(s, "stats"));
            }
            if json {
                // A reader that went away must not stop the capture: the statistics are only a view of it.
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", stats_json(s, "stats")).and_then(|()| out.flush());
            } else if terminal {
                let t = s.total();
                eprint!(
                    "\r{:>7.1} s  {} received  {} written  {} MB  {} flows  drops: {} kernel, {} pcaptool   ",
                    s.elapsed.as_secs_f64(),
                    t.received,
                    t.written,
                    t.bytes / 1_000_000,
                    s.flows,
                    t.kernel_drops,
                    t.dropped
                );
            }
        }
    };
    let result = pcaptool_capture::run(&config, &mut sink, &control, &mut events);
    if terminal && !json {
        eprintln!();
    }
    let finished = sink.ingest.finish();
    if let Some((bg, service)) = service {
        match &result {
            Ok(s) => service.set_capture_stats(stats_json(s, "summary")),
            Err(CaptureError::Sink { summary, .. }) => service.set_capture_stats(stats_json(summary, "summary")),
            Err(_) => {}
        }
        // The service answers its running queries (up to --drain-seconds), then stops.
        if let Err(e) = bg.stop() {
            eprintln!("pcaptool: warning: the service ended with an error: {e:#}");
        }
    }
    let summary = match result {
        Ok(s) => s,
        Err(CaptureError::Sink { source, summary }) => {
            if json {
                outln!("{}", stats_json(&summary, "summary"));
            }
            bail!(
                "cannot write to the store {}: {}; {summary}",
                args.store.display(),
                pcaptool_packet::Chain(&*source)
            );
        }
        Err(e) => return Err(e.into()),
    };
    let (_, segments) = finished.with_context(|| format!("cannot write to the store {}", args.store.display()))?;
    // The capture is on disk whatever the export does: an export that fails says how to finish it.
    let exported = exporter.map(|e| {
        let out = e.out().to_path_buf();
        let done = e.finish().with_context(|| {
            format!(
                "the capture is stored, but its export is not complete: `pcaptool export {} --to parquet --out {}` \
                 finishes it",
                args.store.display(),
                out.display()
            )
        });
        (out, done)
    });
    let (exported, export_error) = match exported {
        Some((out, Ok(done))) => (Some((out, done)), None),
        Some((_, Err(e))) => (None, Some(e)),
        None => (None, None),
    };
    if json {
        let mut line = stats_json(&summary, "summary");
        if let Some((out, (segments, flows))) = &exported {
            line["export"] = serde_json::json!({ "out": out, "segments": segments, "flows": flows });
        }
        outln!("{line}");
    } else {
        eprintln!("pcaptool: {summary}; {segments} segments written to {}", args.store.display());
        if let Some((out, (segments, flows))) = &exported {
            eprintln!("pcaptool: {flows} flow rows of {segments} segments exported to {}", out.display());
        }
    }
    if let Some(e) = export_error {
        return Err(e);
    }
    let t = summary.total();
    if t.kernel_drops + t.dropped > 0 {
        eprintln!(
            "pcaptool: warning: {} packets were dropped ({} by the kernel: a bigger --ring-size helps; {} by pcaptool: \
             the store could not keep up, a bigger --buffer-size helps)",
            t.kernel_drops + t.dropped,
            t.kernel_drops,
            t.dropped
        );
    }
    Ok(ExitCode::SUCCESS)
}
