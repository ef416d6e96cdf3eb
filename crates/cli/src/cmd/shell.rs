//! `pcaptool shell SOURCE`: opens a trace (loading its index once), a flow store (its segments' stage 1 and flow
//! tables) or several traces, and answers query after query at a prompt with line editing and history (pcapWT's
//! prompt mode).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use pcaptool_engine::{OpenOptions, Request, Source, SourceKind, TraceSink, WriteOptions};
use pcaptool_query::Filter;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

/// Arguments of `pcaptool shell`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// What to query: a capture (its index, `TRACE.ptidx`, is loaded once if it exists; see `pcaptool index`),
    /// a flow store's directory, a directory of captures or a pattern such as `'dir/*.pcap'`.
    source: PathBuf,
}

const HELP: &str = "\
  FILTER              count the packets a tcpdump filter selects
  write FILE FILTER   write them to FILE, in the trace's format
  explain FILTER      how the filter is evaluated: the plan, the index's candidates, the tests
  list FILTER         list the first 100 packets it selects, one line each
  flows FILTER        (a store) list the flows that may hold a packet it selects
  flow ID [FILE]      (a store) count a flow's packets, or write them to FILE
  help                this text
  quit                leave (or Ctrl-D)";

/// One line of input, understood.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    Count(&'a str),
    Write(&'a str, &'a str),
    Explain(&'a str),
    List(&'a str),
    Flows(&'a str),
    Flow(u64, Option<&'a str>),
    Help,
    Quit,
    Nothing,
}

fn command(line: &str) -> Result<Command<'_>, &'static str> {
    let line = line.trim();
    let (word, rest) = line.split_once(char::is_whitespace).map_or((line, ""), |(w, r)| (w, r.trim()));
    Ok(match word {
        "" => Command::Nothing,
        "quit" | "exit" | "q" if rest.is_empty() => Command::Quit,
        "help" | "?" if rest.is_empty() => Command::Help,
        "explain" => Command::Explain(rest),
        "list" => Command::List(rest),
        "flows" => Command::Flows(rest),
        "flow" => {
            let (id, file) = rest.split_once(char::is_whitespace).map_or((rest, None), |(i, f)| (i, Some(f.trim())));
            Command::Flow(id.parse().map_err(|_| "flow needs a flow id (a number from `flows`)")?, file)
        }
        "write" | "w" => {
            let (file, filter) = rest.split_once(char::is_whitespace).ok_or("write needs a file and a filter")?;
            Command::Write(file, filter.trim())
        }
        _ => Command::Count(line),
    })
}

fn history_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("pcaptool/shell_history"))
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let source = crate::sources::open(
        std::slice::from_ref(&args.source),
        &OpenOptions::new().long_lived(true),
        &Default::default(),
    )?;
    let secs = started.elapsed().as_secs_f64();
    let name = args.source.display();
    match (source.index(), source.store()) {
        (Some(f), _) => eprintln!(
            "{name}: index of {} packets loaded and checked in {secs:.3} s ({} bytes)",
            f.packets(),
            f.size_bytes()
        ),
        (None, Some(store)) => {
            let segs = store.segments();
            let packets: u64 = segs.iter().map(|s| s.stage1.packets).sum();
            eprintln!("{name}: flow store of {} segments, {packets} packets, opened in {secs:.3} s", segs.len());
        }
        (None, None) if source.kind() == SourceKind::Merged => {
            eprintln!("{name}: several sources, answered as one merged by time")
        }
        (None, None) => {
            eprintln!("{name}: no index (`pcaptool index` makes one): every query scans the trace")
        }
    }
    eprintln!("type a tcpdump filter to count its packets, `help` for more");
    let mut rl = DefaultEditor::new().context("cannot start the line editor")?;
    let history = history_path();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    loop {
        let line = match rl.readline("pcaptool> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("cannot read the prompt"),
        };
        if !line.trim().is_empty() {
            let _ = rl.add_history_entry(line.as_str());
        }
        let t = Instant::now();
        let (filter, write, explain) = match command(&line) {
            Err(e) => {
                eprintln!("error: {e}");
                continue;
            }
            Ok(Command::Quit) => break,
            Ok(Command::Nothing) => continue,
            Ok(Command::Help) => {
                outln!("{HELP}");
                continue;
            }
            Ok(Command::Count(f)) => (f, None, false),
            Ok(Command::Write(file, f)) => (f, Some(PathBuf::from(file)), false),
            Ok(Command::Explain(f)) => (f, None, true),
            Ok(other) => {
                match store_or_list(&source, other) {
                    Ok(()) => eprintln!("({:.3} s)", t.elapsed().as_secs_f64()),
                    Err(e) => eprintln!("error: {}", crate::chain(&e)),
                }
                continue;
            }
        };
        let result = (|| -> anyhow::Result<()> {
            let req =
                Request::new().with_filter(Filter::new(filter).map_err(|e| anyhow::anyhow!("invalid filter: {e}"))?);
            if explain {
                return crate::explain::print(&source.plan(&req)?, false);
            }
            let matched = match &write {
                Some(w) => source.run(&req, &mut TraceSink::create(w, WriteOptions::new())?)?.matched,
                None => source.count(&req)?,
            };
            outln!("{matched}");
            Ok(())
        })();
        match result {
            Ok(()) if !explain => eprintln!("({:.3} s)", t.elapsed().as_secs_f64()),
            Ok(()) => {}
            Err(e) => eprintln!("error: {}", crate::chain(&e)),
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = rl.save_history(h);
    }
    Ok(ExitCode::SUCCESS)
}

/// Packets listed in the line format of `pcaptool query` without -w.
const LIST_AT_MOST: u64 = 100;

/// The commands beyond count, write and explain: listing packets, and a store's flows.
fn store_or_list(source: &Source, cmd: Command<'_>) -> anyhow::Result<()> {
    let filter = |text: &str| Filter::new(text).map_err(|e| anyhow::anyhow!("invalid filter: {e}"));
    match cmd {
        Command::List(f) => {
            let mut req = Request::new().with_filter(filter(f)?);
            req.limit = Some(LIST_AT_MOST + 1);
            let mut lines = Vec::new();
            let mut listing = crate::listing::Listing::new(&mut lines, false);
            source.run(&req, &mut listing)?;
            let text = String::from_utf8_lossy(&lines);
            for l in text.lines().take(LIST_AT_MOST as usize) {
                outln!("{l}");
            }
            if text.lines().count() as u64 > LIST_AT_MOST {
                outln!("(more: `write FILE FILTER` keeps them all)");
            }
        }
        Command::Flows(f) => {
            let mut req = Request::new();
            if !f.is_empty() {
                req = req.with_filter(filter(f)?);
            }
            for flow in source.flows(&req)? {
                outln!("{}", serde_json::to_string(&flow)?);
            }
        }
        Command::Flow(id, file) => {
            let mut req = Request::new();
            req.flow = Some(id);
            let matched = match file {
                Some(w) => {
                    source.run(&req, &mut TraceSink::create(std::path::Path::new(w), WriteOptions::new())?)?.matched
                }
                None => source.run(&req, &mut pcaptool_engine::Counter::default())?.matched,
            };
            outln!("{matched}");
        }
        Command::Count(_) | Command::Write(..) | Command::Explain(_) | Command::Help | Command::Quit => {}
        Command::Nothing => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(command("  tcp port 80 "), Ok(Command::Count("tcp port 80")));
        assert_eq!(command("write out.pcap host 10.0.0.1"), Ok(Command::Write("out.pcap", "host 10.0.0.1")));
        assert_eq!(command("explain udp"), Ok(Command::Explain("udp")));
        assert_eq!(command("quit"), Ok(Command::Quit));
        assert_eq!(command("flow 12 out.pcap"), Ok(Command::Flow(12, Some("out.pcap"))));
        assert_eq!(command("flow 12"), Ok(Command::Flow(12, None)));
        assert!(command("flow x").is_err());
        assert_eq!(command("list tcp"), Ok(Command::List("tcp")));
        assert_eq!(command("flows"), Ok(Command::Flows("")));
        assert_eq!(command(""), Ok(Command::Nothing));
        assert!(command("write out.pcap").is_err());
        // `host quit` is a filter, not the quit command.
        assert_eq!(command("host quit"), Ok(Command::Count("host quit")));
    }
}
