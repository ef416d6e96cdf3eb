//! The writer of a segment's files: aligned staging windows written with `O_DIRECT` where the file system takes
//! them, by a thread of their own while the next window fills, and the data file's block checksums computed on
//! the way (see [`crate::sums`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::sums::push_sums;

/// Writes a segment's file through aligned staging windows, with `O_DIRECT` where the file system takes it: the
/// data then goes from the window to the disk without a copy into the page cache, which costs more CPU than
/// everything else a packet needs (n2disk writes so too). Elsewhere (tmpfs, other systems) it writes through the
/// page cache. The last block is padded for the direct write and the file cut to its length.
///
/// A direct write waits for the disk, so from the second full window on the windows are written by a thread of
/// their own while the caller fills the next (up to [`WINDOWS`] of them): a segment's close then compresses or
/// gathers its data while the last window goes to the disk, not between writes. A write's error is returned by a
/// later [`put`](Self::put) or by [`finish`](Self::finish).
pub(crate) struct DataOut {
    /// The file, while no writer thread has it.
    io: Io,
    /// The window being filled, and the free ones.
    cur: Window,
    free: Vec<Window>,
    /// Windows made or handed in: at most [`WINDOWS`].
    windows: usize,
    /// Whether the file was opened for direct writes (its last window is padded for them).
    opened_direct: bool,
    /// Bytes in the window.
    fill: usize,
    /// Bytes handed to be written before the window.
    written: u64,
    /// The checksums of the blocks written so far, if asked for.
    sums: Option<Vec<u32>>,
}

/// Alignment of direct writes: a page, a multiple of every disk's logical block size.
const DIRECT_ALIGN: usize = 4096;
/// Size of each write.
const DIRECT_CHUNK: usize = 1 << 20;
/// Windows a writer fills and writes at once, at most.
const WINDOWS: usize = 4;
// Windows start at multiples of the checksum block, so each window's checksums are its own.
const _: () = assert!(DIRECT_CHUNK.is_multiple_of(crate::sums::BLOCK));

/// Staging memory of a [`DataOut`], kept from one file to the next so that each does not fault in fresh pages.
#[derive(Debug, Default)]
pub(crate) struct Stage(Vec<Window>);

/// A buffer with an aligned window of [`DIRECT_CHUNK`] bytes in it.
#[derive(Debug)]
pub(crate) struct Window {
    buf: Vec<u8>,
    /// Where the window starts in `buf`.
    start: usize,
}

impl Window {
    /// The window of `buf`, grown to hold it if it is smaller.
    fn new(mut buf: Vec<u8>) -> Window {
        if buf.len() < DIRECT_CHUNK + DIRECT_ALIGN {
            buf = vec![0u8; DIRECT_CHUNK + DIRECT_ALIGN];
        }
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        Window { buf, start }
    }

    fn bytes(&self, len: usize) -> &[u8] {
        &self.buf[self.start..self.start + len]
    }

    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.start..self.start + len]
    }
}

/// The file and how it is written to.
struct FileSink {
    file: File,
    path: PathBuf,
    direct: bool,
}

