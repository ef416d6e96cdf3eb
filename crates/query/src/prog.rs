//! The compiled form of a filter: a tree of tests over loads from the packet, with libpcap's run-time rules.
//!
//! Semantics (those of libpcap's BPF interpreter, `bpf_filter`):
//! - Loads are big-endian and bounds-checked against the captured length; a load past the end, or a division or
//!   modulus by zero, ends the whole program with "no match", wherever it happens (even under a `not`).
//! - Arithmetic is on `u32`, wrapping; shifts by 32 or more give 0; comparisons are unsigned.
//! - `and` and `or` evaluate their left side first and stop as soon as the result is known, so a load on the
//!   right is only made when the left side lets evaluation reach it.
//!
//! [`Cond::eval`] is the reference evaluator; [`crate::Matcher`] runs the same tree flattened into bytecode.

use std::fmt;

/// A jump test of libpcap's BPF: `==`, `>`, `>=` or "any of these bits set".
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Test {
    /// `a == b`
    Eq,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// `a & b != 0`
    Set,
}

impl Test {
    #[inline]
    pub(crate) fn apply(self, a: u32, b: u32) -> bool {
        match self {
            Test::Eq => a == b,
            Test::Gt => a > b,
            Test::Ge => a >= b,
            Test::Set => a & b != 0,
        }
    }
}

/// An arithmetic operation of BPF's ALU: the operators of the language, given BPF's run-time meaning here.
pub use crate::ast::ArithOp as Alu;

impl Alu {
    /// Applies the operation; `None` for a division or modulus by zero.
    #[inline]
    pub fn apply(self, a: u32, b: u32) -> Option<u32> {
        Some(match self {
            Alu::Add => a.wrapping_add(b),
            Alu::Sub => a.wrapping_sub(b),
            Alu::Mul => a.wrapping_mul(b),
            Alu::Div => a.checked_div(b)?,
            Alu::Mod => a.checked_rem(b)?,
            Alu::And => a & b,
            Alu::Or => a | b,
            Alu::Xor => a ^ b,
            Alu::Shl => a.checked_shl(b).unwrap_or(0),
            Alu::Shr => a.checked_shr(b).unwrap_or(0),
        })
    }
}

/// A 32-bit value computed from the packet.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub enum Val {
    /// A constant.
    K(u32),
    /// The length on the wire.
    Len,
    /// `size` bytes (1, 2 or 4) big-endian at a fixed offset.
    Ld {
        /// Offset from the start of the packet.
        off: u32,
        /// 1, 2 or 4.
        size: u8,
    },
    /// `size` bytes at `base + off`, where `base` is computed (BPF's indexed load).
    LdInd {
        /// The computed part of the offset.
        base: Box<Val>,
        /// The constant part.
        off: u32,
        /// 1, 2 or 4.
        size: u8,
    },
    /// `4 * (packet[off] & 0xf)`: an IPv4 header length (BPF's `ldxb 4*([k]&0xf)`).
    Msh(u32),
    /// `4 * (packet[base + off] & 0xf)`: an IPv4 header length after a header of variable length.
    MshInd {
        /// Where the variable part starts.
        base: Box<Val>,
        /// The constant part.
        off: u32,
    },
    /// The length of a radiotap or PPI header: bytes 2-3, little-endian (BPF: `ldb [3]; lsh #8; ldb [2]; or`).
    PrefixLen,
    /// The offset of the payload of an 802.11 frame whose header starts at `hdr`: 24 bytes, 2 more for a QoS
    /// data frame, rounded up to 4 when a radiotap header says the frame is padded (libpcap's
    /// `gen_load_802_11_header_len`, loads in its order).
    Wlan {
        /// Where the 802.11 header starts (0, or the length of a radiotap or PPI header).
        hdr: Box<Val>,
        /// Whether a radiotap header precedes the frame (its flags may announce padding).
        radiotap: bool,
    },
    /// The protocol `protochain` finds (libpcap's `gen_protochain` loop): from the IPv4 protocol (or IPv6 next
    /// header) of the network header at `nl`, step over IPv6 hop-by-hop, destination options, routing and
    /// fragment headers (IPv6 only) and AH headers until the protocol is `proto` or 59 (no next header) or none
    /// of those; the value is the protocol reached. As in libpcap 1.10, an AH header moves to `(its length + 2)
    /// × 4` bytes after the network header, not after itself.
    ProtoChain {
        /// Where the network header starts.
        nl: u32,
        /// IPv6 (else IPv4).
        v6: bool,
        /// The protocol sought (the walk stops on it).
        proto: u32,
    },
    /// An offset into the packet inside a Geneve header, as libpcap's `geneve` computes it (see [`Geneve`]).
    Geneve {
        /// Where the Geneve header is (shared by every offset of one `geneve`, so that the tests after several
        /// nested ones cost memory in proportion to the filter).
        at: std::sync::Arc<Geneve>,
        /// Which offset.
        field: GeneveField,
    },
    /// An operation on two values (left computed first).
    Alu(Alu, Box<Val>, Box<Val>),
    /// Negation (two's complement).
    Neg(Box<Val>),
}

