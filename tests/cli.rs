//! `pcaptool info` and `pcaptool convert` through the binary, on testdata/ and generated traces; outputs are opened
//! with the real tcpdump and tshark (skipped with a message where they are not installed; CI has them).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use pcaptool_packet::TraceReader;
use pcaptool_tests::tracegen::GenOptions;
use pcaptool_tests::{TempDir, pcaptool_bin, repo_root, tool};
use pcaptool_tests::{generated_trace, path_arg as p, pcaptool};
use serde_json::Value;

fn testdata(name: &str) -> PathBuf {
    repo_root().join("testdata").join(name)
}

fn info_json(path: &Path) -> (Value, Output) {
    let out = pcaptool(&["info", "--json", p(path)]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("info --json prints JSON");
    (v[0].clone(), out)
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().map(String::from).collect()
}

#[test]
fn info_reads_two_pcapng_sections_of_both_byte_orders() {
    let (v, out) = info_json(&testdata("pcapng-two-sections.pcapng"));
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert_eq!(v["format"], "pcapng");
    assert_eq!(v["byte_order"], "big-endian");
    assert_eq!(v["packets"], 5);
    assert_eq!(v["interfaces"], 3);
    assert_eq!(v["without_timestamp"], 1, "the simple packet block has no timestamp");
    assert_eq!(v["truncated_packets"], 1, "the obsolete packet block says 1514 on the wire, 54 captured");
    let lts: Vec<(u64, u64)> = v["link_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["linktype"].as_u64().unwrap(), l["packets"].as_u64().unwrap()))
        .collect();
    assert_eq!(lts, vec![(1, 3), (101, 1), (276, 1)]);
    // if_tsresol 2^-20 with if_tsoffset 10 s: 3.5 s + 10 s.
    assert_eq!(v["earliest_ns"], 13_500_000_000u64);
    assert_eq!(v["latest_ns"], 1_700_000_000_123_456_789u64);
    assert_eq!(v["first_ns"], 1_600_000_000_000_001_000u64);
    assert_eq!(v["last_time"], "2023-11-14T22:13:20.123456789Z");
}

#[test]
fn info_matches_tshark_per_packet_on_testdata() {
    let Some(tshark) = tool("tshark") else { return };
    for name in ["pcapng-two-sections.pcapng", "pcap-be-ns.pcap", "tunnels.pcap"] {
        let path = testdata(name);
        let out = Command::new(&tshark)
            .args(["-T", "fields", "-e", "frame.time_epoch", "-e", "frame.len", "-e", "frame.cap_len", "-r"])
            .arg(&path)
            .output()
            .unwrap();
        let theirs: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
        let mut r = TraceReader::open(&path).unwrap();
        let mut ours = Vec::new();
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            let ts = if rec.has_ts {
                format!("{}.{:09}", rec.ts_ns / 1_000_000_000, rec.ts_ns % 1_000_000_000)
            } else {
                String::new()
            };
            ours.push(format!("{ts}\t{}\t{}", rec.wirelen, rec.caplen()));
        }
        assert_eq!(ours, theirs, "{name}");
    }
}

#[test]
fn damage_is_reported_after_every_complete_record() {
    for (name, packets, offset, what) in [
        ("truncated-last-record.pcap", 3, 234, "file ends inside packet data"),
        ("garbage-tail.pcap", 2, 164, "captured length"),
    ] {
        let (v, out) = info_json(&testdata(name));
        assert!(!out.status.success(), "{name}: damage exits non-zero");
        assert_eq!(v["packets"], packets, "{name}");
        let lines = stderr_lines(&out);
        assert_eq!(lines.len(), 1, "{name}: one error line: {lines:?}");
        assert!(lines[0].starts_with("pcaptool: error: "), "{}", lines[0]);
        assert!(
            lines[0].contains(name) && lines[0].contains(&format!("at byte {offset}")) && lines[0].contains(what),
            "{}",
            lines[0]
        );
    }
}

#[test]
fn unreadable_inputs_give_one_clear_line() {
    let missing = pcaptool(&["info", "/nonexistent/x.pcap"]);
    assert!(!missing.status.success());
    let lines = stderr_lines(&missing);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("/nonexistent/x.pcap") && lines[0].contains("No such file"), "{}", lines[0]);

    let not_capture = pcaptool(&["info", p(&testdata("make.py"))]);
    assert!(!not_capture.status.success());
    let lines = stderr_lines(&not_capture);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("not a capture file") && lines[0].contains("at byte 0"), "{}", lines[0]);

    let dir = TempDir::new("cli-empty");
    let empty = dir.join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    let out = pcaptool(&["info", p(&empty)]);
    assert!(!out.status.success());
    assert!(stderr_lines(&out)[0].contains("file ends inside the file magic"), "{:?}", stderr_lines(&out));
}

