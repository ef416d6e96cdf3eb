//! A flow store as a source: stage 1 and 2 narrow the segments and flows to read, the filter runs on their
//! packets, matches come in the store's original order.

use std::collections::HashMap;
use std::path::Path;

use pcaptool_flowstore::{Store, StoreMeta, StoredPacket};
use pcaptool_packet::{Interface, LinkType, Need, Record, TsPrecision, TsResolution};
use pcaptool_query::Filter;
use pcaptool_query::plan::necessary;

use crate::matchers::{Compiled, Matchers, snap_for};
use crate::plan::{DamagedPlan, Plan, StorePlan, Strategy};
use crate::sink::{Layout, NativeFormat};
use crate::{Error, Outcome, Request, Sink, SourceKind};

/// How the packets of one kind are given: their interface, the bytes libpcap would see of them, and their
/// matcher's slot (none without a filter).
type KindOut = (u32, usize, Option<usize>);

/// A flow store, open for reading.
#[derive(Debug)]
pub(crate) struct StoreSource {
    store: Store,
    /// The programs compiled for the filters asked so far.
    compiled: Compiled,
}

/// What a store's packets are given as: one interface per kind of packet (link type, snapshot length,
/// precision, byte order and source interface), in the order of [`Store::metas`].
struct Kinds {
    interfaces: Vec<Interface>,
    /// Per kind: its interface, the bytes libpcap would see of its packets, its byte order.
    by_meta: HashMap<StoreMeta, (u32, usize, bool)>,
}

impl Kinds {
    fn of(store: &Store) -> Kinds {
        let mut interfaces = Vec::new();
        let mut by_meta = HashMap::new();
        for (i, (m, name)) in store.metas().into_iter().enumerate() {
            interfaces.push(Interface {
                linktype: m.linktype,
                snaplen: m.snaplen,
                tsresol: match m.precision {
                    TsPrecision::Micro => TsResolution::Decimal(6),
                    TsPrecision::Nano => TsResolution::Decimal(9),
                },
                tsoffset: 0,
                section: 0,
                name: Some(name).filter(|n| !n.is_empty()),
                fcs_len: None,
            });
            by_meta.insert(m, (i as u32, snap_for(m.linktype, m.snaplen), m.swapped));
        }
        Kinds { interfaces, by_meta }
    }

    /// pcap when the store holds one link type (as tcpdump writes, at the finest precision of its kinds),
    /// pcapng otherwise.
    fn native(&self) -> NativeFormat {
        let mut lts: Vec<LinkType> = self.interfaces.iter().map(|i| i.linktype.base()).collect();
        lts.sort_by_key(|l| l.0);
        lts.dedup();
        if lts.len() > 1 {
            return NativeFormat::PcapNg;
        }
        let nano = self.interfaces.iter().any(|i| i.tsresol == TsResolution::Decimal(9));
        NativeFormat::Pcap(if nano { TsPrecision::Nano } else { TsPrecision::Micro })
    }
}

