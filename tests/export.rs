//! `pcaptool export STORE --to parquet` and `--to postgres`: DuckDB (the Python package) reads the Parquet
//! export and PostgreSQL holds the loaded rows (both installed and started by .ci/setup; skipped with a message
//! elsewhere), and their aggregates (flows, packets, bytes per protocol, flows per hour, distinct hosts) equal
//! those of `pcaptool flows --json` on the same store, the packet rows those of the store's packets; a second
//! run exports nothing; exports killed at random moments leave no partial file (or segment) visible and a later
//! run completes them; a flow found in SQL, and InTraBase's c-query in PostgreSQL, come back by the locator as
//! the packets a 5-tuple filter finds. On a generated trace of three hours, and on a sample of the corpus
//! (../shared/corpus, real captures from public projects; skipped with a message when absent).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use pcaptool_tests::tracegen::{GenOptions, generate};
use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, tool};
use pcaptool_tests::{path_arg as p, pcaptool};
use serde_json::Value;

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Python with DuckDB, or `None` (skipped with a message; under CI a failure).
fn duckdb() -> Option<PathBuf> {
    let py = tool("python3")?;
    let has = Command::new(&py).args(["-c", "import duckdb"]).stderr(Stdio::null()).status();
    if has.is_ok_and(|s| s.success()) {
        return Some(py);
    }
    assert!(!under_ci(), "DuckDB's Python package is required under CI but missing (.ci/setup installs it)");
    eprintln!("SKIPPED: DuckDB's Python package is missing (pip install duckdb); this test needs it (CI has it)");
    None
}

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Runs `sql` in DuckDB over the export in `dir` (as the views `flows` and, if exported, `packets`); the rows as
/// JSON arrays.
fn sql(py: &Path, dir: &Path, sql: &str) -> Vec<Vec<Value>> {
    let script = r#"
import duckdb, glob, json, sys
con = duckdb.connect()
for table in ["flows", "packets"]:
    if glob.glob(sys.argv[1] + "/" + table + "/**/*.parquet", recursive = True):
        con.sql("create view " + table + " as select * from read_parquet('" + sys.argv[1] + "/" + table + "/**/*.parquet', hive_partitioning = true)")
for row in con.sql(sys.argv[2]).fetchall():
    print(json.dumps([v if isinstance(v, (int, float, str)) or v is None else str(v) for v in row]))
"#;
    let out = Command::new(py).args(["-c", script, p(dir), sql]).output().expect("run python3");
    ok(out, sql).lines().map(|l| serde_json::from_str(l).expect("a JSON row")).collect()
}

fn int(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)).unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The figures DuckDB gives of an export, and the same figures from `pcaptool flows --json`.
#[derive(Debug, PartialEq, Eq)]
struct Figures {
    flows: u64,
    packets: u64,
    bytes: u64,
    /// Per protocol: flows, packets, bytes.
    per_proto: BTreeMap<u64, (u64, u64, u64)>,
    /// Flows by the hour of their first packet (`YYYY-MM-DD HH`, UTC).
    per_hour: BTreeMap<String, u64>,
    hosts: u64,
}

fn from_duckdb(py: &Path, dir: &Path) -> Figures {
    let total = &sql(
        py,
        dir,
        "select count(distinct flow_id), sum(orig_pkts + resp_pkts), sum(orig_bytes + resp_bytes) from flows",
    )[0];
    let per_proto = sql(
        py,
        dir,
        "select proto, count(distinct flow_id), sum(orig_pkts + resp_pkts), sum(orig_bytes + resp_bytes) from flows group by proto",
    )
    .iter()
    .map(|r| (int(&r[0]), (int(&r[1]), int(&r[2]), int(&r[3]))))
    .collect();
    // A flow's rows (one per segment it has packets in) start at its first packet in each: its first row's hour.
    let per_hour = sql(
        py,
        dir,
        "select strftime(first, '%Y-%m-%d %H'), count(*) from (select flow_id, min(ts) at time zone 'UTC' as first \
         from flows group by flow_id) group by 1",
    )
    .iter()
    .map(|r| (r[0].as_str().expect("an hour").to_string(), int(&r[1])))
    .collect();
    let hosts = int(&sql(
        py,
        dir,
        "select count(distinct h) from (select orig_h as h from flows union all select resp_h from flows)",
    )[0][0]);
    Figures { flows: int(&total[0]), packets: int(&total[1]), bytes: int(&total[2]), per_proto, per_hour, hosts }
}

