//! Several sources answered as one: each part answers on a thread of its own into a bounded channel of record
//! batches, and the calling thread merges the parts by timestamp (ties in the order the parts were given) into
//! the caller's sink. Memory holds a few batches a part, whatever the answer's size.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use pcaptool_packet::{Interface, LinkType, Record, TsPrecision};

use crate::plan::{Plan, Strategy};
use crate::sink::{Layout, NativeFormat};
use crate::{Cancel, Error, Outcome, OwnedRecord, Request, Sink, SinkError, Source, SourceKind};

/// Records a part sends at once, and batches in flight a part.
const BATCH: usize = 256;
const IN_FLIGHT: usize = 8;

/// Sources answered as one, by name.
#[derive(Debug)]
pub(crate) struct Merged {
    parts: Vec<(String, Arc<Source>)>,
    partial: bool,
    /// The parts' names joined with commas, shown as the source's path.
    name: PathBuf,
}

/// What a part's thread tells the merger, in order.
enum Msg {
    /// The part's layout (before any record).
    Begin(Vec<Interface>, NativeFormat, bool),
    /// Interfaces the part declared after those it had (a pcapng stream).
    More(Vec<Interface>),
    Batch(Vec<OwnedRecord>),
    /// The part's answer is over.
    End(Result<Outcome, Error>),
}

/// The sink a part answers into: its records in batches over the channel.
struct PartSink {
    tx: SyncSender<Msg>,
    batch: Vec<OwnedRecord>,
    /// Interfaces sent so far.
    sent: usize,
}

impl PartSink {
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let b = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.tx.send(Msg::Batch(b)).is_ok()
    }
}

impl Sink for PartSink {
    fn begin(&mut self, layout: &Layout<'_>) -> Result<(), SinkError> {
        self.sent = layout.interfaces.len();
        let _ = self.tx.send(Msg::Begin(layout.interfaces.to_vec(), layout.native, layout.complete));
        Ok(())
    }

    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        if ifaces.len() > self.sent {
            if !self.flush() || self.tx.send(Msg::More(ifaces[self.sent..].to_vec())).is_err() {
                return Ok(false);
            }
            self.sent = ifaces.len();
        }
        self.batch.push(OwnedRecord {
            ts_ns: rec.ts_ns,
            wirelen: rec.wirelen,
            linktype: rec.linktype,
            iface: rec.iface,
            data: rec.data.to_vec(),
        });
        // (The merger has stopped reading only when the answer is over.)
        Ok(self.batch.len() < BATCH || self.flush())
    }

    fn finish(&mut self, _: &[Interface]) -> Result<(), SinkError> {
        self.flush();
        Ok(())
    }
}

/// The merger's view of one part.
struct Part {
    rx: Receiver<Msg>,
    /// The part's interfaces, as indexes of the merged answer's.
    ifaces: Vec<u32>,
    queue: std::collections::VecDeque<OwnedRecord>,
    begun: bool,
    end: Option<Result<Outcome, Error>>,
}

impl Merged {
    pub(crate) fn parts(&self) -> &[(String, Arc<Source>)] {
        &self.parts
    }

    pub(crate) fn new(parts: Vec<(String, Arc<Source>)>, partial: bool) -> Merged {
        let name = PathBuf::from(parts.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(","));
        Merged { parts, partial, name }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.name
    }

    pub(crate) fn plan(&self, req: &Request) -> Result<Plan, Error> {
        req.check()?;
        let mut plans = Vec::with_capacity(self.parts.len());
        for (name, s) in &self.parts {
            match s.plan(req) {
                Ok(mut p) => {
                    p.source = name.clone();
                    plans.push(p);
                }
                Err(e) if self.partial => drop(e),
                Err(e) => return Err(part_error(name.clone(), e)),
            }
        }
        let Some(first) = plans.first().cloned() else {
            return Err(Error::NoParts);
        };
        Ok(Plan {
            source: self.name.display().to_string(),
            kind: SourceKind::Merged,
            strategy: Strategy::Merge,
            plan: format!("{} sources answered in parallel, their matches merged by timestamp", plans.len()),
            index: None,
            store: None,
            parts: plans,
            ..first
        })
    }

