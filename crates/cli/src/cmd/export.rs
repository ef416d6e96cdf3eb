//! `pcaptool export STORE --to parquet --out DIR`: a flow store's flows as Parquet files partitioned by sensor,
//! date and hour, for DuckDB, Spark and Trino (docs/analysis.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use pcaptool_export::{ExportedSegment, ParquetExport, export_flows};

use crate::progress;

/// What an export writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Target {
    /// Parquet files under --out, partitioned Hive-style (`sensor=…/date=…/hour=…/part-….parquet`).
    Parquet,
}

/// Arguments of `pcaptool export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The flow store to export.
    store: PathBuf,
    /// What to export to.
    #[arg(long, value_enum)]
    to: Target,
    /// The export directory (created if missing); a second run exports only the segments added since.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The sensor's name, the first partition level (default: this host's name).
    #[arg(long, value_name = "NAME")]
    sensor: Option<String>,
    /// The store's name in each row's locator and in file names (default: the store directory's name).
    #[arg(long, value_name = "NAME")]
    store_id: Option<String>,
    /// Print each segment exported and a summary as JSON lines.
    #[arg(long)]
    json: bool,
}

/// `name` made a valid partition name: characters other than letters, digits, `.`, `_` and `-` become `-`.
fn tidy(name: &str) -> String {
    let t: String =
        name.trim().chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect();
    let t = t.trim_start_matches(['.', '_']).to_string();
    if t.is_empty() { "local".to_string() } else { t }
}

fn host_name() -> String {
    tidy(&std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default())
}

fn dir_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    tidy(&canonical.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Target::Parquet = args.to;
    let store = crate::cmd::store::open_store(&args.store, false)?;
    let sensor = args.sensor.unwrap_or_else(host_name);
    let store_id = args.store_id.unwrap_or_else(|| dir_name(&args.store));
    let opts = ParquetExport::new(&args.out, &sensor, &store_id)?;
    let pb = progress::items(store.segments().len() as u64, "export");
    let started = Instant::now();
    let json = args.json;
    let report = |seg: &ExportedSegment| -> anyhow::Result<()> {
        pb.inc(1);
        if json {
            outln!(
                "{}",
                serde_json::json!({ "event": "segment", "segment": seg.segment, "flows": seg.flows, "files": seg.files, "bytes": seg.bytes })
            );
        }
        Ok(())
    };
    let mut failed = None;
    let summary = export_flows(&store, &opts, &mut |seg| {
        if failed.is_none()
            && let Err(e) = report(seg)
        {
            failed = Some(e);
        }
    })
    .with_context(|| format!("cannot export {} to {}", args.store.display(), args.out.display()));
    pb.finish_and_clear();
    if let Some(e) = failed {
        return Err(e);
    }
    let summary = summary?;
    let flows: u64 = summary.exported.iter().map(|s| s.flows).sum();
    let bytes: u64 = summary.exported.iter().map(|s| s.bytes).sum();
    let files: usize = summary.exported.iter().map(|s| s.files.len()).sum();
    let secs = started.elapsed().as_secs_f64();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "event": "summary", "store": args.store, "out": args.out, "sensor": sensor, "store_id": store_id,
                "segments": summary.exported.len(), "already_exported": summary.already, "flows": flows,
                "files": files, "bytes": bytes, "seconds": secs,
            })
        );
    } else {
        outln!(
            "{}: {} flows of {} segments in {files} files ({bytes} bytes) under {} in {secs:.2} s{}",
            args.store.display(),
            flows,
            summary.exported.len(),
            args.out.display(),
            if summary.already > 0 {
                format!("; {} segments were exported before", summary.already)
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