fn hour_of(ts: &str) -> String {
    let secs: i64 = ts.split('.').next().and_then(|s| s.parse().ok()).expect("seconds");
    let t = pcaptool_packet::Rfc3339(secs as u64 * 1_000_000_000).to_string();
    format!("{} {}", &t[..10], &t[11..13])
}

fn from_flows(store: &Path) -> Figures {
    let text = ok(pcaptool(&["flows", p(store), "--json"]), "pcaptool flows --json");
    let mut f =
        Figures { flows: 0, packets: 0, bytes: 0, per_proto: BTreeMap::new(), per_hour: BTreeMap::new(), hosts: 0 };
    let mut hosts = BTreeSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("a flow");
        let (pk, by) = (int(&v["orig_pkts"]) + int(&v["resp_pkts"]), int(&v["orig_bytes"]) + int(&v["resp_bytes"]));
        f.flows += 1;
        f.packets += pk;
        f.bytes += by;
        let e = f.per_proto.entry(int(&v["proto"])).or_default();
        *e = (e.0 + 1, e.1 + pk, e.2 + by);
        *f.per_hour.entry(hour_of(v["ts"].as_str().expect("ts"))).or_default() += 1;
        hosts.insert(v["orig_h"].as_str().expect("orig_h").to_string());
        hosts.insert(v["resp_h"].as_str().expect("resp_h").to_string());
    }
    f.hosts = hosts.len() as u64;
    f
}

