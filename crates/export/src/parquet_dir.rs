//! The Parquet export: files partitioned Hive-style under an export directory, a manifest of the segments
//! exported, one export at a time (docs/format/export.md).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pcaptool_flowstore::{Segment, Store};
use rayon::prelude::*;

use crate::manifest::{ExportedSegment, Manifest, Written};
use crate::{ExportError, Summary, Tables, check_name, packets, rows};

/// The lock file an export holds in its directory while it runs.
pub const LOCK: &str = "_pcaptool_export.lock";

/// Where flows (and packets) go, and the names they go under.
#[derive(Clone, Debug)]
pub struct ParquetExport {
    /// The export directory (created if missing).
    pub out: PathBuf,
    /// The sensor's name: the first partition level (`sensor=NAME`).
    pub sensor: String,
    /// The store's name, in each row's locator and in file names (two stores of one sensor export side by side).
    pub store: String,
    /// Rows per row group at most (a group is what an engine skips by its statistics, or reads whole).
    pub row_group_rows: usize,
    /// Whether to export one row per packet too (under `packets/`), for segments whose packets are not yet.
    pub packets: bool,
}

impl ParquetExport {
    /// An export into `out` under these names (letters, digits, `.`, `_` and `-`; not starting with `.` or `_`,
    /// which engines take for hidden files), with row groups of up to 1,048,576 rows.
    pub fn new(out: impl Into<PathBuf>, sensor: &str, store: &str) -> Result<ParquetExport, ExportError> {
        check_name("sensor", sensor)?;
        check_name("store", store)?;
        Ok(ParquetExport {
            out: out.into(),
            sensor: sensor.to_string(),
            store: store.to_string(),
            row_group_rows: 1 << 20,
            packets: false,
        })
    }
}

/// The export directory's lock, held until dropped (an advisory `flock`, let go of by the kernel however the
/// process ends).
#[derive(Debug)]
struct DirLock(#[allow(dead_code)] File);

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, ExportError> {
        let lock = dir.join(LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| ExportError::io(&lock, e))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock(file)),
            Err(TryLockError::WouldBlock) => Err(ExportError::Locked { dir: dir.to_path_buf(), lock }),
            Err(TryLockError::Error(e)) => Err(ExportError::io(&lock, e)),
        }
    }
}

/// Exports the flows (and, with [`packets`](ParquetExport::packets), the packets) of every segment of `store`
/// that the export directory's manifest does not list with them yet, segments in parallel, calling `on_segment`
/// after each with what it exported (its files are then in place; segments finish in any order). The manifest
/// lists the segments finished within a second, and all of them when the run returns, after an error too.
pub fn export_parquet(
    store: &Store,
    opts: &ParquetExport,
    on_segment: &mut (dyn FnMut(&ExportedSegment) + Send),
) -> Result<Summary, ExportError> {
    check_name("sensor", &opts.sensor)?;
    check_name("store", &opts.store)?;
    std::fs::create_dir_all(&opts.out).map_err(|e| ExportError::io(&opts.out, e))?;
    let _lock = DirLock::take(&opts.out)?;
    let manifest = Manifest::load(&opts.out)?;
    for table in TABLES {
        remove_leftovers(&opts.out.join(table).join(format!("sensor={}", opts.sensor)))?;
    }
    let (pending, already) = crate::pending(store, opts.packets, |n| {
        let listed = manifest.get(&opts.sensor, &opts.store, n);
        (listed.is_some_and(|l| l.flows.is_some()), listed.is_some_and(|l| l.packets.is_some()))
    });
    // Segments in parallel (each is its own files). The manifest is saved at most once a second and at the end,
    // not after every segment: rewriting it whole each time made an export of 3,166 small segments take 8.9 s.
    // A segment whose files are in place but not yet listed when the run is killed is written again by the
    // next run, under the same names.
    let state =
        Mutex::new(Listing { manifest, on_segment, exported: Vec::new(), saved: Instant::now(), unsaved: false });
    let result = pending.par_iter().try_for_each(|&(seg, tables)| -> Result<(), ExportError> {
        let done = export_segment(store, seg, tables, opts)?;
        let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
        let l = &mut *guard;
        l.manifest.add(done.clone());
        l.unsaved = true;
        if l.saved.elapsed() >= SAVE_EVERY {
            l.manifest.save(&opts.out)?;
            (l.saved, l.unsaved) = (Instant::now(), false);
        }
        (l.on_segment)(&done);
        l.exported.push(done);
        Ok(())
    });
    let l = state.into_inner().unwrap_or_else(|e| e.into_inner());
    // (Also after an error: the segments finished stay listed.)
    let saved = if l.unsaved { l.manifest.save(&opts.out) } else { Ok(()) };
    result?;
    saved?;
    let mut exported = l.exported;
    exported.sort_by_key(|e| e.segment);
    Ok(Summary { exported, already, bulk: false })
}

