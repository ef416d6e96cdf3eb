//! The PostgreSQL export, as InTraBase keeps traffic: tables of flows, packets and segments (created if missing,
//! with indexes on time, addresses and ports), loaded by binary `COPY` through tokio-postgres, each segment's rows
//! replaced and recorded inside one transaction, and InTraBase's c-query as the function `c_query`.
//!
//! Segments are read and encoded on rayon's threads while connections load them, a segment per transaction
//! ([`Load::Segments`]), or one connection loads them all in one transaction with the tables' indexes dropped
//! and built again at its end ([`Load::Bulk`]: a first load, or one that at least doubles the tables). A run
//! holds a session advisory lock on its sensor and store, so two runs never load the same segments; the server
//! lets go of it however the run ends.

use std::net::IpAddr;
use std::str::FromStr;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use pcaptool_flowstore::{Flow, Segment, Store};
use rayon::prelude::*;
use tokio_postgres::{Client, NoTls};

use crate::manifest::{ExportedSegment, Written};
use crate::packets::{PacketRow, read_segment};
use crate::{ExportError, Summary, Tables, check_name};

/// Where rows go in PostgreSQL, and the names they go under.
#[derive(Clone, Debug)]
pub struct PostgresExport {
    /// The connection string: a URL (`postgresql://user:password@host:port/db`) or libpq's `key=value` form.
    /// Connections are not encrypted (a local server, or one reached through a tunnel).
    pub url: String,
    /// The schema that holds the tables (created if missing).
    pub schema: String,
    /// The sensor's name, in each row.
    pub sensor: String,
    /// The store's name, in each row's locator.
    pub store: String,
    /// Whether to load one row per packet too, for segments whose packets are not loaded yet.
    pub packets: bool,
    /// Connections loading segments side by side (at least 1), when segments are loaded one per transaction.
    pub connections: usize,
    /// How the segments are loaded: a transaction each, or all in one with the indexes built at the end.
    pub load: Load,
}

/// How a run loads its segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Load {
    /// [`Bulk`](Load::Bulk) when the rows to load are at least [`BULK_MIN_ROWS`] and at least as many as each
    /// table they go into holds (a first load, or one that at least doubles its tables), [`Segments`](Load::Segments)
    /// otherwise.
    #[default]
    Auto,
    /// A transaction per segment, over [`connections`](PostgresExport::connections) connections: each segment is
    /// visible once committed, and readers go on meanwhile. Every row goes into every index as it is copied.
    Segments,
    /// One transaction for the run, on one connection: the tables taken for the run (readers wait for it), the
    /// pending segments' old rows deleted, the tables' keys and indexes dropped, every segment's rows copied, the
    /// keys and indexes built again (sorting the rows once, where a row at a time costs a descent of each B-tree:
    /// COPY of 325,906 flows into the indexed table took 1.9 times as long as into the bare table and building
    /// after), the segments recorded. A run stopped anywhere leaves the tables as they were.
    Bulk,
}

/// The fewest rows (flows and packets) that [`Load::Auto`] loads in bulk: below it a load is short anyway, and
/// segments appear one by one.
pub const BULK_MIN_ROWS: u64 = 100_000;

impl PostgresExport {
    /// An export into the database at `url`, schema `pcaptool`, under these names (see
    /// [`ParquetExport::new`](crate::ParquetExport::new)).
    pub fn new(url: &str, sensor: &str, store: &str) -> Result<PostgresExport, ExportError> {
        check_name("sensor", sensor)?;
        check_name("store", store)?;
        Ok(PostgresExport {
            url: url.to_string(),
            schema: "pcaptool".to_string(),
            sensor: sensor.to_string(),
            store: store.to_string(),
            packets: false,
            connections: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
            load: Load::Auto,
        })
    }
}

/// Refuses a schema name that would need quoting rules beyond a plain identifier.
fn check_schema(schema: &str) -> Result<(), ExportError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok { Ok(()) } else { Err(ExportError::Name { what: "schema", name: schema.to_string() }) }
}