fn export(store: &Path, out: &Path, more: &[&str]) -> Vec<Value> {
    let mut args = vec!["export", p(store), "--to", "parquet", "--out", p(out), "--sensor", "test-sensor", "--json"];
    args.extend(more);
    let text = ok(pcaptool(&args), "pcaptool export");
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

/// Every `.parquet` file under `dir`, relative, sorted.
fn parquet_files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|x| x == "parquet") {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// A generated trace of about three hours (40,000 packets, mean gap 0.3 s), imported in small segments so that flows span them.
fn generated_store(dir: &TempDir) -> (PathBuf, PathBuf) {
    let trace = dir.join("gen.pcap");
    let opts = GenOptions { packets: 40_000, seed: 7, mean_gap_ns: 300_000_000, ..GenOptions::default() };
    let (bytes, _) = generate(Vec::new(), &opts).unwrap();
    std::fs::write(&trace, bytes).unwrap();
    let store = dir.join("store");
    ok(pcaptool(&["import", p(&trace), "--store", p(&store), "--segment-size", "2M"]), "import");
    (trace, store)
}

#[test]
fn duckdb_over_the_export_agrees_with_the_flow_table_and_a_rerun_adds_nothing() {
    let Some(py) = duckdb() else { return };
    let dir = TempDir::new("export-gen");
    let (trace, store) = generated_store(&dir);
    let out = dir.join("export");
    let lines = export(&store, &out, &["--packets"]);
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["event"], "summary");
    let segments = int(&summary["segments"]);
    assert!(segments >= 5, "only {segments} segments: the test wants flows that span segments");
    let want = from_flows(&store);
    let got = from_duckdb(&py, &out);
    assert_eq!(got, want, "DuckDB over the export against `pcaptool flows --json`");
    assert!(want.per_hour.len() >= 3, "the trace spans {} hours", want.per_hour.len());
    // The packet rows: every packet of the trace once, those of flows adding up to the flow table's figures.
    let packets = &sql(
        &py,
        &out,
        "select count(*), count(distinct seq), sum(wirelen) filter (where flow_id is not null), \
         count(*) filter (where flow_id is not null) from packets",
    )[0];
    assert_eq!((int(&packets[0]), int(&packets[1])), (40_000, 40_000), "packet rows");
    assert_eq!((int(&packets[3]), int(&packets[2])), (want.packets, want.bytes), "packets of flows, and their bytes");
    assert_eq!(int(&summary["packets"]), 40_000);
    // Partitions: table, sensor, then the date and hour of the rows' first packets.
    let files = parquet_files(&out);
    for table in ["flows", "packets"] {
        let prefix = format!("{table}/sensor=test-sensor/date=");
        assert!(files.iter().any(|f| f.starts_with(&prefix)), "{table}: {files:?}");
        let wrong = sql(
            &py,
            &out,
            &format!(
                "select count(*) from {table} where strftime(ts at time zone 'UTC', '%Y-%m-%d') <> cast(date as varchar) \
                 or strftime(ts at time zone 'UTC', '%H') <> lpad(cast(hour as varchar), 2, '0')"
            ),
        );
        assert_eq!(int(&wrong[0][0]), 0, "{table}: rows in the partition of another hour");
    }
    assert!(
        files
            .iter()
            .all(|f| f.starts_with("flows/sensor=test-sensor/") || f.starts_with("packets/sensor=test-sensor/")),
        "{files:?}"
    );

    // A second run exports nothing and leaves the files as they were.
    let before: Vec<(String, std::time::SystemTime)> =
        files.iter().map(|f| (f.clone(), std::fs::metadata(out.join(f)).unwrap().modified().unwrap())).collect();
    let again = export(&store, &out, &["--packets"]);
    assert_eq!(again.len(), 1, "a second run reports segments: {again:?}");
    assert_eq!((int(&again[0]["segments"]), int(&again[0]["already_exported"])), (0, segments));
    let after: Vec<(String, std::time::SystemTime)> =
        files.iter().map(|f| (f.clone(), std::fs::metadata(out.join(f)).unwrap().modified().unwrap())).collect();
    assert_eq!(before, after);
    assert_eq!(parquet_files(&out), files);

    // A flow found in SQL comes back by its locator: the packets of `query --flow`, and those a 5-tuple filter
    // finds in the trace, are the same; and so are its packet rows.
    let chosen = chosen_flow(&store);
    let row = &sql(
        &py,
        &out,
        &format!(
            "select flow_id, any_value(store), sum(orig_pkts + resp_pkts) from flows where orig_h = '{}' and \
             orig_p = {} and resp_h = '{}' and resp_p = {} and proto = {} group by flow_id",
            chosen["orig_h"].as_str().unwrap(),
            int(&chosen["orig_p"]),
            chosen["resp_h"].as_str().unwrap(),
            int(&chosen["resp_p"]),
            int(&chosen["proto"])
        ),
    );
    assert_eq!(row.len(), 1, "{row:?}");
    let (id, n) = (int(&row[0][0]), int(&row[0][2]));
    assert_eq!((id, row[0][1].as_str()), (int(&chosen["id"]), Some("store")), "the locator");
    let proto = if int(&chosen["proto"]) == 6 { "tcp" } else { "udp" };
    let filter = format!(
        "{proto} and host {} and host {} and port {} and port {}",
        chosen["orig_h"].as_str().unwrap(),
        chosen["resp_h"].as_str().unwrap(),
        int(&chosen["orig_p"]),
        int(&chosen["resp_p"])
    );
    let (by_id, by_filter) = (dir.join("by-id.pcap"), dir.join("by-filter.pcap"));
    ok(pcaptool(&["query", p(&store), "--flow", &id.to_string(), "-w", p(&by_id)]), "query --flow");
    ok(pcaptool(&["query", "--scan", p(&trace), &filter, "-w", p(&by_filter)]), "query by 5-tuple");
    let (a, b) = (pcaptool_tests::records_us(&by_id), pcaptool_tests::records_us(&by_filter));
    assert_eq!(a.len() as u64, n, "flow {id}: the rows count {n} packets");
    assert!(a == b, "flow {id}: `--flow` gives {} packets, `{filter}` {}", a.len(), b.len());
    let rows = sql(
        &py,
        &out,
        &format!(
            "select epoch_ns(ts) // 1000, wirelen, caplen from packets where store = 'store' and flow_id = {id} order by seq"
        ),
    );
    let rows: Vec<(u64, u64, u64)> = rows.iter().map(|r| (int(&r[0]), int(&r[1]), int(&r[2]))).collect();
    let want: Vec<(u64, u64, u64)> = a.iter().map(|r| (r.0, u64::from(r.1), r.2.len() as u64)).collect();
    assert_eq!(rows, want, "flow {id}: its packet rows");
}

/// The flow a test looks up by its locator: the TCP or UDP flow with the most packets among those whose
/// endpoints, either way round, no other flow of the flow table has.
fn chosen_flow(store: &Path) -> Value {
    let flows: Vec<Value> = ok(pcaptool(&["flows", p(store), "--json"]), "flows")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tuple = |v: &Value| {
        let a = (v["orig_h"].as_str().unwrap().to_string(), int(&v["orig_p"]));
        let b = (v["resp_h"].as_str().unwrap().to_string(), int(&v["resp_p"]));
        (int(&v["proto"]), a.clone().min(b.clone()), a.max(b))
    };
    let mut uses: BTreeMap<_, u32> = BTreeMap::new();
    for v in &flows {
        *uses.entry(tuple(v)).or_default() += 1;
    }
    flows
        .iter()
        .filter(|v| [6, 17].contains(&int(&v["proto"])) && uses[&tuple(v)] == 1)
        .max_by_key(|v| (int(&v["orig_pkts"]) + int(&v["resp_pkts"]), std::cmp::Reverse(int(&v["id"]))))
        .expect("a TCP or UDP flow")
        .clone()
}

