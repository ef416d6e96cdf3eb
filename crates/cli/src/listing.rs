//! Packets listed one a line, as tcpdump lists them when it writes no file: time, protocol, addresses and ports,
//! what the transport header says, length. Numeric (as `tcpdump -n`); times in UTC with nanoseconds. With
//! `--json`, one object a packet with the decoded fields.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::IpAddr;

use pcaptool_engine::{Sink, SinkError};
use pcaptool_packet::{Decoded, Interface, Record, Rfc3339, Transport, TunnelKind, decode};
use serde_json::{Map, Value, json};

/// A sink that prints each record it takes.
pub(crate) struct Listing<W: Write> {
    out: W,
    json: bool,
    line: String,
}

impl<W: Write> Listing<W> {
    pub(crate) fn new(out: W, json: bool) -> Listing<W> {
        Listing { out, json, line: String::with_capacity(160) }
    }

    fn io(e: io::Error) -> SinkError {
        SinkError::Io { to: "standard output".into(), source: e }
    }
}

impl<W: Write> Sink for Listing<W> {
    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        let _ = ifaces;
        let d = decode(rec.linktype, rec.data);
        self.line.clear();
        if self.json {
            let v = json_of(rec, &d);
            self.line.push_str(&v.to_string());
        } else {
            text_of(&mut self.line, rec, &d);
        }
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes()).map_err(Self::io)?;
        Ok(true)
    }

    fn finish(&mut self, _: &[Interface]) -> Result<(), SinkError> {
        self.out.flush().map_err(Self::io)
    }
}

/// tcpdump's letters for the TCP flags (S F R P U E W, `.` for ACK), in its order.
pub(crate) fn tcp_flags(flags: u8) -> String {
    let mut s = String::new();
    for (bit, c) in [(0x02, 'S'), (0x01, 'F'), (0x04, 'R'), (0x08, 'P'), (0x20, 'U'), (0x40, 'E'), (0x80, 'W')] {
        if flags & bit != 0 {
            s.push(c);
        }
    }
    if flags & 0x10 != 0 {
        s.push('.');
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

fn mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// An address and port as tcpdump -n writes them: `10.0.0.1.80`, `2001:db8::1.53`.
fn endpoint(out: &mut String, addr: IpAddr, port: Option<u16>) {
    let _ = write!(out, "{addr}");
    if let Some(p) = port {
        let _ = write!(out, ".{p}");
    }
}

fn tunnel_name(k: TunnelKind) -> &'static str {
    match k {
        TunnelKind::Gre => "gre",
        TunnelKind::Erspan => "erspan",
        TunnelKind::IpInIp => "ip-in-ip",
        TunnelKind::Vxlan => "vxlan",
        TunnelKind::Geneve => "geneve",
        TunnelKind::GtpU => "gtp-u",
        _ => "tunnel",
    }
}

fn proto_name(p: u8) -> Option<&'static str> {
    Some(match p {
        1 => "ICMP",
        2 => "IGMP",
        6 => "TCP",
        17 => "UDP",
        47 => "GRE",
        50 => "ESP",
        51 => "AH",
        58 => "ICMP6",
        89 => "OSPF",
        103 => "PIM",
        112 => "VRRP",
        132 => "SCTP",
        _ => return None,
    })
}

fn text_of(out: &mut String, rec: &Record<'_>, d: &Decoded) {
    let _ = write!(out, "{} ", Rfc3339(rec.ts_ns));
    for v in d.vlan_ids() {
        let _ = write!(out, "vlan {v} ");
    }
    for l in d.mpls_labels() {
        let _ = write!(out, "mpls {l} ");
    }
    if let Some(ip) = &d.ip {
        out.push_str(if ip.version == 6 { "IP6 " } else { "IP " });
        let ports = d.transport.as_ref().and_then(Transport::ports);
        endpoint(out, ip.src, ports.map(|p| p.0));
        out.push_str(" > ");
        endpoint(out, ip.dst, ports.map(|p| p.1));
        out.push_str(": ");
        let proto = ip.proto.0;
        match d.transport {
            Some(Transport::Tcp { flags, .. }) => {
                let _ = write!(out, "TCP [{}]", tcp_flags(flags));
            }
            Some(Transport::Icmp { ty, code }) => {
                let _ = write!(out, "ICMP type {ty} code {code}");
            }
            Some(Transport::Icmpv6 { ty, code }) => {
                let _ = write!(out, "ICMP6 type {ty} code {code}");
            }
            Some(Transport::Igmp { ty }) => {
                let _ = write!(out, "IGMP type {ty}");
            }
            _ => match proto_name(proto) {
                Some(n) => out.push_str(n),
                None => {
                    let _ = write!(out, "ip-proto-{proto}");
                }
            },
        }
        if let Some(f) = &ip.fragment {
            let _ = write!(out, " (frag {}:{}{})", f.id, u32::from(f.offset) * 8, if f.more { "+" } else { "" });
        }
        if let Some(t) = &d.tunnel {
            let _ = write!(out, " {}", tunnel_name(t.kind));
        }
    } else if let Some(arp) = &d.arp {
        let ip = |a: Option<[u8; 4]>| a.map_or_else(|| "?".to_string(), |a| std::net::Ipv4Addr::from(a).to_string());
        match arp.op {
            1 => {
                let _ = write!(out, "ARP, Request who-has {} tell {}", ip(arp.target_ip), ip(arp.sender_ip));
            }
            2 => {
                let _ = write!(out, "ARP, Reply {} is-at", ip(arp.sender_ip));
                if let Some(e) = &d.eth {
                    let _ = write!(out, " {}", mac(&e.src));
                }
            }
            op => {
                let _ = write!(out, "ARP, op {op} {} > {}", ip(arp.sender_ip), ip(arp.target_ip));
            }
        }
    } else if let Some(e) = &d.eth {
        let _ = write!(out, "{} > {}", mac(&e.src), mac(&e.dst));
        match d.ethertype {
            Some(t) => {
                let _ = write!(out, ", ethertype 0x{:04x}", t.0);
            }
            None => out.push_str(", 802.3"),
        }
    } else {
        let _ = write!(out, "link type {}", d.linktype);
    }
    let _ = write!(out, ", length {}", rec.wirelen);
}

