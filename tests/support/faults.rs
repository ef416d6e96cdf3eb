//! Fault injection against a flow store and a trace index, as a storage engine's own test suite does it: damage
//! (flipped bytes at random and chosen offsets, truncated files) and `kill -9` of every kind of writer at random
//! moments, each followed by queries whose answers are compared with the undamaged store's. Every outcome falls
//! in one class: the answer is exact, or the command fails with a clear one-line error naming the damaged file;
//! a silently wrong answer or a crash (a panic, a signal) is a defect.
//!
//! `cargo xtask faults` runs it at length and prints the table docs/guarantees.md quotes; the integration test
//! `tests/integrity.rs` runs a few tries of each kind.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::tracegen::{GenOptions, generate};

/// What to run.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// The `pcaptool` binary.
    pub pcaptool: PathBuf,
    /// A directory of the fault runs' own (emptied first).
    pub work: PathBuf,
    /// Tries of each kind of fault.
    pub tries: usize,
    /// Seed of the random offsets and moments.
    pub seed: u64,
    /// Packets of the generated trace.
    pub packets: u64,
}

/// The outcomes of one kind of fault.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// The kind of fault.
    pub kind: String,
    /// Faults injected.
    pub tries: u32,
    /// Tries after which every answer was exact.
    pub correct: u32,
    /// Tries after which some command failed with a clear error (and none answered wrongly).
    pub clear_errors: u32,
    /// Tries after which some command answered wrongly with success: must be 0.
    pub silent_wrong: u32,
    /// Tries after which some command crashed (a panic or a signal): must be 0.
    pub crashes: u32,
    /// For damage: tries `pcaptool verify` reported as damage (it must report every one).
    pub verify_found: u32,
    /// The first few defects, described.
    pub defects: Vec<String>,
}

impl Tally {
    fn new(kind: &str) -> Tally {
        Tally { kind: kind.to_string(), ..Tally::default() }
    }

    fn defect(&mut self, what: String) {
        if self.defects.len() < 5 {
            self.defects.push(what);
        }
    }
}

/// Markdown table of tallies.
pub fn table(tallies: &[Tally]) -> String {
    let mut s = String::from(
        "| fault | tries | exact answers | clear errors | silent wrong | crashes | found by `verify` |\n|---|---|---|---|---|---|---|\n",
    );
    for t in tallies {
        let verify = if t.kind.contains("flip") || t.kind.contains("truncat") {
            format!("{} of {}", t.verify_found, t.tries)
        } else {
            "n/a".to_string()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.kind, t.tries, t.correct, t.clear_errors, t.silent_wrong, t.crashes, verify
        );
    }
    s
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// The queries asked after each fault: a filter (empty: every packet), or a flow.
const FILTERS: [&str; 5] = ["", "tcp port 443", "host 10.0.1.25", "udp", "arp or icmp"];

/// How a command ended, and what it wrote.
enum Outcome {
    Answer(Vec<u8>),
    ClearError,
    Wrong(String),
}

fn crashed(o: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    o.status.signal().is_some()
        || o.status.code() == Some(101)
        || String::from_utf8_lossy(&o.stderr).contains("panicked")
}

/// Runs `pcaptool args` writing to `out` (when given), and classes the result: the bytes written, or a clear
/// error (exit status 1 or 3, one line on standard error saying `pcaptool: error:` and naming a file of
/// `names`), or a defect.
fn ask(pcaptool: &Path, args: &[&str], out: &Path, names: &[&str]) -> Result<Outcome, String> {
    let _ = std::fs::remove_file(out);
    let o = Command::new(pcaptool).args(args).output().map_err(|e| format!("cannot run pcaptool: {e}"))?;
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if crashed(&o) {
        return Ok(Outcome::Wrong(format!("`pcaptool {}` crashed ({}): {err}", args.join(" "), o.status)));
    }
    if o.status.success() {
        let mut bytes = std::fs::read(out).unwrap_or_default();
        bytes.extend_from_slice(&o.stdout);
        return Ok(Outcome::Answer(bytes));
    }
    let line = err.lines().find(|l| l.starts_with("pcaptool: error:"));
    match line {
        Some(l) if names.iter().any(|n| l.contains(n)) && err.lines().filter(|l| l.contains("error:")).count() == 1 => {
            Ok(Outcome::ClearError)
        }
        _ => Ok(Outcome::Wrong(format!("`pcaptool {}` failed unclearly ({}): {err}", args.join(" "), o.status))),
    }
}

/// Copies every file of `from` into `to` (emptied first).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        if e.file_type()?.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn run_ok(pcaptool: &Path, args: &[&str]) -> Result<Output, String> {
    let o = Command::new(pcaptool).args(args).output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!("`pcaptool {}`: {}", args.join(" "), String::from_utf8_lossy(&o.stderr)));
    }
    Ok(o)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// The offsets worth flipping in a segment index besides random ones: the first bytes (magic, version, lengths,