#[test]
fn an_export_killed_anywhere_shows_no_partial_file_and_completes_later() {
    let Some(py) = duckdb() else { return };
    let dir = TempDir::new("export-kill");
    let (_, store) = generated_store(&dir);
    let out = dir.join("export");
    // Kills at growing delays: some before any file, some amid the segments' files (each is synced).
    for (round, delay_ms) in [0u64, 5, 15, 30, 60, 100, 150].into_iter().enumerate() {
        let mut child = Command::new(pcaptool_bin())
            .args(["export", p(&store), "--to", "parquet", "--out", p(&out), "--sensor", "test-sensor"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        // Whatever is visible is whole: DuckDB reads every file (a partial one has no footer and fails).
        if !parquet_files(&out).is_empty() {
            let n = sql(&py, &out, "select count(*) from flows");
            assert!(int(&n[0][0]) > 0, "round {round}: visible files hold no rows");
        }
    }
    // A run to the end completes what the killed ones left: the same figures as the flow table.
    export(&store, &out, &[]);
    assert_eq!(from_duckdb(&py, &out), from_flows(&store));
    let hidden = walk_names(&out).into_iter().filter(|n| n.starts_with('.')).collect::<Vec<_>>();
    assert!(hidden.is_empty(), "files written aside and left: {hidden:?}");
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            v.extend(walk_names(&e.path()));
        } else {
            v.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    v
}

#[test]
fn corpus_stores_export_what_their_flow_tables_hold() {
    let Some(py) = duckdb() else { return };
    let Some(corpus) = corpus_dir() else { return };
    let dir = TempDir::new("export-corpus");
    // Every 8th capture of the corpus into one store (the import skips what it cannot read, as it does).
    let store = dir.join("store");
    let mut imported = 0;
    for f in corpus_files(&corpus).iter().step_by(8) {
        let o = pcaptool(&["import", p(&corpus.join(f)), "--store", p(&store), "--segment-size", "1M"]);
        imported += usize::from(o.status.success());
    }
    assert!(imported >= 50, "only {imported} corpus captures imported");
    let out = dir.join("export");
    let summary = export(&store, &out, &["--packets"]);
    let (got, want) = (from_duckdb(&py, &out), from_flows(&store));
    assert!(want.flows > 100, "{} flows", want.flows);
    assert_eq!(got, want, "DuckDB over the corpus store's export against `pcaptool flows --json`");
    // Every packet once, those of flows adding up to the flow table's counts, whatever the link type.
    let packets = &sql(
        &py,
        &out,
        "select count(*), count(distinct seq), count(*) filter (where flow_id is not null) from packets",
    )[0];
    let n = int(&summary.last().unwrap()["packets"]);
    assert_eq!((int(&packets[0]), int(&packets[1]), int(&packets[2])), (n, n, want.packets), "packet rows");

    // PostgreSQL holds the same rows as the Parquet files, column by column.
    let Some(url) = postgres() else { return };
    let db = Schema::new(&url, "corpus");
    ok(db.export(&store, &["--packets"]), "export --to postgres");
    let s = &db.name;
    let flow_cols = "segment, flow_id, {ts}, duration_ns, {orig_h}, orig_p, {resp_h}, resp_p, proto, vlan, conn_state, \
         orig_pkts, orig_bytes, orig_payload, orig_flags, resp_pkts, resp_bytes, resp_payload, resp_flags";
    let packet_cols = "segment, seq, coalesce(flow_id::text, '-'), {ts}, caplen, wirelen, iface, \
         coalesce({src_h}, '-'), coalesce(src_p::text, '-'), coalesce({dst_h}, '-'), coalesce(dst_p::text, '-'), \
         coalesce(proto::text, '-'), vlan, coalesce(tcp_flags::text, '-')";
    for (table, cols, order) in [("flows", flow_cols, "segment, flow_id"), ("packets", packet_cols, "segment, seq")] {
        let duck = cols
            .replace("{ts}", "epoch_ns(ts) // 1000")
            .replace("{orig_h}", "orig_h")
            .replace("{resp_h}", "resp_h")
            .replace("{src_h}", "src_h")
            .replace("{dst_h}", "dst_h");
        let pg = cols
            .replace("{ts}", "(extract(epoch from ts) * 1000000)::bigint")
            .replace("{orig_h}", "host(orig_h)")
            .replace("{resp_h}", "host(resp_h)")
            .replace("{src_h}", "host(src_h)")
            .replace("{dst_h}", "host(dst_h)");
        let from_duck: Vec<String> =
            sql(&py, &out, &format!("select concat_ws('|', {duck}) from {table} order by {order}"))
                .into_iter()
                .map(|r| r[0].as_str().unwrap().to_string())
                .collect();
        let from_pg: Vec<String> = db
            .sql(&format!("select concat_ws('|', {pg}) c0 from {s}.{table} order by {order}"))
            .into_iter()
            .map(|r| r[0].as_str().unwrap().to_string())
            .collect();
        assert!(from_duck.len() as u64 >= want.flows, "{table}: {} rows", from_duck.len());
        if let Some(i) = (0..from_duck.len().max(from_pg.len())).find(|&i| from_duck.get(i) != from_pg.get(i)) {
            panic!("{table}: row {i}: Parquet {:?}, PostgreSQL {:?}", from_duck.get(i), from_pg.get(i));
        }
    }
}

/// The PostgreSQL database the tests load (`PCAPTOOL_TEST_POSTGRES`, else the one .ci/setup makes), if `psql`
/// reaches it; `None` (skipped with a message; under CI a failure) otherwise.
fn postgres() -> Option<String> {
    let url = std::env::var("PCAPTOOL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgresql://pcaptool:pcaptool@localhost/pcaptool_test".to_string());
    let reached = tool("psql").is_some_and(|psql| {
        Command::new(psql).args([url.as_str(), "-tAc", "select 1"]).output().is_ok_and(|o| o.status.success())
    });
    if reached {
        return Some(url);
    }
    assert!(!under_ci(), "PostgreSQL at {url} is required under CI but not reachable (.ci/setup starts it)");
    eprintln!("SKIPPED: no PostgreSQL at {url} (set PCAPTOOL_TEST_POSTGRES, or run .ci/setup); this test needs it");
    None
}

/// A schema of its own for a test, dropped when done.
struct Schema {
    url: String,
    name: String,
    /// `--load` of its exports.
    load: &'static str,
}

impl Schema {
    fn new(url: &str, test: &str) -> Schema {
        let s = Schema { url: url.to_string(), name: format!("t_{test}_{}", std::process::id()), load: "auto" };
        s.exec(&format!("drop schema if exists {} cascade", s.name));
        s
    }

    /// Its exports with `--load load`.
    fn load(mut self, load: &'static str) -> Schema {
        self.load = load;
        self
    }

    /// The names of the indexes of its tables, sorted.
    fn indexes(&self) -> Vec<String> {
        let rows = self
            .sql(&format!("select indexname c0 from pg_indexes where schemaname = '{}' order by indexname", self.name));
        rows.iter().map(|r| r[0].as_str().unwrap().to_string()).collect()
    }

    /// Runs a statement that returns no rows.
    fn exec(&self, sql: &str) {
        let out = Command::new("psql").args([self.url.as_str(), "-qX", "-v", "ON_ERROR_STOP=1", "-c", sql]).output();
        ok(out.expect("run psql"), sql);
    }

    /// Runs `sql` (columns named `c0`, `c1`, …, in order); the rows as JSON arrays.
    fn sql(&self, sql: &str) -> Vec<Vec<Value>> {
        let wrapped = format!("select row_to_json(t) from ({sql}) t");
        let out =
            Command::new("psql").args([self.url.as_str(), "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", &wrapped]).output();
        let text = ok(out.expect("run psql"), sql);
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let row: serde_json::Map<String, Value> = serde_json::from_str(l).expect("a JSON row");
                let mut cols: Vec<(usize, Value)> = row
                    .into_iter()
                    .map(|(k, v)| (k.trim_start_matches('c').parse().unwrap_or(usize::MAX), v))
                    .collect();
                cols.sort_by_key(|c| c.0);
                cols.into_iter().map(|c| c.1).collect()
            })
            .collect()
    }

    fn export(&self, store: &Path, more: &[&str]) -> Output {
        let mut args = vec!["export", p(store), "--to", "postgres", "--db", &self.url, "--schema", &self.name];
        args.extend(["--sensor", "test-sensor", "--json", "--load", self.load]);
        args.extend(more);
        pcaptool(&args)
    }

    fn figures(&self) -> Figures {
        let s = &self.name;
        let total = &self.sql(&format!(
            "select count(distinct flow_id) c0, sum(orig_pkts + resp_pkts) c1, sum(orig_bytes + resp_bytes) c2 from {s}.flows"
        ))[0];
        let per_proto = self
            .sql(&format!(
                "select proto c0, count(distinct flow_id) c1, sum(orig_pkts + resp_pkts) c2, \
                 sum(orig_bytes + resp_bytes) c3 from {s}.flows group by proto"
            ))
            .iter()
            .map(|r| (int(&r[0]), (int(&r[1]), int(&r[2]), int(&r[3]))))
            .collect();
        let per_hour = self
            .sql(&format!(
                "select to_char(first, 'YYYY-MM-DD HH24') c0, count(*) c1 from (select flow_id, \
                 min(ts) at time zone 'UTC' as first from {s}.flows group by flow_id) f group by 1"
            ))
            .iter()
            .map(|r| (r[0].as_str().expect("an hour").to_string(), int(&r[1])))
            .collect();
        let hosts = int(&self.sql(&format!(
            "select count(distinct h) c0 from (select orig_h as h from {s}.flows union all select resp_h from {s}.flows) a"
        ))[0][0]);
        Figures { flows: int(&total[0]), packets: int(&total[1]), bytes: int(&total[2]), per_proto, per_hour, hosts }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([self.url.as_str(), "-qc", &format!("drop schema if exists {} cascade", self.name)])
            .output();
    }
}

