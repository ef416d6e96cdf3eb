//! From an [`Expr`] to a [`Cond`] for one link type: libpcap's code generator (gencode.c, libpcap 1.10),
//! primitive by primitive, so that the tests made, their order and the loads they need are libpcap's.
//!
//! The order matters beyond the result of a test: a load past the end of the packet ends the whole filter with
//! "no match", so which loads are reached, and when, is part of the meaning. The compiler walks the expression
//! in source order and keeps libpcap's mutable offsets, which `vlan`, `mpls` and `pppoes` move for everything
//! written after them.

use pcaptool_packet::LinkType;

use crate::ast::{AddrKind, Arith, ArithOp, Dir, Expr, Id, Prim, Proto, Qual, RelOp};
use crate::error::{ErrorKind, FilterError, Span};
use crate::names::{self, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use crate::prog::{Alu, Cond, Geneve, GeneveField, Test, Val};

const ETHERTYPE_IP: u32 = 0x0800;
const ETHERTYPE_ARP: u32 = 0x0806;
const ETHERTYPE_REVARP: u32 = 0x8035;
const ETHERTYPE_IPV6: u32 = 0x86dd;
const ETHERTYPE_IPX: u32 = 0x8137;
const ETHERTYPE_ATALK: u32 = 0x809b;
const ETHERTYPE_AARP: u32 = 0x80f3;
const ETHERTYPE_8021Q: u32 = 0x8100;
const ETHERTYPE_8021AD: u32 = 0x88a8;
const ETHERTYPE_8021QINQ: u32 = 0x9100;
const ETHERTYPE_MPLS: u32 = 0x8847;
const ETHERTYPE_PPPOED: u32 = 0x8863;
const ETHERTYPE_PPPOES: u32 = 0x8864;
const ETHERMTU: u32 = 1500;
const LLCSAP_IP: u32 = 0x06;
const LLCSAP_ISONS: u32 = 0xfe;
const LLCSAP_NETBEUI: u32 = 0xf0;
const LLCSAP_IPX: u32 = 0xe0;
const LINUX_SLL_P_802_3: u32 = 0x0001;
const LINUX_SLL_P_802_2: u32 = 0x0004;
const PPP_MPLS_UCAST: u32 = 0x0281;
const GENEVE_PORT: u32 = 6081;
/// libpcap's scratch registers (`BPF_MEMWORDS`); each `geneve` keeps three.
const MEMWORDS: u32 = 16;

/// What a filter is compiled for.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Target {
    /// The link type of the packets (the capture file's LINKTYPE value).
    pub linktype: LinkType,
    /// Whether the capture's byte order differs from this machine's. libpcap compares the address family of
    /// BSD loopback (`null`) headers in the file's byte order; other link types ignore this.
    pub swapped: bool,
}

impl Target {
    /// A target of the given link type in this machine's byte order.
    pub fn new(linktype: LinkType) -> Target {
        Target { linktype, swapped: false }
    }
}

/// How a link type tells the network protocol (libpcap's per-DLT branches of `gen_linktype`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dlt {
    Null,
    Loop,
    Ether,
    Arcnet,
    Slip,
    Ppp,
    CHdlc,
    Frelay,
    Raw,
    Ipv4,
    Ipv6,
    Sll,
    Sll2,
    Ipnet,
    /// libpcap knows the link type but cannot filter on its protocol field.
    NoTypeFilter,
    /// libpcap filters this link type but pcaptool does not yet: only filters that look at no header compile.
    Unimplemented,
    /// 802.11, bare or after radiotap or PPI.
    Wlan,
    /// A payload in LLC/SNAP encapsulation straight after the link-layer header (ATM).
    Llc,
    /// A LAN of 48-bit addresses with LLC after its MAC header (FDDI, token ring, IP over Fibre Channel): the
    /// destination and source addresses at these offsets; protocol tests as `Llc`'s.
    MacLlc {
        dst: u32,
        src: u32,
    },
    /// Any protocol is "the header starts with this magic number" (value, mask): libpcap's Juniper types.
    Magic(u32, u32),
    /// SunATM: LLC/SNAP after a pseudo-header whose low nibble says the traffic is LLC-encapsulated.
    SunAtm,
}

/// Where an offset counts from (libpcap's `OR_*`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rel {
    LinkHdr,
    LinkType,
    LinkPl,
    Llc,
    PrevMpls,
}

/// An offset into the packet: a constant, plus a value computed from the packet for headers of variable length
/// (libpcap's `bpf_abs_offset`).
#[derive(Clone, PartialEq, Eq, Debug)]
struct Off {
    var: Option<Val>,
    k: u32,
}

impl Off {
    fn at(k: u32) -> Off {
        Off { var: None, k }
    }

    /// Offsets add as libpcap's do: in 32 bits, wrapping (a negative offset makes every load fail).
    fn plus(&self, d: u32) -> Off {
        Off { var: self.var.clone(), k: self.k.wrapping_add(d) }
    }

    /// `size` bytes at this offset plus `index` (a computed index, or `None`).
    fn load(&self, index: Option<Val>, size: u8) -> Val {
        let base = match (index, &self.var) {
            (None, None) => return Val::Ld { off: self.k, size },
            (Some(i), None) => i,
            (None, Some(v)) => v.clone(),
            (Some(i), Some(v)) => Val::Alu(Alu::Add, Box::new(i), Box::new(v.clone())),
        };
        Val::LdInd { base: Box::new(base), off: self.k, size }
    }
}

/// The value of an arithmetic expression: libpcap's `struct arth` (statements, the condition under which they
/// are meaningful, and the constant its first statement loads, if it loads one: libpcap's checks of divisors and
/// shift counts read only that statement).
struct Arth {
    val: Val,
    cond: Option<Cond>,
    first_const: Option<u32>,
}

fn and_opt(a: Option<Cond>, b: Cond) -> Cond {
    match a {
        Some(a) => Cond::and(a, b),
        None => b,
    }
}

/// libpcap's code generator state for one link type.
pub(crate) struct Compiler {
    /// Whether libpcap optimises the filter (not when it holds `protochain`): the compiler then follows the
    /// optimiser where it changes results.
    pub(crate) optimize: bool,
    dlt: Dlt,
    /// The DLT value the current link-layer header has (libpcap's `linktype`, changed by `pppoes`).
    dlt_value: u32,
    name: String,
    swapped: bool,
    off_linkhdr: Off,
    off_linktype: Option<Off>,
    off_linkpl: Option<Off>,
    off_nl: u32,
    label_stack_depth: u32,
    span: Span,
    /// Which variable offsets of the link type the code uses (libpcap allocates their registers, and computes
    /// them at the start of the program, only then), and what they are.
    uses_linkpl_var: std::cell::Cell<bool>,
    uses_linkhdr_var: std::cell::Cell<bool>,
    start_linkpl_var: Option<Val>,
    start_linkhdr_var: Option<Val>,
    /// `geneve` primitives compiled so far: the offsets of every test after one are computed by it, at run time,
    /// into scratch registers.
    geneves: u32,
    /// The `geneve` (by number) whose registers the offsets now read, if any.
    geneve_latest: Option<u32>,
    /// libpcap's `is_geneve`: the link-layer header is the one the latest `geneve` found (until `pppoes` moves
    /// it), so the variable parts of the header and payload offsets differ where an inner Ethernet header is there.
    is_geneve: bool,
    /// The `geneve` primitives that have matched wherever the test being compiled runs: those reached from it
    /// back through `and` alone.
    known: Vec<u32>,
}

type CResult<T> = Result<T, FilterError>;

