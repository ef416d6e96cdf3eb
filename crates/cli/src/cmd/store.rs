//! The flow store's commands: `pcaptool import TRACE... --store DIR`, `pcaptool flows DIR [FILTER]`, and the
//! store side of `pcaptool query DIR ...` and `pcaptool info DIR`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use pcaptool_flowstore::{Flow, ImportOptions, Store, StoreError, StoredPacket};
use pcaptool_packet::{Field, Need, PcapNgWriter, PcapWriter, Pred};
use pcaptool_query::Filter;
use pcaptool_query::plan::necessary;

use crate::progress;

/// A byte count with an optional K, M, G or T suffix (powers of 1024).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        Some((i, 'T' | 't')) => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("`{s}` is not a size (bytes, or a number with K, M, G or T)"))
}

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
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = parse_size)]
    segment_size: u64,
    /// After importing, remove the oldest segments whole until the store takes at most this much.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_size: Option<u64>,
    /// Import a trace the store already holds whole again, as new packets (by default it is refused; an
    /// interrupted import of a trace resumes after what it stored).
    #[arg(long)]
    allow_duplicates: bool,
    /// Print what was imported as JSON lines.
    #[arg(long)]
    json: bool,
}

/// Opens a store for reading (which changes nothing in it); `skip_damaged` makes its reads leave damaged
/// segments out instead of failing.
pub(crate) fn open_store(dir: &Path, skip_damaged: bool) -> anyhow::Result<Store> {
    let mut store = Store::open(dir).with_context(|| format!("cannot open the store {}", dir.display()))?;
    store.set_skip_damaged(skip_damaged);
    Ok(store)
}

/// Opens a store for writing (taking its writer lock) and says what opening it repaired.
pub(crate) fn open_writer(dir: &Path, create: bool) -> anyhow::Result<Store> {
    let store = if create { Store::create(dir) } else { Store::open_writer(dir) }
        .with_context(|| format!("cannot open the store {} for writing", dir.display()))?;
    for r in store.repairs() {
        eprintln!("pcaptool: store {}: {r}", dir.display());
    }
    Ok(store)
}

/// A read's error, with what to do when it is damage.
pub(crate) fn read_error(dir: &Path, e: StoreError) -> anyhow::Error {
    if e.is_damage() {
        anyhow::anyhow!(
            "{e}; the answer would miss packets: --skip-damaged answers from the other segments, `pcaptool verify {}` \
             checks the whole store, `pcaptool repair {}` sets damaged segments aside",
            dir.display(),
            dir.display()
        )
    } else {
        anyhow::Error::from(e)
    }
}

/// Warns of the damaged segments a read left out; the exit status that says so.
pub(crate) fn warn_skipped(store: &Store) -> ExitCode {
    let skipped = store.skipped();
    for d in &skipped {
        eprintln!("pcaptool: warning: left out segment {}: {d}", d.number);
    }
    if skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "pcaptool: warning: the answer is from the undamaged segments only ({} left out): `pcaptool repair {}` \
             sets damaged segments aside",
            skipped.len(),
            store.dir().display()
        );
        ExitCode::from(crate::cmd::EXIT_DAMAGED)
    }
}

