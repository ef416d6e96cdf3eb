//! Counters per filter and per interval, as libtrace's `tracestats` and `capinfos` count: for each interval (or
//! the whole trace), the packets and bytes in all and those each filter (tcpdump's language, libpcap's semantics)
//! matches.

use std::path::Path;

use pcaptool_packet::{LinkType, TraceError};
use pcaptool_query::{Filter, Matcher, Target};
use serde::Serialize;

use crate::ToolError;
use crate::pipe::{next, open};

/// Packets and bytes (on the wire, and captured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    /// Packets.
    pub packets: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Bytes captured.
    pub captured: u64,
}

impl Count {
    fn add(&mut self, wirelen: u32, caplen: usize) {
        self.packets += 1;
        self.bytes += u64::from(wirelen);
        self.captured += caplen as u64;
    }
}

/// The counts of one interval.
#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    /// Its start, ns since the epoch (the first packet's time for the whole trace).
    pub start_ns: u64,
    /// Every packet.
    pub all: Count,
    /// Those each filter matches, in the order given.
    pub filters: Vec<Count>,
}

/// What [`stats`] counted.
#[derive(Debug, Serialize)]
pub struct Stats {
    /// The filters' names, in order.
    pub names: Vec<String>,
    /// The intervals with packets, in time order (one when no interval length is given).
    pub intervals: Vec<Interval>,
    /// The whole trace.
    pub total: Interval,
    /// The damage that ended reading early, if any (what came before it is counted).
    #[serde(skip)]
    pub damage: Option<TraceError>,
}

/// Counts the packets of `path` per filter (`filters`: name and text) and, with `interval_ns`, per interval of
/// that length from the first packet's time. Packets out of time order are counted in the interval of their time.
pub fn stats(
    path: &Path,
    filters: &[(String, String)],
    interval_ns: Option<u64>,
    progress: &dyn Fn(u64),
) -> Result<Stats, ToolError> {
    let parsed: Vec<Filter> = filters
        .iter()
        .map(|(name, text)| Filter::new(text).map_err(|e| ToolError::Filter { name: name.clone(), why: e.to_string() }))
        .collect::<Result<_, _>>()?;
    let mut reader = open(path)?;
    let swapped = reader.format().is_some_and(|f| f.swapped());
    let mut compiled: Vec<(LinkType, Vec<Matcher>)> = Vec::new();
    let mut by_start: std::collections::BTreeMap<u64, Interval> = std::collections::BTreeMap::new();
    let n = parsed.len();
    let mut total = Interval { start_ns: 0, all: Count::default(), filters: vec![Count::default(); n] };
    let mut first: Option<u64> = None;
    let mut done = crate::Copied::default();
    while let Some((rec, _)) = next(&mut reader, &mut done, progress) {
        let lt = rec.linktype.base();
        let slot = match compiled.iter().position(|(l, _)| *l == lt) {
            Some(i) => i,
            None => {
                let ms = parsed
                    .iter()
                    .zip(filters)
                    .map(|(f, (name, _))| {
                        f.compile(Target { linktype: lt, swapped })
                            .map_err(|e| ToolError::Filter { name: name.clone(), why: e.to_string() })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                compiled.push((lt, ms));
                compiled.len() - 1
            }
        };
        let hits: Vec<bool> = compiled[slot].1.iter().map(|m| m.matches(rec.data, rec.wirelen, rec.ts_ns)).collect();
        let t0 = *first.get_or_insert(rec.ts_ns);
        total.start_ns = t0;
        total.all.add(rec.wirelen, rec.data.len());
        for (c, &h) in total.filters.iter_mut().zip(&hits) {
            if h {
                c.add(rec.wirelen, rec.data.len());
            }
        }
        if let Some(iv) = interval_ns {
            let iv = iv.max(1);
            let offset = (i128::from(rec.ts_ns) - i128::from(t0)).div_euclid(i128::from(iv)) * i128::from(iv);
            let start = u64::try_from((i128::from(t0) + offset).max(0)).unwrap_or(u64::MAX);
            let e = by_start.entry(start).or_insert_with(|| Interval {
                start_ns: start,
                all: Count::default(),
                filters: vec![Count::default(); n],
            });
            e.all.add(rec.wirelen, rec.data.len());
            for (c, &h) in e.filters.iter_mut().zip(&hits) {
                if h {
                    c.add(rec.wirelen, rec.data.len());
                }
            }
        }
    }
    let intervals = match interval_ns {
        Some(_) => by_start.into_values().collect(),
        None => vec![total.clone()],
    };
    Ok(Stats { names: filters.iter().map(|(n, _)| n.clone()).collect(), intervals, total, damage: done.damage })
}
