//! The writer of a segment's files: an aligned staging buffer written with `O_DIRECT` where the file system takes
//! it, and the data file's block checksums computed on the way (see [`crate::sums`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::sums::push_sums;

/// Writes a segment's data file through an aligned staging buffer, with `O_DIRECT` where the file system takes
/// it: the data then goes from the buffer to the disk without a copy into the page cache, which costs more CPU
/// than everything else a packet needs (n2disk writes so too). Elsewhere (tmpfs, other systems) it writes
/// through the page cache. The last block is padded for the direct write and the file cut to its length.
pub(crate) struct DataOut {
    file: File,
    path: PathBuf,
    direct: bool,
    stage: Vec<u8>,
    /// Where the aligned window of `stage` starts.
    start: usize,
    /// Bytes in the window.
    fill: usize,
    /// Bytes written to the file before the window.
    written: u64,
    /// The checksums of the blocks written so far, if asked for.
    sums: Option<Vec<u32>>,
}

/// Alignment of direct writes: a page, a multiple of every disk's logical block size.
const DIRECT_ALIGN: usize = 4096;
/// Size of each write.
const DIRECT_CHUNK: usize = 1 << 20;
// Windows start at multiples of the checksum block, so each window's checksums are its own.
const _: () = assert!(DIRECT_CHUNK.is_multiple_of(crate::sums::BLOCK));

impl DataOut {
    /// Creates `path`, staging its bytes in `stage` (grown to a window and its alignment if it is smaller: a
    /// buffer from an earlier [`finish`](Self::finish) is reused as it is).
    pub(crate) fn create(path: &Path, stage: Vec<u8>) -> std::io::Result<DataOut> {
        DataOut::create_trying(path, true, stage)
    }

    /// Computes the checksum of each block of the file as it is written (into `sums`, emptied first; its memory
    /// is reused), for [`finish`](Self::finish) to return.
    pub(crate) fn with_sums(mut self, mut sums: Vec<u32>) -> DataOut {
        sums.clear();
        self.sums = Some(sums);
        self
    }

    /// [`create`](Self::create), trying `O_DIRECT` or not.
    pub(crate) fn create_trying(path: &Path, try_direct: bool, mut stage: Vec<u8>) -> std::io::Result<DataOut> {
        let (file, direct) = match try_direct.then(|| open_direct(path)).flatten() {
            Some(f) => (f, true),
            None => (File::create(path)?, false),
        };
        if stage.len() < DIRECT_CHUNK + DIRECT_ALIGN {
            stage = vec![0u8; DIRECT_CHUNK + DIRECT_ALIGN];
        }
        let start = stage.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        Ok(DataOut { file, path: path.to_path_buf(), direct, stage, start, fill: 0, written: 0, sums: None })
    }

    #[inline]
    pub(crate) fn put(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(DIRECT_CHUNK - self.fill);
            let at = self.start + self.fill;
            self.stage[at..at + n].copy_from_slice(&bytes[..n]);
            self.fill += n;
            bytes = &bytes[n..];
            if self.fill == DIRECT_CHUNK {
                self.sum_window(DIRECT_CHUNK);
                self.write_window(DIRECT_CHUNK)?;
                self.written += DIRECT_CHUNK as u64;
                self.fill = 0;
            }
        }
        Ok(())
    }

    /// Writes the window's first `len` bytes at `written`; a direct write the file system refuses is done
    /// again through the page cache, and so is the rest of the file.
    fn write_window(&mut self, len: usize) -> std::io::Result<()> {
        let window = &self.stage[self.start..self.start + len];
        if self.direct {
            match self.file.write_all_at(window, self.written) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.file = std::fs::OpenOptions::new().write(true).open(&self.path)?;
                    self.direct = false;
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(window, self.written)
    }

    /// Adds the checksums of the window's first `len` bytes (the window starts at a multiple of the checksum
    /// block, since [`DIRECT_CHUNK`] is one).
    fn sum_window(&mut self, len: usize) {
        if let Some(sums) = &mut self.sums {
            push_sums(sums, &self.stage[self.start..self.start + len]);
        }
    }

    /// Writes what is left, cuts the file to its length and syncs it; returns the staging buffer and the
    /// checksums (if asked for).
    pub(crate) fn finish(mut self) -> std::io::Result<(Vec<u8>, Option<Vec<u32>>)> {
        let len = self.written + self.fill as u64;
        self.sum_window(self.fill);
        if self.fill > 0 {
            if self.direct {
                let padded = self.fill.next_multiple_of(DIRECT_ALIGN);
                self.stage[self.start + self.fill..self.start + padded].fill(0);
                self.write_window(padded)?;
            } else {
                self.write_window(self.fill)?;
            }
        }
        self.file.set_len(len)?;
        self.file.sync_all()?;
        Ok((self.stage, self.sums))
    }
}

/// Creates `path` for direct writes, if this system and file system allow them.
fn open_direct(path: &Path) -> Option<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data file holds exactly what was put, whatever its length, written directly (where the file system
    /// takes O_DIRECT) or through the page cache.
    #[test]
    fn data_files_hold_exactly_what_was_put() {
        let dirs = [std::env::temp_dir(), PathBuf::from("/dev/shm")];
        for (dir, direct) in dirs.iter().filter(|d| d.is_dir()).flat_map(|d| [(d, true), (d, false)]) {
            let path = dir.join(format!("pcaptool-dataout-{}", std::process::id()));
            for len in [0usize, 1, 24, 4095, 4096, 4097, DIRECT_CHUNK - 3, DIRECT_CHUNK, 3 * DIRECT_CHUNK + 77] {
                let want: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                let mut w = DataOut::create_trying(&path, direct, Vec::new()).expect("create").with_sums(vec![7]);
                // Pieces of the sizes the writer puts: record headers and packets.
                let mut at = 0;
                let mut k = 0;
                while at < len {
                    let n = [16, 60, 1514, 9000, 70_000][k % 5].min(len - at);
                    w.put(&want[at..at + n]).expect("put");
                    at += n;
                    k += 1;
                }
                let (_, sums) = w.finish().expect("finish");
                let got = std::fs::read(&path).expect("read back");
                assert!(got == want, "{} bytes in {}: read back {} bytes, different", len, dir.display(), got.len());
                let mut want_sums = Vec::new();
                push_sums(&mut want_sums, &want);
                assert_eq!(sums.expect("asked for"), want_sums, "{len} bytes: the checksums of the blocks");
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}
