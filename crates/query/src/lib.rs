//! tcpdump's filter language for pcaptool, with libpcap's semantics: a parser, a compiler to a matcher over raw
//! packet bytes, and a planner that splits a filter into what an index can answer and what is left to check
//! per packet.
//!
//! ```
//! use pcaptool_query::parse;
//! let e = parse("tcp dst port 80 or 443").unwrap().unwrap();
//! assert_eq!(e.to_string(), "(tcp dst port 80 or tcp dst port 443)");
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod ast;
mod error;
mod lex;
mod parse;

pub use ast::Expr;
pub use error::{ErrorKind, FilterError, Span};
pub use parse::parse;
mod compile;
mod names;
pub mod prog;

pub use compile::Target;
mod matcher;

pub use matcher::Matcher;

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

    /// The condition tree for packets of one link type, with libpcap's tests in libpcap's order.
    pub fn cond(&self, target: Target) -> Result<prog::Cond, FilterError> {
        let mut c = compile::Compiler::new(target).map_err(|k| FilterError::new(k, Span::default()))?;
        match &self.expr {
            None => Ok(prog::Cond::True),
            Some(e) => c.program(e),
        }
        .map_err(|e| e.with_source(&self.text))
    }

    /// A matcher for packets of one link type. Like libpcap, refuses a filter that provably matches nothing
    /// ("expression rejects all packets", for example `tcp and udp`).
    pub fn compile(&self, target: Target) -> Result<Matcher, FilterError> {
        let m = Matcher::new(self.cond(target)?);
        if m.rejects_all() {
            let span = Span::new(0, self.text.len());
            return Err(FilterError::new(ErrorKind::Invalid("expression rejects all packets".into()), span)
                .with_source(&self.text));
        }
        Ok(m)
    }
}
#[doc(hidden)]
pub mod fuzz_harness;
pub mod plan;