    pub(crate) fn flows(&self, req: &Request) -> Result<Vec<crate::FlowRecord>, Error> {
        let mut all = Vec::new();
        for (name, s) in &self.parts {
            match s.flows(req) {
                Ok(f) => all.extend(f.into_iter().map(|mut r| {
                    r.source = Some(name.clone());
                    r
                })),
                // A trace has no flow table: the stores' flows are the answer.
                Err(Error::FlowNeedsStore { .. }) => {}
                Err(_) if self.partial => {}
                Err(e) => return Err(part_error(name.clone(), e)),
            }
        }
        Ok(all)
    }

    pub(crate) fn run(&self, req: &Request, sink: &mut dyn Sink) -> Result<Outcome, Error> {
        req.check()?;
        // The parts stop on their own flag: set when the caller's is, or when the merged answer is complete.
        let inner = Cancel::new();
        let part_req = req.clone().with_cancel(inner.clone());
        let mut failed: Vec<(String, Error)> = Vec::new();
        let result = std::thread::scope(|s| {
            let mut parts = Vec::with_capacity(self.parts.len());
            for (_, src) in &self.parts {
                let (tx, rx) = sync_channel(IN_FLIGHT);
                let r = part_req.clone();
                s.spawn(move || {
                    let mut ps = PartSink { tx: tx.clone(), batch: Vec::with_capacity(BATCH), sent: 0 };
                    let result =
                        if r.count_only { src.run(&r, &mut crate::Counter::default()) } else { src.run(&r, &mut ps) };
                    ps.flush();
                    let _ = tx.send(Msg::End(result));
                });
                parts.push(Part { rx, ifaces: Vec::new(), queue: Default::default(), begun: false, end: None });
            }
            let r = self.merge(req, sink, &mut parts, &mut failed);
            // Complete, failed or cancelled: the parts still running stop, and their channels close.
            inner.cancel();
            drop(parts);
            r
        });
        if !failed.is_empty() && !self.partial {
            let (name, source) = failed.swap_remove(0);
            return Err(part_error(name, source));
        }
        let mut out = result?;
        out.failed = failed
            .into_iter()
            .map(|(n, e)| match &e {
                // A remote source's error begins with its name: said once.
                Error::Remote { name, source } if *name == n => (n, chain(source.as_ref())),
                _ => (n, chain(&e)),
            })
            .collect();
        Ok(out)
    }

