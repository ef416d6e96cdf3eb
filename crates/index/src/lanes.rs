//! Flows and lanes: how the index says which flow every packet belongs to in about as many bits as there are
//! flows open at once.
//!
//! A chunk's key table has one row per flow (both directions). Flows are laid out in *lanes*: no two flows of a
//! lane are open at once (a flow is open from its first to its last packet in the chunk), so a lane holds one flow
//! after another and there are about as many lanes as flows open at once; the builder places the heaviest flows
//! first, each in the lowest lane of its row class where it fits ([`assign`]). Every
//! packet's symbol in the lane sequence is `2·lane + direction`, held by one wavelet tree: on traffic where each
//! packet is one of a hundred open flows, a symbol costs about 7 bits, where a row number would cost 15 and
//! per-group lists of keys cost more (docs/BENCHMARKS.md). The flow part of a chunk keeps, per row, its lane and its
//! first packet; a flow ends where the next flow of its lane starts (rows of a class are in order of their first
//! packet, so that is the next row of the class with the same lane), so the packets of a flow going one way are the
//! occurrences of its symbol between its start and its end: rank and select on one tree.
//!
//! ```text
//! flows := rows:u32 lanes:u32 lane_bits:u32 n:u32
//!          class_start: 8 × u32     first row of each class (class 7: = rows)
//!          lane_base:   8 × u32     first lane of each class (class 7: = lanes)
//!          lanes:  ⌈rows·lane_bits/8⌉ bytes, the lane of every row, packed LSB first; zero padding to 8
//!          starts: Elias-Fano (format::write_ef) of every row's `class·(n + 1) + first packet`, below 7·(n + 1)
//! ```
//!
//! A row's start key `class·(n + 1) + first packet` is strictly increasing over the rows (rows are ordered by
//! class, then by first packet), so Elias-Fano stores it in about `2 + log2(7·n / rows)` bits with constant-time
//! access.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use crate::format::{BitPacker, Cursor, EliasFano, Out, Packed, bits_for, packed_len, write_ef};

/// Row classes (see [`crate::keys::shape_rank`]).
pub(crate) const CLASSES: usize = 7;

/// The lanes of a chunk's flows, as the builder assigns them.
#[derive(Debug)]
pub(crate) struct Lanes {
    /// Global lane of every row.
    pub lane: Vec<u32>,
    /// First packet of every row.
    pub start: Vec<u32>,
    /// First row of every class, and the number of rows.
    pub class_start: [u32; CLASSES + 1],
    /// First lane of every class, and the number of lanes.
    pub lane_base: [u32; CLASSES + 1],
}

/// Assigns lanes: `class` of every row (non-decreasing), `first`/`last` packet and `packets` of every row (`first`
/// increasing within a class). Within a class, flows take lanes heaviest first, each the lowest lane where no flow
/// already placed is open at any of its packets (first fit by weight): the packets concentrate on few lanes, so the
/// lane sequence's Huffman code is shorter than when each flow takes the lowest lane free at its first packet (1.8%
/// on the generated trace, docs/BENCHMARKS.md). Any assignment where the flows of a lane do not overlap reads the
/// same way.
pub(crate) fn assign(class: &[u8], first: &[u32], last: &[u32], packets: &[u32]) -> Lanes {
    let rows = class.len();
    let mut class_start = [rows as u32; CLASSES + 1];
    for c in (0..CLASSES).rev() {
        class_start[c] = class.partition_point(|&k| (k as usize) < c) as u32;
    }
    let mut lane = vec![0u32; rows];
    let mut lane_base = [0u32; CLASSES + 1];
    let mut base = 0u32;
    for c in 0..CLASSES {
        lane_base[c] = base;
        let r = class_start[c] as usize..class_start[c + 1] as usize;
        let (f, l, p) = (&first[r.clone()], &last[r.clone()], &packets[r.clone()]);
        let used = first_fit_by_weight(f, l, p, &mut lane[r.clone()], TREE_WORDS)
            .unwrap_or_else(|| lowest_free(f, l, &mut lane[r]));
        base += used;
    }
    lane_base[CLASSES] = base;
    // Lanes so far are local to their class.
    for c in 0..CLASSES {
        for l in &mut lane[class_start[c] as usize..class_start[c + 1] as usize] {
            *l += lane_base[c];
        }
    }
    Lanes { lane, start: first.to_vec(), class_start, lane_base }
}

