//! The parsed filter: libpcap's qualifiers resolved (keyword carry-over applied), in source order.
//!
//! Printing an [`Expr`] writes every qualifier out and parenthesises every operator, so that parsing the printed
//! text gives the same expression again.

use std::fmt;
use std::net::Ipv6Addr;

use crate::error::Span;
pub use crate::proto::Proto;

/// A source position inside the tree. Positions are not part of an expression's identity: two `Loc`s always
/// compare equal, so that an expression equals its printed-and-reparsed self.
#[derive(Clone, Copy, Debug, Default)]
pub struct Loc(pub Span);

impl PartialEq for Loc {
    fn eq(&self, _: &Loc) -> bool {
        true
    }
}
impl Eq for Loc {}

/// A boolean filter expression. A run of one operator is one node (`a or b or c` is `Or([a, b, c])`, at least
/// two operands, none itself of the same operator), so that a chain of thousands of terms is not thousands of
/// levels deep; `and` and `or` are associative under libpcap's left-to-right, short-circuit evaluation, so the
/// grouping carries no meaning.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Expr {
    /// All of them (evaluated left to right).
    And(Vec<Expr>),
    /// Any of them (evaluated left to right).
    Or(Vec<Expr>),
    /// Negation.
    Not(Box<Expr>),
    /// A primitive and where it was written.
    Prim(Prim, Loc),
}

/// The direction qualifier.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Dir {
    /// None given (source or destination).
    Default,
    /// `src`
    Src,
    /// `dst`
    Dst,
    /// `src or dst`
    SrcOrDst,
    /// `src and dst`
    SrcAndDst,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Default => "",
            Dir::Src => "src",
            Dir::Dst => "dst",
            Dir::SrcOrDst => "src or dst",
            Dir::SrcAndDst => "src and dst",
        }
    }
}

/// The address-kind qualifier.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum AddrKind {
    /// None given (a host, or a network for short numbers).
    Default,
    /// `host`
    Host,
    /// `net`
    Net,
    /// `port`
    Port,
    /// `portrange`
    PortRange,
    /// `proto`
    Proto,
    /// `protochain`: the protocol found by walking IPv6 extension headers and AH.
    ProtoChain,
}

impl AddrKind {
    fn name(self) -> &'static str {
        match self {
            AddrKind::Default => "",
            AddrKind::Host => "host",
            AddrKind::Net => "net",
            AddrKind::Port => "port",
            AddrKind::PortRange => "portrange",
            AddrKind::Proto => "proto",
            AddrKind::ProtoChain => "protochain",
        }
    }
}

/// The three qualifiers in force for an identifier.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Qual {
    /// Protocol.
    pub proto: Proto,
    /// Direction.
    pub dir: Dir,
    /// Address kind.
    pub addr: AddrKind,
}

/// The value a qualified primitive is about.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Id {
    /// A number (a port, a protocol, a short network or a 32-bit host address).
    Num(u32),
    /// A dotted IPv4 address of `bits / 8` parts, right-aligned (`10.1` is `0x0a01`, 16 bits).
    V4 {
        /// The parts.
        addr: u32,
        /// 8 times the number of parts.
        bits: u8,
    },
    /// `a.b.c.d/len`.
    V4Prefix {
        /// The parts, right-aligned.
        addr: u32,
        /// 8 times the number of parts.
        bits: u8,
        /// The prefix length as written.
        len: u32,
    },
    /// `a.b.c.d mask m.m.m.m`.
    V4Mask {
        /// The parts, right-aligned.
        addr: u32,
        /// 8 times the number of parts.
        bits: u8,
        /// The mask's parts, right-aligned.
        mask: u32,
        /// 8 times the number of the mask's parts.
        mask_bits: u8,
    },
    /// An IPv6 address with an optional prefix length.
    V6 {
        /// The address.
        addr: u128,
        /// `/len`, if given.
        len: Option<u32>,
    },
    /// A MAC address.
    Mac([u8; 6]),
    /// A name: a service, a protocol, a port range `lo-hi`, or a host name (refused: no lookups).
    Name(String),
}

