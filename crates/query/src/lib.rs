//! tcpdump's filter language for pcaptool, with libpcap's semantics: a parser, a compiler to a matcher over raw
//! packet bytes, and a planner that splits a filter into what an index can answer and what is left to check
//! per packet (docs/filters.md).
//!
//! ```
//! use pcaptool_packet::LinkType;
//! use pcaptool_query::{Filter, Target};
//!
//! let f = Filter::new("tcp dst port 80 or 443").unwrap();
//! assert_eq!(f.expr().unwrap().to_string(), "(tcp dst port 80 or tcp dst port 443)");
//! let m = f.compile(Target::new(LinkType::ETHERNET)).unwrap();
//! let syn_to_443 = [
//!     [0u8; 12].as_slice(), &[0x08, 0x00],                          // Ethernet, IPv4
//!     &[0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2], // IPv4, TCP
//!     &[0x30, 0x39, 0x01, 0xbb, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x02, 0, 0, 0, 0, 0, 0], // ports 12345 -> 443
//! ]
//! .concat();
//! assert!(m.matches(&syn_to_443, syn_to_443.len() as u32, 0));
//! assert!(!m.matches(&syn_to_443[..37], 54, 0)); // cut inside the port: no match, as in BPF
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod ast;
mod compile;
mod error;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature; not part of the stable API).
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz_harness;
mod lex;
mod matcher;
mod names;
mod parse;
pub mod plan;
pub mod prog;
mod proto;

pub use ast::Expr;
pub use compile::Target;
pub use error::{ErrorKind, FilterError, Span};
pub use matcher::Matcher;
pub use parse::{MAX_DEPTH, parse};

/// A parsed filter, ready to be compiled for the link types it meets.
#[derive(Clone, Debug)]
pub struct Filter {
    text: String,
    expr: Option<Expr>,
}

impl Filter {
    /// Parses `text` (tcpdump syntax; empty accepts every packet).
    pub fn new(text: &str) -> Result<Filter, FilterError> {
        Ok(Filter { text: text.to_string(), expr: parse(text)? })
    }

    /// The text as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The parsed expression (`None` for the empty filter).
    pub fn expr(&self) -> Option<&Expr> {
        self.expr.as_ref()
    }

    /// Whether libpcap optimises this filter: not when it holds `protochain` or `geneve`, whose loop and jumps
    /// turn libpcap's optimiser off for the whole filter (so that, for example, a packet too short for a test the optimiser would
    /// have dropped is refused, and a filter that matches nothing is not an error).
    pub fn optimized(&self) -> bool {
        fn walk(e: &Expr) -> bool {
            match e {
                Expr::And(v) | Expr::Or(v) => v.iter().all(walk),
                Expr::Not(a) => walk(a),
                Expr::Prim(ast::Prim::Id { q, .. }, _) => q.addr != ast::AddrKind::ProtoChain,
                Expr::Prim(ast::Prim::Geneve(_), _) => false,
                Expr::Prim(..) => true,
            }
        }
        self.expr.as_ref().is_none_or(walk)
    }

    /// The condition tree for packets of one link type, with libpcap's tests in libpcap's order.
    pub fn cond(&self, target: Target) -> Result<prog::Cond, FilterError> {
        let mut c = compile::Compiler::new(target).map_err(|k| FilterError::new(k, Span::default()))?;
        c.optimize = self.optimized();
        match &self.expr {
            None => Ok(prog::Cond::True),
            Some(e) => c.program(e),
        }
        .map_err(|e| e.with_source(&self.text))
    }

    /// A matcher for packets of one link type. Like libpcap, refuses a filter that provably matches nothing
    /// ("expression rejects all packets", for example `tcp and udp`).
    pub fn compile(&self, target: Target) -> Result<Matcher, FilterError> {
        let cond = self.cond(target)?;
        if !self.optimized() {
            return Ok(Matcher::unoptimized(cond));
        }
        let m = Matcher::new(cond);
        if m.rejects_all() {
            let span = Span::new(0, self.text.len());
            return Err(FilterError::new(ErrorKind::Invalid("expression rejects all packets".into()), span)
                .with_source(&self.text));
        }
        Ok(m)
    }
}
