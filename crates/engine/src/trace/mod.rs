//! A trace as a source: opened once (its header read, its index loaded and checked), answered by a scan or
//! through the index, whichever costs less.

mod indexed;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pcaptool_index::{Estimated, IndexFile, IndexView, Selection, compression_code, sidecar_path};
use pcaptool_packet::{
    FileFormat, Interface, LinkType, Need, PacketFields, Record, Records, TraceReader, TsPrecision, precision_for,
};
use pcaptool_query::Filter;
use pcaptool_query::plan::{Field, IndexSource, Plan as QueryPlan, Pred};
use rayon::prelude::*;

use crate::matchers::{Compiled, Matchers, cut, snapshot};
use crate::plan::{IndexPlan, Plan, Strategy};
use crate::sink::{Layout, NativeFormat};
use crate::{Error, Outcome, Progress, Request, Sink, SourceKind};

self_cell::self_cell!(
    /// An index file and its view (the view borrows the file's bytes and keeps what it loaded between answers).
    struct Indexed {
        owner: IndexFile,
        #[not_covariant]
        dependent: IndexView,
    }
);

/// A trace file (or a stream), with its index when it has one and it was asked for.
pub(crate) struct TraceSource {
    path: PathBuf,
    /// The reader opened with the source, for the first answer (a stream can be read only once).
    first: Mutex<Option<TraceReader>>,
    /// A long-lived source's reader, whose mapping every answer shares (`OpenOptions::long_lived`).
    shared: Option<Mutex<TraceReader>>,
    format: Option<FileFormat>,
    interfaces: Vec<Interface>,
    swapped: bool,
    /// Bytes of the trace file (`None` for a stream).
    size: Option<u64>,
    index: Option<Indexed>,
    /// Why the index beside the trace is not used (it is scanned instead).
    unused_index: Option<pcaptool_index::IndexError>,
    /// The programs compiled for the filters asked so far.
    compiled: Compiled,
}

impl std::fmt::Debug for TraceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSource")
            .field("path", &self.path)
            .field("index", &self.index.as_ref().map(|i| i.borrow_owner().path().to_path_buf()))
            .finish_non_exhaustive()
    }
}

/// Whether `path` names standard input.
fn is_stream(path: &Path) -> bool {
    path.as_os_str() == "-"
}

