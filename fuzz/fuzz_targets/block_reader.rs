//! See `pcaptool_flowstore::fuzz_harness::block_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_flowstore::fuzz_harness::block_reader(data));
