//! Huffman code lengths and canonical codes for the Huffman-shaped wavelet tree.

/// Huffman code lengths for `freqs` (all > 0), in the same order. One symbol gets length 0.
pub(crate) fn code_lengths(freqs: &[u64]) -> Vec<u32> {
    let n = freqs.len();
    if n <= 1 {
        return vec![0; n];
    }
    // Two-queue Huffman over leaves sorted by frequency: O(n log n) for the sort, O(n) for the merges.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (freqs[i], i));
    // Nodes: leaves 0..n (in `order`), internal n..2n-1. parent[] links to compute depths.
    let mut weight: Vec<u64> = order.iter().map(|&i| freqs[i]).collect();
    weight.reserve(n - 1);
    let mut parent = vec![usize::MAX; 2 * n - 1];
    let (mut leaf, mut internal) = (0usize, n);
    let pick = |weight: &Vec<u64>, leaf: &mut usize, internal: &mut usize| -> usize {
        let total = weight.len();
        if *leaf < n && (*internal >= total || weight[*leaf] <= weight[*internal]) {
            *leaf += 1;
            *leaf - 1
        } else {
            *internal += 1;
            *internal - 1
        }
    };
    for _ in 0..n - 1 {
        let a = pick(&weight, &mut leaf, &mut internal);
        let b = pick(&weight, &mut leaf, &mut internal);
        let id = weight.len();
        weight.push(weight[a] + weight[b]);
        parent[a] = id;
        parent[b] = id;
    }
    // Depths from the root (the last node) down: parents have larger ids than children.
    let mut depth = vec![0u32; 2 * n - 1];
    for id in (0..2 * n - 2).rev() {
        depth[id] = depth[parent[id]] + 1;
    }
    let mut lengths = vec![0u32; n];
    for (rank, &i) in order.iter().enumerate() {
        lengths[i] = depth[rank];
    }
    lengths
}

/// Codes (read first bit first) for the Huffman-shaped wavelet matrix, given the lengths and, within each length,
/// the order of the symbols. Level by level, the children of the open prefixes are listed in wavelet-matrix order
/// (all `…0` children in the order of their parents, then all `…1` children); the codes ending at this level take
/// the *last* places of that list, the rest stay open. So at every level the elements whose code has ended sort
/// after every element that goes on, and the position mapping of a wavelet matrix skips them for free.
///
/// Returns `(codes, order)`: the code of every symbol, and the symbols in the order their codes were assigned
/// (level by level, list order), which is the order of their ranges at the level where they end.
pub(crate) fn matrix_codes(lengths: &[u32]) -> Option<(Vec<u64>, Vec<usize>)> {
    let n = lengths.len();
    let mut codes = vec![0u64; n];
    let mut order = Vec::with_capacity(n);
    if n <= 1 {
        order.extend(0..n);
        return Some((codes, order));
    }
    let max = *lengths.iter().max()? as usize;
    let mut by_len: Vec<Vec<usize>> = vec![Vec::new(); max + 1];
    for (i, &l) in lengths.iter().enumerate() {
        by_len[l as usize].push(i);
    }
    if !by_len[0].is_empty() {
        return None;
    }
    let mut open: Vec<u64> = vec![0];
    for (d, ending) in by_len.iter().enumerate().skip(1) {
        let mut children: Vec<u64> = open.iter().map(|p| p << 1).chain(open.iter().map(|p| p << 1 | 1)).collect();
        let k = ending.len();
        if k > children.len() {
            return None;
        }
        let first_ended = children.len() - k;
        for (j, &sym) in ending.iter().enumerate() {
            codes[sym] = children[first_ended + j];
            order.push(sym);
        }
        children.truncate(first_ended);
        open = children;
        if open.is_empty() && d < max {
            return None;
        }
    }
    open.is_empty().then_some((codes, order))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_optimal_and_kraft_tight() {
        let freqs = [45u64, 13, 12, 16, 9, 5];
        let l = code_lengths(&freqs);
        assert_eq!(l, vec![1, 3, 3, 3, 4, 4]);
        let kraft: f64 = l.iter().map(|&x| 0.5f64.powi(x as i32)).sum();
        assert!((kraft - 1.0).abs() < 1e-12);
        let (codes, order) = matrix_codes(&l).unwrap();
        assert_eq!(order.len(), l.len());
        // Prefix-free.
        for i in 0..l.len() {
            for j in 0..l.len() {
                if i != j && l[i] <= l[j] {
                    assert_ne!(codes[j] >> (l[j] - l[i]), codes[i], "{i} is a prefix of {j}");
                }
            }
        }
    }
}