impl TraceSource {
    /// Opens a trace and reads its header; with `use_index`, loads its index (`TRACE.ptidx`) if there is one and
    /// checks it against the trace as it is now.
    pub(crate) fn open(path: &Path, use_index: bool, long_lived: bool) -> Result<TraceSource, Error> {
        let open_error = |source| Error::Open { path: path.to_path_buf(), source };
        let mut reader = TraceReader::open(path).map_err(open_error)?;
        reader.read_header().map_err(open_error)?;
        // An index that cannot be used (the trace changed since, the index is damaged or of another format) is
        // left aside: the scan gives the same answer, and the caller tells the user how to rebuild it.
        let (index, unused_index) = match use_index && !is_stream(path) {
            true => match open_index(path, &reader) {
                Ok(index) => (index, None),
                Err(Error::Index { source, .. }) => (None, Some(source)),
                Err(e) => return Err(e),
            },
            false => (None, None),
        };
        let shared = if long_lived { reader.share().map(Mutex::new) } else { None };
        Ok(TraceSource {
            shared,
            path: path.to_path_buf(),
            format: reader.format(),
            interfaces: reader.interfaces().to_vec(),
            swapped: reader.format().is_some_and(|f| f.swapped()),
            size: std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len()),
            first: Mutex::new(Some(reader)),
            index,
            unused_index,
            compiled: Compiled::default(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn kind(&self) -> SourceKind {
        if self.index.is_some() { SourceKind::IndexedTrace } else { SourceKind::Trace }
    }

    pub(crate) fn unused_index(&self) -> Option<&pcaptool_index::IndexError> {
        self.unused_index.as_ref()
    }

    /// The index file, if the trace has one loaded.
    pub(crate) fn index_file(&self) -> Option<&IndexFile> {
        self.index.as_ref().map(|i| i.borrow_owner())
    }

    /// A reader at the first record: the one opened with the source, or a new one.
    fn reader(&self) -> Result<TraceReader, Error> {
        let open_error = |source| Error::Open { path: self.path.clone(), source };
        if let Some(shared) = &self.shared
            && let Some(mut reader) = shared.lock().unwrap_or_else(|e| e.into_inner()).share()
        {
            reader.read_header().map_err(open_error)?;
            return Ok(reader);
        }
        if let Some(r) = self.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Ok(r);
        }
        if is_stream(&self.path) {
            return Err(Error::Consumed { path: self.path.clone() });
        }
        let mut reader = TraceReader::open(&self.path).map_err(open_error)?;
        reader.read_header().map_err(open_error)?;
        Ok(reader)
    }

    /// The container an output keeps by default.
    fn native(&self) -> NativeFormat {
        match self.format {
            Some(FileFormat::Pcap { precision, .. }) => NativeFormat::Pcap(precision),
            Some(FileFormat::PcapNg { .. }) => NativeFormat::PcapNg,
            None => {
                NativeFormat::Pcap(self.interfaces.first().map_or(TsPrecision::Micro, |i| precision_for(i.tsresol)))
            }
        }
    }

    fn filter(req: &Request) -> Filter {
        req.filter.clone().unwrap_or_else(|| Filter::new("").expect("the empty filter parses"))
    }

    /// Matchers for the link types declared before the first packet (as tcpdump, a filter invalid for one of
    /// them is refused).
    fn matchers<'f>(&'f self, filter: &'f Filter) -> Result<Matchers<'f>, Error> {
        let mut m = Matchers::new(filter, &self.compiled);
        for i in &self.interfaces {
            m.get(i.linktype, self.swapped)?;
        }
        Ok(m)
    }

    pub(crate) fn plan(&self, req: &Request) -> Result<Plan, Error> {
        req.check()?;
        if req.flow.is_some() {
            return Err(Error::FlowNeedsStore { path: self.path.clone() });
        }
        let filter = Self::filter(req);
        let mut matchers = self.matchers(&filter)?;
        if self.interfaces.is_empty() {
            // A stream whose first interface is not known yet: explain for Ethernet.
            matchers.get(LinkType::ETHERNET, self.swapped)?;
        }
        let (qplan, strategy, sentence, index) = match &self.index {
            None => {
                let qplan = pcaptool_query::plan::plan(&filter, None);
                let s = qplan.describe();
                (qplan, Strategy::Scan, s, None)
            }
            Some(ix) => ix.with_dependent(|_, view| -> Result<_, Error> {
                let choice = self.choose(req, &filter, view)?;
                let facts = index_plan(view, &choice)?;
                Ok((choice.qplan.clone(), choice.strategy, choice.sentence.clone(), Some(facts)))
            })?,
        };
        Ok(Plan {
            source: self.path.display().to_string(),
            kind: self.kind(),
            filter: filter.text().to_string(),
            parsed: filter.expr().map_or_else(|| "(empty: every packet)".to_string(), |e| e.to_string()),
            index_condition: req.windowed(qplan.need.clone()).to_string(),
            strategy,
            plan: sentence,
            exact: qplan.exact,
            index,
            store: None,
            link_types: matchers.plans(),
            parts: Vec::new(),
        })
    }

    pub(crate) fn run(&self, req: &Request, sink: &mut dyn Sink, progress: &dyn Progress) -> Result<Outcome, Error> {
        req.check()?;
        if req.flow.is_some() {
            return Err(Error::FlowNeedsStore { path: self.path.clone() });
        }
        let filter = Self::filter(req);
        let matchers = self.matchers(&filter)?;
        let mut reader = self.reader()?;
        let layout = Layout {
            interfaces: reader.interfaces(),
            native: self.native(),
            complete: matches!(self.format, Some(FileFormat::Pcap { .. })),
        };
        if !req.count_only {
            sink.begin(&layout)?;
        }
        let mut run = Run { source: self, req, matchers, sink, progress };
        let result = match &self.index {
            None => run.scan(&mut reader),
            Some(ix) => ix.with_dependent(|_, view| run.execute(&filter, &mut reader, view)),
        };
        let outcome = result?;
        if !req.count_only {
            let ifaces = reader.interfaces().to_vec();
            run.sink.finish(&ifaces)?;
        }
        Ok(outcome)
    }

    /// The planner's choice, and the engine's cost check of it.
    fn choose(&self, req: &Request, filter: &Filter, view: &IndexView<'_>) -> Result<Choice, Error> {
        // Estimating a needle also selects it (one walk of the index for both), unless only a count is asked or a
        // time window changes the condition selected.
        let select = !req.count_only && !req.has_window();
        let index = ViewSource { view, select, estimated: RefCell::new(None) };
        let qplan = pcaptool_query::plan::plan(filter, Some(&index as &dyn IndexSource));
        // Counting an exact condition: the index decides every packet whose fields it knows; only the others are
        // read (a time window is checked on packets, so it needs them read).
        if req.count_only && qplan.exact && !req.has_window() {
            let sentence =
                format!("{}; counted from the index, reading only packets it cannot decide", qplan.describe());
            return Ok(Choice { qplan, strategy: Strategy::IndexCount, sentence, selection: None });
        }
        let part = match &qplan.index {
            Some(part) if qplan.use_index => req.windowed(part.clone()),
            _ => {
                let sentence = qplan.describe();
                return Ok(Choice { qplan, strategy: self.bulk(req, view), sentence, selection: None });
            }
        };
        // The cost check, first from the estimate (selecting many candidates costs time of its own): candidates
        // spread over the trace touch `1 - (1 - p)^k` of its blocks of `k` packets.
        let mut touched = 1.0;
        if !view.file().compressed()
            && let Some((est, total)) = qplan.estimate
        {
            let per_block = total as f64 / view.blocks().max(1) as f64;
            touched = 1.0 - (1.0 - est as f64 / total.max(1) as f64).powf(per_block);
            if touched * DENSE_BYTES_DEN as f64 > DENSE_BYTES_NUM as f64 {
                let sentence = format!(
                    "scan every packet (the index's estimate of {est} of {total} packets would touch about {:.0}% \
                     of the trace's blocks: reading them in place costs more than a scan)",
                    touched * 100.0
                );
                return Ok(Choice { qplan, strategy: self.bulk(req, view), sentence, selection: None });
            }
        }
        // Few candidates are selected on this thread (see `FEW`).
        let many = qplan.estimate.is_none_or(|(est, _)| est >= FEW);
        let sel = match index.estimated.take() {
            Some(est) if est.need() == &part => view.select_estimated(est, many),
            _ => view.select_with(&part, many),
        }
        .map_err(|e| index_error(view, e))?;
        // The cost check: candidates whose blocks take most of the trace cost more to read in place than a scan
        // (which decides every packet in parallel batches) costs.
        // (A compressed trace is streamed whole either way: the index then only spares the filter.)
        // (Counted only where the estimate comes near the bound: a needle's few blocks cannot.)
        if let Some(size) = self.size.filter(|_| !view.file().compressed() && touched * 4.0 > 1.0) {
            let to_read = view.bytes_to_read(&sel).map_err(|e| index_error(view, e))?;
            if to_read.saturating_mul(DENSE_BYTES_DEN) > size.saturating_mul(DENSE_BYTES_NUM) {
                let sentence = format!(
                    "scan every packet (the index's {} candidates lie in {to_read} of the trace's {size} bytes: \
                     reading them in place costs more than a scan)",
                    sel.count()
                );
                return Ok(Choice { qplan, strategy: self.bulk(req, view), sentence, selection: None });
            }
        }
        let sentence = qplan.describe();
        Ok(Choice { qplan, strategy: Strategy::Index, sentence, selection: Some(sel) })
    }
}

impl TraceSource {
    /// How a request the index does not narrow is scanned: by chunks in parallel over a mapped trace (the
    /// index gives every chunk's first record; measured 1.17× the batched scan on the generated trace,
    /// docs/BENCHMARKS.md), else record by record.
    fn bulk(&self, req: &Request, view: &IndexView<'_>) -> Strategy {
        if self.size.is_some() && !view.file().compressed() && req.limit.is_none() {
            Strategy::ChunkScan
        } else {
            Strategy::Scan
        }
    }
}

/// Fewer candidates than this are selected and read on the calling thread: handing them to the pool's threads
/// and waiting for them costs more than their help (on the real-traffic trace in a long-lived source, measured
/// p50: 82 candidates 0.135 ms on the calling thread, 0.199 ms in parallel; 399 candidates 0.429 ms against 0.362
/// ms).
pub(crate) const FEW: u64 = 256;

/// Above this share of the trace's bytes or blocks (`NUM/DEN`), the blocks holding an index's candidates cost
/// more to read in place than a scan: measured on the generated 10M-packet trace (docs/BENCHMARKS.md), the index
/// path wins up to about 80% of the bytes (`vlan`, 78%: 0.74 s against a scan's 0.81 s) and loses above (`ip6`,
/// 86%: 0.84 s against 0.71 s); three quarters keeps a margin.
const DENSE_BYTES_NUM: u64 = 3;
const DENSE_BYTES_DEN: u64 = 4;

/// What the engine decided for a request over an indexed trace.
struct Choice {
    qplan: QueryPlan,
    strategy: Strategy,
    sentence: String,
    /// The index's candidates, when they are read.
    selection: Option<Selection>,
}

fn index_plan(view: &IndexView<'_>, choice: &Choice) -> Result<IndexPlan, Error> {
    let reads = match &choice.selection {
        Some(s) => Some((s.chunks.len(), s.count(), view.bytes_to_read(s).map_err(|e| index_error(view, e))?)),
        None => None,
    };
    Ok(IndexPlan {
        path: view.file().path().display().to_string(),
        packets: view.packets(),
        chunks: view.chunks().len(),
        bytes: view.file().size_bytes(),
        uses: choice.qplan.index.as_ref().map(|n| n.to_string()),
        estimate: choice.qplan.estimate.map(|e| e.0),
        chunks_touched: reads.map(|r| r.0),
        candidates: reads.map(|r| r.1),
        trace_bytes_to_read: reads.map(|r| r.2),
    })
}

/// An index error, with the index's path.
pub(crate) fn index_error(view: &IndexView<'_>, source: pcaptool_index::IndexError) -> Error {
    Error::Index { path: view.file().path().to_path_buf(), source }
}

/// Candidates an estimate selects with it, per chunk at most (see `IndexView::estimate_select`): a needle's.
const SELECT_WITH_ESTIMATE: u64 = 4096;

/// The index as the planner sees it.
struct ViewSource<'a, 'b> {
    view: &'a IndexView<'b>,
    /// Whether estimating a condition also selects its candidates where they are few.
    select: bool,
    /// The last condition estimated that way.
    estimated: RefCell<Option<Estimated>>,
}

impl IndexSource for ViewSource<'_, '_> {
    fn packets(&self) -> u64 {
        self.view.packets()
    }
    fn has_field(&self, field: Field) -> bool {
        self.view.has_field(field)
    }
    fn estimate(&self, pred: &Pred) -> Option<u64> {
        // A damaged part gives no estimate here; selecting then reports the damage.
        self.view.estimate(pred).ok()
    }
    fn estimate_need(&self, need: &Need) -> Option<u64> {
        if !self.select {
            return self.view.estimate_need(need).ok();
        }
        let est = self.view.estimate_select(need, SELECT_WITH_ESTIMATE).ok()?;
        let n = est.estimate();
        *self.estimated.borrow_mut() = Some(est);
        Some(n)
    }
}

/// The trace's index, if it has one, checked against the trace as it is now.
fn open_index(trace: &Path, reader: &TraceReader) -> Result<Option<Indexed>, Error> {
    let path = sidecar_path(trace);
    if !path.exists() {
        return Ok(None);
    }
    let error = |source| Error::Index { path: path.clone(), source };
    let file = IndexFile::open(&path).map_err(error)?;
    let snap = u32::try_from(snapshot(reader.interfaces())).unwrap_or(u32::MAX);
    file.check_trace(trace, Some(compression_code(reader.compression())), snap, reader.as_bytes()).map_err(error)?;
    // A pcap of a link type whose header fields the index read: a field it does not know was cut off by the
    // snapshot length (a pcapng may declare interfaces of other link types later).
    let cut = matches!(reader.format(), Some(FileFormat::Pcap { .. }))
        && reader.interfaces().iter().all(|i| {
            PacketFields::new(i.linktype, &[], 0, 0).has_header_fields()
                && (file.fields_by_link_type() || i.linktype == LinkType::ETHERNET)
        });
    Indexed::try_new(file, |f| f.view().map(|v| if cut { v.cut_fields_fail() } else { v })).map(Some).map_err(error)
}

/// One answer in progress.
struct Run<'r, 'f> {
    source: &'r TraceSource,
    req: &'r Request,
    matchers: Matchers<'f>,
    sink: &'r mut dyn Sink,
    progress: &'r dyn Progress,
}

/// Records per batch handed to the thread pool.
const BATCH: usize = 16_384;

impl Run<'_, '_> {
    fn limit(&self) -> u64 {
        self.req.limit.unwrap_or(u64::MAX)
    }

    /// Gives one match to the sink; false when the sink stops the answer.
    fn give(&mut self, rec: &Record<'_>, ifaces: &[Interface], out: &mut Outcome) -> Result<bool, Error> {
        if self.req.count_only {
            return Ok(true);
        }
        let go_on = self.sink.record(rec, ifaces)?;
        if !go_on {
            out.stopped = true;
        }
        Ok(go_on)
    }

    /// Every record in order, the filter on each (batches decided in parallel over a mapped trace).
    fn scan(&mut self, reader: &mut TraceReader) -> Result<Outcome, Error> {
        let limit = self.limit();
        let snap = snapshot(reader.interfaces());
        let swapped = self.source.swapped;
        let mut stats = Outcome::default();
        self.progress.start(self.source.size);
        if let Some(bytes) = reader.as_bytes() {
            // Memory-mapped: walk records, decide a batch in parallel, give its matches in order.
            let mut records = Records::new(bytes).with_path(&self.source.path);
            let mut batch: Vec<Record<'_>> = Vec::with_capacity(BATCH);
            let mut hits: Vec<bool> = Vec::with_capacity(BATCH);
            'outer: loop {
                self.req.go_on()?;
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
                    self.matchers.get(*lt, swapped)?;
                }
                let req = self.req;
                {
                    let decide = self.matchers.decider();
                    let keep = |r: &Record<'_>| req.in_window(r.ts_ns) && decide(r);
                    batch.par_iter().with_min_len(1024).map(keep).collect_into_vec(&mut hits);
                }
                for (rec, hit) in batch.iter().zip(&hits) {
                    stats.packets += 1;
                    if !*hit {
                        continue;
                    }
                    stats.matched += 1;
                    if !self.give(rec, records.interfaces(), &mut stats)? || stats.matched >= limit {
                        break 'outer;
                    }
                }
                self.progress.at(batch.last().map_or(0, |r| r.offset));
                if stats.damage.is_some() {
                    break;
                }
            }
        } else {
            // A stream (standard input, compressed file): one record at a time.
            loop {
                self.req.go_on()?;
                let (rec, ifaces) = match reader.next_with_interfaces() {
                    None => break,
                    Some(Err(e)) => {
                        stats.damage = Some(e);
                        break;
                    }
                    Some(Ok((rec, ifaces))) => (cut(rec, snap), ifaces),
                };
                stats.packets += 1;
                if !self.req.in_window(rec.ts_ns)
                    || !self.matchers.get(rec.linktype, swapped)?.matches(rec.data, rec.wirelen, rec.ts_ns)
                {
                    continue;
                }
                stats.matched += 1;
                if !self.give(&rec, ifaces, &mut stats)? || stats.matched >= limit {
                    break;
                }
            }
        }
        self.progress.finish();
        Ok(stats)
    }
}

/// Builds `trace`'s index beside it (`TRACE.ptidx`), as `pcaptool index` does: for the bytes of each packet a
/// query will see (the trace's snapshot length, as libpcap cuts), in chunks of `chunk_packets` packets (`None`:
/// the default). The trace's damage, if any, is in the statistics; the packets before it are indexed.
pub fn index_trace(
    trace: &Path,
    chunk_packets: Option<u32>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<pcaptool_index::BuildStats, Error> {
    let open_error = |source| Error::Open { path: trace.to_path_buf(), source };
    let mut reader = TraceReader::open(trace).map_err(open_error)?;
    reader.read_header().map_err(open_error)?;
    let snap = u32::try_from(snapshot(reader.interfaces())).unwrap_or(u32::MAX);
    drop(reader);
    let defaults = pcaptool_index::BuildOptions::default();
    let opts = pcaptool_index::BuildOptions { chunk_packets: chunk_packets.unwrap_or(defaults.chunk_packets), snap };
    let index = sidecar_path(trace);
    pcaptool_index::build(trace, &index, &opts, progress).map_err(|source| Error::IndexBuild { path: index, source })
}
