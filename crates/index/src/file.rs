//! Opening an index: its header and directory checked, the trace it describes checked by identity, and the view
//! (every chunk's head checked against the directory; its parts are checked when first used).

use std::path::{Path, PathBuf};

use pcaptool_packet::MappedFile;

use crate::IndexError;
use crate::format::identity;
use crate::format::{Cursor, HEADER_LEN, Header, HeaderError, crc32};

/// Blocks of a trace read to recognise it when its modification time changed.
const SPOT_CHECKS: usize = 1024;

#[derive(Clone, Copy, Debug)]
pub(crate) struct DirEntry {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) crc: u32,
    pub(crate) packets: u32,
    pub(crate) first_packet: u64,
    pub(crate) t_min: u64,
    pub(crate) t_max: u64,
}

/// An index's bytes: mapped from its file, or given.
#[derive(Debug)]
pub(crate) enum Bytes {
    Mapped(MappedFile),
    Owned(Vec<u8>),
}

impl Bytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.bytes(),
            Bytes::Owned(v) => v,
        }
    }
}

/// An index file mapped into memory, its header and directory checked.
#[derive(Debug)]
pub struct IndexFile {
    pub(crate) path: PathBuf,
    pub(crate) bytes: Bytes,
    pub(crate) header: Header,
    pub(crate) structure: Vec<u64>,
    pub(crate) dir: Vec<DirEntry>,
}

impl IndexFile {
    /// Maps the index at `path` into memory and checks its header and directory (chunks are checked as queries
    /// use them).
    pub fn open(path: &Path) -> Result<IndexFile, IndexError> {
        let map = MappedFile::open(path).map_err(|e| IndexError::io(path, e))?;
        IndexFile::load(path, Bytes::Mapped(map))
    }

