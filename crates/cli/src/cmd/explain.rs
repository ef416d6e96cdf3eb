//! `pcaptool query --explain`: how a filter will be evaluated.

use anyhow::Context;
use pcaptool_query::Filter;

use crate::cmd::query::Matchers;

pub(crate) fn print(filter: &Filter, matchers: &mut Matchers<'_>, json: bool) -> anyhow::Result<()> {
    let parsed = filter.expr().map_or_else(|| "(empty: every packet)".to_string(), |e| e.to_string());
    let plan = pcaptool_query::plan::plan(filter, None);
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
        let v = serde_json::json!({
            "filter": filter.text(),
            "parsed": parsed,
            "index_condition": plan.need.to_string(),
            "plan": plan.describe(),
            "link_types": per_lt,
        });
        println!("{}", serde_json::to_string_pretty(&v).context("cannot encode the explanation")?);
        return Ok(());
    }
    println!("filter:    {}", filter.text());
    println!("parsed:    {parsed}");
    println!("indexable: {}", plan.need);
    println!("plan:      {}", plan.describe());
    for (lt, m) in &matchers.compiled {
        println!(
            "link type {lt}: {} operations (libpcap's tests in libpcap's order, optimised as libpcap does)",
            m.len()
        );
        for line in m.listing().lines() {
            println!("  {line}");
        }
    }
    Ok(())
}
