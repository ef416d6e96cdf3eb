//! Printing then parsing gives the same expression; parsing never panics.

use pcaptool_query::parse;
use proptest::prelude::*;

fn table() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/filters.txt"))
        .expect("tests/filters.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

fn roundtrip(f: &str) {
    let Ok(Some(e)) = parse(f) else { return };
    let printed = e.to_string();
    let again = parse(&printed).unwrap_or_else(|err| panic!("`{f}` printed as `{printed}` does not parse: {err}"));
    assert_eq!(again.as_ref(), Some(&e), "`{f}` printed as `{printed}` parses differently");
    assert_eq!(again.map(|e| e.to_string()).as_deref(), Some(printed.as_str()));
}

#[test]
fn every_table_filter_prints_and_parses_back() {
    let t = table();
    for f in &t {
        roundtrip(f);
    }
    // Time filters (not in the libpcap table).
    roundtrip("after 2024-05-01T12:00:00.5+02:00 and before 1714564800.25 or tcp");
}

const WORDS: &[&str] = &[
    "host",
    "net",
    "port",
    "portrange",
    "src",
    "dst",
    "or",
    "and",
    "not",
    "!",
    "(",
    ")",
    "tcp",
    "udp",
    "ip",
    "ip6",
    "ether",
    "proto",
    "vlan",
    "mpls",
    "pppoes",
    "len",
    "less",
    "greater",
    "[",
    "]",
    ":",
    "=",
    "!=",
    "<",
    ">",
    "<=",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "&",
    "|",
    "^",
    "<<",
    ">>",
    "1.2.3.4",
    "10.1",
    "::1",
    "fe80::/10",
    "1:2:3:4:5:6",
    "80",
    "0x10",
    "017",
    "4",
    "2",
    "1-1023",
    "http",
    "\\tcp",
    "broadcast",
    "multicast",
    "after",
    "before",
    "1700000000",
    "tcpflags",
    "tcp-syn",
    "icmp",
    "icmptype",
    "mask",
    "255.0.0.0",
    "/",
    "24",
    "gateway",
    "arp",
    "&&",
    "||",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn random_word_sequences_never_panic_and_roundtrip(words in proptest::collection::vec(0..WORDS.len(), 1..12)) {
        let f: Vec<&str> = words.iter().map(|&i| WORDS[i]).collect();
        roundtrip(&f.join(" "));
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,60}") {
        let _ = parse(&s);
    }

    #[test]
    fn table_combinations_roundtrip(a in 0usize..400, b in 0usize..400, op in 0u8..4) {
        let t = table();
        let (a, b) = (&t[a % t.len()], &t[b % t.len()]);
        let f = match op {
            0 => format!("{a} and {b}"),
            1 => format!("({a}) or not ({b})"),
            2 => format!("not {a} or {b}"),
            _ => format!("{a} && !({b})"),
        };
        roundtrip(&f);
    }
}
