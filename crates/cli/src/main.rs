//! The `pcaptool` binary: argument parsing, dispatch to subcommands, and one-line error reporting.

#![forbid(unsafe_code)]

/// `println!` that hands back the write's error instead of panicking: a closed pipe then ends the command
/// quietly (see `main`), as ripgrep does.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod args;
mod cmd;
mod explain;
mod inputs;
mod listing;
mod progress;
mod sources;

use std::io;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The version, and the optional features this binary was built with.
#[cfg(all(feature = "export", feature = "xdp"))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: export, xdp)");
#[cfg(all(feature = "export", not(feature = "xdp")))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: export; without: xdp)");
#[cfg(all(not(feature = "export"), feature = "xdp"))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: xdp; without: export)");
#[cfg(all(not(feature = "export"), not(feature = "xdp")))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (without: export, xdp)");

/// Packet capture and retrieval toolkit.
#[derive(Debug, Parser)]
#[command(name = "pcaptool", version = VERSION, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise capture files: format, link types, packets, bytes, time span, protocols (like capinfos).
    Info(cmd::info::Args),
    /// Convert between pcap and pcapng, µs and ns, compressed or not; cut by snaplen or time window.
    Convert(cmd::convert::Args),
    /// Index traces (TRACE.ptidx beside each) so that queries read only the packets they need.
    Index(cmd::index::Args),
    /// Select packets with a tcpdump filter: list them (as tcpdump does), write them (-w), count them, or explain
    /// the plan.
    Query(cmd::query::Args),
    /// Load a trace's index once and answer filters at a prompt (line editing, history).
    Shell(cmd::shell::Args),
    /// Import traces into a flow store (a directory of flow-clustered segments) for fast queries.
    Import(cmd::store::ImportArgs),
    /// List a flow store's flows (conn.log-like), optionally those a filter may match.
    Flows(cmd::store::FlowsArgs),
    /// Export a flow store's (or a trace's) flows and packets as Parquet files partitioned by sensor, date and
    /// hour (for DuckDB, Spark, Trino) or into PostgreSQL; a second run exports only the segments added since.
    Export(cmd::export::Args),
    /// Capture live traffic from network interfaces into a flow store.
    Capture(cmd::capture::Args),
    /// Answer queries over HTTP (TLS, tokens, client certificates) from traces and flow stores kept loaded.
    Serve(cmd::serve::Args),
    /// Check a flow store (every segment's index, every byte of packet data against its checksum) or a trace
    /// (every record, and its index if it has one). Exit status 3 when damage is found.
    Verify(cmd::maintain::VerifyArgs),
    /// Repair a flow store: remove what an interrupted writer left and move damaged segments into its
    /// quarantine folder, so that queries answer from the rest. Takes the store's writer lock.
    Repair(cmd::maintain::RepairArgs),
    /// Remove a flow store's oldest segments whole until it takes at most --max-size. Takes the writer lock.
    Retain(cmd::maintain::RetainArgs),
    /// Recompress a flow store's segments (--compress lz4, zstd, zstd:LEVEL or none), one at a time, each atomically:
    /// queries meanwhile read either version. Takes the writer lock.
    Compact(cmd::maintain::CompactArgs),
    /// Merge traces by time into one (as mergecap): interfaces of every input, pcapng when link types differ.
    Merge(cmd::tools::MergeArgs),
    /// Split a trace by packets, bytes, time interval (as editcap -c/-i) or flow.
    Split(cmd::tools::SplitArgs),
    /// Write a trace's packets in time order (as reordercap), in bounded memory.
    Sort(cmd::tools::SortArgs),
    /// Remove duplicate packets within a window of packets or time (as editcap -d/-D/-w).
    Dedup(cmd::tools::DedupArgs),
    /// Anonymise a trace: IP addresses by Crypto-PAn (prefix-preserving, keyed), MACs, payloads cut; checksums
    /// kept as valid as they were.
    #[command(visible_alias = "anonymize")]
    Anonymise(cmd::tools::AnonArgs),
    /// Count packets and bytes per filter and per interval (as tracestats and capinfos).
    Stats(cmd::tools::StatsArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or PowerShell (e.g. `pcaptool completions
    /// bash > /etc/bash_completion.d/pcaptool`).
    Completions(cmd::docs::CompletionsArgs),
    /// Print the manual page (roff), or write one page per command into a directory (`--out DIR`).
    Man(cmd::docs::ManArgs),
}

/// The command line's definition (for completions and manual pages).
pub(crate) fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A store keeps each segment's two files open while it is open (so that retention cannot pull them away from
    // a reader): take the most open files the system allows this process, as servers do. A failure leaves the
    // usual limit, and a store too big for it says so when opened.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let result = match cli.command {
        Command::Info(a) => cmd::info::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Index(a) => cmd::index::run(a),
        Command::Query(a) => cmd::query::run(a),
        Command::Shell(a) => cmd::shell::run(a),
        Command::Import(a) => cmd::store::import(a),
        Command::Flows(a) => cmd::store::flows(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Capture(a) => cmd::capture::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Verify(a) => cmd::maintain::verify(a),
        Command::Repair(a) => cmd::maintain::repair(a),
        Command::Retain(a) => cmd::maintain::retain(a),
        Command::Compact(a) => cmd::maintain::compact(a),
        Command::Merge(a) => cmd::tools::merge(a),
        Command::Split(a) => cmd::tools::split(a),
        Command::Sort(a) => cmd::tools::sort(a),
        Command::Dedup(a) => cmd::tools::dedup(a),
        Command::Anonymise(a) => cmd::tools::anonymise(a),
        Command::Stats(a) => cmd::tools::stats(a),
        Command::Completions(a) => cmd::docs::completions(a),
        Command::Man(a) => cmd::docs::man(a),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("pcaptool: error: {}", chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// The cause chain on one line (library errors do not repeat their cause in their own message).
pub(crate) fn chain(err: &anyhow::Error) -> String {
    let causes: Vec<String> = err.chain().map(|c| c.to_string()).collect();
    chain_of(&causes)
}

/// Messages joined by ": ", a cause's leading words left out when the message before ends with them (a file's
/// name said by both: "cannot open x.pcap" then "x.pcap: No such file or directory").
pub(crate) fn chain_of(causes: &[String]) -> String {
    let mut out = String::new();
    for c in causes {
        let mut c = c.as_str();
        if !out.is_empty() {
            if out.ends_with(c) {
                continue;
            }
            if let Some((head, rest)) = c.split_once(": ")
                && out.ends_with(head)
            {
                c = rest;
            }
            out.push_str(": ");
        }
        out.push_str(c);
    }
    out
}

pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<pcaptool_packet::WriteError>().is_some_and(
                |e| matches!(e, pcaptool_packet::WriteError::Io(e) if e.kind() == io::ErrorKind::BrokenPipe),
            )
    })
}
