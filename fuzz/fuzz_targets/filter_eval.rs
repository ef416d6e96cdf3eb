//! See `pcaptool_tests::fuzz::filter_vs_libpcap`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_tests::fuzz::filter_vs_libpcap(data));