/// Each flow (in order of first packet) takes the lowest lane free at its first packet; returns the lanes used.
/// As many lanes as flows are ever open at once.
fn lowest_free(first: &[u32], last: &[u32], lane: &mut [u32]) -> u32 {
    let mut open: BinaryHeap<Reverse<(u32, u32)>> = BinaryHeap::new();
    let mut free: BinaryHeap<Reverse<u32>> = BinaryHeap::new();
    let mut used = 0u32;
    for r in 0..first.len() {
        while let Some(&Reverse((end, l))) = open.peek() {
            if end >= first[r] {
                break;
            }
            open.pop();
            free.push(Reverse(l));
        }
        let l = match free.pop() {
            Some(Reverse(l)) => l,
            None => {
                used += 1;
                used - 1
            }
        };
        lane[r] = l;
        open.push(Reverse((last[r], l)));
    }
    used
}

/// Words a lane assignment's segment tree may take (32 MiB); a class that would need more is placed by
/// [`lowest_free`], so the memory a chunk's build takes stays bounded whatever the traffic.
const TREE_WORDS: usize = 1 << 22;

/// Flows heaviest first, each to the lowest lane with no placed flow open at any of its packets; returns the lanes
/// used, or `None` when a flow finds every lane it tracks taken (at least twice as many as flows are ever open at
/// once) or the tree would take more than `max_words` words (the caller then uses [`lowest_free`]).
///
/// Which lanes are taken where is a segment tree over the flows' first and last packets (`cover`: lanes taken over
/// a node's whole range; `any`: lanes taken anywhere in it), so a flow costs two walks of its height.
fn first_fit_by_weight(
    first: &[u32],
    last: &[u32],
    packets: &[u32],
    lane: &mut [u32],
    max_words: usize,
) -> Option<u32> {
    let rows = first.len();
    if rows == 0 {
        return Some(0);
    }
    let mut scratch = vec![0u32; rows];
    let most_open = lowest_free(first, last, &mut scratch);
    let words = (2 * most_open as usize).div_ceil(64).max(1);
    let mut coords: Vec<u32> = first.iter().chain(last).copied().collect();
    coords.sort_unstable();
    coords.dedup();
    let size = coords.len().next_power_of_two();
    if 4 * size * words > max_words {
        return None;
    }
    let at = |p: u32| coords.partition_point(|&c| c < p);
    let mut cover = vec![0u64; 2 * size * words];
    let mut any = vec![0u64; 2 * size * words];
    let mut order: Vec<usize> = (0..rows).collect();
    order.sort_unstable_by_key(|&r| (Reverse(packets[r]), first[r], r));
    let mut taken = vec![0u64; words];
    let mut used = 0u32;
    for r in order {
        let (a, b) = (at(first[r]) + size, at(last[r]) + size);
        // Lanes taken anywhere in [a, b]: `cover` on both boundary paths, `any` of the nodes tiling the range.
        taken.fill(0);
        for leaf in [a, b] {
            let mut v = leaf;
            while v > 0 {
                or_into(&mut taken, &cover[v * words..(v + 1) * words]);
                v /= 2;
            }
        }
        let (mut l, mut h) = (a, b + 1);
        while l < h {
            if l & 1 == 1 {
                or_into(&mut taken, &any[l * words..(l + 1) * words]);
                l += 1;
            }
            if h & 1 == 1 {
                h -= 1;
                or_into(&mut taken, &any[h * words..(h + 1) * words]);
            }
            l /= 2;
            h /= 2;
        }
        let w = taken.iter().position(|&x| x != u64::MAX)?;
        let free = w * 64 + taken[w].trailing_ones() as usize;
        let (word, bit) = (free / 64, 1u64 << (free % 64));
        lane[r] = free as u32;
        used = used.max(free as u32 + 1);
        // Take the lane over the nodes tiling [a, b], then bring `any` up to date on both boundary paths.
        let (mut l, mut h) = (a, b + 1);
        while l < h {
            if l & 1 == 1 {
                cover[l * words + word] |= bit;
                any[l * words + word] |= bit;
                l += 1;
            }
            if h & 1 == 1 {
                h -= 1;
                cover[h * words + word] |= bit;
                any[h * words + word] |= bit;
            }
            l /= 2;
            h /= 2;
        }
        for leaf in [a, b] {
            let mut v = leaf / 2;
            while v > 0 {
                any[v * words + word] |=
                    (cover[v * words + word] | any[2 * v * words + word] | any[(2 * v + 1) * words + word]) & bit;
                v /= 2;
            }
        }
    }
    Some(used)
}