/// Where a Geneve header starts: libpcap's `gen_geneve4`/`gen_geneve6` leave the outer IP header's length in
/// `A` (the IPv4 header's, or 40 for IPv6, plus any variable part of the link-layer header), and
/// `gen_geneve_offsets` adds the constant rest (link-layer header and UDP header).
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub struct Geneve {
    /// Which `geneve` of the filter this is (1 for the first): names it in listings.
    pub id: u32,
    /// libpcap's IPv4 Geneve test (outer IPv4, UDP to port 6081, version 0, the VNI). The offsets are only read
    /// where the whole `geneve` test held; then this held, or else the IPv6 test did. Its loads were made when
    /// `geneve` was tested, so evaluating it again cannot fail.
    pub v4: Cond,
    /// `A` after the IPv4 test: the end of the IPv4 header, less the constant part of its offset.
    pub v4_len: Val,
    /// `A` after the IPv6 test: 40, plus the variable part of the network header's offset.
    pub v6_len: Val,
    /// What `gen_geneve_offsets` adds: the constant part of the network header's offset, plus 8 (UDP).
    pub k: u32,
}

/// The offsets `geneve` moves for every test after it (libpcap keeps them in scratch registers).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum GeneveField {
    /// The link-layer header: just past the Geneve header and its options.
    Header,
    /// The protocol type: the inner Ethernet type after Transparent Ethernet Bridging (0x6558), else the Geneve
    /// header's own protocol field.
    LinkType,
    /// The link-layer payload: past the inner Ethernet header after Transparent Ethernet Bridging, else past the
    /// Geneve header.
    Payload,
}

impl Geneve {
    /// The offset `field`, with the loads of `gen_geneve_offsets` (the option length at the header's start, the
    /// protocol type 2 bytes in), which end the program when the packet is too short for them.
    fn eval(&self, field: GeneveField, p: &Packet<'_>) -> Option<u32> {
        let a = if self.v4.eval(p)? { self.v4_len.eval(p)? } else { self.v6_len.eval(p)? };
        let hdr = a.wrapping_add(self.k);
        let options = load(p.data, u64::from(hdr), 1)?;
        let end = ((options & 0x3f) * 4 + 8).wrapping_add(hdr);
        let teb = load(p.data, u64::from(hdr) + 2, 2)? == 0x6558;
        Some(match (field, teb) {
            (GeneveField::Header, _) => end,
            (GeneveField::LinkType, true) => end.wrapping_add(12),
            (GeneveField::LinkType, false) => hdr.wrapping_add(2),
            (GeneveField::Payload, true) => end.wrapping_add(14),
            (GeneveField::Payload, false) => end,
        })
    }
}

/// The facts about a packet a filter looks at.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// The captured bytes.
    pub data: &'a [u8],
    /// The length on the wire.
    pub wirelen: u32,
    /// The timestamp in nanoseconds since the epoch (for `after`/`before`).
    pub ts_ns: u64,
}

#[inline]
pub(crate) fn load(data: &[u8], off: u64, size: u8) -> Option<u32> {
    let start = usize::try_from(off).ok()?;
    let bytes = data.get(start..start.checked_add(usize::from(size))?)?;
    Some(match *bytes {
        [a] => u32::from(a),
        [a, b] => u32::from(u16::from_be_bytes([a, b])),
        [a, b, c, d] => u32::from_be_bytes([a, b, c, d]),
        _ => return None,
    })
}

