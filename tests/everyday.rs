//! Everyday command-line use, through the binary, against the Wireshark and tcpdump tools that do the same:
//! several traces in one command (checked against `mergecap` then `tcpdump`), listing packets as tcpdump does,
//! and the trace tools. Generated traces always; the real captures of `../shared/corpus` where they are present
//! (skipped with a message otherwise; CI has them). mergecap and tcpdump are skipped with a message where they
//! are not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, records_us, repo_root, tcpdump_records, tool};
use pcaptool_tests::{generated_trace as gen_trace, path_arg as p, pcaptool, stderr_of as err};

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Traces whose packets interleave in time: generated ones (those of different seeds start at the same time), and
/// real ones of the corpus when present.
fn trace_sets(tmp: &TempDir) -> Vec<Vec<PathBuf>> {
    let gen_dir = tmp.join("gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    let a = gen_trace(&gen_dir, "a.pcap", 3000, 1);
    let b = gen_trace(&gen_dir, "b.pcap", 2000, 2);
    let mut sets = vec![vec![a, b]];
    match corpus_dir() {
        Some(c) => sets.push(
            [
                "suricata-verify/tests/bug-4376/syn_retransmit_with_ts.pcap",
                "tcpdump/tests/afs.pcap",
                "suricata-verify/tests/smb2-09-trunc-file-logging/input.pcap",
            ]
            .iter()
            .map(|f| c.join(f))
            .filter(|f| f.exists())
            .collect(),
        ),
        None => eprintln!("../shared/corpus is absent: several traces are checked on generated traces only"),
    }
    sets
}

/// `pcaptool query a b -- FILTER` (and with -r, a directory, a pattern, commas) returns exactly what tcpdump
/// returns on the traces merged by `mergecap`; `info`, `index` and `flows` take the same lists.
#[test]
fn several_traces_answer_as_their_merge() {
    let (Some(mergecap), Some(tcpdump)) = (tool("mergecap"), tool("tcpdump")) else {
        eprintln!("mergecap or tcpdump is not installed: skipped");
        return;
    };
    let tmp = TempDir::new("everyday-several");
    for (n, set) in trace_sets(&tmp).iter().enumerate() {
        // The same traces in a directory of their own, indexed but for one (each is read with its index, if any).
        let dir = tmp.join(&format!("set{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let names: Vec<PathBuf> = set
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let to = dir.join(format!("{i}-{}", t.file_name().unwrap().to_string_lossy()));
                std::fs::copy(t, &to).unwrap();
                to
            })
            .collect();
        let o = pcaptool(&["index", p(&dir)]);
        assert!(o.status.success(), "{}", err(&o));
        assert_eq!(out(&o).lines().count(), names.len(), "a directory's captures are indexed");
        std::fs::remove_file(format!("{}.ptidx", p(&names[0]))).unwrap();
        let merged = tmp.join(&format!("merged{n}.pcap"));
        let o = Command::new(&mergecap).arg("-F").arg("pcap").arg("-w").arg(&merged).args(&names).output().unwrap();
        assert!(o.status.success(), "mergecap: {}", err(&o));
        let joined = names.iter().map(|n| p(n)).collect::<Vec<_>>().join(",");
        let pattern = format!("{}/*.pcap", p(&dir));
        for filter in ["tcp", "udp or icmp", "tcp port 80 or tcp port 445", "not ip6", ""] {
            let want = tcpdump_records(&tcpdump, &merged, filter, &tmp.join("want.pcap")).unwrap();
            let got_path = tmp.join("got.pcap");
            let out_args = ["query", "-w", p(&got_path)];
            let mut forms: Vec<Vec<&str>> = vec![
                [&out_args[..], &names.iter().flat_map(|n| ["-r", p(n)]).collect::<Vec<_>>(), &[filter]].concat(),
                [&out_args[..], &[p(&dir), filter]].concat(),
                [&out_args[..], &[pattern.as_str(), filter]].concat(),
                [&out_args[..], &[joined.as_str(), filter]].concat(),
            ];
            if !filter.is_empty() {
                forms.push([&out_args[..], &names.iter().map(|n| p(n)).collect::<Vec<_>>(), &["--", filter]].concat());
            }
            for mut args in forms {
                args.retain(|a| !a.is_empty());
                let o = pcaptool(&args);
                assert!(o.status.success(), "{args:?}: {}", err(&o));
                assert!(err(&o).is_empty(), "{args:?}: {}", err(&o));
                assert!(records_us(&got_path) == want, "{args:?}: not tcpdump's packets of the merged traces");
            }
            let o = pcaptool(&["query", "--count", p(&dir), "--", filter]);
            assert_eq!(out(&o).trim(), want.len().to_string(), "{filter}: {}", err(&o));
        }
        // info: one report per capture of the directory; a pattern that matches nothing is an error at the end.
        let o = pcaptool(&["info", "--json", "--no-protocols", p(&dir), &format!("{}/*.none", p(&dir))]);
        assert_eq!(o.status.code(), Some(1));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v.as_array().unwrap().len(), names.len() + 1);
        assert!(v[names.len()]["error"].as_str().unwrap().contains("no file matches"), "{v}");
        // flows of several traces: the flows of one store they are imported into.
        let store = tmp.join(&format!("store{n}"));
        let mut import = vec!["import"];
        import.extend(names.iter().map(|n| p(n)));
        import.extend(["--store", p(&store)]);
        assert!(pcaptool(&import).status.success());
        let of_store = pcaptool(&["flows", p(&store), "tcp"]);
        let work = tmp.join("work");
        let of_traces = pcaptool(&["flows", p(&dir), "--work-dir", p(&work), "--", "tcp"]);
        assert!(of_traces.status.success(), "{}", err(&of_traces));
        assert_eq!(out(&of_traces), out(&of_store), "flows of the traces are the flows of their store");
        assert!(out(&of_store).lines().count() > 1);
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "the temporary store is removed");
    }
}

