//! The floor of the flow store's write path: a bare model of its design, run beside it in `cargo xtask bench
//! --only pipeline` on the same frames, so that what the design itself costs on the machine at hand is measured
//! rather than assumed.
//!
//! The model does only what any flow-clustered segment must: it reads each frame's flow (the store's own
//! parser), finds the flow in an open-addressing table (its key compared, its lines loaded 8 packets ahead, as
//! the store does), appends the packet's pcap record after the last one in an arena that is reused from pass
//! to pass, and at each close puts the records in flow order (a counting sort by slot) and copies them through
//! an aligned buffer to a file opened with `O_DIRECT`, each record's lines loaded 8 packets ahead. It keeps no
//! flow record, no positions, no Bloom filter, no stage 2 and no index file, and it never fsyncs: it is what
//! is left of the store's write path with all of its indexing taken away. See docs/BENCHMARKS.md.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use pcaptool_packet::{FlowTuple, LinkType, plain_flow, prefetch, prefetch_item};

use crate::capbench::{cpu_seconds, since};

/// Bytes of each direct write.
const CHUNK: usize = 1 << 20;
/// Alignment of direct writes.
const ALIGN: usize = 4096;
/// How many packets ahead a packet's table slot, and at a close its record, start loading.
const AHEAD: usize = 8;

/// A flow in the model's table: its hash (0: empty slot), its key, its slot in the open segment and the
/// segment that slot is of.
#[derive(Clone, Copy, Default)]
struct Flow {
    hash: u64,
    key: FlowTuple,
    slot: u32,
    segment: u32,
}

/// The model's flow table, kept from segment to segment as the store's flow tracker is: open addressing with
/// linear probing. A flow gets a slot in a segment at its first packet there (slot 0: packets of no flow).
struct Table {
    flows: Vec<Flow>,
    live: usize,
    segment: u32,
    /// Slots given in the open segment (slot 0 included).
    slots: u32,
}

impl Table {
    fn new() -> Table {
        Table { flows: vec![Flow::default(); 1 << 10], live: 0, segment: 1, slots: 1 }
    }

    fn hash(t: &FlowTuple) -> u64 {
        let fold = |a: u64, b: u64| {
            let m = u128::from(a) * u128::from(b);
            (m as u64) ^ ((m >> 64) as u64)
        };
        let rest = u64::from(t.lo_port)
            | u64::from(t.hi_port) << 16
            | u64::from(t.vlan) << 32
            | u64::from(t.proto) << 48
            | u64::from(t.v6) << 56;
        let a = fold(t.lo as u64 ^ 0x9e37_79b9_7f4a_7c15, (t.lo >> 64) as u64 ^ 0x243f_6a88_85a3_08d3);
        let b = fold(t.hi as u64 ^ 0x1319_8a2e_0370_7344, (t.hi >> 64) as u64 ^ 0xa409_3822_299f_31d0);
        fold(a ^ rest, b) | 1
    }

    fn prefetch(&self, h: u64) {
        prefetch_item(&self.flows, h as usize & (self.flows.len() - 1));
    }

    /// The slot of the flow keyed `t` (hashed to `h`) in the open segment, a new one if it has none there.
    fn slot(&mut self, h: u64, t: &FlowTuple) -> u32 {
        let mask = self.flows.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let f = &mut self.flows[i];
            if f.hash == h && f.key == *t {
                if f.segment != self.segment {
                    (f.segment, f.slot) = (self.segment, self.slots);
                    self.slots += 1;
                }
                return f.slot;
            }
            if f.hash == 0 {
                *f = Flow { hash: h, key: *t, slot: self.slots, segment: self.segment };
                self.slots += 1;
                self.live += 1;
                let slot = f.slot;
                if self.live * 2 > self.flows.len() {
                    self.grow();
                }
                return slot;
            }
            i = (i + 1) & mask;
        }
    }

    /// Starts the next segment's slots.
    fn next_segment(&mut self) {
        self.segment += 1;
        self.slots = 1;
    }

    #[cold]
    fn grow(&mut self) {
        let cap = self.flows.len() * 2;
        let old = std::mem::replace(&mut self.flows, vec![Flow::default(); cap]);
        let mask = self.flows.len() - 1;
        for f in old.into_iter().filter(|f| f.hash != 0) {
            let mut i = f.hash as usize & mask;
            while self.flows[i].hash != 0 {
                i = (i + 1) & mask;
            }
            self.flows[i] = f;
        }
    }
}

