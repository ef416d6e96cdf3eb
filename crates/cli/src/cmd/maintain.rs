//! `pcaptool verify STORE|TRACE`, `pcaptool repair STORE`, `pcaptool retain STORE --max-size N`: checking and
//! keeping a store (and a trace with its index).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use pcaptool_index::{IndexFile, compression_code, sidecar_path};
use pcaptool_packet::Chain;
use pcaptool_packet::TraceReader;

use crate::args::parse_size;
use crate::cmd::EXIT_DAMAGED;
use crate::cmd::store::{open_store, open_writer};
use crate::progress;

/// Arguments of `pcaptool verify`.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Flow stores (directories) or traces to check.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// One JSON object per store or trace, one per line.
    #[arg(long)]
    json: bool,
}

/// Arguments of `pcaptool repair`.
#[derive(Debug, clap::Args)]
pub(crate) struct RepairArgs {
    /// The store directory.
    store: PathBuf,
}

/// Arguments of `pcaptool retain`.
#[derive(Debug, clap::Args)]
pub(crate) struct RetainArgs {
    /// The store directory.
    store: PathBuf,
    /// Remove the oldest segments whole until the store takes at most this much.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    max_size: u64,
}

/// Arguments of `pcaptool compact`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompactArgs {
    /// The store directory.
    store: PathBuf,
    #[command(flatten)]
    storage: crate::args::Storage,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let mut damaged = false;
    for path in &args.paths {
        damaged |= if path.is_dir() { verify_store(path, args.json)? } else { verify_trace(path, args.json)? };
    }
    Ok(if damaged { ExitCode::from(EXIT_DAMAGED) } else { ExitCode::SUCCESS })
}

/// Checks a store whole; prints what it found; whether it found damage.
fn verify_store(dir: &Path, json: bool) -> anyhow::Result<bool> {
    let store = open_store(dir, false)?;
    let total: u64 = store.segments().iter().map(|s| s.stage1.bytes).sum();
    let pb = progress::bytes(Some(total), "verify");
    let report = store.verify(&mut |done| pb.set_position(done));
    pb.finish_and_clear();
    let bad: Vec<_> = report.damaged().collect();
    let unchecked = report.segments.iter().filter(|s| s.damage.is_none() && !s.checksummed).count();
    let (packets, bytes): (u64, u64) =
        report.segments.iter().filter(|s| s.damage.is_none()).fold((0, 0), |(p, b), s| (p + s.packets, b + s.bytes));
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "store": dir, "segments": report.segments.len(), "intact": report.segments.len() - bad.len(),
                "packets": packets, "data_bytes": bytes, "without_checksums": unchecked,
                "damaged": bad.iter().map(|d| serde_json::json!({
                    "segment": d.number, "file": d.path, "offset": d.offset, "why": d.why,
                })).collect::<Vec<_>>(),
                "unfinished_files": report.leftovers, "quarantined": report.quarantined,
            })
        );
    } else {
        for d in &bad {
            outln!("{}: segment {} is damaged: {d}", dir.display(), d.number);
        }
        outln!(
            "{}: {} of {} segments intact ({packets} packets, {bytes} bytes of packet data checked{}){}",
            dir.display(),
            report.segments.len() - bad.len(),
            report.segments.len(),
            if unchecked > 0 {
                format!("; {unchecked} segments of format version 2 have no data checksums: only their structure")
            } else {
                String::new()
            },
            if report.leftovers.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} files of unfinished segments (being written, or left by an interrupted writer)",
                    report.leftovers.len()
                )
            }
        );
        if !bad.is_empty() {
            outln!(
                "{}: queries fail on damaged segments unless --skip-damaged; `pcaptool repair {}` moves them into \
                 its quarantine folder",
                dir.display(),
                dir.display()
            );
        }
    }
    Ok(!bad.is_empty())
}