/// The (µs time, wire length) of each packet a `query --json` listing prints.
fn listed(o: &Output) -> Vec<(u64, u32)> {
    out(o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["ts"].as_u64().unwrap() / 1000, v["len"].as_u64().unwrap() as u32)
        })
        .collect()
}

/// Without -w, `pcaptool query` lists the packets tcpdump lists, in its order, one line each (text and JSON
/// lines); `-c N` the first N. On generated traces and, when present, on every small corpus trace of one link
/// type with five filters.
#[test]
fn listing_shows_the_packets_tcpdump_lists() {
    let Some(tcpdump) = tool("tcpdump") else {
        eprintln!("tcpdump is not installed: skipped");
        return;
    };
    let tmp = TempDir::new("everyday-list");
    let mut traces = vec![gen_trace(&tmp, "gen.pcap", 4000, 5)];
    match corpus_dir() {
        Some(c) => traces.extend(
            corpus_files(&c)
                .iter()
                .map(|f| c.join(f))
                .filter(|f| std::fs::metadata(f).is_ok_and(|m| m.len() < 1 << 20))
                .step_by(20),
        ),
        None => eprintln!("../shared/corpus is absent: listing is checked on a generated trace only"),
    }
    let (mut compared, mut packets) = (0, 0);
    for trace in &traces {
        for filter in ["", "tcp", "udp and not port 53", "ip6 or arp", "vlan or icmp"] {
            let Some(want) = tcpdump_records(&tcpdump, trace, filter, &tmp.join("want.pcap")) else { continue };
            let mut args = vec!["query", p(trace), "--json"];
            args.extend((!filter.is_empty()).then_some(filter));
            let o = pcaptool(&args);
            if !o.status.success() {
                // A trace or filter pcaptool refuses: the corpus and filter tests hold those to tcpdump's.
                continue;
            }
            let want: Vec<(u64, u32)> = want.iter().map(|r| (r.0, r.1)).collect();
            assert_eq!(listed(&o), want, "{} {filter:?}: not tcpdump's packets", trace.display());
            args.retain(|a| *a != "--json");
            let text = pcaptool(&args);
            assert!(text.status.success());
            let lines: Vec<String> = out(&text).lines().map(String::from).collect();
            assert_eq!(lines.len(), want.len(), "{} {filter:?}: one line a packet", trace.display());
            for (l, (ts, len)) in lines.iter().zip(&want) {
                assert!(l.ends_with(&format!(", length {len}")), "{l}");
                let us = format!("{:02}.{:06}", ts / 1_000_000 % 60, ts % 1_000_000);
                assert!(l.split(' ').next().unwrap().contains(&us), "{l}: the time is not {us}");
            }
            args.extend(["-c", "3"]);
            let first = pcaptool(&[args.clone(), vec!["--json"]].concat());
            assert_eq!(listed(&first), want.iter().take(3).copied().collect::<Vec<_>>());
            compared += 1;
            packets += want.len();
        }
    }
    eprintln!("listing: {compared} trace and filter pairs, {packets} packets, as tcpdump lists them");
    assert!(compared >= 5);
}