/// The model's open segment and what its close keeps for the next one.
struct Model {
    table: Table,
    arena: Vec<u8>,
    used: usize,
    /// Per packet in the arena: its flow's slot (low 24 bits) and where its record starts (40 bits).
    items: Vec<u64>,
    counts: Vec<u32>,
    sorted: Vec<u32>,
    stage: Vec<u8>,
}

impl Model {
    fn new() -> Model {
        Model {
            table: Table::new(),
            arena: Vec::new(),
            used: 0,
            items: Vec::new(),
            counts: Vec::new(),
            sorted: Vec::new(),
            stage: Vec::new(),
        }
    }

    fn push(&mut self, ts_ns: u64, wirelen: u32, data: &[u8], slot: u32) -> anyhow::Result<()> {
        let need = 16 + data.len();
        if slot >> 24 != 0 || (self.used + need) >> 40 != 0 {
            anyhow::bail!("the floor model holds at most 2^24 flows and 1 TiB a segment");
        }
        if self.arena.len() - self.used < need {
            self.arena.resize((self.arena.len() * 2).max(self.used + need).max(1 << 16), 0xa5);
        }
        let at = self.used;
        let r = &mut self.arena[at..at + need];
        r[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        r[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        r[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        r[12..16].copy_from_slice(&wirelen.to_le_bytes());
        r[16..].copy_from_slice(data);
        self.items.push(u64::from(slot) | (at as u64) << 24);
        self.used += need;
        Ok(())
    }

    /// Writes the open segment's records to `path` in flow order, and empties it.
    fn close(&mut self, path: &Path) -> anyhow::Result<()> {
        let (mut file, direct) = open(path)?;
        let nflows = self.table.slots as usize;
        self.counts.clear();
        self.counts.resize(nflows, 0);
        for &it in &self.items {
            self.counts[(it & 0xff_ffff) as usize] += 1;
        }
        let mut start = 0;
        for c in &mut self.counts {
            (start, *c) = (start + *c, start);
        }
        self.sorted.resize(self.items.len(), 0);
        for (k, &it) in self.items.iter().enumerate() {
            let c = &mut self.counts[(it & 0xff_ffff) as usize];
            self.sorted[*c as usize] = k as u32;
            *c += 1;
        }
        if self.stage.len() < CHUNK + 2 * ALIGN + (1 << 18) {
            self.stage.resize(CHUNK + 2 * ALIGN + (1 << 18), 0);
        }
        let base = self.stage.as_ptr().align_offset(ALIGN);
        let mut fill = 0;
        for j in 0..self.sorted.len() {
            if let Some(&next) = self.sorted.get(j + AHEAD) {
                let at = (self.items[next as usize] >> 24) as usize;
                prefetch(&self.arena, at);
                prefetch(&self.arena, at + 64);
            }
            let at = (self.items[self.sorted[j] as usize] >> 24) as usize;
            let len = 16 + u32::from_le_bytes(self.arena[at + 8..at + 12].try_into()?) as usize;
            self.stage[base + fill..base + fill + len].copy_from_slice(&self.arena[at..at + len]);
            fill += len;
            if fill >= CHUNK {
                file.write_all(&self.stage[base..base + CHUNK])?;
                self.stage.copy_within(base + CHUNK..base + fill, base);
                fill -= CHUNK;
            }
        }
        let padded = if direct { fill.div_ceil(ALIGN) * ALIGN } else { fill };
        file.write_all(&self.stage[base..base + padded])?;
        // The last direct write was padded to a block; the file ends with the last record.
        file.set_len(self.used as u64)?;
        self.used = 0;
        self.items.clear();
        self.table.next_segment();
        Ok(())
    }
}

/// `path` for writing, with `O_DIRECT` where the file system takes it (as the store opens its segments).
fn open(path: &Path) -> anyhow::Result<(File, bool)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_DIRECT (on x86_64 and aarch64 Linux).
        const O_DIRECT: i32 = 0o40000;
        let direct = OpenOptions::new().write(true).create(true).truncate(true).custom_flags(O_DIRECT).open(path);
        if let Ok(f) = direct {
            return Ok((f, true));
        }
    }
    Ok((OpenOptions::new().write(true).create(true).truncate(true).open(path)?, false))
}

/// Pushes `frames` through the model again and again (as `store_passes` pushes them through the store),
/// closing every `every` packets into a file in `dir` (removed afterwards); returns each pass's CPU and wall
/// seconds. The flow table is kept from close to close, as the store's flow tracker is, and a flow's slot is
/// numbered anew in each segment, as a segment writer's are.
pub(crate) fn passes(dir: &Path, frames: &[Vec<u8>], every: usize, reused: usize) -> anyhow::Result<Vec<(f64, f64)>> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("floor.bin");
    let mut m = Model::new();
    let n = frames.len();
    // Each frame's flow is read once, AHEAD packets before its push, and its table slot starts loading then.
    let read = |t: &Table, f: &[u8]| {
        let key = plain_flow(LinkType::ETHERNET, f).map(|p| p.tuple);
        let h = key.map_or(0, |k| Table::hash(&k));
        t.prefetch(h);
        (h, key)
    };
    let mut ring = [(0u64, None::<FlowTuple>); 2 * AHEAD];
    let mut out = Vec::new();
    for pass in 0..=reused {
        let (c0, t0) = (cpu_seconds(), Instant::now());
        for (j, part) in frames.chunks(every.max(1)).enumerate() {
            for (i, f) in part.iter().enumerate().take(AHEAD) {
                ring[i % ring.len()] = read(&m.table, f);
            }
            for (i, f) in part.iter().enumerate() {
                if let Some(g) = part.get(i + AHEAD) {
                    ring[(i + AHEAD) % ring.len()] = read(&m.table, g);
                }
                let slot = match ring[i % ring.len()] {
                    (h, Some(key)) => m.table.slot(h, &key),
                    (_, None) => 0,
                };
                let k = (pass * n + j * every + i) as u64;
                m.push(1_700_000_000_000_000_000 + k * 67, 64, f, slot)?;
            }
            m.close(&path)?;
        }
        out.push(since(c0, t0));
    }
    let _ = std::fs::remove_file(&path);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP frame of flow `f` (its source port), with `tag` in its last byte.
    fn frame(f: u16, tag: u8) -> Vec<u8> {
        let mut b = vec![0u8; 60];
        b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        b[14] = 0x45;
        b[16..18].copy_from_slice(&46u16.to_be_bytes());
        b[22] = 64;
        b[23] = 17;
        b[26..30].copy_from_slice(&[198, 18, 0, 1]);
        b[30..34].copy_from_slice(&[198, 19, 0, 1]);
        b[34..36].copy_from_slice(&(1000 + f).to_be_bytes());
        b[36..38].copy_from_slice(&53u16.to_be_bytes());
        b[59] = tag;
        b
    }

