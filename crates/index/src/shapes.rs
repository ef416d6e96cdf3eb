//! The shape sequence of a chunk: every packet's TCP flags code and wire-length class (`8·flags code + class`),
//! which answers conditions on flags and lengths.
//!
//! Version 6 stores the shapes grouped by lane symbol: first the shapes of every packet whose lane symbol is 0, in
//! time order, then those of symbol 1, and so on, under a Huffman-shaped wavelet tree of RRR bit vectors. A lane
//! holds one flow after another, so each group is a few flows' packets in a row, and a flow's packets have few
//! shapes (a bulk transfer's full-size data one way and its acknowledgements the other): RRR's blocks of 63 bits
//! then hold long runs, and the sequence costs about 0.29 bytes a packet against 0.41 in time order over plain
//! bit vectors (docs/BENCHMARKS.md). Packet `i` with lane symbol `s` has its shape at `starts[s] + rank(s, i)`, and
//! the shape at grouped position `j` of group `s` belongs to packet `select(s, j − starts[s])` of the lane
//! sequence. Versions 4 and 5 stored the shapes in time order (one of [`Tree`]'s structures); both are read.

use std::sync::OnceLock;

use pcaptool_wavelet::{DecodeScratch, HuffmanWaveletTree, LeBytes, RrrBitVector};

use crate::tree::{Tree, members};

type RrrHuffman<'a> = HuffmanWaveletTree<RrrBitVector<LeBytes<'a>>, LeBytes<'a>>;

/// How the shapes are laid out.
#[derive(Debug)]
enum Order<'a> {
    /// Versions 4 and 5: packet `i`'s shape at position `i`.
    Time(Tree<'a>),
    /// Version 6: grouped by lane symbol; `starts[s]..starts[s + 1]` holds the shapes of the packets of lane symbol
    /// `s`, in time order (`starts` has one entry per lane symbol and one more); `timed`, once a query has read
    /// many of them, every packet's shape (and lane symbol) in time order.
    Lanes { tree: RrrHuffman<'a>, starts: Vec<u32>, timed: OnceLock<Timed> },
}

/// A chunk's shape sequence, loaded and checked.
#[derive(Debug)]
pub(crate) struct Shapes<'a> {
    order: Order<'a>,
    /// Occurrences of every shape symbol in the chunk (so that counting a set of symbols over the chunk is a sum).
    counts: Vec<u32>,
}

impl<'a> Shapes<'a> {
    /// Loads a version 4 or 5 shape sequence of `n` packets (time order) with `alphabet` possible symbols.
    pub(crate) fn in_time_order(b: &'a [u8], n: usize, alphabet: usize) -> Result<Shapes<'a>, String> {
        let t = Tree::from_bytes(b).map_err(|e| e.to_string())?;
        if t.len() != n {
            return Err(format!("{} symbols for {n} packets", t.len()));
        }
        if matches!(t, Tree::Huffman(_)) && n > 0 && t.max_symbol() >= alphabet as u64 {
            return Err(format!("symbol {} is out of range (below {alphabet})", t.max_symbol()));
        }
        let counts = t.symbol_counts(alphabet);
        Ok(Shapes { order: Order::Time(t), counts })
    }

    /// Loads a version 6 shape sequence grouped by the symbols of `lanes` (`lane_symbols` of them possible).
    pub(crate) fn by_lane(
        b: &'a [u8],
        lanes: &Tree<'a>,
        lane_symbols: usize,
        alphabet: usize,
    ) -> Result<Shapes<'a>, String> {
        let n = lanes.len();
        let tree = RrrHuffman::from_bytes(b).map_err(|e| e.to_string())?;
        if tree.len() != n {
            return Err(format!("{} symbols for {n} packets", tree.len()));
        }
        let mut counts = vec![0u32; alphabet];
        for (s, c) in tree.symbols() {
            match counts.get_mut(s as usize) {
                Some(x) => *x = c as u32,
                None => return Err(format!("symbol {s} is out of range (below {alphabet})")),
            }
        }
        let mut starts = Vec::with_capacity(lane_symbols + 1);
        let mut at = 0u32;
        starts.push(0);
        for c in lanes.symbol_counts(lane_symbols) {
            at += c;
            starts.push(at);
        }
        // Every packet needs a group: a lane sequence holding symbols past the lanes (a damaged wavelet matrix can)
        // leaves shapes that belong to no packet.
        if at as usize != n {
            return Err(format!("the lane sequence gives {at} of the {n} packets a lane"));
        }
        Ok(Shapes { order: Order::Lanes { tree, starts, timed: OnceLock::new() }, counts })
    }

