//! Anonymisation: IP addresses mapped by Crypto-PAn (Xu, Fan, Ammar and Moon, "Prefix-preserving IP address
//! anonymization", ICNP 2002), which keeps prefixes (two addresses sharing their first k bits map to two
//! addresses sharing their first k bits) and is keyed (the same 32-byte key gives the same mapping in every
//! file and run); MAC addresses by the same construction over 48 bits (the multicast and local bits kept,
//! broadcast left alone); payloads optionally cut after the innermost transport header.
//!
//! Every checksum that covers a changed byte is updated incrementally (RFC 1624): the IPv4 header checksum, the
//! TCP, UDP and ICMPv6 checksums through their pseudo-header, and the UDP checksum of a tunnel (VXLAN, Geneve,
//! GTP-U) whose inner packet changed. A checksum that was valid stays valid, one that was wrong stays wrong by as
//! much, and no payload is needed to update one (so cut packets are updated too). UDP over IPv4 without a
//! checksum (0) keeps none.
//!
//! Rewritten: the outer headers and those of decoded tunnels (IP-in-IP, GRE, VXLAN, Geneve, GTP-U), IPv4 and
//! IPv6 addresses, ARP's addresses. Not rewritten: addresses inside payloads (DNS answers, ICMP errors' quoted
//! headers, application protocols), link types other than Ethernet for MACs.

use std::collections::HashMap;

use aes::Aes128;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use pcaptool_packet::{Decoded, LinkType, Transport, decode};

use crate::ToolError;

/// Crypto-PAn with a 32-byte key: AES-128 keyed with its first half, the pad its second half encrypted.
pub struct CryptoPan {
    cipher: Aes128,
    pad: u128,
}

impl std::fmt::Debug for CryptoPan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CryptoPan { .. }")
    }
}

impl CryptoPan {
    /// The mapping of `key`.
    pub fn new(key: &[u8; 32]) -> CryptoPan {
        let cipher = Aes128::new(GenericArray::from_slice(&key[..16]));
        let mut pad = *GenericArray::from_slice(&key[16..]);
        cipher.encrypt_block(&mut pad);
        CryptoPan { cipher, pad: u128::from_be_bytes(pad.into()) }
    }

    /// Maps the first `bits` bits of `addr` (left-aligned in a u128); the rest of the result is 0.
    fn map_bits(&self, addr: u128, bits: u32) -> u128 {
        let mut otp = 0u128;
        for pos in 0..bits {
            // The first `pos` bits from the address, the rest from the pad.
            let keep = if pos == 0 { 0 } else { !0u128 << (128 - pos) };
            let input = (addr & keep) | (self.pad & !keep);
            let mut block = GenericArray::from(input.to_be_bytes());
            self.cipher.encrypt_block(&mut block);
            otp |= u128::from(block[0] >> 7) << (127 - pos);
        }
        let used = if bits == 0 { 0 } else { !0u128 << (128 - bits) };
        (otp ^ addr) & used
    }

    /// An IPv4 address's image.
    pub fn map_v4(&self, addr: [u8; 4]) -> [u8; 4] {
        let a = u128::from(u32::from_be_bytes(addr)) << 96;
        ((self.map_bits(a, 32) >> 96) as u32).to_be_bytes()
    }

    /// An IPv6 address's image.
    pub fn map_v6(&self, addr: [u8; 16]) -> [u8; 16] {
        self.map_bits(u128::from_be_bytes(addr), 128).to_be_bytes()
    }

    /// A MAC address's image: prefix-preserving over its 48 bits, keeping its multicast (I/G) and local (U/L)
    /// bits; broadcast is left alone.
    pub fn map_mac(&self, mac: [u8; 6]) -> [u8; 6] {
        if mac == [0xff; 6] {
            return mac;
        }
        let mut wide = [0u8; 16];
        wide[..6].copy_from_slice(&mac);
        let out = self.map_bits(u128::from_be_bytes(wide), 48).to_be_bytes();
        let mut m = [0u8; 6];
        m.copy_from_slice(&out[..6]);
        m[0] = (m[0] & !0x03) | (mac[0] & 0x03);
        m
    }
}