/// A relational operator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum RelOp {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `=` or `==`
    Eq,
    /// `!=`
    Ne,
}

impl RelOp {
    fn symbol(self) -> &'static str {
        match self {
            RelOp::Gt => ">",
            RelOp::Ge => ">=",
            RelOp::Lt => "<",
            RelOp::Le => "<=",
            RelOp::Eq => "=",
            RelOp::Ne => "!=",
        }
    }
}

/// A binary arithmetic operator (32-bit unsigned, wrapping).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Mod,
    /// `&`
    And,
    /// `|`
    Or,
    /// `^`
    Xor,
    /// `<<`
    Shl,
    /// `>>`
    Shr,
}

impl ArithOp {
    fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
            ArithOp::Mod => "%",
            ArithOp::And => "&",
            ArithOp::Or => "|",
            ArithOp::Xor => "^",
            ArithOp::Shl => "<<",
            ArithOp::Shr => ">>",
        }
    }
}

/// An arithmetic expression over packet bytes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Arith {
    /// A constant.
    Num(u32),
    /// `len`: the packet's length on the wire.
    Len,
    /// `proto[index:size]`: `size` bytes (1, 2 or 4), big-endian, at `index` from the start of `proto`'s header.
    Load {
        /// Whose header the index counts from (`Link` for `ether[...]`).
        proto: Proto,
        /// The offset.
        index: Box<Arith>,
        /// 1, 2 or 4.
        size: u32,
    },
    /// A binary operation.
    Bin(ArithOp, Box<Arith>, Box<Arith>),
    /// Unary minus.
    Neg(Box<Arith>),
}

/// A primitive.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Prim {
    /// `[proto] [dir] [kind] id`, with qualifiers carried over from the previous primitive where omitted.
    Id {
        /// The qualifiers.
        q: Qual,
        /// The value.
        id: Id,
        /// Where the value was written.
        at: Loc,
    },
    /// A bare protocol name: `tcp`, `ip6`, `arp`, ...
    Proto(Proto),
    /// `lhs relop rhs`.
    Rel {
        /// The operator.
        op: RelOp,
        /// Left side.
        lhs: Arith,
        /// Right side.
        rhs: Arith,
    },
    /// `[proto] broadcast`.
    Broadcast(Proto),
    /// `[proto] multicast`.
    Multicast(Proto),
    /// `less n`: `len <= n`.
    Less(u32),
    /// `greater n`: `len >= n`.
    Greater(u32),
    /// `vlan [id]`.
    Vlan(Option<u32>),
    /// `mpls [label]`.
    Mpls(Option<u32>),
    /// `pppoes [session]`.
    Pppoes(Option<u32>),
    /// `pppoed`.
    Pppoed,
    /// `geneve [vni]`: UDP to port 6081 carrying Geneve version 0 (with this VNI); every later test reads the
    /// packet inside.
    Geneve(Option<u32>),
    /// `after T` (pcaptool extension): the packet's timestamp, in ns since the epoch, is at or after T.
    After(u64),
    /// `before T` (pcaptool extension): the packet's timestamp is strictly before T.
    Before(u64),
}

fn dotted(addr: u32, bits: u8) -> String {
    let n = usize::from(bits / 8);
    (0..n).rev().map(|k| ((addr >> (8 * k)) & 0xff).to_string()).collect::<Vec<_>>().join(".")
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::V4 { addr, bits } => write!(f, "{}", dotted(*addr, *bits)),
            Id::V4Prefix { addr, bits, len } => write!(f, "{}/{len}", dotted(*addr, *bits)),
            Id::V4Mask { addr, bits, mask, mask_bits } => {
                write!(f, "{} mask {}", dotted(*addr, *bits), dotted(*mask, *mask_bits))
            }
            Id::V6 { addr, len } => {
                write!(f, "{}", Ipv6Addr::from(*addr))?;
                match len {
                    Some(l) => write!(f, "/{l}"),
                    None => Ok(()),
                }
            }
            Id::Mac(m) => {
                write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
            }
            Id::Name(n) => {
                // A name that would not read back as the same identifier is written with libpcap's backslash.
                let plain = crate::lex::tokenize(n)
                    .ok()
                    .is_some_and(|t| t.len() == 2 && t[0].0 == crate::lex::Tok::Id(n.clone()));
                if plain { write!(f, "{n}") } else { write!(f, "\\{n}") }
            }
        }
    }
}