/// The walk of [`Val::ProtoChain`] over `data`, with BPF's 32-bit registers (`None`: a load past the end, which
/// ends the program). libpcap's loop never ends on a packet whose AH headers lead back to where the walk has been;
/// pcaptool rejects such a packet once the walk has taken more steps than any packet of its length allows without
/// a cycle.
fn protochain(data: &[u8], nl: u32, v6: bool, proto: u32) -> Option<u32> {
    // BPF's offsets are 32-bit: a constant offset wraps (libpcap puts some link types' network layer at -2), an
    // indexed load adds the index to it without wrapping.
    let abs = |k: u32| load(data, u64::from(k), 1);
    let ind = |k: u32, x: u32| load(data, u64::from(k) + u64::from(x), 1);
    let (mut a, mut x) =
        if v6 { (abs(nl.wrapping_add(6))?, 40u32) } else { (abs(nl.wrapping_add(9))?, 4 * (abs(nl)? & 0xf)) };
    // Without a cycle: at most one AH step for each of its 257 possible offsets, each followed by at most one
    // IPv6 step for each 8 bytes of the packet (those steps only move forward).
    let limit = 258 * (data.len() / 8 + 2);
    for _ in 0..limit {
        let ext = v6 && matches!(a, 0 | 60 | 43 | 44);
        if a == proto || a == 59 || !(ext || a == 51) {
            return Some(a);
        }
        // A = P[X + nl]; then past an IPv6 extension header X += (P[X + nl + 1] + 1) * 8, past AH
        // X = (P[X + nl + 1] + 2) * 4.
        let next = ind(nl, x)?;
        let len = ind(nl.wrapping_add(1), x)?;
        x = if ext { x.wrapping_add(len.wrapping_add(1).wrapping_mul(8)) } else { len.wrapping_add(2).wrapping_mul(4) };
        a = next;
    }
    None
}

impl Val {
    /// The value, or `None` when a load falls outside the packet or a division is by zero.
    pub fn eval(&self, p: &Packet<'_>) -> Option<u32> {
        match self {
            Val::K(k) => Some(*k),
            Val::Len => Some(p.wirelen),
            Val::Ld { off, size } => load(p.data, u64::from(*off), *size),
            Val::LdInd { base, off, size } => {
                let b = base.eval(p)?;
                load(p.data, u64::from(b) + u64::from(*off), *size)
            }
            Val::Msh(off) => load(p.data, u64::from(*off), 1).map(|b| 4 * (b & 0xf)),
            Val::MshInd { base, off } => {
                let b = base.eval(p)?;
                load(p.data, u64::from(b) + u64::from(*off), 1).map(|b| 4 * (b & 0xf))
            }
            Val::PrefixLen => {
                let hi = load(p.data, 3, 1)?;
                Some((hi << 8) | load(p.data, 2, 1)?)
            }
            Val::Wlan { hdr, radiotap } => {
                let x = hdr.eval(p)?;
                let mut pl = x.wrapping_add(24);
                let fc = load(p.data, u64::from(x), 1)?;
                if fc & 0x08 != 0 && fc & 0x04 == 0 {
                    if fc & 0x80 != 0 {
                        pl = pl.wrapping_add(2);
                    }
                    if *radiotap {
                        // The radiotap "present" word (read big-endian, as BPF does): flags present, no
                        // extension, then the flags byte after the TSFT field if there is one.
                        let present = load(p.data, 4, 4)?;
                        if present & 0x0200_0000 != 0 && present & 0x80 == 0 {
                            let at = if present & 0x0100_0000 != 0 { 16 } else { 8 };
                            if load(p.data, at, 1)? & 0x20 != 0 {
                                pl = pl.wrapping_add(3) & !3;
                            }
                        }
                    }
                }
                Some(pl)
            }
            Val::ProtoChain { nl, v6, proto } => protochain(p.data, *nl, *v6, *proto),
            Val::Geneve { at, field } => at.eval(*field, p),
            Val::Alu(op, a, b) => {
                let a = a.eval(p)?;
                let b = b.eval(p)?;
                op.apply(a, b)
            }
            Val::Neg(a) => Some(a.eval(p)?.wrapping_neg()),
        }
    }

    /// Whether this value or one inside it satisfies `pred`.
    pub fn any(&self, pred: &dyn Fn(&Val) -> bool) -> bool {
        pred(self)
            || match self {
                Val::K(_) | Val::Len | Val::Ld { .. } | Val::Msh(_) | Val::PrefixLen | Val::ProtoChain { .. } => false,
                Val::LdInd { base, .. } | Val::MshInd { base, .. } => base.any(pred),
                Val::Wlan { hdr, .. } => hdr.any(pred),
                Val::Geneve { at, .. } => at.v4.any_val(pred) || at.v4_len.any(pred) || at.v6_len.any(pred),
                Val::Alu(_, a, b) => a.any(pred) || b.any(pred),
                Val::Neg(a) => a.any(pred),
            }
    }