/// Reads a key: 64 hexadecimal digits (a file's first line, or the text itself), or, from a file, its first 32
/// bytes when it holds exactly 32.
pub fn parse_key(text_or_bytes: &[u8]) -> Result<[u8; 32], ToolError> {
    if text_or_bytes.len() == 32 && !text_or_bytes.iter().all(u8::is_ascii_hexdigit) {
        let mut k = [0u8; 32];
        k.copy_from_slice(text_or_bytes);
        return Ok(k);
    }
    let text = String::from_utf8_lossy(text_or_bytes);
    let hex = text.lines().next().unwrap_or("").trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ToolError::Key(
            "a key is 64 hexadecimal digits (32 bytes), or a file of 32 bytes: make one with `head -c 32 /dev/urandom \
             | xxd -p -c 64`"
                .into(),
        ));
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits checked");
    }
    Ok(k)
}

/// What to anonymise.
#[derive(Clone, Copy, Debug)]
pub struct AnonOptions {
    /// Map Ethernet addresses too.
    pub macs: bool,
    /// Cut each packet after its innermost transport header (or IP header when it has none decoded); the wire
    /// length is kept.
    pub truncate_payload: bool,
}

/// The anonymiser: the mapping and what it has mapped already.
#[derive(Debug)]
pub struct Anonymizer {
    pan: CryptoPan,
    opts: AnonOptions,
    v4: HashMap<[u8; 4], [u8; 4]>,
    v6: HashMap<[u8; 16], [u8; 16]>,
    mac: HashMap<[u8; 6], [u8; 6]>,
}

/// Addresses remembered before the caches start over (bounded memory on traces of many hosts).
const CACHE: usize = 1 << 20;

/// One change of the packet's bytes.
struct Change {
    at: usize,
    old: Vec<u8>,
    new: Vec<u8>,
}

/// The ones'-complement sum of `b` as big-endian 16-bit words, `b` starting at an odd offset from the start of
/// what the checksum covers when `odd`.
fn sum(b: &[u8], odd: bool) -> u32 {
    let mut s = 0u32;
    let mut it = b.chunks(2);
    for w in &mut it {
        let v = u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0));
        s += v;
    }
    let s = fold(s);
    if odd { u32::from((s as u16).swap_bytes()) } else { s }
}

fn fold(mut s: u32) -> u32 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s
}

/// The checksum at `data[at..at + 2]` updated for bytes whose sum went from `old` to `new` (RFC 1624, eq. 3).
fn update(data: &mut [u8], at: usize, old: u32, new: u32, udp: bool) -> Option<Change> {
    let field = data.get(at..at + 2)?;
    let ck = u16::from_be_bytes([field[0], field[1]]);
    if udp && ck == 0 {
        return None; // no checksum
    }
    let s = fold(u32::from(!ck) + u32::from(!(old as u16)) + new);
    let mut out = !(s as u16);
    if udp && out == 0 {
        out = 0xffff;
    }
    let change = Change { at, old: field.to_vec(), new: out.to_be_bytes().to_vec() };
    data[at..at + 2].copy_from_slice(&out.to_be_bytes());
    Some(change)
}

/// The sums, before and after, of the changes in `data[from..]`, aligned to `from`.
fn sums_after(changes: &[Change], from: usize) -> (u32, u32) {
    let (mut old, mut new) = (0, 0);
    for c in changes.iter().filter(|c| c.at >= from) {
        let odd = (c.at - from) % 2 == 1;
        old = fold(old + sum(&c.old, odd));
        new = fold(new + sum(&c.new, odd));
    }
    (old, new)
}

/// One IP layer of a packet: where its headers are and what carries it.
struct Level {
    l3: usize,
    version: u8,
    header_len: usize,
    l4: Option<usize>,
    transport: Option<Transport>,
    /// Whether the packet's bytes reach its transport header's end.
    l4_end: Option<usize>,
}

