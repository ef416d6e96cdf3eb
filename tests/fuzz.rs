//! Fuzz harness comparing pcaptool's compiled filters with libpcap's (fuzz target `filter_eval`).

use pcaptool_packet::LinkType;
use pcaptool_query::{Filter, Target};

use crate::libpcap::Handle;

/// Link types the first input byte chooses from (those pcaptool evaluates; DLT values for libpcap alike).
pub const LINKTYPES: [u32; 9] = [1, 101, 228, 229, 113, 276, 9, 104, 108];

/// Input: a link type selector byte, a wire-length extra byte, the filter text up to a NUL byte, then the packet.
/// Where both pcaptool and libpcap compile the filter, they must decide the packet alike; where one proves the
/// filter matches nothing, the other must not match the packet.
pub fn filter_vs_libpcap(data: &[u8]) {
    let [sel, extra, rest @ ..] = data else { return };
    let lt = LINKTYPES[usize::from(*sel) % LINKTYPES.len()];
    let (text, pkt) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else { return };
    if text.contains('\n') || text.len() > 400 {
        return;
    }
    let wire = pkt.len() as u32 + u32::from(*extra);
    let ours = Filter::new(text).and_then(|f| f.compile(Target::new(LinkType(lt))));
    let h = Handle::dead(crate::libpcap::linktype_to_dlt(lt));
    let theirs = h.compile(text);
    match (ours, theirs) {
        (Ok(m), Ok(p)) => assert_eq!(
            m.matches(pkt, wire, 0),
            p.matches(pkt, wire),
            "{text:?} on link type {lt}, packet {pkt:02x?} (wire {wire})"
        ),
        (Ok(m), Err(e)) if e.contains("rejects all packets") => assert!(!m.matches(pkt, wire, 0), "{text:?}"),
        (Err(e), Ok(p)) if e.message().contains("rejects all packets") => assert!(!p.matches(pkt, wire), "{text:?}"),
        _ => {}
    }
}
