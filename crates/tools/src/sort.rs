//! A trace in time order, as `reordercap` writes it, in bounded memory: records are gathered into runs of at most
//! a memory budget, each run sorted (stably: packets of equal time keep their order) and, when there is more than
//! one, written to a temporary pcapng file; the runs are then merged by time into the output. A trace in order
//! already is copied in one pass.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use pcaptool_engine::{Layout, Sink};
use pcaptool_packet::{Compressor, FileFormat, Interface, LinkType, OutputFormat, Record, TraceReader, TraceWriter};

use crate::pipe::{native, next, open};
use crate::{Copied, ToolError};

/// One record held in memory.
struct Held {
    ts_ns: u64,
    wirelen: u32,
    iface: u32,
    linktype: LinkType,
    data: Vec<u8>,
}

impl Held {
    fn of(r: &Record<'_>) -> Held {
        Held { ts_ns: r.ts_ns, wirelen: r.wirelen, iface: r.iface, linktype: r.linktype, data: r.data.to_vec() }
    }

    fn record(&self) -> Record<'_> {
        Record {
            ts_ns: self.ts_ns,
            has_ts: true,
            wirelen: self.wirelen,
            iface: self.iface,
            linktype: self.linktype,
            offset: 0,
            record_len: 0,
            data: &self.data,
        }
    }
}

/// What [`sort`] did.
#[derive(Debug, Default)]
pub struct Sorted {
    /// Records read and written.
    pub copied: Copied,
    /// Packets earlier than the packet before them in the input (as reordercap counts).
    pub out_of_order: u64,
    /// Runs spilled to temporary files (0: sorted in memory).
    pub runs: usize,
}

/// Sorts `input` by time into `sink`, holding at most about `budget` bytes of packets in memory; runs go to
/// temporary files in `work`.
pub fn sort(
    input: &Path,
    sink: &mut dyn Sink,
    budget: usize,
    work: &Path,
    progress: &dyn Fn(u64),
) -> Result<Sorted, ToolError> {
    let mut reader = open(input)?;
    let complete = matches!(reader.format(), Some(FileFormat::Pcap { .. }));
    let layout_ifaces = reader.interfaces().to_vec();
    sink.begin(&Layout { interfaces: &layout_ifaces, native: native(&reader), complete })?;
    let mut out = Sorted::default();
    let mut run: Vec<Held> = Vec::new();
    let mut held = 0usize;
    let mut runs: Vec<PathBuf> = Vec::new();
    let mut last = 0u64;
    let result = (|| -> Result<Vec<Interface>, ToolError> {
        while let Some((rec, _)) = next(&mut reader, &mut out.copied, progress) {
            if rec.ts_ns < last {
                out.out_of_order += 1;
            }
            last = rec.ts_ns;
            held += rec.data.len() + 64;
            run.push(Held::of(&rec));
            if held >= budget {
                runs.push(spill(&mut run, work, runs.len(), reader.interfaces())?);
                held = 0;
            }
        }
        let ifaces = reader.interfaces().to_vec();
        run.sort_by_key(|h| h.ts_ns);
        if runs.is_empty() {
            for h in &run {
                sink.record(&h.record(), &ifaces)?;
                out.copied.written += 1;
            }
            return Ok(ifaces);
        }
        if !run.is_empty() {
            runs.push(spill(&mut run, work, runs.len(), &ifaces)?);
        }
        out.runs = runs.len();
        out.copied.written = merge_runs(&runs, sink, &ifaces)?;
        Ok(ifaces)
    })();
    for r in &runs {
        let _ = std::fs::remove_file(r);
    }
    match result {
        Ok(ifaces) => {
            sink.finish(&ifaces)?;
            Ok(out)
        }
        Err(e) => {
            sink.abandon();
            Err(e)
        }
    }
}

/// Sorts `run` and writes it to a temporary pcapng file holding every interface (so that interface numbers stay
/// those of the input).
fn spill(run: &mut Vec<Held>, work: &Path, n: usize, ifaces: &[Interface]) -> Result<PathBuf, ToolError> {
    run.sort_by_key(|h| h.ts_ns);
    let path = work.join(format!(".pcaptool-sort-{}-{n}.pcapng", std::process::id()));
    let io = |source| ToolError::Io { path: path.clone(), source };
    let file = std::fs::File::create(&path).map_err(io)?;
    let wio = |e: pcaptool_packet::WriteError| ToolError::Io { path: path.clone(), source: std::io::Error::other(e) };
    let mut w =
        TraceWriter::new(Compressor::None(std::io::BufWriter::new(file)), OutputFormat::PcapNg(None)).map_err(wio)?;
    w.declare(ifaces).map_err(wio)?;
    for h in run.iter() {
        w.write(&h.record(), ifaces).map_err(wio)?;
    }
    let inner = w.finish(ifaces).map_err(wio)?.finish().map_err(io)?;
    inner.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    run.clear();
    Ok(path)
}

/// Merges sorted runs by time (ties: the earlier run first, which keeps the input's order) into `sink`.
fn merge_runs(runs: &[PathBuf], sink: &mut dyn Sink, ifaces: &[Interface]) -> Result<u64, ToolError> {
    let mut readers: Vec<TraceReader> = runs.iter().map(|r| open(r)).collect::<Result<_, _>>()?;
    let mut heads: Vec<Option<Held>> = Vec::with_capacity(runs.len());
    let mut heap = BinaryHeap::new();
    let next = |r: &mut TraceReader, path: &Path| -> Result<Option<Held>, ToolError> {
        match r.next_record() {
            None => Ok(None),
            Some(Ok(rec)) => Ok(Some(Held::of(&rec))),
            Some(Err(source)) => Err(ToolError::Read { path: path.to_path_buf(), source }),
        }
    };
    for (i, r) in readers.iter_mut().enumerate() {
        let h = next(r, &runs[i])?;
        if let Some(h) = &h {
            heap.push(Reverse((h.ts_ns, i)));
        }
        heads.push(h);
    }
    let mut written = 0;
    while let Some(Reverse((_, i))) = heap.pop() {
        let h = heads[i].take().expect("a head for each heap entry");
        sink.record(&h.record(), ifaces)?;
        written += 1;
        if let Some(n) = next(&mut readers[i], &runs[i])? {
            heap.push(Reverse((n.ts_ns, i)));
            heads[i] = Some(n);
        }
    }
    Ok(written)
}