/// The tables, their indexes, and the c-query, in schema `{s}` (idempotent). The names in the keys compare
/// byte by byte (`COLLATE "C"`), whatever the database's locale. A flow's key leads with its id so that one
/// index serves both a flow's rows and the uniqueness of each segment's part: indexes are most of a load's time
/// (`COPY` of 325,906 flows from psql: 0.55 s into the bare table, 1.18 s with the key alone, 3.5 s with the
/// key, four more B-trees and a BRIN). The keys lead with numbers, not with the names (the same in every row of
/// a store): building the flows' key from the real store's rows took 0.19 s so, 0.61-0.64 s names first.
const DDL: &str = r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.segments (
    sensor text COLLATE "C" NOT NULL,
    store text COLLATE "C" NOT NULL,
    segment bigint NOT NULL,
    flows bigint,
    packets bigint,
    exported_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sensor, store, segment)
);
CREATE TABLE IF NOT EXISTS {s}.flows (
    sensor text COLLATE "C" NOT NULL,
    store text COLLATE "C" NOT NULL,
    segment bigint NOT NULL,
    flow_id bigint NOT NULL,
    ts timestamptz NOT NULL,
    duration_ns bigint NOT NULL,
    orig_h inet NOT NULL,
    orig_p integer NOT NULL,
    resp_h inet NOT NULL,
    resp_p integer NOT NULL,
    proto smallint NOT NULL,
    vlan integer NOT NULL,
    conn_state text NOT NULL,
    orig_pkts bigint NOT NULL,
    orig_bytes bigint NOT NULL,
    orig_payload bigint NOT NULL,
    orig_flags smallint NOT NULL,
    resp_pkts bigint NOT NULL,
    resp_bytes bigint NOT NULL,
    resp_payload bigint NOT NULL,
    resp_flags smallint NOT NULL,
    CONSTRAINT {flows_pkey}
);
CREATE TABLE IF NOT EXISTS {s}.packets (
    sensor text COLLATE "C" NOT NULL,
    store text COLLATE "C" NOT NULL,
    segment bigint NOT NULL,
    seq bigint NOT NULL,
    flow_id bigint,
    ts timestamptz NOT NULL,
    caplen integer NOT NULL,
    wirelen integer NOT NULL,
    iface integer NOT NULL,
    src_h inet,
    src_p integer,
    dst_h inet,
    dst_p integer,
    proto smallint,
    vlan integer NOT NULL,
    tcp_flags smallint,
    CONSTRAINT {packets_pkey}
);
{indexes}
CREATE OR REPLACE FUNCTION {s}.c_query(p_sensor text, p_store text, p_flow bigint)
RETURNS TABLE (segment bigint, seq bigint, ts timestamptz, caplen integer, wirelen integer, src_h inet,
               src_p integer, dst_h inet, dst_p integer, tcp_flags smallint)
LANGUAGE sql STABLE AS $$
    SELECT p.segment, p.seq, p.ts, p.caplen, p.wirelen, p.src_h, p.src_p, p.dst_h, p.dst_p, p.tcp_flags
    FROM {s}.packets p
    WHERE p.sensor = p_sensor AND p.store = p_store AND p.flow_id = p_flow
    ORDER BY p.seq
$$;
COMMENT ON FUNCTION {s}.c_query(text, text, bigint) IS
    'InTraBase''s c-query: the packets of one connection (flow id) of a sensor''s store, in the store''s order';
"#;

/// The loaded tables' keys and indexes: table, name, and the definition after the name (a key's starts with
/// `PRIMARY KEY`). The DDL creates them; a bulk load drops and builds them again.
const INDEXES: [(&str, &str, &str); 11] = [
    ("flows", "flows_pkey", "PRIMARY KEY (flow_id, segment, sensor, store)"),
    ("flows", "flows_ts", "ON {s}.flows USING brin (ts)"),
    ("flows", "flows_orig_h", "ON {s}.flows (orig_h)"),
    ("flows", "flows_resp_h", "ON {s}.flows (resp_h)"),
    ("flows", "flows_resp_p", "ON {s}.flows (resp_p)"),
    ("packets", "packets_pkey", "PRIMARY KEY (segment, seq, sensor, store)"),
    ("packets", "packets_ts", "ON {s}.packets USING brin (ts)"),
    ("packets", "packets_flow", "ON {s}.packets (flow_id, seq, sensor, store)"),
    ("packets", "packets_src_h", "ON {s}.packets (src_h)"),
    ("packets", "packets_dst_h", "ON {s}.packets (dst_h)"),
    ("packets", "packets_dst_p", "ON {s}.packets (dst_p)"),
];

