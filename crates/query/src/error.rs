//! Errors of parsing and compiling a filter: what went wrong and where, with a caret under the place.

use std::fmt;

/// A byte range of the filter text.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// The range `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// What is wrong with a filter.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ErrorKind {
    /// A character that no token starts with.
    IllegalChar(char),
    /// A number that is malformed or too large.
    BadNumber(String, &'static str),
    /// A dotted IPv4 address with a part above 255.
    BadAddress(String),
    /// The grammar expected something else here.
    Unexpected {
        /// The token found, as written.
        found: String,
        /// What would have been valid.
        expected: &'static str,
    },
    /// A construct of libpcap's language that pcaptool does not evaluate.
    Unsupported(String),
    /// A name that would need a lookup pcaptool does not do (DNS, /etc/ethers, /etc/networks).
    NameLookup {
        /// What kind of name (`host`, `ether host`, `net`).
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A port or protocol name not found in the services or protocols table.
    UnknownName {
        /// `port` or `protocol`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A time after `after`/`before` that could not be read.
    BadTime(String),
    /// A filter libpcap also refuses, with libpcap's reason (qualifier misuse, value out of range, ...).
    Invalid(String),
    /// A filter libpcap accepts but whose result it leaves to chance (it reads scratch memory nothing has set):
    /// pcaptool refuses it, and says how to write what was meant.
    Undefined(String),
    /// The filter nests deeper than pcaptool takes (see [`crate::MAX_DEPTH`]).
    TooDeep {
        /// The most levels taken.
        max: u32,
    },
    /// The filter means nothing on this link type (libpcap refuses it as well).
    LinkType {
        /// What cannot be done.
        what: String,
        /// The link type's name.
        linktype: String,
    },
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::IllegalChar(c) => write!(f, "illegal character {c:?}"),
            ErrorKind::BadNumber(s, why) => write!(f, "number {s} {why}"),
            ErrorKind::BadAddress(s) => write!(f, "invalid IPv4 address '{s}'"),
            ErrorKind::Unexpected { found, expected } => write!(f, "expected {expected}, found {found}"),
            ErrorKind::Unsupported(what) => write!(f, "{what} is not supported by pcaptool"),
            ErrorKind::NameLookup { what, name } => {
                write!(f, "{what} name '{name}' would need a name lookup, which pcaptool does not do; give the address")
            }
            ErrorKind::UnknownName { what, name } => write!(f, "unknown {what} '{name}'"),
            ErrorKind::BadTime(why) => write!(f, "{why}"),
            ErrorKind::Invalid(why) => write!(f, "{why}"),
            ErrorKind::Undefined(why) => write!(f, "libpcap leaves the result of this filter to chance: {why}"),
            ErrorKind::TooDeep { max } => write!(
                f,
                "the filter nests more than {max} levels deep (parentheses, 'not', arithmetic operators, 'and' and \
                 'or' alternating); write it with fewer levels (a long run of one operator is one level)"
            ),
            ErrorKind::LinkType { what, linktype } => write!(f, "{what} on link type {linktype}"),
        }
    }
}

/// A filter that cannot be parsed or compiled: the reason, the place, and the filter text to point into.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FilterError {
    /// What is wrong.
    pub kind: ErrorKind,
    /// Where, in bytes of the filter text.
    pub span: Span,
    /// The filter text, once known (set by [`crate::parse`] and [`crate::Filter::new`]).
    pub source: Option<String>,
}

impl FilterError {
    pub(crate) fn new(kind: ErrorKind, span: Span) -> FilterError {
        FilterError { kind, span, source: None }
    }

    pub(crate) fn with_source(mut self, source: &str) -> FilterError {
        self.source.get_or_insert_with(|| source.to_string());
        self
    }

    /// The message without the caret lines.
    pub fn message(&self) -> String {
        self.kind.to_string()
    }

    /// The filter and a caret line under the offending part, or `None` when the text is unknown.
    pub fn caret(&self) -> Option<String> {
        let src = self.source.as_deref()?;
        // Columns count characters, not bytes; tabs and newlines are shown as spaces. A long filter is shown around
        // the place only.
        let start = self.span.start.min(src.len());
        let (from, to) = if src.len() > 160 {
            let mut from = start.saturating_sub(60);
            while !src.is_char_boundary(from) {
                from -= 1;
            }
            let mut to = (start + 100).min(src.len());
            while !src.is_char_boundary(to) {
                to += 1;
            }
            (from, to)
        } else {
            (0, src.len())
        };
        let (pre, post) = (if from > 0 { "..." } else { "" }, if to < src.len() { "..." } else { "" });
        let shown: String = pre.to_string()
            + &src[from..to].chars().map(|c| if c.is_whitespace() { ' ' } else { c }).collect::<String>()
            + post;
        let col = pre.len() + src.get(from..start).map_or(0, |s| s.chars().count());
        let width = src
            .get(self.span.start.min(src.len())..self.span.end.min(src.len()))
            .map_or(1, |s| s.chars().count())
            .clamp(1, 100);
        Some(format!("  {shown}\n  {}{}", " ".repeat(col), "^".repeat(width)))
    }
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(c) = self.caret() {
            write!(f, "\n{c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FilterError {}
