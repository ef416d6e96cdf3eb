//! Errors of the trace readers and writers: each names the file, the byte offset and what was wrong.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What went wrong while reading a trace, without the location (see [`TraceError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operating system reported an error.
    #[error("I/O error")]
    Io(#[from] io::Error),
    /// The file could not be opened (or its size read, or it mapped).
    #[error("cannot open it")]
    Open(#[source] io::Error),
    /// The first bytes are neither a pcap, a pcapng nor a supported compressed-stream magic.
    #[error(
        "not a capture file: first bytes are {found:02x?}, expected a pcap magic (a1b2c3d4, a1b23c4d, a1b2cd34 in either byte order), \
         the pcapng magic 0a0d0d0a, or gzip/zstd/lz4 compression{}",
        if found.as_slice() == b"PTDD" {
            " (PTDD: a deduplicated segment of a pcaptool store, decompressed: `pcaptool convert` its compressed \
             file beside its index, or query the store)"
        } else {
            ""
        }
    )]
    UnknownMagic {
        /// The bytes found (up to four).
        found: Vec<u8>,
    },
    /// The input ended inside a structure.
    #[error("file ends inside {what}: {needed} bytes needed, {available} present")]
    Truncated {
        /// The structure that was cut ("the file header", "a record header", "packet data", ...).
        what: &'static str,
        /// Bytes the structure needs.
        needed: u64,
        /// Bytes the input still had.
        available: u64,
    },
    /// A record's captured length is larger than any capture can hold.
    #[error("captured length {caplen} is larger than the maximum of {limit} bytes (a corrupt record or garbage)")]
    CapLenTooLarge {
        /// The captured length in the record header.
        caplen: u32,
        /// The largest length accepted.
        limit: u32,
    },
    /// A legacy pcap file header with a major version other than 2.
    #[error("unsupported pcap version {major}.{minor}, expected 2.x")]
    PcapVersion {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// A pcapng block whose length field is impossible.
    #[error("pcapng block of type {block_type:#010x} has an invalid length {length} ({why})")]
    BlockLength {
        /// The block type.
        block_type: u32,
        /// The total length field.
        length: u32,
        /// Why it is invalid.
        why: &'static str,
    },
    /// The trailing length of a pcapng block differs from the leading one.
    #[error(
        "pcapng block of type {block_type:#010x}: trailing length {trailing} differs from leading length {leading}"
    )]
    TrailingLength {
        /// The block type.
        block_type: u32,
        /// Length at the start of the block.
        leading: u32,
        /// Length at the end of the block.
        trailing: u32,
    },
    /// A pcapng section header whose byte-order magic is not 1a2b3c4d in either order.
    #[error("pcapng section header has byte-order magic {found:#010x}, expected 0x1a2b3c4d")]
    ByteOrderMagic {
        /// The value found.
        found: u32,
    },
    /// A pcapng section of an unsupported major version.
    #[error("unsupported pcapng version {major}.{minor}, expected 1.x")]
    PcapNgVersion {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// The first pcapng block is not a section header.
    #[error("pcapng data before the first section header block")]
    NoSection,
    /// A packet block refers to an interface that no interface description block declared.
    #[error("packet refers to interface {id}, but the section declares only {declared}")]
    UnknownInterface {
        /// The interface id in the packet block.
        id: u32,
        /// Interfaces declared so far in this section.
        declared: u32,
    },
    /// A packet block's captured length does not fit in the block.
    #[error("packet block claims {caplen} captured bytes but its body holds {room}")]
    CapLenBeyondBlock {
        /// Captured length in the block.
        caplen: u32,
        /// Bytes available in the block body.
        room: u32,
    },
    /// A [`Seeker`](crate::Seeker) was given an offset that holds no file header, section header or interface
    /// description (the file is not the one the offsets were taken from).
    #[error("no file structure (file header, section header or interface description) at this offset")]
    NotStructure,
    /// A [`Seeker`](crate::Seeker) found a block that is not a packet where a packet record was expected.
    #[error("no packet record at this offset")]
    NotRecord,
    /// The decompressor rejected the input.
    #[error("{codec} decompression failed")]
    Decompress {
        /// "gzip", "zstd" or "lz4".
        codec: &'static str,
        /// The decompressor's error.
        source: io::Error,
    },
}

/// An error while reading a trace: the file, the byte offset and the [`ErrorKind`].
///
/// The offset counts bytes of the (decompressed) capture stream from its start, so it is the same offset that
/// [`Record::offset`](crate::Record::offset) reports for records.
#[derive(Debug)]
pub struct TraceError {
    /// The file, or `None` for a stream without a name.
    pub path: Option<PathBuf>,
    /// Byte offset in the capture stream where the problem was found.
    pub offset: u64,
    /// What was wrong.
    pub kind: ErrorKind,
}

impl TraceError {
    pub(crate) fn new(path: Option<PathBuf>, offset: u64, kind: ErrorKind) -> TraceError {
        TraceError { path, offset, kind }
    }

    /// An I/O error while opening or reading `path`.
    pub(crate) fn io(path: Option<PathBuf>, offset: u64, err: io::Error) -> TraceError {
        TraceError::new(path, offset, ErrorKind::Io(err))
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}", p.display())?,
            None => f.write_str("<stdin>")?,
        }
        match &self.kind {
            // The cause (the operating system's words) follows as the source: "x.pcap: No such file or directory".
            ErrorKind::Open(_) => Ok(()),
            kind => write!(f, ": at byte {}: {kind}", self.offset),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) | ErrorKind::Open(e) => Some(e),
            ErrorKind::Decompress { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// An error while writing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The operating system reported an error.
    #[error("I/O error while writing")]
    Io(#[from] io::Error),
    /// A legacy pcap file holds one link type; the record has another.
    #[error("pcap files hold one link type: the file has {file}, this packet has {packet}; write pcapng to keep both")]
    LinkTypeMismatch {
        /// The link type in the file header.
        file: crate::LinkType,
        /// The link type of the record.
        packet: crate::LinkType,
    },
    /// Legacy pcap stores seconds in 32 bits: instants from 2106-02-07T06:28:16Z on cannot be written.
    #[error("timestamp {} is past 2106-02-07T06:28:15Z, the last second pcap can hold; write pcapng to keep it", crate::Rfc3339(*ts_ns))]
    TimestampOutOfRange {
        /// The timestamp in nanoseconds since the epoch.
        ts_ns: u64,
    },
    /// A record longer than the format allows.
    #[error("packet of {len} bytes is too large for the format")]
    PacketTooLarge {
        /// The captured length.
        len: usize,
    },
}

/// An error and its causes on one line, each joined to the next by ": " (errors here do not repeat their cause
/// in their own message; this prints both, as a command line wants).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}
