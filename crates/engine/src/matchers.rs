//! The filter compiled on demand for each link type (and byte order) a source holds.

use pcaptool_packet::{LinkType, Record};
use pcaptool_query::{Filter, Matcher, Target};

use crate::Error;
use crate::plan::LinkTypePlan;

/// Matchers compiled on demand for the link types a source holds.
pub(crate) struct Matchers<'f> {
    filter: &'f Filter,
    pub(crate) compiled: Vec<((LinkType, bool), Matcher)>,
}

impl<'f> Matchers<'f> {
    pub(crate) fn new(filter: &'f Filter) -> Matchers<'f> {
        Matchers { filter, compiled: Vec::new() }
    }

    /// The position of the matcher for link type `lt` in a capture of the given byte order, compiled if new.
    pub(crate) fn slot(&mut self, lt: LinkType, swapped: bool) -> Result<usize, Error> {
        let key = (lt.base(), swapped);
        if let Some(i) = self.compiled.iter().position(|(k, _)| *k == key) {
            return Ok(i);
        }
        let m = self
            .filter
            .compile(Target { linktype: key.0, swapped })
            .map_err(|source| Error::FilterForLinkType { linktype: key.0, source })?;
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
