//! Everyday command-line use, through the binary, against the Wireshark and tcpdump tools that do the same:
//! several traces in one command (checked against `mergecap` then `tcpdump`), listing packets as tcpdump does,
//! and the trace tools. Generated traces always; the real captures of `../shared/corpus` where they are present
//! (skipped with a message otherwise; CI has them). mergecap and tcpdump are skipped with a message where they
//! are not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcaptool_tests::tracegen::{GenOptions, generate};
use pcaptool_tests::{TempDir, corpus_dir, corpus_files, pcaptool_bin, records_us, tcpdump_records, tool};

fn pcaptool(args: &[&str]) -> Output {
    Command::new(pcaptool_bin()).args(args).output().expect("run pcaptool")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A generated trace (those of different seeds start at the same time, so their packets interleave).
fn gen_trace(dir: &Path, name: &str, packets: u64, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let (bytes, _) = generate(Vec::new(), &GenOptions { packets, seed, ..GenOptions::default() }).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Traces whose packets interleave in time: generated ones, and real ones of the corpus when present.
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
    let mut traces = vec![gen_trace(&tmp.join("."), "gen.pcap", 4000, 5)];
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
    let a = gen_trace(&tmp.join("."), "a.pcap", 3000, 3);
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
