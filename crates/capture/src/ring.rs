//! Reading the packets of a TPACKET_V3 block (Documentation/networking/packet_mmap.rst), by offsets into the
//! block's bytes: no struct is cast over kernel memory, and every offset is checked against the block.

/// A packet in a block: its timestamp, length on the wire, captured bytes and VLAN tag the kernel took off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingPacket<'a> {
    pub ts_ns: u64,
    pub wirelen: u32,
    pub data: &'a [u8],
    /// (TPID, TCI) of an outer VLAN tag the kernel stripped (`TP_STATUS_VLAN_VALID`), to be put back.
    pub vlan: Option<(u16, u16)>,
    /// Whether the host sent it (`PACKET_OUTGOING` in the `sockaddr_ll` after the header).
    pub outgoing: bool,
}

/// `sll_pkttype` of a packet this host sent.
const PACKET_OUTGOING: u8 = 4;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}

const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// Calls `f` with each packet of `block` (a whole block the kernel handed over); returns how many packets the
/// block says it holds and how many were malformed (offsets outside the block: never expected from the kernel,
/// counted rather than trusted).
pub(crate) fn packets<'a>(block: &'a [u8], mut f: impl FnMut(RingPacket<'a>)) -> (u32, u32) {
    // tpacket_block_desc: version u32, offset_to_priv u32, then tpacket_hdr_v1: block_status u32, num_pkts u32,
    // offset_to_first_pkt u32, blk_len u32, ...
    let (Some(num), Some(first)) = (u32_at(block, 12), u32_at(block, 16)) else { return (0, 0) };
    let mut at = first as usize;
    let mut bad = 0;
    for i in 0..num {
        // tpacket3_hdr: next_offset u32, sec u32, nsec u32, snaplen u32, len u32, status u32, mac u16, net u16,
        // hv1 { rxhash u32, vlan_tci u32, vlan_tpid u16, padding u16 }.
        let h = |o: usize| u32_at(block, at + o);
        let (Some(next), Some(sec), Some(nsec), Some(snap), Some(len), Some(status), Some(mac)) =
            (h(0), h(4), h(8), h(12), h(16), h(20), u16_at(block, at + 24))
        else {
            bad += num - i;
            break;
        };
        let start = at + usize::from(mac);
        match block.get(start..start + snap as usize) {
            Some(data) => {
                let vlan = (status & TP_STATUS_VLAN_VALID != 0).then(|| {
                    let tci = h(32).unwrap_or(0) as u16;
                    let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                        u16_at(block, at + 36).unwrap_or(0x8100)
                    } else {
                        0x8100
                    };
                    (tpid, tci)
                });
                // The sockaddr_ll follows the 48-byte tpacket3_hdr; sll_pkttype is its byte 10.
                let outgoing = block.get(at + 58) == Some(&PACKET_OUTGOING);
                let ts_ns = u64::from(sec) * 1_000_000_000 + u64::from(nsec);
                f(RingPacket { ts_ns, wirelen: len, data, vlan, outgoing });
            }
            None => bad += 1,
        }
        if next == 0 {
            if i + 1 < num {
                bad += num - i - 1;
            }
            break;
        }
        at += next as usize;
    }
    (num, bad)
}

/// Puts a stripped VLAN tag back after the two MAC addresses of an Ethernet frame, as it was on the wire (what
/// libpcap does); returns the frame in `out`.
pub(crate) fn with_vlan<'o>(data: &[u8], tpid: u16, tci: u16, out: &'o mut Vec<u8>) -> &'o [u8] {
    out.clear();
    let cut = data.len().min(12);
    out.extend_from_slice(&data[..cut]);
    out.extend_from_slice(&tpid.to_be_bytes());
    out.extend_from_slice(&tci.to_be_bytes());
    out.extend_from_slice(&data[cut..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fuzz_harness::block;

    #[test]
    fn reads_every_packet_with_its_timestamp_and_vlan() {
        let b =
            block(&[(&[1, 2, 3][..], 60, None), (&[4u8; 100][..], 100, Some(0x0123)), (&[5u8; 14][..], 1514, None)]);
        let mut got = Vec::new();
        let (n, bad) = packets(&b, |p| got.push((p.ts_ns, p.wirelen, p.data.to_vec(), p.vlan)));
        assert_eq!((n, bad), (3, 0));
        assert_eq!(got[0], (1_700_000_000_000_000_123, 60, vec![1, 2, 3], None));
        assert_eq!(got[1].3, Some((0x8100, 0x0123)));
        assert_eq!(got[2].2, vec![5u8; 14]);
    }

    #[test]
    fn offsets_outside_the_block_are_counted_not_followed() {
        let mut b = block(&[(&[1, 2, 3][..], 60, None), (&[4u8; 10][..], 10, None)]);
        b[48..52].copy_from_slice(&100_000u32.to_ne_bytes());
        let mut n = 0;
        let (num, bad) = packets(&b, |_| n += 1);
        assert_eq!((num, bad, n), (2, 1, 1));
        let (num, bad) = packets(&b[..10], |_| n += 1);
        assert_eq!((num, bad), (0, 0));
    }

    #[test]
    fn vlan_tags_go_back_after_the_addresses() {
        let frame: Vec<u8> = (0..20).collect();
        let mut out = Vec::new();
        let v = with_vlan(&frame, 0x8100, 0x0064, &mut out);
        assert_eq!(&v[..12], &frame[..12]);
        assert_eq!(&v[12..16], &[0x81, 0x00, 0x00, 0x64]);
        assert_eq!(&v[16..], &frame[12..]);
    }
}
