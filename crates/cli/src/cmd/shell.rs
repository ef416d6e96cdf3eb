//! `pcaptool shell TRACE`: loads the trace's index once and answers query after query at a prompt with line
//! editing and history (pcapWT's prompt mode).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use pcaptool_engine::{Request, Source, TraceSink, WriteOptions};
use pcaptool_query::Filter;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

/// Arguments of `pcaptool shell`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The capture to query (its index, `TRACE.ptidx`, is loaded once if it exists; see `pcaptool index`).
    trace: PathBuf,
}

const HELP: &str = "\
  FILTER              count the packets a tcpdump filter selects
  write FILE FILTER   write them to FILE, in the trace's format
  explain FILTER      how the filter is evaluated: the plan, the index's candidates, the tests
  help                this text
  quit                leave (or Ctrl-D)";

/// One line of input, understood.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    Count(&'a str),
    Write(&'a str, &'a str),
    Explain(&'a str),
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
    let trace = args.trace;
    let started = Instant::now();
    let source = Source::open(&trace)?;
    crate::sources::warn_unused_indexes(&source);
    match source.index() {
        Some(f) => eprintln!(
            "{}: index of {} packets loaded and checked in {:.3} s ({} bytes)",
            trace.display(),
            f.packets(),
            started.elapsed().as_secs_f64(),
            f.size_bytes()
        ),
        None => eprintln!("{}: no index (`pcaptool index` makes one): every query scans the trace", trace.display()),
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
        };
        let t = Instant::now();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(command("  tcp port 80 "), Ok(Command::Count("tcp port 80")));
        assert_eq!(command("write out.pcap host 10.0.0.1"), Ok(Command::Write("out.pcap", "host 10.0.0.1")));
        assert_eq!(command("explain udp"), Ok(Command::Explain("udp")));
        assert_eq!(command("quit"), Ok(Command::Quit));
        assert_eq!(command(""), Ok(Command::Nothing));
        assert!(command("write out.pcap").is_err());
        // `host quit` is a filter, not the quit command.
        assert_eq!(command("host quit"), Ok(Command::Count("host quit")));
    }
}
