//! One module per subcommand.

pub(crate) mod capture;
pub(crate) mod convert;
pub(crate) mod docs;
#[cfg(not(feature = "export"))]
#[path = "export_off.rs"]
pub(crate) mod export;
#[cfg(feature = "export")]
#[path = "export_on.rs"]
pub(crate) mod export;
pub(crate) mod index;
pub(crate) mod info;
pub(crate) mod maintain;
pub(crate) mod query;
pub(crate) mod serve;
pub(crate) mod shell;
pub(crate) mod store;
pub(crate) mod tools;

/// Whether `a` and `b` name the same existing file (writing one would destroy the other while it is read).
pub(crate) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Exit status of a command that found damaged data (`verify`), or answered without it (`--skip-damaged`).
pub(crate) const EXIT_DAMAGED: u8 = 3;

/// A write error that says "cannot write the output" (said deep inside, where the file's name is not known), with
/// the output's name instead; other errors, and a closed pipe (which ends the command quietly), as they are.
pub(crate) fn name_output(e: anyhow::Error, out: Option<String>) -> anyhow::Error {
    let Some(name) = out else { return e };
    if crate::is_broken_pipe(&e) {
        return e;
    }
    let causes: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    match causes.iter().position(|c| c == "cannot write the output") {
        Some(at) => anyhow::anyhow!("cannot write {name}: {}", crate::chain_of(&causes[at + 1..])),
        None => e,
    }
}

/// Warns of the damaged segments a read left out; the exit status that says so.
pub(crate) fn warn_skipped(
    dir: &std::path::Path,
    skipped: &[pcaptool_flowstore::DamagedSegment],
) -> std::process::ExitCode {
    for d in skipped {
        eprintln!("pcaptool: warning: left out segment {}: {d}", d.number);
    }
    if skipped.is_empty() {
        return std::process::ExitCode::SUCCESS;
    }
    eprintln!(
        "pcaptool: warning: the answer is from the undamaged segments only ({} left out): `pcaptool repair {}` sets \
         damaged segments aside",
        skipped.len(),
        dir.display()
    );
    std::process::ExitCode::from(EXIT_DAMAGED)
}