    /// Whether evaluating this value can end the program (a load or a division).
    pub fn can_fail(&self) -> bool {
        match self {
            Val::K(_) | Val::Len => false,
            Val::Ld { .. }
            | Val::LdInd { .. }
            | Val::Msh(_)
            | Val::MshInd { .. }
            | Val::Wlan { .. }
            | Val::PrefixLen
            | Val::ProtoChain { .. }
            | Val::Geneve { .. } => true,
            Val::Alu(op, a, b) => matches!(op, Alu::Div | Alu::Mod) || a.can_fail() || b.can_fail(),
            Val::Neg(a) => a.can_fail(),
        }
    }
}

/// A boolean test tree.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub enum Cond {
    /// Always (libpcap's `gen_true`).
    True,
    /// Never (libpcap's `gen_false`).
    False,
    /// `test(v, k)` against a constant.
    Cmp {
        /// The value.
        v: Val,
        /// The test.
        test: Test,
        /// The constant.
        k: u32,
    },
    /// `test(a, b)` between two computed values (both computed, left first, before the test).
    CmpX {
        /// Left.
        a: Val,
        /// The test.
        test: Test,
        /// Right.
        b: Val,
    },
    /// All of them, left first (at least two, none itself an `And`: see [`Cond::and`]).
    And(Vec<Cond>),
    /// Any of them, left first (at least two, none itself an `Or`).
    Or(Vec<Cond>),
    /// Negation (a failed load under it still ends the program).
    Not(Box<Cond>),
    /// Computes a value and holds (the value is not tested): libpcap's computation of variable header
    /// offsets at the start of a program, whose loads can end it.
    Touch(Val),
    /// The timestamp is at or after `t` (`after`) or strictly before it (`before`).
    Time {
        /// `true` for `after`.
        after: bool,
        /// Nanoseconds since the epoch.
        t: u64,
    },
}

impl Cond {
    /// `a and b`, flattened (the operands of an `And` among them become operands of this one: libpcap's code for
    /// `(a and b) and c` and for `a and (b and c)` is the same).
    pub fn and(a: Cond, b: Cond) -> Cond {
        Cond::join(a, b, true)
    }

    /// `a or b`, flattened.
    pub fn or(a: Cond, b: Cond) -> Cond {
        Cond::join(a, b, false)
    }

    fn join(a: Cond, b: Cond, and: bool) -> Cond {
        let mut v = match a {
            Cond::And(v) if and => v,
            Cond::Or(v) if !and => v,
            a => vec![a],
        };
        match b {
            Cond::And(w) if and => v.extend(w),
            Cond::Or(w) if !and => v.extend(w),
            b => v.push(b),
        }
        if and { Cond::And(v) } else { Cond::Or(v) }
    }

    /// `not a`.
    #[allow(clippy::should_implement_trait)]
    pub fn not(a: Cond) -> Cond {
        Cond::Not(Box::new(a))
    }

    /// `Some(result)`, or `None` when the program ends with "no match" (a load past the end, a division by zero).
    pub fn eval(&self, p: &Packet<'_>) -> Option<bool> {
        Some(match self {
            Cond::True => true,
            Cond::False => false,
            Cond::Cmp { v, test, k } => test.apply(v.eval(p)?, *k),
            Cond::CmpX { a, test, b } => {
                let a = a.eval(p)?;
                let b = b.eval(p)?;
                test.apply(a, b)
            }
            Cond::And(v) => {
                for c in v {
                    if !c.eval(p)? {
                        return Some(false);
                    }
                }
                true
            }
            Cond::Or(v) => {
                for c in v {
                    if c.eval(p)? {
                        return Some(true);
                    }
                }
                false
            }
            Cond::Not(a) => !a.eval(p)?,
            Cond::Touch(v) => {
                v.eval(p)?;
                true
            }
            Cond::Time { after: true, t } => p.ts_ns >= *t,
            Cond::Time { after: false, t } => p.ts_ns < *t,
        })
    }

    /// Whether any value of the tree satisfies `pred` (searching inside values).
    pub fn any_val(&self, pred: &dyn Fn(&Val) -> bool) -> bool {
        match self {
            Cond::True | Cond::False | Cond::Time { .. } => false,
            Cond::Cmp { v, .. } | Cond::Touch(v) => v.any(pred),
            Cond::CmpX { a, b, .. } => a.any(pred) || b.any(pred),
            Cond::And(v) | Cond::Or(v) => v.iter().any(|c| c.any_val(pred)),
            Cond::Not(a) => a.any_val(pred),
        }
    }

