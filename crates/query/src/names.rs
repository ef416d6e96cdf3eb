//! Service and protocol names, read where libc reads them (`/etc/services`, `/etc/protocols`), as libpcap's
//! `pcap_nametoport` and `pcap_nametoproto` do through getaddrinfo and getprotobyname.

use std::collections::HashMap;
use std::sync::OnceLock;

/// IP protocol numbers libpcap distinguishes for ports.
pub(crate) const IPPROTO_TCP: u32 = 6;
pub(crate) const IPPROTO_UDP: u32 = 17;
pub(crate) const IPPROTO_SCTP: u32 = 132;

#[derive(Default, Debug)]
struct Services {
    tcp: HashMap<String, u32>,
    udp: HashMap<String, u32>,
}

fn services() -> &'static Services {
    static S: OnceLock<Services> = OnceLock::new();
    S.get_or_init(|| {
        let mut s = Services::default();
        let text = std::fs::read_to_string("/etc/services").unwrap_or_default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let (Some(name), Some(pp)) = (words.next(), words.next()) else { continue };
            let Some((port, proto)) = pp.split_once('/') else { continue };
            let Ok(port) = port.parse::<u32>() else { continue };
            let map = match proto {
                "tcp" => &mut s.tcp,
                "udp" => &mut s.udp,
                _ => continue,
            };
            // The first entry for a name wins, as in libc's files backend.
            for n in std::iter::once(name).chain(words) {
                map.entry(n.to_string()).or_insert(port);
            }
        }
        s
    })
}

/// `pcap_nametoport`: the port of a service name and the protocol it is defined for: TCP, UDP, or `None` when
/// both define it with the same number (then the port means TCP, UDP and SCTP).
pub(crate) fn port(name: &str) -> Option<(u32, Option<u32>)> {
    // getaddrinfo takes a numeric service for any protocol.
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return name.parse().ok().map(|p| (p, None));
    }
    let s = services();
    match (s.tcp.get(name), s.udp.get(name)) {
        (Some(&t), Some(&u)) if t == u => Some((t, None)),
        (Some(&t), _) => Some((t, Some(IPPROTO_TCP))),
        (None, Some(&u)) => Some((u, Some(IPPROTO_UDP))),
        (None, None) => None,
    }
}

/// `pcap_nametoportrange`: `lo-hi` as numbers (`sscanf("%d-%d")`), or as two service names.
pub(crate) fn port_range(name: &str) -> Option<(u32, u32, Option<u32>)> {
    if let Some((a, b)) = scan_two_ints(name) {
        return Some((a, b, None));
    }
    let (a, b) = name.split_once('-')?;
    let (p1, proto1) = port(a)?;
    let (p2, proto2) = port(b)?;
    Some((p1, p2, if proto1 == proto2 { proto1 } else { None }))
}

/// `sscanf(s, "%d-%d")` for non-negative numbers: two integers separated by '-', trailing text ignored.
fn scan_two_ints(s: &str) -> Option<(u32, u32)> {
    let digits = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    let n1 = digits(s);
    if n1 == 0 || s.as_bytes().get(n1) != Some(&b'-') {
        return None;
    }
    let rest = &s[n1 + 1..];
    let n2 = digits(rest);
    if n2 == 0 {
        return None;
    }
    // libc's %d on an out-of-range number is undefined; treat it as not a number.
    Some((s[..n1].parse().ok()?, rest[..n2].parse().ok()?))
}

/// `getprotobyname`: an IP protocol number by name or alias.
pub(crate) fn ip_proto(name: &str) -> Option<u32> {
    static P: OnceLock<HashMap<String, u32>> = OnceLock::new();
    let table = P.get_or_init(|| {
        let mut m = HashMap::new();
        let text = std::fs::read_to_string("/etc/protocols").unwrap_or_default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let (Some(name), Some(num)) = (words.next(), words.next()) else { continue };
            let Ok(num) = num.parse::<u32>() else { continue };
            for n in std::iter::once(name).chain(words) {
                m.entry(n.to_string()).or_insert(num);
            }
        }
        m
    });
    table.get(name).copied()
}

/// `pcap_nametoeproto` then `pcap_nametollc`: libpcap's built-in Ethernet type and LLC SAP names.
pub(crate) fn ether_proto(name: &str) -> Option<u32> {
    Some(match name {
        "aarp" => 0x80f3,
        "arp" => 0x0806,
        "atalk" => 0x809b,
        "decnet" => 0x6003,
        "ip" => 0x0800,
        "ip6" => 0x86dd,
        "lat" => 0x6004,
        "loopback" => 0x9000,
        "mopdl" => 0x6001,
        "moprc" => 0x6002,
        "rarp" => 0x8035,
        "sca" => 0x6007,
        "iso" => 0xfe,
        "stp" => 0x42,
        "ipx" => 0xe0,
        "netbeui" => 0xf0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(scan_two_ints("80-90"), Some((80, 90)));
        assert_eq!(scan_two_ints("80-90x"), Some((80, 90)));
        assert_eq!(scan_two_ints("80"), None);
        assert_eq!(port_range("1-2"), Some((1, 2, None)));
    }
}
