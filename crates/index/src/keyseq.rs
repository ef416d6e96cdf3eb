//! The key id of every packet of a chunk, stored by groups of consecutive packets: each group lists the keys it
//! holds (a few hundred of the chunk's tens of thousands: traffic has locality) with their number of packets, and
//! one wavelet structure over the whole chunk holds every packet's position in its group's list (its local
//! symbol). Local symbols are numbered by frequency within the group, so the Huffman-shaped tree gives the
//! common ones short codes. On the generated trace this takes 1.2 bytes a packet where one global id per packet
//! took 2.1 (docs/BENCHMARKS.md).
//!
//! ```text
//! key_seq := group:u32 groups:u32 id_bits:u32 count_bits:u32
//!            starts: (groups + 1) × u32        first entry of each group; starts[groups] = entries
//!            zero padding to a multiple of 8
//!            ids:    ⌈entries·id_bits/8⌉ bytes    the key id of every entry, groups back to back
//!            counts: ⌈entries·count_bits/8⌉ bytes the packets of every entry in its group
//!            zero padding to a multiple of 8
//!            wt_len:u64 wt (PTWV, n local symbols) zero padding to a multiple of 8
//! ```

use std::sync::OnceLock;

use crate::format::{BitPacker, Cursor, Out, Packed, bits_for, packed_len};
use crate::select::Tree;

/// Packets per group of the key sequence.
pub(crate) const GROUP: usize = 4096;

/// Writes the key sequence of `ids` (every id below `keys`) in groups of `group` packets.
pub(crate) fn write_key_seq(out: &mut Out, ids: &[u32], keys: usize, group: usize) {
    let groups = ids.len().div_ceil(group);
    let mut starts = Vec::with_capacity(groups + 1);
    let mut entries: Vec<(u32, u32)> = Vec::new();
    let mut local = Vec::with_capacity(ids.len());
    let mut count = vec![0u32; keys];
    let mut slot = vec![0u32; keys];
    for g in ids.chunks(group) {
        starts.push(entries.len() as u32);
        let first = entries.len();
        for &id in g {
            if count[id as usize] == 0 {
                entries.push((id, 0));
            }
            count[id as usize] += 1;
        }
        let mine = &mut entries[first..];
        for e in mine.iter_mut() {
            e.1 = count[e.0 as usize];
            count[e.0 as usize] = 0;
        }
        // Most frequent first; ties by key id, so that the output depends on nothing else.
        mine.sort_unstable_by_key(|&(id, c)| (std::cmp::Reverse(c), id));
        for (j, e) in mine.iter().enumerate() {
            slot[e.0 as usize] = j as u32;
        }
        local.extend(g.iter().map(|&id| slot[id as usize]));
    }
    starts.push(entries.len() as u32);
    let id_bits = bits_for(keys.saturating_sub(1) as u64);
    let count_bits = bits_for(group as u64);
    out.u32(group as u32);
    out.u32(groups as u32);
    out.u32(id_bits);
    out.u32(count_bits);
    for s in &starts {
        out.u32(*s);
    }
    out.align8();
    let mut p = BitPacker::new(id_bits);
    entries.iter().for_each(|e| p.push(u64::from(e.0)));
    out.bytes(&p.finish());
    let mut p = BitPacker::new(count_bits);
    entries.iter().for_each(|e| p.push(u64::from(e.1)));
    out.bytes(&p.finish());
    out.align8();
    let wt = crate::build::encode_sequence(&local);
    out.u64(wt.len() as u64);
    out.bytes(&wt);
    out.align8();
}

/// A chunk's key sequence, read.
#[derive(Debug)]
pub(crate) struct KeySeq<'a> {
    n: usize,
    group: usize,
    /// First entry of each group, and the number of entries at the end.
    starts: Vec<u32>,
    /// Key id of every entry.
    ids: Packed<'a>,
    /// Packets of every entry in its group.
    counts: Packed<'a>,
    /// Local symbol of every packet.
    local: Tree<'a>,
    /// Packets of every key in the chunk, summed when first needed.
    totals: OnceLock<Vec<u32>>,
    keys: usize,
}

