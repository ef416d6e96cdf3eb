//! The binary container (docs/format/wavelet.md): a 16-byte header, a body of little-endian `u64` words, and a
//! CRC-32 trailer. [`Writer`] streams a structure out; [`Reader`] walks the body of a loaded file without copying.

use std::io::{self, Write};

use crate::error::Error;
use crate::words::LeBytes;

/// File magic.
pub const MAGIC: [u8; 4] = *b"PTWV";
/// Format version written and read by this library.
pub const VERSION: u16 = 1;

/// Structure kinds, the `kind` field of the header and of nested structures.
pub(crate) mod kind {
    pub const RS_BIT_VECTOR: u64 = 1;
    pub const RRR_BIT_VECTOR: u64 = 2;
    pub const HUFFMAN_WT: u64 = 3;
    pub const WAVELET_MATRIX: u64 = 4;
    /// An `RsBitVector` written without its directories (the loader rebuilds them).
    pub const RS_BIT_VECTOR_BARE: u64 = 5;
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), computed by `crc32fast` (carry-less multiplication
/// where the CPU has it: checking a large index costs milliseconds, not tenths of a second).
#[derive(Clone, Debug)]
pub struct Crc32(crc32fast::Hasher);

impl Crc32 {
    /// A fresh checksum.
    pub fn new() -> Crc32 {
        Crc32(crc32fast::Hasher::new())
    }
    /// Adds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The checksum of everything added.
    pub fn finish(&self) -> u32 {
        self.0.clone().finalize()
    }
}

impl Default for Crc32 {
    fn default() -> Crc32 {
        Crc32::new()
    }
}

/// Streams a structure into a writer: header, body words, trailer with the CRC-32 of header and body.
#[derive(Debug)]
#[doc(hidden)]
pub struct Writer<W: Write> {
    w: W,
    crc: Crc32,
    written: u64,
    expected: u64,
}

impl<W: Write> Writer<W> {
    /// Writes the header of a structure of `kind` whose body is `body_words` words.
    pub(crate) fn new(mut w: W, kind: u64, body_words: u64) -> io::Result<Writer<W>> {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
        h[8..16].copy_from_slice(&(body_words * 8).to_le_bytes());
        let mut crc = Crc32::new();
        crc.update(&h);
        w.write_all(&h)?;
        Ok(Writer { w, crc, written: 0, expected: body_words })
    }

    /// Appends one word.
    pub(crate) fn word(&mut self, v: u64) -> io::Result<()> {
        let b = v.to_le_bytes();
        self.crc.update(&b);
        self.written += 1;
        self.w.write_all(&b)
    }

    /// Appends an array: its length in words, then the words.
    pub(crate) fn array(&mut self, words: impl Iterator<Item = u64>, len: usize) -> io::Result<()> {
        self.word(len as u64)?;
        let mut buf = Vec::with_capacity(8 * len.min(8192));
        let mut n = 0;
        for v in words {
            buf.extend_from_slice(&v.to_le_bytes());
            n += 1;
            if buf.len() >= 65536 {
                self.crc.update(&buf);
                self.w.write_all(&buf)?;
                buf.clear();
            }
        }
        assert_eq!(n, len, "array length announced and written differ");
        self.crc.update(&buf);
        self.w.write_all(&buf)?;
        self.written += len as u64;
        Ok(())
    }

    /// Writes the trailer and returns the inner writer.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        assert_eq!(self.written, self.expected, "body size announced and written differ");
        let mut t = [0u8; 8];
        t[0..4].copy_from_slice(&self.crc.finish().to_le_bytes());
        self.w.write_all(&t)?;
        Ok(self.w)
    }
}