impl fmt::Display for Qual {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [self.proto.name(), self.dir.name(), self.addr.name()];
        let words: Vec<&str> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        write!(f, "{}", words.join(" "))
    }
}

impl fmt::Display for Arith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arith::Num(n) => write!(f, "{n}"),
            Arith::Len => write!(f, "len"),
            Arith::Load { proto, index, size } => write!(f, "{}[{index}:{size}]", proto.name()),
            Arith::Bin(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            Arith::Neg(a) => write!(f, "-{a}"),
        }
    }
}

impl fmt::Display for Prim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |f: &mut fmt::Formatter<'_>, kw: &str, v: &Option<u32>| match v {
            Some(v) => write!(f, "{kw} {v}"),
            None => write!(f, "{kw}"),
        };
        match self {
            Prim::Id { q, id, .. } => write!(f, "{q} {id}"),
            Prim::Proto(p) => write!(f, "{}", p.name()),
            Prim::Rel { op, lhs, rhs } => write!(f, "{lhs} {} {rhs}", op.symbol()),
            Prim::Broadcast(Proto::Default) => write!(f, "broadcast"),
            Prim::Broadcast(p) => write!(f, "{} broadcast", p.name()),
            Prim::Multicast(Proto::Default) => write!(f, "multicast"),
            Prim::Multicast(p) => write!(f, "{} multicast", p.name()),
            Prim::Less(n) => write!(f, "less {n}"),
            Prim::Greater(n) => write!(f, "greater {n}"),
            Prim::Vlan(v) => opt(f, "vlan", v),
            Prim::Mpls(v) => opt(f, "mpls", v),
            Prim::Pppoes(v) => opt(f, "pppoes", v),
            Prim::Pppoed => write!(f, "pppoed"),
            Prim::Geneve(v) => opt(f, "geneve", v),
            Prim::After(t) => write!(f, "after {}", pcaptool_packet::Rfc3339(*t)),
            Prim::Before(t) => write!(f, "before {}", pcaptool_packet::Rfc3339(*t)),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, v: &[Expr], op: &str| {
            write!(f, "(")?;
            for (i, e) in v.iter().enumerate() {
                if i > 0 {
                    write!(f, " {op} ")?;
                }
                write!(f, "{e}")?;
            }
            write!(f, ")")
        };
        match self {
            Expr::And(v) => list(f, v, "and"),
            Expr::Or(v) => list(f, v, "or"),
            Expr::Not(a) => write!(f, "not {a}"),
            Expr::Prim(p, _) => write!(f, "{p}"),
        }
    }
}

impl Expr {
    /// `a and b`, flattened: the operands of an `and` among them become operands of this one.
    pub fn and(a: Expr, b: Expr) -> Expr {
        Expr::join(a, b, true)
    }

    /// `a or b`, flattened.
    pub fn or(a: Expr, b: Expr) -> Expr {
        Expr::join(a, b, false)
    }

    fn join(a: Expr, b: Expr, and: bool) -> Expr {
        let mut v = match a {
            Expr::And(v) if and => v,
            Expr::Or(v) if !and => v,
            a => vec![a],
        };
        match b {
            Expr::And(w) if and => v.extend(w),
            Expr::Or(w) if !and => v.extend(w),
            b => v.push(b),
        }
        if and { Expr::And(v) } else { Expr::Or(v) }
    }

    /// Visits every primitive, left to right (the order libpcap generates code in).
    pub fn for_each_prim<'a>(&'a self, f: &mut impl FnMut(&'a Prim, Span)) {
        match self {
            Expr::And(v) | Expr::Or(v) => v.iter().for_each(|e| e.for_each_prim(f)),
            Expr::Not(a) => a.for_each_prim(f),
            Expr::Prim(p, at) => f(p, at.0),
        }
    }
}
