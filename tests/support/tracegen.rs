//! A deterministic generator of realistic Ethernet traces for tests and benchmarks.
//!
//! The same seed and options always give the same bytes. Traffic follows the shapes of real captures in the
//! corpus: many TCP connections (handshake, data both ways with a bimodal size mix, FIN/ACK teardown; heavy-tailed
//! lengths, Pareto with shape 1.1: most connections short, most packets in long ones) to popular servers on
//! well-known ports, DNS and NTP over UDP, ICMP echo, ARP, about 15% IPv6, some 802.1Q-tagged flows and a
//! few fragmented UDP datagrams. Many flows are active at once, so packets of different flows interleave as on a
//! real link.

use std::io::Write;

use pcaptool_packet::{LinkType, PcapWriter, TsPrecision, WriteError};

/// SplitMix64: small, fast and good enough for traffic shapes.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// A generator whose internal state is exactly `state` (no seed scrambling), for data sets that were defined
    /// with that stream.
    pub fn from_state(state: u64) -> Rng {
        Rng(state)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p` percent.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// An index skewed towards small values (roughly Zipf with s = 1 over `n`).
    pub fn zipf(&mut self, n: u64) -> u64 {
        // Inverse of the continuous 1/x distribution on [1, n+1).
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let x = ((n as f64 + 1.0).ln() * u).exp() - 1.0;
        (x as u64).min(n - 1)
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Seed of the random generator.
    pub seed: u64,
    /// Stop after this many packets.
    pub packets: u64,
    /// Or stop once this many bytes of pcap have been written (whichever comes first).
    pub max_bytes: u64,
    /// Client hosts.
    pub clients: u32,
    /// Server hosts.
    pub servers: u32,
    /// Flows open at the same time.
    pub concurrent: usize,
    /// Timestamp of the first packet, ns since the epoch.
    pub start_ns: u64,
    /// Mean gap between packets in ns.
    pub mean_gap_ns: u64,
}

impl Default for GenOptions {
    fn default() -> GenOptions {
        GenOptions {
            seed: 1,
            packets: 10_000,
            max_bytes: u64::MAX,
            clients: 2000,
            servers: 300,
            concurrent: 64,
            start_ns: 1_700_000_000_000_000_000,
            mean_gap_ns: 20_000,
        }
    }
}

/// What was generated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Packets written.
    pub packets: u64,
    /// Bytes of pcap written, header included.
    pub bytes: u64,
    /// Flows started.
    pub flows: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tcp,
    Dns,
    Ntp,
    Icmp,
    Arp,
    Fragmented,
}

#[derive(Clone, Debug)]
struct Flow {
    kind: Kind,
    v6: bool,
    vlan: Option<u16>,
    cmac: [u8; 6],
    smac: [u8; 6],
    caddr: [u8; 16],
    saddr: [u8; 16],
    cport: u16,
    sport: u16,
    /// Packets still to send; the step counter drives the protocol state.
    step: u32,
    total: u32,
    cseq: u32,
    sseq: u32,
    id: u16,
}

const SERVER_PORTS: [(u16, u64); 8] =
    [(443, 50), (80, 20), (22, 5), (25, 3), (993, 3), (8080, 4), (3306, 2), (5432, 2)];

fn mac(prefix: u8, n: u32) -> [u8; 6] {
    let b = n.to_be_bytes();
    [0x02, prefix, b[0], b[1], b[2], b[3]]
}

fn v4(a: u8, n: u32) -> [u8; 16] {
    let mut x = [0u8; 16];
    x[0] = a;
    x[1] = (n >> 16) as u8;
    x[2] = (n >> 8) as u8;
    x[3] = n as u8;
    x
}

fn v6(tag: u16, n: u32) -> [u8; 16] {
    let mut x = [0u8; 16];
    x[0] = 0x20;
    x[1] = 0x01;
    x[2] = 0x0d;
    x[3] = 0xb8;
    x[4..6].copy_from_slice(&tag.to_be_bytes());
    x[12..16].copy_from_slice(&n.to_be_bytes());
    x
}

/// Internet checksum of an IPv4 header.
fn ip_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Builds frames into a reusable buffer.
struct Builder {
    buf: Vec<u8>,
    payload: Vec<u8>,
}

impl Builder {
    fn eth(&mut self, src: [u8; 6], dst: [u8; 6], vlan: Option<u16>, ethertype: u16) {
        self.buf.clear();
        self.buf.extend_from_slice(&dst);
        self.buf.extend_from_slice(&src);
        if let Some(v) = vlan {
            self.buf.extend_from_slice(&0x8100u16.to_be_bytes());
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
        self.buf.extend_from_slice(&ethertype.to_be_bytes());
    }

    /// IP header for `l4_len` bytes of payload; `frag` is (offset in 8-byte units, more fragments).
    #[allow(clippy::too_many_arguments)]
    fn ip(
        &mut self,
        is_v6: bool,
        src: &[u8; 16],
        dst: &[u8; 16],
        proto: u8,
        l4_len: usize,
        id: u16,
        frag: (u16, bool),
    ) {
        if is_v6 {
            self.buf.extend_from_slice(&[0x60, 0, 0, 0]);
            self.buf.extend_from_slice(&(l4_len as u16).to_be_bytes());
            self.buf.push(proto);
            self.buf.push(64);
            self.buf.extend_from_slice(src);
            self.buf.extend_from_slice(dst);
        } else {
            let start = self.buf.len();
            let total = (20 + l4_len) as u16;
            let fo = frag.0 | if frag.1 { 0x2000 } else { 0 } | if frag == (0, false) { 0x4000 } else { 0 };
            self.buf.extend_from_slice(&[0x45, 0]);
            self.buf.extend_from_slice(&total.to_be_bytes());
            self.buf.extend_from_slice(&id.to_be_bytes());
            self.buf.extend_from_slice(&fo.to_be_bytes());
            self.buf.extend_from_slice(&[64, proto, 0, 0]);
            self.buf.extend_from_slice(&src[..4]);
            self.buf.extend_from_slice(&dst[..4]);
            let c = ip_checksum(&self.buf[start..start + 20]);
            self.buf[start + 10..start + 12].copy_from_slice(&c.to_be_bytes());
        }
    }

    fn fill(&mut self, n: usize, salt: u64) {
        let start = (salt as usize) % (self.payload.len() - n.min(self.payload.len()) + 1);
        let end = (start + n).min(self.payload.len());
        self.buf.extend_from_slice(&self.payload[start..end]);
    }
}

fn tcp_payload_len(rng: &mut Rng, from_server: bool) -> usize {
    // Bimodal: full-size segments from servers, small requests, and many pure acknowledgements both ways (about
    // 360 bytes a packet on average, so that 10M packets are a few GB as in the benchmark).
    if from_server {
        match rng.below(100) {
            0..=19 => 1448,
            20..=44 => rng.below(1448) as usize,
            _ => 0,
        }
    } else {
        match rng.below(100) {
            0..=69 => 0,
            70..=94 => 40 + rng.below(500) as usize,
            _ => rng.below(1448) as usize,
        }
    }
}

/// Writes a trace to `w`; returns what was written.
pub fn generate<W: Write>(w: W, opt: &GenOptions) -> Result<(W, GenStats), WriteError> {
    let mut rng = Rng::new(opt.seed);
    let mut payload_rng = Rng::new(opt.seed.wrapping_add(7));
    let payload: Vec<u8> = (0..(1 << 16)).map(|_| payload_rng.next_u64() as u8).collect();
    let mut b = Builder { buf: Vec::with_capacity(2048), payload };
    let mut out = PcapWriter::new(w, LinkType::ETHERNET, 262_144, TsPrecision::Nano)?;
    let mut stats = GenStats { bytes: 24, ..GenStats::default() };
    let mut flows: Vec<Flow> = Vec::with_capacity(opt.concurrent);
    let mut ts = opt.start_ns;
    let router = mac(0xee, 1);
    while stats.packets < opt.packets && stats.bytes < opt.max_bytes {
        while flows.len() < opt.concurrent {
            flows.push(new_flow(&mut rng, opt, router));
            stats.flows += 1;
        }
        let i = rng.below(flows.len() as u64) as usize;
        let f = &mut flows[i];
        emit(&mut b, &mut rng, f);
        f.step += 1;
        let done = f.step >= f.total;
        ts += 1 + rng.below(2 * opt.mean_gap_ns);
        let wirelen = b.buf.len().max(60);
        if b.buf.len() < 60 {
            b.buf.resize(60, 0); // Ethernet padding to the minimum frame
        }
        out.write_packet(ts, wirelen as u32, &b.buf)?;
        stats.packets += 1;
        stats.bytes += 16 + b.buf.len() as u64;
        if done {
            flows.swap_remove(i);
        }
    }
    Ok((out.finish()?, stats))
}

/// A Pareto-distributed count (shape `alpha`, scale `xm`), at most `cap`: flow sizes are heavy-tailed, most flows
/// short and most packets in long ones.
fn pareto(rng: &mut Rng, alpha: f64, xm: f64, cap: u32) -> u32 {
    let u = 1.0 - rng.unit(); // (0, 1]
    let x = xm / u.powf(1.0 / alpha) - xm;
    (x as u64).min(u64::from(cap)) as u32
}

fn new_flow(rng: &mut Rng, opt: &GenOptions, router: [u8; 6]) -> Flow {
    let kind = match rng.below(1000) {
        0..=819 => Kind::Tcp,
        820..=919 => Kind::Dns,
        920..=944 => Kind::Ntp,
        945..=974 => Kind::Icmp,
        975..=989 => Kind::Arp,
        _ => Kind::Fragmented,
    };
    let is_v6 = kind != Kind::Arp && rng.percent(15);
    let c = rng.below(u64::from(opt.clients)) as u32;
    let s = rng.zipf(u64::from(opt.servers)) as u32;
    let (caddr, saddr) = if is_v6 { (v6(1, c), v6(2, s)) } else { (v4(10, c), v4(198, (18 << 16) | s)) };
    let mut sport = match kind {
        Kind::Dns => 53,
        Kind::Ntp => 123,
        Kind::Fragmented => 5001,
        _ => 0,
    };
    if kind == Kind::Tcp {
        let total: u64 = SERVER_PORTS.iter().map(|p| p.1).sum();
        let mut x = rng.below(total);
        for (p, w) in SERVER_PORTS {
            if x < w {
                sport = p;
                break;
            }
            x -= w;
        }
    }
    let total = match kind {
        Kind::Tcp => 7 + 2 * pareto(rng, 1.1, 3.0, 200_000),
        Kind::Dns | Kind::Ntp | Kind::Arp => 2,
        Kind::Icmp => 2 * (1 + rng.below(4) as u32),
        Kind::Fragmented => 3,
    };
    Flow {
        kind,
        v6: is_v6,
        vlan: rng.percent(10).then(|| 100 + rng.below(8) as u16),
        cmac: mac(0xc0, c),
        smac: if rng.percent(50) { router } else { mac(0x5e, s) },
        caddr,
        saddr,
        cport: 1024 + rng.below(64_000) as u16,
        sport,
        step: 0,
        total,
        cseq: rng.next_u64() as u32,
        sseq: rng.next_u64() as u32,
        id: rng.next_u64() as u16,
    }
}

fn emit(b: &mut Builder, rng: &mut Rng, f: &mut Flow) {
    let salt = rng.next_u64();
    // Even steps go client to server, odd ones back (TCP data picks a direction at random).
    let mut to_server = f.step.is_multiple_of(2);
    let et = if f.v6 { 0x86dd } else { 0x0800 };
    match f.kind {
        Kind::Arp => {
            let (src, dst) = if to_server { (f.cmac, [0xff; 6]) } else { (f.smac, f.cmac) };
            b.eth(src, dst, f.vlan, 0x0806);
            let (sha, spa, tha, tpa) =
                if to_server { (f.cmac, f.caddr, [0; 6], f.saddr) } else { (f.smac, f.saddr, f.cmac, f.caddr) };
            b.buf.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, if to_server { 1 } else { 2 }]);
            b.buf.extend_from_slice(&sha);
            b.buf.extend_from_slice(&spa[..4]);
            b.buf.extend_from_slice(&tha);
            b.buf.extend_from_slice(&tpa[..4]);
        }
        Kind::Icmp => {
            let (sm, dm, sa, da) = endpoints(f, to_server);
            b.eth(sm, dm, f.vlan, et);
            let len = 8 + 56;
            b.ip(f.v6, &sa, &da, if f.v6 { 58 } else { 1 }, len, f.id.wrapping_add(f.step as u16), (0, false));
            let ty = match (f.v6, to_server) {
                (false, true) => 8,
                (false, false) => 0,
                (true, true) => 128,
                (true, false) => 129,
            };
            b.buf.extend_from_slice(&[ty, 0, 0, 0]);
            b.buf.extend_from_slice(&f.id.to_be_bytes());
            b.buf.extend_from_slice(&((f.step / 2) as u16).to_be_bytes());
            b.fill(56, salt);
        }
        Kind::Dns | Kind::Ntp => {
            let (sm, dm, sa, da) = endpoints(f, to_server);
            b.eth(sm, dm, f.vlan, et);
            let n = match (f.kind, to_server) {
                (Kind::Ntp, _) => 48,
                (_, true) => 30 + rng.below(40) as usize,
                _ => 60 + rng.below(400) as usize,
            };
            b.ip(f.v6, &sa, &da, 17, 8 + n, f.id.wrapping_add(f.step as u16), (0, false));
            udp(b, f, to_server, n);
            b.fill(n, salt);
        }
        Kind::Fragmented => {
            // One 3000-byte UDP datagram from the client in three fragments (IPv4) or with fragment headers (IPv6).
            let (sm, dm, sa, da) = endpoints(f, true);
            b.eth(sm, dm, f.vlan, et);
            let chunk = 1480usize;
            let total = 8 + 3000usize;
            let off = f.step as usize * chunk;
            let len = chunk.min(total - off);
            let more = off + len < total;
            if f.v6 {
                b.ip(true, &sa, &da, 44, 8 + len, 0, (0, false));
                let fo = ((off / 8) as u16) << 3 | u16::from(more);
                b.buf.extend_from_slice(&[17, 0]);
                b.buf.extend_from_slice(&fo.to_be_bytes());
                b.buf.extend_from_slice(&u32::from(f.id).to_be_bytes());
            } else {
                b.ip(false, &sa, &da, 17, len, f.id, ((off / 8) as u16, more));
            }
            if f.step == 0 {
                udp(b, f, true, 3000);
                b.fill(len - 8, salt);
            } else {
                b.fill(len, salt);
            }
        }
        Kind::Tcp => {
            let last = f.total - 1;
            let (flags, n) = match f.step {
                0 => (0x02, 0),
                1 => (0x12, 0),
                2 => (0x10, 0),
                s if s == last - 2 => (0x11, 0),
                s if s == last - 1 => (0x11, 0),
                s if s == last => (0x10, 0),
                _ => {
                    to_server = rng.percent(35);
                    (0x18, tcp_payload_len(rng, !to_server))
                }
            };
            let to_server = match f.step {
                0 | 2 => true,
                1 => false,
                s if s == last - 2 => true,
                s if s == last - 1 => false,
                s if s == last => true,
                _ => to_server,
            };
            let (sm, dm, sa, da) = endpoints(f, to_server);
            b.eth(sm, dm, f.vlan, et);
            let opts = if flags & 0x02 != 0 { 12 } else { 0 };
            b.ip(f.v6, &sa, &da, 6, 20 + opts + n, f.id.wrapping_add(f.step as u16), (0, false));
            let (sp, dp) = if to_server { (f.cport, f.sport) } else { (f.sport, f.cport) };
            let (seq, ack) = if to_server { (f.cseq, f.sseq) } else { (f.sseq, f.cseq) };
            b.buf.extend_from_slice(&sp.to_be_bytes());
            b.buf.extend_from_slice(&dp.to_be_bytes());
            b.buf.extend_from_slice(&seq.to_be_bytes());
            b.buf.extend_from_slice(&(if flags == 0x02 { 0 } else { ack }).to_be_bytes());
            b.buf.push((((20 + opts) / 4) as u8) << 4);
            b.buf.push(flags);
            b.buf.extend_from_slice(&[0xfa, 0xf0, 0, 0, 0, 0]);
            if opts > 0 {
                b.buf.extend_from_slice(&[2, 4, 0x05, 0xb4, 1, 3, 3, 7, 4, 2, 1, 1]);
            }
            b.fill(n, salt);
            let adv = n as u32 + u32::from(flags & 0x03 != 0);
            if to_server {
                f.cseq = f.cseq.wrapping_add(adv);
            } else {
                f.sseq = f.sseq.wrapping_add(adv);
            }
        }
    }
}

fn endpoints(f: &Flow, to_server: bool) -> ([u8; 6], [u8; 6], [u8; 16], [u8; 16]) {
    if to_server { (f.cmac, f.smac, f.caddr, f.saddr) } else { (f.smac, f.cmac, f.saddr, f.caddr) }
}

fn udp(b: &mut Builder, f: &Flow, to_server: bool, n: usize) {
    let (sp, dp) = if to_server { (f.cport, f.sport) } else { (f.sport, f.cport) };
    b.buf.extend_from_slice(&sp.to_be_bytes());
    b.buf.extend_from_slice(&dp.to_be_bytes());
    b.buf.extend_from_slice(&((8 + n) as u16).to_be_bytes());
    b.buf.extend_from_slice(&[0, 0]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic() {
        let opt = GenOptions { packets: 2000, ..GenOptions::default() };
        let (a, sa) = generate(Vec::new(), &opt).unwrap();
        let (b, sb) = generate(Vec::new(), &opt).unwrap();
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        assert_eq!(sa.packets, 2000);
        assert_eq!(sa.bytes, a.len() as u64);
    }
}