pub(crate) fn import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    let mut store = open_writer(&args.store, true)?;
    let opts = ImportOptions {
        segment_bytes: args.segment_size,
        max_size: args.max_size,
        allow_duplicates: args.allow_duplicates,
        ..ImportOptions::default()
    };
    let mut code = ExitCode::SUCCESS;
    for trace in &args.traces {
        let total = std::fs::metadata(trace).ok().map(|m| m.len());
        let pb = progress::bytes(total, "import");
        let started = Instant::now();
        let stats = store
            .import(trace, &opts, &mut |at| pb.set_position(at))
            .with_context(|| format!("cannot import {} into {}", trace.display(), args.store.display()))?;
        pb.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        if args.json {
            outln!(
                "{}",
                serde_json::json!({
                    "trace": trace, "store": args.store, "packets": stats.packets, "segments": stats.segments,
                    "already_stored": stats.already_stored, "removed_segments": stats.removed, "seconds": secs,
                    "over_max_size": stats.over_max_size,
                    "damage": stats.damage.as_ref().map(|d| d.to_string()),
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
            eprintln!("pcaptool: error: {d}; the {} packets before it were imported", stats.packets);
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

/// The output of a store query.
enum Out {
    Pcap(PcapWriter<Box<dyn Write>>),
    PcapNg(PcapNgWriter<Box<dyn Write>>),
}

/// What `pcaptool query DIR` was asked besides the filter.
pub(crate) struct QueryOpts<'a> {
    pub(crate) flow: Option<u64>,
    pub(crate) write: Option<&'a Path>,
    pub(crate) count: bool,
    pub(crate) limit: Option<u64>,
    pub(crate) explain: bool,
    /// Packets at or after this time (ns).
    pub(crate) after: Option<u64>,
    /// Packets before this time (ns).
    pub(crate) before: Option<u64>,
    /// Answer from the undamaged segments when some are damaged (with a warning and exit status 3).
    pub(crate) skip_damaged: bool,
}

/// `pcaptool query DIR FILTER` (or `--flow ID`): the store's packets the filter matches, in the original order.
pub(crate) fn query(dir: &Path, filter: Option<&Filter>, o: &QueryOpts<'_>) -> anyhow::Result<ExitCode> {
    let QueryOpts { flow, write, count, limit, explain, after, before, skip_damaged } = *o;
    let store = open_store(dir, skip_damaged)?;
    let metas = store.metas();
    if metas.is_empty() {
        bail!("the store {} holds no packets: import traces with `pcaptool import`", dir.display())
    }
    let mut need = filter.map_or(Need::All, necessary);
    if after.is_some() || before.is_some() {
        let window = Pred::range(
            Field::Time,
            u128::from(after.unwrap_or(0)),
            before.map_or(u128::from(u64::MAX), |b| u128::from(b.saturating_sub(1))),
        );
        need = Need::and(vec![need, Need::Pred(window)]);
    }
    if explain {
        let mut passed = 0;
        let (mut flows, mut no_flow, mut bytes) = (0u64, 0u64, 0u64);
        for seg in store.segments().iter().filter(|s| s.stage1.may_match(&need)) {
            passed += 1;
            let entries = seg.stage2().and_then(|s2| s2.candidates(&need)).map_err(|e| read_error(dir, e))?;
            for e in entries.iter().filter(|e| e.packets > 0) {
                if e.is_no_flow() {
                    no_flow += u64::from(e.packets);
                } else {
                    flows += 1;
                }
                bytes += e.data_len;
            }
        }
        outln!("store:     {} ({} segments, {} packets)", dir.display(), store.segments().len(), store.packets());
        outln!("condition: {need}");
        outln!(
            "stage 1:   {passed} of {} segments may hold matches (time range, Bloom filters)",
            store.segments().len()
        );
        outln!(
            "stage 2:   {flows} flows and {no_flow} packets of no flow to read, {bytes} bytes (one read each, \
             checked against its checksums); the filter runs on their packets"
        );
        for d in store.damaged() {
            outln!("damaged:   segment {} cannot be read ({d}): the query fails unless --skip-damaged", d.number);
        }
        return Ok(ExitCode::SUCCESS);
    }
    // One matcher per link type and byte order (the filter must compile for each, as a scan of the traces would
    // require); per kind of packet, its matcher, snapshot length and output interface.
    let mut matchers: Vec<((pcaptool_packet::LinkType, bool), pcaptool_query::Matcher)> = Vec::new();
    let mut kinds: std::collections::HashMap<pcaptool_flowstore::StoreMeta, (Option<usize>, usize, u32)> =
        std::collections::HashMap::new();
    for (i, (m, _)) in metas.iter().enumerate() {
        let target = (m.linktype.base(), m.swapped);
        let matcher = match filter {
            Some(f) => Some(match matchers.iter().position(|x| x.0 == target) {
                Some(at) => at,
                None => {
                    let c = f
                        .compile(pcaptool_query::Target { linktype: target.0, swapped: target.1 })
                        .map_err(|e| anyhow::anyhow!("invalid filter for link type {}: {e}", m.linktype))?;
                    matchers.push((target, c));
                    matchers.len() - 1
                }
            }),
            None => None,
        };
        kinds.insert(*m, (matcher, crate::cmd::query::snap_for(m.linktype, m.snaplen), i as u32));
    }
    let to_stdout = write.is_some_and(|w| w.as_os_str() == "-");
    let out_name = match write {
        Some(w) if !to_stdout => w.display().to_string(),
        _ => "standard output".to_string(),
    };
    let cannot_write = || format!("cannot write {out_name}");
    let mut out = match write {
        None => None,
        Some(w) => {
            let sink: Box<dyn Write> = if to_stdout {
                Box::new(BufWriter::with_capacity(1 << 20, io::stdout().lock()))
            } else {
                Box::new(BufWriter::with_capacity(
                    1 << 20,
                    File::create(w).with_context(|| format!("cannot create {}", w.display()))?,
                ))
            };
            // pcap when the store holds one kind of packet (what tcpdump writes); pcapng with an interface per
            // kind otherwise.
            Some(match &metas[..] {
                [(m, _)] => {
                    Out::Pcap(PcapWriter::new(sink, m.linktype, m.snaplen, m.precision).with_context(cannot_write)?)
                }
                _ => {
                    let mut w = PcapNgWriter::new(sink).with_context(cannot_write)?;
                    for (m, name) in &metas {
                        w.add_interface(
                            m.linktype,
                            m.snaplen,
                            m.precision,
                            Some(name.as_str()).filter(|n| !n.is_empty()),
                        )
                        .with_context(cannot_write)?;
                    }
                    Out::PcapNg(w)
                }
            })
        }
    };
    let limit = limit.unwrap_or(u64::MAX);
    let mut matched = 0u64;
    let mut failure: Option<anyhow::Error> = None;
    let mut each = |q: &StoredPacket<'_>| -> bool {
        let (ts, wirelen) = (q.ts_ns, q.wirelen);
        if after.is_some_and(|a| ts < a) || before.is_some_and(|b| ts >= b) {
            return true;
        }
        let Some(&(matcher, snap, iface)) = kinds.get(&q.meta) else { return true };
        let data = &q.data[..q.data.len().min(snap)];
        if matcher.is_some_and(|m| !matchers[m].1.matches(data, wirelen, ts)) {
            return true;
        }
        matched += 1;
        let written = match out.as_mut() {
            None => Ok(()),
            Some(Out::Pcap(w)) => w.write_packet(ts, wirelen, data),
            Some(Out::PcapNg(w)) => w.write_packet(iface, ts, wirelen, data),
        };
        if let Err(e) = written {
            failure = Some(anyhow::Error::from(e).context(cannot_write()));
            return false;
        }
        matched < limit
    };
    let result = match flow {
        Some(id) => store
            .flow(id, &mut |q| {
                each(q);
            })
            .map(|found| (found, None)),
        None => store.query(&need, &mut each).map(|st| (true, Some(st))),
    };
    let finish = |out: Option<Out>| -> anyhow::Result<()> {
        let sink = match out {
            None => return Ok(()),
            Some(Out::Pcap(w)) => w.finish(),
            Some(Out::PcapNg(w)) => w.finish(),
        };
        sink.with_context(cannot_write)?.flush().with_context(cannot_write)
    };
    let outcome = result.map_err(|e| read_error(dir, e)).and_then(|r| match failure.take() {
        Some(e) => Err(e),
        None => Ok(r),
    });
    let (found, _stats) = match outcome {
        Ok(r) => r,
        Err(e) => {
            drop(out);
            if let Some(w) = write
                && !to_stdout
            {
                let _ = std::fs::remove_file(w);
            }
            return Err(e);
        }
    };
    finish(out)?;
    if !found {
        if let Some(w) = write
            && !to_stdout
        {
            let _ = std::fs::remove_file(w);
        }
        bail!(
            "the store {} has no flow {}: `pcaptool flows {}` lists them",
            dir.display(),
            flow.unwrap_or(0),
            dir.display()
        );
    }
    if count {
        if to_stdout { eprintln!("{matched}") } else { outln!("{matched}") }
    }
    Ok(warn_skipped(&store))
}

/// Arguments of `pcaptool flows`.
#[derive(Debug, clap::Args)]
pub(crate) struct FlowsArgs {
    /// The store directory.
    store: PathBuf,
    /// Only the flows that may hold a packet this tcpdump filter matches (by their addresses, ports, protocol,
    /// VLAN and time).
    filter: Vec<String>,
    /// One JSON object per flow, one per line.
    #[arg(long)]
    json: bool,
    /// List the flows of the undamaged segments when some are damaged (with a warning and exit status 3).
    #[arg(long)]
    skip_damaged: bool,
}

pub(crate) fn flows(args: FlowsArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args.store, args.skip_damaged)?;
    let need = if args.filter.is_empty() {
        Need::All
    } else {
        let f = Filter::new(&args.filter.join(" ")).map_err(|e| anyhow::anyhow!("invalid filter: {e}"))?;
        necessary(&f)
    };
    let flows = store.flows(&need).map_err(|e| read_error(&args.store, e))?;
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
    let (oh, op) = f.orig_endpoint();
    let (rh, rp) = f.resp_endpoint();
    let ts = format!("{}.{:09}", f.first_ns / 1_000_000_000, f.first_ns % 1_000_000_000);
    let dur = f.last_ns.saturating_sub(f.first_ns);
    let dur = format!("{}.{:09}", dur / 1_000_000_000, dur % 1_000_000_000);
    if json {
        writeln!(
            o,
            "{}",
            serde_json::json!({
                "id": f.id, "ts": ts, "duration": dur, "orig_h": oh.to_string(), "orig_p": op,
                "resp_h": rh.to_string(), "resp_p": rp, "proto": f.key.proto.0, "vlan": f.key.vlan,
                "conn_state": f.state.name(), "orig_pkts": f.orig.packets, "orig_bytes": f.orig.bytes,
                "resp_pkts": f.resp.packets, "resp_bytes": f.resp.bytes, "orig_payload": f.orig.payload,
                "resp_payload": f.resp.payload, "orig_flags": f.orig.flags, "resp_flags": f.resp.flags,
            })
        )
    } else {
        writeln!(
            o,
            "{}\t{ts}\t{dur}\t{oh}\t{op}\t{rh}\t{rp}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            f.id,
            f.key.proto.0,
            f.key.vlan,
            f.state.name(),
            f.orig.packets,
            f.orig.bytes,
            f.resp.packets,
            f.resp.bytes,
            f.orig.payload,
            f.resp.payload
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
                "index_bytes": index, "first_ns": t_min, "last_ns": t_max,
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
