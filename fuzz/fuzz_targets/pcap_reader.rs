//! See `pcaptool_packet::fuzz_harness::pcap_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pcaptool_packet::fuzz_harness::pcap_reader(data));