/// The DDL for schema `s`: the tables with their keys, the indexes, the c-query.
fn ddl(s: &str) -> String {
    let mut ddl = DDL.to_string();
    let mut indexes = String::new();
    for (_, name, def) in INDEXES {
        if def.starts_with("PRIMARY KEY") {
            ddl = ddl.replace(&format!("{{{name}}}"), &format!("{name} {def}"));
        } else {
            indexes.push_str(&format!("CREATE INDEX IF NOT EXISTS {name} {def};\n"));
        }
    }
    ddl.replace("{indexes}", &indexes).replace("{s}", s)
}

/// Statements that drop the keys and indexes of `table` in schema `s`.
fn drop_indexes(s: &str, table: &str) -> String {
    let mut sql = String::new();
    for (_, name, def) in INDEXES.iter().filter(|i| i.0 == table) {
        if def.starts_with("PRIMARY KEY") {
            sql.push_str(&format!("ALTER TABLE {s}.{table} DROP CONSTRAINT IF EXISTS {name};\n"));
        } else {
            sql.push_str(&format!("DROP INDEX IF EXISTS {s}.{name};\n"));
        }
    }
    sql
}

/// Statements that build the keys and indexes of `table` in schema `s`, the key first.
fn build_indexes(s: &str, table: &str) -> String {
    let mut sql = String::new();
    for (_, name, def) in INDEXES.iter().filter(|i| i.0 == table) {
        if def.starts_with("PRIMARY KEY") {
            sql.push_str(&format!("ALTER TABLE {s}.{table} ADD CONSTRAINT {name} {def};\n"));
        } else {
            sql.push_str(&format!("CREATE INDEX {name} {};\n", def.replace("{s}", s)));
        }
    }
    sql
}

/// The advisory lock keys: one for creating the tables, and the class of the per-store locks.
const LOCK_DDL: i64 = 0x7063_6170_7464_6c01;
const LOCK_CLASS: i32 = 0x7063_6170;
/// How long a run waits for another's lock on the same rows, in seconds.
const LOCK_WAIT_S: u32 = 10;