/// Like capinfos: `info a missing b` reports a and b, says what is wrong with the missing one on one line, and
/// exits non-zero; `--json` lists all three. Errors name a file once: neither repeated nor lost.
#[test]
fn info_reports_every_file_and_errors_name_the_file_once() {
    let (a, b) = (testdata("geneve.pcap"), testdata("tunnels.pcap"));
    let missing = "/nonexistent/missing.pcap";
    let out = pcaptool(&["info", p(&a), missing, p(&b)]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("geneve.pcap") && text.contains("tunnels.pcap"), "{text}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0], format!("pcaptool: error: {missing}: No such file or directory (os error 2)"));
    let out = pcaptool(&["info", "--json", p(&a), missing, p(&b)]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files: Vec<&str> = v.as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap()).collect();
    assert_eq!(files, [p(&a), missing, p(&b)]);
    assert!(v[0]["packets"].as_u64().unwrap() > 0 && v[1]["error"].as_str().unwrap().contains("No such file"));

    let dir = TempDir::new("cli-errors");
    let out_file = dir.join("o.pcap");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let other = dir.join("notes");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("readme.txt"), b"not a capture").unwrap();
    for args in [
        vec!["convert", missing, p(&out_file)],
        vec!["query", missing, "tcp", "--count"],
        vec!["index", missing],
        vec!["import", missing, "--store", p(&dir.join("st"))],
        vec!["import", p(&a), "--store", p(&file)],
        vec!["info", p(&other)],
    ] {
        let o = pcaptool(&args);
        assert!(!o.status.success(), "{args:?}");
        let lines = stderr_lines(&o);
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        let named = if args.contains(&missing) {
            missing.to_string()
        } else if args[0] == "info" {
            p(&other).to_string()
        } else {
            p(&file).to_string()
        };
        assert_eq!(lines[0].matches(named.as_str()).count(), 1, "{args:?}: the file named once: {}", lines[0]);
    }
}

fn generated(dir: &TempDir, packets: u64) -> PathBuf {
    generated_trace(dir, "gen.pcap", packets, GenOptions::default().seed)
}

fn timestamps(path: &Path) -> Vec<u64> {
    let mut r = TraceReader::open(path).unwrap();
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        v.push(rec.unwrap().ts_ns);
    }
    v
}

#[test]
fn convert_refuses_to_overwrite_its_input() {
    let dir = TempDir::new("cli-same");
    let src = generated(&dir, 100);
    let before = std::fs::read(&src).unwrap();
    let o = pcaptool(&["convert", p(&src), p(&src)]);
    assert!(!o.status.success());
    assert!(stderr_lines(&o)[0].contains("both the input and the output"), "{:?}", stderr_lines(&o));
    assert_eq!(std::fs::read(&src).unwrap(), before, "the input is untouched");
}

