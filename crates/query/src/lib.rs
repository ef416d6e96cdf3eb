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
