//! The fuzz harness on the filter table (so that it is exercised by `cargo test`, not only under the fuzzer).

#[test]
fn harness_accepts_the_table() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/filters.txt")).unwrap();
    let mut n = 0;
    for l in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        pcaptool_query::fuzz_harness::parse_roundtrip(l.as_bytes());
        n += 1;
    }
    assert!(n >= 300);
}