impl<'a> KeySeq<'a> {
    /// Reads the key sequence of `n` packets over `keys` keys, checking what reading it relies on: the groups
    /// tile the packets and their entries lie in the lists. Entries are read in place, not checked one by one (a
    /// damaged id past the table selects its packets, which are then refused as not what the index describes;
    /// the chunk's checksum is what catches damage).
    pub(crate) fn read(c: &mut Cursor<'a>, n: usize, keys: usize) -> Result<KeySeq<'a>, String> {
        let group = c.u32()? as usize;
        let groups = c.u32()? as usize;
        let id_bits = c.u32()?;
        let count_bits = c.u32()?;
        if group == 0 || groups != n.div_ceil(group) {
            return Err(format!("{groups} key groups of {group} packets for {n} packets"));
        }
        if id_bits != bits_for(keys.saturating_sub(1) as u64) || count_bits != bits_for(group as u64) {
            return Err(format!("key groups of {id_bits}-bit ids and {count_bits}-bit counts"));
        }
        let starts = (0..=groups).map(|_| c.u32()).collect::<Result<Vec<u32>, _>>()?;
        c.align8()?;
        let entries = starts[groups] as usize;
        if entries > n || starts[0] != 0 || starts.windows(2).any(|w| w[0] > w[1]) {
            return Err("key group starts are not in order".into());
        }
        if let Some(g) = (0..groups).find(|&g| (starts[g + 1] - starts[g]) as usize > group.min(n - g * group)) {
            return Err(format!("key group {g} lists more keys than it has packets"));
        }
        let ids = Packed::new(c.bytes(packed_len(entries, id_bits))?, id_bits, entries);
        let counts = Packed::new(c.bytes(packed_len(entries, count_bits))?, count_bits, entries);
        c.align8()?;
        let len = c.u64()? as usize;
        let local = Tree::from_bytes(c.bytes(len)?).map_err(|e| format!("key wavelet tree: {e}"))?;
        c.align8()?;
        if local.len() != n {
            return Err(format!("the key wavelet tree has {} symbols for {n} packets", local.len()));
        }
        Ok(KeySeq { n, group, starts, ids, counts, local, totals: OnceLock::new(), keys })
    }

    fn group_range(&self, g: usize) -> (usize, usize) {
        (self.starts[g] as usize, self.starts[g + 1] as usize)
    }

    /// The key id of packet `i` (`u32::MAX` if its local symbol is past its group's list, which only a damaged
    /// structure holds: the caller then reads the packet and finds it is not what the index says).
    pub(crate) fn access(&self, i: usize) -> u32 {
        let (s, e) = self.group_range(i / self.group);
        let j = self.local.access(i) as usize;
        if s + j < e { self.ids.get(s + j) as u32 } else { u32::MAX }
    }

    fn totals(&self) -> &[u32] {
        self.totals.get_or_init(|| {
            // One more slot at the end: the packets of ids past the table (only damage writes them).
            let mut t = vec![0u32; self.keys + 1];
            for (id, c) in self.ids.iter().zip(self.counts.iter()) {
                let x = &mut t[(id as usize).min(self.keys)];
                *x = x.saturating_add(c as u32);
            }
            t
        })
    }

    /// Per group overlapping `[l, r)`: its packets within `[l, r)` and its local symbols whose key `truth`
    /// accepts (a key id past the table: `past`), with their packet counts there.
    fn for_groups(
        &self,
        truth: &[bool],
        past: bool,
        l: usize,
        r: usize,
        mut f: impl FnMut(usize, usize, &[(u32, usize)]),
    ) {
        if l >= r {
            return;
        }
        let mut hits = Vec::new();
        for g in l / self.group..=(r - 1) / self.group {
            let (gl, gr) = (g * self.group, ((g + 1) * self.group).min(self.n));
            let (a, b) = (gl.max(l), gr.min(r));
            let whole = a == gl && b == gr;
            let (s, e) = self.group_range(g);
            hits.clear();
            for (j, k) in (s..e).enumerate() {
                if truth.get(self.ids.get(k) as usize).copied().unwrap_or(past) {
                    let stored = self.counts.get(k) as usize;
                    let c = if whole && stored > 0 {
                        stored
                    } else {
                        self.local.rank(j as u32, b) - self.local.rank(j as u32, a)
                    };
                    if c > 0 {
                        hits.push((j as u32, c));
                    }
                }
            }
            if !hits.is_empty() {
                f(a, b, &hits);
            }
        }
    }

    /// Packets in `[l, r)` whose key `truth` accepts, and those whose key id is past the table if `past`.
    fn count(&self, truth: &[bool], past: bool, l: usize, r: usize) -> usize {
        if l == 0 && r == self.n {
            let t = self.totals();
            let known: usize = truth.iter().zip(t).filter(|(t, _)| **t).map(|(_, &c)| c as usize).sum();
            return known + if past { t[self.keys] as usize } else { 0 };
        }
        let mut total = 0;
        self.for_groups(truth, past, l, r, |_, _, hits| total += hits.iter().map(|h| h.1).sum::<usize>());
        total
    }

    /// Packets in `[l, r)` that may have a key `truth` accepts (an upper bound, as [`positions`](Self::positions)
    /// selects: key ids past the table included).
    pub(crate) fn count_in(&self, truth: &[bool], l: usize, r: usize) -> usize {
        self.count(truth, true, l, r)
    }

    /// Packets in `[l, r)` whose key is in the table and accepted by `truth`.
    pub(crate) fn count_sure(&self, truth: &[bool], l: usize, r: usize) -> usize {
        self.count(truth, false, l, r)
    }

    /// Appends the packets in `[l, r)` whose key `truth` accepts, ascending: per group by `select` for few of
    /// them, by one pass of `access` for many.
    pub(crate) fn positions(&self, truth: &[bool], l: usize, r: usize, out: &mut Vec<u32>) {
        if l == 0 && r == self.n && self.count_in(truth, l, r) == 0 {
            return;
        }
        let mut want = Vec::new();
        self.for_groups(truth, true, l, r, |a, b, hits| {
            let total: usize = hits.iter().map(|h| h.1).sum();
            if total.saturating_mul(8) > b - a {
                want.clear();
                want.resize(hits.iter().map(|h| h.0 as usize + 1).max().unwrap_or(0), false);
                hits.iter().for_each(|h| want[h.0 as usize] = true);
                let ok = |s: u32| want.get(s as usize).copied().unwrap_or(false);
                out.extend((a..b).filter(|&i| ok(self.local.access(i))).map(|i| i as u32));
            } else {
                let start = out.len();
                for &(j, _) in hits {
                    out.extend(self.local.positions(j, a, b).map(|i| i as u32));
                }
                out[start..].sort_unstable();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn load(ids: &[u32], keys: usize, group: usize) -> Vec<u8> {
        let mut o = Out::default();
        write_key_seq(&mut o, ids, keys, group);
        o.into_inner()
    }

    proptest! {
        #[test]
        fn matches_the_plain_sequence(
            ids in prop::collection::vec(0u32..40, 1..3000),
            group in 1usize..300,
            truth in prop::collection::vec(any::<bool>(), 40),
            l in 0usize..3000,
            len in 0usize..3000,
        ) {
            // Every id below the largest occurs, as in a chunk.
            let keys = *ids.iter().max().unwrap() as usize + 1;
            let mut ids = ids;
            ids.extend(0..keys as u32);
            let n = ids.len();
            let bytes = load(&ids, keys, group);
            let mut c = Cursor::new(&bytes);
            let s = KeySeq::read(&mut c, n, keys).unwrap();
            prop_assert!(c.is_empty());
            for (i, &id) in ids.iter().enumerate() {
                prop_assert_eq!(s.access(i), id);
            }
            let truth = &truth[..keys];
            let (l, r) = (l.min(n), (l + len).min(n));
            let want: Vec<u32> = (l..r).filter(|&i| truth[ids[i] as usize]).map(|i| i as u32).collect();
            prop_assert_eq!(s.count_in(truth, l, r), want.len());
            prop_assert_eq!(s.count_in(truth, 0, n), ids.iter().filter(|&&i| truth[i as usize]).count());
            let mut got = Vec::new();
            s.positions(truth, l, r, &mut got);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn refuses_inconsistent_groups() {
        let ids = [0u32, 1, 1, 2, 0, 0, 2, 1];
        let bytes = load(&ids, 3, 4);
        assert!(KeySeq::read(&mut Cursor::new(&bytes), 8, 3).is_ok());
        assert!(KeySeq::read(&mut Cursor::new(&bytes), 8, 5).is_err(), "ids of another width");
        assert!(KeySeq::read(&mut Cursor::new(&bytes), 9, 3).is_err(), "groups do not tile the packets");
        // The second group start moved past the entries.
        let mut bad = bytes.clone();
        bad[20] = 7;
        assert!(KeySeq::read(&mut Cursor::new(&bad), 8, 3).is_err());
        // An id past the table (the first entry's two bits set to 3): read, then given as past the table.
        let mut bad = bytes.clone();
        bad[32] |= 3;
        let s = KeySeq::read(&mut Cursor::new(&bad), 8, 3).unwrap();
        let past: Vec<usize> = (0..8).filter(|&i| s.access(i) == 3).collect();
        assert!(!past.is_empty());
        // Such packets may match anything: selected (then refused when read), never counted as sure.
        let mut out = Vec::new();
        s.positions(&[false, false, false], 0, 8, &mut out);
        assert_eq!(out.iter().map(|&i| i as usize).collect::<Vec<_>>(), past);
        assert_eq!(s.count_in(&[false; 3], 0, 8), past.len());
        assert_eq!(s.count_sure(&[true; 3], 0, 8), 8 - past.len());
    }
}
