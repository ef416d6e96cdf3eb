//! An answer streamed as it is found: the engine runs on a blocking thread and writes its pcap bytes into a
//! bounded channel, which the response body reads. A full channel blocks the engine (backpressure: a slow
//! client never makes the service hold the answer); a dropped body (the client went away) cancels the work.

use std::io::{self, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use pcaptool_engine::{Cancel, Error as EngineError, Layout, Positional, Sink, SinkError};
use pcaptool_packet::{Interface, Record};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

/// Pieces of an answer in flight at most: with the format writer's 128 KiB pieces, 512 KiB a query.
pub(crate) const IN_FLIGHT: usize = 4;

/// The response body of a streamed answer.
#[derive(Debug)]
pub(crate) struct Stream {
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
    cancel: Cancel,
    ended: bool,
}

impl http_body::Body for Stream {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Dropped before its end: the client went away (or the connection failed); stop the engine.
        if !self.ended {
            self.cancel.cancel();
        }
    }
}

/// Told once whether an answer starts (its first byte is written: `None`) or fails before it (`Some`), so that
/// a failure before any byte gets its own status instead of a stream that breaks. It also holds the answer's
/// turn to run (see `exec` in the HTTP side) until then: a needle's answer is whole by its first byte, and a
/// stream that waits for its client must not keep other queries from running.
#[derive(Debug)]
pub(crate) struct First {
    tx: Mutex<Option<oneshot::Sender<Option<EngineError>>>>,
    turn: Mutex<Option<OwnedSemaphorePermit>>,
}

impl First {
    pub(crate) fn new(turn: Option<OwnedSemaphorePermit>) -> (Arc<First>, oneshot::Receiver<Option<EngineError>>) {
        let (tx, rx) = oneshot::channel();
        (Arc::new(First { tx: Mutex::new(Some(tx)), turn: Mutex::new(turn) }), rx)
    }

    /// Whether it was told.
    pub(crate) fn fired(&self) -> bool {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Tells it, the first time only (and gives the turn back); true if this was the first time.
    pub(crate) fn fire(&self, failure: Option<EngineError>) -> bool {
        drop(self.turn.lock().unwrap_or_else(|e| e.into_inner()).take());
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        tx.map(|tx| tx.send(failure)).is_some()
    }
}

/// The engine's side: bytes written go to the body, blocking while the channel is full.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    sent: Arc<AtomicU64>,
    first: Arc<First>,
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.first.fire(None);
        self.tx
            .blocking_send(Ok(SPARE.copied(buf)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        self.sent.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Buffers of pieces the response is done with, kept for the next pieces (of this answer or another): a piece
/// copied into memory never touched before costs a page fault for each 4 KiB of it (6% of the service's CPU for a
/// needle answer of 984 KB, docs/BENCHMARKS.md). At most [`SPARE_PIECES`] buffers of at most [`SPARE_CAPACITY`]
/// bytes are kept, 8 MiB however many queries ran. Each holds at least a whole piece, so that a small answer's
/// piece never leaves a buffer that a large one would have to grow into fresh memory.
#[derive(Debug)]
struct Spare(Mutex<Vec<Vec<u8>>>);

const SPARE_PIECES: usize = 32;
const SPARE_CAPACITY: usize = 256 << 10;
/// The pieces the format writer hands over (its buffer), the least a buffer is made with.
const PIECE: usize = 128 << 10;

/// The service's spare buffers.
static SPARE: Spare = Spare(Mutex::new(Vec::new()));

impl Spare {
    /// `buf` copied into a spare buffer (or a new one), as `Bytes` whose buffer comes back here when dropped.
    fn copied(&'static self, buf: &[u8]) -> Bytes {
        let spare = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut v = spare.unwrap_or_else(|| Vec::with_capacity(buf.len().max(PIECE)));
        v.clear();
        v.extend_from_slice(buf);
        Bytes::from_owner(Piece { buf: v, spare: self })
    }

    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() <= SPARE_CAPACITY {
            let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < SPARE_PIECES {
                kept.push(buf);
            }
        }
    }

    #[cfg(test)]
    fn kept(&self) -> Vec<usize> {
        self.0.lock().unwrap().iter().map(Vec::capacity).collect()
    }
}

/// A piece of an answer, its buffer given back to `spare` when dropped.
struct Piece {
    buf: Vec<u8>,
    spare: &'static Spare,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        self.spare.give(std::mem::take(&mut self.buf));
    }
}

/// A body, the writer that feeds it, the sender for a failure after its start, and how many bytes went out;
/// `first` hears of the first byte.
pub(crate) fn channel(
    cancel: Cancel,
    first: Arc<First>,
) -> (Stream, Writer, mpsc::Sender<Result<Bytes, io::Error>>, Arc<AtomicU64>) {
    let (tx, rx) = mpsc::channel(IN_FLIGHT);
    let sent = Arc::new(AtomicU64::new(0));
    (Stream { rx, cancel, ended: false }, Writer { tx: tx.clone(), sent: sent.clone(), first }, tx, sent)
}

/// A sink that passes records on until their captured bytes would pass `max_bytes`, then stops the answer (a
/// limit, as a packet limit is: the answer is complete up to it).
#[derive(Debug)]
pub(crate) struct ByteLimit<S> {
    pub(crate) inner: S,
    pub(crate) max_bytes: u64,
    pub(crate) bytes: u64,
    pub(crate) packets: u64,
    /// Whether the limit stopped the answer.
    pub(crate) reached: bool,
}

impl<S: Sink> Sink for ByteLimit<S> {
    fn begin(&mut self, layout: &Layout<'_>) -> Result<(), SinkError> {
        self.inner.begin(layout)
    }

    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        let n = rec.data.len() as u64;
        if self.bytes + n > self.max_bytes {
            self.reached = true;
            return Ok(false);
        }
        self.bytes += n;
        self.packets += 1;
        self.inner.record(rec, ifaces)
    }

