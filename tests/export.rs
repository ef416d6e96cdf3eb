//! `pcaptool export STORE --to parquet`: DuckDB (the Python package, which CI installs; skipped with a message
//! elsewhere) reads the export, and its aggregates (flows, packets, bytes per protocol, flows per hour, distinct
//! hosts) equal those of `pcaptool flows --json` on the same store; a second run exports nothing; exports killed
//! at random moments leave no partial file visible and a later run completes them; a flow found in SQL comes
//! back by its locator as the packets a 5-tuple filter finds. On a generated trace of three hours, and on a
//! sample of the corpus (../shared/corpus, real captures from public projects; skipped with a message when
//! absent).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use pcaptool_tests::tracegen::{GenOptions, generate};
use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, tool};
use serde_json::Value;

fn pcaptool(args: &[&str]) -> Output {
    Command::new(pcaptool_bin()).args(args).output().expect("run pcaptool")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

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
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    assert!(!ci, "DuckDB's Python package is required under CI but missing (.ci/setup installs it)");
    eprintln!("SKIPPED: DuckDB's Python package is missing (pip install duckdb); this test needs it (CI has it)");
    None
}

/// Runs `sql` in DuckDB over the export in `dir` (as the view `flows`); the rows as JSON arrays.
fn sql(py: &Path, dir: &Path, sql: &str) -> Vec<Vec<Value>> {
    let script = r#"
import duckdb, json, sys
con = duckdb.connect()
con.sql("create view flows as select * from read_parquet('" + sys.argv[1] + "/**/*.parquet', hive_partitioning = true)")
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

fn export(store: &Path, out: &Path) -> Vec<Value> {
    let text = ok(
        pcaptool(&["export", p(store), "--to", "parquet", "--out", p(out), "--sensor", "test-sensor", "--json"]),
        "pcaptool export",
    );
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
    let lines = export(&store, &out);
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["event"], "summary");
    let segments = int(&summary["segments"]);
    assert!(segments >= 5, "only {segments} segments: the test wants flows that span segments");
    let want = from_flows(&store);
    let got = from_duckdb(&py, &out);
    assert_eq!(got, want, "DuckDB over the export against `pcaptool flows --json`");
    assert!(want.per_hour.len() >= 3, "the trace spans {} hours", want.per_hour.len());
    // Partitions: sensor, then the date and hour of the rows' first packets.
    let files = parquet_files(&out);
    assert!(files.iter().all(|f| f.starts_with("sensor=test-sensor/date=") && f.contains("/hour=")), "{files:?}");
    let wrong = sql(
        &py,
        &out,
        "select count(*) from flows where strftime(ts at time zone 'UTC', '%Y-%m-%d') <> cast(date as varchar) \
         or strftime(ts at time zone 'UTC', '%H') <> lpad(cast(hour as varchar), 2, '0')",
    );
    assert_eq!(int(&wrong[0][0]), 0, "rows in the partition of another hour");

    // A second run exports nothing and leaves the files as they were.
    let before: Vec<(String, std::time::SystemTime)> =
        files.iter().map(|f| (f.clone(), std::fs::metadata(out.join(f)).unwrap().modified().unwrap())).collect();
    let again = export(&store, &out);
    assert_eq!(again.len(), 1, "a second run reports segments: {again:?}");
    assert_eq!((int(&again[0]["segments"]), int(&again[0]["already_exported"])), (0, segments));
    let after: Vec<(String, std::time::SystemTime)> =
        files.iter().map(|f| (f.clone(), std::fs::metadata(out.join(f)).unwrap().modified().unwrap())).collect();
    assert_eq!(before, after);
    assert_eq!(parquet_files(&out), files);

    // A flow found in SQL comes back by its locator: the packets of `query --flow`, and those a 5-tuple filter
    // finds in the trace, are the same. (The flow: the TCP or UDP flow with the most packets among those whose
    // endpoints, either way round, no other flow of the flow table has.)
    let flows: Vec<Value> = ok(pcaptool(&["flows", p(&store), "--json"]), "flows")
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
    let chosen = flows
        .iter()
        .filter(|v| [6, 17].contains(&int(&v["proto"])) && uses[&tuple(v)] == 1)
        .max_by_key(|v| (int(&v["orig_pkts"]) + int(&v["resp_pkts"]), std::cmp::Reverse(int(&v["id"]))))
        .expect("a TCP or UDP flow");
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
    export(&store, &out);
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
    export(&store, &out);
    let (got, want) = (from_duckdb(&py, &out), from_flows(&store));
    assert!(want.flows > 100, "{} flows", want.flows);
    assert_eq!(got, want, "DuckDB over the corpus store's export against `pcaptool flows --json`");
}