impl Compiler {
    pub(crate) fn new(target: Target) -> Result<Compiler, ErrorKind> {
        let lt = target.linktype.0;
        // Earlier arms win over the range of libpcap's encapsulation-specific link types.
        #[allow(clippy::match_overlapping_arm)]
        let (dlt, linktype, linkpl): (Dlt, Option<u32>, Option<u32>) = match lt {
            0 => (Dlt::Null, Some(0), Some(4)),
            108 => (Dlt::Loop, Some(0), Some(4)),
            1 => (Dlt::Ether, Some(12), Some(14)),
            7 => (Dlt::Arcnet, Some(2), Some(6)),
            129 => (Dlt::Arcnet, Some(4), Some(8)),
            8 => (Dlt::Slip, None, Some(16)),
            9 | 50 | 166 => (Dlt::Ppp, Some(2), Some(4)),
            51 => (Dlt::Ppp, Some(6), Some(8)),
            104 => (Dlt::CHdlc, Some(2), Some(4)),
            // libpcap 1.10 puts the network layer of Frame Relay at offset 0, not after the Q.922 header.
            107 => (Dlt::Frelay, None, Some(0)),
            12 | 101 => (Dlt::Raw, None, Some(0)),
            228 => (Dlt::Ipv4, None, Some(0)),
            229 => (Dlt::Ipv6, None, Some(0)),
            113 => (Dlt::Sll, Some(14), Some(16)),
            276 => (Dlt::Sll2, Some(0), Some(20)),
            226 => (Dlt::Ipnet, Some(1), Some(24)),
            // ATM with LLC/SNAP (RFC 1483, Linux classical IP): the SNAP type 6 bytes in, the network layer at 8.
            100 | 106 => (Dlt::Llc, Some(6), Some(0)),
            // LLC after a MAC header (libpcap assumes SNAP for Ethernet types, as for ATM): token ring (access and
            // frame control, then addresses; routing information is not looked for, as libpcap does not), FDDI
            // (frame control, then addresses), IP over Fibre Channel.
            6 => (Dlt::MacLlc { dst: 2, src: 8 }, Some(14 + 6), Some(14)),
            10 => (Dlt::MacLlc { dst: 1, src: 7 }, Some(13 + 6), Some(13)),
            122 => (Dlt::MacLlc { dst: 2, src: 10 }, Some(16 + 6), Some(16)),
            // SunATM: a 4-byte pseudo-header (type, VPI, VCI), then LLC/SNAP when the type says so.
            123 => (Dlt::SunAtm, Some(10), Some(4)),
            // Juniper pseudo-headers (and BACnet MS/TP): protocol tests check only the magic number, the network
            // layer is at a fixed offset (libpcap 1.10's; -2 for some, which wraps).
            178 => (Dlt::Magic(0x4d47_4300, 0xffff_ff00), None, Some(32)),
            132 => (Dlt::Magic(0x4d47_4300, 0xffff_ff00), None, Some(u32::MAX - 1)),
            137 => (Dlt::Magic(0x4d47_4300, 0xffff_ff00), None, Some(4)),
            164 => (Dlt::Magic(0x4d47_4300, 0xffff_ff00), None, Some(12)),
            165 => (Dlt::Magic(0x55ff_0000, 0xffff_0000), None, Some(u32::MAX - 1)),
            // 802.11: the payload offset depends on the frame (and on a radiotap or PPI header before it).
            105 | 127 | 192 => (Dlt::Wlan, Some(0), Some(0)),
            // 802.11 with Prism or AVS headers: not yet evaluated by pcaptool.
            119 | 163 => (Dlt::Unimplemented, None, None),
            // libpcap's own encapsulation-specific range: no protocol field, link-layer loads from offset 0.
            104..=289 => (Dlt::NoTypeFilter, None, None),
            _ => {
                return Err(ErrorKind::LinkType {
                    what: "no filter can be applied (libpcap does not know this link type either)".into(),
                    linktype: target.linktype.to_string(),
                });
            }
        };
        let (off_linkhdr, off_linktype, off_linkpl, off_nl) = if dlt == Dlt::Wlan {
            // The 802.11 header follows a radiotap or PPI header of variable length.
            let hdr = match lt {
                127 | 192 => Some(Val::PrefixLen),
                _ => None,
            };
            let pl = Val::Wlan { hdr: Box::new(hdr.clone().unwrap_or(Val::K(0))), radiotap: lt == 127 };
            let pl = Off { var: Some(pl), k: 0 };
            // The link-layer type is the SNAP type, 6 bytes into the payload; the network layer starts after
            // LLC and SNAP (8 bytes).
            (Off { var: hdr, k: 0 }, Some(pl.plus(6)), Some(pl), 8)
        } else {
            let nl = if matches!(dlt, Dlt::Llc | Dlt::MacLlc { .. } | Dlt::SunAtm) { 8 } else { 0 };
            (Off::at(0), linktype.map(Off::at), linkpl.map(Off::at), nl)
        };
        Ok(Compiler {
            optimize: true,
            dlt,
            dlt_value: lt,
            name: target.linktype.to_string(),
            swapped: target.swapped,
            off_nl,
            label_stack_depth: 0,
            span: Span::default(),
            uses_linkpl_var: std::cell::Cell::new(false),
            uses_linkhdr_var: std::cell::Cell::new(false),
            start_linkpl_var: off_linkpl.as_ref().and_then(|o| o.var.clone()),
            start_linkhdr_var: off_linkhdr.var.clone(),
            off_linkhdr,
            off_linktype,
            off_linkpl,
            geneves: 0,
            geneve_latest: None,
            is_geneve: false,
            known: Vec::new(),
        })
    }

    fn err<T>(&self, msg: impl Into<String>) -> CResult<T> {
        Err(FilterError::new(ErrorKind::Invalid(msg.into()), self.span))
    }

    fn link_err<T>(&self, what: impl Into<String>) -> CResult<T> {
        Err(FilterError::new(ErrorKind::LinkType { what: what.into(), linktype: self.name.clone() }, self.span))
    }

    /// The program for `e`: its tests, after libpcap's computation of the variable offsets it uses.
    pub(crate) fn program(&mut self, e: &Expr) -> CResult<Cond> {
        let c = self.compile(e)?;
        let pl = self.start_linkpl_var.clone();
        let hdr = self.start_linkhdr_var.clone();
        // Computing the payload offset of 802.11 starts from the radiotap or PPI length, so it covers both.
        let touch = match (self.uses_linkpl_var.get(), self.uses_linkhdr_var.get()) {
            (true, _) => pl.or(hdr),
            (false, true) => hdr,
            (false, false) => None,
        };
        Ok(match touch {
            Some(v) => Cond::and(Cond::Touch(v), c),
            None => c,
        })
    }

    pub(crate) fn compile(&mut self, e: &Expr) -> CResult<Cond> {
        Ok(self.compile_held(e)?.0)
    }

    /// The tests of `e`, and the `geneve` primitives that have matched whenever `e` holds (those reached through
    /// `and` alone): the tests after one of them in the same `and` run only where its offsets were computed.
    fn compile_held(&mut self, e: &Expr) -> CResult<(Cond, Vec<u32>)> {
        Ok(match e {
            Expr::And(v) => {
                let base = self.known.len();
                let mut acc: Option<Cond> = None;
                for x in v {
                    let (c, held) = self.compile_held(x)?;
                    self.known.extend(held);
                    acc = Some(match acc {
                        None => c,
                        Some(a) => Cond::and(a, c),
                    });
                }
                let held = self.known.split_off(base);
                (acc.unwrap_or(Cond::True), held)
            }
            Expr::Or(v) => {
                let mut acc: Option<Cond> = None;
                for x in v {
                    let c = self.compile_held(x)?.0;
                    acc = Some(match acc {
                        None => c,
                        Some(a) => Cond::or(a, c),
                    });
                }
                (acc.unwrap_or(Cond::False), Vec::new())
            }
            Expr::Not(a) => (Cond::not(self.compile_held(a)?.0), Vec::new()),
            Expr::Prim(p, at) => {
                self.span = at.0;
                let c = self.prim(p)?;
                let held = match (p, self.geneve_latest) {
                    (Prim::Geneve(_), Some(g)) => vec![g],
                    _ => Vec::new(),
                };
                (c, held)
            }
        })
    }

    /// Refuses a test that reads the offsets of a `geneve` where that `geneve` may not have matched: libpcap
    /// would read scratch registers nothing has set, whose contents are left over from earlier packets.
    fn geneve_registers_set(&self) -> CResult<()> {
        match self.geneve_latest {
            Some(g) if !self.known.contains(&g) => Err(FilterError::new(
                ErrorKind::Undefined(
                    "this test comes after 'geneve' and runs where 'geneve' may not have matched, so it would read \
                     offsets left over from earlier packets; join the tests that follow 'geneve' to it with 'and'"
                        .into(),
                ),
                self.span,
            )),
            _ => Ok(()),
        }
    }

    // ---- loads and comparisons -------------------------------------------------------------------------------

    fn off(&self, rel: Rel, off: u32) -> CResult<Off> {
        if self.dlt == Dlt::Unimplemented {
            return self.link_err("pcaptool does not yet evaluate header fields");
        }
        self.geneve_registers_set()?;
        // (After `geneve`, the variable offsets are those it computes where it matched, not the link type's.)
        if self.geneve_latest.is_none() {
            if rel == Rel::LinkHdr && self.off_linkhdr.var.is_some() {
                self.uses_linkhdr_var.set(true);
            } else if rel != Rel::LinkHdr && self.off_linkpl.as_ref().is_some_and(|o| o.var.is_some()) {
                self.uses_linkpl_var.set(true);
            }
        }
        let base = match rel {
            Rel::LinkHdr => Some(self.off_linkhdr.clone()),
            Rel::LinkType => self.off_linktype.clone(),
            Rel::LinkPl => self.off_linkpl.as_ref().map(|p| p.plus(self.off_nl)),
            Rel::Llc => self.off_linkpl.clone(),
            Rel::PrevMpls => self
                .off_linkpl
                .as_ref()
                .map(|p| Off { var: p.var.clone(), k: p.k.wrapping_add(self.off_nl).wrapping_sub(4) }),
        };
        match base {
            Some(b) => Ok(b.plus(off)),
            None => self.link_err("the link-layer header has no such field"),
        }
    }

    fn ld(&self, rel: Rel, off: u32, size: u8) -> CResult<Val> {
        Ok(self.off(rel, off)?.load(None, size))
    }

    fn ncmp(&self, rel: Rel, off: u32, size: u8, mask: u32, test: Test, k: u32) -> CResult<Cond> {
        let at = self.off(rel, off)?;
        if mask == 0 && test == Test::Eq && k == 0 && at.var.is_none() && self.optimize {
            // `x & 0 == 0` holds whatever x is; libpcap's optimiser drops the load (not one through the index
            // register, after a header of variable length), so a short packet matches too.
            return Ok(Cond::True);
        }
        let mut v = at.load(None, size);
        if mask != 0xffff_ffff {
            v = Val::Alu(Alu::And, Box::new(v), Box::new(Val::K(mask)));
        }
        Ok(Cond::Cmp { v, test, k })
    }

    fn cmp(&self, rel: Rel, off: u32, size: u8, k: u32) -> CResult<Cond> {
        self.ncmp(rel, off, size, 0xffff_ffff, Test::Eq, k)
    }

    fn mcmp(&self, rel: Rel, off: u32, size: u8, k: u32, mask: u32) -> CResult<Cond> {
        self.ncmp(rel, off, size, mask, Test::Eq, k)
    }

    fn cmp_gt(&self, rel: Rel, off: u32, size: u8, k: u32) -> CResult<Cond> {
        self.ncmp(rel, off, size, 0xffff_ffff, Test::Gt, k)
    }