/// Completions and manual pages come from the command line's definition: every command is in them, bash takes
/// the script, and `--version` names the features built in.
#[test]
fn completions_man_pages_and_version() {
    let o = pcaptool(&["--version"]);
    let v = out(&o);
    assert!(v.starts_with("pcaptool ") && v.contains("export"), "{v}");
    assert_eq!(v.contains("features: export"), !v.contains("without: export"), "{v}");
    let commands = ["info", "convert", "index", "query", "import", "flows", "capture", "serve", "verify", "man"];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = pcaptool(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", err(&o));
        let script = out(&o);
        for c in commands {
            assert!(script.contains(c), "{shell}: {c} missing");
        }
    }
    match tool("bash") {
        Some(bash) => {
            let script = out(&pcaptool(&["completions", "bash"]));
            let o = Command::new(bash).args(["-c", &format!("{script}\ncomplete -p pcaptool")]).output().unwrap();
            assert!(o.status.success() && out(&o).contains("_pcaptool"), "{}", err(&o));
        }
        None => eprintln!("bash is not installed: the script is not loaded"),
    }
    let page = out(&pcaptool(&["man"]));
    assert!(page.contains(".TH pcaptool 1") && page.contains("query"), "{page}");
    let tmp = TempDir::new("everyday-man");
    let dir = tmp.join("man");
    let o = pcaptool(&["man", "--out", p(&dir)]);
    assert!(o.status.success(), "{}", err(&o));
    for c in commands {
        let page = std::fs::read_to_string(dir.join(format!("pcaptool-{c}.1"))).unwrap();
        assert!(page.contains(&format!(".TH pcaptool-{c} 1")), "{c}: {page}");
    }
    if let Some(man) = tool("man") {
        let o = Command::new(man).arg("-l").arg(dir.join("pcaptool-query.1")).env("MANPAGER", "cat").output().unwrap();
        assert!(o.status.success() && out(&o).contains("tcpdump filter"), "{}", err(&o));
    }
}

