//! Importing a trace into a store: each segment records the trace it came from (its identity and where its
//! packets start in the store), so that an interrupted import resumes after what was stored, never storing a
//! packet twice, and a trace imported whole is not imported again by mistake.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use pcaptool_packet::{FileFormat, LinkType, TraceReader, TsPrecision, precision_for};
use rustc_hash::FxHashMap;

use crate::error::StoreError;
use crate::ingest::Ingest;
use crate::stage1::{SourceMark, StoreMeta};
use crate::store::{ImportOptions, ImportStats, Store};

/// Bytes read at each end of a trace for its identity.
const IDENTITY_SPAN: u64 = 1 << 20;

/// The identity of the trace file at `path`: its length, and CRC-32Cs of its first and last MiB (of the file as
/// stored: compressed files by their compressed bytes). `None` for what is not a regular file (a pipe, standard
/// input), which cannot be read again.
pub fn trace_identity(path: &Path) -> Result<Option<[u8; 16]>, StoreError> {
    let io = |e| StoreError::io(path, e);
    let meta = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => m,
        _ => return Ok(None),
    };
    let len = meta.len();
    let mut f = File::open(path).map_err(io)?;
    let mut head = vec![0u8; len.min(IDENTITY_SPAN) as usize];
    f.read_exact(&mut head).map_err(io)?;
    let mut tail = vec![0u8; len.min(IDENTITY_SPAN) as usize];
    f.seek(SeekFrom::Start(len - tail.len() as u64)).map_err(io)?;
    f.read_exact(&mut tail).map_err(io)?;
    let mut id = [0u8; 16];
    id[0..8].copy_from_slice(&len.to_le_bytes());
    id[8..12].copy_from_slice(&crc32c::crc32c(&head).to_le_bytes());
    id[12..16].copy_from_slice(&crc32c::crc32c(&tail).to_le_bytes());
    Ok(Some(id))
}

/// What an interrupted import of the same trace left: where its packets start, its first flow id, and the
/// stretches of positions its segments hold, by kind of segment.
#[derive(Debug)]
struct Resume {
    seq0: u64,
    flow0: u64,
    /// Per kind of segment, the stretches of positions held, sorted.
    held: FxHashMap<(LinkType, bool), Vec<(u64, u64)>>,
}

impl Resume {
    /// Whether the packet at position `seq`, of kind `kind`, is stored already (a binary search: a trace of
    /// thousands of segments is resumed at the speed of reading it).
    fn holds(&self, kind: (LinkType, bool), seq: u64) -> bool {
        let Some(v) = self.held.get(&kind) else { return false };
        let i = v.partition_point(|&(lo, _)| lo <= seq);
        i > 0 && v[i - 1].1 >= seq
    }
}

impl Store {
    /// Decides how to import the trace of identity `id`: as new packets (`None`), resuming an interrupted import
    /// of it, or not at all (it is in the store whole, or its interrupted import cannot be resumed in order).
    fn plan_import(&self, trace: &Path, id: &[u8; 16], opts: &ImportOptions) -> Result<Option<Resume>, StoreError> {
        let mine: Vec<_> = self.segments.iter().filter(|s| s.stage1.source.is_some_and(|m| m.id == *id)).collect();
        if mine.is_empty() || opts.allow_duplicates {
            return Ok(None);
        }
        let mut segments: Vec<u32> = mine.iter().map(|s| s.stage1.number).collect();
        segments.sort_unstable();
        let marks: Vec<SourceMark> = mine.iter().filter_map(|s| s.stage1.source).collect();
        let ends = marks.iter().map(|m| m.ends).max().unwrap_or(0);
        if ends > 0 && marks.iter().filter(|m| m.ends > 0).count() >= ends as usize {
            return Err(StoreError::AlreadyImported { trace: trace.to_path_buf(), segments });
        }
        // Interrupted: resumable when nothing was stored after it and its marks agree.
        let (seq0, flow0) = (marks[0].seq0, marks[0].flow0);
        let later = self.segments.iter().any(|s| {
            s.stage1.source.is_none_or(|m| m.id != *id) && (s.stage1.seq_max >= seq0 || s.stage1.flow_max >= flow0)
        });
        if later || marks.iter().any(|m| m.seq0 != seq0 || m.flow0 != flow0) || !self.damaged().is_empty() {
            let stored_after = self.damaged().is_empty();
            return Err(StoreError::CannotResume { trace: trace.to_path_buf(), segments, stored_after });
        }
        let mut held: FxHashMap<(LinkType, bool), Vec<(u64, u64)>> = FxHashMap::default();
        for s in &mine {
            held.entry((s.stage1.linktype, s.stage1.swapped)).or_default().push((s.stage1.seq_min, s.stage1.seq_max));
        }
        held.values_mut().for_each(|v| v.sort_unstable());
        Ok(Some(Resume { seq0, flow0, held }))
    }