    /// Whether the packet matches (a program that ends early does not match).
    pub fn matches(&self, p: &Packet<'_>) -> bool {
        self.eval(p) == Some(true)
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::K(k) => write!(f, "{k:#x}"),
            Val::Len => write!(f, "len"),
            Val::Ld { off, size } => write!(f, "pkt[{off}:{size}]"),
            Val::LdInd { base, off, size } => write!(f, "pkt[{base}+{off}:{size}]"),
            Val::Msh(off) => write!(f, "4*(pkt[{off}]&0xf)"),
            Val::MshInd { base, off } => write!(f, "4*(pkt[{base}+{off}]&0xf)"),
            Val::PrefixLen => write!(f, "hdrlen"),
            Val::ProtoChain { nl, v6, proto } => {
                write!(f, "protochain(ip{} at {nl}, until {proto})", if *v6 { "6" } else { "" })
            }
            Val::Geneve { at, field } => {
                let what = match field {
                    GeneveField::Header => "header",
                    GeneveField::LinkType => "type",
                    GeneveField::Payload => "payload",
                };
                write!(f, "geneve{}.{what}", at.id)
            }
            Val::Wlan { hdr, radiotap: true } => write!(f, "wlan_payload(radiotap {hdr})"),
            Val::Wlan { hdr, radiotap: false } => write!(f, "wlan_payload({hdr})"),
            Val::Alu(op, a, b) => write!(f, "({a} {op:?} {b})"),
            Val::Neg(a) => write!(f, "-{a}"),
        }
    }
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cond::True => write!(f, "true"),
            Cond::False => write!(f, "false"),
            Cond::Cmp { v, test, k } => match test {
                Test::Eq => write!(f, "{v} == {k:#x}"),
                Test::Gt => write!(f, "{v} > {k:#x}"),
                Test::Ge => write!(f, "{v} >= {k:#x}"),
                Test::Set => write!(f, "{v} & {k:#x} != 0"),
            },
            Cond::CmpX { a, test, b } => write!(f, "{a} {test:?} {b}"),
            Cond::And(v) | Cond::Or(v) => {
                let op = if matches!(self, Cond::And(_)) { " && " } else { " || " };
                write!(f, "(")?;
                for (i, c) in v.iter().enumerate() {
                    write!(f, "{}{c}", if i > 0 { op } else { "" })?;
                }
                write!(f, ")")
            }
            Cond::Not(a) => write!(f, "!{a}"),
            Cond::Touch(v) => write!(f, "compute({v})"),
            Cond::Time { after: true, t } => write!(f, "ts >= {t}"),
            Cond::Time { after: false, t } => write!(f, "ts < {t}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(data: &[u8], v6: bool, proto: u32) -> Option<u32> {
        Val::ProtoChain { nl: 14, v6, proto }.eval(&Packet { data, wirelen: data.len() as u32, ts_ns: 0 })
    }

    /// Ethernet, then `ip`, then `rest`.
    fn frame(ip: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(if ip[0] >> 4 == 6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
        f.extend_from_slice(ip);
        f.extend_from_slice(rest);
        f
    }

    #[test]
    fn protochain_walks_ipv6_extension_headers_and_ah() {
        // IPv6, hop-by-hop (8 bytes), routing (16 bytes), then TCP.
        let mut ip6 = vec![0x60, 0, 0, 0, 0, 40, 0, 64];
        ip6.extend_from_slice(&[0u8; 32]);
        let f = frame(&ip6, &[43, 0, 0, 0, 0, 0, 0, 0, 6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xaa]);
        assert_eq!(walk(&f, true, 6), Some(6));
        assert_eq!(walk(&f, true, 43), Some(43), "the walk stops at the protocol sought");
        assert_eq!(walk(&f, true, 17), Some(6));
        // Cut inside the routing header: the load fails, the program ends.
        assert_eq!(walk(&f[..14 + 40 + 9], true, 6), None);
        // IPv4 with AH: libpcap 1.10 moves to (length + 2) × 4 bytes after the IPv4 header's start.
        let mut ip4 = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 51, 0, 0];
        ip4.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        // AH at 20: next header 17, length 4 → X = 24, where byte 24 after the network header is read next.
        let mut rest = vec![17, 4, 0, 0];
        rest.extend_from_slice(&[0u8; 20]);
        let f = frame(&ip4, &rest);
        assert_eq!(walk(&f, false, 17), Some(17));
        assert_eq!(walk(&f, false, 6), Some(17));
        // An AH whose length leads back to itself: libpcap loops for ever; the walk gives up and refuses.
        let f = frame(&ip4, &[51, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(walk(&f, false, 6), None);
        assert_eq!(walk(&f, false, 51), Some(51));
    }
}