/// Checks a trace (every record) and its index, if it has one; prints what it found; whether it found damage.
fn verify_trace(trace: &Path, json: bool) -> anyhow::Result<bool> {
    let mut reader = TraceReader::open(trace)?;
    let total = std::fs::metadata(trace).ok().map(|m| m.len());
    let pb = progress::bytes(total, "verify");
    let (mut packets, mut damage) = (0u64, None);
    while let Some(r) = reader.next_record() {
        match r {
            Ok(rec) => {
                packets += 1;
                if packets.is_multiple_of(1 << 16) {
                    pb.set_position(rec.offset);
                }
            }
            Err(e) => {
                damage = Some(Chain(&e).to_string());
                break;
            }
        }
    }
    pb.finish_and_clear();
    let index_path = sidecar_path(trace);
    let index = if index_path.exists() {
        let check = || -> Result<(), String> {
            let file = IndexFile::open(&index_path).map_err(|e| Chain(&e).to_string())?;
            let snap = u32::try_from(pcaptool_engine::snapshot(reader.interfaces())).unwrap_or(u32::MAX);
            file.check_trace(trace, Some(compression_code(reader.compression())), snap, reader.as_bytes())
                .map_err(|e| Chain(&e).to_string())?;
            file.view().and_then(|v| v.check()).map_err(|e| Chain(&e).to_string())
        };
        Some(check())
    } else {
        None
    };
    let index_damage = index.as_ref().and_then(|r| r.as_ref().err().cloned());
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "trace": trace, "packets": packets, "damage": damage,
                "index": index.as_ref().map(|_| &index_path), "index_damage": index_damage,
            })
        );
    } else {
        match &damage {
            Some(d) => outln!("{}: damaged after {packets} packets: {d}", trace.display()),
            None => outln!("{}: {packets} packets, intact", trace.display()),
        }
        match &index {
            None => {}
            Some(Ok(())) => outln!("{}: intact, and describes the trace as it is", index_path.display()),
            Some(Err(e)) => {
                outln!("{}: {e}; `pcaptool index {}` builds it again", index_path.display(), trace.display())
            }
        }
    }
    Ok(damage.is_some() || index_damage.is_some())
}

pub(crate) fn repair(args: RepairArgs) -> anyhow::Result<ExitCode> {
    let mut store = open_writer(&args.store, false)?;
    let total: u64 = store.segments().iter().map(|s| s.stage1.bytes).sum();
    let pb = progress::bytes(Some(total), "repair");
    let moved = store
        .repair(&mut |done| pb.set_position(done))
        .with_context(|| format!("cannot repair {}", args.store.display()))?;
    pb.finish_and_clear();
    for d in &moved {
        outln!(
            "{}: moved segment {} into {}: {d}",
            args.store.display(),
            d.number,
            args.store.join(pcaptool_flowstore::QUARANTINE).display()
        );
    }
    outln!(
        "{}: {} segments intact, {} moved into quarantine, {} repairs of unfinished segments",
        args.store.display(),
        store.segments().len(),
        moved.len(),
        store.repairs().len()
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn retain(args: RetainArgs) -> anyhow::Result<ExitCode> {
    let mut store = open_writer(&args.store, false)?;
    let (removed, size) = store
        .retain_size(args.max_size, u32::MAX)
        .with_context(|| format!("cannot remove segments of {}", args.store.display()))?;
    outln!("{}: {removed} oldest segments removed; the store takes {size} bytes", args.store.display());
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn compact(args: CompactArgs) -> anyhow::Result<ExitCode> {
    args.storage.check()?;
    let mut store = open_writer(&args.store, false)?;
    let total: u64 = store.segments().iter().map(|s| s.stage1.bytes).sum();
    let pb = progress::bytes(Some(total), "compact");
    let codec = args.storage.compress;
    let st = store
        .compact(codec, args.storage.block_size, args.storage.dedup, &mut |done| pb.set_position(done))
        .with_context(|| format!("cannot compact {}", args.store.display()))?;
    pb.finish_and_clear();
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "store": args.store, "codec": codec.to_string(), "rewritten": st.rewritten, "kept": st.kept,
                "old_format": st.old_format, "raw_bytes": st.raw_bytes, "bytes_before": st.before,
                "bytes_after": st.after,
            })
        );
    } else {
        outln!(
            "{}: {} segments rewritten as {codec} ({} raw bytes: {} stored before, {} after), {} already {codec}",
            args.store.display(),
            st.rewritten,
            st.raw_bytes,
            st.before,
            st.after,
            st.kept
        );
        if st.old_format > 0 {
            outln!(
                "{}: {} segments of a format before version 6 left as they are (import their traces again to \
                 compress them)",
                args.store.display(),
                st.old_format
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
