//! A segment's first stage (docs/format/segment.md): what its packets are, its time and position ranges, the
//! Bloom filters that rule it out without reading further, its interfaces, the trace it came from, and where its
//! packet data's checksums are. Kept in memory for every segment of an open store.

use pcaptool_packet::{Field, LinkType, Need, Pred, TsPrecision};

use crate::blocks::{Codec, ENTRY_BYTES};
use crate::bloom::Bloom;
use crate::codec::Rd;
use crate::format::data_file_name;

/// What a packet of a store is: its link type, snapshot length, timestamp precision and byte order, and the
/// interface it came from. Segments group packets by link type and byte order (the pcap data file has one link
/// type; libpcap reads a few link-layer fields in the capture's byte order); a segment's interfaces carry the rest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct StoreMeta {
    /// Link type of every packet.
    pub linktype: LinkType,
    /// Snapshot length of the source.
    pub snaplen: u32,
    /// Timestamp precision of the source (query output is written with it, as tcpdump would).
    pub precision: TsPrecision,
    /// Whether the source was written in the other byte order than this machine's (libpcap's filters read a
    /// few link-layer fields, such as DLT_NULL's family, in the capture's byte order; packets are kept as they
    /// were).
    pub swapped: bool,
    /// The interface the packets came from: its index in the source pcapng file (0 for pcap), or in a
    /// capture's list of interfaces. Query output keeps interfaces apart.
    pub iface: u32,
}

/// An interface whose packets a segment holds (a segment holds those of up to 65,536 interfaces of one link
/// type and byte order).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SegmentIface {
    /// Its index in the source (see [`StoreMeta::iface`]).
    pub iface: u32,
    /// Its snapshot length.
    pub snaplen: u32,
    /// Its timestamp precision.
    pub precision: TsPrecision,
    /// Its name (UTF-8, at most 255 bytes; empty if unknown).
    pub name: String,
}

/// Where a segment's packets came from: a trace imported into the store, so that an interrupted import resumes
/// after what was stored and a complete one is not imported twice.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SourceMark {
    /// The trace's identity: its length and a hash of its first and last MiB (see `Store::import`).
    pub id: [u8; 16],
    /// The store position given to the trace's first packet (its packet `i` is at `seq0 + i`).
    pub seq0: u64,
    /// The first flow id the import gave.
    pub flow0: u64,
    /// 0, or how many segments the import closed when it reached the trace's end (this one among them): the
    /// import is complete once that many such segments are in the store.
    pub ends: u32,
}

/// The flow ids a segment holds: a Bloom filter of them (formats 2 and 3), or the ids themselves as runs of
/// consecutive ids, increasing (format 4: exact, and on real traffic a tenth of the filter's size, as a segment's
/// new flows take consecutive ids).
#[derive(Clone, Debug)]
pub(crate) enum FlowIds {
    Bloom(Bloom),
    /// First and last id of each run.
    Runs(Vec<(u64, u64)>),
}

impl FlowIds {
    /// The runs of `ids` (increasing).
    pub(crate) fn runs(ids: impl IntoIterator<Item = u64>) -> FlowIds {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for id in ids {
            match runs.last_mut() {
                Some(r) if r.1.checked_add(1) == Some(id) => r.1 = id,
                _ => runs.push((id, id)),
            }
        }
        FlowIds::Runs(runs)
    }

    fn may_contain(&self, id: u64) -> bool {
        match self {
            FlowIds::Bloom(b) => b.may_contain(&id.to_le_bytes()),
            FlowIds::Runs(r) => {
                let i = r.partition_point(|&(first, _)| first <= id);
                i > 0 && r[i - 1].1 >= id
            }
        }
    }

    /// Format 4's encoding: the number of runs (u32), then per run the gap from the previous run's end (from 0
    /// for the first) and its length less one, as varints.
    fn encode(&self, o: &mut Vec<u8>) {
        let FlowIds::Runs(runs) = self else { return };
        o.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        let mut next = 0u64;
        for &(first, last) in runs {
            crate::codec::put_varint(o, first - next);
            crate::codec::put_varint(o, last - first);
            next = last.saturating_add(1);
        }
    }

