//! One module per subcommand.

pub(crate) mod capture;
pub(crate) mod convert;
pub(crate) mod explain;
pub(crate) mod index;
pub(crate) mod info;
pub(crate) mod maintain;
pub(crate) mod query;
pub(crate) mod shell;
pub(crate) mod store;

/// Whether `a` and `b` name the same existing file (writing one would destroy the other while it is read).
pub(crate) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Exit status of a command that found damaged data (`verify`), or answered without it (`--skip-damaged`).
pub(crate) const EXIT_DAMAGED: u8 = 3;