#[test]
fn postgres_holds_the_flow_table_and_the_c_query_gives_a_connections_packets() {
    postgres_load("segments");
}

#[test]
fn postgres_loads_in_bulk_as_segment_by_segment() {
    postgres_load("bulk");
}

/// The segments of the store in `dir` (its index files).
fn segments_in(dir: &Path) -> u64 {
    let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
    names.filter(|n| n.starts_with("seg-") && n.ends_with(".ptsx")).count() as u64
}

/// Loads a generated store into PostgreSQL with `--load LOAD`, killed midway, whole, again, a segment again, and
/// twice at once; checks the rows against the store's flow table and the c-query against `query --flow` and a
/// 5-tuple filter.
fn postgres_load(load: &'static str) {
    let Some(url) = postgres() else { return };
    let dir = TempDir::new(&format!("export-pg-{load}"));
    let (trace, store) = generated_store(&dir);
    let db = Schema::new(&url, &format!("load_{load}")).load(load);
    let s = db.name.clone();
    // Killed at growing delays: whatever is visible is whole segments (each is one transaction, or all are).
    for (round, delay_ms) in [0u64, 40, 120, 250].into_iter().enumerate() {
        let mut child = Command::new(pcaptool_bin())
            .args(["export", p(&store), "--to", "postgres", "--db", &url, "--schema", &s, "--sensor", "test-sensor"])
            .args(["--packets", "--load", load])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        let listed = db.sql(&format!("select to_regclass('{s}.segments') is not null c0"));
        if listed[0][0] == Value::Bool(true) {
            let half = db.sql(&format!(
                "select count(*) c0 from {s}.segments g where flows <> (select count(*) from {s}.flows f where \
                 f.segment = g.segment) or packets <> (select count(*) from {s}.packets k where k.segment = g.segment)"
            ));
            assert_eq!(int(&half[0][0]), 0, "round {round}: a segment listed without its rows");
            let unlisted = db.sql(&format!(
                "select count(*) c0 from {s}.flows f where not exists (select 1 from {s}.segments g where \
                 g.segment = f.segment)"
            ));
            assert_eq!(int(&unlisted[0][0]), 0, "round {round}: rows of a segment not listed");
            // A run that ended before it was killed (a fast machine) loaded every segment: the load below would
            // find nothing to do and try no mode, so it starts afresh.
            let listed = db.sql(&format!("select count(*) c0 from {s}.segments"));
            if int(&listed[0][0]) == segments_in(&store) {
                db.exec(&format!("drop schema {s} cascade"));
                break;
            }
        }
    }
    let out = db.export(&store, &["--packets"]);
    let lines: Vec<Value> = ok(out, "export --to postgres").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.last().unwrap();
    let segments = int(&summary["segments"]) + int(&summary["already_exported"]);
    assert!(segments >= 5, "{summary}");
    assert_eq!(summary["load"], load, "{summary}");
    let want = from_flows(&store);
    assert_eq!(db.figures(), want, "PostgreSQL's flows against `pcaptool flows --json`");
    let indexes = [
        "flows_orig_h",
        "flows_pkey",
        "flows_resp_h",
        "flows_resp_p",
        "flows_ts",
        "packets_dst_h",
        "packets_dst_p",
        "packets_flow",
        "packets_pkey",
        "packets_src_h",
        "packets_ts",
        "segments_pkey",
    ];
    assert_eq!(db.indexes(), indexes, "the tables' keys and indexes after a load");
    let packets = &db.sql(&format!(
        "select count(*) c0, count(distinct (segment, seq)) c1, sum(wirelen) filter (where flow_id is not null) c2, \
         count(*) filter (where flow_id is not null) c3 from {s}.packets"
    ))[0];
    assert_eq!((int(&packets[0]), int(&packets[1])), (40_000, 40_000), "packet rows");
    assert_eq!((int(&packets[3]), int(&packets[2])), (want.packets, want.bytes), "packets of flows, and their bytes");

    // A second run loads nothing; a segment struck from the segments table is loaded again, its rows replaced.
    let again: Vec<Value> =
        ok(db.export(&store, &["--packets"]), "again").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((int(&again[0]["segments"]), int(&again[0]["already_exported"])), (0, segments), "{again:?}");
    db.exec(&format!("delete from {s}.segments where segment = (select min(segment) from {s}.segments)"));
    let redo: Vec<Value> =
        ok(db.export(&store, &["--packets"]), "redo").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(int(&redo.last().unwrap()["segments"]), 1, "{redo:?}");
    assert_eq!(db.figures(), want, "after a segment loaded again");
    assert_eq!(int(&db.sql(&format!("select count(*) c0 from {s}.packets"))[0][0]), 40_000);
    assert_eq!(db.indexes(), indexes, "the tables' keys and indexes after a segment loaded again");

    // The c-query: the packets of a flow found in SQL, in order, are those `query --flow` and a 5-tuple filter
    // give.
    let chosen = chosen_flow(&store);
    let id = int(&db.sql(&format!(
        "select distinct flow_id c0 from {s}.flows where orig_h = '{}' and orig_p = {} and resp_h = '{}' and \
         resp_p = {} and proto = {}",
        chosen["orig_h"].as_str().unwrap(),
        int(&chosen["orig_p"]),
        chosen["resp_h"].as_str().unwrap(),
        int(&chosen["resp_p"]),
        int(&chosen["proto"])
    ))[0][0]);
    assert_eq!(id, int(&chosen["id"]));
    let rows = db.sql(&format!(
        "select (extract(epoch from ts) * 1000000)::bigint c0, wirelen c1, caplen c2 from \
         {s}.c_query('test-sensor', 'store', {id})"
    ));
    let rows: Vec<(u64, u64, u64)> = rows.iter().map(|r| (int(&r[0]), int(&r[1]), int(&r[2]))).collect();
    let by_id = dir.join("by-id.pcap");
    ok(pcaptool(&["query", p(&store), "--flow", &id.to_string(), "-w", p(&by_id)]), "query --flow");
    let want: Vec<(u64, u64, u64)> =
        pcaptool_tests::records_us(&by_id).iter().map(|r| (r.0, u64::from(r.1), r.2.len() as u64)).collect();
    assert!(want.len() > 10, "flow {id} has {} packets", want.len());
    assert_eq!(rows, want, "c_query of flow {id} against `query --flow`");
    let proto = if int(&chosen["proto"]) == 6 { "tcp" } else { "udp" };
    let filter = format!(
        "{proto} and host {} and host {} and port {} and port {}",
        chosen["orig_h"].as_str().unwrap(),
        chosen["resp_h"].as_str().unwrap(),
        int(&chosen["orig_p"]),
        int(&chosen["resp_p"])
    );
    let by_filter = dir.join("by-filter.pcap");
    ok(pcaptool(&["query", "--scan", p(&trace), &filter, "-w", p(&by_filter)]), "query by 5-tuple");
    let scanned: Vec<u64> = pcaptool_tests::records_us(&by_filter).iter().map(|r| r.0).collect();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), scanned, "c_query against `{filter}`");

    // Two runs at once into another schema: one waits for the other's lock, and no row is loaded twice.
    let two = Schema::new(&url, &format!("two_{load}")).load(load);
    let run = || {
        Command::new(pcaptool_bin())
            .args(["export", p(&store), "--to", "postgres", "--db", &url, "--schema", &two.name])
            .args(["--sensor", "test-sensor", "--json", "--load", load])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (run(), run());
    let mut loaded = 0;
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        let text = ok(out, "export at the same time as another");
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        loaded += int(&last["segments"]);
    }
    assert_eq!(loaded, segments, "each segment loaded by one of the two runs");
    assert_eq!(two.figures(), from_flows(&store), "two runs at once");
}

