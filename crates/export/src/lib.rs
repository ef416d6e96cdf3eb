//! A flow store's flows (and, when asked, one row of metadata per packet) for the engines analysts already run:
//! Parquet files partitioned Hive-style by sensor, date and hour for DuckDB on a laptop and Spark or Trino on a
//! cluster ([`export_parquet`]), and PostgreSQL tables loaded by binary `COPY`, with InTraBase's c-query as a
//! function ([`export_postgres`]). Each row carries its locator (store, segment, flow id; and the packet's
//! position for packets), which leads back to the packets in the store.
//!
//! Exports are incremental, segment by segment, and crash-safe. A Parquet export keeps a manifest in its
//! directory (see docs/format/export.md) and writes each file aside, synced, then renamed into place; a segment
//! enters the manifest only once all its files are, so a run killed anywhere leaves no partial file visible and
//! the next run writes that segment's files again under the same names. A PostgreSQL export replaces a
//! segment's rows and records it in its `segments` table inside one transaction.
//!
//! ```no_run
//! use pcaptool_export::{ParquetExport, export_parquet};
//! let store = pcaptool_flowstore::Store::open("store".as_ref())?;
//! let opts = ParquetExport::new("export", "sensor-1", "store")?;
//! let summary = export_parquet(&store, &opts, &mut |seg| println!("segment {} exported", seg.segment))?;
//! println!("{} segments exported, {} already", summary.exported.len(), summary.already);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod manifest;
mod packets;
mod parquet_dir;
mod postgres;
mod rows;

use std::path::{Path, PathBuf};

use pcaptool_flowstore::{Segment, Store, StoreError};

pub use manifest::{ExportedSegment, MANIFEST, Manifest, Written};
pub use packets::PacketRow;
pub use parquet_dir::{LOCK, ParquetExport, export_parquet};
pub use postgres::{BULK_MIN_ROWS, Load, PostgresExport, export_postgres};
pub use rows::{FLOW_COLUMNS, PACKET_COLUMNS, flow_schema, packet_schema};

/// Refuses a name that is not a safe, visible path component.
fn check_name(what: &'static str, name: &str) -> Result<(), ExportError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '_'])
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok { Ok(()) } else { Err(ExportError::Name { what, name: name.to_string() }) }
}

/// Which tables of a segment a run writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tables {
    pub(crate) flows: bool,
    pub(crate) packets: bool,
}

/// What each segment of `store` lacks, given what `exported` says a segment number has (its flows, its
/// packets): the segments with the tables to write (packets only when `packets` asks), and how many lack
/// nothing.
pub(crate) fn pending(
    store: &Store,
    packets: bool,
    exported: impl Fn(u32) -> (bool, bool),
) -> (Vec<(&Segment, Tables)>, u32) {
    let mut pending = Vec::new();
    let mut already = 0;
    for seg in store.segments() {
        let (has_flows, has_packets) = exported(seg.stage1.number);
        let tables = Tables { flows: !has_flows, packets: packets && !has_packets };
        if tables.flows || tables.packets {
            pending.push((seg, tables));
        } else {
            already += 1;
        }
    }
    (pending, already)
}

/// What a run exported.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// What this run exported of each segment, in the store's order.
    pub exported: Vec<ExportedSegment>,
    /// Segments exported before (with the tables asked for), left alone.
    pub already: u32,
    /// Whether the rows went into PostgreSQL in one transaction, the indexes built at its end
    /// ([`Load::Bulk`]).
    pub bulk: bool,
}

impl Summary {
    /// Rows of one table over the segments exported: `table` picks it.
    pub fn rows(&self, table: fn(&ExportedSegment) -> &Option<Written>) -> u64 {
        self.exported.iter().filter_map(|s| table(s).as_ref()).map(|w| w.rows).sum()
    }
}

/// Why an export failed. What was exported before the failure stays exported (and listed in the manifest, or
/// in PostgreSQL's `segments` table), except in a bulk load into PostgreSQL ([`Load::Bulk`]): that is one
/// transaction, and its failure leaves the tables as they were.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// A sensor or store name that cannot name a partition or file.
    #[error(
        "invalid {what} name {name:?}: use letters, digits, '.', '_' and '-' (at most 128, not starting with '.' \
         or '_')"
    )]
    Name { what: &'static str, name: String },
    /// A segment of the store could not be read.
    #[error("cannot read segment {segment} of {}", dir.display())]
    Store {
        dir: PathBuf,
        segment: u32,
        #[source]
        source: StoreError,
    },
    /// A file of the export could not be written (or read, for the manifest).
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("cannot write the Parquet file {}", path.display())]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// The manifest is not one this version wrote, or is damaged.
    #[error(
        "the export manifest {} is unreadable ({why}): move it aside and run the export again to rewrite every \
         segment's files",
        path.display()
    )]
    Manifest { path: PathBuf, why: String },
    /// Another export into the same directory is running.
    #[error("another export into {} is running (it holds {}): wait for it to finish", dir.display(), lock.display())]
    Locked { dir: PathBuf, lock: PathBuf },
    /// PostgreSQL refused or failed: `doing` says what the export was doing (connecting, creating the tables,
    /// loading a segment).
    #[error("PostgreSQL: {doing}: {}", pg_message(source))]
    Postgres {
        doing: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// The database's own message when it sent one (tokio-postgres's `Display` says only "db error").
fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

impl ExportError {
    fn io(path: &Path, source: std::io::Error) -> ExportError {
        ExportError::Io { path: path.to_path_buf(), source }
    }
}