    /// The model writes what a segment's data file holds (without its file header): each flow's records
    /// together, flows in the order they came, each flow's records in theirs. So its timing is of real work.
    #[test]
    fn the_model_writes_each_flows_records_together() {
        let dir = std::env::temp_dir().join(format!("pcaptool-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let flows = [2u16, 0, 1, 0, 2, 2, 1, 0, 3, 1];
        let frames: Vec<Vec<u8>> = flows.iter().enumerate().map(|(i, &f)| frame(f, i as u8)).collect();
        // Two segments of 5 packets, then one of all 10.
        for every in [5, 10] {
            passes(&dir, &frames, every, 0).unwrap();
        }
        let mut m = Model::new();
        for (i, f) in frames.iter().enumerate() {
            let key = plain_flow(LinkType::ETHERNET, f).unwrap().tuple;
            let slot = m.table.slot(Table::hash(&key), &key);
            m.push(i as u64 * 1_000_000_001, 64, f, slot).unwrap();
        }
        let path = dir.join("check.bin");
        m.close(&path).unwrap();
        let got = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let mut want = Vec::new();
        for f in [2u16, 0, 1, 3] {
            for (i, _) in flows.iter().enumerate().filter(|(_, g)| **g == f) {
                let ts = i as u64 * 1_000_000_001;
                want.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
                want.extend_from_slice(&((ts % 1_000_000_000) as u32).to_le_bytes());
                want.extend_from_slice(&60u32.to_le_bytes());
                want.extend_from_slice(&64u32.to_le_bytes());
                want.extend_from_slice(&frames[i]);
            }
        }
        assert_eq!(got, want);
    }
}
