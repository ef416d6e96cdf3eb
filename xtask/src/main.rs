//! `cargo xtask`: project automation. Subcommands: `gen` (deterministic trace), `demo` (the README's example),
//! `bench` (pcaptool beside tcpdump on a generated trace).

#![forbid(unsafe_code)]

mod bench;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use xtask::tracegen::{GenOptions, generate};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  gen OUT [--packets N] [--size BYTES[K|M|G]] [--seed S] [--clients N] [--servers N]
                  write a deterministic Ethernet trace (pcap, ns) to OUT
  demo            generate a small trace in example/ and run `pcaptool info` on it
  bench [--size BYTES[K|M|G]] [--keep]
                  side-by-side benchmark of pcaptool and tcpdump on a generated trace";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("gen") => gen_cmd(&args[1..]),
        Some("demo") => demo(),
        Some("bench") => bench::run(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            bail!("unknown or missing command")
        }
    }
}

/// Parses "3G", "500M", "64K" or a plain number of bytes.
pub(crate) fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num.parse::<u64>().with_context(|| format!("bad size {s:?}"))? * mul)
}

pub(crate) fn gen_options(args: &[String]) -> anyhow::Result<(Option<PathBuf>, GenOptions)> {
    let mut opt = GenOptions::default();
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--packets" => opt.packets = val()?.parse()?,
            "--size" => {
                opt.max_bytes = parse_size(val()?)?;
                if opt.packets == GenOptions::default().packets {
                    opt.packets = u64::MAX;
                }
            }
            "--seed" => opt.seed = val()?.parse()?,
            "--clients" => opt.clients = val()?.parse()?,
            "--servers" => opt.servers = val()?.parse()?,
            s if !s.starts_with('-') && out.is_none() => out = Some(PathBuf::from(s)),
            s => bail!("unknown argument {s:?}\n{USAGE}"),
        }
    }
    Ok((out, opt))
}

fn gen_cmd(args: &[String]) -> anyhow::Result<()> {
    let (out, opt) = gen_options(args)?;
    let out = out.context("gen needs an output file")?;
    let stats = gen_file(&out, &opt)?;
    eprintln!(
        "wrote {}: {} packets, {} bytes, {} flows (seed {})",
        out.display(),
        stats.packets,
        stats.bytes,
        stats.flows,
        opt.seed
    );
    Ok(())
}

pub(crate) fn gen_file(out: &Path, opt: &GenOptions) -> anyhow::Result<xtask::tracegen::GenStats> {
    let f = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let (_, stats) = generate(BufWriter::with_capacity(1 << 20, f), opt)?;
    Ok(stats)
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent").to_path_buf()
}

/// Builds the release binary and returns its path.
pub(crate) fn build_pcaptool() -> anyhow::Result<PathBuf> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "pcaptool"])
        .current_dir(root())
        .status()?;
    if !status.success() {
        bail!("cargo build --release -p pcaptool failed");
    }
    Ok(root().join("target/release/pcaptool"))
}

fn demo() -> anyhow::Result<()> {
    let dir = root().join("example");
    std::fs::create_dir_all(&dir)?;
    let trace = dir.join("example.pcap");
    let opt = GenOptions { packets: 20_000, ..GenOptions::default() };
    let stats = gen_file(&trace, &opt)?;
    eprintln!("generated {} ({} packets, {} flows)", trace.display(), stats.packets, stats.flows);
    let bin = build_pcaptool()?;
    let ng = dir.join("example.pcapng.zst");
    run(Command::new(&bin).arg("convert").arg(&trace).arg(&ng))?;
    eprintln!("converted it to {} (pcapng, zstd); `pcaptool info` on it:\n", ng.display());
    run(Command::new(&bin).arg("info").arg(&ng))?;
    Ok(())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