fn or_into(acc: &mut [u64], x: &[u64]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a |= b);
}

/// Writes the flow part of a chunk of `n` packets.
pub(crate) fn write_flows(out: &mut Out, lanes: &Lanes, class: &[u8], n: usize) {
    let rows = lanes.lane.len();
    let total = lanes.lane_base[CLASSES];
    let lane_bits = bits_for(u64::from(total.saturating_sub(1)));
    out.u32(rows as u32);
    out.u32(total);
    out.u32(lane_bits);
    out.u32(n as u32);
    for v in lanes.class_start {
        out.u32(v);
    }
    for v in lanes.lane_base {
        out.u32(v);
    }
    let mut p = BitPacker::new(lane_bits);
    lanes.lane.iter().for_each(|&l| p.push(u64::from(l)));
    out.bytes(&p.finish());
    out.align8();
    let keys: Vec<u64> = (0..rows).map(|r| u64::from(class[r]) * (n as u64 + 1) + u64::from(lanes.start[r])).collect();
    write_ef(out, &keys, CLASSES as u64 * (n as u64 + 1));
}

/// The flow part of a chunk, read: per row its lane and first packet, and where it ends.
#[derive(Debug)]
pub(crate) struct Flows<'a> {
    n: usize,
    rows: usize,
    lanes: u32,
    class_start: [u32; CLASSES + 1],
    lane: Packed<'a>,
    /// `class·(n + 1) + first packet` of every row.
    starts: EliasFano<'a>,
    /// Rows by lane, each lane's in order of first packet (built when a query needs many of them).
    by_lane: OnceLock<ByLane>,
}

/// Rows grouped by lane: `rows[first[l]..first[l + 1]]` are lane `l`'s, in order of first packet.
#[derive(Debug)]
struct ByLane {
    first: Vec<u32>,
    rows: Vec<u32>,
    starts: Vec<u32>,
}

