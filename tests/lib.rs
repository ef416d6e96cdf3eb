//! Helpers shared by the integration tests, the benchmarks and `cargo xtask`: finding the corpus, the external
//! tools and the `pcaptool` binary; the deterministic trace generator; network namespaces for capture tests; the
//! fault injector.
//!
//! Tests that need `../shared/corpus` or an external tool (tcpdump, capinfos, tshark) say so and skip when it is
//! absent on a developer's machine; under CI (`CI=true`) a missing tool or corpus is a failure instead, so that a
//! broken set-up cannot pass silently.

#![deny(unsafe_code)]

#[path = "support/faults.rs"]
pub mod faults;
pub mod fuzz;
#[path = "support/http.rs"]
pub mod http;
pub mod libpcap;
#[path = "support/netns.rs"]
pub mod netns;
#[path = "support/realtrace.rs"]
pub mod realtrace;
#[path = "support/tracegen.rs"]
pub mod tracegen;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Skips (returns `None`) with a message, or fails under CI.
fn missing(what: &str) -> Option<PathBuf> {
    if in_ci() {
        panic!("{what} is required under CI but missing");
    }
    eprintln!("SKIPPED: {what} is missing; this test needs it (CI has it)");
    None
}

/// `../shared/corpus`, the real captures from public projects, or `None` (with a message) when absent.
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = repo_root().join("../shared/corpus");
    if dir.join("CATALOGUE.tsv").is_file() {
        Some(dir.canonicalize().unwrap_or(dir))
    } else {
        missing("the shared capture corpus ../shared/corpus")
    }
}

/// The path of an external tool on `PATH`, or `None` (with a message) when it is not installed.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    missing(&format!("the external tool `{name}`"))
}

/// The `pcaptool` binary of this build profile, brought up to date once per test process (`cargo build` is a quick
/// no-op when `cargo test --workspace` has just built it; with `cargo test -p pcaptool-tests` it would be stale).
pub fn pcaptool_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_pcaptool).clone()
}

fn build_pcaptool() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
    let bin = profile_dir.join(format!("pcaptool{}", std::env::consts::EXE_SUFFIX));
    {
        let profile = profile_dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
        let profile = if profile == "debug" { "dev" } else { profile };
        // PCAPTOOL_FEATURES: cargo features to build the binary with (CI builds `xdp` for the capture tests).
        let features = std::env::var("PCAPTOOL_FEATURES").unwrap_or_default();
        let mut args = vec!["build", "--quiet", "-p", "pcaptool", "--bin", "pcaptool", "--profile", profile];
        if !features.is_empty() {
            args.extend(["--features", features.as_str()]);
        }
        let status =
            Command::new(env!("CARGO")).args(&args).current_dir(repo_root()).status().expect("run cargo build");
        assert!(status.success(), "cargo build -p pcaptool failed");
    }
    bin
}

/// Whether the binary is built with cargo feature `f` (listed in `PCAPTOOL_FEATURES`).
pub fn built_with(f: &str) -> bool {
    std::env::var("PCAPTOOL_FEATURES").is_ok_and(|v| v.split([',', ' ']).any(|x| x == f))
}

/// Every file listed in the corpus catalogue, relative to the corpus directory.
pub fn corpus_files(corpus: &Path) -> Vec<String> {
    let cat = std::fs::read_to_string(corpus.join("CATALOGUE.tsv")).expect("read CATALOGUE.tsv");
    cat.lines().skip(1).filter_map(|l| l.split('\t').next()).filter(|p| !p.is_empty()).map(String::from).collect()
}

/// A fresh temporary directory under the target directory, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `target/tmp/<name>-<pid>-<n>`.
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = repo_root().join("target/tmp").join(format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// A path inside the directory.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The filters of the shared table (tests/filters.txt), comments and blank lines left out.
pub fn filter_table() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join("tests/filters.txt")).expect("read tests/filters.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// Timestamp in µs (tcpdump writes µs), wire length and bytes of every record of a trace, to compare outputs
/// whose containers or precisions differ.
pub fn records_us(path: &Path) -> Vec<(u64, u32, Vec<u8>)> {
    let mut r = pcaptool_packet::TraceReader::open(path).unwrap();
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        v.push((rec.ts_ns / 1000, rec.wirelen, rec.data.to_vec()));
    }
    v
}

/// The records (as [`records_us`]) tcpdump writes for `filter` on `trace` into `out`, if it reads the whole trace
/// (not when it fails or reports a truncated file).
pub fn tcpdump_records(tcpdump: &Path, trace: &Path, filter: &str, out: &Path) -> Option<Vec<(u64, u32, Vec<u8>)>> {
    let o = Command::new(tcpdump).arg("-r").arg(trace).arg("-w").arg(out).arg(filter).output().ok()?;
    (o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("truncated")).then(|| records_us(out))
}

/// Runs the `pcaptool` binary with `args` and waits for it.
pub fn pcaptool(args: &[&str]) -> Output {
    Command::new(pcaptool_bin()).args(args).output().expect("run pcaptool")
}

/// `path` as an argument of the binary (the tests' paths are UTF-8).
pub fn path_arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// What a run printed on its standard error.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes a generated trace of `packets` packets from `seed` ([`tracegen`]) as `name` in `dir`; its path.
pub fn generated_trace(dir: impl AsRef<Path>, name: &str, packets: u64, seed: u64) -> PathBuf {
    let path = dir.as_ref().join(name);
    let opt = tracegen::GenOptions { packets, seed, ..tracegen::GenOptions::default() };
    let (bytes, _) = tracegen::generate(Vec::new(), &opt).expect("generate a trace");
    std::fs::write(&path, bytes).expect("write the generated trace");
    path
}
