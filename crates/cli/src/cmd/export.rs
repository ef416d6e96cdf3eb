//! `pcaptool export STORE --to parquet --out DIR` and `--to postgres --db URL`: a flow store's flows (and, with
//! `--packets`, its packets) as Parquet files partitioned by sensor, date and hour, for DuckDB, Spark and Trino,
//! or as PostgreSQL tables (docs/analysis.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use pcaptool_export::{ExportedSegment, ParquetExport, PostgresExport, export_parquet, export_postgres};

use crate::progress;

/// What an export writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Target {
    /// Parquet files under --out, partitioned Hive-style (`flows/sensor=…/date=…/hour=…/part-….parquet`).
    Parquet,
    /// PostgreSQL tables (flows, packets, segments) in the database --db names, loaded by binary COPY.
    Postgres,
}

/// Arguments of `pcaptool export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The flow store to export.
    store: PathBuf,
    /// What to export to.
    #[arg(long, value_enum)]
    to: Target,
    /// The export directory (created if missing), for --to parquet; a second run exports only the segments
    /// added since.
    #[arg(long, value_name = "DIR", required_if_eq("to", "parquet"))]
    out: Option<PathBuf>,
    /// The database, for --to postgres: a URL (postgresql://user:password@host/db) or libpq's key=value form;
    /// default: the PCAPTOOL_DATABASE_URL environment variable.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The PostgreSQL schema that holds the tables (created if missing).
    #[arg(long, value_name = "NAME", default_value = "pcaptool")]
    schema: String,
    /// Export one row per packet too (time, lengths, 5-tuple, TCP flags, flow id), for the segments whose packets
    /// are not exported yet.
    #[arg(long)]
    packets: bool,
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
    let store = crate::cmd::store::open_store(&args.store, false)?;
    let sensor = args.sensor.unwrap_or_else(host_name);
    let store_id = args.store_id.unwrap_or_else(|| dir_name(&args.store));
    let pb = progress::items(store.segments().len() as u64, "export");
    let started = Instant::now();
    let json = args.json;
    let report = |seg: &ExportedSegment| -> anyhow::Result<()> {
        pb.inc(1);
        if json {
            outln!(
                "{}",
                serde_json::json!({ "event": "segment", "segment": seg.segment, "flows": seg.flows, "packets": seg.packets })
            );
        }
        Ok(())
    };
    let mut failed = None;
    let mut on_segment = |seg: &ExportedSegment| {
        if failed.is_none()
            && let Err(e) = report(seg)
        {
            failed = Some(e);
        }
    };
    let (summary, dest) = match args.to {
        Target::Parquet => {
            let out = args.out.context("--to parquet needs --out DIR")?;
            let mut opts = ParquetExport::new(&out, &sensor, &store_id)?;
            opts.packets = args.packets;
            let s = export_parquet(&store, &opts, &mut on_segment);
            (
                s.with_context(|| format!("cannot export {} to {}", args.store.display(), out.display())),
                out.display().to_string(),
            )
        }
        Target::Postgres => {
            let db = args.db.or_else(|| std::env::var("PCAPTOOL_DATABASE_URL").ok());
            let db = db.context("--to postgres needs --db URL (or PCAPTOOL_DATABASE_URL)")?;
            let mut opts = PostgresExport::new(&db, &sensor, &store_id)?;
            opts.schema = args.schema.clone();
            opts.packets = args.packets;
            let s = export_postgres(&store, &opts, &mut on_segment);
            (
                s.with_context(|| format!("cannot export {} to PostgreSQL", args.store.display())),
                format!("PostgreSQL schema {}", args.schema),
            )
        }
    };
    pb.finish_and_clear();
    if let Some(e) = failed {
        return Err(e);
    }
    let summary = summary?;
    let flows = summary.rows(|s| &s.flows);
    let packets = summary.rows(|s| &s.packets);
    let written = summary.exported.iter().flat_map(|s| s.flows.iter().chain(s.packets.iter()));
    let (files, bytes) = written.fold((0, 0), |(f, b), w| (f + w.files.len(), b + w.bytes));
    let secs = started.elapsed().as_secs_f64();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "event": "summary", "store": args.store, "to": dest, "sensor": sensor, "store_id": store_id,
                "segments": summary.exported.len(), "already_exported": summary.already, "flows": flows,
                "packets": packets, "files": files, "bytes": bytes, "seconds": secs,
            })
        );
    } else {
        outln!(
            "{}: {flows} flows{} of {} segments into {dest} ({files} files, {bytes} bytes) in {secs:.2} s{}",
            args.store.display(),
            if args.packets { format!(" and {packets} packets") } else { String::new() },
            summary.exported.len(),
            if summary.already > 0 {
                format!("; {} segments were exported before", summary.already)
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