    /// The view that answers questions (`lanes`: the chunk's lane sequence, needed for version 6).
    pub(crate) fn with<'v>(&'v self, lanes: Option<&'v Tree<'a>>) -> ShapeView<'v, 'a> {
        ShapeView { shapes: self, lanes }
    }

    /// Every packet's shape in time order, when a version 6 sequence has been decoded so.
    fn decoded(&self) -> Option<&[u16]> {
        match &self.order {
            Order::Lanes { timed, .. } => timed.get().map(|t| t.shapes.as_slice()),
            Order::Time(_) => None,
        }
    }

    /// Packet `i`'s lane symbol, when a version 6 sequence has been decoded into time order (which reads them).
    pub(crate) fn decoded_lane(&self, i: usize) -> Option<u32> {
        match &self.order {
            Order::Lanes { timed, .. } => timed.get()?.lanes.get(i).copied(),
            Order::Time(_) => None,
        }
    }
}

/// A version 6 sequence is decoded into time order once a query reads the shapes of more than one packet in this
/// many (a lookup through the lanes and the RRR tree costs about as much as decoding this many packets).
const DECODE_FROM: usize = 32;

/// The shape of the packet with lane symbol `sym` and `rank` occurrences of it before it, in a grouped sequence
/// (`None` where they place none, which only a damaged index does).
fn grouped_at(tree: &RrrHuffman<'_>, starts: &[u32], sym: u32, rank: usize) -> Option<u32> {
    let (a, b) = (*starts.get(sym as usize)? as usize, *starts.get(sym as usize + 1)? as usize);
    let j = a + rank;
    (j < b).then(|| tree.access(j))
}

/// A shape sequence with what it needs to answer by packet position.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShapeView<'v, 'a> {
    shapes: &'v Shapes<'a>,
    lanes: Option<&'v Tree<'a>>,
}

impl ShapeView<'_, '_> {
    /// The shape of packet `i` (`None` only where the lane sequence gives it no group, which a loaded sequence
    /// rules out).
    pub(crate) fn at(&self, i: usize) -> Option<u32> {
        if let Some(t) = self.shapes.decoded() {
            return t.get(i).map(|&c| u32::from(c));
        }
        match (&self.shapes.order, self.lanes) {
            (Order::Time(t), _) => Some(t.access(i)),
            (Order::Lanes { tree, starts, .. }, Some(lanes)) => {
                let (sym, rank) = lanes.access_rank(i);
                grouped_at(tree, starts, sym, rank)
            }
            (Order::Lanes { .. }, None) => None,
        }
    }

    /// The shape of packet `i`, given its lane symbol `sym` and that symbol's occurrences before it (`rank`), as
    /// selecting by key learns them: one access of the grouped sequence, no walk of the lanes (`None` where `sym`
    /// and `rank` place no shape, which a caller then asks [`at`](Self::at) about).
    pub(crate) fn at_lane(&self, i: usize, sym: u32, rank: usize) -> Option<u32> {
        if let Some(t) = self.shapes.decoded() {
            return t.get(i).map(|&c| u32::from(c));
        }
        match &self.shapes.order {
            Order::Time(t) => (i < t.len()).then(|| t.access(i)),
            Order::Lanes { tree, starts, .. } => grouped_at(tree, starts, sym, rank),
        }
    }

    /// Says that the shapes of about `reads` packets are about to be read one by one (`at`): when they are many,
    /// the shapes are decoded in time order first (a few nanoseconds a packet, against about a microsecond for
    /// each lookup through the lanes and the RRR tree).
    pub(crate) fn expect(&self, reads: usize) {
        if let (Order::Lanes { tree, starts, timed }, Some(lanes)) = (&self.shapes.order, self.lanes)
            && reads.saturating_mul(DECODE_FROM) > lanes.len()
        {
            timed.get_or_init(|| in_time_order(tree, starts, lanes));
        }
    }

