//! Byte sources for streaming readers: magic detection, decompression on its own thread, and standard input.

use std::io::{self, Read};
use std::thread;

use crossbeam_channel::{Receiver, bounded};

/// A compression codec, detected from the first bytes of the input.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Compression {
    /// gzip (RFC 1952), concatenated members included.
    Gzip,
    /// Zstandard frames.
    Zstd,
    /// LZ4 frame format (not the legacy or block format).
    Lz4,
}

impl Compression {
    /// Detects a compressed stream from its first bytes.
    pub fn detect(magic: &[u8]) -> Option<Compression> {
        match magic {
            [0x1f, 0x8b, ..] => Some(Compression::Gzip),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Some(Compression::Zstd),
            [0x04, 0x22, 0x4d, 0x18, ..] => Some(Compression::Lz4),
            _ => None,
        }
    }

    /// `gzip`, `zstd` or `lz4`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }

    /// Wraps `r` in the matching decompressor.
    pub(crate) fn decoder(self, r: Box<dyn Read + Send>) -> io::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 16, r))),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(r)?),
            Compression::Lz4 => Box::new(Lz4Frames(lz4_flex::frame::FrameDecoder::new(EofTrack { r, eof: false }))),
        })
    }
}

/// The `lz4` tool's reading of a file: frame after frame to the end of the input (lz4_flex's decoder ends at
/// the end of a frame; a store's compressed segment is a frame per block).
struct Lz4Frames(lz4_flex::frame::FrameDecoder<EofTrack>);

impl Read for Lz4Frames {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let n = self.0.read(buf)?;
            // 0 at the end of a frame: another may follow, unless the input has ended.
            if n > 0 || self.0.get_mut().eof {
                return Ok(n);
            }
        }
    }
}

/// A reader that remembers whether it has reached the end of its input.
struct EofTrack {
    r: Box<dyn Read + Send>,
    eof: bool,
}

impl Read for EofTrack {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.r.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.eof = true;
        }
        Ok(n)
    }
}

const CHUNK: usize = 1 << 18;

/// A reader fed by a thread that runs the decompressor (libtrace's threaded I/O): the parsing thread never waits on
/// decompression unless the decompressor is slower than the parser.
pub(crate) struct ThreadedReader {
    rx: Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl std::fmt::Debug for ThreadedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadedReader").field("pos", &self.pos).field("done", &self.done).finish()
    }
}

impl ThreadedReader {
    pub(crate) fn spawn(mut src: Box<dyn Read + Send>) -> io::Result<ThreadedReader> {
        let (tx, rx) = bounded::<io::Result<Vec<u8>>>(4);
        thread::Builder::new().name("pcaptool-decompress".into()).spawn(move || {
            loop {
                let mut buf = vec![0u8; CHUNK];
                let mut filled = 0;
                let res = loop {
                    match src.read(&mut buf[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == buf.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                buf.truncate(filled);
                let last = filled < CHUNK || res.is_err();
                if filled > 0 && tx.send(Ok(buf)).is_err() {
                    return;
                }
                if let Err(e) = res {
                    let _ = tx.send(Err(e));
                    return;
                }
                if last {
                    return;
                }
            }
        })?;
        Ok(ThreadedReader { rx, cur: Vec::new(), pos: 0, done: false })
    }
}

impl Read for ThreadedReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.cur = chunk;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