/// `--load auto` loads in bulk (a load of 100,000 rows or more) into tables that hold no more than it adds, and a
/// segment at a time into tables that hold more; both give the same rows.
#[test]
fn an_automatic_load_is_bulk_only_while_it_at_least_doubles_the_tables() {
    let Some(url) = postgres() else { return };
    let dir = TempDir::new("export-pg-auto");
    let trace = dir.join("gen.pcap");
    let opts = GenOptions { packets: 110_000, seed: 9, mean_gap_ns: 50_000_000, ..GenOptions::default() };
    std::fs::write(&trace, generate(Vec::new(), &opts).unwrap().0).unwrap();
    let store = dir.join("store");
    ok(pcaptool(&["import", p(&trace), "--store", p(&store), "--segment-size", "8M"]), "import");
    let db = Schema::new(&url, "auto");
    let s = &db.name;
    let mut figures = Vec::new();
    for (id, want) in [("first", "bulk"), ("second", "bulk"), ("third", "segments")] {
        let out = ok(db.export(&store, &["--packets", "--store-id", id]), "export --to postgres");
        let summary: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(summary["load"], want, "store id {id}: {summary}");
        figures.push(db.sql(&format!(
            "select count(*) c0, sum(orig_bytes) c1, count(distinct orig_h) c2, min(ts)::text c3 from {s}.flows \
             where store = '{id}'"
        )));
        let packets = db.sql(&format!("select count(*) c0, sum(wirelen) c1 from {s}.packets where store = '{id}'"));
        assert_eq!(int(&packets[0][0]), 110_000, "store id {id}");
        figures.push(packets);
    }
    assert_eq!(figures[0..2], figures[2..4], "bulk into empty tables and into tables as large as the load");
    assert_eq!(figures[0..2], figures[4..6], "bulk against a segment at a time");
    assert_eq!(db.indexes().len(), 12, "{:?}", db.indexes());
}

