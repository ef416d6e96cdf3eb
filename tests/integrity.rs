//! Store integrity through the binary: one writer at a time (a second import, `retain` or `repair` is refused
//! with who holds the store), readers that never disturb a writer and always see a consistent set of segments
//! (during an import, during retention), damage that never comes back as a packet (byte flips and truncations of
//! segment data, segment indexes and trace indexes, `kill -9` of writers: `pcaptool_tests::faults`), read-only media and
//! other users with leftovers present, format 2 stores still read, and hostile input (pcapng files of thousands
//! of interfaces or sections, filters nested thousands deep or thousands of terms long) answered within a
//! watchdog's time and a memory limit. Import races with a capture are in tests/capture.rs.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pcaptool_tests::{TempDir, pcaptool_bin, repo_root, tool};
use pcaptool_tests::{generated_trace as gen_trace, path_arg as p, pcaptool, stderr_of as err};

/// The records of a pcap file, each with its header, in order.
fn records(pcap: &[u8]) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes([pcap[at + 8], pcap[at + 9], pcap[at + 10], pcap[at + 11]]) as usize;
        v.push(pcap[at..at + 16 + len].to_vec());
        at += 16 + len;
    }
    v
}

/// What the store answers for `filter` (written as pcap), or `None` while it holds no packets.
fn answer(dir: &Path, filter: &str, out: &Path) -> Option<Vec<Vec<u8>>> {
    let o = pcaptool(&["query", p(dir), filter, "-w", p(out)]);
    if !o.status.success() {
        assert!(err(&o).contains("holds no packets"), "a reader failed: {}", err(&o));
        return None;
    }
    Some(records(&std::fs::read(out).unwrap()))
}

/// A generated trace of `packets` (seed `seed`) in `tmp`, imported into `store` in `base` (or `tmp`) (with `--segment-size`
/// when given); returns the trace and the store.
fn imported(
    tmp: &TempDir,
    base: Option<&Path>,
    packets: u64,
    seed: u64,
    segment_size: Option<&str>,
) -> (PathBuf, PathBuf) {
    let a = gen_trace(tmp, "a.pcap", packets, seed);
    let dir = base.map_or_else(|| tmp.join("store"), |b| b.join("store"));
    let mut args = vec!["import", p(&a), "--store", p(&dir)];
    args.extend(segment_size.iter().flat_map(|s| ["--segment-size", s]));
    let o = pcaptool(&args);
    assert!(o.status.success(), "{}", err(&o));
    (a, dir)
}

/// Waits for the lock file of `dir` to name a holder.
fn wait_for_writer(dir: &Path, child: &mut std::process::Child) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let text = std::fs::read_to_string(dir.join("writer.lock")).unwrap_or_default();
        if text.starts_with("pid ") {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the writer ended before it took the lock");
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("the writer never took the lock");
}