    fn finish(&mut self, ifaces: &[Interface]) -> Result<(), SinkError> {
        self.inner.finish(ifaces)
    }

    fn abandon(&mut self) {
        self.inner.abandon()
    }

    fn positional(&mut self, _: &[Interface]) -> Result<Option<&mut Positional>, SinkError> {
        // Records go one by one, so that each is counted against the limit.
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_come_back_and_hold_only_the_new_piece() {
        static S: Spare = Spare(Mutex::new(Vec::new()));
        let a = S.copied(&[7u8; 1000]);
        assert_eq!(&a[..], &[7u8; 1000][..]);
        assert!(S.kept().is_empty(), "a piece in flight keeps its buffer");
        drop(a);
        assert_eq!(S.kept().len(), 1);
        // The buffer is reused for a shorter piece: only the new bytes are seen.
        let b = S.copied(b"xy");
        assert_eq!(&b[..], b"xy");
        assert!(S.kept().is_empty());
        // A slice of a piece keeps the buffer until the last of them is dropped.
        let c = b.slice(1..);
        drop(b);
        assert!(S.kept().is_empty());
        assert_eq!(&c[..], b"y");
        drop(c);
        assert_eq!(S.kept().len(), 1);
    }

    #[test]
    fn a_small_piece_leaves_a_buffer_a_whole_piece_fits_in() {
        static S: Spare = Spare(Mutex::new(Vec::new()));
        drop(S.copied(b"small"));
        assert!(S.kept().iter().all(|&c| c >= PIECE), "kept: {:?}", S.kept());
    }

    #[test]
    fn spare_buffers_are_bounded_in_number_and_size() {
        static S: Spare = Spare(Mutex::new(Vec::new()));
        let big = S.copied(&vec![1u8; SPARE_CAPACITY + 1]);
        drop(big);
        assert!(S.kept().is_empty(), "a buffer larger than the bound is freed");
        let pieces: Vec<Bytes> = (0..SPARE_PIECES + 5).map(|i| S.copied(&[i as u8; 100])).collect();
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(&p[..], &[i as u8; 100][..]);
        }
        drop(pieces);
        assert_eq!(S.kept().len(), SPARE_PIECES);
    }
}
