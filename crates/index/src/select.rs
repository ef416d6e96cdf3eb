//! Loading an index and answering field conditions with it: key tables say which flows may satisfy a condition,
//! the lane sequence where their packets are (rank/select), the shape sequence which packets have given TCP flags
//! or lengths, time pages which packets may be in a window.
//!
//! Opening an index checks its header and directory; each chunk's parts are checked (checksum, structure) the
//! first time a query uses them, so a query reads and checks only what it needs (a needle query: the columns of
//! its fields, the flow part and the lane sequence of each chunk).

use std::path::Path;

use pcaptool_packet::{Field, Need, Pred, Record, Seeker};
use rayon::prelude::*;

use crate::IndexError;
use crate::chunk::{ChunkView, Known, RUN_READ, WHOLE_BLOCK_READ, resume};
use crate::file::IndexFile;
use crate::format::{BLOCK, Damage};
use crate::keys::KEY_FIELDS;
use crate::keys::KeyMemo;

/// Packets [`IndexView::read_packets`] looks for at once, their walks from their blocks' first records overlapping.
const WALKS: usize = 32;

/// Cache lines of each record [`IndexView::read_packets`] asks for ahead of reading them.
const PREFETCH_LINES: usize = 4;

/// Chunks up to this many are estimated on the calling thread: estimating a chunk whose key conditions were
/// evaluated before costs a few µs, less than the hand-over to the pool's threads (measured on the real-traffic
/// trace's 4 chunks in a long-lived source: an absent host 57 µs on the calling thread, 112 µs in parallel).
const SERIAL_CHUNKS: usize = 8;

/// Candidates a chunk estimated on the calling thread (see [`SERIAL_CHUNKS`]) selects with its estimate at most;
/// more are selected afterwards, in parallel: on the real-traffic trace's 4 chunks in a long-lived source, 399
/// candidates (about 100 a chunk) took 0.15 ms selected with the estimate against 0.16-0.21 ms estimated, then
/// selected in parallel; 5,333 (about 1,300 a chunk) 4.6-5.0 ms selected with the estimate against 3.3-3.5 ms
/// selected after it in parallel.
const SERIAL_SELECT: u64 = 256;

/// The packets an index selected: per chunk, the positions in the chunk, ascending.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `(chunk, positions)` for every chunk with candidates.
    pub chunks: Vec<(usize, Vec<u32>)>,
}

impl Selection {
    /// Packets selected.
    pub fn count(&self) -> u64 {
        self.chunks.iter().map(|(_, v)| v.len() as u64).sum()
    }
}

/// A condition's estimate from [`IndexView::estimate_select`], with the candidates of the chunks where it found
/// them.
#[derive(Clone, Debug)]
pub struct Estimated {
    need: Need,
    estimate: u64,
    /// Per chunk, its candidates when they were selected with the estimate.
    pub(crate) chunks: Vec<Option<Vec<u32>>>,
}

impl Estimated {
    /// Packets that may satisfy the condition, as [`IndexView::estimate_need`] gives them.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The condition estimated.
    pub fn need(&self) -> &Need {
        &self.need
    }
}

/// An index ready to answer conditions; its chunks' parts are checked as they are used.
#[derive(Debug)]
pub struct IndexView<'a> {
    file: &'a IndexFile,
    chunks: Vec<ChunkView<'a>>,
}

fn time_preds(need: &Need, out: &mut Vec<Pred>) {
    match need {
        Need::Pred(p) if p.field == Field::Time && !out.contains(p) => out.push(*p),
        Need::And(v) | Need::Or(v) => v.iter().for_each(|n| time_preds(n, out)),
        _ => {}
    }
}

