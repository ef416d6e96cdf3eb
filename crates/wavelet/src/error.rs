//! Errors of loading serialized structures: each names what was expected and where.

/// Why bytes could not be loaded as a structure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bytes end before the structure does.
    #[error("truncated: {what} needs {needed} bytes at offset {offset}, {available} present")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Byte offset in the input.
        offset: usize,
        /// Bytes needed.
        needed: usize,
        /// Bytes present from `offset`.
        available: usize,
    },
    /// The magic is not `PTWV`.
    #[error("not a pcaptool wavelet file: magic {found:02x?}, expected \"PTWV\"")]
    Magic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// An unsupported format version.
    #[error("unsupported wavelet format version {found}, expected {expected}")]
    Version {
        /// Version in the file.
        found: u16,
        /// Version this library writes and reads.
        expected: u16,
    },
    /// The structure in the bytes is of another kind than the one requested.
    #[error("wrong structure kind: found {found}, expected {expected}")]
    Kind {
        /// Kind code found.
        found: u64,
        /// Kind code expected.
        expected: u64,
    },
    /// The checksum does not match the contents.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (corrupt data)")]
    Checksum {
        /// CRC-32 in the file.
        stored: u32,
        /// CRC-32 of the contents.
        computed: u32,
    },
    /// A field holds a value that contradicts the rest of the structure.
    #[error("invalid {what} at offset {offset}: {why}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// Byte offset of the field (or of the structure it belongs to).
        offset: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// Bytes remain after the structure.
    #[error("{extra} unexpected bytes after the structure at offset {offset}")]
    Trailing {
        /// Offset where the structure ended.
        offset: usize,
        /// Bytes left over.
        extra: usize,
    },
}