    fn decode(r: &mut Rd<'_>, flows: u32) -> Result<FlowIds, String> {
        let n = r.u32()?;
        if n > flows {
            return Err(format!("{n} runs of flow ids for {flows} flows"));
        }
        let mut runs = Vec::with_capacity(n as usize);
        let (mut next, mut count) = (0u64, 0u64);
        for _ in 0..n {
            let mut at = r.at;
            let gap = crate::codec::get_varint(r.b, &mut at).ok_or("flow id runs truncated")?;
            let len = crate::codec::get_varint(r.b, &mut at).ok_or("flow id runs truncated")?;
            r.at = at;
            let first = next.checked_add(gap).ok_or("flow ids overflow")?;
            let last = first.checked_add(len).ok_or("flow ids overflow")?;
            if !runs.is_empty() && gap == 0 {
                return Err("flow id runs not apart".into());
            }
            count = count.saturating_add(len + 1);
            runs.push((first, last));
            next = last.saturating_add(1);
        }
        if count != u64::from(flows) {
            return Err(format!("flow id runs of {count} ids for {flows} flows"));
        }
        Ok(FlowIds::Runs(runs))
    }
}

/// A segment's first stage: kept in memory for every segment of a store.
#[derive(Clone, Debug)]
pub struct Stage1 {
    /// The index's format version (2 to 7).
    pub version: u16,
    /// The segment's number.
    pub number: u32,
    /// Link type of its packets.
    pub linktype: LinkType,
    /// Whether its packets came in the other byte order than this machine's (see [`StoreMeta::swapped`]).
    pub swapped: bool,
    /// Snapshot length of the data file (the largest of its interfaces').
    pub snaplen: u32,
    /// Its interfaces (at least one); a packet names its own by index.
    pub ifaces: Vec<SegmentIface>,
    /// Packets.
    pub packets: u64,
    /// Bytes of the data file.
    pub bytes: u64,
    /// Flows (parts of flows: a flow spans segments).
    pub flows: u32,
    /// Earliest and latest timestamp.
    pub t_min: u64,
    /// See `t_min`.
    pub t_max: u64,
    /// First and last position in the store's original order.
    pub seq_min: u64,
    /// See `seq_min`.
    pub seq_max: u64,
    /// Smallest and largest flow id.
    pub flow_min: u64,
    /// See `flow_min`.
    pub flow_max: u64,
    /// Whether the packets' header fields are not read (a link type without fields a filter reads positionally):
    /// the Bloom filters then rule nothing out. Before format 4, also set by packets cut short.
    pub unknown_fields: bool,
    /// The trace the packets were imported from (`None` for a capture or a stream).
    pub source: Option<SourceMark>,
    pub(crate) addr_bloom: Bloom,
    pub(crate) port_bloom: Bloom,
    pub(crate) ids: FlowIds,
    pub(crate) stage2_len: u64,
    pub(crate) positions_len: u64,
    /// log2 of the data checksum block size (0: no checksums, a version 2 segment).
    pub(crate) block_log2: u8,
    /// CRC-32 of the checksum part.
    pub(crate) sums_crc: u32,
    /// Where stage 2 starts in the index file.
    pub(crate) stage2_at: u64,
    /// How the packet data is stored (plain pcap before version 7).
    pub codec: Codec,
    /// The data file's generation: 0 as written, one more at each recompression (it is part of the file's name,
    /// so that a recompressed segment's data never replaces the file a reader has open).
    pub generation: u32,
    /// Blocks of compressed data (0 for plain data).
    pub(crate) n_blocks: u32,
    /// Bytes of the data file as stored (`bytes` for plain data, less when compressed).
    pub stored_bytes: u64,
    /// Whether the data is deduplicated (its stored data begins `PTDD` instead of the pcap magic).
    pub dedup: bool,
    /// Raw bytes left out of the stored data as copies of earlier bytes, and the elisions that say so.
    pub elided_bytes: u64,
    pub(crate) n_elisions: u32,
    pub(crate) elisions_len: u32,
}

fn precision_code(p: TsPrecision) -> u8 {
    match p {
        TsPrecision::Micro => 0,
        TsPrecision::Nano => 1,
    }
}

fn precision_of(code: u8) -> Result<TsPrecision, String> {
    match code {
        0 => Ok(TsPrecision::Micro),
        1 => Ok(TsPrecision::Nano),
        p => Err(format!("precision code {p}")),
    }
}

impl Stage1 {
    /// The full kind of the packets of interface `i` of the segment (`i` below `ifaces.len()`).
    pub fn meta(&self, i: usize) -> StoreMeta {
        let f = &self.ifaces[i];
        StoreMeta {
            linktype: self.linktype,
            snaplen: f.snaplen,
            precision: f.precision,
            swapped: self.swapped,
            iface: f.iface,
        }
    }

