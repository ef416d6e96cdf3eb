//! Criterion benchmarks of the pcaptool crates live in `benches/`; the side-by-side harness against tcpdump is
//! `cargo xtask bench`. Results and commands: docs/BENCHMARKS.md.
