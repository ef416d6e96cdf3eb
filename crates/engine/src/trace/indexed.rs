//! Answers through a trace's index: counting from it, reading only the packets it selects (in parallel, piece by
//! piece), or scanning its chunks in parallel. Matches are given in trace order, the same bytes as a scan's.

use std::fs::File;

use pcaptool_index::{IndexView, Selection};
use pcaptool_packet::{Interface, Record, Seeker, TraceReader};
use pcaptool_query::Filter;
use rayon::prelude::*;

use super::{Run, index_error, snapshot};
use crate::matchers::cut;
use crate::plan::Strategy;
use crate::positional::Arena;
use crate::{Error, Mismatch, Outcome};

thread_local! {
    /// A thread's buffer for reading the trace's blocks with `pread` ([`IndexView::read_packets_at`]).
    static WINDOW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Run<'_, '_> {
    /// Answers over an indexed trace, as [`TraceSource::choose`](super::TraceSource) decides.
    pub(super) fn execute(
        &mut self,
        filter: &Filter,
        reader: &mut TraceReader,
        view: &IndexView<'_>,
    ) -> Result<Outcome, Error> {
        let choice = self.source.choose(self.req, filter, view)?;
        match (choice.strategy, &choice.qplan.index, &choice.selection) {
            (Strategy::IndexCount, Some(part), _) => {
                let (sure, undecided) = view.count(part).map_err(|e| index_error(view, e))?;
                let mut s = self.indexed(reader, view, &undecided)?;
                s.matched = (s.matched + sure).min(self.limit());
                s.counted_from_index = Some(sure);
                Ok(s)
            }
            (Strategy::Index, _, Some(sel)) => self.indexed(reader, view, sel),
            (Strategy::ChunkScan, ..) if reader.as_bytes().is_some() => self.scan_chunks(reader, view),
            _ => self.scan(reader),
        }
    }

    /// Whether the sink writes at offsets computed in advance: a mapped, uncompressed trace of one interface
    /// without FCS bits, and a sink that can.
    fn positional(&mut self, reader: &TraceReader, view: &IndexView<'_>) -> Result<bool, Error> {
        let ifaces = reader.interfaces();
        if self.req.count_only
            || reader.as_bytes().is_none()
            || view.file().compressed()
            || ifaces.len() != 1
            || ifaces[0].fcs_len.is_some()
        {
            return Ok(false);
        }
        Ok(self.sink.positional(ifaces)?.is_some())
    }

    /// Gives the matches of consecutive lists, in order, up to the limit in all (counted in `stats`); true when
    /// the answer is complete (the limit reached, or the sink stopped it).
    fn emit(
        &mut self,
        mut lists: Vec<Vec<Record<'_>>>,
        positional: bool,
        ifaces: &[Interface],
        stats: &mut Outcome,
    ) -> Result<bool, Error> {
        let done = keep_first(&mut lists, self.limit(), stats, |l, n| {
            l.truncate(n);
            l.len()
        });
        if positional {
            if let Some(p) = self.sink.positional(ifaces)? {
                p.write(&lists)?;
            }
            return Ok(done);
        }
        if self.req.count_only {
            return Ok(done);
        }
        let total: u64 = lists.iter().map(|l| l.len() as u64).sum();
        for (given, rec) in lists.iter().flatten().enumerate() {
            self.req.go_on()?;
            if !self.sink.record(rec, ifaces)? {
                stats.matched -= total - given as u64 - 1;
                stats.stopped = true;
                return Ok(true);
            }
        }
        Ok(done)
    }

    /// [`Run::emit`] for arenas: those of a positional output are written as they are, with their headers
    /// filled in.
    fn emit_arenas(
        &mut self,
        mut arenas: Vec<Arena>,
        positional: bool,
        ifaces: &[Interface],
        stats: &mut Outcome,
    ) -> Result<bool, Error> {
        if !positional {
            let lists = arenas.iter().map(Arena::records).collect();
            return self.emit(lists, false, ifaces, stats);
        }
        let done = keep_first(&mut arenas, self.limit(), stats, Arena::truncate);
        if let Some(p) = self.sink.positional(ifaces)? {
            p.write_arenas(&mut arenas)?;
        }
        Ok(done)
    }

    /// A scan split by the index: every chunk read from its first record, chunks in parallel (in waves, so
    /// memory holds a few chunks' matches), matches given in order.
    fn scan_chunks(&mut self, reader: &mut TraceReader, view: &IndexView<'_>) -> Result<Outcome, Error> {
        let snap = snapshot(reader.interfaces());
        let positional = self.positional(reader, view)?;
        let bytes = reader.as_bytes().expect("a mapped trace");
        let mut stats = Outcome { packets: view.packets(), ..Outcome::default() };
        let seeker = self.seeker(bytes, view)?;
        self.progress.start(self.source.size);
        // Into a file, deciding overlaps writing (see `scan_chunks_piped`); into a device that takes the bytes for
        // nothing (/dev/null), every thread decides, then writes its part.
        if positional && self.req.limit.is_none() && self.scan_chunks_piped(bytes, view, &seeker, snap, &mut stats)? {
            self.progress.finish();
            stats.damage = self.index_damage(view, bytes, &seeker)?;
            return Ok(stats);
        }
        let source = self.source;
        let trace = &source.path;
        let all: Vec<usize> = (0..view.chunks().len()).collect();
        for wave in all.chunks(rayon::current_num_threads().max(1)) {
            self.req.go_on()?;
            let (req, progress) = (self.req, self.progress);
            let lists = {
                let decide = self.matchers.decider();
                wave.par_iter()
                    .map(|&ci| {
                        let mut hits = Vec::new();
                        view.walk_chunk(bytes, &seeker, trace, ci, &mut |_, rec| {
                            let rec = cut(rec, snap);
                            if req.in_window(rec.ts_ns) && decide(&rec) {
                                hits.push(rec);
                            }
                            Ok(())
                        })?;
                        progress.advance(view.chunk_bytes(ci)?);
                        Ok(hits)
                    })
                    .collect::<Result<Vec<Vec<Record<'_>>>, pcaptool_index::IndexError>>()
                    .map_err(|e| index_error(view, e))?
            };
            if self.emit(lists, positional, seeker.interfaces(), &mut stats)? {
                self.progress.finish();
                return Ok(stats);
            }
        }
        self.progress.finish();
        stats.damage = self.index_damage(view, bytes, &seeker)?;
        Ok(stats)
    }

    /// [`Run::scan_chunks`] into a positional file: decider threads take the chunks in order and hand their
    /// matches in batches to this thread, which writes them in trace order as they come. Deciding overlaps
    /// writing, and one thread writes: threads writing one file wait for its lock, spinning (on the real-traffic
    /// trace, `tcp` to a file in memory spent 17% of its processor time there; docs/BENCHMARKS.md). False, having
    /// done nothing, when the output is not a regular file.
    fn scan_chunks_piped(
        &mut self,
        bytes: &[u8],
        view: &IndexView<'_>,
        seeker: &Seeker,
        snap: usize,
        stats: &mut Outcome,
    ) -> Result<bool, Error> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
        use std::sync::{Condvar, Mutex};
        enum Piece<'d> {
            /// Matches of a chunk, in order; more may follow.
            Matches(usize, Vec<Record<'d>>),
            /// The chunk's matches are all sent.
            Done(usize),
            Failed(pcaptool_index::IndexError),
        }
        const BATCH: usize = 8192;
        let Some(out) = self.sink.positional(seeker.interfaces())?.filter(|p| p.writes_cost()) else {
            return Ok(false);
        };
        let chunks = view.chunks().len();
        // One decider fewer than the processors, this thread writing: writing costs about what deciding costs (the
        // kernel's copy into the file's pages), and one more decider would take processor time from the writer.
        let threads = rayon::current_num_threads().saturating_sub(1).max(1);
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        // Chunks written so far: a decider waits before starting one more than `ahead` past them, so that memory
        // holds a few chunks' matches.
        let written = (Mutex::new(0usize), Condvar::new());
        let ahead = 2 * threads;
        let (req, progress, trace) = (self.req, self.progress, &self.source.path);
        let decide = self.matchers.decider();
        let halt = || {
            stop.store(true, Relaxed);
            let _guard = written.0.lock().unwrap_or_else(|e| e.into_inner());
            written.1.notify_all();
        };
        let (mut failed, mut write_error) = (None, None);
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Piece<'_>>(4 * threads);
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, stop, written, decide) = (&next, &stop, &written, &decide);
                s.spawn(move || {
                    while !stop.load(Relaxed) && !req.is_cancelled() {
                        let ci = next.fetch_add(1, Relaxed);
                        if ci >= chunks {
                            return;
                        }
                        {
                            let mut w = written.0.lock().unwrap_or_else(|e| e.into_inner());
                            while ci >= *w + ahead && !stop.load(Relaxed) {
                                w = written.1.wait(w).unwrap_or_else(|e| e.into_inner());
                            }
                        }
                        let mut batch = Vec::with_capacity(BATCH);
                        let walked = view.walk_chunk(bytes, seeker, trace, ci, &mut |_, rec| {
                            let rec = cut(rec, snap);
                            if req.in_window(rec.ts_ns) && decide(&rec) {
                                batch.push(rec);
                                if batch.len() == BATCH {
                                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                                    // (The writer has stopped reading only when the answer failed.)
                                    let _ = tx.send(Piece::Matches(ci, full));
                                }
                            }
                            Ok(())
                        });
                        match walked.and_then(|()| view.chunk_bytes(ci)) {
                            Ok(n) => {
                                progress.advance(n);
                                let _ = tx.send(Piece::Matches(ci, batch));
                                let _ = tx.send(Piece::Done(ci));
                            }
                            Err(e) => {
                                let _ = tx.send(Piece::Failed(e));
                                return;
                            }
                        }
                    }
                });
            }
            drop(tx);
            // Matches of chunks after the one being written, and whether each is complete.
            let mut pending: std::collections::HashMap<usize, (Vec<Vec<Record<'_>>>, bool)> = Default::default();
            let mut at = 0;
            for piece in rx {
                match piece {
                    Piece::Matches(ci, recs) => pending.entry(ci).or_default().0.push(recs),
                    Piece::Done(ci) => pending.entry(ci).or_default().1 = true,
                    Piece::Failed(e) => {
                        failed.get_or_insert(e);
                        halt();
                    }
                }
                while let Some((lists, done)) = pending.get_mut(&at) {
                    for recs in lists.drain(..) {
                        stats.matched += recs.len() as u64;
                        if write_error.is_none()
                            && let Err(e) = out.append(&recs, Some(bytes))
                        {
                            write_error = Some(e);
                            halt();
                        }
                    }
                    if !*done {
                        break;
                    }
                    pending.remove(&at);
                    at += 1;
                    let mut w = written.0.lock().unwrap_or_else(|e| e.into_inner());
                    *w = at;
                    written.1.notify_all();
                }
            }
        });
        if let Some(e) = failed {
            return Err(index_error(view, e));
        }
        // Deciders that saw the cancel flag stop taking chunks; the chunks written are then not the whole answer.
        self.req.go_on()?;
        match write_error {
            Some(e) => Err(e.into()),
            None => Ok(true),
        }
    }

    /// A reader of the records of the mapped trace `bytes` at the offsets the index gives, with the filter
    /// compiled for every link type of the trace.
    fn seeker(&mut self, bytes: &[u8], view: &IndexView<'_>) -> Result<Seeker, Error> {
        let trace = &self.source.path;
        let seeker = Seeker::new(bytes, view.file().structure())
            .map_err(|e| Error::IndexMismatch {
                index: view.file().path().to_path_buf(),
                trace: trace.clone(),
                mismatch: Mismatch::Structure(e.to_string()),
            })?
            .with_path(trace);
        for i in seeker.interfaces() {
            self.matchers.get(i.linktype, self.source.swapped)?;
        }
        Ok(seeker)
    }

    /// The damage the index says ended the trace, read again from the trace (an index claiming damage the trace
    /// does not have is refused).
    fn index_damage(
        &self,
        view: &IndexView<'_>,
        bytes: &[u8],
        seeker: &Seeker,
    ) -> Result<Option<pcaptool_packet::TraceError>, Error> {
        let file = view.file();
        let Some(offset) = file.damage() else { return Ok(None) };
        match seeker.next_record_at(bytes, offset) {
            Err(e) => Ok(Some(e)),
            Ok(_) => Err(Error::IndexMismatch {
                index: file.path().to_path_buf(),
                trace: self.source.path.clone(),
                mismatch: Mismatch::NoDamage { offset },
            }),
        }
    }

    /// Reads the packets the index selected and gives those the filter matches, in trace order.
    fn indexed(&mut self, reader: &mut TraceReader, view: &IndexView<'_>, sel: &Selection) -> Result<Outcome, Error> {
        let limit = self.limit();
        let snap = snapshot(reader.interfaces());
        let positional = self.positional(reader, view)?;
        let mut stats = Outcome { packets: view.packets(), candidates: Some(sel.count()), ..Outcome::default() };
        let trace = self.source.path.clone();
        if let Some(bytes) = reader.as_bytes() {
            // Few candidates over a large trace are read with `pread` from their blocks' first records (a read of
            // a few KiB costs less than a page fault of the mapping, measured on the needle benchmark); many are
            // read through the mapping.
            // A long-lived source reads through its mapping, which keeps the pages earlier answers faulted in.
            let sparse = self.source.shared.is_none() && view.blocks_to_read(sel).saturating_mul(8) < view.blocks();
            let trace_file = match sparse {
                true => Some(File::open(&trace).map_err(|source| Error::Io { path: trace.clone(), source })?),
                false => None,
            };
            let seeker = self.seeker(bytes, view)?;
            // The candidates in pieces of at most PIECE packets, read in parallel in waves of a bounded number of
            // packets (so that memory holds a few pieces' matches) and given in order: pieces, not whole chunks,
            // so that both threads have work when one chunk holds most candidates.
            const PIECE: usize = 512;
            let pieces: Vec<(usize, &[u32])> =
                sel.chunks.iter().flat_map(|(ci, positions)| positions.chunks(PIECE).map(move |p| (*ci, p))).collect();
            let per_wave = (rayon::current_num_threads().max(1) * 64).max(1);
            let req = self.req;
            for wave in pieces.chunks(per_wave) {
                self.req.go_on()?;
                let parallel = wave.iter().map(|(_, p)| p.len() as u64).sum::<u64>() >= super::FEW;
                let done = if let Some(tf) = &trace_file {
                    let arenas = {
                        let decide = self.matchers.decider();
                        let keep = |rec: &Record<'_>| req.in_window(rec.ts_ns) && decide(rec);
                        each_piece(wave, parallel, |(ci, positions)| {
                            let mut arena = Arena::new(positional);
                            let mut read = |window: &mut Vec<u8>| {
                                view.read_packets_at(tf, &seeker, &trace, *ci, positions, window, &mut |_, rec| {
                                    let rec = cut(rec, snap);
                                    if keep(&rec) {
                                        arena.push(&rec);
                                    }
                                    Ok(())
                                })
                            };
                            // Each thread keeps its read buffer from piece to piece (fresh pages cost more than the
                            // reads they would hold); a fresh one should the thread's be in use already.
                            WINDOW.with(|w| match w.try_borrow_mut() {
                                Ok(mut window) => read(&mut window),
                                Err(_) => read(&mut Vec::new()),
                            })?;
                            Ok(arena)
                        })
                        .map_err(|e| index_error(view, e))?
                    };
                    self.emit_arenas(arenas, positional, seeker.interfaces(), &mut stats)?
                } else {
                    let lists = {
                        let decide = self.matchers.decider();
                        let keep = |rec: &Record<'_>| req.in_window(rec.ts_ns) && decide(rec);
                        each_piece(wave, parallel, |(ci, positions)| {
                            let mut hits = Vec::new();
                            view.read_packets(bytes, &seeker, &trace, *ci, positions, &mut |_, rec| {
                                let rec = cut(rec, snap);
                                if keep(&rec) {
                                    hits.push(rec);
                                }
                                Ok(())
                            })?;
                            Ok(hits)
                        })
                        .map_err(|e| index_error(view, e))?
                    };
                    self.emit(lists, positional, seeker.interfaces(), &mut stats)?
                };
                if done {
                    break;
                }
            }
            if stats.matched < limit && !stats.stopped {
                stats.damage = self.index_damage(view, bytes, &seeker)?;
            }
            return Ok(stats);
        }
        self.indexed_stream(reader, view, sel, stats)
    }

    /// A compressed trace: stream it, and run the filter on the selected packets only.
    fn indexed_stream(
        &mut self,
        reader: &mut TraceReader,
        view: &IndexView<'_>,
        sel: &Selection,
        mut stats: Outcome,
    ) -> Result<Outcome, Error> {
        let limit = self.limit();
        let snap = snapshot(reader.interfaces());
        let file = view.file();
        let mismatch = |mismatch| Error::IndexMismatch {
            index: file.path().to_path_buf(),
            trace: self.source.path.clone(),
            mismatch,
        };
        let mut wanted = sel.chunks.iter().flat_map(|(ci, v)| {
            let first = view.chunks()[*ci].first_packet();
            v.iter().map(move |&i| (*ci, i as usize, first + u64::from(i)))
        });
        let mut next = wanted.next();
        let mut at = 0u64;
        while next.is_some() || file.damage().is_some() {
            self.req.go_on()?;
            let (rec, ifaces) = match reader.next_with_interfaces() {
                None => break,
                Some(Err(e)) => {
                    stats.damage = Some(e);
                    break;
                }
                Some(Ok((rec, ifaces))) => (cut(rec, snap), ifaces),
            };
            if let Some((ci, i, global)) = next
                && global == at
            {
                if !view.is_record(ci, i, &rec).map_err(|e| index_error(view, e))? {
                    return Err(mismatch(Mismatch::Packet { at }));
                }
                next = wanted.next();
                let hit = self.req.in_window(rec.ts_ns)
                    && self.matchers.get(rec.linktype, self.source.swapped)?.matches(rec.data, rec.wirelen, rec.ts_ns);
                if hit && stats.matched < limit {
                    stats.matched += 1;
                    if !self.give(&rec, ifaces, &mut stats)? || stats.matched >= limit {
                        break;
                    }
                }
            }
            at += 1;
        }
        if let Some((_, _, described)) = next
            && stats.damage.is_none()
            && stats.matched < limit
            && !stats.stopped
        {
            return Err(mismatch(Mismatch::Ends { described, packets: at }));
        }
        Ok(stats)
    }
}

/// `f` over the pieces of a wave, in order: in parallel, or on the calling thread (few candidates, see
/// [`FEW`](super::FEW)).
fn each_piece<'p, T: Send>(
    wave: &'p [(usize, &'p [u32])],
    parallel: bool,
    f: impl Fn(&'p (usize, &'p [u32])) -> Result<T, pcaptool_index::IndexError> + Sync + Send,
) -> Result<Vec<T>, pcaptool_index::IndexError> {
    if parallel { wave.par_iter().map(f).collect() } else { wave.iter().map(f).collect() }
}

/// Cuts consecutive lists of matches to `limit` matches in all, counted in `stats` (`keep` keeps a list's first
/// `n` and says how many it holds); true when the limit is reached.
fn keep_first<T>(
    lists: &mut [T],
    limit: u64,
    stats: &mut Outcome,
    mut keep: impl FnMut(&mut T, usize) -> usize,
) -> bool {
    let mut left = limit - stats.matched;
    for l in lists {
        left -= keep(l, usize::try_from(left).unwrap_or(usize::MAX)) as u64;
    }
    stats.matched = limit - left;
    left == 0
}
