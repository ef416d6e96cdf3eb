//! The filter compiled on demand for each link type (and byte order) a source holds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use pcaptool_packet::{LinkType, Record};
use pcaptool_query::{Filter, Matcher, Target};

use crate::Error;
use crate::plan::LinkTypePlan;

/// Programs a source compiled for the filters it answered, kept for the next answers: a long-lived source (the
/// service's) is often asked the same filter again, and compiling costs 10-20 µs (libpcap's optimiser), a
/// noticeable share of a needle's answer. At most [`Compiled::KEPT`] programs, the least recently used
/// dropped.
#[derive(Debug, Default)]
pub(crate) struct Compiled(Mutex<VecDeque<Kept>>);

/// A program kept: the filter's text, the link type and byte order it was compiled for, the program.
type Kept = (String, (LinkType, bool), Arc<Matcher>);

impl Compiled {
    const KEPT: usize = 64;

    fn get(&self, text: &str, key: (LinkType, bool)) -> Option<Arc<Matcher>> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = kept.iter().position(|(t, k, _)| *k == key && t == text)?;
        let hit = kept.remove(at)?;
        let m = hit.2.clone();
        kept.push_front(hit);
        Some(m)
    }

    fn put(&self, text: &str, key: (LinkType, bool), m: Arc<Matcher>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.truncate(Self::KEPT - 1);
        kept.push_front((text.to_string(), key, m));
    }
}

/// Matchers compiled on demand for the link types a source holds.
pub(crate) struct Matchers<'f> {
    filter: &'f Filter,
    kept: &'f Compiled,
    pub(crate) compiled: Vec<((LinkType, bool), Arc<Matcher>)>,
}

impl<'f> Matchers<'f> {
    /// Matchers of `filter`, taken from (and added to) the programs `kept`.
    pub(crate) fn new(filter: &'f Filter, kept: &'f Compiled) -> Matchers<'f> {
        Matchers { filter, kept, compiled: Vec::new() }
    }

    /// The position of the matcher for link type `lt` in a capture of the given byte order, compiled if new.
    pub(crate) fn slot(&mut self, lt: LinkType, swapped: bool) -> Result<usize, Error> {
        let key = (lt.base(), swapped);
        if let Some(i) = self.compiled.iter().position(|(k, _)| *k == key) {
            return Ok(i);
        }
        let text = self.filter.text();
        let m = match self.kept.get(text, key) {
            Some(m) => m,
            None => {
                let m = self
                    .filter
                    .compile(Target { linktype: key.0, swapped })
                    .map_err(|source| Error::FilterForLinkType { linktype: key.0, source })?;
                let m = Arc::new(m);
                self.kept.put(text, key, m.clone());
                m
            }
        };
        self.compiled.push((key, m));
        Ok(self.compiled.len() - 1)
    }

    pub(crate) fn get(&mut self, lt: LinkType, swapped: bool) -> Result<&Matcher, Error> {
        let i = self.slot(lt, swapped)?;
        Ok(&self.compiled[i].1)
    }

    /// Whether a record matches, by the filter compiled for its link type (compile every link type first).
    pub(crate) fn decider(&self) -> impl Fn(&Record<'_>) -> bool + Sync + '_ {
        let compiled = &self.compiled;
        move |r: &Record<'_>| {
            let lt = r.linktype.base();
            compiled.iter().find(|((l, _), _)| *l == lt).is_some_and(|(_, m)| m.matches(r.data, r.wirelen, r.ts_ns))
        }
    }

    /// The compiled tests, for a plan.
    pub(crate) fn plans(&self) -> Vec<LinkTypePlan> {
        let mut out: Vec<LinkTypePlan> = Vec::new();
        for ((lt, _), m) in &self.compiled {
            if out.iter().any(|p| p.linktype == lt.0) {
                continue;
            }
            out.push(LinkTypePlan {
                linktype: lt.0,
                linktype_name: lt.to_string(),
                operations: m.len(),
                optimized: m.optimized(),
                tests: m.cond().to_string(),
                program: m.listing().lines().map(str::to_string).collect(),
            });
        }
        out
    }
}

/// libpcap's `max_snaplen_for_dlt`.
fn max_snaplen(lt: LinkType) -> u32 {
    match lt.base().0 {
        231 => 128 * 1024 * 1024, // D-Bus
        279 => 8 * 1024 * 1024,   // EBHSCR
        249 => 1024 * 1024,       // USBPcap
        _ => pcaptool_packet::MAX_SNAPLEN,
    }
}

/// The bytes of a packet libpcap's filters and output see, for a capture of this link type and snapshot length:
/// libpcap cuts a record longer than the capture's snapshot length to that length.
pub fn snap_for(linktype: LinkType, snaplen: u32) -> usize {
    let max = max_snaplen(linktype);
    (if snaplen == 0 || snaplen > max { max } else { snaplen }) as usize
}

/// The most bytes of a packet tcpdump sees in a trace whose interfaces (as read before its first packet) are
/// `interfaces`: libpcap cuts a record longer than the capture's snapshot length (the pcap header's, or the
/// first pcapng interface's) to that length, so filters and output do too.
pub fn snapshot(interfaces: &[pcaptool_packet::Interface]) -> usize {
    let Some(first) = interfaces.first() else { return usize::MAX };
    snap_for(first.linktype, first.snaplen)
}

/// `rec` cut to `snap` bytes.
pub(crate) fn cut(rec: Record<'_>, snap: usize) -> Record<'_> {
    if rec.data.len() > snap { Record { data: &rec.data[..snap], ..rec } } else { rec }
}
