//! Live capture (`pcaptool capture`) on a veth pair between two network namespaces the tests make themselves
//! (no end in the root namespace, addresses from the benchmarking range 198.18.0.0/15, so nothing can leave the
//! pair): packets replayed with tcpreplay from one end at a bounded rate come back from the store byte for byte,
//! the drop counters agree with what is missing, a query during capture sees what was flushed, SIGINT and
//! SIGKILL leave a consistent store. The namespaces are removed afterwards. Needs root (CI runs as root); skips
//! with a message where namespaces cannot be made, fails instead under CI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pcaptool_packet::{LinkType, PcapWriter, TraceReader, TsPrecision};
use pcaptool_tests::netns::Pair;
use pcaptool_tests::tracegen::{GenOptions, generate};
use pcaptool_tests::{TempDir, corpus_dir, pcaptool_bin, repo_root, tool};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run a command")
}

/// The pair of namespaces, or `None` (with a message) where they cannot be made; under CI that is a failure.
fn pair(tag: &str) -> Option<Pair> {
    tool("ip")?;
    match Pair::new(tag) {
        Ok(p) => Some(p),
        Err(why) if in_ci() => panic!("{why}: CI runs as root and must run the capture tests"),
        Err(why) => {
            eprintln!("SKIPPED: {why}; the capture tests run under CI");
            None
        }
    }
}

/// The packets to send: a generated trace and Ethernet traces of testdata/ (and a few of the corpus when present),
/// those of 14 to 9000 bytes, in one pcap. Returns its path and the packets' bytes in order.
fn traffic(tmp: &TempDir, packets: u64) -> (PathBuf, Vec<Vec<u8>>) {
    traffic_up_to(tmp, packets, 9000)
}

/// [`traffic`] with packets of at most `max` bytes.
fn traffic_up_to(tmp: &TempDir, packets: u64, max: usize) -> (PathBuf, Vec<Vec<u8>>) {
    let generated = tmp.join("gen.pcap");
    let (bytes, _) = generate(Vec::new(), &GenOptions { packets, seed: 11, ..GenOptions::default() }).unwrap();
    std::fs::write(&generated, bytes).unwrap();
    let mut sources = vec![generated, repo_root().join("testdata/tunnels.pcap")];
    if let Some(c) = corpus_dir() {
        let mut ether: Vec<PathBuf> = pcaptool_tests::corpus_files(&c)
            .iter()
            .map(|f| c.join(f))
            .filter(|f| {
                let mut r = match TraceReader::open(f) {
                    Ok(r) => r,
                    Err(_) => return false,
                };
                r.read_header().is_ok()
                    && r.interfaces().len() == 1
                    && r.interfaces()[0].linktype == LinkType::ETHERNET
                    && std::fs::metadata(f).is_ok_and(|m| m.len() < 200_000)
            })
            .collect();
        ether.truncate(8);
        sources.extend(ether);
    }
    let path = tmp.join("send.pcap");
    let mut w =
        PcapWriter::new(std::fs::File::create(&path).unwrap(), LinkType::ETHERNET, 65535, TsPrecision::Micro).unwrap();
    let mut sent = Vec::new();
    for s in &sources {
        let mut r = TraceReader::open(s).unwrap();
        while let Some(Ok(rec)) = r.next_record() {
            if (14..=max).contains(&rec.data.len()) && rec.linktype == LinkType::ETHERNET {
                w.write_packet(rec.ts_ns, rec.data.len() as u32, rec.data).unwrap();
                sent.push(rec.data.to_vec());
            }
        }
    }
    w.finish().unwrap();
    (path, sent)
}

/// Starts `pcaptool capture` in namespace `ns` on `dev`; returns once it says it is capturing.
fn start_capture(pair: &Pair, ns: &str, dev: &str, store: &Path, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut c = pair.exec(ns);
    c.arg(pcaptool_bin()).args(["capture", "-i", dev, "--store"]).arg(store).args(extra);
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start pcaptool capture");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("capturing on") {
                let _ = ready_tx.send(());
            }
            let _ = tx.send(line);
        }
    });
    if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        let lines: Vec<String> = rx.try_iter().collect();
        panic!("pcaptool capture did not start: {lines:?}");
    }
    (child, rx)
}