impl FileSink {
    /// Writes `bytes` at `at`; a direct write the file system refuses is done again through the page cache, and
    /// so is the rest of the file.
    fn write(&mut self, bytes: &[u8], at: u64) -> std::io::Result<()> {
        if self.direct {
            match self.file.write_all_at(bytes, at) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.file = std::fs::OpenOptions::new().write(true).open(&self.path)?;
                    self.direct = false;
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(bytes, at)
    }
}

/// A window to write: its first `len` bytes at `at`.
struct Job {
    window: Window,
    len: usize,
    at: u64,
}

enum Io {
    /// Writes on the caller's thread (until a second window fills, or if no thread could start).
    Inline(FileSink),
    /// Writes on a thread, which hands each window back with the write's outcome; `in_flight` windows are there.
    Behind {
        jobs: mpsc::SyncSender<Job>,
        done: mpsc::Receiver<(Window, std::io::Result<()>)>,
        thread: std::thread::JoinHandle<FileSink>,
        in_flight: usize,
    },
    /// No file to write to: its thread stopped, or it could not be opened again without one.
    Gone,
}

impl DataOut {
    /// Creates `path`, staging its bytes in `stage`'s windows (a window made when there are none: the windows of
    /// an earlier [`finish`](Self::finish) are reused as they are).
    pub(crate) fn create(path: &Path, stage: Stage) -> std::io::Result<DataOut> {
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
    pub(crate) fn create_trying(path: &Path, try_direct: bool, stage: Stage) -> std::io::Result<DataOut> {
        let (file, direct) = match try_direct.then(|| open_direct(path)).flatten() {
            Some(f) => (f, true),
            None => (File::create(path)?, false),
        };
        let mut free = stage.0;
        free.truncate(WINDOWS);
        let windows = free.len().max(1);
        let cur = free.pop().map_or_else(|| Window::new(Vec::new()), |w| Window::new(w.buf));
        Ok(DataOut {
            io: Io::Inline(FileSink { file, path: path.to_path_buf(), direct }),
            cur,
            free,
            windows,
            opened_direct: direct,
            fill: 0,
            written: 0,
            sums: None,
        })
    }

    #[inline]
    pub(crate) fn put(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(DIRECT_CHUNK - self.fill);
            let at = self.cur.start + self.fill;
            self.cur.buf[at..at + n].copy_from_slice(&bytes[..n]);
            self.fill += n;
            bytes = &bytes[n..];
            if self.fill == DIRECT_CHUNK {
                self.sum_window(DIRECT_CHUNK);
                self.hand(DIRECT_CHUNK)?;
                self.written += DIRECT_CHUNK as u64;
                self.fill = 0;
            }
        }
        Ok(())
    }

    /// Writes the window's first `len` bytes at `written`, or hands them to the writer thread (started at the
    /// second window) and takes a free window, waiting for one when all are being written.
    fn hand(&mut self, len: usize) -> std::io::Result<()> {
        if let Io::Inline(sink) = &mut self.io {
            if self.written == 0 {
                // A file of one window is written where it is: no thread for an index or a small segment.
                return sink.write(self.cur.bytes(len), 0);
            }
            if self.written == DIRECT_CHUNK as u64 {
                self.start_thread();
            }
        }
        let (jobs, done, in_flight) = match &mut self.io {
            Io::Behind { jobs, done, in_flight, .. } => (jobs, done, in_flight),
            // No thread could start.
            Io::Inline(sink) => return sink.write(self.cur.bytes(len), self.written),
            Io::Gone => return Err(thread_gone()),
        };
        let next = match self.free.pop() {
            Some(w) => w,
            None if self.windows < WINDOWS => {
                self.windows += 1;
                Window::new(Vec::new())
            }
            None => {
                let (w, r) = done.recv().map_err(|_| thread_gone())?;
                *in_flight -= 1;
                r?;
                w
            }
        };
        let window = std::mem::replace(&mut self.cur, next);
        jobs.send(Job { window, len, at: self.written }).map_err(|_| thread_gone())?;
        *in_flight += 1;
        Ok(())
    }

    /// Moves the file to a writer thread (once, at the second window); if none can start, the file is written on
    /// through the file opened again.
    fn start_thread(&mut self) {
        let Io::Inline(mut sink) = std::mem::replace(&mut self.io, Io::Gone) else { return };
        let path = sink.path.clone();
        let (jobs, todo) = mpsc::sync_channel::<Job>(WINDOWS);
        let (report, done) = mpsc::sync_channel(WINDOWS);
        let spawned = std::thread::Builder::new().name("pcaptool-write".into()).spawn(move || {
            for Job { window, len, at } in todo {
                let r = sink.write(window.bytes(len), at);
                if report.send((window, r)).is_err() {
                    break;
                }
            }
            sink
        });
        self.io = match spawned {
            Ok(thread) => Io::Behind { jobs, done, thread, in_flight: 0 },
            // (The file went with the thread that did not start.)
            Err(_) => match std::fs::OpenOptions::new().write(true).open(&path) {
                Ok(file) => Io::Inline(FileSink { file, path, direct: false }),
                Err(_) => Io::Gone,
            },
        };
    }

