//! The parser: libpcap's grammar (grammar.y) by recursive descent, with backtracking where yacc looks ahead.
//!
//! What libpcap's grammar does and this parser keeps:
//! - `and` and `or` have the same precedence and group to the left (`a or b and c` is `(a or b) and c`); `not`
//!   binds tighter.
//! - An identifier without qualifiers after `and`/`or`/`not` takes the qualifiers of the primitive before it
//!   (`host a or b`, `tcp dst port 80 or 443`); a parenthesised expression hands on the qualifiers in force before
//!   its parenthesis.
//! - Arithmetic precedence `|` < `&` < `<<` `>>` < `+` `-` < `*` `/` `%` < unary minus; `^` has no precedence
//!   in libpcap's grammar, so yacc's shift default makes everything after a `^` its right operand and a `^`
//!   after an operand take that operand (`a & b ^ c + d` is `a & (b ^ (c + d))`).

use crate::ast::{AddrKind, Arith, ArithOp, Dir, Expr, Id, Loc, Prim, Proto, Qual, RelOp};
use crate::error::{ErrorKind, FilterError, Span};
use crate::lex::{Kw, Tok, tokenize};

type PResult<T> = Result<T, FilterError>;

/// How deeply a filter may nest: parentheses, `not`, unary minus and arithmetic operators, and `and` and `or`
/// alternating (a run of one operator is one level however long). Deeper filters are refused with
/// [`ErrorKind::TooDeep`], so that no step of parsing, compiling or printing them can exhaust a thread's stack;
/// real filters nest a few levels.
pub const MAX_DEPTH: u32 = 200;

/// Parses a filter. `Ok(None)` is the empty filter, which accepts every packet.
pub fn parse(input: &str) -> Result<Option<Expr>, FilterError> {
    parse_inner(input).map_err(|e| e.with_source(input))
}

fn parse_inner(input: &str) -> PResult<Option<Expr>> {
    let toks = tokenize(input)?;
    let mut p = Parser { src: input, toks, pos: 0, q: None, depth: 0 };
    if p.peek() == &Tok::Eof {
        return Ok(None);
    }
    let e = p.expr()?;
    if p.peek() != &Tok::Eof {
        return Err(p.unexpected("'and', 'or' or the end of the filter"));
    }
    Ok(Some(e))
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<(Tok, Span)>,
    pos: usize,
    /// libpcap's `$<blk>0.q`: the qualifiers an unqualified identifier takes here; `None` is libpcap's `qerr`.
    q: Option<Qual>,
    /// Levels of nesting entered (see [`MAX_DEPTH`]).
    depth: u32,
}

/// Of two failed alternatives, the error that got further into the input.
fn furthest(a: FilterError, b: FilterError) -> FilterError {
    if b.span.start > a.span.start { b } else { a }
}

