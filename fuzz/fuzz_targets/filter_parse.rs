//! See `pcaptool_query::fuzz_harness::parse_roundtrip`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_query::fuzz_harness::parse_roundtrip(data));