    /// The symbols `truth` accepts that occur in the chunk.
    fn present<'t>(&'t self, truth: &'t [bool]) -> impl Iterator<Item = u32> + 't {
        members(truth).filter(|&c| self.shapes.counts.get(c as usize).is_some_and(|&n| n > 0))
    }

    /// The groups of the lane symbols with packets in `[l, r)`: `(symbol, first, end)` in grouped positions.
    fn groups<'t>(
        &'t self,
        starts: &'t [u32],
        lanes: &'t Tree<'_>,
        l: usize,
        r: usize,
    ) -> impl Iterator<Item = (u32, usize, usize)> + 't {
        let whole = l == 0 && r == lanes.len();
        starts.windows(2).enumerate().filter(|(_, w)| w[0] < w[1]).filter_map(move |(s, w)| {
            let (a, b) = if whole {
                (w[0] as usize, w[1] as usize)
            } else {
                let base = w[0] as usize;
                (base + lanes.rank(s as u32, l), base + lanes.rank(s as u32, r))
            };
            (a < b).then_some((s as u32, a, b))
        })
    }

    /// Occurrences in `[l, r)` of the symbols `truth` accepts.
    pub(crate) fn count_in(&self, truth: &[bool], l: usize, r: usize) -> usize {
        let counts = &self.shapes.counts;
        let n = match &self.shapes.order {
            Order::Time(t) => t.len(),
            Order::Lanes { tree, .. } => tree.len(),
        };
        if l == 0 && r == n {
            return truth.iter().zip(counts).filter(|(t, _)| **t).map(|(_, &c)| c as usize).sum();
        }
        if let Some(t) = self.shapes.decoded() {
            return t[l..r].iter().filter(|&&c| truth.get(c as usize) == Some(&true)).count();
        }
        match (&self.shapes.order, self.lanes) {
            (Order::Time(t), _) => self.present(truth).map(|c| t.rank(c, r) - t.rank(c, l)).sum(),
            (Order::Lanes { tree, starts, .. }, Some(lanes)) => {
                let wanted: Vec<u32> = self.present(truth).collect();
                self.groups(starts, lanes, l, r)
                    .map(|(_, a, b)| wanted.iter().map(|&c| tree.rank(c, b) - tree.rank(c, a)).sum::<usize>())
                    .sum()
            }
            // Without the lanes nothing is known: every packet may match.
            (Order::Lanes { .. }, None) => r - l,
        }
    }

    /// Appends the positions in `[l, r)` whose symbol `truth` accepts, ascending: by `select` for few of them,
    /// by one pass for many.
    pub(crate) fn positions(&self, truth: &[bool], l: usize, r: usize, out: &mut Vec<u32>) {
        let ok = |s: u32| truth.get(s as usize).copied().unwrap_or(false);
        let total = self.count_in(truth, l, r);
        if total == 0 {
            return;
        }
        let start = out.len();
        let dense = total.saturating_mul(8) > r - l;
        match (&self.shapes.order, self.lanes) {
            (Order::Time(t), _) if dense => out.extend((l..r).filter(|&i| ok(t.access(i))).map(|i| i as u32)),
            (Order::Time(t), _) => {
                for c in self.present(truth) {
                    out.extend(t.positions(c, l, r).map(|i| i as u32));
                }
                out[start..].sort_unstable();
            }
            // Many: the shapes in time order, decoded once (a few nanoseconds a packet), scanned.
            (Order::Lanes { tree, starts, timed }, Some(lanes))
                if timed.get().is_some() || total.saturating_mul(DECODE_FROM) > r - l =>
            {
                let t = &timed.get_or_init(|| in_time_order(tree, starts, lanes)).shapes;
                out.extend((l..r).filter(|&i| ok(u32::from(t[i]))).map(|i| i as u32));
            }
            // Few: each occurrence found by `select` and mapped back to its packet.
            (Order::Lanes { tree, starts, .. }, Some(lanes)) => {
                let back = |s: u32, j: usize| lanes.select(s, j - starts[s as usize] as usize);
                if l == 0 && r == lanes.len() {
                    // The whole chunk: each accepted symbol's occurrences, mapped back to packets.
                    for c in self.present(truth) {
                        for j in tree.positions(c, 0, tree.len()) {
                            let s = starts.partition_point(|&a| a as usize <= j) - 1;
                            out.extend(back(s as u32, j).map(|p| p as u32));
                        }
                    }
                } else {
                    let wanted: Vec<u32> = self.present(truth).collect();
                    for (s, a, b) in self.groups(starts, lanes, l, r) {
                        for &c in &wanted {
                            for j in tree.positions(c, a, b) {
                                out.extend(back(s, j).map(|p| p as u32));
                            }
                        }
                    }
                }
                out[start..].sort_unstable();
            }
            (Order::Lanes { .. }, None) => out.extend((l as u32)..(r as u32)),
        }
    }
}

