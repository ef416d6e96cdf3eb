//! Two network namespaces joined by a veth pair, for the capture tests and benchmarks: no end in the root
//! namespace, addresses from the benchmarking range 198.18.0.0/15 (RFC 2544), IPv6 off (no router solicitations),
//! jumbo MTU so that any packet of a trace fits. Removed on drop. Needs root and iproute2.

use std::process::Command;

/// A veth pair between namespace `a` (device `va`) and namespace `b` (device `vb`).
#[derive(Debug)]
pub struct Pair {
    /// The sending namespace.
    pub a: String,
    /// The capturing namespace.
    pub b: String,
    /// The device in `a`.
    pub va: String,
    /// The device in `b`.
    pub vb: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).output().is_ok_and(|o| o.status.success())
}

impl Pair {
    /// Makes the pair, named after this process and `tag` (at most 4 characters); `Err` says why it cannot (not
    /// root, no iproute2).
    pub fn new(tag: &str) -> Result<Pair, String> {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let p = Pair { a: format!("pta{id}"), b: format!("ptb{id}"), va: format!("va{id}"), vb: format!("vb{id}") };
        if !ip(&["netns", "add", &p.a]) {
            return Err("cannot create a network namespace (this needs root and iproute2)".into());
        }
        let made = ip(&["netns", "add", &p.b])
            && ip(&["link", "add", &p.va, "type", "veth", "peer", "name", &p.vb])
            && ip(&["link", "set", &p.va, "netns", &p.a])
            && ip(&["link", "set", &p.vb, "netns", &p.b]);
        if !made {
            return Err("cannot create a veth pair between two namespaces".into());
        }
        for (ns, dev, addr) in [(&p.a, &p.va, "198.18.0.1/24"), (&p.b, &p.vb, "198.18.0.2/24")] {
            for key in ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"] {
                ip(&["netns", "exec", ns, "sysctl", "-qw", key]);
            }
            // Loopback too: a service started in the namespace (`capture --serve`) listens there.
            let up = ip(&["-n", ns, "link", "set", "lo", "up"])
                && ip(&["-n", ns, "link", "set", dev, "mtu", "9000"])
                && ip(&["-n", ns, "addr", "add", addr, "dev", dev])
                && ip(&["-n", ns, "link", "set", dev, "up"]);
            if !up {
                return Err(format!("cannot bring {dev} up in {ns}"));
            }
        }
        Ok(p)
    }

    /// A command that runs in namespace `ns` (`ip netns exec ns ...`); add the program and its arguments.
    pub fn exec(&self, ns: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        c
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Ethernet frames of `len` bytes (without FCS: 60 for the 64-byte minimum on the wire) carrying IPv4/UDP between
/// `flows` address and port pairs of 198.18.0.0/15, round robin.
pub fn udp_frames(n: usize, len: usize, flows: usize) -> Vec<Vec<u8>> {
    let len = len.max(42);
    (0..n)
        .map(|i| {
            let f = (i % flows.max(1)) as u32;
            let mut b = vec![0u8; len];
            b[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
            b[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
            b[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip_len = (len - 14) as u16;
            b[14] = 0x45;
            b[16..18].copy_from_slice(&ip_len.to_be_bytes());
            b[18..20].copy_from_slice(&(i as u16).to_be_bytes());
            b[22] = 64;
            b[23] = 17;
            b[26..30].copy_from_slice(&[198, 18, (f >> 8) as u8 & 1, f as u8]);
            b[30..34].copy_from_slice(&[198, 19, 0, (f % 7) as u8 + 1]);
            let sum = checksum(&b[14..34]);
            b[24..26].copy_from_slice(&sum.to_be_bytes());
            b[34..36].copy_from_slice(&(10_000 + (f % 50_000) as u16).to_be_bytes());
            b[36..38].copy_from_slice(&9u16.to_be_bytes());
            b[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
            b
        })
        .collect()
}

fn checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}