/// The tables' directories under an export directory.
const TABLES: [&str; 2] = ["flows", "packets"];

/// How often a running export saves its manifest at most.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// What the segments exported so far change: the manifest (and when it was last saved), the caller's callback,
/// the summary's list.
struct Listing<'c> {
    manifest: Manifest,
    on_segment: &'c mut (dyn FnMut(&ExportedSegment) + Send),
    exported: Vec<ExportedSegment>,
    saved: Instant,
    unsaved: bool,
}

/// Writes the files of one segment's tables, one per table and hour its rows start in.
fn export_segment(
    store: &Store,
    seg: &Segment,
    tables: Tables,
    opts: &ParquetExport,
) -> Result<ExportedSegment, ExportError> {
    let number = seg.stage1.number;
    let read = packets::read_segment(seg, tables.packets);
    let rows = read.map_err(|source| ExportError::Store { dir: store.dir().to_path_buf(), segment: number, source })?;
    let mut done = ExportedSegment {
        sensor: opts.sensor.clone(),
        store: opts.store.clone(),
        segment: number,
        flows: None,
        packets: None,
    };
    if tables.flows {
        let parts = rows::flows_by_hour(rows.flows);
        let batch = |f: &[_]| rows::flow_batch(f, &opts.store, number);
        done.flows = Some(write_table(opts, number, "flows", parts, batch, &rows::FLOW_ENCODINGS)?);
    }
    if let Some(packets) = rows.packets {
        let parts = rows::by_hour(packets, |p| p.ts_ns);
        let batch = |p: &[_]| rows::packet_batch(p, &opts.store, number);
        done.packets = Some(write_table(opts, number, "packets", parts, batch, &rows::PACKET_ENCODINGS)?);
    }
    Ok(done)
}

/// Writes a table's rows of segment `number`, one file per hour partition, each as `batch` makes it.
fn write_table<T>(
    opts: &ParquetExport,
    number: u32,
    table: &str,
    parts: Vec<(String, Vec<T>)>,
    batch: impl Fn(&[T]) -> arrow_array::RecordBatch,
    enc: &rows::Encodings,
) -> Result<Written, ExportError> {
    let mut w = Written::default();
    for (partition, part) in parts {
        let name = format!("{table}/sensor={}/{partition}/part-{}-{number:06}.parquet", opts.sensor, opts.store);
        let batch = batch(&part);
        w.rows += part.len() as u64;
        w.bytes += write_atomically(&opts.out, &name, |f| rows::write_parquet(f, &batch, opts.row_group_rows, enc))?;
        w.files.push(name);
    }
    Ok(w)
}

/// Writes `name` (relative to `out`, in `/`-separated parts) by `write` into a hidden file beside it, synced,
/// then renamed into place (and the directory synced): the name shows a whole file or none. Returns its size.
fn write_atomically(
    out: &Path,
    name: &str,
    write: impl FnOnce(&mut File) -> Result<(), parquet::errors::ParquetError>,
) -> Result<u64, ExportError> {
    let path = out.join(name);
    let dir = path.parent().unwrap_or(out).to_path_buf();
    std::fs::create_dir_all(&dir).map_err(|e| ExportError::io(&dir, e))?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| ExportError::io(&tmp, e))?;
    write(&mut f).map_err(|source| ExportError::Parquet { path: path.clone(), source })?;
    f.flush().and_then(|()| f.sync_all()).map_err(|e| ExportError::io(&tmp, e))?;
    let size = f.metadata().map_err(|e| ExportError::io(&tmp, e))?.len();
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| ExportError::io(&path, e))?;
    File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| ExportError::io(&dir, e))?;
    Ok(size)
}