    /// Each interface's kind of packet, with its name.
    pub fn metas(&self) -> impl Iterator<Item = (StoreMeta, &str)> + '_ {
        (0..self.ifaces.len()).map(|i| (self.meta(i), self.ifaces[i].name.as_str()))
    }

    /// Bits of a packet's interface index in its position (0 with one interface).
    pub(crate) fn iface_bits(&self) -> u32 {
        iface_bits(self.ifaces.len())
    }

    /// Bytes of the data checksum block (`None` for a version 2 segment, which has none).
    pub fn checksum_block(&self) -> Option<u64> {
        (self.block_log2 != 0).then(|| 1u64 << self.block_log2)
    }

    /// Checksums of the data file: one per block (plain data).
    pub(crate) fn sums_count(&self) -> u64 {
        if self.codec.is_compressed() {
            return 0;
        }
        self.checksum_block().map_or(0, |b| self.bytes.div_ceil(b))
    }

    /// Bytes of the index's last part: the data checksums of plain data, or the block directory of compressed
    /// data.
    pub(crate) fn map_bytes(&self) -> u64 {
        if self.codec.is_compressed() {
            u64::from(self.n_blocks) * ENTRY_BYTES as u64 + u64::from(self.elisions_len)
        } else {
            4 * self.sums_count()
        }
    }

    /// Whether deduplicated data's elisions carry checkpoints (format 9 on): then `sums_crc` covers the block
    /// directory and the checkpoints, not the elisions' varints, each chunk of which has its CRC in its checkpoint,
    /// so that a reader reads only the chunks it needs.
    pub(crate) fn checkpointed(&self) -> bool {
        self.version >= 9
    }

    /// The CRC-32 of the index's last part `part` that stage 1 holds (`sums_crc`): of the whole part, or, of
    /// [checkpointed](Self::checkpointed) deduplicated data, of the block directory and the checkpoints (see
    /// [`directory_crc`](Self::directory_crc)).
    pub(crate) fn part_crc(&self, part: &[u8]) -> u32 {
        if !(self.checkpointed() && self.dedup) {
            return crc32fast::hash(part);
        }
        let table = crate::dedup::checkpoint_bytes(self.n_elisions as usize, true);
        let dir = (self.n_blocks as usize * ENTRY_BYTES).min(part.len());
        Stage1::directory_crc(&part[..dir], &part[part.len().saturating_sub(table).max(dir)..])
    }

    /// `sums_crc` of checkpointed deduplicated data: the CRC-32 of its block directory `dir` followed by its
    /// elisions' checkpoints `table`.
    pub(crate) fn directory_crc(dir: &[u8], table: &[u8]) -> u32 {
        let mut crc = crc32fast::Hasher::new();
        crc.update(dir);
        crc.update(table);
        crc.finalize()
    }

    /// The data file's name: `seg-NNNNNN.pcap` as first written plain, with the generation after the number once
    /// recompressed, and the compressor's suffix when compressed (`seg-000003.pcap.zst`, `seg-000003.2.pcap.lz4`).
    pub fn data_file_name(&self) -> String {
        data_file_name(self.number, self.generation, self.codec)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        o.extend_from_slice(&self.number.to_le_bytes());
        o.extend_from_slice(&self.linktype.0.to_le_bytes());
        o.extend_from_slice(&self.snaplen.to_le_bytes());
        o.push(u8::from(self.unknown_fields));
        o.push(u8::from(self.swapped));
        o.push(self.block_log2);
        o.push(0);
        for v in [self.packets, self.bytes, u64::from(self.flows), self.t_min, self.t_max, self.seq_min, self.seq_max] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.flow_min, self.flow_max, self.stage2_len, self.positions_len] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        let id_bloom = match &self.ids {
            FlowIds::Bloom(b) => Some(b),
            FlowIds::Runs(_) => None,
        };
        for b in [Some(&self.addr_bloom), Some(&self.port_bloom), id_bloom].into_iter().flatten() {
            o.extend_from_slice(&b.k().to_le_bytes());
            o.extend_from_slice(&(b.words().len() as u32).to_le_bytes());
            for w in b.words() {
                o.extend_from_slice(&w.to_le_bytes());
            }
        }
        self.ids.encode(&mut o);
        o.extend_from_slice(&self.sums_crc.to_le_bytes());
        o.extend_from_slice(&(self.ifaces.len() as u32).to_le_bytes());
        for f in &self.ifaces {
            o.extend_from_slice(&f.iface.to_le_bytes());
            o.extend_from_slice(&f.snaplen.to_le_bytes());
            o.push(precision_code(f.precision));
            o.push(f.name.len() as u8);
            o.extend_from_slice(f.name.as_bytes());
        }
        match &self.source {
            None => o.push(0),
            Some(s) => {
                o.push(16);
                o.extend_from_slice(&s.id);
                o.extend_from_slice(&s.seq0.to_le_bytes());
                o.extend_from_slice(&s.flow0.to_le_bytes());
                o.extend_from_slice(&s.ends.to_le_bytes());
            }
        }
        o.push(self.codec.id());
        o.push(self.codec.level());
        o.push(u8::from(self.dedup));
        o.extend_from_slice(&self.generation.to_le_bytes());
        o.extend_from_slice(&self.n_blocks.to_le_bytes());
        o.extend_from_slice(&self.stored_bytes.to_le_bytes());
        o.extend_from_slice(&self.elided_bytes.to_le_bytes());
        o.extend_from_slice(&self.n_elisions.to_le_bytes());
        o.extend_from_slice(&self.elisions_len.to_le_bytes());
        o
    }

    /// Decodes a stage 1 body of format `version` (2 to 7).
    pub(crate) fn decode(b: &[u8], version: u16) -> Result<Stage1, String> {
        let mut r = Rd { b, at: 0 };
        let number = r.u32()?;
        let linktype = LinkType(r.u32()?);
        let snaplen = r.u32()?;
        let flag = |r: &mut Rd<'_>, what: &str| match r.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(format!("{what} flag {x}")),
        };
        // Version 2: precision, unknown fields, byte order, zero; version 3: unknown fields, byte order, block
        // size, zero (precision is per interface).
        let v2_precision = if version == 2 { Some(precision_of(r.u8()?)?) } else { None };
        let unknown_fields = r.u8()? != 0;
        let swapped = flag(&mut r, "byte-order")?;
        let block_log2 = if version == 2 { 0 } else { r.u8()? };
        if version == 2 {
            r.take(1)?;
        } else if r.u8()? != 0 || !(block_log2 == 0 || (9..=30).contains(&block_log2)) {
            return Err(format!("checksum block size 2^{block_log2}"));
        }
        let packets = r.u64()?;
        let bytes = r.u64()?;
        let flows = u32::try_from(r.u64()?).map_err(|_| "flow count")?;
        let (t_min, t_max, seq_min, seq_max) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (flow_min, flow_max, stage2_len, positions_len) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let bloom = |r: &mut Rd<'_>| -> Result<Bloom, String> {
            let k = r.u32()?;
            let n = r.u32()? as usize;
            let words = r.take(n.checked_mul(8).ok_or("bloom size")?)?;
            let bits = words.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
            Bloom::from_parts(k, bits).ok_or_else(|| "a Bloom filter without bits or probes".to_string())
        };
        let addr_bloom = bloom(&mut r)?;
        let port_bloom = bloom(&mut r)?;
        let ids = if version >= 4 { FlowIds::decode(&mut r, flows)? } else { FlowIds::Bloom(bloom(&mut r)?) };
        let name = |r: &mut Rd<'_>| -> Result<String, String> {
            let len = r.u8()? as usize;
            String::from_utf8(r.take(len)?.to_vec()).map_err(|_| "interface name not UTF-8".to_string())
        };
        let (sums_crc, ifaces, source) = match v2_precision {
            Some(precision) => {
                let iface = r.u32()?;
                let name = name(&mut r)?;
                (0, vec![SegmentIface { iface, snaplen, precision, name }], None)
            }
            None => {
                let sums_crc = r.u32()?;
                let n = r.u32()? as usize;
                if n == 0 || n > 1 << 16 || n > r.b.len() {
                    return Err(format!("{n} interfaces"));
                }
                let mut ifaces = Vec::with_capacity(n);
                for _ in 0..n {
                    let (iface, snaplen) = (r.u32()?, r.u32()?);
                    let precision = precision_of(r.u8()?)?;
                    ifaces.push(SegmentIface { iface, snaplen, precision, name: name(&mut r)? });
                }
                let source = match r.u8()? {
                    0 => None,
                    16 => {
                        let mut id = [0u8; 16];
                        id.copy_from_slice(r.take(16)?);
                        Some(SourceMark { id, seq0: r.u64()?, flow0: r.u64()?, ends: r.u32()? })
                    }
                    n => return Err(format!("a source identity of {n} bytes")),
                };
                (sums_crc, ifaces, source)
            }
        };
        // Version 7: how the data is stored.
        let (codec, dedup, generation, n_blocks, stored_bytes, elided_bytes, n_elisions, elisions_len) = if version >= 7
        {
            let codec = Codec::from_parts(r.u8()?, r.u8()?)?;
            let dedup = flag(&mut r, "deduplication")?;
            let (generation, n_blocks, stored) = (r.u32()?, r.u32()?, r.u64()?);
            let (elided, n_elisions, elisions_len) = (r.u64()?, r.u32()?, r.u32()?);
            // Compressed data is in blocks (the pcap header is one at least); plain data in none, and never
            // deduplicated.
            if codec.is_compressed() != (n_blocks > 0) {
                return Err(format!("{codec} data in {n_blocks} blocks"));
            }
            if !dedup && (elided, n_elisions, elisions_len) != (0, 0, 0) || dedup && !codec.is_compressed() {
                return Err(format!("{codec} data, deduplicated: {dedup}, with {n_elisions} elisions"));
            }
            if elided > bytes.saturating_sub(24) {
                return Err(format!("{elided} bytes elided of {bytes}"));
            }
            (codec, dedup, generation, n_blocks, stored, elided, n_elisions, elisions_len)
        } else {
            (Codec::None, false, 0, 0, bytes, 0, 0, 0)
        };
        if !codec.is_compressed() && stored_bytes != bytes {
            return Err(format!("plain data of {bytes} bytes stored in {stored_bytes}"));
        }
        if r.at != b.len() {
            return Err("bytes after stage 1".into());
        }
        Ok(Stage1 {
            version,
            number,
            linktype,
            swapped,
            snaplen,
            ifaces,
            packets,
            bytes,
            flows,
            t_min,
            t_max,
            seq_min,
            seq_max,
            flow_min,
            flow_max,
            unknown_fields,
            source,
            addr_bloom,
            port_bloom,
            ids,
            stage2_len,
            positions_len,
            block_log2,
            sums_crc,
            stage2_at: 0,
            codec,
            generation,
            n_blocks,
            stored_bytes,
            dedup,
            elided_bytes,
            n_elisions,
            elisions_len,
        })
    }

    /// Bytes of the index beyond stage 1 (flow table, sorted arrays, positions, data checksums).
    pub fn stage2_bytes(&self) -> u64 {
        self.stage2_len + self.positions_len + self.map_bytes()
    }

    /// Bytes of the whole index file.
    pub fn index_bytes(&self) -> u64 {
        self.stage2_at + self.stage2_bytes()
    }

    /// Bytes of the original-order positions (the rest of the index is the flow index proper).
    pub fn positions_bytes(&self) -> u64 {
        self.positions_len
    }

    /// Whether the segment may hold packets of flow `id` (its id range and a Bloom filter of its flow ids).
    pub fn may_hold_flow(&self, id: u64) -> bool {
        (self.flow_min..=self.flow_max).contains(&id) && self.ids.may_contain(id)
    }

    /// Whether the segment may hold a packet satisfying `need` (false only when it cannot).
    pub fn may_match(&self, need: &Need) -> bool {
        need_may(need, &|p| self.pred_may(p))
    }

    fn pred_may(&self, p: &Pred) -> bool {
        let exact = p.mask == u128::MAX && p.lo == p.hi;
        match p.field {
            Field::Time => p.mask != u128::MAX || (p.lo <= u128::from(self.t_max) && u128::from(self.t_min) <= p.hi),
            _ if self.unknown_fields => true,
            Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa if exact => {
                self.addr_bloom.may_contain(&(p.lo as u32).to_be_bytes())
            }
            Field::Ip6Src | Field::Ip6Dst if exact => self.addr_bloom.may_contain(&p.lo.to_be_bytes()),
            Field::SrcPort | Field::DstPort if p.mask == u128::MAX && p.hi.saturating_sub(p.lo) < 16 => {
                (p.lo..=p.hi.min(0xffff)).any(|v| self.port_bloom.may_contain(&(v as u16).to_be_bytes()))
            }
            _ => true,
        }
    }
}

/// Bits of a packet's interface index in its position, for a segment of `n` interfaces: 0 for one, else enough
/// for `n - 1`.
pub(crate) fn iface_bits(n: usize) -> u32 {
    if n <= 1 { 0 } else { usize::BITS - (n - 1).leading_zeros() }
}

/// `need` evaluated with `pred` deciding each predicate (a superset: `All` and unknown fields may match).
pub(crate) fn need_may(need: &Need, pred: &dyn Fn(&Pred) -> bool) -> bool {
    match need {
        Need::All => true,
        Need::Pred(p) => pred(p),
        Need::And(v) => v.iter().all(|n| need_may(n, pred)),
        Need::Or(v) => v.iter().any(|n| need_may(n, pred)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_bits() {
        assert_eq!([1, 2, 3, 4, 5, 256, 257, 65536].map(iface_bits), [0, 1, 2, 2, 3, 8, 9, 16]);
    }
}
