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

use crate::packets::PacketRow;

/// The flow table's columns, in order: name and Arrow type.
pub const FLOW_COLUMNS: [(&str, DataType); 20] = [
    ("store", DataType::Utf8),
    ("segment", DataType::Int64),
    ("flow_id", DataType::Int64),
    ("ts", DataType::Timestamp(TimeUnit::Nanosecond, None)),
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
    let fields: Vec<Field> = FLOW_COLUMNS.iter().map(|(name, t)| Field::new(*name, utc(t), false)).collect();
    Arc::new(Schema::new(fields))
}

/// The packet table's columns, in order: name, Arrow type, and whether it may be null (the IP fields of a packet
/// without an IP header, the ports of a protocol without ports, the flags of a packet other than TCP).
pub const PACKET_COLUMNS: [(&str, DataType, bool); 15] = [
    ("store", DataType::Utf8, false),
    ("segment", DataType::Int64, false),
    ("seq", DataType::Int64, false),
    ("flow_id", DataType::Int64, true),
    ("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), false),
    ("caplen", DataType::Int32, false),
    ("wirelen", DataType::Int32, false),
    ("iface", DataType::Int32, false),
    ("src_h", DataType::Utf8, true),
    ("src_p", DataType::Int32, true),
    ("dst_h", DataType::Utf8, true),
    ("dst_p", DataType::Int32, true),
    ("proto", DataType::Int16, true),
    ("vlan", DataType::Int32, false),
    ("tcp_flags", DataType::Int16, true),
];

/// The packet table's Arrow schema: [`PACKET_COLUMNS`], timestamps in UTC.
pub fn packet_schema() -> Arc<Schema> {
    let fields: Vec<Field> = PACKET_COLUMNS.iter().map(|(name, t, null)| Field::new(*name, utc(t), *null)).collect();
    Arc::new(Schema::new(fields))
}

fn utc(t: &DataType) -> DataType {
    match t {
        DataType::Timestamp(unit, _) => DataType::Timestamp(*unit, Some("UTC".into())),
        t => t.clone(),
    }
}

/// The hour partition (`date=YYYY-MM-DD/hour=HH`, UTC) of a time in ns.
fn hour_partition(ts_ns: u64) -> String {
    let t = Rfc3339(ts_ns / HOUR_NS * HOUR_NS).to_string();
    format!("date={}/hour={}", &t[..10], &t[11..13])
}

const HOUR_NS: u64 = 3_600_000_000_000;

/// The rows of `packets` (of segment `segment` of the store named `store`) as one batch.
pub(crate) fn packet_batch(packets: &[PacketRow], store: &str, segment: u32) -> RecordBatch {
    let opt64 = |f: &dyn Fn(&PacketRow) -> Option<u64>| {
        Arc::new(Int64Array::from_iter(packets.iter().map(|p| f(p).map(ns)))) as ArrayRef
    };
    let int32 = |f: &dyn Fn(&PacketRow) -> Option<u32>| {
        Arc::new(Int32Array::from_iter(packets.iter().map(|p| f(p).map(|v| i32::try_from(v).unwrap_or(i32::MAX)))))
            as ArrayRef
    };
    let int16 = |f: &dyn Fn(&PacketRow) -> Option<u8>| {
        Arc::new(Int16Array::from_iter(packets.iter().map(|p| f(p).map(i16::from)))) as ArrayRef
    };
    let addr = |f: &dyn Fn(&PacketRow) -> Option<std::net::IpAddr>| {
        Arc::new(StringArray::from_iter(packets.iter().map(|p| f(p).map(|a| a.to_string())))) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(packets.iter().map(|_| store))),
        opt64(&|_| Some(u64::from(segment))),
        opt64(&|p| Some(p.seq)),
        opt64(&|p| p.flow_id),
        Arc::new(TimestampNanosecondArray::from_iter_values(packets.iter().map(|p| ns(p.ts_ns))).with_timezone("UTC")),
        int32(&|p| Some(p.caplen)),
        int32(&|p| Some(p.wirelen)),
        int32(&|p| Some(p.iface)),
        addr(&|p| p.src),
        int32(&|p| p.sport.map(u32::from)),
        addr(&|p| p.dst),
        int32(&|p| p.dport.map(u32::from)),
        int16(&|p| p.proto),
        int32(&|p| Some(u32::from(p.vlan))),
        int16(&|p| p.tcp_flags),
    ];
    RecordBatch::try_new(packet_schema(), columns).expect("the columns follow the schema")
}

/// `rows` grouped by the hour partition (`date=YYYY-MM-DD/hour=HH`, UTC) of their time `ts`, the groups in time
/// order, each in the order given.
pub(crate) fn by_hour<T>(rows: Vec<T>, ts: impl Fn(&T) -> u64) -> Vec<(String, Vec<T>)> {
    let mut groups: BTreeMap<u64, Vec<T>> = BTreeMap::new();
    for r in rows {
        groups.entry(ts(&r) / HOUR_NS).or_default().push(r);
    }
    groups.into_iter().map(|(h, v)| (hour_partition(h * HOUR_NS), v)).collect()
}

/// The flows grouped by the hour of their first packet, each group in time order (then by flow id).
pub(crate) fn flows_by_hour(mut flows: Vec<Flow>) -> Vec<(String, Vec<Flow>)> {
    flows.sort_by_key(|f| (f.first_ns, f.id));
    by_hour(flows, |f| f.first_ns)
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

/// How a table's columns are encoded where the `parquet` crate's default (a dictionary, falling back to plain
/// values when it grows too large) does worse.
pub(crate) struct Encodings {
    /// Columns that grow, or wander little, row by row: differences pack into a few bits
    /// (`DELTA_BINARY_PACKED`), where a dictionary of distinct values would only grow.
    pub(crate) delta: &'static [&'static str],
    /// Columns of mostly distinct values: plain values, Zstandard-compressed, without a dictionary that would
    /// only be built, outgrow its limit and be dropped page by page.
    pub(crate) plain: &'static [&'static str],
}

/// The flow table's encodings. Measured on the bench stores (`cargo xtask bench --only export`): without them
/// the export was 1.26 (generated) and 1.66 (real) times the store's flow index; with them 0.93 and 1.38. Times
/// and ids grow (rows are in time order, ids in order of first packet); an originator's port is mostly an
/// ephemeral port near the last one; durations, byte counts and (on real traffic) originators are mostly
/// distinct.
pub(crate) const FLOW_ENCODINGS: Encodings = Encodings {
    delta: &["ts", "flow_id", "orig_p"],
    plain: &["duration_ns", "orig_h", "orig_bytes", "orig_payload", "resp_bytes", "resp_payload"],
};

/// The packet table's encodings: positions and times grow row by row.
pub(crate) const PACKET_ENCODINGS: Encodings = Encodings { delta: &["seq", "ts"], plain: &[] };

/// Writes `batch` as a Parquet file: Zstandard pages (read by DuckDB, Spark and Trino), columns encoded as `enc`
/// says, statistics per page and row group (so that engines skip groups by time, address and port), row groups
/// of at most `row_group_rows` rows.
pub(crate) fn write_parquet(
    file: &mut File,
    batch: &RecordBatch,
    row_group_rows: usize,
    enc: &Encodings,
) -> Result<(), parquet::errors::ParquetError> {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_created_by(format!("pcaptool {}", env!("CARGO_PKG_VERSION")));
    for &col in enc.plain {
        props = props.set_column_dictionary_enabled(ColumnPath::from(col), false);
    }
    for &col in enc.delta {
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
