//! Checking a store whole (`verify`) and setting its damaged segments aside (`repair`).

use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::segment::Segment;
use crate::store::{DamagedSegment, QUARANTINE, Store};

/// What [`Store::verify`] found of one segment.
#[derive(Clone, Debug)]
pub struct SegmentCheck {
    /// Its number.
    pub number: u32,
    /// Its data file.
    pub data: PathBuf,
    /// Packets and data bytes its index describes (0 when it cannot be read).
    pub packets: u64,
    /// See `packets`.
    pub bytes: u64,
    /// Whether its packet data has checksums (a version 2 segment has none: only its structure is checked).
    pub checksummed: bool,
    /// Its damage, if any.
    pub damage: Option<DamagedSegment>,
}

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Every segment, by number.
    pub segments: Vec<SegmentCheck>,
    /// Files of unfinished segments (see [`Store::leftovers`]).
    pub leftovers: Vec<PathBuf>,
    /// Segments in the quarantine folder.
    pub quarantined: u32,
}

impl VerifyReport {
    /// The damaged segments.
    pub fn damaged(&self) -> impl Iterator<Item = &DamagedSegment> {
        self.segments.iter().filter_map(|s| s.damage.as_ref())
    }
}

/// Checks everything of segment `seg`: stage 2's every part, the data file's header, every data block against
/// its checksum and every record against the flow it belongs to; returns the bytes checked.
fn check_segment(seg: &Segment) -> Result<(), StoreError> {
    let s1 = &seg.stage1;
    let s2 = seg.stage2()?;
    let entries = s2.check_all()?;
    // Every block checked (and decompressed, if compressed).
    let data = seg.read_all()?;
    let b = data.bytes();
    let bad = |offset: u64, why: String| StoreError::Corrupt { path: seg.data.clone(), offset, why };
    let le = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if b.len() < 24 || le(0) != 0xa1b2_3c4d || le(4) != 0x0004_0002 {
        return Err(bad(0, "not a nanosecond pcap file of version 2.4".into()));
    }
    if le(16) != s1.snaplen || le(20) != s1.linktype.0 {
        return Err(bad(
            16,
            format!(
                "snapshot length {} and link type {}, its index says {} and {}",
                le(16),
                le(20),
                s1.snaplen,
                s1.linktype.0
            ),
        ));
    }
    let mut packets = 0u64;
    for e in entries.iter().filter(|e| e.packets > 0) {
        let span = usize::try_from(e.data_offset)
            .ok()
            .and_then(|from| b.get(from..from.checked_add(usize::try_from(e.data_len).ok()?)?))
            .ok_or_else(|| bad(b.len() as u64, format!("flow {} lies past the end of the data", e.flow.id)))?;
        let (seqs, ifaces) = s2.positions_and_ifaces(e)?;
        let recs = seg.records(e, &seqs, &ifaces, span)?;
        if let Some(r) = recs.iter().find(|r| r.seq < s1.seq_min || r.seq > s1.seq_max) {
            return Err(bad(
                e.data_offset,
                format!("a packet at position {} outside the segment's {}..={}", r.seq, s1.seq_min, s1.seq_max),
            ));
        }
        packets += recs.len() as u64;
    }
    if packets != s1.packets {
        return Err(bad(0, format!("{packets} packets in its flows, its index says {}", s1.packets)));
    }
    Ok(())
}

impl Store {
    /// Checks every segment whole (its index's every part, every byte of its data against its checksums, every
    /// record against its flow), the segments that could not be opened included; `progress` gets the bytes of
    /// data checked so far. Changes nothing.
    pub fn verify(&self, progress: &mut dyn FnMut(u64)) -> VerifyReport {
        let mut report = VerifyReport {
            leftovers: self.leftovers().to_vec(),
            quarantined: self.quarantined(),
            ..VerifyReport::default()
        };
        let mut done = 0u64;
        for seg in self.segments() {
            let damage = check_segment(seg).err().map(|e| DamagedSegment::of(seg.stage1.number, &e, &seg.index));
            done += seg.stage1.bytes;
            progress(done);
            report.segments.push(SegmentCheck {
                number: seg.stage1.number,
                data: seg.data.clone(),
                packets: seg.stage1.packets,
                bytes: seg.stage1.bytes,
                checksummed: seg.stage1.checksum_block().is_some(),
                damage,
            });
        }
        for d in self.damaged() {
            report.segments.push(SegmentCheck {
                number: d.number,
                data: crate::store::data_files(self.dir(), d.number)
                    .ok()
                    .and_then(|v| v.into_iter().next())
                    .unwrap_or_else(|| crate::format::segment_paths(self.dir(), d.number).0),
                packets: 0,
                bytes: 0,
                checksummed: false,
                damage: Some(d.clone()),
            });
        }
        report.segments.sort_by_key(|s| s.number);
        report
    }

    /// Sets the damaged segments aside: checks every segment as [`verify`](Self::verify) does and moves the
    /// files of each damaged one into the store's `quarantine` folder (nothing is deleted), so that queries
    /// answer from the others; returns what it moved, and why. Needs the store open for writing (whose
    /// opening already removed the files of unfinished segments: [`repairs`](Self::repairs)).
    pub fn repair(&mut self, progress: &mut dyn FnMut(u64)) -> Result<Vec<DamagedSegment>, StoreError> {
        self.writable()?;
        let report = self.verify(progress);
        let damaged: Vec<DamagedSegment> = report.damaged().cloned().collect();
        if damaged.is_empty() {
            return Ok(damaged);
        }
        let q = self.dir().join(QUARANTINE);
        std::fs::create_dir_all(&q).map_err(|e| StoreError::io(&q, e))?;
        for d in &damaged {
            let index = crate::format::segment_paths(self.dir(), d.number).1;
            // The index first: without it, what is left is out of the store; then its data files (the one it
            // names, and any left by an interrupted recompression).
            move_into(&index, &q)?;
            for p in crate::store::data_files(self.dir(), d.number)? {
                move_into(&p, &q)?;
            }
            self.segments.retain(|s| s.stage1.number != d.number);
        }
        self.forget_damaged();
        for d in [self.dir(), &q] {
            if let Ok(f) = std::fs::File::open(d) {
                let _ = f.sync_all();
            }
        }
        Ok(damaged)
    }
}

/// Moves `p` (if it exists) into the folder `q`, keeping its name.
fn move_into(p: &Path, q: &Path) -> Result<(), StoreError> {
    let Some(name) = p.file_name() else { return Ok(()) };
    match std::fs::rename(p, q.join(name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(p, e)),
    }
}