    fn cmp_ge(&self, rel: Rel, off: u32, size: u8, k: u32) -> CResult<Cond> {
        self.ncmp(rel, off, size, 0xffff_ffff, Test::Ge, k)
    }

    /// `gen_bcmp`: compares bytes from the end, four at a time, then two, then one.
    fn bcmp(&self, rel: Rel, off: u32, bytes: &[u8]) -> CResult<Cond> {
        let mut size = bytes.len();
        let mut b: Option<Cond> = None;
        while size >= 4 {
            let p = &bytes[size - 4..size];
            let tmp = self.cmp(rel, off + size as u32 - 4, 4, u32::from_be_bytes([p[0], p[1], p[2], p[3]]))?;
            b = Some(match b {
                Some(b) => Cond::and(b, tmp),
                None => tmp,
            });
            size -= 4;
        }
        while size >= 2 {
            let p = &bytes[size - 2..size];
            let tmp = self.cmp(rel, off + size as u32 - 2, 2, u32::from(u16::from_be_bytes([p[0], p[1]])))?;
            b = Some(match b {
                Some(b) => Cond::and(b, tmp),
                None => tmp,
            });
            size -= 2;
        }
        if size > 0 {
            let tmp = self.cmp(rel, off, 1, u32::from(bytes[0]))?;
            b = Some(match b {
                Some(b) => Cond::and(b, tmp),
                None => tmp,
            });
        }
        Ok(b.unwrap_or(Cond::True))
    }

    /// A transport-layer load after an IPv4 header of any length (`OR_TRAN_IPV4`).
    /// Where the IPv4 header's end is: `X` and the constant to add (`ldxb 4*([nl]&0xf)`, plus the variable part
    /// of the offset when the link-layer header has a variable length).
    fn iphdr_end(&self) -> CResult<(Val, u32)> {
        let nl = self.off(Rel::LinkPl, 0)?;
        Ok(match nl.var {
            None => (Val::Msh(nl.k), nl.k),
            Some(v) => {
                let msh = Val::MshInd { base: Box::new(v.clone()), off: nl.k };
                (Val::Alu(Alu::Add, Box::new(v), Box::new(msh)), nl.k)
            }
        })
    }

    fn ld_tran4(&self, off: u32, size: u8) -> CResult<Val> {
        let (x, k) = self.iphdr_end()?;
        Ok(Val::LdInd { base: Box::new(x), off: k.wrapping_add(off), size })
    }

    fn ipfrag(&self) -> CResult<Cond> {
        Ok(Cond::not(Cond::Cmp { v: self.ld(Rel::LinkPl, 6, 2)?, test: Test::Set, k: 0x1fff }))
    }

    // ---- link-layer types ------------------------------------------------------------------------------------

    fn snap(&self, orgcode: u32, ptype: u32) -> CResult<Cond> {
        let block = [
            0xaa,
            0xaa,
            0x03,
            (orgcode >> 16) as u8,
            (orgcode >> 8) as u8,
            orgcode as u8,
            (ptype >> 8) as u8,
            ptype as u8,
        ];
        self.bcmp(Rel::Llc, 0, &block)
    }

    fn linktype(&self, ll_proto: u32) -> CResult<Cond> {
        if self.label_stack_depth > 0 {
            return match ll_proto {
                ETHERTYPE_IP | 0x0021 => self.mpls_linktype(0x40),
                ETHERTYPE_IPV6 | 0x0057 => self.mpls_linktype(0x60),
                _ => self.err("unsupported protocol over mpls"),
            };
        }
        match self.dlt {
            Dlt::Ether => self.ether_linktype(ll_proto),
            Dlt::CHdlc => {
                let p = if ll_proto == LLCSAP_ISONS { (ll_proto << 8) | ll_proto } else { ll_proto };
                self.cmp(Rel::LinkType, 0, 2, p)
            }
            Dlt::Sll => self.sll_linktype(ll_proto),
            Dlt::Slip | Dlt::Raw => match ll_proto {
                ETHERTYPE_IP => self.mcmp(Rel::LinkHdr, 0, 1, 0x40, 0xf0),
                ETHERTYPE_IPV6 => self.mcmp(Rel::LinkHdr, 0, 1, 0x60, 0xf0),
                _ => Ok(Cond::False),
            },
            Dlt::Ipv4 => Ok(if ll_proto == ETHERTYPE_IP { Cond::True } else { Cond::False }),
            Dlt::Ipv6 => Ok(if ll_proto == ETHERTYPE_IPV6 { Cond::True } else { Cond::False }),
            Dlt::Ppp => self.cmp(Rel::LinkType, 0, 2, ethertype_to_ppptype(ll_proto)),
            Dlt::Null | Dlt::Loop => match ll_proto {
                ETHERTYPE_IP => self.loopback_linktype(2),
                ETHERTYPE_IPV6 => {
                    // The BSDs' AF_INET6 values: Darwin's, then (NetBSD/OpenBSD/BSD/OS, FreeBSD).
                    let b = Cond::or(self.loopback_linktype(24)?, self.loopback_linktype(28)?);
                    Ok(Cond::or(self.loopback_linktype(30)?, b))
                }
                _ => Ok(Cond::False),
            },
            Dlt::Arcnet => match ll_proto {
                ETHERTYPE_IPV6 => self.cmp(Rel::LinkType, 0, 1, 0xc4),
                ETHERTYPE_IP => {
                    Ok(Cond::or(self.cmp(Rel::LinkType, 0, 1, 0xd4)?, self.cmp(Rel::LinkType, 0, 1, 0xf0)?))
                }
                ETHERTYPE_ARP => {
                    Ok(Cond::or(self.cmp(Rel::LinkType, 0, 1, 0xd5)?, self.cmp(Rel::LinkType, 0, 1, 0xf1)?))
                }
                ETHERTYPE_REVARP => self.cmp(Rel::LinkType, 0, 1, 0xd6),
                ETHERTYPE_ATALK => self.cmp(Rel::LinkType, 0, 1, 0xdd),
                _ => Ok(Cond::False),
            },
            Dlt::Frelay => match ll_proto {
                ETHERTYPE_IP => self.cmp(Rel::LinkHdr, 2, 2, 0x03cc),
                ETHERTYPE_IPV6 => self.cmp(Rel::LinkHdr, 2, 2, 0x038e),
                LLCSAP_ISONS => {
                    // OSI over Q.933: NLPIDs for CLNP, ES-IS and IS-IS.
                    let b = Cond::or(self.cmp(Rel::LinkHdr, 2, 2, 0x0381)?, self.cmp(Rel::LinkHdr, 2, 2, 0x0382)?);
                    Ok(Cond::or(b, self.cmp(Rel::LinkHdr, 2, 2, 0x0383)?))
                }
                _ => Ok(Cond::False),
            },
            Dlt::Ipnet => match ll_proto {
                ETHERTYPE_IP => self.cmp(Rel::LinkType, 0, 1, 2),
                ETHERTYPE_IPV6 => self.cmp(Rel::LinkType, 0, 1, 26),
                _ => Ok(Cond::False),
            },
            Dlt::Sll2 => self.cmp(Rel::LinkType, 0, 2, ll_proto),
            Dlt::Wlan => Ok(Cond::and(self.wlan_data_frame()?, self.llc_linktype(ll_proto)?)),
            Dlt::Llc | Dlt::MacLlc { .. } => self.llc_linktype(ll_proto),
            Dlt::SunAtm => Ok(Cond::and(self.mcmp(Rel::LinkHdr, 0, 1, 2, 0x0f)?, self.llc_linktype(ll_proto)?)),
            Dlt::Magic(v, mask) => self.mcmp(Rel::LinkHdr, 0, 4, v, mask),
            Dlt::NoTypeFilter => self.link_err("link-layer type filtering is not implemented"),
            Dlt::Unimplemented => self.link_err("pcaptool does not yet evaluate protocol tests"),
        }
    }

    /// `gen_check_802_11_data_frame`: not a control frame, and a data frame.
    fn wlan_data_frame(&self) -> CResult<Cond> {
        let fc = || self.ld(Rel::LinkHdr, 0, 1);
        let ctrl = Cond::Cmp { v: fc()?, test: Test::Set, k: 0x04 };
        let data = Cond::Cmp { v: fc()?, test: Test::Set, k: 0x08 };
        Ok(Cond::and(Cond::not(ctrl), data))
    }

    /// `gen_llc_linktype`: the protocol of an LLC-encapsulated payload (802.11 here).
    fn llc_linktype(&self, p: u32) -> CResult<Cond> {
        match p {
            LLCSAP_IP | LLCSAP_ISONS | LLCSAP_NETBEUI => self.cmp(Rel::Llc, 0, 2, (p << 8) | p),
            LLCSAP_IPX => self.cmp(Rel::Llc, 0, 1, LLCSAP_IPX),
            ETHERTYPE_ATALK => self.snap(0x080007, ETHERTYPE_ATALK),
            _ if p <= ETHERMTU => self.cmp(Rel::Llc, 0, 1, p),
            _ => self.cmp(Rel::LinkType, 0, 2, p),
        }
    }

    fn ds_bit(&self, bit: u32) -> CResult<Cond> {
        Ok(Cond::Cmp { v: self.ld(Rel::LinkHdr, 1, 1)?, test: Test::Set, k: bit })
    }

    fn type_bit(&self, bit: u32) -> CResult<Cond> {
        Ok(Cond::Cmp { v: self.ld(Rel::LinkHdr, 0, 1)?, test: Test::Set, k: bit })
    }