/// Removes the hidden files a killed export left under `dir` (its sensor's partitions): nothing else writes
/// names of that form, and the lock says no other export runs.
fn remove_leftovers(dir: &Path) -> Result<(), ExportError> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in rd {
        let e = e.map_err(|e| ExportError::io(dir, e))?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().map_err(|x| ExportError::io(&path, x))?.is_dir() {
            remove_leftovers(&path)?;
        } else if name.starts_with(".part-") && name.ends_with(".parquet.tmp") {
            std::fs::remove_file(&path).map_err(|x| ExportError::io(&path, x))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Int64Array, StringArray, TimestampNanosecondArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use pcaptool_flowstore::ImportOptions;
    use pcaptool_packet::{LinkType, PcapWriter, TsPrecision};

    /// A fresh directory, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("pcaptool-export-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// 600 UDP packets of 30 flows, one every 12 s from 00:30 UTC (two hours), in segments of 100 packets.
    fn store(dir: &Path) -> Store {
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, TsPrecision::Nano).unwrap();
        let start = 1_767_227_400_000_000_000u64; // 2026-01-01T00:30:00Z
        for i in 0..600u64 {
            let mut f = vec![0u8; 60];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14] = 0x45;
            f[16..18].copy_from_slice(&46u16.to_be_bytes());
            f[22] = 64;
            f[23] = 17;
            f[26..30].copy_from_slice(&[10, 0, 0, (i % 30) as u8 + 1]);
            f[30..34].copy_from_slice(&[192, 0, 2, 1]);
            f[34..36].copy_from_slice(&(4000 + (i % 30) as u16).to_be_bytes());
            f[36..38].copy_from_slice(&53u16.to_be_bytes());
            f[38..40].copy_from_slice(&26u16.to_be_bytes());
            w.write_packet(start + i * 12_000_000_000, 60, &f).unwrap();
        }
        let trace = dir.join("t.pcap");
        std::fs::write(&trace, w.finish().unwrap()).unwrap();
        let mut s = Store::create(&dir.join("store")).unwrap();
        let opts = ImportOptions { segment_packets: 100, ..ImportOptions::default() };
        s.import(&trace, &opts, &mut |_| ()).unwrap();
        drop(s);
        Store::open(&dir.join("store")).unwrap()
    }

    fn read_rows(path: &Path) -> Vec<(String, i64, i64, i64, String, i64)> {
        let mut out = Vec::new();
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap().build().unwrap();
        for batch in reader {
            let b = batch.unwrap();
            assert_eq!(b.schema().fields().len(), crate::FLOW_COLUMNS.len());
            let col = |n: &str| b.column(b.schema().index_of(n).unwrap()).clone();
            let (store, seg, id) = (col("store"), col("segment"), col("flow_id"));
            let (store, seg, id) = (
                store.as_any().downcast_ref::<StringArray>().unwrap(),
                seg.as_any().downcast_ref::<Int64Array>().unwrap(),
                id.as_any().downcast_ref::<Int64Array>().unwrap(),
            );
            let ts = col("ts");
            let ts = ts.as_any().downcast_ref::<TimestampNanosecondArray>().unwrap();
            let (h, pk) = (col("orig_h"), col("orig_pkts"));
            let (h, pk) =
                (h.as_any().downcast_ref::<StringArray>().unwrap(), pk.as_any().downcast_ref::<Int64Array>().unwrap());
            for i in 0..b.num_rows() {
                out.push((
                    store.value(i).to_string(),
                    seg.value(i),
                    id.value(i),
                    ts.value(i),
                    h.value(i).to_string(),
                    pk.value(i),
                ));
            }
        }
        out
    }

    #[test]
    fn exports_every_segment_once_into_hour_partitions() {
        let dir = Dir::new("segments");
        let store = store(&dir.0);
        let segments = store.segments().len();
        assert!(segments >= 6, "{segments} segments");
        let opts = ParquetExport::new(dir.0.join("out"), "s1", "st").unwrap();
        // A file a killed export left aside is removed; a file of another kind is not.
        let part = dir.0.join("out/flows/sensor=s1/date=2026-01-01/hour=00");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join(".part-st-000000.parquet.tmp"), b"half").unwrap();
        std::fs::write(part.join("notes.txt"), b"mine").unwrap();
        let mut seen = Vec::new();
        let s = export_parquet(&store, &opts, &mut |e| seen.push(e.segment)).unwrap();
        assert_eq!((s.exported.len(), s.already), (segments, 0));
        seen.sort_unstable();
        assert_eq!(seen, store.segments().iter().map(|g| g.stage1.number).collect::<Vec<_>>());
        assert!(!part.join(".part-st-000000.parquet.tmp").exists() && part.join("notes.txt").exists());
        // Every row: in the partition of its first packet's hour, its packets those of the store's flow part.
        let mut rows = Vec::new();
        for e in &s.exported {
            for f in &e.flows.as_ref().unwrap().files {
                let hour = if f.contains("/hour=00/") {
                    0
                } else if f.contains("/hour=01/") {
                    1
                } else {
                    2
                };
                assert!(
                    f.starts_with("flows/sensor=s1/date=2026-01-01/hour=")
                        && f.ends_with(&format!("part-st-{:06}.parquet", e.segment)),
                    "{f}"
                );
                for r in read_rows(&dir.0.join("out").join(f)) {
                    let h = (r.3 as u64 / 3_600_000_000_000) % 24;
                    assert_eq!(h, hour, "{f}: a row of hour {h}");
                    assert_eq!((r.0.as_str(), r.1), ("st", i64::from(e.segment)));
                    rows.push(r);
                }
            }
        }
        assert_eq!(rows.len() as u64, s.rows(|e| &e.flows));
        assert!(s.exported.iter().all(|e| e.packets.is_none()), "packets only when asked for");
        let packets: i64 = rows.iter().map(|r| r.5).sum();
        assert_eq!(packets, 600, "every packet counted once");
        let flows: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.2).collect();
        assert_eq!(flows.len(), store.flows(&pcaptool_packet::Need::All).unwrap().len());
        assert!(rows.iter().all(|r| r.4.starts_with("10.0.0.")), "originators");
        // A second run exports nothing; the manifest lists every segment once.
        let again = export_parquet(&store, &opts, &mut |_| panic!("exported again")).unwrap();
        assert_eq!((again.exported.len(), again.already as usize), (0, segments));
        assert_eq!(Manifest::load(&opts.out).unwrap().segments().len(), segments);
        // Another sensor's export of the same store into the same directory is its own.
        let other = ParquetExport::new(dir.0.join("out"), "s2", "st").unwrap();
        assert_eq!(export_parquet(&store, &other, &mut |_| ()).unwrap().exported.len(), segments);
    }

    /// The packet rows of a Parquet file: (segment, seq, flow id, ts, caplen, src, src port, tcp flags).
    #[allow(clippy::type_complexity)]
    fn read_packets(path: &Path) -> Vec<(i64, i64, Option<i64>, i64, i32, Option<String>, Option<i32>, Option<i16>)> {
        use arrow_array::{Int16Array, Int32Array};
        let mut out = Vec::new();
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap().build().unwrap();
        for batch in reader {
            let b = batch.unwrap();
            assert_eq!(b.schema().fields().len(), crate::PACKET_COLUMNS.len());
            let col = |n: &str| b.column(b.schema().index_of(n).unwrap()).clone();
            let i64s = |n: &str| col(n).as_any().downcast_ref::<Int64Array>().unwrap().clone();
            let (seg, seq, flow) = (i64s("segment"), i64s("seq"), i64s("flow_id"));
            let ts = col("ts");
            let ts = ts.as_any().downcast_ref::<TimestampNanosecondArray>().unwrap();
            let (cap, src, sp, fl) = (col("caplen"), col("src_h"), col("src_p"), col("tcp_flags"));
            let cap = cap.as_any().downcast_ref::<Int32Array>().unwrap();
            let src = src.as_any().downcast_ref::<StringArray>().unwrap();
            let sp = sp.as_any().downcast_ref::<Int32Array>().unwrap();
            let fl = fl.as_any().downcast_ref::<Int16Array>().unwrap();
            for i in 0..b.num_rows() {
                out.push((
                    seg.value(i),
                    seq.value(i),
                    flow.is_valid(i).then(|| flow.value(i)),
                    ts.value(i),
                    cap.value(i),
                    src.is_valid(i).then(|| src.value(i).to_string()),
                    sp.is_valid(i).then(|| sp.value(i)),
                    fl.is_valid(i).then(|| fl.value(i)),
                ));
            }
        }
        out
    }

    #[test]
    fn packets_are_exported_once_when_asked_for_later() {
        let dir = Dir::new("packets");
        let store = store(&dir.0);
        let segments = store.segments().len();
        let mut opts = ParquetExport::new(dir.0.join("out"), "s1", "st").unwrap();
        export_parquet(&store, &opts, &mut |_| ()).unwrap();
        // Asked for packets later: each segment's packets, and its flows not again.
        opts.packets = true;
        let s = export_parquet(&store, &opts, &mut |_| ()).unwrap();
        assert_eq!((s.exported.len(), s.already), (segments, 0));
        assert!(s.exported.iter().all(|e| e.flows.is_none() && e.packets.is_some()));
        assert_eq!(s.rows(|e| &e.packets), 600);
        let mut rows = Vec::new();
        for e in &s.exported {
            for f in &e.packets.as_ref().unwrap().files {
                assert!(f.starts_with("packets/sensor=s1/date=2026-01-01/hour=0"), "{f}");
                let got = read_packets(&dir.0.join("out").join(f));
                assert!(got.windows(2).all(|w| w[0].1 < w[1].1), "in the store's order");
                rows.extend(got.into_iter().inspect(|r| assert_eq!(r.0, i64::from(e.segment))));
            }
        }
        rows.sort_by_key(|r| r.1);
        // Packet i of the trace: its time, source, port, its flow the store's flow of that 5-tuple.
        let flows = store.flows(&pcaptool_packet::Need::All).unwrap();
        let start = 1_767_227_400_000_000_000i64;
        for (i, r) in rows.iter().enumerate() {
            let i = i as i64;
            assert_eq!(r.1, i, "seq");
            assert_eq!((r.3, r.4), (start + i * 12_000_000_000, 60));
            assert_eq!(
                (r.5.as_deref(), r.6, r.7),
                (Some(format!("10.0.0.{}", i % 30 + 1).as_str()), Some(4000 + (i % 30) as i32), None)
            );
            let ts = r.3 as u64;
            let flow = flows
                .iter()
                .find(|f| f.orig_endpoint().1 == 4000 + (i % 30) as u16 && (f.first_ns..=f.last_ns).contains(&ts))
                .unwrap();
            assert_eq!(r.2, Some(flow.id as i64));
        }
        let again = export_parquet(&store, &opts, &mut |_| panic!("exported again")).unwrap();
        assert_eq!(again.already as usize, segments);
        let m = Manifest::load(&opts.out).unwrap();
        assert!(m.segments().iter().all(|e| e.flows.is_some() && e.packets.is_some()));
    }

    #[test]
    fn one_export_at_a_time_and_names_that_are_partitions() {
        let dir = Dir::new("lock");
        let store = store(&dir.0);
        let opts = ParquetExport::new(dir.0.join("out"), "s1", "st").unwrap();
        std::fs::create_dir_all(&opts.out).unwrap();
        let held = DirLock::take(&opts.out).unwrap();
        let e = export_parquet(&store, &opts, &mut |_| ()).unwrap_err();
        assert!(matches!(e, ExportError::Locked { .. }) && e.to_string().contains("wait"), "{e}");
        drop(held);
        assert!(export_parquet(&store, &opts, &mut |_| ()).is_ok());
        for bad in ["", ".hidden", "_meta", "a/b", "a b", "ü", &"x".repeat(129)] {
            assert!(
                matches!(ParquetExport::new("o", bad, "st"), Err(ExportError::Name { what: "sensor", .. })),
                "{bad:?}"
            );
            assert!(
                matches!(ParquetExport::new("o", "s", bad), Err(ExportError::Name { what: "store", .. })),
                "{bad:?}"
            );
        }
        assert!(ParquetExport::new("o", "sensor-1.east_2", "store-07").is_ok());
    }

    #[test]
    fn partitions_split_at_the_hour() {
        let flow = |id: u64, first_ns: u64| {
            let mut f = store_flow();
            f.id = id;
            f.first_ns = first_ns;
            f.last_ns = first_ns;
            f
        };
        let h = 3_600_000_000_000u64;
        let day = 24 * h;
        let flows = vec![flow(3, day + h), flow(1, day + h - 1), flow(2, day), flow(4, day + h)];
        let parts = rows::flows_by_hour(flows);
        let got: Vec<(String, Vec<u64>)> =
            parts.iter().map(|(p, v)| (p.clone(), v.iter().map(|f| f.id).collect())).collect();
        assert_eq!(
            got,
            vec![
                ("date=1970-01-02/hour=00".to_string(), vec![2, 1]),
                ("date=1970-01-02/hour=01".to_string(), vec![3, 4])
            ]
        );
    }

    /// A flow record of the test store, for its fields' types.
    fn store_flow() -> pcaptool_flowstore::Flow {
        let dir = Dir::new("one-flow");
        let s = store(&dir.0);
        s.flows(&pcaptool_packet::Need::All).unwrap()[0]
    }
}
