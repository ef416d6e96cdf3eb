//! Errors of the store.

use std::io;
use std::path::PathBuf;

fn not_a_store(dir: &std::path::Path, holds: Option<&str>) -> String {
    match holds {
        Some(f) => format!("{} is not a store directory (it holds {f}, and none of a store's files)", dir.display()),
        None => format!(
            "{} is not a store directory: create one with `pcaptool import TRACE --store {}`",
            dir.display(),
            dir.display()
        ),
    }
}

/// What went wrong with a store: every variant names the file, and damage the offset and what was expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Reading or writing a file failed.
    #[error("{}", path.display())]
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
    /// Packet data does not match its checksum: the bytes `start..end` of the data file are damaged.
    #[error(
        "{path} is damaged at bytes {start}..{end}: the packet data does not match its checksum (stored {stored:08x}, \
         computed {computed:08x})"
    )]
    DataChecksum {
        /// The segment's data file.
        path: PathBuf,
        /// The damaged block's first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The checksum the index holds.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
    /// A compressed block does not match its checksum: block `block` of the data file, its bytes `start..end`,
    /// is damaged (nothing of it is decompressed).
    #[error(
        "{path} is damaged in block {block} (bytes {start}..{end}): the compressed packet data does not match its \
         checksum (stored {stored:08x}, computed {computed:08x})"
    )]
    BlockChecksum {
        /// The segment's data file.
        path: PathBuf,
        /// The block's number in the file.
        block: u64,
        /// Its first byte in the file.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The checksum the index holds.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
    /// Another process writes the store: one writer at a time.
    #[error(
        "the store {dir} is being written by another process{}: a store takes one writer at a time; wait for it to \
         finish (or stop it)",
        holder.as_ref().map_or(String::new(), |h| format!(" ({h})"))
    )]
    Locked {
        /// The store.
        dir: PathBuf,
        /// Who holds the lock, as it wrote itself in the lock file (`None` until it has).
        holder: Option<LockHolder>,
    },
    /// The store was opened for reading and asked to change.
    #[error("the store {dir} is open for reading only: writing needs `Store::create` or `Store::open_writer`")]
    ReadOnly {
        /// The store.
        dir: PathBuf,
    },
    /// The system's limit of open files was reached (a store keeps two files open per segment).
    #[error(
        "cannot open {}: a store keeps two files open per segment while it is open: raise the limit (`ulimit -n`) or \
         keep fewer, larger segments (--segment-size)",
        path.display()
    )]
    TooManyFiles {
        /// The file that could not be opened.
        path: PathBuf,
        /// The system's error (EMFILE or ENFILE).
        source: io::Error,
    },
    /// The path exists and is not a directory.
    #[error("{} exists and is not a directory: a store is a directory (choose another --store)", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The path is not a store's directory.
    #[error("{}", not_a_store(dir, holds.as_deref()))]
    NotAStore {
        /// The path.
        dir: PathBuf,
        /// One of the files it holds, if it holds any (but none of a store's).
        holds: Option<String>,
    },
    /// A store was to be made in a directory that holds other files.
    #[error(
        "{} holds files that are not a store's (such as {first}): a store needs an empty or new directory",
        dir.display()
    )]
    ForeignDirectory {
        /// The directory.
        dir: PathBuf,
        /// One of its files.
        first: String,
    },
    /// The trace is in the store already, imported whole.
    #[error(
        "{} is in the store already ({}, imported whole): importing it again would store its packets twice; \
         --allow-duplicates imports it anyway",
        trace.display(),
        segment_list(segments)
    )]
    AlreadyImported {
        /// The trace.
        trace: PathBuf,
        /// The segments that hold it.
        segments: Vec<u32>,
    },
    /// The trace was partly imported and the rest cannot follow it.
    #[error(
        "{} was partly imported ({}) and cannot be resumed: {}; --allow-duplicates imports it whole again as new \
         packets",
        trace.display(),
        segment_list(segments),
        if *stored_after {
            "other packets were stored after it, so its remaining packets cannot take their places"
        } else {
            "the store has damaged segments that may hold more of it (`pcaptool repair` sets them aside)"
        }
    )]
    CannotResume {
        /// The trace.
        trace: PathBuf,
        /// The segments that hold its first part.
        segments: Vec<u32>,
        /// Whether other packets were stored after it (else: damaged segments may hold more of it).
        stored_after: bool,
    },
}

/// The process that holds a store's writer lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command line.
    pub command: String,
    /// When it took the lock, in nanoseconds since the epoch.
    pub since_ns: u64,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}, `{}`, since {}", self.pid, self.command, pcaptool_packet::Rfc3339(self.since_ns))
    }
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> StoreError {
        StoreError::Io { path: path.into(), source }
    }

    /// Whether this is damage found in a store's files (a checksum or structure that does not hold), as opposed
    /// to a failure to read them or a refusal.
    pub fn is_damage(&self) -> bool {
        matches!(self, StoreError::Corrupt { .. } | StoreError::DataChecksum { .. } | StoreError::BlockChecksum { .. })
    }
}

/// "segment 3" or "segments 3-5, 8".
fn segment_list(numbers: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let mut j = i;
        while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { numbers[i].to_string() } else { format!("{}-{}", numbers[i], numbers[j]) });
        i = j + 1;
    }
    format!("{} {}", if numbers.len() == 1 { "segment" } else { "segments" }, parts.join(", "))
}
