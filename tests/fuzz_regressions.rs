//! Replays every saved fuzz input (fuzz/regressions/<target>/) through the harness the fuzzer runs.

use pcaptool_packet::fuzz_harness;
use pcaptool_tests::repo_root;

#[test]
fn replay_fuzz_regressions() {
    let mut n = 0;
    for (target, f) in [
        ("pcap_reader", fuzz_harness::pcap_reader as fn(&[u8])),
        ("pcapng_reader", fuzz_harness::pcapng_reader),
        ("stream_reader", fuzz_harness::stream_reader),
        ("decode", fuzz_harness::decode_packet),
        ("wavelet_from_bytes", pcaptool_wavelet::fuzz_harness::from_bytes),
        ("wavelet_ops", pcaptool_wavelet::fuzz_harness::ops_vs_naive),
        ("filter_parse", pcaptool_query::fuzz_harness::parse_roundtrip),
        ("filter_eval", pcaptool_tests::fuzz::filter_vs_libpcap),
        ("index_from_bytes", pcaptool_index::fuzz_harness::from_bytes),
        ("segment_from_bytes", pcaptool_flowstore::fuzz_harness::segment_from_bytes),
        ("store_from_bytes", pcaptool_flowstore::fuzz_harness::store_from_bytes),
        ("block_reader", pcaptool_flowstore::fuzz_harness::block_reader),
    ] {
        let dir = repo_root().join("fuzz/regressions").join(target);
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            f(&data);
            n += 1;
        }
    }
    assert!(n >= 10, "the regression folders are not empty");
    println!("replayed {n} fuzz regression inputs");
}