fn pname(kw: Kw) -> Option<Proto> {
    match kw {
        Kw::Pname(p) => Some(p),
        _ => None,
    }
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].0
    }

    fn span(&self) -> Span {
        self.toks[self.pos].1
    }

    fn prev_span(&self) -> Span {
        self.toks[self.pos.saturating_sub(1)].1
    }

    fn bump(&mut self) -> (Tok, Span) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn text(&self, span: Span) -> &str {
        &self.src[span.start..span.end]
    }

    fn unexpected(&self, expected: &'static str) -> FilterError {
        let (tok, span) = &self.toks[self.pos];
        if let Tok::Kw(Kw::Unsupported(w)) = tok {
            return FilterError::new(ErrorKind::Unsupported(format!("'{w}'")), *span);
        }
        FilterError::new(ErrorKind::Unexpected { found: tok.describe(self.text(*span)), expected }, *span)
    }

    fn expect(&mut self, t: Tok, expected: &'static str) -> PResult<Span> {
        if *self.peek() == t { Ok(self.bump().1) } else { Err(self.unexpected(expected)) }
    }

    fn save(&self) -> (usize, Option<Qual>) {
        (self.pos, self.q)
    }

    fn restore(&mut self, s: (usize, Option<Qual>)) {
        self.pos = s.0;
        self.q = s.1;
    }

    fn too_deep(&self) -> FilterError {
        FilterError::new(ErrorKind::TooDeep { max: MAX_DEPTH }, self.span())
    }

    /// Runs `f` one level deeper, refusing to go past [`MAX_DEPTH`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> PResult<T>) -> PResult<T> {
        if self.depth >= MAX_DEPTH {
            return Err(self.too_deep());
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    /// Checks that a tree `extra` levels deep below the current nesting stays within [`MAX_DEPTH`].
    fn check_depth(&self, extra: u32) -> PResult<()> {
        if self.depth.saturating_add(extra) > MAX_DEPTH { Err(self.too_deep()) } else { Ok(()) }
    }

    /// `e and rhs` (or `or`), counting in `alternations` the levels `and` and `or` alternating add (a run of one
    /// operator is one node), within [`MAX_DEPTH`].
    fn join(&self, e: Expr, rhs: Expr, and: bool, alternations: &mut u32) -> PResult<Expr> {
        if matches!((&e, and), (Expr::Or(_), true) | (Expr::And(_), false)) {
            *alternations += 1;
            self.check_depth(*alternations)?;
        }
        Ok(if and { Expr::and(e, rhs) } else { Expr::or(e, rhs) })
    }

    /// `expr: term | expr and term | expr or term | expr and id | expr or id`
    fn expr(&mut self) -> PResult<Expr> {
        self.nested(Parser::expr_inner)
    }

    fn expr_inner(&mut self) -> PResult<Expr> {
        let mut e = self.term()?;
        // Levels added by `and` and `or` alternating (a run of one is one node).
        let mut alternations = 0;
        loop {
            let and = match self.peek() {
                Tok::And => true,
                Tok::Or => false,
                _ => return Ok(e),
            };
            self.bump();
            let saved = self.save();
            let rhs = match self.term() {
                Ok(t) => t,
                Err(e1) => {
                    self.restore(saved);
                    self.id().map_err(|e2| match &e2.kind {
                        // `tcp or 80`: say what is missing rather than where the comparison attempt ended.
                        ErrorKind::Invalid(_)
                            if e1.span.start <= e2.span.end && matches!(e1.kind, ErrorKind::Unexpected { .. }) =>
                        {
                            e2
                        }
                        _ => furthest(e1, e2),
                    })?
                }
            };
            e = self.join(e, rhs, and, &mut alternations)?;
        }
    }

    /// `term: rterm | not term`
    fn term(&mut self) -> PResult<Expr> {
        if *self.peek() == Tok::Not {
            self.bump();
            let t = self.nested(Parser::term)?;
            return Ok(Expr::Not(Box::new(t)));
        }
        self.rterm()
    }

    fn prim(&self, p: Prim, start: Span) -> Expr {
        Expr::Prim(p, Loc(start.to(self.prev_span())))
    }

    fn rterm(&mut self) -> PResult<Expr> {
        let start = self.span();
        match self.peek().clone() {
            Tok::LParen => {
                let saved = self.save();
                match self.relation() {
                    Ok(r) => Ok(r),
                    Err(e1) => {
                        self.restore(saved);
                        let q_before = self.q;
                        self.bump();
                        let e = self.expr().map_err(|e2| furthest(e1.clone(), e2))?;
                        self.expect(Tok::RParen, "')'").map_err(|e2| furthest(e1, e2))?;
                        self.q = q_before;
                        Ok(e)
                    }
                }
            }
            Tok::Num(_) | Tok::Minus | Tok::Kw(Kw::Len) => self.relation(),
            Tok::Kw(kw) => {
                if let Some(p) = pname(kw) {
                    match self.peek_at(1) {
                        Tok::LBrack => return self.relation(),
                        Tok::Kw(Kw::Broadcast) => {
                            self.bump();
                            self.bump();
                            self.q = None;
                            return Ok(self.prim(Prim::Broadcast(p), start));
                        }
                        Tok::Kw(Kw::Multicast) => {
                            self.bump();
                            self.bump();
                            self.q = None;
                            return Ok(self.prim(Prim::Multicast(p), start));
                        }
                        Tok::Kw(
                            Kw::Src
                            | Kw::Dst
                            | Kw::Host
                            | Kw::Net
                            | Kw::Port
                            | Kw::PortRange
                            | Kw::Proto
                            | Kw::Gateway
                            | Kw::ProtoChain,
                        ) => return self.head_id(),
                        _ => {
                            self.bump();
                            self.q = None;
                            return Ok(self.prim(Prim::Proto(p), start));
                        }
                    }
                }
                match kw {
                    Kw::Src
                    | Kw::Dst
                    | Kw::Host
                    | Kw::Net
                    | Kw::Port
                    | Kw::PortRange
                    | Kw::Proto
                    | Kw::Gateway
                    | Kw::ProtoChain => self.head_id(),
                    Kw::Broadcast | Kw::Multicast => {
                        self.bump();
                        self.q = None;
                        let p = if kw == Kw::Broadcast {
                            Prim::Broadcast(Proto::Default)
                        } else {
                            Prim::Multicast(Proto::Default)
                        };
                        Ok(self.prim(p, start))
                    }
                    Kw::Less | Kw::Greater => {
                        self.bump();
                        let Tok::Num(n) = *self.peek() else {
                            return Err(self.unexpected("a number"));
                        };
                        self.bump();
                        self.q = None;
                        let p = if kw == Kw::Less { Prim::Less(n) } else { Prim::Greater(n) };
                        Ok(self.prim(p, start))
                    }
                    Kw::Vlan | Kw::Mpls | Kw::Pppoes | Kw::Geneve => {
                        self.bump();
                        let n = self.opt_pnum();
                        self.q = None;
                        let p = match kw {
                            Kw::Vlan => Prim::Vlan(n),
                            Kw::Mpls => Prim::Mpls(n),
                            Kw::Geneve => Prim::Geneve(n),
                            _ => Prim::Pppoes(n),
                        };
                        Ok(self.prim(p, start))
                    }
                    Kw::Pppoed => {
                        self.bump();
                        self.q = None;
                        Ok(self.prim(Prim::Pppoed, start))
                    }
                    Kw::After | Kw::Before => {
                        self.bump();
                        let (tok, span) = self.bump();
                        let Tok::Time(text) = tok else {
                            self.pos -= 1;
                            return Err(self.unexpected("a time (RFC 3339 or epoch seconds)"));
                        };
                        let t = pcaptool_packet::parse_time(&text)
                            .map_err(|e| FilterError::new(ErrorKind::BadTime(e.to_string()), span))?;
                        self.q = None;
                        let p = if kw == Kw::After { Prim::After(t) } else { Prim::Before(t) };
                        Ok(self.prim(p, start))
                    }
                    Kw::Unsupported(_) => Err(self.unexpected("")),
                    _ => Err(self.unexpected("a primitive ('host', 'port', 'tcp', a comparison, ...)")),
                }
            }
            Tok::Hid(..) | Tok::Hid6(_) | Tok::Eid(_) | Tok::Id(_) => {
                let text = self.text(self.span()).to_string();
                Err(FilterError::new(
                    ErrorKind::Invalid(format!(
                        "'{text}' needs a qualifier to say what it is, as in 'host {text}', 'net {text}' or 'port {text}'"
                    )),
                    self.span(),
                ))
            }
            _ => Err(self.unexpected("a primitive ('host', 'port', 'tcp', a comparison, ...)")),
        }
    }

    /// `VLAN pnum | VLAN` (also `mpls`, `pppoes`, `geneve`): a number, possibly in parentheses, if one follows.
    fn opt_pnum(&mut self) -> Option<u32> {
        let saved = self.save();
        match self.pnum() {
            Ok(n) => Some(n),
            Err(_) => {
                self.restore(saved);
                None
            }
        }
    }

    /// `pnum: NUM | '(' pnum ')'`
    fn pnum(&mut self) -> PResult<u32> {
        match *self.peek() {
            Tok::Num(n) => {
                self.bump();
                Ok(n)
            }
            Tok::LParen => {
                self.bump();
                let n = self.nested(Parser::pnum)?;
                self.expect(Tok::RParen, "')'")?;
                Ok(n)
            }
            _ => Err(self.unexpected("a number")),
        }
    }

    /// `head id`, where `head` is `[pname] [dqual] [aqual]`, `[pname] proto`, `[pname] protochain`, and the
    /// refused `gateway`.
    fn head_id(&mut self) -> PResult<Expr> {
        let start = self.span();
        let mut q = Qual { proto: Proto::Default, dir: Dir::Default, addr: AddrKind::Default };
        if let Tok::Kw(kw) = *self.peek()
            && let Some(p) = pname(kw)
        {
            q.proto = p;
            self.bump();
        }
        match *self.peek() {
            Tok::Kw(Kw::Src) | Tok::Kw(Kw::Dst) => {
                let first = self.peek().clone();
                self.bump();
                q.dir = if first == Tok::Kw(Kw::Src) { Dir::Src } else { Dir::Dst };
                let other = if first == Tok::Kw(Kw::Src) { Tok::Kw(Kw::Dst) } else { Tok::Kw(Kw::Src) };
                match self.peek() {
                    Tok::Or if *self.peek_at(1) == other => {
                        self.bump();
                        self.bump();
                        q.dir = Dir::SrcOrDst;
                    }
                    Tok::And if *self.peek_at(1) == other => {
                        self.bump();
                        self.bump();
                        q.dir = Dir::SrcAndDst;
                    }
                    _ => {}
                }
                if let Some(a) = self.aqual() {
                    q.addr = a;
                }
            }
            Tok::Kw(Kw::Proto) => {
                self.bump();
                q.addr = AddrKind::Proto;
            }
            Tok::Kw(Kw::Gateway) => {
                return Err(FilterError::new(ErrorKind::Unsupported("'gateway'".into()), self.span()));
            }
            Tok::Kw(Kw::ProtoChain) => {
                self.bump();
                q.addr = AddrKind::ProtoChain;
            }
            _ => match self.aqual() {
                Some(a) => q.addr = a,
                None => return Err(self.unexpected("'src', 'dst', 'host', 'net', 'port', 'portrange' or 'proto'")),
            },
        }
        if matches!(self.peek(), Tok::Kw(Kw::Gateway)) {
            return Err(FilterError::new(ErrorKind::Unsupported("'gateway'".into()), self.span()));
        }
        self.q = Some(q);
        let e = self.id()?;
        // `head id` spans from the qualifiers: widen the first primitive's location.
        Ok(match e {
            Expr::Prim(p, at) => Expr::Prim(p, Loc(start.to(at.0))),
            other => other,
        })
    }

    fn aqual(&mut self) -> Option<AddrKind> {
        let a = match self.peek() {
            Tok::Kw(Kw::Host) => AddrKind::Host,
            Tok::Kw(Kw::Net) => AddrKind::Net,
            Tok::Kw(Kw::Port) => AddrKind::Port,
            Tok::Kw(Kw::PortRange) => AddrKind::PortRange,
            _ => return None,
        };
        self.bump();
        Some(a)
    }

    /// `id: nid | pnum | '(' pid ')'`, `nid: ID | HID | HID '/' NUM | HID mask HID | HID6 | HID6 '/' NUM | EID
    /// | not id`, `pid: nid | qid and id | qid or id`: a value under the qualifiers in force.
    fn id(&mut self) -> PResult<Expr> {
        let start = self.span();
        let Some(q) = self.q else {
            // libpcap: an identifier after a primitive that sets no qualifiers is a syntax error.
            if !matches!(self.peek(), Tok::Num(_) | Tok::Hid(..) | Tok::Hid6(_) | Tok::Eid(_) | Tok::Id(_)) {
                return Err(self.unexpected("a primitive ('host', 'port', 'tcp', a comparison, ...)"));
            }
            let text = self.text(self.span()).to_string();
            return Err(FilterError::new(
                ErrorKind::Invalid(format!(
                    "'{text}' has no qualifier: the primitive before it sets none to carry over; write one, as in 'port {text}' or 'host {text}'"
                )),
                self.span(),
            ));
        };
        let id = match self.peek().clone() {
            Tok::Not => {
                self.bump();
                let inner = self.nested(Parser::id)?;
                return Ok(Expr::Not(Box::new(inner)));
            }
            Tok::LParen => {
                let saved = self.save();
                if let Ok(n) = self.pnum() {
                    Id::Num(n)
                } else {
                    self.restore(saved);
                    self.bump();
                    let e = self.nested(|p| {
                        let mut e = p.id()?;
                        let mut alternations = 0;
                        loop {
                            let and = match p.peek() {
                                Tok::And => true,
                                Tok::Or => false,
                                _ => break,
                            };
                            p.bump();
                            let rhs = p.id()?;
                            e = p.join(e, rhs, and, &mut alternations)?;
                        }
                        Ok(e)
                    })?;
                    self.expect(Tok::RParen, "')'")?;
                    return Ok(e);
                }
            }
            Tok::Num(n) => {
                self.bump();
                Id::Num(n)
            }
            Tok::Hid(addr, bits) => {
                self.bump();
                match self.peek().clone() {
                    Tok::Slash => {
                        self.bump();
                        let Tok::Num(len) = *self.peek() else {
                            return Err(self.unexpected("a prefix length"));
                        };
                        self.bump();
                        Id::V4Prefix { addr, bits, len }
                    }
                    Tok::Kw(Kw::Mask) => {
                        self.bump();
                        let Tok::Hid(mask, mask_bits) = *self.peek() else {
                            return Err(self.unexpected("a dotted netmask"));
                        };
                        self.bump();
                        Id::V4Mask { addr, bits, mask, mask_bits }
                    }
                    _ => Id::V4 { addr, bits },
                }
            }
            Tok::Hid6(addr) => {
                self.bump();
                if *self.peek() == Tok::Slash {
                    self.bump();
                    let Tok::Num(len) = *self.peek() else {
                        return Err(self.unexpected("a prefix length"));
                    };
                    self.bump();
                    Id::V6 { addr, len: Some(len) }
                } else {
                    Id::V6 { addr, len: None }
                }
            }
            Tok::Eid(m) => {
                self.bump();
                Id::Mac(m)
            }
            Tok::Id(name) => {
                self.bump();
                Id::Name(name)
            }
            Tok::Kw(kw) if !matches!(kw, Kw::Unsupported(_)) => {
                let text = self.text(self.span()).to_string();
                return Err(FilterError::new(
                    ErrorKind::Invalid(format!(
                        "expected an address, a number or a name, found the keyword '{text}' (write '\\{text}' to use it as a name)"
                    )),
                    self.span(),
                ));
            }
            _ => return Err(self.unexpected("an address, a number or a name")),
        };
        let at = Loc(start.to(self.prev_span()));
        Ok(Expr::Prim(Prim::Id { q, id, at }, at))
    }

    /// `arth relop arth`
    fn relation(&mut self) -> PResult<Expr> {
        let start = self.span();
        let (lhs, _) = self.arith(0)?;
        let op = match self.peek() {
            Tok::Gt => RelOp::Gt,
            Tok::Ge => RelOp::Ge,
            Tok::Lt => RelOp::Lt,
            Tok::Le => RelOp::Le,
            Tok::Eq => RelOp::Eq,
            Tok::Ne => RelOp::Ne,
            _ => return Err(self.unexpected("a comparison operator (=, !=, <, <=, >, >=)")),
        };
        self.bump();
        let (rhs, _) = self.arith(0)?;
        self.q = None;
        Ok(self.prim(Prim::Rel { op, lhs, rhs }, start))
    }

    /// An arithmetic expression binding at least as tightly as `min`, and how many levels deep it is.
    fn arith(&mut self, min: u8) -> PResult<(Arith, u32)> {
        self.nested(|p| p.arith_inner(min))
    }

    fn arith_inner(&mut self, min: u8) -> PResult<(Arith, u32)> {
        let (mut lhs, mut depth) = self.arith_unary()?;
        loop {
            let (op, prec) = match self.peek() {
                Tok::Caret => {
                    // No precedence in libpcap's grammar: yacc shifts, so the rest is the right operand.
                    self.bump();
                    let (rhs, d) = self.arith(0)?;
                    depth = depth.max(d) + 1;
                    self.check_depth(depth)?;
                    lhs = Arith::Bin(ArithOp::Xor, Box::new(lhs), Box::new(rhs));
                    continue;
                }
                Tok::Pipe => (ArithOp::Or, 1),
                Tok::Amp => (ArithOp::And, 2),
                Tok::Shl => (ArithOp::Shl, 3),
                Tok::Shr => (ArithOp::Shr, 3),
                Tok::Plus => (ArithOp::Add, 4),
                Tok::Minus => (ArithOp::Sub, 4),
                Tok::Star => (ArithOp::Mul, 5),
                Tok::Slash => (ArithOp::Div, 5),
                Tok::Percent => (ArithOp::Mod, 5),
                _ => return Ok((lhs, depth)),
            };
            if prec < min {
                return Ok((lhs, depth));
            }
            self.bump();
            let (rhs, d) = self.arith(prec + 1)?;
            // A left-leaning chain (`1 + 1 + ...`) is built by this loop, not by recursion: its depth counts too.
            depth = depth.max(d) + 1;
            self.check_depth(depth)?;
            lhs = Arith::Bin(op, Box::new(lhs), Box::new(rhs));
        }
    }

    fn arith_unary(&mut self) -> PResult<(Arith, u32)> {
        if *self.peek() == Tok::Minus {
            self.bump();
            let (a, d) = self.arith(6)?;
            return Ok((Arith::Neg(Box::new(a)), d + 1));
        }
        self.arith_primary()
    }

    fn arith_primary(&mut self) -> PResult<(Arith, u32)> {
        match self.peek().clone() {
            Tok::Num(n) => {
                self.bump();
                Ok((Arith::Num(n), 1))
            }
            Tok::Kw(Kw::Len) => {
                self.bump();
                Ok((Arith::Len, 1))
            }
            Tok::LParen => {
                self.bump();
                let a = self.arith(0)?;
                self.expect(Tok::RParen, "')'")?;
                Ok(a)
            }
            Tok::Kw(kw) if *self.peek_at(1) == Tok::LBrack => {
                let Some(proto) = pname(kw) else {
                    return Err(self.unexpected(""));
                };
                self.bump();
                self.bump();
                let (index, depth) = self.arith(0)?;
                let mut size = 1;
                if *self.peek() == Tok::Colon {
                    self.bump();
                    let Tok::Num(n) = *self.peek() else {
                        return Err(self.unexpected("a size (1, 2 or 4)"));
                    };
                    if !matches!(n, 1 | 2 | 4) {
                        return Err(FilterError::new(
                            ErrorKind::Invalid("data size must be 1, 2, or 4".into()),
                            self.span(),
                        ));
                    }
                    self.bump();
                    size = n;
                }
                self.expect(Tok::RBrack, "']'")?;
                Ok((Arith::Load { proto, index: Box::new(index), size }, depth + 1))
            }
            _ => Err(self.unexpected("a number, 'len', 'proto[offset]' or '('")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(s: &str) -> String {
        parse(s).unwrap().unwrap().to_string()
    }

    #[test]
    fn carry_over_and_precedence() {
        assert_eq!(show("host 1.2.3.4 or 5.6.7.8"), "(host 1.2.3.4 or host 5.6.7.8)");
        assert_eq!(show("tcp dst port 80 or 443"), "(tcp dst port 80 or tcp dst port 443)");
        assert_eq!(show("tcp or udp and icmp"), "((tcp or udp) and icmp)");
        assert_eq!(show("host 1.1.1.1 and not 2.2.2.2"), "(host 1.1.1.1 and not host 2.2.2.2)");
        // A run of one operator is one node, parenthesised or not.
        assert_eq!(show("host 1.1.1.1 or (tcp) or 2.2.2.2"), "(host 1.1.1.1 or tcp or host 2.2.2.2)");
        assert_eq!(show("(tcp or udp) or (icmp or arp)"), "(tcp or udp or icmp or arp)");
        assert_eq!(show("tcp and udp or icmp and arp"), "(((tcp and udp) or icmp) and arp)");
        assert_eq!(show("src or dst port 53"), "src or dst port 53");
        assert_eq!(show("not tcp and udp"), "(not tcp and udp)");
        assert_eq!(show("host 1.1.1.1 or (2.2.2.2 and 3.3.3.3)"), "(host 1.1.1.1 or (host 2.2.2.2 and host 3.3.3.3))");
    }

    #[test]
    fn arithmetic_grouping_matches_yacc() {
        assert_eq!(show("len ^ 1 & 2 = 0"), "(len ^ (1 & 2)) = 0");
        assert_eq!(show("len & 1 ^ 2 = 0"), "(len & (1 ^ 2)) = 0");
        assert_eq!(show("len - 1 - 2 = 0"), "((len - 1) - 2) = 0");
        assert_eq!(show("1 + 2 * 3 = 7"), "(1 + (2 * 3)) = 7");
        assert_eq!(show("-len + 1 = 0"), "(-len + 1) = 0");
        assert_eq!(show("tcp[tcpflags] & tcp-syn != 0"), "(tcp[13:1] & 2) != 0");
        assert_eq!(show("(ip[0] & 0xf) > 5"), "(ip[0:1] & 15) > 5");
    }

    /// Nesting past [`MAX_DEPTH`] is refused with its own error, however it is made (parentheses, `not`, unary
    /// minus, left-leaning arithmetic, right-leaning `^`, `and`/`or` alternating, parenthesised identifiers);
    /// a run of one operator, however long, is one level.
    #[test]
    fn nesting_is_bounded_and_long_runs_are_flat() {
        let deep = |s: &str| matches!(parse(s), Err(FilterError { kind: ErrorKind::TooDeep { .. }, .. }));
        let n = 5 * MAX_DEPTH as usize;
        assert!(deep(&format!("{}tcp{}", "(".repeat(n), ")".repeat(n))));
        assert!(deep(&format!("{}tcp", "not ".repeat(n))));
        assert!(deep(&format!("ip[0] = {}1", "-".repeat(n))));
        assert!(deep(&format!("ip[0] = 1{}", " + 1".repeat(n))));
        assert!(deep(&format!("ip[0] = 1{}", " ^ 1".repeat(n))));
        assert!(deep(&format!("ip[{}0{}] = 1", "ip[".repeat(n), "]".repeat(n))));
        assert!(deep(&format!("tcp{}", [" and udp", " or icmp"].repeat(n).concat())));
        assert!(deep(&format!("host ({}1.1.1.1{})", "(".repeat(n), ")".repeat(n))));
        assert!(deep(&format!("port {}1{}", "(".repeat(n), ")".repeat(n))));
        // Within the bound: parsed.
        let ok = MAX_DEPTH as usize / 3;
        assert!(parse(&format!("{}tcp{}", "(".repeat(ok), ")".repeat(ok))).is_ok());
        assert!(parse(&format!("ip[0] = 1{}", " + 1".repeat(ok))).is_ok());
        let run: String = (0..20_000).map(|i| format!("port {}", i % 65536)).collect::<Vec<_>>().join(" or ");
        match parse(&run) {
            Ok(Some(Expr::Or(v))) => assert_eq!(v.len(), 20_000),
            other => panic!("a run of 20,000: {other:?}"),
        }
    }

    #[test]
    fn errors_point_at_the_problem() {
        let e = parse("tcp or 80").unwrap_err();
        assert_eq!(e.span, Span::new(7, 9));
        let e = parse("gateway foo").unwrap_err();
        assert!(e.to_string().contains("'gateway' is not supported"), "{e}");
        assert!(parse("1.2.3.4").is_err());
        assert!(parse("ip proto tcp").is_err());
        assert!(parse("src proto 6").is_err());
        assert!(parse("(tcp").is_err());
        assert!(parse("ether[0:3] = 1").is_err());
        assert_eq!(parse("").unwrap(), None);
    }
}
