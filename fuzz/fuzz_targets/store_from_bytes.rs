//! See `pcaptool_flowstore::fuzz_harness::store_from_bytes`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_flowstore::fuzz_harness::store_from_bytes(data));