    /// Imports `trace` after what the store holds (which must be open for writing). Memory holds at most one
    /// segment's packets per kind of segment; each segment is complete on disk when it becomes visible.
    /// `progress` gets the stream offset reached.
    ///
    /// Each segment records the trace's identity ([`trace_identity`]). A trace whose import was interrupted
    /// (a crash, a full disk) resumes: the packets already stored are left out, the rest take the positions and
    /// flow ids they would have had. A trace the store holds whole is refused unless `opts.allow_duplicates`.
    /// After the import, `opts.max_size` removes the oldest segments, never those just written: a store still
    /// over the size is reported in [`ImportStats::over_max_size`].
    pub fn import(
        &mut self,
        trace: &Path,
        opts: &ImportOptions,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportStats, StoreError> {
        self.writable()?;
        let id = trace_identity(trace)?;
        let resume = match &id {
            Some(id) => self.plan_import(trace, id, opts)?,
            None => None,
        };
        let mut reader = TraceReader::open(trace)?;
        reader.read_header()?;
        let precision = match reader.format() {
            Some(FileFormat::Pcap { precision, .. }) => precision,
            _ => reader.interfaces().first().map_or(TsPrecision::Micro, |i| precision_for(i.tsresol)),
        };
        let swapped = match reader.format() {
            Some(FileFormat::Pcap { big_endian, .. }) | Some(FileFormat::PcapNg { big_endian }) => {
                big_endian != cfg!(target_endian = "big")
            }
            _ => false,
        };
        let mut ingest = self.ingest(opts)?;
        if let Some(r) = &resume {
            ingest.restart_flows_at(r.flow0);
        }
        let seq0 = resume.as_ref().map_or(ingest.seq, |r| r.seq0);
        ingest.source = id.map(|id| SourceMark { id, seq0, flow0: ingest.first_flow(), ends: 0 });
        let first_number = ingest.first_number();
        let (damage, already_stored) = feed(&mut reader, &mut ingest, precision, swapped, resume.as_ref(), progress)?;
        let (packets, segments) = ingest.finish()?;
        let mut stats = ImportStats { packets, segments, damage, already_stored, ..ImportStats::default() };
        if let Some(max) = opts.max_size {
            let (removed, size) = self.retain_size(max, first_number)?;
            stats.removed = removed;
            stats.over_max_size = (size > max).then_some(size);
        }
        Ok(stats)
    }
}

/// Pushes every record of `reader` into `ingest` (those `resume` says are stored, only through flow tracking);
/// returns the damage that ended the trace early, if any, and the packets left out.
fn feed(
    reader: &mut TraceReader,
    ingest: &mut Ingest<'_>,
    precision: TsPrecision,
    swapped: bool,
    resume: Option<&Resume>,
    progress: &mut dyn FnMut(u64),
) -> Result<(Option<pcaptool_packet::TraceError>, u64), StoreError> {
    let mut last_report = 0u64;
    // Snapshot length and name per interface, learnt at each interface's first packet.
    let mut ifaces: Vec<Option<(u32, String)>> = Vec::new();
    let mut copy = Vec::new();
    let (mut i, mut left_out) = (0u64, 0u64);
    loop {
        let rec = match reader.next_record() {
            None => return Ok((None, left_out)),
            Some(Err(e)) => return Ok((Some(e), left_out)),
            Some(Ok(r)) => r,
        };
        let (ts_ns, wirelen, linktype, offset, iface) = (rec.ts_ns, rec.wirelen, rec.linktype, rec.offset, rec.iface);
        let at = iface as usize;
        let data = if ifaces.get(at).is_some_and(Option::is_some) {
            rec.data
        } else {
            // The record borrows the reader: keep its bytes while asking the reader for the interface.
            copy.clear();
            copy.extend_from_slice(rec.data);
            let (snap, name) = reader.interfaces().get(at).map_or((0, None), |f| (f.snaplen, f.name.clone()));
            if ifaces.len() <= at {
                ifaces.resize(at + 1, None);
            }
            ifaces[at] = Some((if snap == 0 { 262_144 } else { snap }, name.unwrap_or_default()));
            &copy[..]
        };
        let (snaplen, name) = ifaces[at].as_ref().map_or((262_144, ""), |(s, n)| (*s, n.as_str()));
        let meta = StoreMeta { linktype, snaplen, precision, swapped, iface };
        match resume {
            Some(r) if r.holds((linktype, swapped), r.seq0 + i) => {
                ingest.account_only(meta, ts_ns, wirelen, data);
                left_out += 1;
            }
            Some(r) => {
                ingest.seq = r.seq0 + i;
                ingest.push(meta, name, ts_ns, wirelen, data)?;
            }
            None => ingest.push(meta, name, ts_ns, wirelen, data)?,
        }
        i += 1;
        if offset >= last_report + (1 << 24) {
            last_report = offset;
            progress(offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A position is held exactly when a stretch of its kind covers it, wherever the stretches are.
    #[test]
    fn resume_holds_the_stretches_of_its_kind() {
        let eth = (LinkType::ETHERNET, false);
        let raw = (LinkType(101), false);
        let mut held = FxHashMap::default();
        held.insert(eth, vec![(0, 9), (20, 29), (40, 40)]);
        held.insert(raw, vec![(10, 19)]);
        let r = Resume { seq0: 0, flow0: 0, held };
        let naive = |kind: (LinkType, bool), seq: u64| {
            r.held.get(&kind).is_some_and(|v| v.iter().any(|&(lo, hi)| (lo..=hi).contains(&seq)))
        };
        for seq in 0..50 {
            for kind in [eth, raw, (LinkType(1), true)] {
                assert_eq!(r.holds(kind, seq), naive(kind, seq), "{kind:?} {seq}");
            }
        }
    }
}