/// checksum), each part's first and last bytes.
fn index_targets(index: &[u8]) -> Vec<u64> {
    let le32 = |at: usize| index.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64);
    let le64 = |at: usize| index.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let mut v: Vec<u64> = (0..32).collect();
    if let (Some(s1), Some(l2), Some(lp)) = (le32(8), le64(24 + 88), le64(24 + 96)) {
        let at2 = 24 + s1;
        for at in [at2 - 1, at2, at2 + 36, at2 + l2 - 1, at2 + l2, at2 + l2 + lp - 1, at2 + l2 + lp] {
            v.push(at);
        }
    }
    v.push(index.len() as u64 - 1);
    v.retain(|&a| a < index.len() as u64);
    v
}

/// Checks the answers of the damaged store `dir` (segment files named `names`) against `want`; `verify`'s
/// verdict too.
fn check_store(
    cfg: &FaultConfig,
    t: &mut Tally,
    what: &str,
    dir: &Path,
    want: &[Vec<u8>],
    names: &[&str],
) -> Result<(), String> {
    let out = cfg.work.join("out.pcap");
    let (mut wrong, mut errors) = (false, false);
    for (f, w) in FILTERS.iter().zip(want) {
        match ask(&cfg.pcaptool, &["query", s(dir), f, "-w", s(&out)], &out, names)? {
            Outcome::Answer(got) if got == *w => {}
            Outcome::Answer(got) => {
                wrong = true;
                t.defect(format!("{what}: `{f}` answered {} bytes, {} expected, with success", got.len(), w.len()));
            }
            Outcome::ClearError => errors = true,
            Outcome::Wrong(why) => {
                wrong = true;
                t.defect(format!("{what}: {why}"));
            }
        }
    }
    t.tries += 1;
    if wrong {
        // A crash among them counts as one.
        if t.defects.last().is_some_and(|d| d.contains("crashed")) {
            t.crashes += 1;
        } else {
            t.silent_wrong += 1;
        }
    } else if errors {
        t.clear_errors += 1;
    } else {
        t.correct += 1;
    }
    let v = Command::new(&cfg.pcaptool).args(["verify", s(dir)]).output().map_err(|e| e.to_string())?;
    if crashed(&v) {
        t.crashes += 1;
        t.defect(format!("{what}: verify crashed: {}", String::from_utf8_lossy(&v.stderr)));
    } else if !v.status.success() {
        t.verify_found += 1;
    }
    Ok(())
}