fn level_of(d: &Decoded) -> Option<Level> {
    let ip = d.ip?;
    let l3 = d.l3_offset? as usize;
    let l4 = d.l4_offset.map(|o| o as usize);
    let l4_end = match (l4, d.transport) {
        (Some(o), Some(Transport::Tcp { header_len, .. })) => Some(o + usize::from(header_len).max(20)),
        (Some(o), Some(Transport::Udp { .. })) => Some(o + 8),
        (Some(o), Some(Transport::Sctp { .. })) => Some(o + 12),
        (Some(o), Some(Transport::Icmp { .. } | Transport::Icmpv6 { .. } | Transport::Igmp { .. })) => Some(o + 8),
        (Some(o), _) => Some(o),
        (None, _) => None,
    };
    Some(Level { l3, version: ip.version, header_len: usize::from(ip.header_len), l4, transport: d.transport, l4_end })
}

impl Anonymizer {
    /// An anonymiser with `key` doing `opts`.
    pub fn new(key: &[u8; 32], opts: AnonOptions) -> Anonymizer {
        Anonymizer { pan: CryptoPan::new(key), opts, v4: HashMap::new(), v6: HashMap::new(), mac: HashMap::new() }
    }

    fn v4(&mut self, a: [u8; 4]) -> [u8; 4] {
        if self.v4.len() >= CACHE {
            self.v4.clear();
        }
        let pan = &self.pan;
        *self.v4.entry(a).or_insert_with(|| pan.map_v4(a))
    }

    fn v6(&mut self, a: [u8; 16]) -> [u8; 16] {
        if self.v6.len() >= CACHE {
            self.v6.clear();
        }
        let pan = &self.pan;
        *self.v6.entry(a).or_insert_with(|| pan.map_v6(a))
    }

    fn mac(&mut self, a: [u8; 6]) -> [u8; 6] {
        if self.mac.len() >= CACHE {
            self.mac.clear();
        }
        let pan = &self.pan;
        *self.mac.entry(a).or_insert_with(|| pan.map_mac(a))
    }

    /// Maps the bytes at `data[at..at + n]` by `f`, recording the change.
    fn map_field(data: &mut [u8], at: usize, n: usize, changes: &mut Vec<Change>, f: &mut dyn FnMut(&[u8]) -> Vec<u8>) {
        let Some(old) = data.get(at..at + n) else { return };
        let old = old.to_vec();
        let new = f(&old);
        if new != old {
            data[at..at + n].copy_from_slice(&new);
            changes.push(Change { at, old, new });
        }
    }

