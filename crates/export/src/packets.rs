//! What an export reads of a segment: its flows (from stage 2 alone) and, when asked, one row of metadata per
//! packet (every packet's record read back, checked against the data checksums, and decoded).

use std::net::IpAddr;

use pcaptool_flowstore::{Flow, Segment, StoreError};
use pcaptool_packet::{Transport, decode};

/// One packet's metadata: its locator, time, lengths, 5-tuple, TCP flags and flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketRow {
    /// Its position in the store's original order: the packet's locator, with the store and segment.
    pub seq: u64,
    /// Its flow (`None`: a packet without an IP header, such as ARP, belongs to no flow).
    pub flow_id: Option<u64>,
    /// Timestamp, ns since the epoch (UTC).
    pub ts_ns: u64,
    /// Bytes captured.
    pub caplen: u32,
    /// Length on the wire.
    pub wirelen: u32,
    /// The interface it came from (index in the source pcapng file, or in a capture's interfaces; 0 for pcap).
    pub iface: u32,
    /// Source and destination address of its (outermost) IP header.
    pub src: Option<IpAddr>,
    /// See `src`.
    pub dst: Option<IpAddr>,
    /// Source and destination port (TCP, UDP and SCTP).
    pub sport: Option<u16>,
    /// See `sport`.
    pub dport: Option<u16>,
    /// The upper-layer protocol (after IPv6 extension headers).
    pub proto: Option<u8>,
    /// The outermost VLAN id, 0 when untagged.
    pub vlan: u16,
    /// The TCP flag byte (CWR ECE URG ACK PSH RST SYN FIN), for TCP.
    pub tcp_flags: Option<u8>,
}

/// A segment's rows: its flows' parts, and its packets when asked for (in the store's original order).
pub(crate) struct SegmentRows {
    pub(crate) flows: Vec<Flow>,
    pub(crate) packets: Option<Vec<PacketRow>>,
}

/// Reads segment `seg`'s flows and, if `packets`, its packets' rows.
pub(crate) fn read_segment(seg: &Segment, packets: bool) -> Result<SegmentRows, StoreError> {
    let s2 = seg.stage2()?;
    let entries = s2.entries()?;
    let flows = entries.iter().filter(|e| !e.is_no_flow()).map(|e| e.flow).collect();
    if !packets {
        return Ok(SegmentRows { flows, packets: None });
    }
    let mut rows = Vec::with_capacity(usize::try_from(seg.stage1.packets).unwrap_or(0));
    let mut buf = Vec::new();
    for e in &entries {
        let flow_id = (!e.is_no_flow()).then_some(e.flow.id);
        seg.read_flow(&s2, e, &mut buf, &mut |p| {
            let d = decode(p.meta.linktype, p.data);
            let ip = d.ip;
            let ports = d.transport.and_then(|t| t.ports());
            rows.push(PacketRow {
                seq: p.seq,
                flow_id,
                ts_ns: p.ts_ns,
                caplen: p.data.len() as u32,
                wirelen: p.wirelen,
                iface: p.meta.iface,
                src: ip.map(|i| i.src),
                dst: ip.map(|i| i.dst),
                sport: ports.map(|p| p.0),
                dport: ports.map(|p| p.1),
                proto: ip.map(|i| i.proto.0),
                vlan: d.vlan_ids().first().copied().unwrap_or(0),
                tcp_flags: match d.transport {
                    Some(Transport::Tcp { flags, .. }) => Some(flags),
                    _ => None,
                },
            });
        })?;
    }
    rows.sort_unstable_by_key(|r| r.seq);
    Ok(SegmentRows { flows, packets: Some(rows) })
}
