//! See `pcaptool_capture::fuzz_harness::ring_block`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_capture::fuzz_harness::ring_block(data));