    /// Anonymises one packet of link type `linktype` in place; returns the length to keep (less than
    /// `data.len()` when payloads are cut).
    pub fn packet(&mut self, linktype: LinkType, data: &mut [u8]) -> usize {
        let outer = decode(linktype, data);
        // The IP layers, outermost first, decoded before anything changes.
        let mut levels = Vec::new();
        let mut d = outer;
        for _ in 0..8 {
            if let Some(l) = level_of(&d) {
                levels.push(l);
            }
            match d.decode_inner(data) {
                Some(inner) if d.tunnel.is_some() => d = inner,
                _ => break,
            }
        }
        let innermost = d;
        let mut changes: Vec<Change> = Vec::new();
        // Innermost first: an outer checksum covers the inner bytes, checksums included.
        for l in levels.iter().rev() {
            let first = changes.len();
            let alen = if l.version == 6 { 16 } else { 4 };
            let (src, dst) = if l.version == 6 { (l.l3 + 8, l.l3 + 24) } else { (l.l3 + 12, l.l3 + 16) };
            for at in [src, dst] {
                let this = &mut *self;
                Self::map_field(data, at, alen, &mut changes, &mut |old| match alen {
                    4 => this.v4(old.try_into().expect("4 bytes")).to_vec(),
                    _ => this.v6(old.try_into().expect("16 bytes")).to_vec(),
                });
            }
            let (a_old, a_new) = sums_after(&changes[first..], l.l3);
            if l.version == 4 && l.l3 + l.header_len <= data.len() {
                changes.extend(update(data, l.l3 + 10, a_old, a_new, false));
            }
            let Some(l4) = l.l4 else { continue };
            // The transport checksum covers the pseudo-header (the addresses) and every byte from l4 on.
            let (in_old, in_new) = sums_after(&changes[..first], l4);
            let (old, new) = (fold(a_old + in_old), fold(a_new + in_new));
            let c = match l.transport {
                Some(Transport::Tcp { .. }) => update(data, l4 + 16, old, new, false),
                Some(Transport::Udp { .. }) => update(data, l4 + 6, old, new, true),
                Some(Transport::Icmpv6 { .. }) => update(data, l4 + 2, old, new, false),
                _ => None,
            };
            changes.extend(c);
        }
        if self.opts.macs && linktype.base() == LinkType::ETHERNET && data.len() >= 12 {
            for at in [0, 6] {
                let this = &mut *self;
                Self::map_field(data, at, 6, &mut changes, &mut |old| {
                    this.mac(old.try_into().expect("6 bytes")).to_vec()
                });
            }
        }
        if let (Some(arp), Some(at)) = (outer.arp, outer.l3_offset) {
            let at = at as usize;
            if arp.sender_ip.is_some() || arp.target_ip.is_some() {
                for ip_at in [at + 14, at + 24] {
                    let this = &mut *self;
                    Self::map_field(data, ip_at, 4, &mut changes, &mut |old| {
                        this.v4(old.try_into().expect("4")).to_vec()
                    });
                }
                if self.opts.macs && data.get(at + 4..at + 6) == Some(&[6, 4]) {
                    for mac_at in [at + 8, at + 18] {
                        let this = &mut *self;
                        Self::map_field(data, mac_at, 6, &mut changes, &mut |old| {
                            this.mac(old.try_into().expect("6")).to_vec()
                        });
                    }
                }
            }
        }
        if !self.opts.truncate_payload {
            return data.len();
        }
        let keep = match (levels.last(), level_of(&innermost)) {
            (_, Some(l)) => l.l4_end.unwrap_or(l.l3 + l.header_len),
            (Some(l), None) => l.l4_end.unwrap_or(l.l3 + l.header_len),
            (None, None) => data.len(),
        };
        keep.min(data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [
        21, 34, 23, 141, 51, 164, 207, 128, 19, 10, 91, 22, 73, 144, 125, 16, 216, 152, 143, 131, 121, 121, 101, 39,
        98, 87, 76, 45, 42, 132, 34, 2,
    ];

    /// The published vectors of the reference implementation's sample key (and of its IPv6 extension).
    #[test]
    fn reference_vectors() {
        let pan = CryptoPan::new(&KEY);
        for (a, b) in [
            ("128.11.68.132", "135.242.180.132"),
            ("129.118.74.4", "134.136.186.123"),
            ("130.132.252.244", "133.68.164.234"),
            ("141.223.7.43", "141.167.8.160"),
            ("141.233.145.108", "141.129.237.235"),
            ("152.163.225.39", "151.140.114.167"),
            ("192.102.249.13", "252.138.62.131"),
            ("24.0.250.221", "100.15.198.226"),
            ("64.14.118.196", "0.255.183.58"),
            ("10.185.25.118", "117.161.29.118"),
        ] {
            let a: std::net::Ipv4Addr = a.parse().unwrap();
            assert_eq!(std::net::Ipv4Addr::from(pan.map_v4(a.octets())).to_string(), b);
        }
        for (a, b) in [
            ("::1", "78ff:f001:9fc0:20df:8380:b1f1:704:ed"),
            ("::ffff", "78ff:f001:9fc0:20df:8380:b1f1:704:f838"),
            ("2001:db8::1", "4401:2bc:603f:d91d:27f:ff8e:e6f1:dc1e"),
            ("2001:db8::2", "4401:2bc:603f:d91d:27f:ff8e:e6f1:dc1c"),
        ] {
            let a: std::net::Ipv6Addr = a.parse().unwrap();
            assert_eq!(std::net::Ipv6Addr::from(pan.map_v6(a.octets())).to_string(), b);
        }
    }

    proptest::proptest! {
        /// Two addresses share exactly as many leading bits after the mapping as before.
        #[test]
        fn prefixes_are_preserved(a: u32, b: u32, m: [u8; 6], n: [u8; 6]) {
            let pan = CryptoPan::new(&KEY);
            let (x, y) = (u32::from_be_bytes(pan.map_v4(a.to_be_bytes())), u32::from_be_bytes(pan.map_v4(b.to_be_bytes())));
            proptest::prop_assert_eq!((a ^ b).leading_zeros(), (x ^ y).leading_zeros());
            let (mm, nn) = (pan.map_mac(m), pan.map_mac(n));
            let common = |p: [u8; 6], q: [u8; 6]| {
                let (p, q) = (u64::from_be_bytes([0, 0, p[0], p[1], p[2], p[3], p[4], p[5]]), u64::from_be_bytes([0, 0, q[0], q[1], q[2], q[3], q[4], q[5]]));
                (p ^ q).leading_zeros().min(16 + 6) // the first byte's low two bits are kept, not mapped
            };
            if m != [0xff; 6] && n != [0xff; 6] {
                proptest::prop_assert_eq!(common(m, n), common(mm, nn));
            }
            proptest::prop_assert_eq!(mm[0] & 3, m[0] & 3);
        }

        /// Any bytes of any link type: no panic, never longer, the same twice, the length kept unless cut.
        #[test]
        fn any_packet_is_rewritten_safely(lt in 0usize..12, data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), cut: bool) {
            let lt = LinkType([1u32, 6, 10, 122, 101, 113, 276, 0, 9, 104, 228, 229][lt]);
            let opts = AnonOptions { macs: true, truncate_payload: cut };
            let (mut a, mut b) = (data.clone(), data.clone());
            let ka = Anonymizer::new(&KEY, opts).packet(lt, &mut a);
            let kb = Anonymizer::new(&KEY, opts).packet(lt, &mut b);
            proptest::prop_assert!(ka <= a.len());
            proptest::prop_assert_eq!((ka, &a), (kb, &b));
            if !cut {
                proptest::prop_assert_eq!(ka, data.len());
            }
        }

        /// An updated checksum equals the one computed afresh.
        #[test]
        fn incremental_update_equals_recomputing(mut words in proptest::collection::vec(proptest::prelude::any::<u8>(), 24..64), at in 0usize..10, new in proptest::prelude::any::<[u8; 4]>()) {
            let at = 2 + at * 2; // the checksum at 0..2, a 4-byte field at an even offset after it
            let ck = |b: &[u8]| !(fold(sum(&b[2..], false)) as u16);
            let c0 = ck(&words);
            words[0..2].copy_from_slice(&c0.to_be_bytes());
            let old = words[at..at + 4].to_vec();
            words[at..at + 4].copy_from_slice(&new);
            update(&mut words, 0, sum(&old, false), sum(&new, false), false);
            let got = u16::from_be_bytes([words[0], words[1]]);
            let want = ck(&words);
            // 0x0000 and 0xffff are the same number in ones' complement.
            proptest::prop_assert!(got == want || (got == 0xffff && want == 0) || (got == 0 && want == 0xffff));
        }
    }

    #[test]
    fn keys_parse() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        assert_eq!(parse_key(hex.as_bytes()).unwrap()[1], 0x11);
        assert_eq!(parse_key(format!("{hex}\n").as_bytes()).unwrap()[31], 0xff);
        assert_eq!(parse_key(&[7u8; 32]).unwrap(), [7u8; 32]);
        assert!(parse_key(b"short").is_err());
    }
}
