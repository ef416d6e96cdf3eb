//! Golden error messages: every way a filter can be refused, rendered as the CLI prints it (message, the filter,
//! a caret under the place). `UPDATE_GOLDEN=1 cargo test -p pcaptool-query --test errors` rewrites the file after
//! a deliberate change; review the diff.

use pcaptool_packet::LinkType;
use pcaptool_query::{Filter, Target};

const CASES: &[(&str, u32)] = &[
    ("", 1),
    ("tcp or", 1),
    ("tcp or 80", 1),
    ("(tcp", 1),
    ("tcp)", 1),
    ("host", 1),
    ("host $", 1),
    ("port 08", 1),
    ("port 99999999999", 1),
    ("host 1.2.3.256", 1),
    ("1.2.3.4", 1),
    ("ip proto tcp", 1),
    ("src proto 6", 1),
    ("gateway router", 1),
    ("tcp protochain 6", 1),
    ("geneve 5 or tcp", 1),
    ("geneve 0x1000000", 1),
    ("geneve and ip", 105),
    ("vxlan", 1),
    ("decnet host 1.2", 1),
    ("wlan type data", 1),
    ("ether[0:3] = 1", 1),
    ("tcp[0] = ", 1),
    ("host example.com", 1),
    ("ether host gw", 1),
    ("net corp", 1),
    ("port nosuchservice", 1),
    ("portrange 10-x", 1),
    ("udp port ssh", 1),
    ("port 70000", 1),
    ("tcp host 1.2.3.4", 1),
    ("ip6 host 1.2.3.4", 1),
    ("ip host ::1", 1),
    ("host 10.0.0.0/8", 1),
    ("net 10.0.0.1/8", 1),
    ("net 10.0.0.0/33", 1),
    ("net 10.0.0.1 mask 255.0.0.0", 1),
    ("port 1.2.3.4", 1),
    ("host 1:2:3:4:5:6", 1),
    ("tcp proto 6", 1),
    ("arp proto 6", 1),
    ("len / 0 = 1", 1),
    ("len % 0 = 1", 1),
    ("len << 32 = 1", 1),
    ("tcp and udp", 1),
    ("vlan 5000", 1),
    ("mpls 1048576", 1),
    ("pppoes 65536", 1),
    ("mpls and vlan", 1),
    ("mpls and arp", 1),
    ("ah[0] = 1", 1),
    ("after yesterday", 1),
    ("before 2024-13-01T00:00:00Z", 1),
    ("ether host 1:2:3:4:5:6", 113),
    ("broadcast", 113),
    ("vlan", 9),
    ("ip", 239),
    ("ip", 163),
    ("ether host 1:2:3:4:5:6", 178),
    ("pppoes", 127),
    ("len > 10", 14),
];

fn render(filter: &str, lt: u32) -> String {
    let r = Filter::new(filter).and_then(|f| f.compile(Target::new(LinkType(lt))));
    match r {
        Ok(_) => "accepted".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn error_messages_match_the_golden_file() {
    let mut out = String::new();
    for (f, lt) in CASES {
        out.push_str(&format!("=== {f:?} on link type {lt}\n{}\n", render(f, *lt)));
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/errors.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &out).expect("write the golden file");
    }
    let golden = std::fs::read_to_string(path).expect("tests/golden/errors.txt (UPDATE_GOLDEN=1 creates it)");
    assert_eq!(out, golden, "error messages changed; if deliberate, rerun with UPDATE_GOLDEN=1 and review the diff");
    // Every case but the empty filter is refused.
    assert_eq!(out.matches("\naccepted\n").count(), 1);
}
