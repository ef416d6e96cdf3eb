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

/// Canonical codes (MSB first) for the given lengths: symbols sorted by (length, index) get increasing codes.
pub(crate) fn canonical_codes(lengths: &[u32]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| (lengths[i], i));
    let mut codes = vec![0u64; lengths.len()];
    let mut code: u64 = 0;
    let mut prev_len = 0u32;
    for (k, &i) in order.iter().enumerate() {
        let len = lengths[i];
        if k > 0 {
            code = (code + 1) << (len - prev_len);
        } else {
            code = 0;
        }
        codes[i] = code;
        prev_len = len;
    }
    codes
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
        let codes = canonical_codes(&l);
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