#[test]
fn postgres_errors_say_what_failed() {
    let dir = TempDir::new("export-pg-errors");
    let (_, store) = generated_store(&dir);
    // Nothing listens on port 1: one line that says PostgreSQL and what it was doing.
    let o = pcaptool(&["export", p(&store), "--to", "postgres", "--db", "postgresql://u:secret@127.0.0.1:1/db"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("PostgreSQL: connecting"), "{err}");
    assert!(!err.contains("secret"), "the password is printed: {err}");
    let o = pcaptool(&["export", p(&store), "--to", "postgres"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--db"), "no database named");
    let o =
        pcaptool(&["export", p(&store), "--to", "postgres", "--db", "postgresql://x@localhost/y", "--schema", "a;b"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("schema"), "a bad schema name");
}

#[test]
fn a_trace_exports_as_its_import_would() {
    let Some(py) = duckdb() else { return };
    let dir = TempDir::new("export-trace");
    let (trace, store) = generated_store(&dir);
    let out = dir.join("export");
    // The trace straight to Parquet, through a temporary store of the importer's (its default segments).
    let lines = export(&trace, &out, &["--packets"]);
    let summary = lines.last().unwrap();
    assert_eq!((summary["store_id"].as_str(), int(&summary["packets"])), (Some("gen.pcap"), 40_000), "{summary}");
    assert!(walk_names(&out).iter().all(|n| !n.contains("pcaptool-work")), "the temporary store is left");
    // Its flows are those of the trace's import: the same figures, and the same ids for the same 5-tuples.
    assert_eq!(from_duckdb(&py, &out), from_flows(&store));
    let chosen = chosen_flow(&store);
    let id = &sql(
        &py,
        &out,
        &format!(
            "select distinct flow_id from flows where orig_h = '{}' and orig_p = {} and resp_p = {}",
            chosen["orig_h"].as_str().unwrap(),
            int(&chosen["orig_p"]),
            int(&chosen["resp_p"])
        ),
    );
    assert_eq!(id, &vec![vec![chosen["id"].clone()]], "the flow's id");
    // A packet row's `seq` is its position in the trace.
    let want = pcaptool_tests::records_us(&trace);
    let rows =
        sql(&py, &out, "select seq, epoch_ns(ts) // 1000, wirelen from packets where seq % 997 = 0 order by seq");
    assert!(rows.len() > 30);
    for r in &rows {
        let k = int(&r[0]) as usize;
        assert_eq!((int(&r[1]), int(&r[2])), (want[k].0, u64::from(want[k].1)), "packet {k}");
    }
    // A second run finds every segment exported.
    let again = export(&trace, &out, &["--packets"]);
    assert_eq!((int(&again[0]["segments"]), int(&again[0]["already_exported"]) > 0), (0, true), "{again:?}");
    // Neither a store nor a trace: one line that says so.
    let o = pcaptool(&["export", p(&dir.join("nothing")), "--to", "parquet", "--out", p(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("neither a flow store"), "{err}");
}