    /// `(!bit && clear) || (bit && set)`, the shape libpcap builds each decision on a frame-control bit with.
    fn by_bit(&self, bit: Cond, not_bit: Cond, clear: Cond, set: Cond) -> Cond {
        Cond::or(Cond::and(Cond::not(not_bit), clear), Cond::and(bit, set))
    }

    /// `gen_wlanhostop`: an address of an 802.11 frame, whose place depends on the frame type and DS bits.
    /// `addr` compares the address at an offset (a MAC address, or the multicast bit).
    fn wlanhostop(&self, dir: Dir, addr: &dyn Fn(u32) -> CResult<Cond>) -> CResult<Cond> {
        let data = match dir {
            // Data frames: with From DS set, SA at 24 when To DS is set, else at 16; with From DS clear, at 10.
            Dir::Src => {
                let from_ds = self.by_bit(self.ds_bit(0x01)?, self.ds_bit(0x01)?, addr(16)?, addr(24)?);
                self.by_bit(self.ds_bit(0x02)?, self.ds_bit(0x02)?, addr(10)?, from_ds)
            }
            // Data frames: DA at 16 when To DS is set, else at 4.
            Dir::Dst => self.by_bit(self.ds_bit(0x01)?, self.ds_bit(0x01)?, addr(4)?, addr(16)?),
            Dir::SrcAndDst => {
                return Ok(Cond::and(self.wlanhostop(Dir::Src, addr)?, self.wlanhostop(Dir::Dst, addr)?));
            }
            Dir::Default | Dir::SrcOrDst => {
                return Ok(Cond::or(self.wlanhostop(Dir::Src, addr)?, self.wlanhostop(Dir::Dst, addr)?));
            }
        };
        // Management frames: SA at 10, DA at 4. Control frames have neither.
        let mgmt = addr(if dir == Dir::Src { 10 } else { 4 })?;
        let b = self.by_bit(self.type_bit(0x08)?, self.type_bit(0x08)?, mgmt, data);
        Ok(Cond::and(Cond::not(self.type_bit(0x04)?), b))
    }

    fn loopback_linktype(&self, af: u32) -> CResult<Cond> {
        // DLT_NULL carries the family in the capturing host's byte order; DLT_LOOP in network order.
        let k = if self.dlt == Dlt::Null && !self.swapped { af.swap_bytes() } else { af };
        self.cmp(Rel::LinkType, 0, 4, k)
    }

    fn mpls_linktype(&self, version: u32) -> CResult<Cond> {
        let bos = self.mcmp(Rel::PrevMpls, 2, 1, 0x01, 0x01)?;
        Ok(Cond::and(bos, self.mcmp(Rel::LinkPl, 0, 1, version, 0xf0)?))
    }

    fn ether_linktype(&self, p: u32) -> CResult<Cond> {
        let is_8023 = || -> CResult<Cond> { Ok(Cond::not(self.cmp_gt(Rel::LinkType, 0, 2, ETHERMTU)?)) };
        match p {
            LLCSAP_ISONS | LLCSAP_IP | LLCSAP_NETBEUI => {
                Ok(Cond::and(is_8023()?, self.cmp(Rel::Llc, 0, 2, (p << 8) | p)?))
            }
            LLCSAP_IPX => {
                let b1 = Cond::or(self.cmp(Rel::Llc, 0, 1, LLCSAP_IPX)?, self.cmp(Rel::Llc, 0, 2, 0xffff)?);
                let b1 = Cond::or(self.snap(0, ETHERTYPE_IPX)?, b1);
                let b1 = Cond::and(is_8023()?, b1);
                Ok(Cond::or(self.cmp(Rel::LinkType, 0, 2, ETHERTYPE_IPX)?, b1))
            }
            ETHERTYPE_ATALK | ETHERTYPE_AARP => {
                let snap = self.appletalk_snap(p)?;
                let b1 = Cond::and(is_8023()?, snap);
                Ok(Cond::or(self.cmp(Rel::LinkType, 0, 2, p)?, b1))
            }
            _ if p <= ETHERMTU => Ok(Cond::and(is_8023()?, self.cmp(Rel::LinkType, 2, 1, p)?)),
            _ => self.cmp(Rel::LinkType, 0, 2, p),
        }
    }

    /// 802.2-encapsulated AppleTalk is SNAP with Apple's organization code; AARP, SNAP with encapsulated
    /// Ethernet's.
    fn appletalk_snap(&self, p: u32) -> CResult<Cond> {
        if p == ETHERTYPE_ATALK { self.snap(0x080007, ETHERTYPE_ATALK) } else { self.snap(0, ETHERTYPE_AARP) }
    }

    fn sll_linktype(&self, p: u32) -> CResult<Cond> {
        match p {
            LLCSAP_ISONS | LLCSAP_IP | LLCSAP_NETBEUI => Ok(Cond::and(
                self.cmp(Rel::LinkType, 0, 2, LINUX_SLL_P_802_2)?,
                self.cmp(Rel::LinkPl, 0, 2, (p << 8) | p)?,
            )),
            LLCSAP_IPX => {
                let b1 = Cond::or(self.cmp(Rel::Llc, 0, 1, LLCSAP_IPX)?, self.snap(0, ETHERTYPE_IPX)?);
                let b1 = Cond::and(self.cmp(Rel::LinkType, 0, 2, LINUX_SLL_P_802_2)?, b1);
                let b1 = Cond::or(self.cmp(Rel::LinkType, 0, 2, LINUX_SLL_P_802_3)?, b1);
                Ok(Cond::or(self.cmp(Rel::LinkType, 0, 2, ETHERTYPE_IPX)?, b1))
            }
            ETHERTYPE_ATALK | ETHERTYPE_AARP => {
                let snap = self.appletalk_snap(p)?;
                let b1 = Cond::and(self.cmp(Rel::LinkType, 0, 2, LINUX_SLL_P_802_2)?, snap);
                Ok(Cond::or(self.cmp(Rel::LinkType, 0, 2, p)?, b1))
            }
            _ if p <= ETHERMTU => {
                Ok(Cond::and(self.cmp(Rel::LinkType, 0, 2, LINUX_SLL_P_802_2)?, self.cmp(Rel::Llc, 0, 1, p)?))
            }
            _ => self.cmp(Rel::LinkType, 0, 2, p),
        }
    }

    // ---- protocols -------------------------------------------------------------------------------------------

    fn proto_abbrev(&self, p: Proto) -> CResult<Cond> {
        match p {
            Proto::Sctp => self.gen_proto(IPPROTO_SCTP, Proto::Default),
            Proto::Tcp => self.gen_proto(IPPROTO_TCP, Proto::Default),
            Proto::Udp => self.gen_proto(IPPROTO_UDP, Proto::Default),
            Proto::Icmp => self.gen_proto(1, Proto::Ip),
            Proto::Igmp => self.gen_proto(2, Proto::Ip),
            Proto::Igrp => self.gen_proto(9, Proto::Ip),
            Proto::Pim => self.gen_proto(103, Proto::Default),
            Proto::Vrrp | Proto::Carp => self.gen_proto(112, Proto::Ip),
            Proto::Ip => self.linktype(ETHERTYPE_IP),
            Proto::Arp => self.linktype(ETHERTYPE_ARP),
            Proto::Rarp => self.linktype(ETHERTYPE_REVARP),
            Proto::Ip6 => self.linktype(ETHERTYPE_IPV6),
            Proto::Icmp6 => self.gen_proto(58, Proto::Ip6),
            Proto::Ah => self.gen_proto(51, Proto::Default),
            Proto::Esp => self.gen_proto(50, Proto::Default),
            Proto::Link => self.err("link layer applied in wrong context"),
            Proto::Default => self.err("a protocol is required here"),
        }
    }

    fn gen_proto(&self, v: u32, proto: Proto) -> CResult<Cond> {
        match proto {
            Proto::Default => Ok(Cond::or(self.gen_proto(v, Proto::Ip)?, self.gen_proto(v, Proto::Ip6)?)),
            Proto::Link => self.linktype(v),
            Proto::Ip => Ok(Cond::and(self.linktype(ETHERTYPE_IP)?, self.cmp(Rel::LinkPl, 9, 1, v)?)),
            Proto::Ip6 => {
                let b0 = self.linktype(ETHERTYPE_IPV6)?;
                // Also a fragment header right before the final header.
                let frag = Cond::and(self.cmp(Rel::LinkPl, 6, 1, 44)?, self.cmp(Rel::LinkPl, 40, 1, v)?);
                let b1 = Cond::or(self.cmp(Rel::LinkPl, 6, 1, v)?, frag);
                Ok(Cond::and(b0, b1))
            }
            Proto::Arp => self.err("arp does not encapsulate another protocol"),
            Proto::Rarp => self.err("rarp does not encapsulate another protocol"),
            p => self.err(format!("'{} proto' is bogus", p.name())),
        }
    }

