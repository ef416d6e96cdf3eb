//! Flows as Arrow columns and Parquet files: the schema (docs/analysis.md describes each column), the partition
//! of a flow, and the writer's settings.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use pcaptool_flowstore::Flow;
use pcaptool_packet::Rfc3339;

/// The flow table's columns, in order: name and Arrow type.
pub const FLOW_COLUMNS: [(&str, DataType); 21] = [
    ("store", DataType::Utf8),
    ("segment", DataType::Int64),
    ("flow_id", DataType::Int64),
    ("ts", DataType::Timestamp(TimeUnit::Nanosecond, None)),
    ("ts_last", DataType::Timestamp(TimeUnit::Nanosecond, None)),
    ("duration_ns", DataType::Int64),
    ("orig_h", DataType::Utf8),
    ("orig_p", DataType::Int32),
    ("resp_h", DataType::Utf8),
    ("resp_p", DataType::Int32),
    ("proto", DataType::Int16),
    ("vlan", DataType::Int32),
    ("conn_state", DataType::Utf8),
    ("orig_pkts", DataType::Int64),
    ("orig_bytes", DataType::Int64),
    ("orig_payload", DataType::Int64),
    ("orig_flags", DataType::Int16),
    ("resp_pkts", DataType::Int64),
    ("resp_bytes", DataType::Int64),
    ("resp_payload", DataType::Int64),
    ("resp_flags", DataType::Int16),
];

/// The flow table's Arrow schema: [`FLOW_COLUMNS`], timestamps in UTC, no column nullable.
pub fn flow_schema() -> Arc<Schema> {
    let fields: Vec<Field> = FLOW_COLUMNS
        .iter()
        .map(|(name, t)| {
            let t = match t {
                DataType::Timestamp(unit, _) => DataType::Timestamp(*unit, Some("UTC".into())),
                t => t.clone(),
            };
            Field::new(*name, t, false)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The flows grouped by the partition of their first packet's time (`date=YYYY-MM-DD/hour=HH`, UTC), each group
/// in time order (then by flow id), the groups in time order.
pub(crate) fn by_hour(flows: Vec<Flow>) -> Vec<(String, Vec<Flow>)> {
    let mut groups: BTreeMap<u64, Vec<Flow>> = BTreeMap::new();
    for f in flows {
        groups.entry(f.first_ns / 3_600_000_000_000).or_default().push(f);
    }
    groups
        .into_values()
        .map(|mut v| {
            v.sort_by_key(|f| (f.first_ns, f.id));
            let t = Rfc3339(v[0].first_ns).to_string();
            (format!("date={}/hour={}", &t[..10], &t[11..13]), v)
        })
        .collect()
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The rows of `flows` (parts in segment `segment` of the store named `store`) as one batch.
pub(crate) fn flow_batch(flows: &[Flow], store: &str, segment: u32) -> RecordBatch {
    let int64 =
        |f: &dyn Fn(&Flow) -> u64| Arc::new(Int64Array::from_iter_values(flows.iter().map(|x| ns(f(x))))) as ArrayRef;
    let int32 = |f: &dyn Fn(&Flow) -> u16| {
        Arc::new(Int32Array::from_iter_values(flows.iter().map(|x| i32::from(f(x))))) as ArrayRef
    };
    let int16 = |f: &dyn Fn(&Flow) -> u8| {
        Arc::new(Int16Array::from_iter_values(flows.iter().map(|x| i16::from(f(x))))) as ArrayRef
    };
    let text = |f: &dyn Fn(&Flow) -> String| Arc::new(StringArray::from_iter_values(flows.iter().map(f))) as ArrayRef;
    let time = |f: &dyn Fn(&Flow) -> u64| {
        Arc::new(TimestampNanosecondArray::from_iter_values(flows.iter().map(|x| ns(f(x)))).with_timezone("UTC"))
            as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        text(&|_| store.to_string()),
        int64(&|_| u64::from(segment)),
        int64(&|f| f.id),
        time(&|f| f.first_ns),
        time(&|f| f.last_ns),
        int64(&|f| f.last_ns.saturating_sub(f.first_ns)),
        text(&|f| f.orig_endpoint().0.to_string()),
        int32(&|f| f.orig_endpoint().1),
        text(&|f| f.resp_endpoint().0.to_string()),
        int32(&|f| f.resp_endpoint().1),
        int16(&|f| f.key.proto.0),
        int32(&|f| f.key.vlan),
        text(&|f| f.state.name().to_string()),
        int64(&|f| f.orig.packets),
        int64(&|f| f.orig.bytes),
        int64(&|f| f.orig.payload),
        int16(&|f| f.orig.flags),
        int64(&|f| f.resp.packets),
        int64(&|f| f.resp.bytes),
        int64(&|f| f.resp.payload),
        int16(&|f| f.resp.flags),
    ];
    RecordBatch::try_new(flow_schema(), columns).expect("the columns follow the schema")
}

/// Writes `batch` as a Parquet file: Zstandard pages (read by DuckDB, Spark and Trino), times and ids delta-coded,
/// statistics per page and row group (so that engines skip groups by time, address and port), row groups of at
/// most `row_group_rows` rows.
pub(crate) fn write_parquet(
    file: &mut File,
    batch: &RecordBatch,
    row_group_rows: usize,
) -> Result<(), parquet::errors::ParquetError> {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_created_by(format!("pcaptool {}", env!("CARGO_PKG_VERSION")));
    // Times and ids grow row by row (rows are in time order; ids in order of first packet): differences pack into
    // a few bits, where a dictionary of distinct values would only grow.
    for col in ["ts", "ts_last", "flow_id"] {
        props = props
            .set_column_dictionary_enabled(ColumnPath::from(col), false)
            .set_column_encoding(ColumnPath::from(col), Encoding::DELTA_BINARY_PACKED);
    }
    let props = props.build();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(())
}
