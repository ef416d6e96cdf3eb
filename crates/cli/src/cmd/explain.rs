//! `pcaptool query --explain`: how a filter will be evaluated, and with an index what it will read.

use anyhow::Context;
use pcaptool_index::{IndexView, Selection};
use pcaptool_query::Filter;
use pcaptool_query::plan::Plan;

use crate::cmd::query::Matchers;

/// The index's part of an explanation: what it holds and what the plan reads from the trace.
pub(crate) struct IndexFacts {
    path: String,
    packets: u64,
    chunks: usize,
    index_bytes: u64,
    /// Chunks with candidates, candidates, bytes of the trace to read (when the index is used).
    reads: Option<(usize, u64, u64)>,
}

impl IndexFacts {
    pub(crate) fn of(view: &IndexView<'_>, _plan: &Plan, sel: Option<&Selection>) -> anyhow::Result<IndexFacts> {
        let reads = match sel {
            Some(s) => Some((s.chunks.len(), s.count(), view.bytes_to_read(s)?)),
            None => None,
        };
        Ok(IndexFacts {
            path: view.file().path().display().to_string(),
            packets: view.packets(),
            chunks: view.chunks().len(),
            index_bytes: view.file().size_bytes(),
            reads,
        })
    }
}

pub(crate) fn print(
    filter: &Filter,
    plan: &Plan,
    index: Option<&IndexFacts>,
    matchers: &mut Matchers<'_>,
    json: bool,
) -> anyhow::Result<()> {
    let parsed = filter.expr().map_or_else(|| "(empty: every packet)".to_string(), |e| e.to_string());
    if json {
        let per_lt: Vec<_> = matchers
            .compiled
            .iter()
            .map(|(lt, m)| {
                serde_json::json!({
                    "linktype": lt.0,
                    "linktype_name": lt.to_string(),
                    "operations": m.len(),
                    "tests": m.cond().to_string(),
                    "program": m.listing().lines().collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut v = serde_json::json!({
            "filter": filter.text(),
            "parsed": parsed,
            "index_condition": plan.need.to_string(),
            "plan": plan.describe(),
            "exact": plan.exact,
            "link_types": per_lt,
        });
        if let Some(ix) = index {
            v["index"] = serde_json::json!({
                "path": ix.path,
                "packets": ix.packets,
                "chunks": ix.chunks,
                "bytes": ix.index_bytes,
                "uses": plan.index.as_ref().map(|n| n.to_string()),
                "chunks_touched": ix.reads.map(|r| r.0),
                "candidates": ix.reads.map(|r| r.1),
                "trace_bytes_to_read": ix.reads.map(|r| r.2),
            });
        }
        outln!("{}", serde_json::to_string_pretty(&v).context("cannot encode the explanation")?);
        return Ok(());
    }
    outln!("filter:    {}", filter.text());
    outln!("parsed:    {parsed}");
    outln!("indexable: {}", plan.need);
    outln!("plan:      {}", plan.describe());
    if plan.exact && index.is_some() {
        outln!(
            "count:     exact condition: --count takes matches from the index, reading only packets it cannot decide"
        );
    }
    if let Some(ix) = index {
        outln!("index:     {} ({} packets in {} chunks, {} bytes)", ix.path, ix.packets, ix.chunks, ix.index_bytes);
        if let Some((chunks, candidates, bytes)) = ix.reads {
            outln!(
                "reads:     {candidates} candidate packets in {chunks} of {} chunks, {bytes} bytes of the trace",
                ix.chunks
            );
        }
    }
    for (lt, m) in &matchers.compiled {
        outln!(
            "link type {lt}: {} operations (libpcap's tests in libpcap's order, optimised as libpcap does)",
            m.len()
        );
        for line in m.listing().lines() {
            outln!("  {line}");
        }
    }
    Ok(())
}
