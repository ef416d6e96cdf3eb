//! See `pcaptool_wavelet::fuzz_harness::ops_vs_naive`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_wavelet::fuzz_harness::ops_vs_naive(data));
