//! The small codecs of the segment format: LEB128 varints, sealed parts (bytes followed by their CRC-32) and a
//! bounds-checked little-endian reader.

use std::path::Path;

use crate::error::StoreError;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Appends the CRC-32 of `b` to it.
pub(crate) fn seal(b: &mut Vec<u8>) {
    let crc = crc32fast::hash(b);
    b.extend_from_slice(&crc.to_le_bytes());
}

/// Checks the CRC-32 `b` ends with; returns the bytes before it.
pub(crate) fn unseal<'a>(b: &'a [u8], path: &Path, offset: u64, what: &str) -> Result<&'a [u8], StoreError> {
    let corrupt = |why: String| StoreError::Corrupt { path: path.to_path_buf(), offset, why };
    if b.len() < 4 {
        return Err(corrupt(format!("{what}: {} bytes, too short", b.len())));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err(corrupt(format!("{what} checksum mismatch")));
    }
    Ok(body)
}

/// A bounds-checked little-endian reader.
pub(crate) struct Rd<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Rd<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("truncated")?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}