    /// Waits for a message of part `i`, looking at the caller's cancel flag every 50 ms.
    fn next(req: &Request, part: &Part) -> Result<Option<Msg>, Error> {
        loop {
            req.go_on()?;
            match part.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(m) => return Ok(Some(m)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Takes part `i`'s next message into its state; false when the part has ended.
    fn take(
        &self,
        req: &Request,
        i: usize,
        parts: &mut [Part],
        ifaces: &mut Vec<Interface>,
        failed: &mut Vec<(String, Error)>,
    ) -> Result<bool, Error> {
        let part = &mut parts[i];
        let msg = match Self::next(req, part)? {
            Some(m) => m,
            None => {
                // The thread ended without its last word: it panicked.
                failed.push((self.parts[i].0.clone(), Error::PartLost));
                part.end = Some(Ok(Outcome::default()));
                return if self.partial { Ok(false) } else { Err(Error::Cancelled) };
            }
        };
        match msg {
            Msg::Begin(list, _, _) | Msg::More(list) => {
                part.begun = true;
                for iface in list {
                    part.ifaces.push(ifaces.len() as u32);
                    ifaces.push(iface);
                }
            }
            Msg::Batch(b) => part.queue.extend(b),
            Msg::End(Ok(o)) => part.end = Some(Ok(o)),
            Msg::End(Err(e)) => {
                failed.push((self.parts[i].0.clone(), e));
                part.end = Some(Ok(Outcome::default()));
                if !self.partial {
                    return Err(Error::Cancelled);
                }
            }
        }
        Ok(part.end.is_none())
    }

    fn merge(
        &self,
        req: &Request,
        sink: &mut dyn Sink,
        parts: &mut [Part],
        failed: &mut Vec<(String, Error)>,
    ) -> Result<Outcome, Error> {
        let mut ifaces: Vec<Interface> = Vec::new();
        let mut natives: Vec<NativeFormat> = Vec::new();
        let mut complete = true;
        // Every part's layout first (or its end): the merged answer's interfaces start as theirs, in order.
        for (i, part) in parts.iter_mut().enumerate() {
            while !part.begun && part.end.is_none() {
                match Self::next(req, part)? {
                    Some(Msg::Begin(list, native, whole)) => {
                        part.begun = true;
                        natives.push(native);
                        complete &= whole;
                        for iface in list {
                            part.ifaces.push(ifaces.len() as u32);
                            ifaces.push(iface);
                        }
                    }
                    Some(Msg::End(Ok(o))) => part.end = Some(Ok(o)),
                    Some(Msg::End(Err(e))) => {
                        failed.push((self.parts[i].0.clone(), e));
                        part.end = Some(Ok(Outcome::default()));
                        if !self.partial {
                            return Err(Error::Cancelled);
                        }
                    }
                    Some(_) => unreachable!("a part sends its layout before its records"),
                    None => {
                        failed.push((self.parts[i].0.clone(), Error::PartLost));
                        part.end = Some(Ok(Outcome::default()));
                        if !self.partial {
                            return Err(Error::Cancelled);
                        }
                    }
                }
            }
        }
        if !req.count_only {
            let native = merged_native(&natives, &ifaces);
            sink.begin(&Layout { interfaces: &ifaces, native, complete })?;
        }
        let limit = req.limit.unwrap_or(u64::MAX);
        let mut out = Outcome::default();
        while !req.count_only && out.matched < limit {
            // Every part still answering has a record waiting, so that the earliest of them is the next.
            for i in 0..parts.len() {
                while parts[i].queue.is_empty() && parts[i].end.is_none() {
                    self.take(req, i, parts, &mut ifaces, failed)?;
                }
            }
            let next = (0..parts.len()).filter_map(|i| parts[i].queue.front().map(|r| (r.ts_ns, i))).min();
            let Some((_, i)) = next else { break };
            let rec = parts[i].queue.pop_front().expect("a front record");
            let iface = parts[i].ifaces.get(rec.iface as usize).copied().unwrap_or(0);
            let r = Record {
                ts_ns: rec.ts_ns,
                has_ts: true,
                wirelen: rec.wirelen,
                iface,
                linktype: rec.linktype,
                offset: 0,
                record_len: 0,
                data: &rec.data,
            };
            out.matched += 1;
            if !sink.record(&r, &ifaces)? {
                out.stopped = true;
                break;
            }
        }
        // The parts' own figures (each part's to its end, unless the merged answer stopped first).
        let complete_answer = out.matched < limit && !out.stopped;
        for i in 0..parts.len() {
            if complete_answer || req.count_only {
                while parts[i].end.is_none() {
                    self.take(req, i, parts, &mut ifaces, failed)?;
                }
            }
            if let Some(Ok(o)) = parts[i].end.take() {
                out.packets += o.packets;
                if req.count_only {
                    out.matched += o.matched;
                }
                out.candidates = add(out.candidates, o.candidates);
                out.counted_from_index = add(out.counted_from_index, o.counted_from_index);
                out.damage = out.damage.or(o.damage);
                out.skipped.extend(o.skipped);
            }
        }
        if req.count_only {
            out.matched = out.matched.min(limit);
        } else {
            sink.finish(&ifaces)?;
        }
        Ok(out)
    }
}

/// A part's failure, naming it (a remote part's error names it already).
fn part_error(name: String, e: Error) -> Error {
    match e {
        Error::Remote { name: n, source } if n == name => Error::Remote { name: n, source },
        e => Error::Part { name, source: Box::new(e) },
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// The merged answer's native container: pcap when every part's is pcap of one precision and one link type,
/// else pcapng.
fn merged_native(natives: &[NativeFormat], ifaces: &[Interface]) -> NativeFormat {
    let mut lts: Vec<LinkType> = Vec::new();
    for i in ifaces {
        if !lts.contains(&i.linktype.base()) {
            lts.push(i.linktype.base());
        }
    }
    let pcap: Vec<TsPrecision> =
        natives.iter().filter_map(|n| if let NativeFormat::Pcap(p) = n { Some(*p) } else { None }).collect();
    if pcap.len() == natives.len() && lts.len() <= 1 {
        if let Some(&p) = pcap.first()
            && pcap.iter().all(|&q| q == p)
        {
            return NativeFormat::Pcap(p);
        }
        // Precisions differ: nanoseconds keep every timestamp.
        if !pcap.is_empty() {
            return NativeFormat::Pcap(TsPrecision::Nano);
        }
    }
    NativeFormat::PcapNg
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    pcaptool_packet::Chain(e).to_string()
}
