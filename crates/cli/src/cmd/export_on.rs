//! `pcaptool export STORE --to parquet --out DIR` and `--to postgres --db URL`: a flow store's flows (and, with
//! `--packets`, its packets) as Parquet files partitioned by sensor, date and hour, for DuckDB, Spark and Trino,
//! or as PostgreSQL tables (docs/analysis.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use pcaptool_export::{ExportedSegment, Load, ParquetExport, PostgresExport, export_parquet, export_postgres};

use crate::cmd::store::WorkStore;
use crate::progress;

/// What an export writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Target {
    /// Parquet files under --out, partitioned Hive-style (`flows/sensor=…/date=…/hour=…/part-….parquet`).
    Parquet,
    /// PostgreSQL tables (flows, packets, segments) in the database --db names, loaded by binary COPY.
    Postgres,
}

/// How `--to postgres` loads (see [`Load`]).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum LoadArg {
    Auto,
    Segments,
    Bulk,
}

/// Arguments of `pcaptool export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The flow store to export, or a trace (pcap or pcapng, possibly compressed): a trace is imported first into
    /// a temporary store (the importer's flow tracking and segments), which is removed afterwards.
    store: PathBuf,
    /// Where a trace's temporary store goes (default: a hidden directory in --out, or the system's temporary
    /// directory for --to postgres); it takes about the trace's size.
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
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
    /// PostgreSQL connections loading segments side by side, one transaction each (default: this machine's
    /// processors, at most 4).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    connections: Option<u16>,
    /// How --to postgres loads: `segments`, a transaction per segment (each visible once committed, readers go
    /// on); `bulk`, all in one transaction with the tables locked and their indexes built again at the end
    /// (faster for large loads); `auto`, bulk when the load has 100,000 rows or more and at least as many as the
    /// tables hold.
    #[arg(long, value_enum, default_value = "auto")]
    load: LoadArg,
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

pub(crate) fn host_name() -> String {
    tidy(&std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default())
}

pub(crate) fn dir_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    tidy(&canonical.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let work = if args.store.is_dir() {
        None
    } else {
        let under = match (&args.work_dir, args.to, &args.out) {
            (Some(d), _, _) => d.clone(),
            (None, Target::Parquet, Some(out)) => out.clone(),
            _ => std::env::temp_dir(),
        };
        Some(WorkStore::import(std::slice::from_ref(&args.store), &under, "exported")?)
    };
    let store_dir = work.as_ref().map_or(args.store.as_path(), |w| w.dir());
    let store = crate::cmd::store::open_store(store_dir, false)?;
    let sensor = args.sensor.unwrap_or_else(host_name);
    let store_id = args.store_id.unwrap_or_else(|| match &work {
        Some(_) => tidy(&args.store.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        None => dir_name(&args.store),
    });
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
            if let Some(n) = args.connections {
                opts.connections = usize::from(n);
            }
            opts.packets = args.packets;
            opts.load = match args.load {
                LoadArg::Auto => Load::Auto,
                LoadArg::Segments => Load::Segments,
                LoadArg::Bulk => Load::Bulk,
            };
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
                "load": matches!(args.to, Target::Postgres).then_some(if summary.bulk { "bulk" } else { "segments" }),
            })
        );
    } else {
        outln!(
            "{}: {flows} flows{} of {} segments into {dest} ({files} files, {bytes} bytes{}) in {secs:.2} s{}",
            args.store.display(),
            if args.packets { format!(" and {packets} packets") } else { String::new() },
            summary.exported.len(),
            if summary.bulk { "; in one transaction, indexes built at its end" } else { "" },
            if summary.already > 0 {
                format!("; {} segments were exported before", summary.already)
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A capture's exporter (`pcaptool capture --export DIR`): a thread that exports the store's closed segments to
/// Parquet as they appear (looking every `every`, on one thread of its own so that it never takes more than one
/// processor from the capture), and exports the rest when the capture ends.
pub(crate) struct CaptureExport {
    store: PathBuf,
    opts: ParquetExport,
    /// The one thread exports run on (made once: a capture runs for days).
    pool: std::sync::Arc<rayon::ThreadPool>,
    wake: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CaptureExport {
    /// Checks the names and starts the thread.
    pub(crate) fn start(
        store: &Path,
        out: &Path,
        sensor: Option<String>,
        packets: bool,
        every: std::time::Duration,
    ) -> anyhow::Result<CaptureExport> {
        let sensor = sensor.unwrap_or_else(host_name);
        let mut opts = ParquetExport::new(out, &sensor, &dir_name(store))?;
        opts.packets = packets;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "export".into()).build()?;
        let pool = std::sync::Arc::new(pool);
        let wake = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let thread = {
            let (store, opts, pool, wake) = (store.to_path_buf(), opts.clone(), pool.clone(), wake.clone());
            std::thread::Builder::new().name("export".into()).spawn(move || {
                let mut said = None;
                loop {
                    let (stop, cv) = &*wake;
                    let guard = stop.lock().unwrap_or_else(|e| e.into_inner());
                    let (guard, _) = cv.wait_timeout_while(guard, every, |s| !*s).unwrap_or_else(|e| e.into_inner());
                    if *guard {
                        return;
                    }
                    drop(guard);
                    // A failure (a full disk under DIR) must not stop the capture: said once, tried again later,
                    // and the final export reports it.
                    if let Err(e) = export_once(&pool, &store, &opts) {
                        let text = format!("{e:#}");
                        if said.as_ref() != Some(&text) {
                            eprintln!("pcaptool: warning: exporting while capturing: {text} (trying again)");
                            said = Some(text);
                        }
                    }
                }
            })?
        };
        Ok(CaptureExport { store: store.to_path_buf(), opts, pool, wake, thread: Some(thread) })
    }

    /// Stops the thread and exports what it has not (the capture's last segments): what was exported by the
    /// thread and now, in segments and flow rows.
    pub(crate) fn finish(mut self) -> anyhow::Result<(usize, u64)> {
        let (stop, cv) = &*self.wake;
        *stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        export_once(&self.pool, &self.store, &self.opts)?;
        let manifest = pcaptool_export::Manifest::load(&self.opts.out)?;
        let mine = manifest.segments().iter().filter(|s| s.sensor == self.opts.sensor && s.store == self.opts.store);
        let (segments, flows) = mine.fold((0, 0), |(n, f), s| (n + 1, f + s.flows.as_ref().map_or(0, |w| w.rows)));
        Ok((segments, flows))
    }

    /// The export directory.
    pub(crate) fn out(&self) -> &Path {
        &self.opts.out
    }
}

/// One pass of a capture's exporter: the store opened as a reader (the capture's closed segments), its segments
/// not yet exported exported on `pool`.
fn export_once(pool: &rayon::ThreadPool, store: &Path, opts: &ParquetExport) -> anyhow::Result<()> {
    let store_dir = store;
    let store = crate::cmd::store::open_store(store, false)?;
    pool.install(|| export_parquet(&store, opts, &mut |_| ()))
        .with_context(|| format!("cannot export {} to {}", store_dir.display(), opts.out.display()))?;
    Ok(())
}