/// Runs every kind of fault; returns their tallies.
pub fn run(cfg: &FaultConfig) -> Result<Vec<Tally>, String> {
    let _ = std::fs::remove_dir_all(&cfg.work);
    std::fs::create_dir_all(&cfg.work).map_err(|e| e.to_string())?;
    let mut rng = Rng(cfg.seed);
    let trace = cfg.work.join("trace.pcap");
    let (bytes, _) =
        generate(Vec::new(), &GenOptions { packets: cfg.packets, seed: cfg.seed, ..GenOptions::default() })
            .map_err(|e| e.to_string())?;
    std::fs::write(&trace, bytes).map_err(|e| e.to_string())?;
    let pristine = cfg.work.join("pristine");
    run_ok(&cfg.pcaptool, &["import", s(&trace), "--store", s(&pristine), "--segment-size", "256K"])?;
    let out = cfg.work.join("out.pcap");
    let mut want = Vec::new();
    for f in FILTERS {
        match ask(&cfg.pcaptool, &["query", s(&pristine), f, "-w", s(&out)], &out, &[])? {
            Outcome::Answer(b) => want.push(b),
            _ => return Err(format!("the undamaged store does not answer `{f}`")),
        }
    }
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&pristine)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "ptsx"))
        .collect();
    segs.sort();
    let data_files: Vec<PathBuf> =
        segs.iter().filter(|p| p.extension().is_some_and(|x| x == "pcap")).cloned().collect();
    let index_files: Vec<PathBuf> =
        segs.iter().filter(|p| p.extension().is_some_and(|x| x == "ptsx")).cloned().collect();
    let mut tallies = Vec::new();
    let damaged = cfg.work.join("damaged");

    // Byte flips and truncations of segment files.
    for (kind, files, targeted) in
        [("segment data byte flip", &data_files, false), ("segment index byte flip", &index_files, true)]
    {
        let mut t = Tally::new(kind);
        for i in 0..cfg.tries {
            copy_dir(&pristine, &damaged).map_err(|e| e.to_string())?;
            let f = &files[rng.below(files.len() as u64) as usize];
            let path = damaged.join(f.file_name().unwrap_or_default());
            let mut b = std::fs::read(&path).map_err(|e| e.to_string())?;
            let targets = if targeted { index_targets(&b) } else { Vec::new() };
            let at = if i % 2 == 1 && !targets.is_empty() {
                targets[rng.below(targets.len() as u64) as usize]
            } else {
                rng.below(b.len() as u64)
            } as usize;
            b[at] ^= 1 << rng.below(8);
            std::fs::write(&path, &b).map_err(|e| e.to_string())?;
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            check_store(cfg, &mut t, &format!("{name} byte {at}"), &damaged, &want, &[&name])?;
        }
        tallies.push(t);
    }
    let mut t = Tally::new("segment file truncated");
    for _ in 0..cfg.tries {
        copy_dir(&pristine, &damaged).map_err(|e| e.to_string())?;
        let f = &segs[rng.below(segs.len() as u64) as usize];
        let path = damaged.join(f.file_name().unwrap_or_default());
        let len = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
        let cut = rng.below(len);
        std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(cut)).map_err(|e| e.to_string())?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        check_store(cfg, &mut t, &format!("{name} cut to {cut} bytes"), &damaged, &want, &[&name])?;
    }
    tallies.push(t);

    // Byte flips of a trace index: answers must equal the scan's.
    tallies.push(trace_index_flips(cfg, &mut rng, &trace)?);

    // kill -9 of writers at random moments.
    tallies.push(killed_imports(cfg, &mut rng, &trace)?);
    tallies.push(killed_maintenance(cfg, &mut rng, &pristine, &trace)?);
    Ok(tallies)
}

