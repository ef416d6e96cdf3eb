//! Errors of the store.

use std::io;
use std::path::PathBuf;

/// What went wrong with a store: every variant names the file, and damage the offset and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A trace being imported could not be read.
    #[error(transparent)]
    Trace(#[from] pcaptool_packet::TraceError),
    /// A segment file is damaged.
    #[error("{path} is damaged at byte {offset}: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What does not hold.
        why: String,
    },
    /// The input cannot go into this store.
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> StoreError {
        StoreError::Io { path: path.into(), source }
    }
}