/// `pcaptool shell` opens a flow store: counts, flows, a flow's packets (counted and written) and listings equal
/// what `query`, `flows` and `query --flow` answer.
#[test]
fn shell_opens_stores() {
    use std::io::Write as _;
    let tmp = TempDir::new("everyday-shell");
    let a = gen_trace(&tmp, "a.pcap", 3000, 3);
    let store = tmp.join("store");
    assert!(pcaptool(&["import", p(&a), "--store", p(&store)]).status.success());
    let written = tmp.join("flow.pcap");
    let script = format!("tcp\nflows udp\nflow 5\nflow 5 {}\nlist tcp port 22\nflow x\nquit\n", p(&written));
    let mut child = Command::new(pcaptool_bin())
        .args(["shell", p(&store)])
        .env("HOME", tmp.join("home"))
        .env_remove("XDG_STATE_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("flow store of") && err(&o).contains("error: flow needs a flow id"), "{}", err(&o));
    let query = |args: &[&str]| out(&pcaptool(&[&["query", p(&store)][..], args].concat()));
    let flows = out(&pcaptool(&["flows", p(&store), "--json", "udp"]));
    let listing = query(&["tcp port 22", "-c", "101"]);
    let mut want = query(&["tcp", "--count"]);
    want += &flows;
    want += &query(&["--flow", "5", "--count"]);
    want += &query(&["--flow", "5", "--count"]);
    for l in listing.lines().take(100) {
        want += l;
        want.push('\n');
    }
    if listing.lines().count() > 100 {
        want += "(more: `write FILE FILTER` keeps them all)\n";
    }
    assert_eq!(out(&o), want);
    let expected = tmp.join("expected.pcap");
    assert!(pcaptool(&["query", p(&store), "--flow", "5", "-w", p(&expected)]).status.success());
    assert_eq!(std::fs::read(&written).unwrap(), std::fs::read(&expected).unwrap());
}

/// Runs a Wireshark tool; None (with a message) when it is not installed.
fn wireshark(name: &str, args: &[&str]) -> Option<Output> {
    let Some(t) = tool(name) else {
        eprintln!("{name} is not installed: its comparison is skipped");
        return None;
    };
    let o = Command::new(t).args(args).output().unwrap();
    if !o.status.success() {
        // A file the Wireshark tool cannot write (mergecap and two pcapng sections of different link types).
        eprintln!("{name} {args:?} fails, its comparison is skipped: {}", err(&o));
        return None;
    }
    Some(o)
}

/// Records (µs time, wire length, bytes) of every file of a split, in file order, files with none left out.
fn split_records(files: &[PathBuf]) -> Vec<Vec<(u64, u32, Vec<u8>)>> {
    files.iter().map(|f| records_us(f)).filter(|r| !r.is_empty()).collect()
}

/// The traces the tools are tried on: generated ones (with duplicates and disorder made by mergecap), and real
/// ones from the corpus when present.
fn tool_traces(tmp: &TempDir) -> Vec<PathBuf> {
    let dir = tmp.join("in");
    std::fs::create_dir_all(&dir).unwrap();
    let mut v = vec![gen_trace(&dir, "gen.pcap", 3000, 11)];
    match corpus_dir() {
        Some(c) => v.extend(
            [
                "suricata-verify/tests/smb2-09-trunc-file-logging/input.pcap",
                "tcpdump/tests/pim-packet-assortment.pcap",
                "tcpdump/tests/afs.pcap",
            ]
            .iter()
            .map(|f| c.join(f))
            .filter(|f| f.exists()),
        ),
        None => eprintln!("../shared/corpus is absent: the tools are tried on generated traces only"),
    }
    v.push(repo_root().join("testdata/tunnels.pcap"));
    v.push(repo_root().join("testdata/pcapng-two-sections.pcapng"));
    v
}

/// merge, sort, dedup and split write what mergecap, reordercap and editcap write: the same records in the same
/// order (and, for split, in the same files, editcap's empty ones aside).
#[test]
fn merge_sort_dedup_and_split_match_the_wireshark_tools() {
    if tool("mergecap").is_none() {
        eprintln!("mergecap is not installed: skipped");
        return;
    }
    let tmp = TempDir::new("everyday-tools");
    let traces = tool_traces(&tmp);
    let w = |n: &str| tmp.join(n);
    for t in &traces {
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        // merge: the trace with a second copy of itself, pcap out (as mergecap -F pcap).
        let twice = w("twice.pcapng");
        let copy = w(&format!("copy-{name}"));
        std::fs::copy(t, &copy).unwrap();
        let o = pcaptool(&["merge", p(t), p(&copy), "-w", p(&twice)]);
        assert!(o.status.success(), "{name}: {}", err(&o));
        let m = w("m.pcapng");
        let theirs = match wireshark("mergecap", &["-w", p(&m), p(t), p(&copy)]) {
            Some(_) => records_us(&m),
            None => Vec::new(),
        };
        let ours = records_us(&twice);
        assert_eq!(ours.len(), 2 * records_us(t).len(), "{name}: merge lost packets");
        // A packet longer than its interface's snapshot length is cut to it, as libpcap reads it (mergecap keeps
        // it whole, and libpcap, tcpdump and our reader then stop at it in mergecap's output): compare what
        // both hold, times and wire lengths whole.
        if theirs.len() < ours.len() {
            eprintln!("{name}: mergecap's output is readable for {} of {} packets only", theirs.len(), ours.len());
        }
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let n = a.2.len().min(b.2.len());
            assert!(a.0 == b.0 && a.1 == b.1 && a.2[..n] == b.2[..n], "{name}: packet {i} differs from mergecap's");
        }
        // dedup: every packet is there twice, back to back (editcap -d, -D 3, -w 0.5).
        for (ours, theirs) in [
            (vec![], vec!["-d"]),
            (vec!["--window", "3"], vec!["-D", "3"]),
            (vec!["--time-window", "0.5"], vec!["-w", "0.5"]),
        ] {
            let (a, b) = (w("d1.pcapng"), w("d2.pcapng"));
            let o = pcaptool(&[&["dedup", p(&twice), "-w", p(&a)][..], &ours].concat());
            assert!(o.status.success(), "{name}: {}", err(&o));
            if wireshark("editcap", &[&theirs[..], &[p(&twice), p(&b)]].concat()).is_some() {
                assert!(records_us(&a) == records_us(&b), "{name} {ours:?}: dedup differs from editcap {theirs:?}");
            }
        }
        // sort: the trace appended after a later one, so that it is out of order (mergecap -a).
        let later = w("later.pcap");
        let o = pcaptool(&["convert", p(t), p(&later)]);
        assert!(o.status.success() || !err(&o).is_empty());
        let unordered = w("unordered.pcapng");
        if wireshark("mergecap", &["-a", "-w", p(&unordered), p(&traces[0]), p(t)]).is_none() {
            continue;
        }
        for memory in ["512M", "16K"] {
            let (a, b) = (w("s1.pcapng"), w("s2.pcapng"));
            let o = pcaptool(&["sort", p(&unordered), "-w", p(&a), "--memory", memory]);
            assert!(o.status.success(), "{name}: {}", err(&o));
            if wireshark("reordercap", &[p(&unordered), p(&b)]).is_some() {
                assert!(records_us(&a) == records_us(&b), "{name} --memory {memory}: sort differs from reordercap");
            }
        }
        // split: by packets and by interval.
        for (ours, theirs) in
            [(vec!["--packets", "100"], vec!["-c", "100"]), (vec!["--interval", "20"], vec!["-i", "20"])]
        {
            let (da, db) = (w(&format!("sa-{name}-{}", ours[0])), w(&format!("sb-{name}-{}", ours[0])));
            std::fs::create_dir_all(&db).unwrap();
            let o = pcaptool(&[&["split", p(t), "-w", p(&da.join("part.pcapng")), "--json"][..], &ours].concat());
            assert!(o.status.success(), "{name}: {}", err(&o));
            let ours_files: Vec<PathBuf> = out(&o)
                .lines()
                .map(|l| PathBuf::from(serde_json::from_str::<serde_json::Value>(l).unwrap()["file"].as_str().unwrap()))
                .collect();
            if wireshark("editcap", &[&theirs[..], &[p(t), p(&db.join("e.pcapng"))]].concat()).is_none() {
                continue;
            }
            let mut theirs_files: Vec<PathBuf> = std::fs::read_dir(&db).unwrap().map(|e| e.unwrap().path()).collect();
            theirs_files.sort();
            let (a, b) = (split_records(&ours_files), split_records(&theirs_files));
            let firsts = |v: &[Vec<(u64, u32, Vec<u8>)>]| v.iter().map(|f| (f.len(), f[0].0)).collect::<Vec<_>>();
            assert!(
                a == b,
                "{name} {ours:?}: split differs from editcap {theirs:?}: {:?} {:?}",
                firsts(&a),
                firsts(&b)
            );
        }
    }
}