    /// `gen_protochain`: the protocol found by walking the IPv6 extension headers and AH after the IPv4 or IPv6
    /// header ([`Val::ProtoChain`]) is `v`. libpcap compiles this to a loop, and turns its optimiser off for the
    /// whole filter (see `Filter::optimized`).
    fn gen_protochain(&self, v: u32, proto: Proto) -> CResult<Cond> {
        let one = |v6: bool| -> CResult<Cond> {
            let nl = self.off(Rel::LinkPl, 0)?;
            if nl.var.is_some() {
                return self.err("'protochain' not supported with variable length headers");
            }
            let b0 = self.linktype(if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IP })?;
            let walk = Val::ProtoChain { nl: nl.k, v6, proto: v };
            Ok(Cond::and(b0, Cond::Cmp { v: walk, test: Test::Eq, k: v }))
        };
        match proto {
            Proto::Default => Ok(Cond::or(one(false)?, one(true)?)),
            Proto::Ip => one(false),
            Proto::Ip6 => one(true),
            _ => self.err("bad protocol applied for 'protochain'"),
        }
    }

    // ---- hosts and networks ----------------------------------------------------------------------------------

    fn hostop(&self, addr: u32, mask: u32, dir: Dir, ll: u32, src: u32, dst: u32) -> CResult<Cond> {
        let off = match dir {
            Dir::Src => src,
            Dir::Dst => dst,
            Dir::SrcAndDst => {
                let a = self.hostop(addr, mask, Dir::Src, ll, src, dst)?;
                return Ok(Cond::and(a, self.hostop(addr, mask, Dir::Dst, ll, src, dst)?));
            }
            Dir::Default | Dir::SrcOrDst => {
                let a = self.hostop(addr, mask, Dir::Src, ll, src, dst)?;
                return Ok(Cond::or(a, self.hostop(addr, mask, Dir::Dst, ll, src, dst)?));
            }
        };
        Ok(Cond::and(self.linktype(ll)?, self.mcmp(Rel::LinkPl, off, 4, addr, mask)?))
    }

    fn gen_host(&self, addr: u32, mask: u32, proto: Proto, dir: Dir, kind: AddrKind) -> CResult<Cond> {
        let typestr = if kind == AddrKind::Net { "net" } else { "host" };
        match proto {
            Proto::Default => {
                let b0 = self.gen_host(addr, mask, Proto::Ip, dir, kind)?;
                // Not ARP or RARP inside MPLS.
                if self.label_stack_depth == 0 {
                    let b1 = Cond::or(b0, self.gen_host(addr, mask, Proto::Arp, dir, kind)?);
                    return Ok(Cond::or(b1, self.gen_host(addr, mask, Proto::Rarp, dir, kind)?));
                }
                Ok(b0)
            }
            Proto::Ip => self.hostop(addr, mask, dir, ETHERTYPE_IP, 12, 16),
            Proto::Arp => self.hostop(addr, mask, dir, ETHERTYPE_ARP, 14, 24),
            Proto::Rarp => self.hostop(addr, mask, dir, ETHERTYPE_REVARP, 14, 24),
            Proto::Link => self.err(format!("link-layer modifier applied to {typestr}")),
            Proto::Ip6 => self.err("'ip6' modifier applied to ip host"),
            p => self.err(format!("'{}' modifier applied to {typestr}", p.name())),
        }
    }

    fn gen_host6(&self, addr: u128, mask: u128, proto: Proto, dir: Dir, kind: AddrKind) -> CResult<Cond> {
        let typestr = if kind == AddrKind::Net { "net" } else { "host" };
        match proto {
            Proto::Default | Proto::Ip6 => self.hostop6(addr, mask, dir, 8, 24),
            Proto::Link => self.err(format!("link-layer modifier applied to ip6 {typestr}")),
            p => self.err(format!("'{}' modifier applied to ip6 {typestr}", p.name())),
        }
    }

    fn hostop6(&self, addr: u128, mask: u128, dir: Dir, src: u32, dst: u32) -> CResult<Cond> {
        let off = match dir {
            Dir::Src => src,
            Dir::Dst => dst,
            Dir::SrcAndDst => {
                let a = self.hostop6(addr, mask, Dir::Src, src, dst)?;
                return Ok(Cond::and(a, self.hostop6(addr, mask, Dir::Dst, src, dst)?));
            }
            Dir::Default | Dir::SrcOrDst => {
                let a = self.hostop6(addr, mask, Dir::Src, src, dst)?;
                return Ok(Cond::or(a, self.hostop6(addr, mask, Dir::Dst, src, dst)?));
            }
        };
        let word = |x: u128, i: u32| (x >> (96 - 32 * i)) as u32;
        let mut b = self.mcmp(Rel::LinkPl, off + 12, 4, word(addr, 3), word(mask, 3))?;
        for i in (0..3).rev() {
            b = Cond::and(self.mcmp(Rel::LinkPl, off + 4 * i, 4, word(addr, i), word(mask, i))?, b);
        }
        Ok(Cond::and(self.linktype(ETHERTYPE_IPV6)?, b))
    }

    fn ehostop(&self, mac: &[u8; 6], dir: Dir) -> CResult<Cond> {
        match dir {
            Dir::Src => self.bcmp(Rel::LinkHdr, 6, mac),
            Dir::Dst => self.bcmp(Rel::LinkHdr, 0, mac),
            Dir::SrcAndDst => Ok(Cond::and(self.ehostop(mac, Dir::Src)?, self.ehostop(mac, Dir::Dst)?)),
            Dir::Default | Dir::SrcOrDst => Ok(Cond::or(self.ehostop(mac, Dir::Src)?, self.ehostop(mac, Dir::Dst)?)),
        }
    }

    /// `gen_fhostop`, `gen_thostop`, `gen_ipfchostop`: the addresses at fixed offsets of the MAC header.
    fn machostop(&self, mac: &[u8; 6], dir: Dir, dst: u32, src: u32) -> CResult<Cond> {
        let one = |d: Dir| self.machostop(mac, d, dst, src);
        match dir {
            Dir::Src => self.bcmp(Rel::LinkHdr, src, mac),
            Dir::Dst => self.bcmp(Rel::LinkHdr, dst, mac),
            Dir::SrcAndDst => Ok(Cond::and(one(Dir::Src)?, one(Dir::Dst)?)),
            Dir::Default | Dir::SrcOrDst => Ok(Cond::or(one(Dir::Src)?, one(Dir::Dst)?)),
        }
    }

    // ---- ports -----------------------------------------------------------------------------------------------

    fn port_proto(&self, proto: Proto, what: &str) -> CResult<Option<u32>> {
        match proto {
            Proto::Udp => Ok(Some(IPPROTO_UDP)),
            Proto::Tcp => Ok(Some(IPPROTO_TCP)),
            Proto::Sctp => Ok(Some(IPPROTO_SCTP)),
            Proto::Default => Ok(None),
            _ => self.err(format!("illegal qualifier of '{what}'")),
        }
    }

    /// Ports `lo..=hi` in direction `dir` of an IPv4 (`v6 == false`) or IPv6 transport header.
    fn portatoms(&self, v6: bool, lo: u32, hi: u32, range: bool, dir: Dir) -> CResult<Cond> {
        let atom = |off: u32| -> CResult<Cond> {
            let v = || -> CResult<Val> { if v6 { self.ld(Rel::LinkPl, 40 + off, 2) } else { self.ld_tran4(off, 2) } };
            if range {
                let ge = Cond::Cmp { v: v()?, test: Test::Ge, k: lo };
                let le = Cond::not(Cond::Cmp { v: v()?, test: Test::Gt, k: hi });
                Ok(Cond::and(ge, le))
            } else {
                Ok(Cond::Cmp { v: v()?, test: Test::Eq, k: lo })
            }
        };
        Ok(match dir {
            Dir::Src => atom(0)?,
            Dir::Dst => atom(2)?,
            Dir::SrcAndDst => Cond::and(atom(0)?, atom(2)?),
            Dir::Default | Dir::SrcOrDst => Cond::or(atom(0)?, atom(2)?),
        })
    }

    fn portop(&self, v6: bool, lo: u32, hi: u32, range: bool, proto: u32, dir: Dir) -> CResult<Cond> {
        let ports = self.portatoms(v6, lo, hi, range, dir)?;
        if v6 {
            Ok(Cond::and(self.cmp(Rel::LinkPl, 6, 1, proto)?, ports))
        } else {
            let b0 = Cond::and(self.cmp(Rel::LinkPl, 9, 1, proto)?, self.ipfrag()?);
            Ok(Cond::and(b0, ports))
        }
    }

    /// `gen_port`/`gen_port6`/`gen_portrange`/`gen_portrange6`, IPv6 first as libpcap ORs them.
    fn ports(&self, lo: u32, hi: u32, range: bool, proto: Option<u32>, dir: Dir) -> CResult<Cond> {
        let (lo, hi) = if lo > hi { (hi, lo) } else { (lo, hi) };
        Ok(Cond::or(self.ports_of(true, lo, hi, range, proto, dir)?, self.ports_of(false, lo, hi, range, proto, dir)?))
    }

    /// The ports of IPv6 (`gen_port6`, `gen_portrange6`) or IPv4 (`gen_port`, `gen_portrange`).
    fn ports_of(&self, v6: bool, lo: u32, hi: u32, range: bool, proto: Option<u32>, dir: Dir) -> CResult<Cond> {
        let b0 = self.linktype(if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IP })?;
        let b1 = match proto {
            Some(p) => self.portop(v6, lo, hi, range, p, dir)?,
            None => {
                let tcp_udp = Cond::or(
                    self.portop(v6, lo, hi, range, IPPROTO_TCP, dir)?,
                    self.portop(v6, lo, hi, range, IPPROTO_UDP, dir)?,
                );
                Cond::or(self.portop(v6, lo, hi, range, IPPROTO_SCTP, dir)?, tcp_udp)
            }
        };
        Ok(Cond::and(b0, b1))
    }

    // ---- identifiers -----------------------------------------------------------------------------------------

    fn id(&self, q: Qual, id: &Id) -> CResult<Cond> {
        match id {
            Id::Num(v) => self.ncode(None, *v, q),
            Id::V4 { addr, bits } => {
                match q.addr {
                    AddrKind::Port => return self.err("'port' modifier applied to ip host"),
                    AddrKind::PortRange => return self.err("'portrange' modifier applied to ip host"),
                    AddrKind::Proto => return self.err("'proto' modifier applied to ip host"),
                    AddrKind::ProtoChain => return self.err("'protochain' modifier applied to ip host"),
                    _ => {}
                }
                self.ncode(Some(*bits), *addr, q)
            }
            Id::V4Prefix { addr, bits, len } => {
                let n = addr << (32 - u32::from(*bits));
                if *len > 32 {
                    return self.err("mask length must be <= 32");
                }
                let m = if *len == 0 { 0 } else { u32::MAX << (32 - len) };
                if n & !m != 0 {
                    return self.err(format!("non-network bits set in \"{id}\""));
                }
                self.mcode(n, m, q)
            }
            Id::V4Mask { addr, bits, mask, mask_bits } => {
                let n = addr << (32 - u32::from(*bits));
                let m = mask << (32 - u32::from(*mask_bits));
                if n & !m != 0 {
                    return self.err(format!("non-network bits set in \"{id}\""));
                }
                self.mcode(n, m, q)
            }
            Id::V6 { addr, len } => {
                let len = len.unwrap_or(128);
                if len > 128 {
                    return self.err("mask length must be <= 128");
                }
                let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
                if addr & !mask != 0 {
                    return self.err(format!("non-network bits set in \"{id}\""));
                }
                match q.addr {
                    AddrKind::Default | AddrKind::Host if len != 128 => self.err("Mask syntax for networks only"),
                    AddrKind::Default | AddrKind::Host | AddrKind::Net => {
                        self.gen_host6(*addr, mask, q.proto, q.dir, q.addr)
                    }
                    _ => self.err("invalid qualifier against IPv6 address"),
                }
            }
            Id::Mac(mac) => {
                if matches!(q.addr, AddrKind::Host | AddrKind::Default) && q.proto == Proto::Link {
                    match self.dlt {
                        Dlt::Ether => self.inner_ether(self.ehostop(mac, q.dir)?),
                        Dlt::MacLlc { dst, src } => self.machostop(mac, q.dir, dst, src),
                        Dlt::Wlan => self.wlanhostop(q.dir, &|off| self.bcmp(Rel::LinkHdr, off, mac)),
                        _ => self.link_err(
                            "ethernet addresses supported only on ethernet/FDDI/token ring/802.11/ATM LANE/Fibre Channel",
                        ),
                    }
                } else {
                    self.err("ethernet address used in non-ether expression")
                }
            }
            Id::Name(name) => self.scode(name, q),
        }
    }

    fn mcode(&self, n: u32, m: u32, q: Qual) -> CResult<Cond> {
        match q.addr {
            AddrKind::Net => self.gen_host(n, m, q.proto, q.dir, q.addr),
            _ => self.err("Mask syntax for networks only"),
        }
    }

    /// `gen_ncode`: a number or a dotted address of `bits` bits (`None`: a plain number).
    fn ncode(&self, bits: Option<u8>, v: u32, q: Qual) -> CResult<Cond> {
        match q.addr {
            AddrKind::Default | AddrKind::Host | AddrKind::Net => {
                if q.proto == Proto::Link {
                    return self.err("illegal link layer address");
                }
                let (mut v, mut mask) = (v, u32::MAX);
                if bits.is_none() && q.addr == AddrKind::Net {
                    // Promote a short net number: `net 10` is 10.0.0.0/8.
                    while v != 0 && v & 0xff00_0000 == 0 {
                        v <<= 8;
                        mask <<= 8;
                    }
                } else {
                    let shift = 32 - u32::from(bits.unwrap_or(32));
                    v = v.checked_shl(shift).unwrap_or(0);
                    mask = mask.checked_shl(shift).unwrap_or(0);
                }
                self.gen_host(v, mask, q.proto, q.dir, q.addr)
            }
            AddrKind::Port | AddrKind::PortRange => {
                let range = q.addr == AddrKind::PortRange;
                let proto = self.port_proto(q.proto, if range { "portrange" } else { "port" })?;
                if v > 65535 {
                    return self.err(format!("illegal port number {v} > 65535"));
                }
                self.ports(v, v, range, proto, q.dir)
            }
            AddrKind::Proto => self.gen_proto(v, q.proto),
            AddrKind::ProtoChain => self.gen_protochain(v, q.proto),
        }
    }

    /// `gen_scode`: a name.
    fn scode(&self, name: &str, q: Qual) -> CResult<Cond> {
        let unknown = |what: &'static str| {
            Err(FilterError::new(ErrorKind::UnknownName { what, name: name.to_string() }, self.span))
        };
        match q.addr {
            AddrKind::Net => {
                Err(FilterError::new(ErrorKind::NameLookup { what: "network", name: name.into() }, self.span))
            }
            AddrKind::Default | AddrKind::Host => {
                let what = if q.proto == Proto::Link { "ethernet host" } else { "host" };
                Err(FilterError::new(ErrorKind::NameLookup { what, name: name.into() }, self.span))
            }
            AddrKind::Port | AddrKind::PortRange => {
                let range = q.addr == AddrKind::PortRange;
                let want = self.port_proto(q.proto, if range { "portrange" } else { "port" })?;
                let (lo, hi, real) = if range {
                    match names::port_range(name) {
                        Some(r) => r,
                        None => return unknown("port range"),
                    }
                } else {
                    match names::port(name) {
                        Some((p, real)) => (p, p, real),
                        None => return unknown("port"),
                    }
                };
                let what = if range { "port in range" } else { "port" };
                let real = match (want, real) {
                    (None, r) => r,
                    (Some(w), None) => Some(w),
                    (Some(w), Some(r)) if w == r => Some(w),
                    (Some(_), Some(r)) => {
                        let pname = match r {
                            IPPROTO_TCP => "tcp",
                            IPPROTO_UDP => "udp",
                            _ => "sctp",
                        };
                        return self.err(format!("{what} '{name}' is {pname}"));
                    }
                };
                for p in [lo, hi] {
                    if p > 65535 {
                        return self.err(format!("illegal port number {p} > 65535"));
                    }
                }
                self.ports(lo, hi, range, real, q.dir)
            }
            AddrKind::ProtoChain => match names::ip_proto(name) {
                // (libpcap's `lookup_proto` for `protochain` reads IP protocol names whatever the qualifier.)
                Some(v) => self.gen_protochain(v, q.proto),
                None => unknown("ip proto"),
            },
            AddrKind::Proto => {
                let v = match q.proto {
                    Proto::Default | Proto::Ip | Proto::Ip6 => match names::ip_proto(name) {
                        Some(v) => v,
                        None => return unknown("ip proto"),
                    },
                    Proto::Link => match names::ether_proto(name) {
                        Some(v) => v,
                        None => return unknown("ether proto"),
                    },
                    _ => u32::MAX,
                };
                self.gen_proto(v, q.proto)
            }
        }
    }

    // ---- arithmetic ------------------------------------------------------------------------------------------

    fn arith(&self, a: &Arith) -> CResult<Arth> {
        Ok(match a {
            Arith::Num(k) => Arth { val: Val::K(*k), cond: None, first_const: Some(*k) },
            Arith::Len => Arth { val: Val::Len, cond: None, first_const: None },
            Arith::Neg(x) => {
                let x = self.arith(x)?;
                // libpcap's optimiser folds constants.
                let val = match x.val {
                    Val::K(k) => Val::K(k.wrapping_neg()),
                    v => Val::Neg(Box::new(v)),
                };
                Arth { val, ..x }
            }
            Arith::Bin(op, a0, a1) => {
                let a0 = self.arith(a0)?;
                let a1 = self.arith(a1)?;
                // libpcap refuses a divisor whose first statement loads the constant 0, and a shift count whose
                // first statement loads a constant above 31.
                match (op, a1.first_const) {
                    (ArithOp::Div, Some(0)) => return self.err("division by zero"),
                    (ArithOp::Mod, Some(0)) => return self.err("modulus by zero"),
                    (ArithOp::Shl | ArithOp::Shr, Some(k)) if k > 31 => {
                        return self.err("shift by more than 31 bits");
                    }
                    _ => {}
                }
                let alu = *op;
                let val = match (a0.val, a1.val) {
                    // libpcap's optimiser folds constant operations, and refuses a constant division by zero.
                    (Val::K(x), Val::K(y)) => match alu.apply(x, y) {
                        Some(v) => Val::K(v),
                        None if alu == Alu::Div => return self.err("division by zero"),
                        None => return self.err("modulus by zero"),
                    },
                    // libpcap's optimiser turns `A / X` with a constant X into `A / k` and refuses k = 0.
                    (_, Val::K(0)) if alu == Alu::Div => return self.err("division by zero"),
                    (_, Val::K(0)) if alu == Alu::Mod => return self.err("modulus by zero"),
                    (x, y) => Val::Alu(alu, Box::new(x), Box::new(y)),
                };
                // libpcap keeps only the left operand's condition.
                Arth { val, cond: a0.cond, first_const: a0.first_const }
            }
            Arith::Load { proto, index, size } => self.load(*proto, index, *size as u8)?,
        })
    }

    /// `proto[index]` at `off`: kept as an indexed load even for a constant index, as libpcap numbers it.
    fn indexed(&self, index: Val, off: Off, size: u8) -> Val {
        off.load(Some(index), size)
    }

    fn load(&self, proto: Proto, index: &Arith, size: u8) -> CResult<Arth> {
        let inst = self.arith(index)?;
        let first_const = inst.first_const;
        let (val, cond) = match proto {
            Proto::Link => {
                let off = self.off(Rel::LinkHdr, 0)?;
                (self.indexed(inst.val, off, size), inst.cond)
            }
            Proto::Ip | Proto::Arp | Proto::Rarp | Proto::Ip6 => {
                let b = self.proto_abbrev(proto)?;
                let off = self.off(Rel::LinkPl, 0)?;
                (self.indexed(inst.val, off, size), Some(and_opt(inst.cond, b)))
            }
            Proto::Sctp
            | Proto::Tcp
            | Proto::Udp
            | Proto::Icmp
            | Proto::Igmp
            | Proto::Igrp
            | Proto::Pim
            | Proto::Vrrp
            | Proto::Carp => {
                let (x, nl) = self.iphdr_end()?;
                let val = match (inst.val, &x) {
                    // A constant index: the same load as `index + header length` when that cannot wrap.
                    (Val::K(k), Val::Msh(_)) if k < u32::MAX - 64 && nl.checked_add(k).is_some() => {
                        Val::LdInd { base: Box::new(x), off: nl.wrapping_add(k), size }
                    }
                    (index, _) => {
                        let base = Val::Alu(Alu::Add, Box::new(index), Box::new(x));
                        Val::LdInd { base: Box::new(base), off: nl, size }
                    }
                };
                let b = Cond::and(self.proto_abbrev(proto)?, self.ipfrag()?);
                let b = and_opt(inst.cond, b);
                let b = Cond::and(self.proto_abbrev(Proto::Ip)?, b);
                (val, Some(b))
            }
            Proto::Icmp6 => {
                let b = and_opt(inst.cond, self.proto_abbrev(Proto::Ip6)?);
                let b = Cond::and(b, self.cmp(Rel::LinkPl, 6, 1, 58)?);
                let off = self.off(Rel::LinkPl, 40)?;
                (self.indexed(inst.val, off, size), Some(b))
            }
            Proto::Ah | Proto::Esp | Proto::Default => return self.err("unsupported index operation"),
        };
        Ok(Arth { val, cond, first_const })
    }

    // ---- primitives ------------------------------------------------------------------------------------------

    fn prim(&mut self, p: &Prim) -> CResult<Cond> {
        match p {
            Prim::Id { q, id, at } => {
                let outer = self.span;
                self.span = at.0;
                let c = self.id(*q, id);
                self.span = outer;
                c
            }
            Prim::Proto(p) => self.proto_abbrev(*p),
            Prim::Rel { op, lhs: Arith::Num(a), rhs: Arith::Num(b) } => {
                // Two literals: libpcap's optimiser decides this early, like a test of a known value.
                Ok(if match op {
                    RelOp::Gt => a > b,
                    RelOp::Ge => a >= b,
                    RelOp::Eq => a == b,
                    RelOp::Ne => a != b,
                    RelOp::Lt => a < b,
                    RelOp::Le => a <= b,
                } {
                    Cond::True
                } else {
                    Cond::False
                })
            }
            Prim::Rel { op, lhs, rhs } => {
                let a0 = self.arith(lhs)?;
                let a1 = self.arith(rhs)?;
                let (test, reversed) = match op {
                    RelOp::Gt => (Test::Gt, false),
                    RelOp::Ge => (Test::Ge, false),
                    RelOp::Eq => (Test::Eq, false),
                    RelOp::Ne => (Test::Eq, true),
                    RelOp::Lt => (Test::Ge, true),
                    RelOp::Le => (Test::Gt, true),
                };
                let mut b = Cond::CmpX { a: a0.val, test, b: a1.val };
                if reversed {
                    b = Cond::not(b);
                }
                let b = and_opt(a0.cond, b);
                Ok(and_opt(a1.cond, b))
            }
            Prim::Broadcast(p) => match p {
                Proto::Default | Proto::Link => match self.dlt {
                    Dlt::Arcnet => self.cmp(Rel::LinkHdr, 1, 1, 0),
                    Dlt::Ether => self.inner_ether(self.ehostop(&[0xff; 6], Dir::Dst)?),
                    Dlt::MacLlc { dst, src } => self.machostop(&[0xff; 6], Dir::Dst, dst, src),
                    Dlt::Wlan => self.wlanhostop(Dir::Dst, &|off| self.bcmp(Rel::LinkHdr, off, &[0xff; 6])),
                    _ => self.link_err("not a broadcast link"),
                },
                Proto::Ip => {
                    // tcpdump reading a file compiles with netmask 0, so the host part is the whole address.
                    let b1 = self.mcmp(Rel::LinkPl, 16, 4, 0, u32::MAX)?;
                    let b2 = self.mcmp(Rel::LinkPl, 16, 4, u32::MAX, u32::MAX)?;
                    Ok(Cond::and(self.linktype(ETHERTYPE_IP)?, Cond::or(b1, b2)))
                }
                _ => self.err("only link-layer/IP broadcast filters supported"),
            },
            Prim::Multicast(p) => match p {
                Proto::Default | Proto::Link => match self.dlt {
                    Dlt::Arcnet => self.cmp(Rel::LinkHdr, 1, 1, 0),
                    Dlt::Ether => {
                        self.inner_ether(Cond::Cmp { v: self.ld(Rel::LinkHdr, 0, 1)?, test: Test::Set, k: 1 })
                    }
                    Dlt::MacLlc { dst, .. } => Ok(Cond::Cmp { v: self.ld(Rel::LinkHdr, dst, 1)?, test: Test::Set, k: 1 }),
                    Dlt::Wlan => self.wlanhostop(Dir::Dst, &|off| {
                        Ok(Cond::Cmp { v: self.ld(Rel::LinkHdr, off, 1)?, test: Test::Set, k: 1 })
                    }),
                    _ => self.link_err(
                        "link-layer multicast filters supported only on ethernet/FDDI/token ring/ARCNET/802.11/ATM LANE/Fibre Channel",
                    ),
                },
                Proto::Ip => Ok(Cond::and(self.linktype(ETHERTYPE_IP)?, self.cmp_ge(Rel::LinkPl, 16, 1, 224)?)),
                Proto::Ip6 => Ok(Cond::and(self.linktype(ETHERTYPE_IPV6)?, self.cmp(Rel::LinkPl, 24, 1, 255)?)),
                _ => self.err(
                    "link-layer multicast filters supported only on ethernet/FDDI/token ring/ARCNET/802.11/ATM LANE/Fibre Channel",
                ),
            },
            Prim::Less(n) => Ok(Cond::not(Cond::Cmp { v: Val::Len, test: Test::Gt, k: *n })),
            Prim::Greater(n) => Ok(Cond::Cmp { v: Val::Len, test: Test::Ge, k: *n }),
            Prim::Vlan(id) => self.vlan(*id),
            Prim::Mpls(label) => self.mpls(*label),
            Prim::Pppoed => self.linktype(ETHERTYPE_PPPOED),
            Prim::Pppoes(sid) => self.pppoes(*sid),
            Prim::Geneve(vni) => self.geneve(*vni),
            Prim::After(t) => Ok(Cond::Time { after: true, t: *t }),
            Prim::Before(t) => Ok(Cond::Time { after: false, t: *t }),
        }
    }

    fn vlan(&mut self, id: Option<u32>) -> CResult<Cond> {
        if self.label_stack_depth > 0 {
            return self.err("no VLAN match after MPLS");
        }
        // libpcap looks for VLAN tags in 802.11 frames after radiotap, but not after PPI.
        if !(self.dlt == Dlt::Ether || self.dlt == Dlt::Wlan && self.dlt_value != 192) {
            return self.link_err("no VLAN support");
        }
        let b = Cond::or(self.linktype(ETHERTYPE_8021Q)?, self.linktype(ETHERTYPE_8021AD)?);
        let mut b = Cond::or(b, self.linktype(ETHERTYPE_8021QINQ)?);
        if let Some(id) = id {
            if id > 0x0fff {
                return self.err(format!("VLAN tag {id} greater than maximum 4095"));
            }
            b = Cond::and(b, self.mcmp(Rel::LinkPl, 0, 2, id, 0x0fff)?);
        }
        // Everything after this looks inside the tag.
        self.off_linkpl = self.off_linkpl.as_ref().map(|o| o.plus(4));
        self.off_linktype = self.off_linktype.as_ref().map(|o| o.plus(4));
        Ok(b)
    }

    fn mpls(&mut self, label: Option<u32>) -> CResult<Cond> {
        let mut b = if self.label_stack_depth > 0 {
            // Inside a label stack: the previous label is not the bottom one.
            self.mcmp(Rel::PrevMpls, 2, 1, 0, 0x01)?
        } else {
            match self.dlt {
                Dlt::CHdlc | Dlt::Ether => self.linktype(ETHERTYPE_MPLS)?,
                // Only DLT_PPP itself (not PPP in HDLC framing, pppd or PPPoE-pushed PPP).
                Dlt::Ppp if self.dlt_value == 9 => self.linktype(PPP_MPLS_UCAST)?,
                _ => return self.link_err("no MPLS support"),
            }
        };
        if let Some(label) = label {
            if label > 0xfffff {
                return self.err(format!("MPLS label {label} greater than maximum 1048575"));
            }
            b = Cond::and(b, self.mcmp(Rel::LinkPl, 0, 4, label << 12, 0xffff_f000)?);
        }
        self.off_nl += 4;
        self.label_stack_depth += 1;
        Ok(b)
    }

    fn pppoes(&mut self, sid: Option<u32>) -> CResult<Cond> {
        if self.off_linkhdr.var.is_some() && self.geneve_latest.is_none() {
            // libpcap 1.10 compiles this to code that reads a scratch register it never sets (the radiotap or PPI
            // length), so its answer depends on leftover memory: nothing to be exact to.
            return self.link_err("pcaptool does not evaluate 'pppoes' after a radiotap or PPI header");
        }
        let mut b = self.linktype(ETHERTYPE_PPPOES)?;
        if let Some(sid) = sid {
            if sid > 0xffff {
                return self.err(format!("PPPoE session number {sid} greater than maximum 65535"));
            }
            b = Cond::and(b, self.mcmp(Rel::LinkPl, 0, 4, sid, 0xffff)?);
        }
        // From here on the packet is PPP, 6 bytes (the PPPoE header) into the link-layer payload.
        let hdr = self.off(Rel::LinkPl, 6)?;
        self.dlt = Dlt::Ppp;
        self.dlt_value = 9;
        self.off_linkpl = Some(hdr.plus(2));
        self.off_linktype = Some(hdr.clone());
        self.off_linkhdr = hdr;
        self.off_nl = 0;
        self.is_geneve = false;
        Ok(b)
    }

    /// `gen_prevlinkhdr_check` for an Ethernet address test: after `geneve`, an inner Ethernet header must be
    /// there (libpcap compares the header and payload offsets), tested first.
    fn inner_ether(&self, b: Cond) -> CResult<Cond> {
        if !self.is_geneve {
            return Ok(b);
        }
        self.geneve_registers_set()?;
        // libpcap compares the registers alone (`vlan` and `mpls` after `geneve` move the constant parts only).
        let var = |o: Option<&Off>| o.and_then(|o| o.var.clone()).unwrap_or(Val::K(0));
        let bare = Cond::CmpX { a: var(Some(&self.off_linkhdr)), test: Test::Eq, b: var(self.off_linkpl.as_ref()) };
        Ok(Cond::and(Cond::not(bare), b))
    }

    /// `gen_geneve`: UDP to port 6081 over IPv4, else over IPv6, with a Geneve header of version 0 (and the VNI);
    /// then, where that matched, the offsets of the packet inside (libpcap's `gen_geneve_offsets`): the
    /// link-layer header past the Geneve header and its options, and past an inner Ethernet header when the
    /// protocol type is Transparent Ethernet Bridging, else the Geneve protocol type as the link-layer type.
    /// Every later test is an Ethernet test at those offsets. libpcap turns its optimiser off for the whole filter
    /// (see `Filter::optimized`).
    fn geneve(&mut self, vni: Option<u32>) -> CResult<Cond> {
        if self.dlt == Dlt::Wlan {
            // libpcap 1.10 computes the 802.11 offsets at the start of the program into the registers of the last
            // `geneve`, so the tests before it read registers nothing has set.
            return Err(FilterError::new(
                ErrorKind::Undefined(
                    "on 802.11, libpcap computes the frame's offsets into the registers of the last 'geneve', so the \
                     tests before it read registers nothing has set"
                        .into(),
                ),
                self.span,
            ));
        }
        let check = |v6: bool| -> CResult<Cond> {
            let b0 = self.ports_of(v6, GENEVE_PORT, GENEVE_PORT, false, Some(IPPROTO_UDP), Dir::Dst)?;
            // The Geneve header: version (2 bits) 0, and the VNI in the upper 3 bytes of its second word.
            let field = |off: u32, size: u8, mask: u32| -> CResult<Val> {
                let v = if v6 { self.ld(Rel::LinkPl, 40 + off, size)? } else { self.ld_tran4(off, size)? };
                Ok(Val::Alu(Alu::And, Box::new(v), Box::new(Val::K(mask))))
            };
            let mut b = Cond::and(b0, Cond::Cmp { v: field(8, 1, 0xc0)?, test: Test::Eq, k: 0 });
            if let Some(vni) = vni {
                if vni > 0xff_ffff {
                    return self.err(format!("Geneve VNI {vni} greater than maximum {}", 0xff_ffff));
                }
                b = Cond::and(b, Cond::Cmp { v: field(12, 4, 0xffff_ff00)?, test: Test::Eq, k: vni << 8 });
            }
            Ok(b)
        };
        let v4 = check(false)?;
        let v6 = check(true)?;
        if 3 * (self.geneves + 1) > MEMWORDS {
            return self.err("too many registers needed to evaluate expression");
        }
        let nl = self.off(Rel::LinkPl, 0)?;
        let v6_len = match &nl.var {
            Some(v) => Val::Alu(Alu::Add, Box::new(Val::K(40)), Box::new(v.clone())),
            None => Val::K(40),
        };
        let at = std::sync::Arc::new(Geneve {
            id: self.geneves + 1,
            v4: v4.clone(),
            v4_len: self.iphdr_end()?.0,
            v6_len,
            k: nl.k.wrapping_add(8),
        });
        let reg = |field: GeneveField| Val::Geneve { at: at.clone(), field };
        let off = |field: GeneveField| Off { var: Some(reg(field)), k: 0 };
        // The offsets are computed (their loads made) where the test matched.
        let b = Cond::and(Cond::or(v4, v6), Cond::Touch(reg(GeneveField::Payload)));
        self.geneves += 1;
        self.geneve_latest = Some(self.geneves);
        self.dlt = Dlt::Ether;
        self.dlt_value = 1;
        self.off_linkhdr = off(GeneveField::Header);
        self.off_linktype = Some(off(GeneveField::LinkType));
        self.off_linkpl = Some(off(GeneveField::Payload));
        self.off_nl = 0;
        self.is_geneve = true;
        Ok(b)
    }
}