/// The shapes of every packet in time order, from the grouped sequence and the lanes: the grouped shapes decoded,
/// then the lanes decoded symbol by symbol (a Huffman-shaped tree gives each symbol's packets in time order, which
/// are its group's shapes in order: the permutation from grouped to time order, without decoding the lane
/// sequence itself).
fn in_time_order(tree: &RrrHuffman<'_>, starts: &[u32], lanes: &Tree<'_>) -> Timed {
    thread_local! {
        // The decoding's working memory (8 bytes a packet), kept by each thread for the next chunk it decodes:
        // fresh memory costs a page fault a page here, more than the decoding's passes over it.
        static SCRATCH: std::cell::RefCell<DecodeScratch> = std::cell::RefCell::new(DecodeScratch::default());
    }
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut scratch) => decode_in_time_order(tree, starts, lanes, &mut scratch),
        Err(_) => decode_in_time_order(tree, starts, lanes, &mut DecodeScratch::default()),
    })
}

fn decode_in_time_order(tree: &RrrHuffman<'_>, starts: &[u32], lanes: &Tree<'_>, scratch: &mut DecodeScratch) -> Timed {
    let mut grouped = vec![0u16; tree.len()];
    tree.for_each_symbol_in(scratch, |c, positions| {
        for &j in positions {
            grouped[j as usize] = c as u16;
        }
    });
    let mut timed = vec![0u16; lanes.len()];
    let mut lane = vec![0u32; lanes.len()];
    match lanes {
        Tree::Huffman(t) => t.for_each_symbol_in(scratch, |s, packets| {
            let from = starts.get(s as usize).map_or(grouped.len(), |&a| a as usize);
            for (&i, &c) in packets.iter().zip(grouped.get(from..).unwrap_or_default()) {
                timed[i as usize] = c;
            }
            for &i in packets {
                lane[i as usize] = s;
            }
        }),
        Tree::Matrix(_) => {
            lane = lanes.decode();
            let mut next: Vec<usize> = starts.iter().map(|&a| a as usize).collect();
            for (i, &s) in lane.iter().enumerate() {
                if let Some(j) = next.get_mut(s as usize) {
                    timed[i] = grouped.get(*j).copied().unwrap_or(0);
                    *j += 1;
                }
            }
        }
    }
    Timed { shapes: timed, lanes: lane }
}

/// A version 6 chunk's shapes decoded into time order, with the lane symbols the decode read on the way (so that
/// a query reading many packets' shapes also has their lane symbols without a lookup each).
#[derive(Debug)]
struct Timed {
    shapes: Vec<u16>,
    lanes: Vec<u32>,
}