/// Flips bytes of `trace`'s index; every query through it must equal the scan or fail clearly.
fn trace_index_flips(cfg: &FaultConfig, rng: &mut Rng, trace: &Path) -> Result<Tally, String> {
    let mut t = Tally::new("trace index byte flip");
    let dir = cfg.work.join("indexed");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let copy = dir.join("t.pcap");
    std::fs::copy(trace, &copy).map_err(|e| e.to_string())?;
    run_ok(&cfg.pcaptool, &["index", s(&copy)])?;
    let index = dir.join("t.pcap.ptidx");
    let good = std::fs::read(&index).map_err(|e| e.to_string())?;
    let out = cfg.work.join("out.pcap");
    let mut want = Vec::new();
    for f in FILTERS.iter().skip(1) {
        match ask(&cfg.pcaptool, &["query", "--scan", s(&copy), f, "-w", s(&out)], &out, &[])? {
            Outcome::Answer(b) => want.push(b),
            _ => return Err(format!("the scan does not answer `{f}`")),
        }
    }
    for _ in 0..cfg.tries {
        let mut b = good.clone();
        let at = rng.below(b.len() as u64) as usize;
        b[at] ^= 1 << rng.below(8);
        std::fs::write(&index, &b).map_err(|e| e.to_string())?;
        let (mut wrong, mut errors) = (false, false);
        for (f, w) in FILTERS.iter().skip(1).zip(&want) {
            match ask(&cfg.pcaptool, &["query", s(&copy), f, "-w", s(&out)], &out, &["t.pcap.ptidx"])? {
                Outcome::Answer(got) if got == *w => {}
                Outcome::Answer(_) => {
                    wrong = true;
                    t.defect(format!("index byte {at}: `{f}` answered wrongly with success"));
                }
                Outcome::ClearError => errors = true,
                Outcome::Wrong(why) => {
                    wrong = true;
                    t.defect(format!("index byte {at}: {why}"));
                }
            }
        }
        t.tries += 1;
        match (wrong, errors) {
            (true, _) if t.defects.last().is_some_and(|d| d.contains("crashed")) => t.crashes += 1,
            (true, _) => t.silent_wrong += 1,
            (false, true) => t.clear_errors += 1,
            (false, false) => t.correct += 1,
        }
        let v = Command::new(&cfg.pcaptool).args(["verify", s(&copy)]).output().map_err(|e| e.to_string())?;
        if crashed(&v) {
            t.crashes += 1;
        } else if !v.status.success() {
            t.verify_found += 1;
        }
    }
    Ok(t)
}

/// Records of `trace` (all its bytes after the file header), to compare a store's whole answer with a prefix.
fn trace_records(pcap: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes([pcap[at + 8], pcap[at + 9], pcap[at + 10], pcap[at + 11]]) as usize;
        v.push(&pcap[at..at + 16 + len]);
        at += 16 + len;
    }
    v
}

