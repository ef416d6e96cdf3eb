//! See `pcaptool_packet::fuzz_harness::pcapng_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_packet::fuzz_harness::pcapng_reader(data));