/// The shapes of a chunk grouped by lane symbol, each group in time order (what version 6 stores): a stable
/// counting sort by `lane_symbols`.
pub(crate) fn group_by_lane(shapes: &[u32], lane_symbols: &[u32]) -> Vec<u32> {
    let alphabet = lane_symbols.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut next = vec![0usize; alphabet + 1];
    for &s in lane_symbols {
        next[s as usize + 1] += 1;
    }
    for k in 1..next.len() {
        next[k] += next[k - 1];
    }
    let mut out = vec![0u32; shapes.len()];
    for (&shape, &s) in shapes.iter().zip(lane_symbols) {
        out[next[s as usize]] = shape;
        next[s as usize] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use pcaptool_wavelet::{Encode, RrrParams, RsBitVector, RsParams};
    use proptest::prelude::*;

    use super::*;

    /// Every question, asked through the lanes and the RRR tree and then again from the decoded time order, against
    /// the shapes in time order.
    fn check(lanes: &[u32], shapes: &[u32], lane_symbols: usize) {
        let n = lanes.len();
        let lane_bytes = HuffmanWaveletTree::<RsBitVector>::build(
            lanes.iter().copied(),
            RsParams { rate: 16, store_directories: false },
        )
        .to_bytes();
        let shape_bytes =
            HuffmanWaveletTree::<RrrBitVector>::build(group_by_lane(shapes, lanes), RrrParams { block: 63, sample: 4 })
                .to_bytes();
        let tree = Tree::from_bytes(&lane_bytes).unwrap();
        let loaded = Shapes::by_lane(&shape_bytes, &tree, lane_symbols, 64).unwrap();
        let view = loaded.with(Some(&tree));
        let truths: Vec<Vec<bool>> = vec![
            (0..64).map(|c| c % 3 == 0).collect(),
            (0..64).map(|c| c == shapes.first().copied().unwrap_or(0) as usize).collect(),
            (0..64).map(|c| c == 63).collect(),
            vec![true; 64],
            vec![false; 64],
        ];
        for decoded in [false, true] {
            if decoded {
                view.expect(n);
            }
            let mut before = vec![0usize; lane_symbols];
            for (i, &s) in shapes.iter().enumerate() {
                assert_eq!(view.at(i), Some(s), "at({i}), decoded {decoded}");
                let sym = lanes[i];
                assert_eq!(view.at_lane(i, sym, before[sym as usize]), Some(s), "at_lane({i}), decoded {decoded}");
                before[sym as usize] += 1;
                let lane = loaded.decoded_lane(i);
                assert_eq!(lane, decoded.then_some(lanes[i]), "decoded_lane({i}), decoded {decoded}");
            }
            for t in &truths {
                for (l, r) in [(0, n), (n / 3, n - n / 5), (n / 2, n / 2), (1.min(n), n)] {
                    let want: Vec<u32> = (l..r).filter(|&i| t[shapes[i] as usize]).map(|i| i as u32).collect();
                    assert_eq!(view.count_in(t, l, r), want.len(), "count_in({l}, {r}), decoded {decoded}");
                    let mut got = vec![];
                    view.positions(t, l, r, &mut got);
                    assert_eq!(got, want, "positions({l}, {r}), decoded {decoded}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn grouped_shapes_answer_as_the_time_order_does(
            packets in proptest::collection::vec((0u32..9, 0u32..64), 1..2500),
            runs in 1usize..50,
        ) {
            // Lane symbols below 9 (of 10 possible: one never used), shapes in runs as a flow's are.
            let lanes: Vec<u32> = packets.iter().map(|p| p.0).collect();
            let shapes: Vec<u32> = packets.iter().enumerate().map(|(i, p)| packets[i / runs * runs].1.min(p.1 | 1)).collect();
            check(&lanes, &shapes, 10);
        }
    }

    #[test]
    fn one_lane_and_one_shape() {
        check(&[0; 300], &[5; 300], 2);
        check(&[1, 0, 1], &[7, 8, 7], 2);
    }

    #[test]
    fn a_lane_sequence_past_the_lanes_is_refused() {
        let lanes = [0u32, 3, 1];
        let lane_bytes = HuffmanWaveletTree::<RsBitVector>::from_symbols(lanes.iter().copied()).to_bytes();
        let shape_bytes = HuffmanWaveletTree::<RrrBitVector>::from_symbols([1u32, 2, 3]).to_bytes();
        let tree = Tree::from_bytes(&lane_bytes).unwrap();
        let e = Shapes::by_lane(&shape_bytes, &tree, 2, 64).unwrap_err();
        assert!(e.contains("gives 2 of the 3 packets a lane"), "{e}");
        let e = Shapes::by_lane(&shape_bytes, &tree, 4, 3).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }
}