/// Exports the flows (and, with [`packets`](PostgresExport::packets), the packets) of every segment of `store`
/// that the `segments` table does not list with them yet: each segment's rows of those tables replaced and the
/// segment recorded in one transaction, so a run stopped anywhere leaves whole segments and the next run loads
/// the rest. Calls `on_segment` after each commit.
pub fn export_postgres(
    store: &Store,
    opts: &PostgresExport,
    on_segment: &mut (dyn FnMut(&ExportedSegment) + Send),
) -> Result<Summary, ExportError> {
    check_name("sensor", &opts.sensor)?;
    check_name("store", &opts.store)?;
    check_schema(&opts.schema)?;
    let pg = |doing: &str| {
        let doing = doing.to_string();
        move |source| ExportError::Postgres { doing: doing.clone(), source }
    };
    let config = tokio_postgres::Config::from_str(&opts.url).map_err(pg("reading the connection string"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ExportError::io(std::path::Path::new("tokio runtime"), e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Encoded, ExportError>>(2);
    std::thread::scope(|scope| {
        runtime.block_on(async {
            let (mut client, connection) = config.connect(NoTls).await.map_err(pg("connecting"))?;
            let conn = tokio::spawn(connection);
            let s = &opts.schema;
            {
                let t = client.transaction().await.map_err(pg("creating the tables"))?;
                t.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_DDL]).await.map_err(pg("creating the tables"))?;
                t.batch_execute(&ddl(s)).await.map_err(pg("creating the tables"))?;
                t.commit().await.map_err(pg("creating the tables"))?;
            }
            // The rows of this sensor and store in this schema are one run's. A run that was killed keeps its
            // lock until the server sees its connection close: waited for a few seconds, as another run is.
            let key = lock_key(s, &opts.sensor, &opts.store);
            let locking = pg("locking the store's rows");
            client.batch_execute(&format!("SET lock_timeout = '{}s'", LOCK_WAIT_S)).await.map_err(&locking)?;
            match client.execute("SELECT pg_advisory_lock($1, $2)", &[&LOCK_CLASS, &key]).await {
                Ok(_) => {}
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                    return Err(ExportError::Locked {
                        dir: format!("PostgreSQL schema {s}").into(),
                        lock: format!(
                            "advisory lock ({LOCK_CLASS}, {key}) for sensor {} store {}",
                            opts.sensor, opts.store
                        )
                        .into(),
                    });
                }
                Err(e) => return Err(locking(e)),
            }
            client.batch_execute("RESET lock_timeout").await.map_err(&locking)?;
            let listed = client
                .query(
                    &format!("SELECT segment, flows IS NOT NULL, packets IS NOT NULL FROM {s}.segments WHERE sensor = $1 AND store = $2"),
                    &[&opts.sensor, &opts.store],
                )
                .await
                .map_err(pg("reading the segments table"))?;
            let listed: std::collections::HashMap<i64, (bool, bool)> =
                listed.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
            let (pending, already) = crate::pending(store, opts.packets, |n| {
                listed.get(&i64::from(n)).copied().unwrap_or((false, false))
            });
            let bulk = match opts.load {
                Load::Bulk => !pending.is_empty(),
                Load::Segments => false,
                Load::Auto => bulk_pays(&client, s, &pending).await.map_err(pg("counting the tables' rows"))?,
            };
            // Read and encode on rayon's threads; load over `connections` connections, a segment at a time on
            // each (the server then spreads the index work over its processors), or in bulk over the first. The
            // first connection holds the lock until all are done.
            let numbers = |pick: fn(&Tables) -> bool| -> Vec<i64> {
                pending.iter().filter(|(_, t)| pick(t)).map(|(seg, _)| i64::from(seg.stage1.number)).collect()
            };
            let replaced = [("flows", numbers(|t| t.flows)), ("packets", numbers(|t| t.packets))];
            scope.spawn(move || {
                let _ = pending.par_iter().try_for_each(|&(seg, tables)| {
                    let encoded = encode_segment(store, seg, tables, opts);
                    tx.blocking_send(encoded).map_err(|_| ())
                });
            });
            if bulk {
                let mut rx = rx;
                let loaded = load_bulk(&mut client, s, opts, &replaced, &mut rx).await;
                drop(client);
                let _ = conn.await;
                let mut exported = loaded?;
                exported.sort_by_key(|e| e.segment);
                for e in &exported {
                    on_segment(e);
                }
                return Ok(Summary { exported, already, bulk: true });
            }
            let mut clients = vec![client];
            let mut conns = vec![conn];
            for _ in 1..opts.connections.max(1) {
                let (client, connection) = config.connect(NoTls).await.map_err(pg("connecting"))?;
                conns.push(tokio::spawn(connection));
                clients.push(client);
            }
            let rx = tokio::sync::Mutex::new(rx);
            let finished = std::sync::Mutex::new((Vec::new(), on_segment));
            let loaders = clients.iter_mut().map(|client| {
                let (rx, finished) = (&rx, &finished);
                async move {
                    loop {
                        let next = rx.lock().await.recv().await;
                        let Some(encoded) = next else { return Ok::<(), ExportError>(()) };
                        let done = load(client, s, opts, encoded?).await?;
                        let mut f = finished.lock().unwrap_or_else(|e| e.into_inner());
                        (f.1)(&done);
                        f.0.push(done);
                    }
                }
            });
            let loaded = futures_util::future::try_join_all(loaders).await;
            drop(clients);
            for conn in conns {
                let _ = conn.await;
            }
            loaded?;
            let mut exported = finished.into_inner().unwrap_or_else(|e| e.into_inner()).0;
            exported.sort_by_key(|e| e.segment);
            Ok(Summary { exported, already, bulk: false })
        })
    })
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The per-store lock's key: a hash of the schema's, sensor's and store's names.
fn lock_key(schema: &str, sensor: &str, store: &str) -> i32 {
    let h = crc32c::crc32c(format!("{schema}\0{sensor}\0{store}").as_bytes());
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// A segment's rows in `COPY`'s binary format, in pieces of about [`PIECE`] bytes.
struct Encoded {
    segment: u32,
    /// The least and greatest flow id of its flows.
    flow_ids: (u64, u64),
    flows: Option<(u64, Vec<Bytes>)>,
    packets: Option<(u64, Vec<Bytes>)>,
}

/// The size of the pieces a segment's rows are sent in.
const PIECE: usize = 1 << 22;

fn encode_segment(store: &Store, seg: &Segment, tables: Tables, opts: &PostgresExport) -> Result<Encoded, ExportError> {
    let number = seg.stage1.number;
    let rows = read_segment(seg, tables.packets).map_err(|source| ExportError::Store {
        dir: store.dir().to_path_buf(),
        segment: number,
        source,
    })?;
    let names = (opts.sensor.as_str(), opts.store.as_str(), number);
    let ids = rows.flows.iter().map(|f| f.id);
    let flow_ids = (ids.clone().min().unwrap_or(0), ids.max().unwrap_or(0));
    let flows = tables.flows.then(|| (rows.flows.len() as u64, encode(&rows.flows, |c, f| flow_row(c, names, f))));
    let packets = rows.packets.map(|p| (p.len() as u64, encode(&p, |c, r| packet_row(c, names, r))));
    Ok(Encoded { segment: number, flow_ids, packets, flows })
}

/// Rows in `COPY`'s binary format: the header, each row by `row`, the trailer; cut into pieces.
fn encode<T>(rows: &[T], row: impl Fn(&mut Copy, &T)) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let mut c = Copy(BytesMut::with_capacity(PIECE + 4096));
    c.0.put_slice(b"PGCOPY\n\xff\r\n\0");
    c.0.put_i32(0); // flags
    c.0.put_i32(0); // header extension length
    for r in rows {
        row(&mut c, r);
        if c.0.len() >= PIECE {
            pieces.push(c.0.split().freeze());
        }
    }
    c.0.put_i16(-1);
    pieces.push(c.0.freeze());
    pieces
}

/// A buffer of `COPY` binary rows: each field its length (-1 for NULL) and its value in the type's binary form.
struct Copy(BytesMut);

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

impl Copy {
    fn fields(&mut self, n: i16) {
        self.0.put_i16(n);
    }
    fn null(&mut self) {
        self.0.put_i32(-1);
    }
    fn int8(&mut self, v: u64) {
        self.0.put_i32(8);
        self.0.put_i64(i64::try_from(v).unwrap_or(i64::MAX));
    }
    fn int4(&mut self, v: u32) {
        self.0.put_i32(4);
        self.0.put_i32(i32::try_from(v).unwrap_or(i32::MAX));
    }
    fn int2(&mut self, v: u8) {
        self.0.put_i32(2);
        self.0.put_i16(i16::from(v));
    }
    fn text(&mut self, s: &str) {
        self.0.put_i32(s.len() as i32);
        self.0.put_slice(s.as_bytes());
    }
    /// A `timestamptz` (microseconds: PostgreSQL keeps no finer time; the nanoseconds are cut).
    fn time(&mut self, ns: u64) {
        self.0.put_i32(8);
        self.0.put_i64(i64::try_from(ns / 1000).unwrap_or(i64::MAX) - PG_EPOCH_US);
    }
    /// An `inet` host address: family (2 IPv4, 3 IPv6), prefix length, not a CIDR, address length, address.
    fn inet(&mut self, a: IpAddr) {
        match a {
            IpAddr::V4(v4) => {
                self.0.put_i32(8);
                self.0.put_slice(&[2, 32, 0, 4]);
                self.0.put_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.0.put_i32(20);
                self.0.put_slice(&[3, 128, 0, 16]);
                self.0.put_slice(&v6.octets());
            }
        }
    }
    fn opt<T>(&mut self, v: Option<T>, put: impl FnOnce(&mut Copy, T)) {
        match v {
            Some(v) => put(self, v),
            None => self.null(),
        }
    }
}

/// The flow table's columns, in the order [`flow_row`] writes them.
const FLOW_COPY: &str = "sensor, store, segment, flow_id, ts, duration_ns, orig_h, orig_p, resp_h, resp_p, \
     proto, vlan, conn_state, orig_pkts, orig_bytes, orig_payload, orig_flags, resp_pkts, resp_bytes, resp_payload, \
     resp_flags";

fn flow_row(c: &mut Copy, (sensor, store, segment): (&str, &str, u32), f: &Flow) {
    let (oh, op) = f.orig_endpoint();
    let (rh, rp) = f.resp_endpoint();
    c.fields(21);
    c.text(sensor);
    c.text(store);
    c.int8(u64::from(segment));
    c.int8(f.id);
    c.time(f.first_ns);
    c.int8(f.last_ns.saturating_sub(f.first_ns));
    c.inet(oh);
    c.int4(u32::from(op));
    c.inet(rh);
    c.int4(u32::from(rp));
    c.int2(f.key.proto.0);
    c.int4(u32::from(f.key.vlan));
    c.text(f.state.name());
    for side in [&f.orig, &f.resp] {
        c.int8(side.packets);
        c.int8(side.bytes);
        c.int8(side.payload);
        c.int2(side.flags);
    }
}

/// The packet table's columns, in the order [`packet_row`] writes them.
const PACKET_COPY: &str = "sensor, store, segment, seq, flow_id, ts, caplen, wirelen, iface, src_h, src_p, dst_h, dst_p, proto, vlan, tcp_flags";

fn packet_row(c: &mut Copy, (sensor, store, segment): (&str, &str, u32), p: &PacketRow) {
    c.fields(16);
    c.text(sensor);
    c.text(store);
    c.int8(u64::from(segment));
    c.int8(p.seq);
    c.opt(p.flow_id, Copy::int8);
    c.time(p.ts_ns);
    c.int4(p.caplen);
    c.int4(p.wirelen);
    c.int4(p.iface);
    c.opt(p.src, Copy::inet);
    c.opt(p.sport.map(u32::from), Copy::int4);
    c.opt(p.dst, Copy::inet);
    c.opt(p.dport.map(u32::from), Copy::int4);
    c.opt(p.proto, Copy::int2);
    c.int4(u32::from(p.vlan));
    c.opt(p.tcp_flags, Copy::int2);
}

/// Whether [`Load::Auto`] loads `pending` in bulk: when it adds at least [`BULK_MIN_ROWS`] rows, and each table
/// it adds rows to holds no more than it adds.
async fn bulk_pays(client: &Client, s: &str, pending: &[(&Segment, Tables)]) -> Result<bool, tokio_postgres::Error> {
    let flows: u64 = pending.iter().filter(|(_, t)| t.flows).map(|(seg, _)| u64::from(seg.stage1.flows)).sum();
    let packets: u64 = pending.iter().filter(|(_, t)| t.packets).map(|(seg, _)| seg.stage1.packets).sum();
    if flows + packets < BULK_MIN_ROWS {
        return Ok(false);
    }
    for (table, adds) in [("flows", flows), ("packets", packets)] {
        // Counted up to one more than the load adds, so that the count costs no more than the load.
        let most = to_i64(adds + 1);
        let sql = format!("SELECT count(*) FROM (SELECT 1 FROM {s}.{table} LIMIT $1) t");
        if adds > 0 && client.query_one(&sql, &[&most]).await?.get::<_, i64>(0) > to_i64(adds) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Loads one segment's rows in one transaction: the tables it has rows for emptied of the segment's rows, the
/// rows copied in, the segment recorded.
async fn load(client: &mut Client, s: &str, opts: &PostgresExport, e: Encoded) -> Result<ExportedSegment, ExportError> {
    let doing = format!("loading segment {}", e.segment);
    let pg = |source| ExportError::Postgres { doing: doing.clone(), source };
    let t = client.transaction().await.map_err(pg)?;
    // The segment's rows of a load before (its `segments` row struck by hand): found by the key's prefix, the
    // flows' through their ids' range.
    let segment = i64::from(e.segment);
    if e.flows.is_some() {
        let (lo, hi) = (to_i64(e.flow_ids.0), to_i64(e.flow_ids.1));
        t.execute(
            &format!(
                "DELETE FROM {s}.flows WHERE flow_id BETWEEN $4 AND $5 AND segment = $3 AND sensor = $1 AND \
                 store = $2"
            ),
            &[&opts.sensor, &opts.store, &segment, &lo, &hi],
        )
        .await
        .map_err(pg)?;
    }
    if e.packets.is_some() {
        t.execute(
            &format!("DELETE FROM {s}.packets WHERE segment = $3 AND sensor = $1 AND store = $2"),
            &[&opts.sensor, &opts.store, &segment],
        )
        .await
        .map_err(pg)?;
    }
    let done = copy_segment(&t, s, opts, e).await?;
    record(&t, s, opts, &done).await?;
    t.commit().await.map_err(pg)?;
    Ok(done)
}

/// Loads every segment `rx` brings in one transaction ([`Load::Bulk`]): the tables locked, the old rows of the
/// segments `replaced` lists (per table) deleted, the tables' keys and indexes dropped, the rows copied, the keys
/// and indexes built again, the segments recorded.
async fn load_bulk(
    client: &mut Client,
    s: &str,
    opts: &PostgresExport,
    replaced: &[(&str, Vec<i64>); 2],
    rx: &mut tokio::sync::mpsc::Receiver<Result<Encoded, ExportError>>,
) -> Result<Vec<ExportedSegment>, ExportError> {
    let pg = |doing: &str| {
        let doing = format!("loading in bulk: {doing}");
        move |source| ExportError::Postgres { doing: doing.clone(), source }
    };
    let t = client.transaction().await.map_err(pg("beginning"))?;
    // In one order (flows, packets), as every load takes them, so two loads never wait on each other in turn.
    t.batch_execute(&format!("LOCK TABLE {s}.flows, {s}.packets IN ACCESS EXCLUSIVE MODE"))
        .await
        .map_err(pg("locking the tables"))?;
    for (table, segments) in replaced.iter().filter(|(_, n)| !n.is_empty()) {
        // (While the key still finds them.)
        t.execute(
            &format!("DELETE FROM {s}.{table} WHERE sensor = $1 AND store = $2 AND segment = ANY($3)"),
            &[&opts.sensor, &opts.store, segments],
        )
        .await
        .map_err(pg(&format!("deleting the {table} of earlier loads")))?;
        t.batch_execute(&drop_indexes(s, table)).await.map_err(pg(&format!("dropping the {table}' indexes")))?;
    }
    let mut done = Vec::new();
    while let Some(e) = rx.recv().await {
        done.push(copy_segment(&t, s, opts, e?).await?);
    }
    for (table, _) in replaced.iter().filter(|(_, n)| !n.is_empty()) {
        t.batch_execute(&build_indexes(s, table)).await.map_err(pg(&format!("building the {table}' indexes")))?;
    }
    for d in &done {
        record(&t, s, opts, d).await?;
    }
    t.commit().await.map_err(pg("committing"))?;
    Ok(done)
}

/// Copies one segment's rows inside transaction `t`.
async fn copy_segment(
    t: &tokio_postgres::Transaction<'_>,
    s: &str,
    opts: &PostgresExport,
    e: Encoded,
) -> Result<ExportedSegment, ExportError> {
    let doing = format!("loading segment {}", e.segment);
    let pg = |source| ExportError::Postgres { doing: doing.clone(), source };
    let mut done = ExportedSegment {
        sensor: opts.sensor.clone(),
        store: opts.store.clone(),
        segment: e.segment,
        flows: None,
        packets: None,
    };
    for (table, columns, rows, slot) in
        [("flows", FLOW_COPY, e.flows, &mut done.flows), ("packets", PACKET_COPY, e.packets, &mut done.packets)]
    {
        let Some((n, pieces)) = rows else { continue };
        let sink = t
            .copy_in::<_, Bytes>(&format!("COPY {s}.{table} ({columns}) FROM STDIN (FORMAT binary)"))
            .await
            .map_err(pg)?;
        futures_util::pin_mut!(sink);
        let mut bytes = 0;
        for piece in pieces {
            bytes += piece.len() as u64;
            sink.send(piece).await.map_err(pg)?;
        }
        let copied = sink.finish().await.map_err(pg)?;
        debug_assert_eq!(copied, n);
        *slot = Some(Written { rows: copied, files: Vec::new(), bytes });
    }
    Ok(done)
}

/// Records in the `segments` table what was loaded of a segment, inside transaction `t`.
async fn record(
    t: &tokio_postgres::Transaction<'_>,
    s: &str,
    opts: &PostgresExport,
    done: &ExportedSegment,
) -> Result<(), ExportError> {
    let count = |w: &Option<Written>| w.as_ref().map(|w| w.rows as i64);
    t.execute(
        &format!(
            "INSERT INTO {s}.segments (sensor, store, segment, flows, packets) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (sensor, store, segment) DO UPDATE SET flows = COALESCE(EXCLUDED.flows, segments.flows), \
             packets = COALESCE(EXCLUDED.packets, segments.packets), exported_at = now()"
        ),
        &[&opts.sensor, &opts.store, &i64::from(done.segment), &count(&done.flows), &count(&done.packets)],
    )
    .await
    .map_err(|source| ExportError::Postgres { doing: format!("recording segment {}", done.segment), source })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::types::{ToSql, Type};

    /// Each field as tokio-postgres's own encoder writes it.
    fn theirs(v: &(dyn ToSql + Sync), t: &Type) -> Vec<u8> {
        let mut b = BytesMut::new();
        v.to_sql_checked(t, &mut b).unwrap();
        let mut out = (b.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&b);
        out
    }

    #[test]
    fn fields_are_postgres_binary_forms() {
        let mut c = Copy(BytesMut::new());
        for a in ["192.0.2.1", "2001:db8::1", "::ffff:10.0.0.1"] {
            let a: IpAddr = a.parse().unwrap();
            c.0.clear();
            c.inet(a);
            assert_eq!(&c.0[..], &theirs(&a, &Type::INET)[..], "{a}");
        }
        for (v, put) in [(0u64, Copy::int8 as fn(&mut Copy, u64)), (u64::MAX, Copy::int8)] {
            c.0.clear();
            put(&mut c, v);
            assert_eq!(&c.0[..], &theirs(&i64::try_from(v).unwrap_or(i64::MAX), &Type::INT8)[..]);
        }
        c.0.clear();
        c.int4(65535);
        assert_eq!(&c.0[..], &theirs(&65535i32, &Type::INT4)[..]);
        c.0.clear();
        c.int2(255);
        assert_eq!(&c.0[..], &theirs(&255i16, &Type::INT2)[..]);
        c.0.clear();
        c.text("S0");
        assert_eq!(&c.0[..], &theirs(&"S0", &Type::TEXT)[..]);
        // 2000-01-01T00:00:00.000001999Z is PostgreSQL's microsecond 1.
        c.0.clear();
        c.time(946_684_800_000_001_999);
        assert_eq!(&c.0[..], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]);
        c.0.clear();
        c.opt(None::<u64>, Copy::int8);
        assert_eq!(&c.0[..], &(-1i32).to_be_bytes());
    }

    #[test]
    fn rows_are_cut_into_pieces_with_one_header_and_trailer() {
        let rows: Vec<u32> = (0..500_000).collect();
        let pieces = encode(&rows, |c, &r| {
            c.fields(1);
            c.int4(r);
        });
        assert!(pieces.len() > 1);
        let all: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(&all[..11], b"PGCOPY\n\xff\r\n\0");
        assert_eq!(all.len(), 19 + 500_000 * 10 + 2);
        assert_eq!(&all[all.len() - 2..], &[0xff, 0xff]);
        assert!(pieces[..pieces.len() - 1].iter().all(|p| p.len() >= PIECE));
    }

    #[test]
    fn the_ddl_and_a_bulk_load_name_the_same_keys_and_indexes() {
        let ddl = ddl("x1");
        assert!(!ddl.contains("{s}") && !ddl.contains("{indexes}") && !ddl.contains("_pkey}"), "{ddl}");
        for (table, name, def) in INDEXES {
            let (dropped, built) = (drop_indexes("x1", table), build_indexes("x1", table));
            if def.starts_with("PRIMARY KEY") {
                assert!(ddl.contains(&format!("CONSTRAINT {name} {def}")), "{name}");
                assert!(dropped.contains(&format!("ALTER TABLE x1.{table} DROP CONSTRAINT IF EXISTS {name};")));
                assert!(built.starts_with(&format!("ALTER TABLE x1.{table} ADD CONSTRAINT {name} {def};")));
            } else {
                let def = def.replace("{s}", "x1");
                assert!(def.starts_with(&format!("ON x1.{table} ")), "{name}");
                assert!(ddl.contains(&format!("CREATE INDEX IF NOT EXISTS {name} {def};")), "{name}");
                assert!(dropped.contains(&format!("DROP INDEX IF EXISTS x1.{name};")));
                assert!(built.contains(&format!("CREATE INDEX {name} {def};")));
            }
        }
        let count = |sql: &str| sql.lines().count();
        assert_eq!(count(&drop_indexes("x1", "flows")) + count(&drop_indexes("x1", "packets")), INDEXES.len());
        assert_eq!(count(&build_indexes("x1", "flows")) + count(&build_indexes("x1", "packets")), INDEXES.len());
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["pcaptool", "_x", "a1_b"] {
            assert!(check_schema(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1a", "A", "a-b", "a;drop", "a\"b", &"x".repeat(64)] {
            assert!(check_schema(bad).is_err(), "{bad}");
        }
    }
}
