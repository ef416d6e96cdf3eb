//! Errors of building, loading and using an index.

use std::io;
use std::path::PathBuf;

/// What went wrong with an index. Every variant names the file and, for damage, the offset and what was
/// expected, so that a message tells the user what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// Reading or writing a file failed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] pcaptool_packet::TraceError),
    /// The file is an index of another format version.
    #[error(
        "{path} is an index of format version {found}, this pcaptool reads versions {} to {}; rebuild it with `pcaptool index`",
        crate::OLDEST_READ,
        crate::VERSION
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it has.
        found: u16,
    },
    /// The file is not an index.
    #[error("{path} is not a pcaptool index ({why})")]
    NotIndex {
        /// The file.
        path: PathBuf,
        /// What was found.
        why: String,
    },
    /// The index is damaged: a checksum or a structure does not hold.
    #[error("{path} is damaged at byte {offset}: {why}; rebuild it with `pcaptool index`")]
    Corrupt {
        /// The index file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What does not hold.
        why: String,
    },
    /// The index describes another trace, or this trace before it changed.
    #[error("{index} does not describe {trace} as it is now ({why}); rebuild it with `pcaptool index {trace}`")]
    Stale {
        /// The index file.
        index: PathBuf,
        /// The trace.
        trace: PathBuf,
        /// What differs.
        why: String,
    },
}

impl IndexError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> IndexError {
        IndexError::Io { path: path.into(), source }
    }
}
