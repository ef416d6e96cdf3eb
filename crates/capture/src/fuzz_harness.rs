//! Fuzz support (not part of the API): the ring block reader on arbitrary bytes, and a block as the kernel lays
//! it out, for seeds and tests.

use crate::ring;

/// Fuzz target `ring_block`: `data` read as a TPACKET_V3 block; nothing may panic or reach outside it.
pub fn ring_block(data: &[u8]) {
    let mut scratch = Vec::new();
    let (num, bad) = ring::packets(data, |p| {
        assert!(p.data.len() <= data.len());
        if let Some((tpid, tci)) = p.vlan {
            assert_eq!(ring::with_vlan(p.data, tpid, tci, &mut scratch).len(), p.data.len() + 4);
        }
    });
    assert!(bad <= num);
}

/// A block as the kernel lays it out, holding `pkts` (bytes, wire length, VLAN TCI the kernel took off) at
/// 16-byte aligned offsets.
pub fn block(pkts: &[(&[u8], u32, Option<u16>)]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[12..16].copy_from_slice(&(pkts.len() as u32).to_ne_bytes());
    b[16..20].copy_from_slice(&48u32.to_ne_bytes());
    let mut at = 48;
    for (i, (data, len, vlan)) in pkts.iter().enumerate() {
        let mac = 68u16;
        let next = if i + 1 == pkts.len() { 0 } else { (usize::from(mac) + data.len()).div_ceil(16) * 16 };
        b[at..at + 4].copy_from_slice(&(next as u32).to_ne_bytes());
        b[at + 4..at + 8].copy_from_slice(&(1_700_000_000u32 + i as u32).to_ne_bytes());
        b[at + 8..at + 12].copy_from_slice(&(123u32).to_ne_bytes());
        b[at + 12..at + 16].copy_from_slice(&(data.len() as u32).to_ne_bytes());
        b[at + 16..at + 20].copy_from_slice(&len.to_ne_bytes());
        let status: u32 = 1 | if vlan.is_some() { 1 << 4 } else { 0 };
        b[at + 20..at + 24].copy_from_slice(&status.to_ne_bytes());
        b[at + 24..at + 26].copy_from_slice(&mac.to_ne_bytes());
        b[at + 32..at + 36].copy_from_slice(&u32::from(vlan.unwrap_or(0)).to_ne_bytes());
        let s = at + usize::from(mac);
        b[s..s + data.len()].copy_from_slice(data);
        at += next;
    }
    b
}
