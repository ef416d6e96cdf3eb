//! `pcaptool_tools::anon`: any packet of any link type the decoder knows is rewritten without a panic, never
//! grows, keeps its length unless payloads are cut, and is rewritten the same way twice.
#![no_main]

use pcaptool_packet::LinkType;
use pcaptool_packet::fuzz_harness::LINKTYPES;
use pcaptool_tools::anon::{AnonOptions, Anonymizer};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let lt = LinkType(LINKTYPES[usize::from(u16::from_le_bytes([data[0], data[1]])) % LINKTYPES.len()]);
    let key = [7u8; 32];
    for (macs, truncate_payload) in [(true, false), (false, true)] {
        let opts = AnonOptions { macs, truncate_payload };
        let (mut a, mut b) = (data[2..].to_vec(), data[2..].to_vec());
        let ka = Anonymizer::new(&key, opts).packet(lt, &mut a);
        let kb = Anonymizer::new(&key, opts).packet(lt, &mut b);
        assert!(ka <= a.len());
        assert_eq!((ka, &a), (kb, &b), "the same key rewrites the same way");
        if !truncate_payload {
            assert_eq!(ka, a.len());
        }
        let _ = pcaptool_packet::decode(lt, &a[..ka]);
    }
});