/// split --flows keeps each flow whole in one file, and the files together hold every packet.
#[test]
fn split_by_flow_keeps_flows_whole() {
    let tmp = TempDir::new("everyday-split-flows");
    let t = gen_trace(&tmp, "t.pcap", 3000, 12);
    let o = pcaptool(&["split", p(&t), "--flows", "4", "-w", p(&tmp.join("f.pcap")), "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    let files: Vec<String> = out(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["file"].as_str().unwrap().to_string())
        .collect();
    assert!(files.len() > 1);
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut total = 0;
    for (i, f) in files.iter().enumerate() {
        let o = pcaptool(&["flows", f, "--json"]);
        for l in out(&o).lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let mut ends = [format!("{}:{}", v["orig_h"], v["orig_p"]), format!("{}:{}", v["resp_h"], v["resp_p"])];
            ends.sort();
            let key = format!("{}-{}-{}-{}", ends[0], ends[1], v["proto"], v["vlan"]);
            assert_eq!(*seen.entry(key.clone()).or_insert(i), i, "{key} is in two files");
        }
        total += records_us(Path::new(f)).len();
    }
    assert_eq!(total, records_us(&t).len());
}

/// stats counts what capinfos and tcpdump count: packets and bytes of the whole trace, and per filter; per
/// interval, the intervals add up to the whole.
#[test]
fn stats_count_as_capinfos_and_tcpdump() {
    let tmp = TempDir::new("everyday-stats");
    for t in tool_traces(&tmp) {
        let filters = ["tcp", "udp", "ip6 or arp"];
        let mut args = vec!["stats", p(&t), "--json", "--interval", "10"];
        for f in &filters {
            args.extend(["-f", f]);
        }
        let o = pcaptool(&args);
        assert!(o.status.success(), "{}: {}", t.display(), err(&o));
        let v: serde_json::Value = serde_json::from_str(out(&o).trim()).unwrap();
        let total = &v["total"];
        let all = records_us(&t);
        assert_eq!(total["all"]["packets"], all.len() as u64);
        assert_eq!(total["all"]["bytes"], all.iter().map(|r| u64::from(r.1)).sum::<u64>());
        if let Some(c) = wireshark("capinfos", &["-M", "-c", "-d", "-T", p(&t)]) {
            let line = out(&c).lines().nth(1).unwrap().to_string();
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols[1], total["all"]["packets"].to_string(), "capinfos packets: {line}");
            assert_eq!(cols[2], total["all"]["bytes"].to_string(), "capinfos bytes: {line}");
        }
        if let Some(tcpdump) = tool("tcpdump") {
            for (i, f) in filters.iter().enumerate() {
                if let Some(want) = tcpdump_records(&tcpdump, &t, f, &tmp.join("f.pcap")) {
                    assert_eq!(total["filters"][i]["packets"], want.len() as u64, "{}: {f}", t.display());
                }
            }
        }
        let intervals = v["intervals"].as_array().unwrap();
        let sum: u64 = intervals.iter().map(|i| i["all"]["packets"].as_u64().unwrap()).sum();
        assert_eq!(sum, all.len() as u64);
    }
}