/// `kill -9` of an import at a random moment: the store must answer exactly for a prefix of the trace, and the
/// import run again must complete it.
fn killed_imports(cfg: &FaultConfig, rng: &mut Rng, trace: &Path) -> Result<Tally, String> {
    let mut t = Tally::new("kill -9 during import, then the import again");
    let whole = std::fs::read(trace).map_err(|e| e.to_string())?;
    let recs = trace_records(&whole);
    let out = cfg.work.join("out.pcap");
    // How long a whole import takes, so that the kills fall all along it.
    let dir = cfg.work.join("killed");
    let _ = std::fs::remove_dir_all(&dir);
    let started = Instant::now();
    run_ok(&cfg.pcaptool, &["import", s(trace), "--store", s(&dir), "--segment-size", "128K"])?;
    let span = started.elapsed().as_micros() as u64 + 1;
    for i in 0..cfg.tries {
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = Command::new(&cfg.pcaptool)
            .args(["import", s(trace), "--store", s(&dir), "--segment-size", "128K"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_micros(rng.below(span)));
        let _ = child.kill();
        let _ = child.wait();
        t.tries += 1;
        let bad = |t: &mut Tally, why: String| {
            t.defect(why);
            t.silent_wrong += 1;
        };
        if !dir.exists() {
            t.correct += 1;
            continue;
        }
        // Killed before it made any file: an empty directory is no store yet (a query says so, naming it), and
        // the import again makes one there.
        let empty = std::fs::read_dir(&dir).map_err(|e| e.to_string())?.next().is_none();
        let o = Command::new(&cfg.pcaptool)
            .args(["query", s(&dir), "", "-w", s(&out)])
            .output()
            .map_err(|e| e.to_string())?;
        let held = if empty {
            if o.status.success() || !String::from_utf8_lossy(&o.stderr).contains("is neither a flow store") {
                bad(&mut t, format!("killed import {i}: an empty directory: {}", String::from_utf8_lossy(&o.stderr)));
                continue;
            }
            0
        } else if o.status.success() {
            let got = std::fs::read(&out).unwrap_or_default();
            let got_recs = trace_records(&got);
            if got_recs.as_slice() != &recs[..got_recs.len().min(recs.len())] || got.get(..24) != whole.get(..24) {
                bad(&mut t, format!("killed import {i}: the store is not a prefix of the trace"));
                continue;
            }
            got_recs.len()
        } else if String::from_utf8_lossy(&o.stderr).contains("holds no packets") {
            0
        } else {
            bad(&mut t, format!("killed import {i}: {}", String::from_utf8_lossy(&o.stderr)));
            continue;
        };
        let o = Command::new(&cfg.pcaptool)
            .args(["import", s(trace), "--store", s(&dir), "--segment-size", "128K"])
            .output()
            .map_err(|e| e.to_string())?;
        // An import that had finished before the kill is refused when run again: nothing to add.
        let finished = held == recs.len() && String::from_utf8_lossy(&o.stderr).contains("is in the store already");
        if !o.status.success() && !finished {
            bad(
                &mut t,
                format!("killed import {i} ({held} packets held): again: {}", String::from_utf8_lossy(&o.stderr)),
            );
            continue;
        }
        let o = Command::new(&cfg.pcaptool)
            .args(["query", s(&dir), "", "-w", s(&out)])
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() || std::fs::read(&out).unwrap_or_default() != whole {
            bad(&mut t, format!("killed import {i} ({held} packets held): after the import again, not the trace"));
            continue;
        }
        t.correct += 1;
    }
    Ok(t)
}

/// `kill -9` of retention and repair at random moments: the store must then open, verify clean and answer with
/// a stretch of the trace (retention removes the oldest segments whole).
fn killed_maintenance(cfg: &FaultConfig, rng: &mut Rng, pristine: &Path, trace: &Path) -> Result<Tally, String> {
    let mut t = Tally::new("kill -9 during retention or repair");
    let whole = std::fs::read(trace).map_err(|e| e.to_string())?;
    let recs = trace_records(&whole);
    let out = cfg.work.join("out.pcap");
    let dir = cfg.work.join("maint");
    for i in 0..cfg.tries {
        copy_dir(pristine, &dir).map_err(|e| e.to_string())?;
        let size = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum::<u64>();
        let max = rng.below(size).to_string();
        let args: Vec<&str> =
            if i % 2 == 0 { vec!["retain", s(&dir), "--max-size", &max] } else { vec!["repair", s(&dir)] };
        let mut child = Command::new(&cfg.pcaptool)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        let _ = child.kill();
        let _ = child.wait();
        t.tries += 1;
        let v = Command::new(&cfg.pcaptool).args(["verify", s(&dir)]).output().map_err(|e| e.to_string())?;
        if crashed(&v) || !v.status.success() {
            t.silent_wrong += 1;
            t.defect(format!("killed `{}`: verify: {}", args.join(" "), String::from_utf8_lossy(&v.stdout)));
            continue;
        }
        let o = Command::new(&cfg.pcaptool)
            .args(["query", s(&dir), "", "-w", s(&out)])
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            if String::from_utf8_lossy(&o.stderr).contains("holds no packets") {
                t.correct += 1;
            } else {
                t.silent_wrong += 1;
                t.defect(format!("killed `{}`: query: {}", args.join(" "), String::from_utf8_lossy(&o.stderr)));
            }
            continue;
        }
        let got = std::fs::read(&out).unwrap_or_default();
        let got_recs = trace_records(&got);
        let suffix = recs.len() >= got_recs.len() && recs[recs.len() - got_recs.len()..] == got_recs[..];
        if suffix {
            t.correct += 1;
        } else {
            t.silent_wrong += 1;
            t.defect(format!("killed `{}`: the store is not the trace's newest packets", args.join(" ")));
        }
    }
    Ok(t)
}
