//! Succinct structures for pcaptool: rank/select bit vectors and Huffman-shaped wavelet trees.
//!
//! This crate knows nothing of packets. It is filled by the wavelet issue; until then it is empty.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