/// anonymise: the published Crypto-PAn vectors hold (a unit test), and on traces: prefixes are preserved between
/// every pair of addresses, the same key maps an address the same way in two files, another key differently,
/// tshark finds every checksum as it was (valid stays valid), and --truncate-payload cuts after the headers.
#[test]
fn anonymise_preserves_prefixes_and_checksums() {
    let tmp = TempDir::new("everyday-anon");
    let key = tmp.join("key");
    std::fs::write(&key, "156e2c80a6de3a3dc8cd2b0f0a2a0b8d7a2ce5b1c56d4ea8b2b8c2ad0d5b9d11\n").unwrap();
    let addrs = |f: &Path| -> Vec<(String, String)> {
        let o = pcaptool(&["query", p(f), "ip", "--json"]);
        out(&o)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["src"].as_str().unwrap().to_string(), v["dst"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let mut mapping: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let checks = ["-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"];
    let statuses = |f: &Path| -> Option<String> {
        let fields =
            ["-T", "fields", "-e", "ip.checksum.status", "-e", "tcp.checksum.status", "-e", "udp.checksum.status"];
        wireshark("tshark", &[&["-r", p(f)][..], &checks, &fields].concat()).map(|o| out(&o))
    };
    for t in tool_traces(&tmp) {
        let a = tmp.join("a.pcapng");
        let o = pcaptool(&["anonymise", p(&t), "-w", p(&a), "--key-file", p(&key), "--macs"]);
        assert!(o.status.success(), "{}: {}", t.display(), err(&o));
        let (before, after) = (addrs(&t), addrs(&a));
        assert_eq!(before.len(), after.len());
        for ((s, d), (s2, d2)) in before.iter().zip(&after) {
            for (x, y) in [(s, s2), (d, d2)] {
                assert_eq!(mapping.entry(x.clone()).or_insert_with(|| y.clone()), y, "{x} mapped two ways");
            }
        }
        if let (Some(x), Some(y)) = (statuses(&t), statuses(&a)) {
            assert_eq!(x, y, "{}: checksum statuses changed", t.display());
        }
        // Same length and time of every packet.
        let (r0, r1) = (records_us(&t), records_us(&a));
        assert!(r0.iter().zip(&r1).all(|(x, y)| x.0 == y.0 && x.1 == y.1 && x.2.len() == y.2.len()));
        // Truncated: no longer than before, headers still decode to the same mapped addresses.
        let cut = tmp.join("cut.pcapng");
        let o = pcaptool(&["anonymise", p(&t), "-w", p(&cut), "--key-file", p(&key), "--truncate-payload"]);
        assert!(o.status.success(), "{}", err(&o));
        assert_eq!(addrs(&cut), after);
        let rc = records_us(&cut);
        assert!(rc.iter().zip(&r0).all(|(c, o)| c.2.len() <= o.2.len() && c.1 == o.1));
        assert!(rc.iter().map(|r| r.2.len()).sum::<usize>() < r0.iter().map(|r| r.2.len()).sum::<usize>());
    }
    // Prefix preservation between every pair of distinct addresses seen (IPv4 and IPv6 apart).
    let bits = |a: &str| -> Option<(u8, u128)> {
        match a.parse::<std::net::IpAddr>().ok()? {
            std::net::IpAddr::V4(v) => Some((4, u128::from(u32::from(v)) << 96)),
            std::net::IpAddr::V6(v) => Some((6, u128::from(v))),
        }
    };
    let pairs: Vec<((u8, u128), (u8, u128))> = mapping.iter().filter_map(|(x, y)| Some((bits(x)?, bits(y)?))).collect();
    assert!(pairs.len() > 10, "{} addresses", pairs.len());
    for (a, a2) in &pairs {
        for (b, b2) in &pairs {
            if a.0 == b.0 {
                assert_eq!((a.1 ^ b.1).leading_zeros(), (a2.1 ^ b2.1).leading_zeros(), "prefix of {a:?} {b:?}");
            }
        }
    }
    // Another key maps differently; a bad key is refused with what to do.
    let other = tmp.join("other.pcap");
    let t = &tool_traces(&tmp)[0];
    let k2 = "ff".repeat(32);
    assert!(pcaptool(&["anonymise", p(t), "-w", p(&other), "--key", &k2]).status.success());
    let first = &addrs(&other)[0].0;
    assert_ne!(Some(first), mapping.get(&addrs(t)[0].0));
    let o = pcaptool(&["anonymise", p(t), "-w", p(&other), "--key", "abc"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("64 hexadecimal digits"), "{}", err(&o));
}

/// FDDI, token ring and IP over Fibre Channel (testdata/, written by make.py) are filtered as tcpdump filters
/// them, listed with their decoded headers, indexed and imported.
#[test]
fn lan_link_types_with_llc_are_filtered_as_tcpdump_does() {
    let Some(tcpdump) = tool("tcpdump") else {
        eprintln!("tcpdump is not installed: skipped");
        return;
    };
    let tmp = TempDir::new("everyday-llc");
    for name in ["fddi.pcap", "token-ring.pcap", "ip-over-fc.pcap"] {
        let t = tmp.join(name);
        std::fs::copy(repo_root().join("testdata").join(name), &t).unwrap();
        assert!(pcaptool(&["index", p(&t)]).status.success());
        let filters = [
            "ip",
            "tcp",
            "udp port 53",
            "ip6",
            "arp",
            "host 192.0.2.1",
            "not ip",
            "ether host 02:00:00:00:00:0b",
            "ether src 02:00:00:00:00:0a",
            "ether broadcast",
            "ether multicast",
            "ip multicast",
            "ether proto 0x42",
        ];
        for f in filters {
            let want = tcpdump_records(&tcpdump, &t, f, &tmp.join("want.pcap")).unwrap();
            assert!(!want.is_empty() || f == "ether proto 0x42", "{name} {f}: the trace exercises the filter");
            let (got, scan) = (tmp.join("got.pcap"), tmp.join("scan.pcap"));
            let o = pcaptool(&["query", p(&t), f, "-w", p(&got)]);
            assert!(o.status.success(), "{name} {f}: {}", err(&o));
            assert_eq!(records_us(&got), want, "{name} {f}: not tcpdump's packets");
            assert!(pcaptool(&["query", "--scan", p(&t), f, "-w", p(&scan)]).status.success());
            assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&scan).unwrap(), "{name} {f}: index and scan");
        }
        let o = pcaptool(&["query", p(&t), "ip", "--json"]);
        let first: serde_json::Value = serde_json::from_str(out(&o).lines().next().unwrap()).unwrap();
        assert_eq!(first["src"], "192.0.2.1", "{name}: {first}");
        assert_eq!(first["eth_src"], "02:00:00:00:00:0a", "{name}: {first}");
        let store = tmp.join(&format!("store-{name}"));
        assert!(pcaptool(&["import", p(&t), "--store", p(&store)]).status.success());
        let flows = out(&pcaptool(&["flows", p(&store), "--json"]));
        assert!(flows.lines().count() >= 4, "{name}: {flows}");
    }
}

/// Sizes take the usual units through the binary (`100MB` was refused where `100M` worked), and a size that is
/// none says which units there are.
#[test]
fn sizes_take_the_usual_units() {
    let tmp = TempDir::new("everyday-units");
    let t = gen_trace(&tmp, "t.pcap", 500, 13);
    let store = tmp.join("st");
    assert!(pcaptool(&["import", p(&t), "--store", p(&store)]).status.success());
    for size in ["100MB", "100M", "100MiB", "1G", "2 GiB", "104857600"] {
        let o = pcaptool(&["retain", p(&store), "--max-size", size]);
        assert!(o.status.success(), "{size}: {}", err(&o));
    }
    let o = pcaptool(&["retain", p(&store), "--max-size", "10X"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("K, M, G or T"), "{}", err(&o));
    let o = pcaptool(&["split", p(&t), "--bytes", "64KB", "-w", p(&tmp.join("parts/p.pcap")), "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).lines().count() > 1);
}
