//! See `pcaptool_index::fuzz_harness::from_bytes`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_index::fuzz_harness::from_bytes(data));