/// A second writer of any kind is refused at once, naming the one that holds the store; the first finishes, and
/// the store then holds exactly its trace (what tcpdump reads from it).
#[test]
fn a_second_writer_is_refused_and_the_first_loses_nothing() {
    let tmp = TempDir::new("integrity-writers");
    let a = gen_trace(&tmp, "a.pcap", 150_000, 21);
    let b = gen_trace(&tmp, "b.pcap", 5_000, 22);
    let dir = tmp.join("store");
    let mut first = Command::new(pcaptool_bin())
        .args(["import", p(&a), "--store", p(&dir), "--segment-size", "1M"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_writer(&dir, &mut first);
    let pid = first.id().to_string();
    for args in
        [vec!["import", p(&b), "--store", p(&dir)], vec!["retain", p(&dir), "--max-size", "1"], vec!["repair", p(&dir)]]
    {
        let o = pcaptool(&args);
        assert_eq!(o.status.code(), Some(1), "`{}`: {}", args.join(" "), err(&o));
        let e = err(&o);
        assert!(
            e.contains("is being written by another process")
                && e.contains(&format!("pid {pid}"))
                && e.contains("import"),
            "`{}` names the writer: {e}",
            args.join(" ")
        );
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    }
    assert!(first.try_wait().unwrap().is_none(), "the first writer was still running when the others were refused");
    assert!(first.wait().unwrap().success(), "the first writer finishes");
    let out = tmp.join("out.pcap");
    let got = answer(&dir, "", &out).expect("the store holds the import");
    assert_eq!(got, records(&std::fs::read(&a).unwrap()), "every packet of the first import, once, in order");
    if let Some(tcpdump) = tool("tcpdump") {
        let t = tmp.join("tcpdump.pcap");
        let theirs = pcaptool_tests::tcpdump_records(&tcpdump, &a, "tcp port 443", &t).expect("tcpdump reads it");
        let o = pcaptool(&["query", p(&dir), "tcp port 443", "-w", p(&out)]);
        assert!(o.status.success(), "{}", err(&o));
        assert_eq!(pcaptool_tests::records_us(&out), theirs, "the store equals tcpdump on the first trace");
    }
    // Once it is done, the next writer goes ahead.
    let o = pcaptool(&["import", p(&b), "--store", p(&dir)]);
    assert!(o.status.success(), "{}", err(&o));
}

/// Readers in a loop while an import writes small segments: the import is never disturbed (it finishes and the
/// store holds its trace whole), and each answer equals tcpdump's on a prefix of the trace (the segments complete
/// when the reader opened the store): the first packets of tcpdump's whole answer, never fewer than before.
#[test]
fn readers_during_an_import_see_a_growing_prefix() {
    let tmp = TempDir::new("integrity-readers");
    let a = gen_trace(&tmp, "a.pcap", 120_000, 23);
    let dir = tmp.join("store");
    let filters = ["ip", "tcp port 443", "udp or arp"];
    let out = tmp.join("out.pcap");
    // The oracle: tcpdump on the whole trace (or, without tcpdump, the store of the whole trace).
    let whole: Vec<Vec<(u64, u32, Vec<u8>)>> = match tool("tcpdump") {
        Some(tcpdump) => filters
            .iter()
            .map(|f| pcaptool_tests::tcpdump_records(&tcpdump, &a, f, &tmp.join("t.pcap")).expect("tcpdump reads it"))
            .collect(),
        None => {
            let whole_dir = tmp.join("whole");
            assert!(pcaptool(&["import", p(&a), "--store", p(&whole_dir)]).status.success());
            filters.iter().map(|f| answer_us(&whole_dir, f, &out).unwrap()).collect()
        }
    };
    let mut writer = Command::new(pcaptool_bin())
        .args(["import", p(&a), "--store", p(&dir), "--segment-size", "256K"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut last = [0usize; 3];
    let (mut reads, mut partial) = (0, 0);
    while writer.try_wait().unwrap().is_none() {
        // The directory is a store once its writer has made its lock file (an empty directory is none yet).
        if !dir.join("writer.lock").exists() {
            continue;
        }
        for (i, f) in filters.iter().enumerate() {
            let Some(got) = answer_us(&dir, f, &out) else { continue };
            assert!(got.len() >= last[i], "`{f}`: {} packets after {}", got.len(), last[i]);
            assert!(got[..] == whole[i][..got.len()], "`{f}`: the answer is tcpdump's first {}", got.len());
            partial += usize::from(got.len() < whole[i].len());
            last[i] = got.len();
            reads += 1;
        }
        let o = pcaptool(&["info", p(&dir), "--json"]);
        assert!(o.status.success(), "info during the import: {}", err(&o));
    }
    let mut e = String::new();
    writer.stderr.take().unwrap().read_to_string(&mut e).unwrap();
    assert!(writer.wait().unwrap().success(), "the import is not disturbed: {e}");
    for (i, f) in filters.iter().enumerate() {
        assert_eq!(answer_us(&dir, f, &out).unwrap(), whole[i], "`{f}` once the import is done: tcpdump's");
    }
    println!("readers during an import: {reads} answers, {partial} of them partial, all prefixes of tcpdump's");
    assert!(reads >= 3, "the readers ran while the import did ({reads} answers)");
}

/// [`answer`] as (µs, wire length, bytes) records, as tcpdump's are compared.
fn answer_us(dir: &Path, filter: &str, out: &Path) -> Option<Vec<(u64, u32, Vec<u8>)>> {
    answer(dir, filter, out).map(|_| pcaptool_tests::records_us(out))
}

/// Readers in a loop while retention removes the oldest segments one by one: each answer is a stretch of the
/// whole answer (the segments complete when the reader opened the store, which retention cannot pull away),
/// never more than the answer before.
#[test]
fn readers_during_retention_see_whole_segments() {
    let tmp = TempDir::new("integrity-retention");
    let (_, dir) = imported(&tmp, None, 60_000, 24, Some("128K"));
    let out = tmp.join("out.pcap");
    let filter = "tcp or icmp";
    let whole = answer(&dir, filter, &out).unwrap();
    let size: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    // Each step of retention waits for an answer after the one before it (or gives up waiting after a while), so
    // that the readers run between the steps however slow the machine is.
    let answered = Arc::new(AtomicUsize::new(0));
    let remover = {
        let (bin, dir, answered) = (pcaptool_bin(), dir.clone(), answered.clone());
        std::thread::spawn(move || {
            for step in (0..40u64).rev() {
                let seen = answered.load(Ordering::SeqCst);
                let waited = Instant::now();
                while answered.load(Ordering::SeqCst) == seen && waited.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let o = Command::new(&bin)
                    .args(["retain", p(&dir), "--max-size", &(size * step / 40 + 1).to_string()])
                    .output()
                    .unwrap();
                assert!(o.status.success(), "retain: {}", err(&o));
            }
        })
    };
    let (mut reads, mut last) = (0, whole.len());
    while !remover.is_finished() {
        let Some(got) = answer(&dir, filter, &tmp.join("during.pcap")) else { continue };
        assert!(got.len() <= last, "{} packets after {last}", got.len());
        if let Some(first) = got.first() {
            let start = whole.iter().position(|r| r == first).expect("the answer's first packet is in the whole");
            assert!(got[..] == whole[start..start + got.len()], "a stretch of the whole answer");
        }
        last = got.len();
        reads += 1;
        answered.fetch_add(1, Ordering::SeqCst);
    }
    remover.join().unwrap();
    println!("readers during retention: {reads} answers, each a stretch of whole segments");
    assert!(reads >= 3, "the readers ran while retention did ({reads} answers)");
}

/// Every kind of fault (`pcaptool_tests::faults`, a few tries each: byte flips at random and chosen offsets of segment
/// data, segment indexes and a trace index, truncations, `kill -9` of import, retention and repair) ends in an
/// exact answer or a clear error, never a wrong answer with success nor a crash; `verify` finds every damage.
#[test]
fn faults_never_give_a_silent_wrong_answer() {
    let tmp = TempDir::new("integrity-faults");
    let cfg = pcaptool_tests::faults::FaultConfig {
        pcaptool: pcaptool_bin(),
        work: tmp.join("faults"),
        tries: 8,
        seed: 31,
        packets: 6_000,
    };
    let tallies = pcaptool_tests::faults::run(&cfg).unwrap();
    println!("{}", pcaptool_tests::faults::table(&tallies));
    for t in &tallies {
        assert_eq!(t.tries as usize, cfg.tries, "{}", t.kind);
        assert_eq!(t.silent_wrong + t.crashes, 0, "{}: {:?}", t.kind, t.defects);
        assert_eq!(t.correct + t.clear_errors, t.tries, "{}", t.kind);
        if t.kind.contains("segment") {
            assert_eq!(t.verify_found, t.tries, "{}: verify finds every damage", t.kind);
        }
    }
}

/// A damaged segment fails queries with the file and byte range; `--skip-damaged` answers exactly from the
/// other segments (tcpdump's packets of the trace minus that segment's), with a warning and exit status 3;
/// `info` still describes the store; `repair` moves the segment into quarantine, after which queries answer
/// again.
#[test]
fn skip_damaged_answers_from_the_rest_and_repair_sets_it_aside() {
    let tmp = TempDir::new("integrity-skip");
    let (_, dir) = imported(&tmp, None, 8_000, 25, Some("256K"));
    let out = tmp.join("out.pcap");
    let whole = answer(&dir, "", &out).unwrap();
    // What segment 1 holds: its packets are a stretch of the trace (one kind of packet).
    let seg1 = records(&std::fs::read(dir.join("seg-000001.pcap")).unwrap());
    let data = dir.join("seg-000001.pcap");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(&data, &bytes).unwrap();
    let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("seg-000001.pcap is damaged at bytes 0..4096") && err(&o).contains("--skip-damaged"),
        "{}",
        err(&o)
    );
    let o = pcaptool(&["query", p(&dir), "", "-w", p(&out), "--skip-damaged"]);
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    assert!(err(&o).contains("left out segment 1"), "{}", err(&o));
    let got = records(&std::fs::read(&out).unwrap());
    let mut sorted_seg1 = seg1.clone();
    sorted_seg1.sort();
    let want: Vec<Vec<u8>> = whole.iter().filter(|r| sorted_seg1.binary_search(r).is_err()).cloned().collect();
    assert_eq!(got, want, "every packet but those of the damaged segment, in order");
    let o = pcaptool(&["info", p(&dir), "--json"]);
    assert_eq!(o.status.code(), Some(0), "info reads no packet data: {}", err(&o));
    let o = pcaptool(&["verify", p(&dir), "--json"]);
    assert_eq!(o.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["damaged"][0]["segment"], 1, "{v}");
    let o = pcaptool(&["repair", p(&dir)]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(dir.join("quarantine/seg-000001.pcap").exists() && dir.join("quarantine/seg-000001.ptsx").exists());
    let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(records(&std::fs::read(&out).unwrap()), want);
    let o = pcaptool(&["info", p(&dir), "--json"]);
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["quarantined"], 1, "{info}");
    assert_eq!(answer(&dir, "", &out).unwrap(), want, "after repair");
    // A segment's files copied under another number (a botched copy) would give its packets twice: it is set aside.
    for ext in ["pcap", "ptsx"] {
        std::fs::copy(dir.join(format!("seg-000000.{ext}")), dir.join(format!("seg-000090.{ext}"))).unwrap();
    }
    let o = pcaptool(&["query", p(&dir), "", "-w", p(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("seg-000090.ptsx") && err(&o).contains("says it is segment 0"), "{}", err(&o));
    let o = pcaptool(&["query", p(&dir), "", "-w", p(&out), "--skip-damaged"]);
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    assert_eq!(records(&std::fs::read(&out).unwrap()), want, "no packet twice");
    assert!(pcaptool(&["repair", p(&dir)]).status.success());
    // A damaged index: the other segments are still described, and a query says which one.
    let index = dir.join("seg-000002.ptsx");
    let mut b = std::fs::read(&index).unwrap();
    b[30] ^= 1;
    std::fs::write(&index, &b).unwrap();
    let o = pcaptool(&["info", p(&dir)]);
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("damaged:      segment 2"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = pcaptool(&["query", p(&dir), "tcp", "--count"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("seg-000002.ptsx is damaged"), "{}", err(&o));
}

/// A tmpfs mounted at `dir` with `opts`, unmounted when dropped; `None` (with a message) where this process may
/// not mount (not root), a failure under CI, which runs as root.
fn tmpfs(dir: &Path, opts: &str, what: &str) -> Option<Unmount> {
    let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    std::fs::create_dir_all(dir).unwrap();
    let mounted = root
        && Command::new("mount").args(["-t", "tmpfs", "-o", opts, "tmpfs", p(dir)]).status().is_ok_and(|s| s.success());
    if !mounted {
        assert!(!in_ci, "CI runs as root and must run {what}");
        eprintln!("SKIPPED: {what} needs root to mount a tmpfs; CI runs it");
        return None;
    }
    Some(Unmount(dir.to_path_buf()))
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writing a query's answer to a full disk fails with one line naming the output file.
#[test]
fn a_full_disk_names_the_output() {
    let tmp = TempDir::new("integrity-full");
    let (a, dir) = imported(&tmp, None, 20_000, 28, None);
    let mnt = tmp.join("small");
    let Some(_unmount) = tmpfs(&mnt, "size=1m", "the full disk test") else { return };
    for source in [&a, &dir] {
        let out = mnt.join("out.pcap");
        let o = pcaptool(&["query", p(source), "tcp", "-w", p(&out)]);
        assert_eq!(o.status.code(), Some(1), "{}", err(&o));
        let e = err(&o);
        assert!(e.contains(p(&out)) && e.contains("No space left on device"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

/// Every command ends quietly when its reader goes away (`| head -c0`), as tcpdump and ripgrep do: exit status
/// 0, no panic.
#[test]
fn closed_pipes_end_quietly() {
    let tmp = TempDir::new("integrity-pipe");
    let (a, dir) = imported(&tmp, None, 3_000, 29, None);
    let bin = pcaptool_bin();
    for args in [
        format!("info {}", p(&dir)),
        format!("info {}", p(&a)),
        format!("flows {}", p(&dir)),
        format!("query {} tcp --explain", p(&a)),
        format!("query {} tcp --explain", p(&dir)),
        format!("query {} tcp -w -", p(&dir)),
        format!("verify {}", p(&dir)),
    ] {
        for _ in 0..3 {
            let o = Command::new("bash")
                .arg("-c")
                .arg(format!("set -o pipefail; {} {args} | head -c0", bin.display()))
                .output()
                .unwrap();
            assert!(o.status.success(), "`pcaptool {args} | head -c0`: {} {}", o.status, err(&o));
        }
    }
}

/// Readers change nothing: on a read-only file system (a tmpfs remounted read-only) and as another user, with
/// the files of an unfinished segment present, queries, `info`, `flows` and `verify` work and answer as on the
/// writable store. Needs root (mount, another user); skips with a message otherwise, fails under CI.
#[test]
fn readers_work_on_read_only_media_and_as_other_users() {
    let tmp = TempDir::new("integrity-ro");
    let mnt = tmp.join("mnt");
    let Some(_unmount) = tmpfs(&mnt, "size=64m", "the read-only media test") else { return };
    let (a, dir) = imported(&tmp, Some(&mnt), 5_000, 26, Some("256K"));
    std::fs::write(dir.join("seg-000099.pcap.tmp"), b"an interrupted segment").unwrap();
    std::fs::write(dir.join("seg-000099.ptsx"), b"an index without its data").unwrap();
    let out = tmp.join("out.pcap");
    let want = answer(&dir, "tcp", &out).unwrap();
    let listing = || {
        let mut v: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    let before = listing();
    assert!(Command::new("mount").args(["-o", "remount,ro", p(&mnt)]).status().unwrap().success());
    assert_eq!(answer(&dir, "tcp", &out).unwrap(), want, "read-only media");
    for args in [vec!["info", p(&dir)], vec!["flows", p(&dir)], vec!["verify", p(&dir)]] {
        let o = pcaptool(&args);
        assert!(o.status.success(), "`{}` on read-only media: {}", args.join(" "), err(&o));
    }
    let o = pcaptool(&["import", p(&a), "--store", p(&dir)]);
    assert_eq!(o.status.code(), Some(1), "a writer is refused on read-only media");
    assert!(err(&o).contains("Read-only file system"), "{}", err(&o));
    // Another user: nobody, reading a root-owned store through the same binary.
    let out_nobody = mnt.parent().unwrap().join("nobody-out.pcap");
    let _ = std::fs::remove_file(&out_nobody);
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(pcaptool_bin())
        .args(["query", p(&dir), "tcp", "--count"])
        .output()
        .unwrap();
    assert!(o.status.success(), "as nobody: {}", err(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), want.len().to_string());
    assert_eq!(listing(), before, "the readers left every file as it was");
}

/// A store written by format 2 (testdata/store-v2: a generated trace of 300 packets, seed 7, then
/// testdata/tunnels.pcap and testdata/pcapng-two-sections.pcapng) is still read: its answer equals a scan of those
/// traces, and `verify` says it has no data checksums.
#[test]
fn format_2_stores_are_still_read() {
    let tmp = TempDir::new("integrity-v2");
    let store = repo_root().join("testdata/store-v2");
    let g = gen_trace(&tmp, "g7.pcap", 300, 7);
    let traces =
        [g, repo_root().join("testdata/tunnels.pcap"), repo_root().join("testdata/pcapng-two-sections.pcapng")];
    for f in ["", "tcp", "udp or icmp"] {
        let out = tmp.join("out.pcapng");
        let o = pcaptool(&["query", p(&store), f, "-w", p(&out)]);
        assert!(o.status.success(), "{}", err(&o));
        let mut want = Vec::new();
        for t in &traces {
            let part = tmp.join("part.out");
            let o = pcaptool(&["query", "--scan", p(t), if f.is_empty() { "len >= 0" } else { f }, "-w", p(&part)]);
            assert!(o.status.success(), "{}", err(&o));
            want.extend(pcaptool_tests::records_us(&part));
        }
        assert_eq!(pcaptool_tests::records_us(&out), want, "`{f}` on the format 2 store");
    }
    let o = pcaptool(&["verify", p(&store)]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("format version 2 have no data checksums"));
}

/// Runs `args` under a watchdog (a generous limit on time: the command must end, not be fast) and a limit on
/// its address space; returns its output.
fn bounded(args: &[&str], secs: u64, mem_mib: u64) -> Output {
    let mut cmd = match tool("prlimit") {
        Some(prlimit) => {
            let mut c = Command::new(prlimit);
            c.arg(format!("--as={}", mem_mib << 20)).arg(pcaptool_bin());
            c
        }
        None => Command::new(pcaptool_bin()),
    };
    let mut child = cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("`pcaptool {}` did not end within {secs} s", args.join(" ").chars().take(80).collect::<String>());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn pcapng_block(t: u32, body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    b.resize(body.len().next_multiple_of(4), 0);
    let len = (12 + b.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&t.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&b);
    out.extend_from_slice(&len.to_le_bytes());
    out
}

/// A pcapng file: `kind` "idbs" (`n` interfaces, then one packet), "ifaces" (`n` interfaces of their own
/// snapshot length, a packet on each), "sections" (`n` sections of one interface and one packet).
fn hostile_pcapng(kind: &str, n: usize) -> Vec<u8> {
    let shb = pcapng_block(
        0x0A0D_0D0A,
        &[0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    );
    let idb = |snap: u32| {
        let mut b = vec![1, 0, 0, 0];
        b.extend_from_slice(&snap.to_le_bytes());
        pcapng_block(1, &b)
    };
    let frame: Vec<u8> = [
        &[0xff; 6][..],
        &[2, 0, 0, 0, 0, 1, 8, 0],
        &[0x45, 0, 0, 28, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2],
        &[0, 53, 0, 53, 0, 8, 0, 0],
    ]
    .concat();
    let epb = |iface: u32, i: usize| {
        let mut b = iface.to_le_bytes().to_vec();
        let ts = 1_700_000_000_000_000u64 + i as u64;
        b.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        b.extend_from_slice(&(ts as u32).to_le_bytes());
        b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        b.extend_from_slice(&frame);
        pcapng_block(6, &b)
    };
    let mut out = shb.clone();
    match kind {
        "idbs" => {
            (0..n).for_each(|_| out.extend(idb(65535)));
            out.extend(epb(0, 0));
        }
        "ifaces" => (0..n).for_each(|i| {
            out.extend(idb(1000 + i as u32));
            out.extend(epb(i as u32, i));
        }),
        _ => (0..n).for_each(|i| {
            if i > 0 {
                out.extend(shb.clone());
            }
            out.extend(idb(2000 + i as u32));
            out.extend(epb(0, i));
        }),
    }
    out
}

/// pcapng files of 100,000 interface blocks before the first packet, 20,000 interfaces or 20,000 sections of one
/// packet each: queried, imported (into one segment, not one each) and queried from the store, within a watchdog
/// and 512 MiB of address space; the store's answer is the trace's, and tshark reads it.
#[test]
fn hostile_pcapng_is_linear_and_bounded() {
    let tmp = TempDir::new("integrity-pcapng");
    for (kind, n, packets) in [("idbs", 100_000, 1), ("ifaces", 20_000, 20_000), ("sections", 20_000, 20_000)] {
        let trace = tmp.join(&format!("{kind}.pcapng"));
        std::fs::write(&trace, hostile_pcapng(kind, n)).unwrap();
        let o = bounded(&["query", p(&trace), "udp", "--count"], 120, 512);
        assert!(o.status.success(), "{kind}: {}", err(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), packets.to_string(), "{kind}");
        let dir = tmp.join(&format!("store-{kind}"));
        let o = bounded(&["import", p(&trace), "--store", p(&dir)], 120, 512);
        assert!(o.status.success(), "{kind}: {}", err(&o));
        let segments = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".pcap"))
            .count();
        assert_eq!(segments, 1, "{kind}: the interfaces share one segment");
        let out = tmp.join(&format!("{kind}-out.pcapng"));
        let o = bounded(&["query", p(&dir), "udp", "-w", p(&out)], 120, 512);
        assert!(o.status.success(), "{kind}: {}", err(&o));
        let scan = tmp.join(&format!("{kind}-scan.pcapng"));
        assert!(pcaptool(&["query", "--scan", p(&trace), "udp", "-w", p(&scan)]).status.success());
        assert_eq!(pcaptool_tests::records_us(&out), pcaptool_tests::records_us(&scan), "{kind}: store vs scan");
        if let Some(tshark) = tool("tshark") {
            let o = Command::new(tshark).arg("-r").arg(&out).output().unwrap();
            assert!(o.status.success(), "{kind}: tshark reads the store's answer: {}", err(&o));
        }
    }
}

/// Filters nested thousands deep are refused with one clear error and no crash; 10,000-term `or` lists of ports,
/// hosts and comparisons run (compiled, planned, matched against a trace, its index and a store) within a
/// watchdog and 1 GiB, and agree with each other.
#[test]
fn hostile_filters_are_refused_or_answered() {
    let tmp = TempDir::new("integrity-filters");
    let trace = gen_trace(&tmp, "t.pcap", 20_000, 27);
    for deep in [
        format!("{}tcp{}", "(".repeat(5_000), ")".repeat(5_000)),
        format!("{}tcp", "not ".repeat(25_000)),
        format!("ip[0] = 1{}", "+1".repeat(30_000)),
        format!("{}tcp", "! ".repeat(25_000)),
    ] {
        let o = bounded(&["query", p(&trace), &deep, "--count"], 60, 1024);
        assert_eq!(o.status.code(), Some(1), "{}", err(&o));
        assert!(err(&o).contains("nests more than 200 levels deep"), "{}", err(&o));
        assert!(err(&o).len() < 1000, "the error shows the filter around the place only: {}", err(&o).len());
    }
    let dir = tmp.join("store");
    assert!(pcaptool(&["import", p(&trace), "--store", p(&dir)]).status.success());
    let indexed = tmp.join("i.pcap");
    std::fs::copy(&trace, &indexed).unwrap();
    assert!(pcaptool(&["index", p(&indexed)]).status.success());
    let lists = [
        (0..10_000).map(|i| format!("port {}", i + 1)).collect::<Vec<_>>().join(" or "),
        (0..10_000).map(|i| format!("host 10.0.{}.{}", i / 256, i % 256)).collect::<Vec<_>>().join(" or "),
        (0..10_000).map(|i| format!("ip[8] = {}", i % 256)).collect::<Vec<_>>().join(" or "),
    ];
    for list in &lists {
        // Passed as words (one argument may not exceed 128 KiB); pcaptool joins them as tcpdump does.
        let words: Vec<&str> = list.split(' ').collect();
        let mut counts = Vec::new();
        for target in [&trace, &indexed, &dir] {
            let mut args = vec!["query", p(target)];
            args.extend(&words);
            args.push("--count");
            let o = bounded(&args, 120, 1024);
            assert!(o.status.success(), "{}...: {}", &list[..30], err(&o));
            counts.push(String::from_utf8_lossy(&o.stdout).trim().to_string());
        }
        assert!(counts.iter().all(|c| *c == counts[0]), "{}...: trace, index and store agree: {counts:?}", &list[..30]);
        println!("{}... (10,000 terms): {} packets", &list[..30], counts[0]);
    }
}