impl StoreSource {
    /// Opens the store in `dir`; with `keep`, its decoded indexes are kept within that many heap bytes (a
    /// long-lived source).
    pub(crate) fn open(dir: &Path, skip_damaged: bool, keep: Option<u64>) -> Result<StoreSource, Error> {
        let mut store = Store::open(dir).map_err(|source| Error::OpenStore { dir: dir.to_path_buf(), source })?;
        store.set_skip_damaged(skip_damaged);
        if let Some(budget) = keep {
            store.keep_indexes(budget);
        }
        Ok(StoreSource { store, compiled: Compiled::default() })
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    fn read_error(&self, source: pcaptool_flowstore::StoreError) -> Error {
        Error::Store { dir: self.store.dir().to_path_buf(), source }
    }

    /// The flows `req`'s filter may match (its necessary condition on flow keys, within the time window).
    pub(crate) fn flows(&self, req: &Request) -> Result<Vec<crate::FlowRecord>, Error> {
        let flows = self.store.flows(&Self::need(req)).map_err(|e| self.read_error(e))?;
        Ok(flows.iter().map(crate::FlowRecord::from).collect())
    }

    /// The condition a store can check: the filter's, within the time window.
    fn need(req: &Request) -> Need {
        req.windowed(req.filter.as_ref().map_or(Need::All, necessary))
    }

    fn matchers<'f>(&'f self, filter: Option<&'f Filter>, kinds: &Kinds) -> Result<Option<Matchers<'f>>, Error> {
        let Some(f) = filter else { return Ok(None) };
        let mut m = Matchers::new(f, &self.compiled);
        // The filter must compile for every link type and byte order, as a scan of the traces would require.
        for (meta, &(_, _, swapped)) in &kinds.by_meta {
            m.get(meta.linktype, swapped)?;
        }
        Ok(Some(m))
    }

    pub(crate) fn plan(&self, req: &Request) -> Result<Plan, Error> {
        req.check()?;
        let store = &self.store;
        let need = Self::need(req);
        let kinds = Kinds::of(store);
        let matchers = self.matchers(req.filter.as_ref(), &kinds)?;
        let mut passed = 0;
        let (mut flows, mut no_flow, mut bytes, mut no_flow_skipped) = (0u64, 0u64, 0u64, 0u64);
        for seg in store.segments().iter().filter(|s| s.stage1.may_match(&need)) {
            passed += 1;
            let s2 = seg.stage2_kept().map_err(|e| self.read_error(e))?;
            let entries = s2.candidates(&need).map_err(|e| self.read_error(e))?;
            let mut no_flow_read = 0;
            for e in entries.iter().filter(|e| e.packets > 0) {
                if e.is_no_flow() {
                    no_flow_read += u64::from(e.packets);
                } else {
                    flows += 1;
                }
                bytes += e.data_len;
            }
            no_flow += no_flow_read;
            no_flow_skipped += s2.no_flow_packets().map_err(|e| self.read_error(e))?.saturating_sub(no_flow_read);
        }
        let segments = store.segments().len();
        let (strategy, sentence) = match req.flow {
            Some(id) => (Strategy::Flow, format!("flow {id}: its packets, one read per segment it spans")),
            None => (
                Strategy::Stages,
                format!(
                    "stage 1: {passed} of {segments} segments may hold matches (time range, Bloom filters); stage 2: \
                     {flows} flows and {no_flow} packets of no flow to read ({no_flow_skipped} more ruled out by their \
                     summary), {bytes} bytes (one read each, checked against its checksums); the filter runs on \
                     their packets"
                ),
            ),
        };
        let filter = req.filter.as_ref();
        Ok(Plan {
            source: store.dir().display().to_string(),
            kind: SourceKind::Store,
            filter: filter.map_or(String::new(), |f| f.text().to_string()),
            parsed: filter
                .and_then(|f| f.expr())
                .map_or_else(|| "(empty: every packet)".to_string(), |e| e.to_string()),
            index_condition: need.to_string(),
            strategy,
            plan: sentence,
            exact: filter.is_none_or(pcaptool_query::plan::exact),
            index: None,
            store: Some(StorePlan {
                segments,
                packets: store.packets(),
                stage1_passed: passed,
                flows,
                no_flow_packets: no_flow,
                no_flow_skipped,
                bytes_to_read: bytes,
                damaged: store
                    .damaged()
                    .iter()
                    .map(|d| DamagedPlan { segment: d.number, why: d.to_string() })
                    .collect(),
            }),
            link_types: matchers.map(|m| m.plans()).unwrap_or_default(),
            parts: Vec::new(),
        })
    }

    pub(crate) fn run(&self, req: &Request, sink: &mut dyn Sink) -> Result<Outcome, Error> {
        req.check()?;
        let store = &self.store;
        let kinds = Kinds::of(store);
        if kinds.interfaces.is_empty() {
            return Err(Error::EmptyStore { dir: store.dir().to_path_buf() });
        }
        let need = Self::need(req);
        let mut matchers = self.matchers(req.filter.as_ref(), &kinds)?;
        // Per kind of packet: its interface, snapshot length and matcher.
        let mut by_meta: HashMap<StoreMeta, KindOut> = HashMap::new();
        for (m, &(iface, snap, swapped)) in &kinds.by_meta {
            let slot = match matchers.as_mut() {
                Some(ms) => Some(ms.slot(m.linktype, swapped)?),
                None => None,
            };
            by_meta.insert(*m, (iface, snap, slot));
        }
        if !req.count_only {
            sink.begin(&Layout { interfaces: &kinds.interfaces, native: kinds.native(), complete: true })?;
        }
        let limit = req.limit.unwrap_or(u64::MAX);
        let mut out = Outcome::default();
        let mut failure: Option<Error> = None;
        let ifaces = &kinds.interfaces;
        let mut last: Option<(StoreMeta, KindOut)> = None;
        let mut each = |q: &StoredPacket<'_>| -> bool {
            if req.is_cancelled() {
                failure = Some(Error::Cancelled);
                return false;
            }
            let (ts, wirelen) = (q.ts_ns, q.wirelen);
            out.packets += 1;
            if !req.in_window(ts) || out.matched >= limit {
                return out.matched < limit;
            }
            // (Packets come in runs of one kind: the last kind's answer saves hashing each packet's.)
            let (iface, snap, slot) = match last {
                Some((m, k)) if m == q.meta => k,
                _ => {
                    let Some(&k) = by_meta.get(&q.meta) else { return true };
                    last = Some((q.meta, k));
                    k
                }
            };
            let data = &q.data[..q.data.len().min(snap)];
            if let (Some(ms), Some(i)) = (matchers.as_ref(), slot)
                && !ms.compiled[i].1.matches(data, wirelen, ts)
            {
                return true;
            }
            out.matched += 1;
            if !req.count_only {
                let rec = Record {
                    ts_ns: ts,
                    has_ts: true,
                    wirelen,
                    iface,
                    linktype: q.meta.linktype,
                    offset: 0,
                    record_len: 0,
                    data,
                };
                match sink.record(&rec, ifaces) {
                    Ok(true) => {}
                    Ok(false) => {
                        out.stopped = true;
                        return false;
                    }
                    Err(e) => {
                        failure = Some(e.into());
                        return false;
                    }
                }
            }
            out.matched < limit
        };
        let result = match req.flow {
            Some(id) => store.flow(id, &mut |q| {
                each(q);
            }),
            None => store.query(&need, &mut each).map(|st| {
                out.store = Some(st);
                true
            }),
        };
        let outcome = match (result, failure) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(self.read_error(e)),
            (Ok(false), None) => Err(Error::NoFlow { dir: store.dir().to_path_buf(), id: req.flow.unwrap_or(0) }),
            (Ok(true), None) => Ok(()),
        };
        match outcome {
            Ok(()) => {
                if !req.count_only {
                    sink.finish(ifaces)?;
                }
                out.skipped = store.skipped();
                Ok(out)
            }
            Err(e) => Err(e),
        }
    }
}