impl<'a> Flows<'a> {
    /// Reads the flow part of a chunk of `n` packets whose key table has `rows` rows, checking what reading it
    /// relies on (class and lane boundaries in order, the Elias-Fano high bits of the right shape); lanes are
    /// read in place (a lane past the last reads as no lane).
    pub(crate) fn read(b: &'a [u8], n: usize, rows: usize) -> Result<Flows<'a>, String> {
        let mut c = Cursor::new(b);
        let stored_rows = c.u32()? as usize;
        let lanes = c.u32()?;
        let lane_bits = c.u32()?;
        let stored_n = c.u32()? as usize;
        if stored_rows != rows || stored_n != n {
            return Err(format!("flows of {stored_rows} rows over {stored_n} packets, expected {rows} and {n}"));
        }
        let mut class_start = [0u32; CLASSES + 1];
        for v in &mut class_start {
            *v = c.u32()?;
        }
        let mut lane_base = [0u32; CLASSES + 1];
        for v in &mut lane_base {
            *v = c.u32()?;
        }
        if class_start.windows(2).any(|w| w[0] > w[1]) || class_start[0] != 0 || class_start[CLASSES] as usize != rows {
            return Err("class boundaries are not in order".into());
        }
        if lane_base.windows(2).any(|w| w[0] > w[1]) || lane_base[0] != 0 || lane_base[CLASSES] != lanes {
            return Err("lane boundaries are not in order".into());
        }
        if lane_bits != bits_for(u64::from(lanes.saturating_sub(1))) {
            return Err(format!("{lane_bits}-bit lanes for {lanes} lanes"));
        }
        let lane = Packed::new(c.bytes(packed_len(rows, lane_bits))?, lane_bits, rows);
        c.align8()?;
        let starts = EliasFano::read(&mut c).map_err(|e| format!("flow starts: {e}"))?;
        if starts.len() != rows {
            return Err(format!("{} flow starts for {rows} rows", starts.len()));
        }
        if !c.is_empty() {
            return Err(format!("{} bytes after the flow starts", b.len() - c.pos()));
        }
        Ok(Flows { n, rows, lanes, class_start, lane, starts, by_lane: OnceLock::new() })
    }

    /// Rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Lanes (symbols of the lane sequence are below twice this).
    pub(crate) fn lanes(&self) -> u32 {
        self.lanes
    }

    /// The lane of row `r` (`u32::MAX` for a damaged lane past the last).
    pub(crate) fn lane(&self, r: usize) -> u32 {
        let l = self.lane.get(r) as u32;
        if l < self.lanes { l } else { u32::MAX }
    }

    fn class_of(&self, r: usize) -> usize {
        self.class_start.partition_point(|&s| s as usize <= r).saturating_sub(1).min(CLASSES - 1)
    }

    /// The first packet of row `r` (clamped to the chunk).
    pub(crate) fn start(&self, r: usize) -> usize {
        let class = self.class_of(r) as u64;
        (self.starts.get(r).saturating_sub(class * (self.n as u64 + 1)) as usize).min(self.n)
    }

    /// The first packet of every row, decoded in one pass (a `select` per row costs far more when all are
    /// wanted).
    pub(crate) fn starts(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.rows);
        let mut class = 0usize;
        let base = self.n as u64 + 1;
        for key in self.starts.iter() {
            while class + 1 < CLASSES && self.class_start[class + 1] as usize <= out.len() {
                class += 1;
            }
            out.push(key.saturating_sub(class as u64 * base).min(self.n as u64) as u32);
        }
        out.resize(self.rows, self.n as u32);
        out
    }

    /// Where row `r` ends: the first packet of the next flow of its lane, or the end of the chunk.
    pub(crate) fn end(&self, r: usize) -> usize {
        if let Some(b) = self.by_lane.get() {
            return b.end_of(self, r);
        }
        let l = self.lane(r);
        let class_end = self.class_start[self.class_of(r) + 1] as usize;
        ((r + 1)..class_end).find(|&q| self.lane(q) == l).map_or(self.n, |q| self.start(q).max(self.start(r)))
    }

    /// Rows by lane (built once).
    fn by_lane(&self) -> &ByLane {
        self.by_lane.get_or_init(|| {
            let lanes = self.lanes as usize;
            let mut first = vec![0u32; lanes + 2];
            let lane_of: Vec<u32> =
                self.lane.iter_from(0).map(|l| if l < u64::from(self.lanes) { l as u32 } else { self.lanes }).collect();
            for &l in &lane_of {
                first[l as usize + 1] += 1;
            }
            for l in 0..=lanes {
                first[l + 1] += first[l];
            }
            // Counting sort by lane: rows of a class are in order of first packet and a lane belongs to one
            // class, so each lane's rows come out in order of first packet. (Rows whose damaged lane is past the
            // last go to an extra lane no lookup asks for.)
            let all = self.starts();
            let mut fill = first.clone();
            let total = first[lanes + 1] as usize;
            let (mut rows, mut starts) = (vec![0u32; total], vec![0u32; total]);
            for (r, &l) in lane_of.iter().enumerate() {
                let at = fill[l as usize] as usize;
                rows[at] = r as u32;
                starts[at] = all[r];
                fill[l as usize] += 1;
            }
            first.truncate(lanes + 1);
            ByLane { first, rows, starts }
        })
    }

