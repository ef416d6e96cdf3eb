//! Succinct structures: rank/select bit vectors and wavelet trees, with no knowledge of packets.
//!
//! - [`RsBitVector`]: plain bits with sampled rank/select directories (tunable rate; González et al.'s "RG").
//! - [`RrrBitVector`]: bits compressed to about H0(B)+o(n) (Raman, Raman and Rao; tunable block size).
//! - [`HuffmanWaveletTree`]: a wavelet tree shaped by the Huffman code of symbol frequencies, over `u32` symbols,
//!   about `n·H0 + o(n·H0)` bits with [`RrrBitVector`] levels; generic over its [`BitVector`].
//! - [`WaveletMatrix`]: the balanced alternative, `n·⌈log2(max+1)⌉` bits.
//!
//! Every structure writes a documented binary format (docs/format/wavelet.md: magic, version, CRC-32) with a
//! streaming writer ([`Encode::write_to`]) and loads from `&[u8]` without copying its bits (usable straight from an
//! mmap; an [`RsBitVector`]'s rank and select directories are computed into memory while loading, so a file may
//! leave them out) through a safe `from_bytes` that validates everything: corrupt or hostile bytes give an
//! [`Error`], never a panic.
//!
//! ```
//! use pcaptool_wavelet::{BitVector, Encode, HuffmanWaveletTree, RsBitVector};
//!
//! let seq = [443u32, 80, 443, 53, 443, 80, 443, 22];
//! let wt = HuffmanWaveletTree::<RsBitVector>::from_symbols(seq.iter().copied());
//! assert_eq!(wt.access(3), 53);
//! assert_eq!(wt.rank(443, 5), 3);             // 443 occurs 3 times in positions [0, 5)
//! assert_eq!(wt.select(80, 1), Some(5));       // the second 80 is at position 5
//! assert_eq!(wt.positions(443, 1, 7).collect::<Vec<_>>(), vec![2, 4, 6]);
//! assert_eq!(wt.count_range(0, 8, 50, 100), 3); // symbols in [50, 100]: 80, 53, 80
//!
//! let bytes = wt.to_bytes();                    // or wt.write_to(file)
//! let view = HuffmanWaveletTree::<RsBitVector<_>, _>::from_bytes(&bytes)?;
//! assert_eq!(view.rank(443, 8), 4);
//! # Ok::<(), pcaptool_wavelet::Error>(())
//! ```
//!
//! ## Complexity and memory
//!
//! | structure | access | rank | select | space (bits) |
//! |---|---|---|---|---|
//! | `RsBitVector` (rate r words) | O(1) | O(1) for r ≤ 8, else O(r) | O(log n) | n + 2n/r (r ≤ 8) or n + n/r, + 2·64 per 4096 ones and zeros |
//! | `RrrBitVector` (block b, sample s) | O(s + b) | O(s + b) | O(log n + s + b) | ≈ n·H0 + n·⌈log2(b+1)⌉/b + 128·n/(b·s) |
//! | `HuffmanWaveletTree` | O(H0) levels avg | O(H0 + log σ) | O(H0 + log σ) | bit vectors over n·(H0+1) bits + 3 words per distinct symbol + 5 per level |
//! | `WaveletMatrix` (w = bits of the largest symbol) | O(w) | O(w) | O(w) | bit vectors over n·w bits |

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bits;
mod error;
mod format;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod huffman;
mod hwt;
mod matrix;
mod rank_select;
mod rrr;
mod rs;
mod words;

pub use bits::BitBuf;
pub use error::Error;
pub use format::{BitVectorCodec, Crc32, DecodeBitVector, Encode, MAGIC, VERSION};
#[doc(hidden)]
pub use format::{Reader, Writer};
pub use hwt::{DecodeScratch, HuffmanWaveletTree, Positions};
pub use matrix::WaveletMatrix;
pub use rank_select::{BitVector, BuildBitVector};
pub use rrr::{RrrBitVector, RrrParams};
pub use rs::{Ones, RsBitVector, RsParams};
pub use words::{LeBytes, Words};