    /// Checks the header and directory of index bytes read from `path` (named in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<IndexFile, IndexError> {
        IndexFile::load(path, Bytes::Owned(bytes))
    }

    pub(crate) fn load(path: &Path, owned: Bytes) -> Result<IndexFile, IndexError> {
        let bytes = owned.as_slice();
        let corrupt = |offset: u64, why: String| IndexError::Corrupt { path: path.to_path_buf(), offset, why };
        let header = Header::decode(bytes).map_err(|e| match e {
            HeaderError::Foreign(why) => IndexError::NotIndex { path: path.to_path_buf(), why },
            HeaderError::Version(found) => IndexError::Version { path: path.to_path_buf(), found },
            HeaderError::Damaged(why) => corrupt(0, why),
        })?;
        let dir_start = header.dir_offset;
        let dir_bytes = usize::try_from(dir_start)
            .ok()
            .zip(usize::try_from(header.dir_len).ok())
            .and_then(|(s, l)| bytes.get(s..s.checked_add(l)?))
            .filter(|d| d.len() >= 12 && dir_start >= HEADER_LEN as u64)
            .ok_or_else(|| {
                corrupt(dir_start, format!("the directory ({} bytes) is not inside the file", header.dir_len))
            })?;
        if dir_start + header.dir_len != bytes.len() as u64 {
            return Err(corrupt(dir_start + header.dir_len, "bytes after the directory".into()));
        }
        let (body, stored) = dir_bytes.split_at(dir_bytes.len() - 4);
        if crc32(body) != u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]) {
            return Err(corrupt(dir_start, "directory checksum mismatch".into()));
        }
        let parse = || -> Result<(Vec<u64>, Vec<DirEntry>), String> {
            let mut c = Cursor::new(body);
            let n = c.u32()? as usize;
            c.u32()?;
            let structure = (0..n).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let mut dir = Vec::with_capacity(header.chunks as usize);
            let mut next_offset = HEADER_LEN as u64;
            let mut next_packet = 0u64;
            for i in 0..header.chunks {
                let e = DirEntry {
                    offset: c.u64()?,
                    len: c.u64()?,
                    crc: c.u32()?,
                    packets: c.u32()?,
                    first_packet: c.u64()?,
                    t_min: c.u64()?,
                    t_max: c.u64()?,
                };
                let last = i + 1 == header.chunks;
                if e.offset != next_offset
                    || e.first_packet != next_packet
                    || e.packets == 0
                    || e.packets > header.chunk_packets
                    || (!last && e.packets != header.chunk_packets)
                {
                    return Err(format!("directory entry {i} does not follow the previous chunk"));
                }
                next_offset = e.offset.checked_add(e.len).ok_or("chunk length overflows")?;
                next_packet += u64::from(e.packets);
                dir.push(e);
            }
            if next_offset != dir_start || next_packet != header.packets || !c.is_empty() {
                return Err("the chunks do not tile the file up to the directory".into());
            }
            Ok((structure, dir))
        };
        let (structure, dir) = parse().map_err(|why| corrupt(dir_start, why))?;
        Ok(IndexFile { path: path.to_path_buf(), bytes: owned, header, structure, dir })
    }

    /// The index file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Packets indexed.
    pub fn packets(&self) -> u64 {
        self.header.packets
    }

    /// The earliest and latest timestamps of the indexed packets (ns since the Unix epoch), from the directory;
    /// `None` without packets.
    pub fn time_span(&self) -> Option<(u64, u64)> {
        let t_min = self.dir.iter().map(|d| d.t_min).min()?;
        let t_max = self.dir.iter().map(|d| d.t_max).max()?;
        Some((t_min, t_max))
    }

    /// Bytes of the index file.
    pub fn size_bytes(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Whether the trace is compressed (its packets are then read by streaming it).
    pub fn compressed(&self) -> bool {
        self.header.compression != 0
    }

    /// Whether packets' fields were read by their own link type (version 7 on); older indexes read Ethernet
    /// packets' fields only, and no field of other link types.
    pub fn fields_by_link_type(&self) -> bool {
        self.header.version >= 7
    }

    /// The snapshot length packets were cut to before their fields were read (`u32::MAX`: none).
    pub fn snap(&self) -> u32 {
        self.header.snap
    }

    /// Offset in the capture stream of the damage that ended indexing, if the trace is damaged.
    pub fn damage(&self) -> Option<u64> {
        (self.header.damage != u64::MAX).then_some(self.header.damage)
    }

    /// Offsets of the trace's structures (for [`pcaptool_packet::Seeker::new`]).
    pub fn structure(&self) -> &[u64] {
        &self.structure
    }

    /// Checks that `trace` is the file this index describes, unchanged (length, the checksums of its first and
    /// last 64 KiB, compression) and that packets are cut to the same snapshot length `snap`. When its
    /// modification time differs from the one indexed (a copy, a restore), its content decides: `data`, the
    /// whole trace when it is uncompressed, is spot-checked at sampled blocks against the packets the index
    /// describes ([`IndexView::spot_check`](crate::IndexView::spot_check)); without `data` it is stale.
    pub fn check_trace(
        &self,
        trace: &Path,
        compressed_code: Option<u8>,
        snap: u32,
        data: Option<&[u8]>,
    ) -> Result<(), IndexError> {
        let stale = |why: String| IndexError::Stale { index: self.path.clone(), trace: trace.to_path_buf(), why };
        let (len, mtime, head, tail) = identity(trace)?;
        let h = &self.header;
        if len != h.trace_len {
            return Err(stale(format!("the trace has {len} bytes, the index was built on {}", h.trace_len)));
        }
        if head != h.head_crc || tail != h.tail_crc {
            return Err(stale("the trace's first or last 64 KiB differ from what was indexed".into()));
        }
        if let Some(c) = compressed_code
            && c != h.compression
        {
            return Err(stale("the trace's compression differs".into()));
        }
        if snap != h.snap {
            return Err(stale(format!("packets are cut to {snap} bytes now, to {} when indexed", h.snap)));
        }
        if mtime != h.mtime_ns {
            match data {
                Some(data) => self.view()?.spot_check(data, trace, SPOT_CHECKS)?,
                None => return Err(stale("the trace was modified after it was indexed".into())),
            }
        }
        Ok(())
    }
}
