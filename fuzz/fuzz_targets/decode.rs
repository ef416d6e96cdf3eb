//! See `pcaptool_packet::fuzz_harness::decode_packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_packet::fuzz_harness::decode_packet(data));