    /// Adds the checksums of the window's first `len` bytes (the window starts at a multiple of the checksum
    /// block, since [`DIRECT_CHUNK`] is one).
    fn sum_window(&mut self, len: usize) {
        if let Some(sums) = &mut self.sums {
            push_sums(sums, self.cur.bytes(len));
        }
    }

    /// Writes what is left, waits for every write, cuts the file to its length and syncs it; returns the staging
    /// windows and the checksums (if asked for).
    pub(crate) fn finish(mut self) -> std::io::Result<(Stage, Option<Vec<u32>>)> {
        let len = self.written + self.fill as u64;
        self.sum_window(self.fill);
        if self.fill > 0 {
            let padded = if self.opened_direct { self.fill.next_multiple_of(DIRECT_ALIGN) } else { self.fill };
            let fill = self.fill;
            self.cur.bytes_mut(padded)[fill..].fill(0);
            self.hand(padded)?;
        }
        let sink = match std::mem::replace(&mut self.io, Io::Gone) {
            Io::Inline(sink) => sink,
            Io::Behind { jobs, done, thread, in_flight } => {
                drop(jobs);
                let mut first_error = None;
                for _ in 0..in_flight {
                    let (w, r) = done.recv().map_err(|_| thread_gone())?;
                    self.free.push(w);
                    if let Err(e) = r {
                        first_error.get_or_insert(e);
                    }
                }
                let sink = thread.join().map_err(|_| thread_gone())?;
                if let Some(e) = first_error {
                    return Err(e);
                }
                sink
            }
            Io::Gone => return Err(thread_gone()),
        };
        sink.file.set_len(len)?;
        sink.file.sync_all()?;
        self.free.push(self.cur);
        Ok((Stage(self.free), self.sums))
    }
}

/// The error of a writer thread that stopped (it panicked).
fn thread_gone() -> std::io::Error {
    std::io::Error::other("the file's writer stopped (its thread ended, or it could not be opened again)")
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
    /// takes O_DIRECT) or through the page cache, on the caller's thread (one window) or by the writer thread
    /// (more windows than it has, so that it waits for windows written); the windows go from file to file.
    #[test]
    fn data_files_hold_exactly_what_was_put() {
        let dirs = [std::env::temp_dir(), PathBuf::from("/dev/shm")];
        for (dir, direct) in dirs.iter().filter(|d| d.is_dir()).flat_map(|d| [(d, true), (d, false)]) {
            let path = dir.join(format!("pcaptool-dataout-{}", std::process::id()));
            let mut stage = Stage::default();
            let lens = [0usize, 1, 24, 4095, 4096, 4097, DIRECT_CHUNK - 3, DIRECT_CHUNK, 3 * DIRECT_CHUNK + 77];
            for len in lens.into_iter().chain([(WINDOWS + 2) * DIRECT_CHUNK + 5]) {
                let want: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                let mut w = DataOut::create_trying(&path, direct, stage).expect("create").with_sums(vec![7]);
                // Pieces of the sizes the writer puts: record headers and packets.
                let mut at = 0;
                let mut k = 0;
                while at < len {
                    let n = [16, 60, 1514, 9000, 70_000][k % 5].min(len - at);
                    w.put(&want[at..at + n]).expect("put");
                    at += n;
                    k += 1;
                }
                let (back, sums) = w.finish().expect("finish");
                assert!(!back.0.is_empty() && back.0.len() <= WINDOWS);
                stage = back;
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