    /// Prepares for many `end` and `row_at` calls.
    pub(crate) fn index_lanes(&self) {
        self.by_lane();
    }

    /// The rows of lane `lane` in order of first packet, and their first packets.
    pub(crate) fn lane_rows(&self, lane: u32) -> (&[u32], &[u32]) {
        let b = self.by_lane();
        let l = lane as usize;
        if l + 1 >= b.first.len() {
            return (&[], &[]);
        }
        let (a, e) = (b.first[l] as usize, b.first[l + 1] as usize);
        (&b.rows[a..e], &b.starts[a..e])
    }

    /// The row whose flow holds packet `i` in lane `lane` (`None` if no flow of the lane has started by then).
    pub(crate) fn row_at(&self, lane: u32, i: usize) -> Option<usize> {
        let b = self.by_lane();
        let l = lane as usize;
        if l + 1 >= b.first.len() {
            return None;
        }
        let (a, e) = (b.first[l] as usize, b.first[l + 1] as usize);
        let k = b.starts[a..e].partition_point(|&s| s as usize <= i);
        (k > 0).then(|| b.rows[a + k - 1] as usize)
    }
}

impl ByLane {
    fn end_of(&self, f: &Flows<'_>, r: usize) -> usize {
        let l = f.lane(r) as usize;
        if l + 1 >= self.first.len() {
            return f.n;
        }
        let (a, e) = (self.first[l] as usize, self.first[l + 1] as usize);
        // A lane's rows are ascending (`by_lane` places them in row order).
        match self.rows[a..e].binary_search(&(r as u32)).ok() {
            Some(k) if a + k + 1 < e => (self.starts[a + k + 1] as usize).max(f.start(r)),
            _ => f.n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Flows from a random interleaving: every row's class, first and last packet.
    fn flows_of(seq: &[(u8, u16)]) -> (Vec<u8>, Vec<u32>, Vec<u32>, Vec<Vec<usize>>) {
        // Rows: distinct (class, flow) pairs in order of first appearance, then sorted by class (stable).
        let mut ids: Vec<(u8, u16)> = Vec::new();
        let mut packets: Vec<Vec<usize>> = Vec::new();
        for (i, &k) in seq.iter().enumerate() {
            match ids.iter().position(|&x| x == k) {
                Some(r) => packets[r].push(i),
                None => {
                    ids.push(k);
                    packets.push(vec![i]);
                }
            }
        }
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&r| ids[r].0);
        let class = order.iter().map(|&r| ids[r].0).collect();
        let first = order.iter().map(|&r| packets[r][0] as u32).collect();
        let last = order.iter().map(|&r| *packets[r].last().unwrap() as u32).collect();
        let pk = order.iter().map(|&r| packets[r].clone()).collect();
        (class, first, last, pk)
    }

    proptest! {
        #[test]
        fn lanes_separate_open_flows_and_read_back(seq in prop::collection::vec((0u8..7, 0u16..30), 1..400)) {
            let (class, first, last, packets) = flows_of(&seq);
            let n = seq.len();
            let counts: Vec<u32> = packets.iter().map(|p| p.len() as u32).collect();
            let lanes = assign(&class, &first, &last, &counts);
            let rows = class.len();
            // No two flows of a lane are open at once.
            for a in 0..rows {
                for b in a + 1..rows {
                    if lanes.lane[a] == lanes.lane[b] {
                        prop_assert!(last[a] < first[b] || last[b] < first[a]);
                    }
                }
            }
            let mut out = Out::default();
            write_flows(&mut out, &lanes, &class, n);
            let bytes = out.into_inner();
            let f = Flows::read(&bytes, n, rows).unwrap();
            prop_assert_eq!(f.starts(), first.clone());
            for pass in 0..2 {
                if pass == 1 {
                    f.index_lanes();
                }
                for r in 0..rows {
                    prop_assert_eq!(f.lane(r), lanes.lane[r]);
                    prop_assert_eq!(f.start(r), first[r] as usize);
                    // The flow's packets are the packets of its lane between its start and its end.
                    let end = f.end(r);
                    prop_assert!(end > last[r] as usize);
                    let lane_packets: Vec<usize> = (f.start(r)..end)
                        .filter(|&i| packets.iter().enumerate().any(|(q, p)| lanes.lane[q] == lanes.lane[r] && p.contains(&i)))
                        .collect();
                    prop_assert_eq!(&lane_packets, &packets[r]);
                    for &i in &packets[r] {
                        prop_assert_eq!(f.row_at(lanes.lane[r], i), Some(r));
                    }
                }
            }
        }
    }

    proptest! {
        /// The segment tree places every flow where a naive first fit by weight does.
        #[test]
        fn first_fit_matches_naive(flows in prop::collection::vec((0u32..300, 0u32..40, 1u32..50), 1..200)) {
            let mut flows: Vec<(u32, u32, u32)> = flows.into_iter().map(|(s, len, w)| (s, s + len, w)).collect();
            flows.sort_by_key(|f| f.0);
            let first: Vec<u32> = flows.iter().map(|f| f.0).collect();
            let last: Vec<u32> = flows.iter().map(|f| f.1).collect();
            let weight: Vec<u32> = flows.iter().map(|f| f.2).collect();
            let mut lane = vec![0; flows.len()];
            prop_assert_eq!(first_fit_by_weight(&first, &last, &weight, &mut lane, 3), None, "past its memory");
            let used = first_fit_by_weight(&first, &last, &weight, &mut lane, TREE_WORDS);
            let mut order: Vec<usize> = (0..flows.len()).collect();
            order.sort_by_key(|&r| (Reverse(weight[r]), first[r], r));
            let mut naive = vec![u32::MAX; flows.len()];
            for &r in &order {
                let overlaps = |q: usize| first[q] <= last[r] && first[r] <= last[q];
                let clash = |l: u32| (0..flows.len()).any(|q| naive[q] == l && overlaps(q));
                naive[r] = (0..).find(|&l| !clash(l)).unwrap();
            }
            let naive_used = naive.iter().max().map_or(0, |&l| l + 1);
            let mut scratch = vec![0; flows.len()];
            if naive_used as usize <= (2 * lowest_free(&first, &last, &mut scratch) as usize).div_ceil(64).max(1) * 64 {
                prop_assert_eq!(used, Some(naive_used));
                prop_assert_eq!(lane, naive);
            }
        }
    }

    #[test]
    fn refuses_inconsistent_parts() {
        let (class, first, last, _) = flows_of(&[(0, 1), (0, 2), (1, 3), (0, 1), (1, 3)]);
        let lanes = assign(&class, &first, &last, &[2, 1, 2]);
        let mut out = Out::default();
        write_flows(&mut out, &lanes, &class, 5);
        let bytes = out.into_inner();
        assert!(Flows::read(&bytes, 5, 3).is_ok());
        assert!(Flows::read(&bytes, 6, 3).is_err(), "another chunk length");
        assert!(Flows::read(&bytes, 5, 4).is_err(), "another row count");
        let mut bad = bytes.clone();
        bad[16] = 9; // class 0 starting at row 9
        assert!(Flows::read(&bad, 5, 3).is_err());
    }
}