#[test]
fn convert_time_window_is_packet_exact() {
    let dir = TempDir::new("cli-window");
    let src = generated(&dir, 3000);
    let ts = timestamps(&src);
    let (a, b) = (ts[1000], ts[2000]);
    let out = dir.join("w.pcap");
    let fmt = |t: u64| format!("{}.{:09}", t / 1_000_000_000, t % 1_000_000_000);
    let o = pcaptool(&["convert", p(&src), p(&out), "--after", &fmt(a), "--before", &fmt(b)]);
    assert!(o.status.success(), "{:?}", stderr_lines(&o));
    let expected: Vec<u64> = ts.iter().copied().filter(|&t| t >= a && t < b).collect();
    assert_eq!(timestamps(&out), expected);
    // RFC 3339 gives the same window.
    let rfc = |t: u64| pcaptool_packet::Rfc3339(t).to_string();
    let out2 = dir.join("w2.pcap");
    let o = pcaptool(&["convert", p(&src), p(&out2), "--after", &rfc(a), "--before", &rfc(b)]);
    assert!(o.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
    // An empty window is refused with a reason.
    let o = pcaptool(&["convert", p(&src), p(&dir.join("x.pcap")), "--after", &fmt(b), "--before", &fmt(a)]);
    assert!(!o.status.success());
    assert!(stderr_lines(&o)[0].contains("--after must be earlier than --before"));
    let o = pcaptool(&["convert", p(&src), p(&dir.join("x.pcap")), "--after", "yesterday"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("RFC 3339"));
}

#[test]
fn convert_outputs_open_in_tcpdump_and_tshark() {
    let tcpdump = tool("tcpdump");
    let tshark = tool("tshark");
    let dir = TempDir::new("cli-tools");
    let src = generated(&dir, 2000);
    let cases: Vec<(PathBuf, Vec<&str>, bool)> = vec![
        (src.clone(), vec!["--format", "pcapng"], false),
        (src.clone(), vec!["--format", "pcap", "--precision", "us"], true),
        (src.clone(), vec!["--snaplen", "64"], true),
        (testdata("tunnels.pcap"), vec!["--format", "pcapng", "--precision", "ns"], false),
        (testdata("pcapng-two-sections.pcapng"), vec!["--format", "pcapng"], false),
        (testdata("pcap-be-ns.pcap"), vec!["--format", "pcap"], true),
    ];
    for (i, (input, args, is_pcap)) in cases.iter().enumerate() {
        let out = dir.join(&format!("o{i}.{}", if *is_pcap { "pcap" } else { "pcapng" }));
        let mut a = vec!["convert", p(input), p(&out)];
        a.extend(args.iter().copied());
        let o = pcaptool(&a);
        assert!(o.status.success(), "{a:?}: {:?}", stderr_lines(&o));
        let n_in = timestamps(input).len();
        let n_out = timestamps(&out).len();
        assert_eq!(n_in, n_out, "{a:?}");
        if args.contains(&"--snaplen") {
            let mut r = TraceReader::open(&out).unwrap();
            let mut s = TraceReader::open(input).unwrap();
            while let (Some(x), Some(y)) = (r.next_record(), s.next_record()) {
                let (x, y) = (x.unwrap(), y.unwrap());
                assert_eq!(x.data, &y.data[..y.data.len().min(64)]);
                assert_eq!(x.wirelen, y.wirelen);
            }
        }
        // libpcap cannot read pcapng with several link types (tcpdump fails on that input too).
        let single_link = !input.ends_with("pcapng-two-sections.pcapng");
        if let Some(t) = tcpdump.as_ref().filter(|_| single_link) {
            // tcpdump reads the whole file and writes every packet on.
            let copy = dir.join("tcpdump-copy.pcap");
            let o = Command::new(t)
                .arg("--time-stamp-precision=nano")
                .arg("-r")
                .arg(&out)
                .arg("-w")
                .arg(&copy)
                .output()
                .unwrap();
            assert!(o.status.success(), "tcpdump -r {a:?}: {}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(timestamps(&copy), timestamps(&out), "tcpdump's copy {a:?}");
        }
        if let Some(t) = &tshark {
            let o =
                Command::new(t).args(["-T", "fields", "-e", "frame.interface_id", "-r"]).arg(&out).output().unwrap();
            assert!(o.status.success(), "tshark -r {a:?}: {}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), n_out, "tshark count {a:?}");
            if !*is_pcap && input.ends_with("pcapng-two-sections.pcapng") {
                let ids: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect();
                assert_eq!(ids, ["0", "1", "0", "0", "2"], "interface ids kept");
            }
        }
    }
}

#[test]
fn stdin_stdout_and_compressed_streams() {
    let dir = TempDir::new("cli-pipes");
    let src = generated(&dir, 1500);
    let gz = dir.join("a.pcapng.gz");
    assert!(pcaptool(&["convert", p(&src), p(&gz)]).status.success());
    // Compressed input on standard input, output on standard output.
    let mut child = Command::new(pcaptool_bin())
        .args(["convert", "-", "-", "--format", "pcap"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let data = std::fs::read(&gz).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let mut produced = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut produced).unwrap();
    writer.join().unwrap().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(produced, std::fs::read(&src).unwrap(), "gzip pcapng through pipes back to the original pcap");
    // info reads standard input too.
    let out = Command::new(pcaptool_bin())
        .args(["info", "--json", "-"])
        .stdin(std::fs::File::open(&gz).unwrap())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["packets"], 1500);
    assert_eq!(v[0]["compression"], "gzip");
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let dir = TempDir::new("cli-pipe-closed");
    let src = generated(&dir, 20_000);
    let mut child = Command::new(pcaptool_bin())
        .args(["convert", p(&src), "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "exit on a closed pipe: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
}

#[test]
fn info_text_shows_the_protocol_breakdown() {
    let out = pcaptool(&["info", p(&testdata("tunnels.pcap"))]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for proto in
        ["vlan", "mpls", "pppoe", "gre", "vxlan", "ip-fragment", "headers-cut-by-snaplen", "ipv6", "tcp", "udp", "icmp"]
    {
        assert!(text.lines().any(|l| l.trim_start().starts_with(proto)), "{proto} missing from:\n{text}");
    }
}