/// libpcap's `ethertype_to_ppptype`.
fn ethertype_to_ppptype(p: u32) -> u32 {
    match p {
        ETHERTYPE_IP => 0x0021,
        ETHERTYPE_IPV6 => 0x0057,
        0x6003 => 0x0027, // DECnet
        ETHERTYPE_ATALK => 0x0029,
        0x0600 => 0x0025, // XNS
        LLCSAP_ISONS => 0x0023,
        0x42 => 0x0031, // 802.1D bridge PDU
        LLCSAP_IPX => 0x002b,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use crate::{ErrorKind, Filter, Target};
    use pcaptool_packet::LinkType;

    fn compile(f: &str, lt: u32) -> Result<crate::Matcher, ErrorKind> {
        Filter::new(f).and_then(|x| x.compile(Target::new(LinkType(lt)))).map_err(|e| e.kind)
    }

    /// Ethernet, IPv4, UDP to port 6081, a Geneve header (version 0, `options` 4-byte words, protocol `proto`,
    /// VNI 10), then `inner`.
    fn geneve(options: u8, proto: u16, inner: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 12];
        p.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend_from_slice(&[0x9c, 0x40, 0x17, 0xc1, 0, 0, 0, 0]);
        p.extend_from_slice(&[options, 0]);
        p.extend_from_slice(&proto.to_be_bytes());
        p.extend_from_slice(&[0, 0, 10, 0]);
        p.extend(std::iter::repeat_n(0xaa, 4 * usize::from(options)));
        p.extend_from_slice(inner);
        p
    }

    #[test]
    fn geneve_reads_the_inner_packet_past_options_with_or_without_an_inner_ethernet_header() {
        let m = |f: &str, p: &[u8]| compile(f, 1).unwrap().matches(p, p.len() as u32, 0);
        // Bare IPv4 inside (protocol 0x0800): the network layer right after the Geneve header and its options.
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 192, 0, 2, 7, 192, 0, 2, 8];
        ip.extend_from_slice(&[0, 1, 0, 80]);
        let bare = geneve(2, 0x0800, &ip);
        assert!(m("geneve 10 and ip and host 192.0.2.7 and tcp dst port 80", &bare));
        assert!(!m("geneve 11", &bare));
        assert!(!m("geneve and ether host 0:0:0:0:0:0", &bare), "no inner Ethernet header to test");
        // Transparent Ethernet Bridging: an inner Ethernet header (zero MACs) first.
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&[0x08, 0x00]);
        eth.extend_from_slice(&ip);
        let teb = geneve(1, 0x6558, &eth);
        assert!(m("geneve and ether host 0:0:0:0:0:0 and tcp port 80", &teb));
        // Cut inside the Geneve header's protocol type: the offsets cannot be computed, and the whole filter
        // fails there, even on its other side.
        assert!(!m("geneve or less 1000", &teb[..14 + 20 + 8 + 3]));
        assert!(m("geneve or less 1000", &teb[..14 + 20 + 8 + 4]));
    }

    #[test]
    fn tests_that_may_run_where_geneve_did_not_match_are_refused() {
        for f in [
            "geneve or ip",
            "not geneve and tcp",
            "geneve and (geneve 5 or tcp)",
            "geneve and icmp6 or geneve and icmp",
            "(geneve or udp) and ether broadcast",
        ] {
            assert!(matches!(compile(f, 1), Err(ErrorKind::Undefined(_))), "`{f}`");
        }
        for f in [
            "geneve or less 100",
            "geneve and (ip or ip6)",
            "not (geneve and tcp) and len > 60",
            "tcp or geneve",
            "geneve and (ip or geneve)",
            "(udp and geneve) and vlan 3",
        ] {
            assert!(compile(f, 1).is_ok(), "`{f}`");
        }
        // libpcap's limits: 16 scratch registers, three for each `geneve`; 24-bit VNIs.
        let five = ["geneve"; 5].join(" and ");
        assert!(compile(&five, 1).is_ok());
        assert!(matches!(compile(&format!("{five} and geneve"), 1), Err(ErrorKind::Invalid(_))));
        assert!(matches!(compile("geneve 0x1000000", 1), Err(ErrorKind::Invalid(_))));
        // On 802.11, libpcap computes the frame's offsets into the registers of the last `geneve`.
        assert!(matches!(compile("geneve", 105), Err(ErrorKind::Undefined(_))));
        assert!(compile("geneve and ip", 113).is_ok());
    }
}
