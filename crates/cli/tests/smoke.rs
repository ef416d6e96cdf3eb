//! The binary starts and answers `--help` and `--version` (the full CLI suite lives in the workspace `tests/`
//! crate; this file also makes `cargo test --workspace` build the binary that suite drives).

use std::process::Command;

#[test]
fn help_and_version() {
    let bin = env!("CARGO_BIN_EXE_pcaptool");
    let out = Command::new(bin).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("info") && text.contains("convert"), "{text}");
    let out = Command::new(bin).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("pcaptool "));
}