fn json_of(rec: &Record<'_>, d: &Decoded) -> Value {
    let mut m = Map::new();
    m.insert("ts".into(), json!(rec.ts_ns));
    m.insert("time".into(), json!(Rfc3339(rec.ts_ns).to_string()));
    m.insert("caplen".into(), json!(rec.data.len()));
    m.insert("len".into(), json!(rec.wirelen));
    m.insert("iface".into(), json!(rec.iface));
    m.insert("linktype".into(), json!(rec.linktype.0));
    if let Some(e) = &d.eth {
        m.insert("eth_src".into(), json!(mac(&e.src)));
        m.insert("eth_dst".into(), json!(mac(&e.dst)));
    }
    if let Some(t) = d.ethertype {
        m.insert("ethertype".into(), json!(t.0));
    }
    if d.vlan_count > 0 {
        m.insert("vlan".into(), json!(d.vlan_ids()));
    }
    if d.mpls_count > 0 {
        m.insert("mpls".into(), json!(d.mpls_labels()));
    }
    if let Some(ip) = &d.ip {
        m.insert("ip_version".into(), json!(ip.version));
        m.insert("src".into(), json!(ip.src.to_string()));
        m.insert("dst".into(), json!(ip.dst.to_string()));
        m.insert("proto".into(), json!(ip.proto.0));
        m.insert("ttl".into(), json!(ip.ttl));
        if let Some(f) = &ip.fragment {
            m.insert("frag".into(), json!({ "id": f.id, "offset": u32::from(f.offset) * 8, "more": f.more }));
        }
    }
    if let Some(arp) = &d.arp {
        let ip = |a: Option<[u8; 4]>| a.map(|a| std::net::Ipv4Addr::from(a).to_string());
        m.insert("arp".into(), json!({ "op": arp.op, "sender": ip(arp.sender_ip), "target": ip(arp.target_ip) }));
    }
    if let Some((sp, dp)) = d.transport.as_ref().and_then(Transport::ports) {
        m.insert("sport".into(), json!(sp));
        m.insert("dport".into(), json!(dp));
    }
    match d.transport {
        Some(Transport::Tcp { flags, .. }) => {
            m.insert("tcp_flags".into(), json!(tcp_flags(flags)));
        }
        Some(Transport::Icmp { ty, code }) | Some(Transport::Icmpv6 { ty, code }) => {
            m.insert("icmp_type".into(), json!(ty));
            m.insert("icmp_code".into(), json!(code));
        }
        Some(Transport::Igmp { ty }) => {
            m.insert("igmp_type".into(), json!(ty));
        }
        _ => {}
    }
    if let Some(t) = &d.tunnel {
        m.insert("tunnel".into(), json!(tunnel_name(t.kind)));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_as_tcpdump_writes_them() {
        assert_eq!(tcp_flags(0x02), "S");
        assert_eq!(tcp_flags(0x12), "S.");
        assert_eq!(tcp_flags(0x18), "P.");
        assert_eq!(tcp_flags(0x11), "F.");
        assert_eq!(tcp_flags(0x04), "R");
        assert_eq!(tcp_flags(0x00), "none");
        assert_eq!(tcp_flags(0xc2), "SEW");
    }

    #[test]
    fn a_tcp_packet_is_one_line() {
        // Ethernet, IPv4 10.0.0.1 > 10.0.0.2, TCP 1234 > 80 SYN.
        let mut p = vec![0u8; 14 + 20 + 20];
        p[12] = 0x08;
        p[14] = 0x45;
        p[16..18].copy_from_slice(&40u16.to_be_bytes());
        p[22] = 64;
        p[23] = 6;
        p[26..30].copy_from_slice(&[10, 0, 0, 1]);
        p[30..34].copy_from_slice(&[10, 0, 0, 2]);
        p[34..36].copy_from_slice(&1234u16.to_be_bytes());
        p[36..38].copy_from_slice(&80u16.to_be_bytes());
        p[46] = 0x50;
        p[47] = 0x02;
        let eth = pcaptool_packet::LinkType::ETHERNET;
        let rec = Record {
            ts_ns: 1_000_000_000_123,
            has_ts: true,
            wirelen: 54,
            iface: 0,
            linktype: eth,
            offset: 0,
            record_len: 0,
            data: &p,
        };
        let d = decode(eth, &p);
        let mut s = String::new();
        text_of(&mut s, &rec, &d);
        assert_eq!(s, "1970-01-01T00:16:40.000000123Z IP 10.0.0.1.1234 > 10.0.0.2.80: TCP [S], length 54");
    }
}