/// Walks the body of a loaded structure.
#[derive(Debug)]
#[doc(hidden)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    /// Checks header, size and checksum of a whole file holding a structure of `expected_kind`.
    pub(crate) fn open(bytes: &'a [u8], expected_kind: u64) -> Result<Reader<'a>, Error> {
        Reader::open_any(bytes, &[expected_kind]).map(|(r, _)| r)
    }

    /// Checks header, size and checksum of a whole file holding a structure of one of `kinds` (the first is the one
    /// an error names); returns the reader and the file's kind.
    pub(crate) fn open_any(bytes: &'a [u8], kinds: &[u64]) -> Result<(Reader<'a>, u64), Error> {
        if bytes.len() < 24 {
            return Err(Error::Truncated { what: "header and trailer", offset: 0, needed: 24, available: bytes.len() });
        }
        let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(Error::Magic { found: magic });
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(Error::Version { found: version, expected: VERSION });
        }
        let kind = u64::from(u16::from_le_bytes([bytes[6], bytes[7]]));
        if !kinds.contains(&kind) {
            return Err(Error::Kind { found: kind, expected: kinds[0] });
        }
        let body_len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        if body_len % 8 != 0 {
            return Err(Error::Invalid { what: "body length", offset: 8, why: "not a multiple of 8" });
        }
        let available = bytes.len() - 24;
        if body_len > available as u64 {
            return Err(Error::Truncated { what: "body", offset: 16, needed: body_len as usize, available });
        }
        let body_len = body_len as usize;
        let end = 16 + body_len;
        if bytes.len() > end + 8 {
            return Err(Error::Trailing { offset: end + 8, extra: bytes.len() - end - 8 });
        }
        if bytes[end + 4..end + 8] != [0; 4] {
            return Err(Error::Invalid { what: "trailer padding", offset: end + 4, why: "not zero" });
        }
        let stored = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes"));
        let mut crc = Crc32::new();
        crc.update(&bytes[..end]);
        let computed = crc.finish();
        if stored != computed {
            return Err(Error::Checksum { stored, computed });
        }
        Ok((Reader { bytes, pos: 16, end }, kind))
    }

    pub(crate) fn offset(&self) -> usize {
        self.pos
    }

    pub(crate) fn word(&mut self, what: &'static str) -> Result<u64, Error> {
        if self.end - self.pos < 8 {
            return Err(Error::Truncated { what, offset: self.pos, needed: 8, available: self.end - self.pos });
        }
        let v = u64::from_le_bytes(self.bytes[self.pos..self.pos + 8].try_into().expect("8 bytes"));
        self.pos += 8;
        Ok(v)
    }

    /// A word that must fit in `usize` and be at most `max`.
    pub(crate) fn count(&mut self, what: &'static str, max: u64) -> Result<usize, Error> {
        let at = self.pos;
        let v = self.word(what)?;
        if v > max {
            return Err(Error::Invalid { what, offset: at, why: "value too large" });
        }
        usize::try_from(v).map_err(|_| Error::Invalid { what, offset: at, why: "value too large" })
    }

    /// An array written by [`Writer::array`], borrowed.
    pub(crate) fn array(&mut self, what: &'static str) -> Result<LeBytes<'a>, Error> {
        let at = self.pos;
        let len = self.word(what)?;
        let room = (self.end - self.pos) / 8;
        if len > room as u64 {
            return Err(Error::Truncated {
                what,
                offset: at,
                needed: len.saturating_mul(8).saturating_add(8) as usize,
                available: 8 + room * 8,
            });
        }
        let bytes = len as usize * 8;
        let slice = &self.bytes[self.pos..self.pos + bytes];
        self.pos += bytes;
        Ok(LeBytes::new(slice))
    }

    /// Checks the body was consumed exactly.
    pub(crate) fn finish(self) -> Result<(), Error> {
        if self.pos != self.end {
            return Err(Error::Trailing { offset: self.pos, extra: self.end - self.pos });
        }
        Ok(())
    }
}

/// A structure that can be written in the container format.
pub trait Encode {
    /// Number of body words `encode_body` writes.
    #[doc(hidden)]
    fn body_words(&self) -> u64;
    /// Writes the body.
    #[doc(hidden)]
    fn encode_body<W: Write>(&self, w: &mut Writer<W>) -> io::Result<()>;
    /// The kind code of the header.
    #[doc(hidden)]
    fn kind(&self) -> u64;

    /// Streams the whole file (header, body, checksum) into `w` and returns it.
    fn write_to<W: Write>(&self, w: W) -> io::Result<W> {
        let mut wr = Writer::new(w, self.kind(), self.body_words())?;
        self.encode_body(&mut wr)?;
        wr.finish()
    }

    /// The whole file as bytes.
    fn to_bytes(&self) -> Vec<u8> {
        self.write_to(Vec::new()).expect("writing to a Vec cannot fail")
    }
}

/// Array of `n` words costs `n + 1` body words (its length first).
pub(crate) fn array_words(n: usize) -> u64 {
    n as u64 + 1
}

/// A bit vector that can be nested in another structure's body (wavelet trees are generic over it).
pub trait BitVectorCodec {
    /// Kind code written before the nested body.
    #[doc(hidden)]
    fn kind(&self) -> u64;
    /// Words of the nested body.
    #[doc(hidden)]
    fn encoded_words(&self) -> u64;
    /// Writes the nested body.
    #[doc(hidden)]
    fn encode_into<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()>;
}

/// A bit vector is written as a file of its own kind, with its nested body as the file's body.
impl<T: BitVectorCodec> Encode for T {
    fn body_words(&self) -> u64 {
        self.encoded_words()
    }
    fn encode_body<O: Write>(&self, w: &mut Writer<O>) -> io::Result<()> {
        self.encode_into(w)
    }
    fn kind(&self) -> u64 {
        BitVectorCodec::kind(self)
    }
}

/// A borrowed bit vector that can be read back, validated, from a nested body.
pub trait DecodeBitVector<'a>: Sized {
    /// Kind codes accepted before the nested body (an error names the first).
    #[doc(hidden)]
    const KINDS: &'static [u64];
    /// Reads and validates the nested body of `kind` (one of [`KINDS`](Self::KINDS)).
    #[doc(hidden)]
    fn decode_nested(r: &mut Reader<'a>, kind: u64) -> Result<Self, Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        let mut c = Crc32::new();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xcbf4_3926);
    }
}