fn replay(pair: &Pair, trace: &Path, pps: u32) {
    let tcpreplay = tool("tcpreplay").expect("tcpreplay");
    let o = run(pair.exec(&pair.a).arg(tcpreplay).args(["-q", "-i", &pair.va, "--pps", &pps.to_string()]).arg(trace));
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "tcpreplay: {out}");
    let failed = out.lines().find_map(|l| l.trim().strip_prefix("Failed packets:")).map(|v| v.trim().to_string());
    assert_eq!(failed.as_deref(), Some("0"), "tcpreplay sent every packet: {out}");
}

/// Replays `trace` from the pair's first end at `pps` packets a second on another thread.
fn replay_in_background(pair: &Pair, trace: &Path, pps: u32) -> std::thread::JoinHandle<Output> {
    let (exec_a, va, trace) = (pair.a.clone(), pair.va.clone(), trace.to_path_buf());
    std::thread::spawn(move || {
        let tcpreplay = tool("tcpreplay").expect("tcpreplay");
        Command::new("ip")
            .args(["netns", "exec", &exec_a])
            .arg(tcpreplay)
            .args(["-q", "-i", &va, "--pps", &pps.to_string()])
            .arg(trace)
            .output()
            .unwrap()
    })
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("pcaptool capture did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends the capture SIGINT and waits for it to end: its exit status and what it printed on standard error.
fn interrupt(child: &mut Child, lines: &mpsc::Receiver<String>) -> (std::process::ExitStatus, Vec<String>) {
    let o = run(Command::new("kill").args(["-INT", &child.id().to_string()]));
    assert!(o.status.success());
    let status = wait(child, Duration::from_secs(30));
    // (The reader thread may still be passing on the last lines.)
    std::thread::sleep(Duration::from_millis(200));
    (status, lines.try_iter().collect())
}

/// The store's packets (bytes and wire length), in order.
fn stored(store: &Path, tmp: &TempDir) -> Vec<(u32, Vec<u8>)> {
    let out = tmp.join("stored.pcap");
    let o = run(Command::new(pcaptool_bin()).arg("query").arg(store).args(["", "-w"]).arg(&out));
    assert!(o.status.success(), "query the store: {}", String::from_utf8_lossy(&o.stderr));
    pcaptool_tests::records_us(&out).into_iter().map(|(_, wl, d)| (wl, d)).collect()
}

fn summary(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().rev().find(|l| l.contains("\"summary\"")).expect("a summary line");
    serde_json::from_str(line).unwrap()
}

/// Captures into `store` (with `extra` arguments) until the `packets` of `trace`, replayed at 4,000 packets/s, are
/// written; returns pcaptool's JSON summary.
fn capture_all(pair: &Pair, trace: &Path, packets: usize, store: &Path, extra: &[&str]) -> serde_json::Value {
    let n = packets.to_string();
    let mut args = vec!["--json", "--packets", &n, "--duration", "120s"];
    args.extend_from_slice(extra);
    let (mut child, _lines) = start_capture(pair, &pair.b, &pair.vb, store, &args);
    replay(pair, trace, 4000);
    let status = wait(&mut child, Duration::from_secs(150));
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "capture: {stdout}");
    summary(&stdout)
}

/// Every packet sent comes back from the store, byte for byte and in order, with no drop counted; with
/// `--packets` the capture stops by itself.
#[test]
fn captured_packets_come_back_byte_for_byte() {
    let Some(pair) = pair("c") else { return };
    let tmp = TempDir::new("capture-bytes");
    let (trace, sent) = traffic(&tmp, 3000);
    let store = tmp.join("store");
    let s = capture_all(&pair, &trace, sent.len(), &store, &[]);
    let got = stored(&store, &tmp);
    assert_eq!(got.len(), sent.len(), "every sent packet stored: {s}");
    for (i, ((wl, data), want)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(data, want, "packet {i}: bytes");
        assert_eq!(*wl as usize, want.len(), "packet {i}: wire length");
    }
    assert_eq!(s["written"].as_u64(), Some(sent.len() as u64));
    assert_eq!(s["kernel_drops"].as_u64(), Some(0));
    assert_eq!(s["pcaptool_drops"].as_u64(), Some(0));
    assert_eq!(s["interfaces"][0]["name"].as_str(), Some(pair.vb.as_str()));
    println!("capture: {} packets sent and stored byte for byte ({s})", sent.len());
    // Compressed as it captures (LZ4, small segments and blocks): the same packets.
    let lz4 = tmp.join("store-lz4");
    let s = capture_all(
        &pair,
        &trace,
        sent.len(),
        &lz4,
        &["--compress", "lz4", "--block-size", "8K", "--segment-size", "256K"],
    );
    assert_eq!(s["pcaptool_drops"].as_u64(), Some(0));
    let files: Vec<String> =
        std::fs::read_dir(&lz4).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(files.iter().filter(|f| f.ends_with(".pcap.lz4")).count() > 1, "{files:?}");
    let got: Vec<Vec<u8>> = stored(&lz4, &tmp).into_iter().map(|(_, d)| d).collect();
    assert!(got == sent, "the compressed capture's packets are those sent");
    println!("capture --compress lz4: {} packets stored byte for byte", sent.len());
}

/// A query during capture sees what was flushed; SIGINT flushes, closes the segment and prints a summary.
#[test]
fn queries_during_capture_and_sigint() {
    let Some(pair) = pair("q") else { return };
    let tmp = TempDir::new("capture-live");
    let (trace, sent) = traffic(&tmp, 1500);
    let store = tmp.join("store");
    let (mut child, lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &["--flush-every", "1s"]);
    replay(&pair, &trace, 3000);
    // Flushed within a second of the last packet: poll the store while the capture runs.
    let t = Instant::now();
    let mut count = 0;
    while t.elapsed() < Duration::from_secs(20) {
        let o = run(Command::new(pcaptool_bin()).arg("query").arg(&store).args(["", "--count"]));
        if o.status.success() {
            count = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or(0);
            if count == sent.len() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    if let Some(status) = child.try_wait().unwrap() {
        let said: Vec<String> = lines.try_iter().collect();
        panic!("capture still running: it ended ({status}) saying {said:?}");
    }
    assert_eq!(count, sent.len(), "a query during capture sees every flushed packet");
    let (status, all) = interrupt(&mut child, &lines);
    assert!(status.success(), "SIGINT ends the capture cleanly");
    let summary = all.iter().find(|l| l.contains("packets received")).expect("a summary line");
    assert!(summary.contains(&format!("{} written", sent.len())), "{summary}");
    let got = stored(&store, &tmp);
    assert_eq!(got.iter().map(|g| &g.1).collect::<Vec<_>>(), sent.iter().collect::<Vec<_>>());
}

/// SIGINT just after the last packet arrived: the packets in the ring's block being filled (which the kernel
/// hands over up to 100 ms later) are written too, not left in the ring.
#[test]
fn sigint_right_after_the_last_packet_keeps_it() {
    let Some(pair) = pair("si") else { return };
    let tmp = TempDir::new("capture-sigint");
    let (trace, sent) = traffic(&tmp, 1500);
    let store = tmp.join("store");
    let (mut child, lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &[]);
    replay(&pair, &trace, 6000);
    let (status, said) = interrupt(&mut child, &lines);
    assert!(status.success(), "SIGINT ends the capture cleanly: {said:?}");
    let summary = said.iter().find(|l| l.contains("packets received")).expect("a summary line");
    assert!(summary.contains(" 0 dropped by the kernel"), "{summary}");
    let got = stored(&store, &tmp);
    assert_eq!(got.len(), sent.len(), "every packet sent before SIGINT is stored: {summary}");
    assert!(got.iter().map(|g| &g.1).eq(sent.iter()), "byte for byte and in order");
}

/// `capture --serve`: the service in the same process answers from the segments closed so far while the capture
/// runs, its `/v1/stats` shows the capture's counters, and SIGINT stops both cleanly.
#[test]
fn capture_serve_answers_from_closed_segments_while_capturing() {
    let Some(pair) = pair("sv") else { return };
    let curl = tool("curl").expect("curl (CI installs it)");
    let tmp = TempDir::new("capture-serve");
    let (trace, sent) = traffic(&tmp, 1500);
    let store = tmp.join("store");
    let (mut child, lines) =
        start_capture(&pair, &pair.b, &pair.vb, &store, &["--flush-every", "1s", "--serve", "127.0.0.1:0"]);
    let mut said: Vec<String> = Vec::new();
    let mut addr = None;
    while addr.is_none() {
        let line =
            lines.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("no listening line: {said:?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["event"] == "listening" {
            addr = v["addr"].as_str().map(str::to_string);
        }
        said.push(line);
    }
    let url = format!("http://{}", addr.unwrap());
    // The service listens on the namespace's loopback: ask from inside it.
    let in_ns = |program: &Path, args: &[&str]| run(pair.exec(&pair.b).arg(program).args(args));
    replay(&pair, &trace, 3000);
    let t = Instant::now();
    let (mut count, mut stats) = (0, serde_json::Value::Null);
    while t.elapsed() < Duration::from_secs(20) {
        let o = in_ns(&pcaptool_bin(), &["query", &url, "", "--count"]);
        count = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or(0);
        let o = in_ns(&curl, &["-sS", &format!("{url}/v1/stats")]);
        stats = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if count == sent.len() && stats["capture"]["written"] == sent.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(child.try_wait().unwrap().is_none(), "the capture ended early: {said:?}");
    assert_eq!(count, sent.len(), "the service sees every packet of the closed segments during the capture");
    assert_eq!(stats["capture"]["written"], sent.len(), "{stats}");
    assert_eq!(stats["capture"]["event"], "stats", "{stats}");
    assert_eq!(stats["sources"][0]["packets"], sent.len(), "{stats}");
    // An answer streamed during the capture: the bytes the store gives afterwards.
    let during = tmp.join("during.pcap");
    let o = in_ns(&pcaptool_bin(), &["query", &url, "tcp", "-w", during.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(run(Command::new("kill").args(["-INT", &child.id().to_string()])).status.success());
    assert!(wait(&mut child, Duration::from_secs(30)).success(), "SIGINT ends the capture and its service cleanly");
    let after = tmp.join("after.pcap");
    let o = run(Command::new(pcaptool_bin()).arg("query").arg(&store).args(["tcp", "-w"]).arg(&after));
    assert!(o.status.success());
    let (d, a) = (std::fs::read(&during).unwrap(), std::fs::read(&after).unwrap());
    assert!(
        d.len() > 24 && d == a,
        "the service's answer ({} bytes) differs from the store's ({} bytes)",
        d.len(),
        a.len()
    );
    // Both stopped: nothing listens any more.
    let o = in_ns(&curl, &["-sS", &format!("{url}/healthz")]);
    assert!(!o.status.success());
}

/// `kill -9` during capture: the reopened store is consistent and holds every packet flushed before the kill, a
/// prefix of what was sent.
#[test]
fn kill_during_capture_keeps_what_was_flushed() {
    let Some(pair) = pair("k") else { return };
    let tmp = TempDir::new("capture-kill");
    let (trace, sent) = traffic(&tmp, 4000);
    let store = tmp.join("store");
    let (mut child, _lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &["--flush-every", "1s"]);
    let sender = replay_in_background(&pair, &trace, 1500);
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    child.wait().unwrap();
    sender.join().unwrap();
    let o = run(Command::new(pcaptool_bin()).arg("info").arg(&store).arg("--json"));
    assert!(o.status.success(), "the store opens after the kill: {}", String::from_utf8_lossy(&o.stderr));
    let got = stored(&store, &tmp);
    assert!(!got.is_empty(), "segments flushed before the kill are kept");
    assert!(got.len() < sent.len(), "the kill came before the end");
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(&g.1, s, "packet {i}: the store holds a prefix of what was sent");
    }
    println!("kill -9 after 2.5 s: {} of {} packets kept", got.len(), sent.len());
}

/// A capture holds its store's writer lock: an import or `retain` into it is refused with the capture's pid, and
/// readers in a loop see a growing prefix of what was sent, never disturbing the capture; once the capture ends
/// the import goes ahead. The other way round, a capture into a store an import writes is refused before it
/// captures anything, and the import loses nothing.
#[test]
fn a_capture_and_an_import_do_not_share_a_store() {
    let Some(pair) = pair("w") else { return };
    let tmp = TempDir::new("capture-writers");
    let (trace, sent) = traffic(&tmp, 2000);
    let store = tmp.join("store");
    let (mut child, lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &["--flush-every", "1s"]);
    let other = tmp.join("other.pcap");
    std::fs::copy(&trace, &other).unwrap();
    for args in [
        vec!["import".to_string(), other.display().to_string(), "--store".into(), store.display().to_string()],
        vec!["retain".into(), store.display().to_string(), "--max-size".into(), "1".into()],
    ] {
        let o = run(Command::new(pcaptool_bin()).args(&args));
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "`{}`: {e}", args.join(" "));
        assert!(e.contains("is being written by another process") && e.contains("capture"), "{e}");
    }
    // Readers while packets arrive: each answer a prefix of what was sent, never shorter than the one before.
    let sender = replay_in_background(&pair, &trace, 1500);
    let (mut last, mut reads) = (0, 0);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let out = tmp.join("read.pcap");
        let o = run(Command::new(pcaptool_bin()).arg("query").arg(&store).args(["", "-w"]).arg(&out));
        if o.status.success() {
            let got: Vec<Vec<u8>> = pcaptool_tests::records_us(&out).into_iter().map(|r| r.2).collect();
            assert!(got.len() >= last, "{} packets after {last}", got.len());
            assert!(got[..] == sent[..got.len()], "a prefix of what was sent");
            last = got.len();
            reads += 1;
            if last == sent.len() && sender.is_finished() {
                break;
            }
        } else {
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("holds no packets"),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    sender.join().unwrap();
    assert!(child.try_wait().unwrap().is_none(), "the capture still runs: {:?}", lines.try_iter().collect::<Vec<_>>());
    assert_eq!(last, sent.len(), "readers saw every packet once flushed ({reads} reads)");
    assert!(run(Command::new("kill").args(["-INT", &child.id().to_string()])).status.success());
    assert!(wait(&mut child, Duration::from_secs(30)).success());
    let o = run(Command::new(pcaptool_bin()).arg("import").arg(&other).arg("--store").arg(&store));
    assert!(o.status.success(), "the import once the capture is done: {}", String::from_utf8_lossy(&o.stderr));

    // An import holds the store: a capture into it is refused before capturing.
    let big = tmp.join("big.pcap");
    let (bytes, _) = generate(Vec::new(), &GenOptions { packets: 150_000, seed: 12, ..GenOptions::default() }).unwrap();
    std::fs::write(&big, bytes).unwrap();
    let store2 = tmp.join("store2");
    let mut import = Command::new(pcaptool_bin()).arg("import").arg(&big).arg("--store").arg(&store2).spawn().unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(store2.join("writer.lock")).unwrap_or_default().starts_with("pid ") {
        assert!(
            t.elapsed() < Duration::from_secs(60) && import.try_wait().unwrap().is_none(),
            "the import took the lock"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut c = pair.exec(&pair.b);
    c.arg(pcaptool_bin()).args(["capture", "-i", &pair.vb, "--store"]).arg(&store2);
    refused(&mut c, "is being written by another process");
    assert!(import.try_wait().unwrap().is_none(), "the import was running when the capture was refused");
    assert!(import.wait().unwrap().success());
    let out = tmp.join("all.pcap");
    assert!(run(Command::new(pcaptool_bin()).arg("query").arg(&store2).args(["", "-w"]).arg(&out)).status.success());
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&big).unwrap(), "the import lost nothing");
    println!("capture and import: each refused the other; {reads} reads during the capture, all prefixes");
}

/// Errors: a missing interface, the AF_XDP backend (not built in), a process without CAP_NET_RAW.
#[test]
fn capture_errors_say_what_to_do() {
    let tmp = TempDir::new("capture-errors");
    let store = tmp.join("store");
    refused(
        Command::new(pcaptool_bin()).args(["capture", "-i", "no-such-if0", "--store"]).arg(&store),
        "no network interface named `no-such-if0`",
    );
    let Some(pair) = pair("e") else { return };
    if !pcaptool_tests::built_with("xdp") {
        let mut c = pair.exec(&pair.b);
        c.arg(pcaptool_bin()).args(["capture", "-i", &pair.vb, "--backend", "af_xdp", "--store"]).arg(&store);
        refused(&mut c, "AF_XDP is not built");
    }
    if let Some(setpriv) = tool("setpriv") {
        let mut c = pair.exec(&pair.b);
        c.arg(setpriv).args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]);
        c.arg(pcaptool_bin()).args(["capture", "-i", &pair.vb, "--store"]).arg(&store);
        refused(&mut c, "CAP_NET_RAW");
    }
}

/// Runs `cmd` and checks that it fails with one line of error saying `what`.
fn refused(cmd: &mut Command, what: &str) {
    let o = run(cmd);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains(what), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Two interfaces in one capture, each recorded as its own interface: the veth end and the loopback of the
/// capturing namespace.
#[test]
fn two_interfaces_are_recorded_apart() {
    let Some(pair) = pair("m") else { return };
    let tmp = TempDir::new("capture-two");
    let (trace, sent) = traffic(&tmp, 800);
    assert!(run(Command::new("ip").args(["-n", &pair.b, "link", "set", "lo", "up"])).status.success());
    let store = tmp.join("store");
    let ifaces = format!("{},lo", pair.vb);
    let (mut child, _lines) = start_capture(&pair, &pair.b, &ifaces, &store, &["--flush-every", "1s"]);
    replay(&pair, &trace, 4000);
    for _ in 0..5 {
        let o = run(pair.exec(&pair.b).args(["bash", "-c", "echo pcaptool > /dev/udp/127.0.0.1/9"]));
        assert!(o.status.success());
    }
    std::thread::sleep(Duration::from_millis(1500));
    run(Command::new("kill").args(["-INT", &child.id().to_string()]));
    assert!(wait(&mut child, Duration::from_secs(30)).success());
    let out = tmp.join("two.pcapng");
    let o = run(Command::new(pcaptool_bin()).arg("query").arg(&store).args(["", "-w"]).arg(&out));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let Some(tshark) = tool("tshark") else { return };
    let o = run(Command::new(tshark).arg("-r").arg(&out).args([
        "-T",
        "fields",
        "-e",
        "frame.interface_name",
        "-e",
        "udp.dstport",
        "-e",
        "icmp.type",
    ]));
    assert!(o.status.success(), "tshark reads the output: {}", String::from_utf8_lossy(&o.stderr));
    let rows = String::from_utf8_lossy(&o.stdout).into_owned();
    let on = |name: &str| rows.lines().filter(|l| l.split('\t').next() == Some(name)).count();
    assert_eq!(on(&pair.vb), sent.len(), "the veth's packets: {rows}");
    // Each datagram once (not twice, sent and received, as the loopback passes it), without its ICMP replies.
    let lo_port9 = rows.lines().filter(|l| *l == "lo\t9\t").count();
    assert_eq!(lo_port9, 5, "the loopback's datagrams, recorded once each on interface lo: {rows}");
    let records = pcaptool_tests::records_us(&out);
    let veth: Vec<&Vec<u8>> = records
        .iter()
        .zip(rows.lines())
        .filter(|(_, l)| l.split('\t').next() == Some(pair.vb.as_str()))
        .map(|(r, _)| &r.2)
        .collect();
    assert_eq!(veth, sent.iter().collect::<Vec<_>>(), "the veth's packets, byte for byte and in order");
}

/// A tmpfs of its own, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn new(dir: PathBuf, opts: &str) -> Mount {
        std::fs::create_dir_all(&dir).unwrap();
        let o = run(Command::new("mount").args(["-t", "tmpfs", "-o", opts, "tmpfs"]).arg(&dir));
        assert!(o.status.success(), "mount a tmpfs: {}", String::from_utf8_lossy(&o.stderr));
        Mount(dir)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A store on a full disk stops the capture with one line that says so, every packet not written is counted,
/// and what was written stays readable; a read-only store is refused before capturing.
#[test]
fn full_and_read_only_disks_are_reported() {
    let Some(pair) = pair("f") else { return };
    let tmp = TempDir::new("capture-full");
    let (trace, _sent) = traffic(&tmp, 3000);
    let small = Mount::new(tmp.join("small"), "size=1m");
    let store = small.0.join("store");
    let (mut child, lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &["--flush-every", "1s", "--json"]);
    let tcpreplay = tool("tcpreplay").expect("tcpreplay");
    run(pair.exec(&pair.a).arg(tcpreplay).args(["-q", "-i", &pair.va, "--pps", "5000", "--loop", "3"]).arg(&trace));
    let status = wait(&mut child, Duration::from_secs(60));
    assert!(!status.success(), "a full disk ends the capture with an error");
    std::thread::sleep(Duration::from_millis(200));
    let errs: Vec<String> = lines.try_iter().filter(|l| l.contains("error")).collect();
    assert_eq!(errs.len(), 1, "one error line: {errs:?}");
    assert!(errs[0].contains("No space left on device") && errs[0].contains("not written"), "{}", errs[0]);
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let s = summary(&stdout);
    assert!(s["not_written"].as_u64().unwrap_or(0) > 0, "the packets not written are counted: {s}");
    let o = run(Command::new(pcaptool_bin()).arg("info").arg(&store));
    assert!(o.status.success(), "the store stays readable: {}", String::from_utf8_lossy(&o.stderr));
    drop(small);

    let ro = Mount::new(tmp.join("ro"), "ro,size=1m");
    let mut c = pair.exec(&pair.b);
    c.arg(pcaptool_bin()).args(["capture", "-i", &pair.vb, "--store"]).arg(ro.0.join("store"));
    refused(&mut c, "Read-only file system");
}

/// `--queues 2`: two sockets in a fanout group (flow hash), two capture threads; the writer merges their packets
/// by timestamp, so every packet is stored once and in the order it arrived.
#[test]
fn fanout_queues_store_every_packet_once() {
    let Some(pair) = pair("o") else { return };
    let tmp = TempDir::new("capture-fanout");
    let (trace, sent) = traffic(&tmp, 3000);
    let store = tmp.join("store");
    capture_all(&pair, &trace, sent.len(), &store, &["--queues", "2"]);
    let got: Vec<Vec<u8>> = stored(&store, &tmp).into_iter().map(|g| g.1).collect();
    assert_eq!(got.len(), sent.len(), "every sent packet stored once");
    assert!(got == sent, "the two sockets' packets merged back into the order they arrived in");
}

/// The AF_XDP backend (when the binary is built with `--features xdp`: CI does): every packet comes back byte for
/// byte and in order, with 0 drops, and the summary names the backend. The link's MTU is 3000 here: XDP on veth
/// takes frames that fit a page.
#[test]
fn af_xdp_captures_byte_for_byte() {
    if !pcaptool_tests::built_with("xdp") {
        // .ci/run runs the capture tests a second time with PCAPTOOL_FEATURES=xdp, which runs this one.
        eprintln!("SKIPPED: the binary is built without the `xdp` feature (PCAPTOOL_FEATURES=xdp builds it)");
        return;
    }
    let Some(pair) = pair("x") else { return };
    for (ns, dev) in [(&pair.a, &pair.va), (&pair.b, &pair.vb)] {
        assert!(run(Command::new("ip").args(["-n", ns, "link", "set", dev, "mtu", "3000"])).status.success());
    }
    let tmp = TempDir::new("capture-xdp");
    let (trace, sent) = traffic_up_to(&tmp, 3000, 3000);
    let store = tmp.join("store");
    let s = capture_all(&pair, &trace, sent.len(), &store, &["--backend", "af_xdp"]);
    assert!(s["backend"].as_str().is_some_and(|b| b.starts_with("af_xdp")), "{s}");
    let got = stored(&store, &tmp);
    assert_eq!(got.len(), sent.len(), "every sent packet stored: {s}");
    assert!(got.iter().map(|g| &g.1).eq(sent.iter()), "byte for byte and in order");
    assert_eq!(s["kernel_drops"].as_u64(), Some(0));
    assert_eq!(s["pcaptool_drops"].as_u64(), Some(0));
    println!("af_xdp: {} packets stored byte for byte ({})", sent.len(), s["backend"]);
}

/// `capture --export DIR`: segments are exported to Parquet while the capture runs (as they close), the last
/// ones when it ends; `pcaptool export` over the same store and directory then finds nothing left, and the rows
/// count every packet written.
#[test]
fn capture_exports_segments_as_they_close() {
    let Some(pair) = pair("x") else { return };
    let tmp = TempDir::new("capture-export");
    let (trace, sent) = traffic(&tmp, 3000);
    let (store, out) = (tmp.join("store"), tmp.join("export"));
    let extra = ["--flush-every", "1s", "--export", out.to_str().unwrap(), "--export-packets", "--sensor", "cap-1"];
    let (mut child, lines) = start_capture(&pair, &pair.b, &pair.vb, &store, &extra);
    replay(&pair, &trace, 3000);
    // Exported while the capture runs: the manifest lists a segment within seconds of the last packet.
    let manifest = out.join("_pcaptool_manifest.json");
    let t = Instant::now();
    while !manifest.exists() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some(status) = child.try_wait().unwrap() {
        let said: Vec<String> = lines.try_iter().collect();
        panic!("capture ended ({status}) before this test stopped it, saying {said:?}");
    }
    assert!(manifest.exists(), "no segment exported while capturing");
    let (status, said) = interrupt(&mut child, &lines);
    assert!(status.success(), "SIGINT ends the capture and its export cleanly: {said:?}");
    assert!(said.iter().any(|l| l.contains("exported to")), "{said:?}");
    // Every segment is exported, flows and packets, under the store directory's name.
    let o = run(Command::new(pcaptool_bin())
        .arg("export")
        .arg(&store)
        .args(["--to", "parquet", "--out"])
        .arg(&out)
        .args(["--sensor", "cap-1", "--packets", "--json"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    assert_eq!(summary["segments"].as_u64(), Some(0), "left for a later export: {summary}");
    assert!(summary["already_exported"].as_u64().unwrap() >= 1, "{summary}");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let m: serde_json::Value = serde_json::from_str(&text).unwrap();
    let packets: u64 = m["segments"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|s| assert_eq!((s["sensor"].as_str(), s["store"].as_str()), (Some("cap-1"), Some("store"))))
        .map(|s| s["packets"]["rows"].as_u64().unwrap())
        .sum();
    // (The summary line says whether a shortfall was lost before the store or in the export.)
    let summary = said.iter().find(|l| l.contains("packets received")).map_or("no summary line", |l| l.as_str());
    assert_eq!(packets, sent.len() as u64, "packet rows of every packet captured: {summary}");
}
