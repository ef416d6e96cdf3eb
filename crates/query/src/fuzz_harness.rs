//! The bodies of the fuzz targets for the filter language (fuzz/fuzz_targets/), here so that `cargo test`
//! replays every saved crash input through the code the fuzzer ran. Not part of the stable API.

use pcaptool_packet::LinkType;

use crate::{Filter, Target, parse};

/// Link types the harnesses compile for.
pub const LINKTYPES: [u32; 12] = [1, 0, 108, 101, 228, 229, 113, 276, 9, 104, 107, 127];

/// Parses arbitrary text: never panics; what parses prints as text that parses to the same expression; what
/// compiles runs on the text's own bytes as a packet without panicking.
pub fn parse_roundtrip(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(Some(e)) = parse(&text) else { return };
    let printed = e.to_string();
    let again = parse(&printed).unwrap_or_else(|err| panic!("{text:?} printed as {printed:?} does not parse: {err}"));
    assert_eq!(again.as_ref(), Some(&e), "{text:?} printed as {printed:?} parses differently");
    let Ok(f) = Filter::new(&text) else { return };
    for lt in LINKTYPES {
        if let Ok(m) = f.compile(Target::new(LinkType(lt))) {
            let cond = f.cond(Target::new(LinkType(lt))).expect("compiled once");
            for cut in [0, data.len() / 2, data.len()] {
                let pkt = &data[..cut];
                let wire = cut as u32 + 4;
                let fast = m.matches(pkt, wire, 0);
                let p = crate::prog::Packet { data: pkt, wirelen: wire, ts_ns: 0 };
                // The optimised program may skip a test whose branches meet (as libpcap does), so it can match
                // where the unoptimised tree gives up on a short packet, never the other way round.
                if cond.eval(&p) == Some(true) {
                    assert!(fast, "{text:?} on link type {lt}: the tree matches {pkt:02x?}, the program does not");
                }
                if cond.eval(&p) == Some(false) {
                    assert!(!fast, "{text:?} on link type {lt}: the tree rejects {pkt:02x?}, the program matches");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The harness on the filter table (so that it is exercised by `cargo test`, not only under the fuzzer).
    #[test]
    fn harness_accepts_the_table() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/filters.txt")).unwrap();
        let mut n = 0;
        for l in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
            super::parse_roundtrip(l.as_bytes());
            n += 1;
        }
        assert!(n >= 300);
    }
}
