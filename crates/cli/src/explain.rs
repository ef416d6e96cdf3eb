//! Printing a plan (`pcaptool query --explain`, `explain` in the shell): text or JSON.

use anyhow::Context;
use pcaptool_engine::Plan;

pub(crate) fn print(plan: &Plan, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(plan).context("cannot encode the explanation")?);
        return Ok(());
    }
    if let Some(s) = &plan.store {
        outln!("store:     {} ({} segments, {} packets)", plan.source, s.segments, s.packets);
    }
    outln!("filter:    {}", plan.filter);
    outln!("parsed:    {}", plan.parsed);
    outln!("indexable: {}", plan.index_condition);
    outln!("plan:      {}", plan.plan);
    parts(plan, 0)?;
    if plan.exact && plan.index.is_some() {
        outln!(
            "count:     exact condition: --count takes matches from the index, reading only packets it cannot decide"
        );
    }
    if let Some(ix) = &plan.index {
        outln!("index:     {} ({} packets in {} chunks, {} bytes)", ix.path, ix.packets, ix.chunks, ix.bytes);
        if let (Some(touched), Some(candidates), Some(bytes)) =
            (ix.chunks_touched, ix.candidates, ix.trace_bytes_to_read)
        {
            outln!(
                "reads:     {candidates} candidate packets in {touched} of {} chunks, {bytes} bytes of the trace",
                ix.chunks
            );
        }
    }
    if let Some(s) = &plan.store {
        outln!(
            "stage 1:   {} of {} segments may hold matches (time range, Bloom filters)",
            s.stage1_passed,
            s.segments
        );
        outln!(
            "stage 2:   {} flows and {} packets of no flow to read ({} more ruled out by their summary), {} bytes (one \
             read each, checked against its checksums); the filter runs on their packets",
            s.flows,
            s.no_flow_packets,
            s.no_flow_skipped,
            s.bytes_to_read
        );
        for d in &s.damaged {
            outln!(
                "damaged:   segment {} cannot be read ({}): the query fails unless --skip-damaged",
                d.segment,
                d.why
            );
        }
    }
    for lt in &plan.link_types {
        outln!(
            "link type {}: {} operations (libpcap's tests in libpcap's order, {})",
            lt.linktype_name,
            lt.operations,
            if lt.optimized {
                "optimised as libpcap does"
            } else {
                "not optimised: libpcap does not optimise a filter holding protochain or geneve"
            }
        );
        for line in &lt.program {
            outln!("  {line}");
        }
    }
    Ok(())
}

/// The plans of a merged or remote source's parts, a line each (nested parts indented).
fn parts(plan: &Plan, depth: usize) -> anyhow::Result<()> {
    for p in &plan.parts {
        outln!("part:      {:depth$}{}: {}", "", p.source, p.plan, depth = depth * 2);
        parts(p, depth + 1)?;
    }
    Ok(())
}