impl<'a> IndexView<'a> {
    /// The index file.
    pub fn file(&self) -> &'a IndexFile {
        self.file
    }

    /// Packets indexed.
    pub fn packets(&self) -> u64 {
        self.file.packets()
    }

    /// The chunks.
    pub fn chunks(&self) -> &[ChunkView<'a>] {
        &self.chunks
    }

    fn corrupt(&self, d: Damage) -> IndexError {
        IndexError::Corrupt { path: self.file.path.clone(), offset: d.offset, why: d.why }
    }

    /// Checks every part of every chunk (checksums and structure), in parallel.
    pub fn check(&self) -> Result<(), IndexError> {
        self.chunks.par_iter().try_for_each(|c| c.check().map_err(|d| self.corrupt(d)))
    }

    /// Whether the index answers predicates on `field`.
    pub fn has_field(&self, field: Field) -> bool {
        KEY_FIELDS.contains(&field) || matches!(field, Field::TcpFlags | Field::WireLen | Field::Time)
    }

    /// Packets that may satisfy `pred`, from the key tables, the sequences' counts and the time pages.
    pub fn estimate(&self, pred: &Pred) -> Result<u64, IndexError> {
        self.chunks.par_iter().map(|c| c.estimate(pred).map_err(|d| self.corrupt(d))).sum()
    }

    /// Packets that may satisfy `need` as a whole (an upper bound: what [`select`](Self::select) would select,
    /// before the per-candidate checks of a mixed condition).
    pub fn estimate_need(&self, need: &Need) -> Result<u64, IndexError> {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let per = self.over_chunks(self.chunks.len() > SERIAL_CHUNKS, |_, c| c.estimate_need(need, &tp))?;
        Ok(per.into_iter().sum())
    }

    /// `f` over every chunk, in order: in parallel, or on the calling thread (where little work per chunk
    /// costs less than handing it to the pool's threads and waiting for them: a wake-up and a wait each,
    /// about 25 µs measured in the service).
    fn over_chunks<T: Send>(
        &self,
        parallel: bool,
        f: impl Fn(usize, &ChunkView<'a>) -> Result<T, Damage> + Sync + Send,
    ) -> Result<Vec<T>, IndexError> {
        let f = |(i, c)| f(i, c).map_err(|d| self.corrupt(d));
        if parallel {
            self.chunks.par_iter().enumerate().map(f).collect()
        } else {
            self.chunks.iter().enumerate().map(f).collect()
        }
    }

    /// For an exact condition (one that equals the filter where fields are known, see `pcaptool_query::plan::exact`):
    /// the packets the index alone shows to satisfy it, and the candidates it cannot decide (their fields unknown to
    /// it, a length class or time page across a bound), which the caller reads and filters.
    pub fn count(&self, need: &Need) -> Result<(u64, Selection), IndexError> {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let per = self
            .chunks
            .par_iter()
            .enumerate()
            .map(|(i, c)| c.count(need, &tp).map(|(sure, maybe)| (i, sure, maybe)).map_err(|d| self.corrupt(d)))
            .collect::<Result<Vec<_>, _>>()?;
        let sure = per.iter().map(|p| p.1).sum();
        let chunks = per.into_iter().filter(|p| !p.2.is_empty()).map(|(i, _, v)| (i, v)).collect();
        Ok((sure, Selection { chunks }))
    }

    /// Tells the view that every packet of its trace has a link type whose header fields the index reads (a
    /// pcap of such a link type; an index of version 6 or older read Ethernet only), so that a value it does not
    /// know is one the snapshot length cut off. A predicate that loads all of such a value's bytes then fails, as
    /// libpcap rejects a packet whose load reaches past its captured bytes (`Need::may_match_captured`): those
    /// packets are no longer candidates of, say, every `host` filter. Set it before selecting or counting.
    pub fn cut_fields_fail(mut self) -> IndexView<'a> {
        for c in &mut self.chunks {
            c.keys.cut_fails = true;
        }
        self
    }

    /// Every packet that may satisfy `need` (a superset of the packets that do; never fewer), chunks in
    /// parallel.
    pub fn select(&self, need: &Need) -> Result<Selection, IndexError> {
        self.select_with(need, true)
    }

    /// [`select`](Self::select), chunks in parallel or on the calling thread: a caller expecting few candidates
    /// (an estimate below a few hundred) spares the hand-over to the pool's threads, which costs more than
    /// their help then.
    pub fn select_with(&self, need: &Need, parallel: bool) -> Result<Selection, IndexError> {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let chunks = self
            .over_chunks(parallel && self.chunks.len() > 1, |i, c| c.select(need, &tp).map(|v| (i, v)))?
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect();
        Ok(Selection { chunks })
    }

    /// Plans and selects at once: [`estimate_need`](Self::estimate_need)'s estimate of `need` and, for every
    /// chunk where it is at most `max` and at most one packet in 64 of the chunk, the candidates
    /// [`select`](Self::select) would give there, found in the same walk of the lane sequence (a needle's
    /// flows are walked once instead of once for the estimate and again for the selection). At that density the
    /// candidates touch under a quarter of a chunk's blocks, so a planner deciding by the estimate reads them
    /// and the work is not lost; [`select_estimated`](Self::select_estimated) selects the other chunks.
    pub fn estimate_select(&self, need: &Need, max: u64) -> Result<Estimated, IndexError> {
        let mut tp = Vec::new();
        time_preds(need, &mut tp);
        let parallel = self.chunks.len() > SERIAL_CHUNKS;
        let max = if parallel { max } else { max.min(SERIAL_SELECT) };
        let per = self.over_chunks(parallel, |_, c| c.estimate_select(need, &tp, max.min(c.n as u64 / 64)))?;
        let estimate = per.iter().map(|p| p.0).sum();
        Ok(Estimated { need: need.clone(), estimate, chunks: per.into_iter().map(|p| p.1).collect() })
    }

    /// The selection of what [`estimate_select`](Self::estimate_select) estimated: the candidates it found, and
    /// those of the other chunks, selected now (in parallel or on the calling thread, as
    /// [`select_with`](Self::select_with)). Equal to `select_with(est.need(), parallel)`.
    pub fn select_estimated(&self, est: Estimated, parallel: bool) -> Result<Selection, IndexError> {
        let mut tp = Vec::new();
        time_preds(&est.need, &mut tp);
        let todo: Vec<usize> = est.chunks.iter().enumerate().filter(|(_, c)| c.is_none()).map(|(i, _)| i).collect();
        let select = |&i: &usize| self.chunks[i].select(&est.need, &tp).map(|v| (i, v)).map_err(|d| self.corrupt(d));
        let mut done: Vec<(usize, Vec<u32>)> = if parallel && todo.len() > 1 {
            todo.par_iter().map(select).collect::<Result<_, _>>()?
        } else {
            todo.iter().map(select).collect::<Result<_, _>>()?
        };
        done.extend(est.chunks.into_iter().enumerate().filter_map(|(i, c)| c.map(|v| (i, v))));
        done.retain(|(_, v)| !v.is_empty());
        done.sort_unstable_by_key(|(i, _)| *i);
        Ok(Selection { chunks: done })
    }

    /// The stream offset of the first record of block `b` of chunk `ci` and where the block ends.
    fn block_span(&self, ci: usize, b: usize) -> Result<(u64, u64), Damage> {
        let c = &self.chunks[ci];
        let end = if (b + 1) * BLOCK < c.n {
            c.block_offset(b + 1)?
        } else {
            match self.chunks.get(ci + 1) {
                Some(n) => n.block_offset(0)?,
                None => self.file.header.stream_len,
            }
        };
        Ok((c.block_offset(b)?, end))
    }

    /// Offset blocks in the index (a packet is read by walking from its block's first record).
    pub fn blocks(&self) -> u64 {
        self.chunks.iter().map(|c| c.n.div_ceil(BLOCK) as u64).sum()
    }

    /// Offset blocks that reading `sel` walks (the blocks holding its packets), without decoding their offsets.
    pub fn blocks_to_read(&self, sel: &Selection) -> u64 {
        sel.chunks
            .iter()
            .map(|(_, v)| {
                let mut last = u32::MAX;
                v.iter().filter(|&&i| std::mem::replace(&mut last, i / BLOCK as u32) != i / BLOCK as u32).count() as u64
            })
            .sum()
    }

    /// Bytes of the trace that reading `sel` touches (the blocks holding its packets).
    pub fn bytes_to_read(&self, sel: &Selection) -> Result<u64, IndexError> {
        let mut sum = 0u64;
        for (ci, v) in &sel.chunks {
            let mut last = usize::MAX;
            for &i in v {
                let b = i as usize / BLOCK;
                if b != last {
                    let (s, e) = self.block_span(*ci, b).map_err(|d| self.corrupt(d))?;
                    sum += e.saturating_sub(s);
                    last = b;
                }
            }
        }
        Ok(sum)
    }

    /// Checks that packet `i` of chunk `c`, read as `rec`, is the packet the index describes.
    fn check_read(&self, c: &ChunkView<'_>, i: usize, rec: &Record<'_>, trace: &Path) -> Result<(), IndexError> {
        self.check_read_with(c, i, c.known(i), &mut KeyMemo::default(), rec, trace)
    }

    /// [`check_read`](Self::check_read) with what selecting learnt of the packet and the key values checked before
    /// (see [`ChunkView::is_packet_with`]).
    fn check_read_with(
        &self,
        c: &ChunkView<'_>,
        i: usize,
        known: Option<Known>,
        memo: &mut KeyMemo,
        rec: &Record<'_>,
        trace: &Path,
    ) -> Result<(), IndexError> {
        let fields = self.file.header.reading().fields(rec);
        if c.is_packet_with(i, known, memo, &fields, rec.wirelen, rec.ts_ns).map_err(|d| self.corrupt(d))? {
            Ok(())
        } else {
            Err(self.stale(
                trace,
                format!(
                    "packet {} at byte {} is not the packet the index describes",
                    c.first_packet + i as u64,
                    rec.offset
                ),
            ))
        }
    }

    fn stale(&self, trace: &Path, why: String) -> IndexError {
        IndexError::Stale { index: self.file.path.clone(), trace: trace.to_path_buf(), why }
    }

    /// The trace holds no packet `j` of chunk `c` where the index places it.
    fn misplaced(&self, trace: &Path, c: &ChunkView<'_>, j: usize, why: impl std::fmt::Display) -> IndexError {
        self.stale(trace, format!("no packet {} where the index places it ({why})", c.first_packet + j as u64))
    }

    /// Reads the packets of chunk `ci` at `positions` from the trace held in `data` (memory-mapped), checking
    /// that each is the packet the index describes. `f` gets each packet's index in the trace and its record.
    pub fn read_packets<'d>(
        &self,
        data: &'d [u8],
        seeker: &Seeker,
        trace: &Path,
        ci: usize,
        positions: &[u32],
        f: &mut dyn FnMut(u64, Record<'d>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let c = &self.chunks[ci];
        // The walk: the next record's offset and its position in the chunk.
        let mut at: Option<(u64, usize)> = None;
        let (known, mut memo) = (c.known_many(positions), KeyMemo::default());
        let mut found = Vec::with_capacity(WALKS);
        for (batch, known) in positions.chunks(WALKS).zip(known.chunks(WALKS)) {
            // Found together, or (a pcapng file, or a record on the way that is not whole) one walk at a time
            // below, which says what is wrong.
            let together = self.locate(c, data, seeker, batch, at, &mut found)?;
            if together {
                // Each record's first lines (its header and most packets whole) are asked for before any is read:
                // the reads overlap.
                for &off in &found {
                    for line in 0..PREFETCH_LINES {
                        pcaptool_packet::prefetch(data, off as usize + 64 * line);
                    }
                }
            }
            for (k, (&i, &known)) in batch.iter().zip(known).enumerate() {
                let i = i as usize;
                // Where the walk to packet `i` starts, and the position there.
                let (off, j) = match (together, resume(at, i)) {
                    (true, _) => (found[k], i),
                    (false, Some(at)) => at,
                    (false, None) => (c.block_offset(i / BLOCK).map_err(|d| self.corrupt(d))?, i / BLOCK * BLOCK),
                };
                // The records before packet `i` in its block are only measured on the way.
                let (rec, next) = seeker.nth_record_at(data, off, i - j).map_err(|e| self.misplaced(trace, c, j, e))?;
                at = Some((next, i + 1));
                self.check_read_with(c, i, known, &mut memo, &rec, trace)?;
                f(c.first_packet + i as u64, rec)?;
            }
        }
        Ok(())
    }

    /// Where the records of `batch` (positions in chunk `c`, ascending) are in `data`, into `found`: each walked to
    /// from its block's first record, or from the record before it in its block (`at`: where the last record read
    /// ends and the position after it), the walks taken together by [`Seeker::skip_records_many`], in rounds (a
    /// position waits for the one before it in its block). `false` if a walk could not be finished that way.
    fn locate(
        &self,
        c: &ChunkView<'_>,
        data: &[u8],
        seeker: &Seeker,
        batch: &[u32],
        at: Option<(u64, usize)>,
        found: &mut Vec<u64>,
    ) -> Result<bool, IndexError> {
        const NONE: u64 = u64::MAX;
        found.clear();
        found.resize(batch.len(), NONE);
        let mut walks: Vec<(u64, usize)> = Vec::with_capacity(batch.len());
        let mut whose: Vec<usize> = Vec::with_capacity(batch.len());
        let mut left = batch.len();
        while left > 0 {
            walks.clear();
            whose.clear();
            for (k, &i) in batch.iter().enumerate() {
                let i = i as usize;
                if found[k] != NONE {
                    continue;
                }
                let b = i / BLOCK;
                let walk = match k.checked_sub(1).map(|p| (p, batch[p] as usize)) {
                    // From the record before it in its block, once found (the walk measures that record again).
                    Some((p, before)) if before / BLOCK == b => match found[p] {
                        NONE => continue,
                        from => (from, i - before),
                    },
                    _ => match resume(at, i).filter(|_| k == 0) {
                        Some((from, j)) => (from, i - j),
                        None => (c.block_offset(b).map_err(|d| self.corrupt(d))?, i - b * BLOCK),
                    },
                };
                walks.push(walk);
                whose.push(k);
            }
            if !seeker.skip_records_many(data, &mut walks) {
                return Ok(false);
            }
            for (&(off, n), &k) in walks.iter().zip(&whose) {
                if n != 0 {
                    return Ok(false);
                }
                found[k] = off;
                left -= 1;
            }
        }
        Ok(true)
    }

    /// Reads the packets of chunk `ci` at `positions` (ascending) from the uncompressed trace `file` by `pread`
    /// into `window` (a buffer reused from call to call), checking that each is the packet the index describes.
    /// For a few packets scattered over a large trace this is the cheaper way: each costs a read of a few KiB from
    /// its block's first record, where touching it through a memory map costs a page fault (docs/BENCHMARKS.md).
    /// `f` gets each packet's index in the trace and its record, which borrows `window` until `f` returns.
    #[allow(clippy::too_many_arguments)]
    pub fn read_packets_at(
        &self,
        file: &std::fs::File,
        seeker: &Seeker,
        trace: &Path,
        ci: usize,
        positions: &[u32],
        window: &mut Vec<u8>,
        f: &mut dyn FnMut(u64, Record<'_>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        use pcaptool_packet::Peek;
        use std::os::unix::fs::FileExt;
        let c = &self.chunks[ci];
        let io = |e: std::io::Error| IndexError::io(trace, e);
        // `window` holds the trace's bytes from `start` on.
        let mut start = 0u64;
        window.clear();
        let fill = |window: &mut Vec<u8>, start: &mut u64, from: u64, len: usize| -> Result<(), IndexError> {
            window.resize(len, 0);
            let mut got = 0;
            while got < len {
                match file.read_at(&mut window[got..], from + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io(e)),
                }
            }
            window.truncate(got);
            *start = from;
            Ok(())
        };
        let mut at: Option<(u64, usize)> = None;
        let (known, mut memo) = (c.known_many(positions), KeyMemo::default());
        for (pi, &i) in positions.iter().enumerate() {
            let i = i as usize;
            let b = i / BLOCK;
            let (mut off, mut j) = match resume(at, i) {
                Some(at) => at,
                None => {
                    let (s, e) = self.block_span(ci, b).map_err(|d| self.corrupt(d))?;
                    let span = e.saturating_sub(s) as usize;
                    if s >= start && e <= start + window.len() as u64 {
                        // Read already, with the block before it.
                        (s, b * BLOCK)
                    } else {
                        // One read of the whole block when it is small (a read costs about the same up to a few
                        // KiB, and a second one costs a whole read), and of the blocks right after it that
                        // packets to come are in (a packet's flow often has the next one in the next block);
                        // a large block is read as far as its length divided evenly would place packet `i`, and
                        // a little more (a short read is extended from where the walk stopped).
                        let want = if span <= WHOLE_BLOCK_READ {
                            let mut end = e;
                            let mut last = b;
                            for &k in &positions[pi + 1..] {
                                let kb = k as usize / BLOCK;
                                if kb == last {
                                    continue;
                                }
                                if kb != last + 1 {
                                    break;
                                }
                                let (_, ke) = self.block_span(ci, kb).map_err(|d| self.corrupt(d))?;
                                if ke.saturating_sub(s) > RUN_READ as u64 {
                                    break;
                                }
                                (end, last) = (ke, kb);
                            }
                            end.saturating_sub(s) as usize
                        } else {
                            (span / BLOCK * (i - b * BLOCK + 1) + span / (2 * BLOCK) + 256).min(span)
                        };
                        fill(window, &mut start, s, want.max(256))?;
                        (s, b * BLOCK)
                    }
                }
            };
            loop {
                let inside = off >= start && off <= start + window.len() as u64;
                let peek = if inside { seeker.peek_in(window, start, off) } else { Ok(Peek::Beyond(1)) };
                let peek = peek.map_err(|e| self.misplaced(trace, c, j, e))?;
                match peek {
                    Peek::Record(rec) => {
                        off = rec.offset + u64::from(rec.record_len);
                        j += 1;
                        if j > i {
                            self.check_read_with(c, i, known[pi], &mut memo, &rec, trace)?;
                            f(c.first_packet + i as u64, rec)?;
                            break;
                        }
                    }
                    Peek::Skip(n) => off += n,
                    Peek::Beyond(need) => {
                        let before = (start, window.len());
                        fill(window, &mut start, off, (need as usize).max(2048))?;
                        if (start, window.len()) == before || (window.len() as u64) < need {
                            let end = start + window.len() as u64;
                            return Err(self.misplaced(trace, c, j, format_args!("the trace ends at byte {end}")));
                        }
                    }
                }
            }
            at = Some((off, j));
        }
        Ok(())
    }

    /// Reads every packet of chunk `ci` in order from the trace held in `data` (memory-mapped), starting at the
    /// chunk's first record, so that chunks can be read in parallel (a scan split by the index). The first and
    /// last packets are checked against the index, and the walk must find exactly the chunk's packets, so a
    /// stale index gives an error, not other packets. `f` gets each packet's index in the trace and its record.
    pub fn walk_chunk<'d>(
        &self,
        data: &'d [u8],
        seeker: &Seeker,
        trace: &Path,
        ci: usize,
        f: &mut dyn FnMut(u64, Record<'d>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let c = &self.chunks[ci];
        let check = |i: usize, rec: &Record<'_>| self.check_read(c, i, rec, trace);
        let mut off = c.block_offset(0).map_err(|d| self.corrupt(d))?;
        for i in 0..c.n {
            let rec = seeker.next_record_at(data, off).map_err(|e| self.misplaced(trace, c, i, e))?;
            if i == 0 || i + 1 == c.n {
                check(i, &rec)?;
            }
            off = rec.offset + u64::from(rec.record_len);
            f(c.first_packet + i as u64, rec)?;
        }
        if let Some(next) = self.chunks.get(ci + 1) {
            let next_start = next.block_offset(0).map_err(|d| self.corrupt(d))?;
            if off > next_start {
                return Err(
                    self.stale(trace, format!("chunk of packet {} runs past the next chunk's start", c.first_packet))
                );
            }
        }
        Ok(())
    }

    /// Bytes of the capture stream chunk `ci` spans (from its first record to the next chunk's, or to the end of
    /// what was indexed).
    pub fn chunk_bytes(&self, ci: usize) -> Result<u64, IndexError> {
        let end = match self.chunks.get(ci + 1) {
            Some(n) => n.block_offset(0).map_err(|d| self.corrupt(d))?,
            None => self.file.header.stream_len,
        };
        Ok(end.saturating_sub(self.chunks[ci].block_offset(0).map_err(|d| self.corrupt(d))?))
    }

    /// Checks the trace's content against the index at up to `samples` blocks spread evenly over it: each
    /// sampled block's first record must be where the index places it and be the packet it describes (key, time
    /// and shape). `data` is the whole uncompressed trace. This is how a trace whose modification time changed
    /// (copied, restored from a backup) is recognised as the one indexed, without reading all of it.
    pub fn spot_check(&self, data: &[u8], trace: &Path, samples: usize) -> Result<(), IndexError> {
        let seeker = Seeker::new(data, self.file.structure())
            .map_err(|e| self.stale(trace, format!("its headers are not where the index saw them ({e})")))?
            .with_path(trace);
        let blocks: Vec<usize> = self.chunks.iter().map(|c| c.n.div_ceil(BLOCK)).collect();
        let total: usize = blocks.iter().sum();
        let step = total.div_ceil(samples.max(1)).max(1);
        let (mut ci, mut before) = (0, 0);
        for k in (0..total).step_by(step).chain((total > 0).then(|| total - 1)) {
            while k >= before + blocks[ci] {
                before += blocks[ci];
                ci += 1;
            }
            let (c, b) = (&self.chunks[ci], k - before);
            let off = c.block_offset(b).map_err(|d| self.corrupt(d))?;
            let rec = seeker.next_record_at(data, off).map_err(|e| self.misplaced(trace, c, b * BLOCK, e))?;
            self.check_read(c, b * BLOCK, &rec, trace)?;
        }
        Ok(())
    }

    /// Whether packet `i` of chunk `ci` is `rec`: has the key, time and shape the index gives it (for streamed
    /// traces, read in order).
    pub fn is_record(&self, ci: usize, i: usize, rec: &Record<'_>) -> Result<bool, IndexError> {
        let fields = self.file.header.reading().fields(rec);
        self.chunks[ci].is_packet(i, &fields, rec.wirelen, rec.ts_ns).map_err(|d| self.corrupt(d))
    }
}

impl IndexFile {
    /// The queryable view: every chunk's head checked against the directory; its parts are checked when first
    /// used.
    pub fn view(&self) -> Result<IndexView<'_>, IndexError> {
        let chunks = self
            .dir
            .iter()
            .map(|e| {
                let corrupt = |why: String| IndexError::Corrupt { path: self.path.clone(), offset: e.offset, why };
                let b = &self.bytes.as_slice()[e.offset as usize..(e.offset + e.len) as usize];
                ChunkView::parse(b, e, self.header.version)
                    .map_err(|why| corrupt(format!("chunk of packet {}: {why}", e.first_packet)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IndexView { file: self, chunks })
    }
}
