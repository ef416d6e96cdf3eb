//! The tokenizer: libpcap's scanner rules (longest match, keywords before identifiers, named constants as numbers).

use crate::error::{ErrorKind, FilterError, Span};
use crate::proto::Proto;

/// A keyword of the language. Words libpcap knows but pcaptool does not evaluate are [`Kw::Unsupported`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kw {
    Dst,
    Src,
    Host,
    Net,
    Mask,
    Port,
    PortRange,
    Proto,
    Gateway,
    ProtoChain,
    /// A protocol name (`ether` is also spelled `link`, `fddi`, `tr`, `wlan`, `ppp`, `slip`, as in libpcap).
    Pname(Proto),
    Broadcast,
    Multicast,
    Len,
    Less,
    Greater,
    Vlan,
    Mpls,
    Pppoed,
    Pppoes,
    Geneve,
    After,
    Before,
    /// A libpcap keyword that pcaptool does not evaluate; the error names it.
    Unsupported(&'static str),
}

/// A token.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Tok {
    Kw(Kw),
    /// A number (decimal, 0x hex, 0 octal) or a named constant (`tcpflags`, `icmp-echo`, ...).
    Num(u32),
    /// Dotted IPv4 with 2 to 4 parts: value right-aligned and the number of bits given.
    Hid(u32, u8),
    /// IPv6 address.
    Hid6(u128),
    /// MAC address.
    Eid([u8; 6]),
    /// A name (possibly written with a leading backslash).
    Id(String),
    /// The text after `after`/`before`, taken verbatim up to white space or a parenthesis.
    Time(String),
    LParen,
    RParen,
    LBrack,
    RBrack,
    Colon,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Amp,
    Pipe,
    Caret,
    Shl,
    Shr,
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
    Not,
    And,
    Or,
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self, text: &str) -> String {
        match self {
            Tok::Eof => "the end of the filter".to_string(),
            _ => format!("'{text}'"),
        }
    }
}

const KEYWORDS: &[(&str, Kw)] = &[
    ("dst", Kw::Dst),
    ("src", Kw::Src),
    ("host", Kw::Host),
    ("net", Kw::Net),
    ("mask", Kw::Mask),
    ("port", Kw::Port),
    ("portrange", Kw::PortRange),
    ("proto", Kw::Proto),
    ("gateway", Kw::Gateway),
    ("protochain", Kw::ProtoChain),
    ("link", Kw::Pname(Proto::Link)),
    ("ether", Kw::Pname(Proto::Link)),
    ("fddi", Kw::Pname(Proto::Link)),
    ("tr", Kw::Pname(Proto::Link)),
    ("wlan", Kw::Pname(Proto::Link)),
    ("ppp", Kw::Pname(Proto::Link)),
    ("slip", Kw::Pname(Proto::Link)),
    ("ip", Kw::Pname(Proto::Ip)),
    ("ip6", Kw::Pname(Proto::Ip6)),
    ("arp", Kw::Pname(Proto::Arp)),
    ("rarp", Kw::Pname(Proto::Rarp)),
    ("tcp", Kw::Pname(Proto::Tcp)),
    ("udp", Kw::Pname(Proto::Udp)),
    ("sctp", Kw::Pname(Proto::Sctp)),
    ("icmp", Kw::Pname(Proto::Icmp)),
    ("icmp6", Kw::Pname(Proto::Icmp6)),
    ("igmp", Kw::Pname(Proto::Igmp)),
    ("igrp", Kw::Pname(Proto::Igrp)),
    ("pim", Kw::Pname(Proto::Pim)),
    ("vrrp", Kw::Pname(Proto::Vrrp)),
    ("carp", Kw::Pname(Proto::Carp)),
    ("ah", Kw::Pname(Proto::Ah)),
    ("esp", Kw::Pname(Proto::Esp)),
    ("broadcast", Kw::Broadcast),
    ("multicast", Kw::Multicast),
    ("len", Kw::Len),
    ("length", Kw::Len),
    ("less", Kw::Less),
    ("greater", Kw::Greater),
    ("vlan", Kw::Vlan),
    ("mpls", Kw::Mpls),
    ("pppoed", Kw::Pppoed),
    ("pppoes", Kw::Pppoes),
    ("geneve", Kw::Geneve),
    ("after", Kw::After),
    ("before", Kw::Before),
];

/// libpcap keywords pcaptool recognises only to refuse them by name.
const UNSUPPORTED: &[&str] = &[
    "atalk",
    "aarp",
    "decnet",
    "lat",
    "sca",
    "moprc",
    "mopdl",
    "iso",
    "esis",
    "es-is",
    "isis",
    "is-is",
    "l1",
    "l2",
    "iih",
    "lsp",
    "snp",
    "csnp",
    "psnp",
    "clnp",
    "stp",
    "ipx",
    "netbeui",
    "radio",
    "byte",
    "inbound",
    "outbound",
    "ifindex",
    "vxlan",
    "lane",
    "llc",
    "metac",
    "bcc",
    "oam",
    "oamf4",
    "oamf4ec",
    "oamf4sc",
    "sc",
    "ilmic",
    "vpi",
    "vci",
    "connectmsg",
    "metaconnect",
    "fisu",
    "lssu",
    "msu",
    "hfisu",
    "hlssu",
    "hmsu",
    "sio",
    "opc",
    "dpc",
    "sls",
    "hsio",
    "hopc",
    "hdpc",
    "hsls",
    "on",
    "ifname",
    "rnr",
    "rulenum",
    "reason",
    "rset",
    "ruleset",
    "srnr",
    "subrulenum",
    "action",
    "type",
    "subtype",
    "direction",
    "dir",
    "address1",
    "addr1",
    "address2",
    "addr2",
    "address3",
    "addr3",
    "address4",
    "addr4",
    "ra",
    "ta",
];

/// Named values the scanner turns into numbers.
const CONSTANTS: &[(&str, u32)] = &[
    ("icmptype", 0),
    ("icmpcode", 1),
    ("icmp-echoreply", 0),
    ("icmp-unreach", 3),
    ("icmp-sourcequench", 4),
    ("icmp-redirect", 5),
    ("icmp-echo", 8),
    ("icmp-routeradvert", 9),
    ("icmp-routersolicit", 10),
    ("icmp-timxceed", 11),
    ("icmp-paramprob", 12),
    ("icmp-tstamp", 13),
    ("icmp-tstampreply", 14),
    ("icmp-ireq", 15),
    ("icmp-ireqreply", 16),
    ("icmp-maskreq", 17),
    ("icmp-maskreply", 18),
    ("icmp6type", 0),
    ("icmp6code", 1),
    ("icmp6-destinationunreach", 1),
    ("icmp6-packettoobig", 2),
    ("icmp6-timeexceeded", 3),
    ("icmp6-parameterproblem", 4),
    ("icmp6-echo", 128),
    ("icmp6-echoreply", 129),
    ("icmp6-multicastlistenerquery", 130),
    ("icmp6-multicastlistenerreportv1", 131),
    ("icmp6-multicastlistenerdone", 132),
    ("icmp6-routersolicit", 133),
    ("icmp6-routeradvert", 134),
    ("icmp6-neighborsolicit", 135),
    ("icmp6-neighboradvert", 136),
    ("icmp6-redirect", 137),
    ("icmp6-routerrenum", 138),
    ("icmp6-nodeinformationquery", 139),
    ("icmp6-nodeinformationresponse", 140),
    ("icmp6-ineighbordiscoverysolicit", 141),
    ("icmp6-ineighbordiscoveryadvert", 142),
    ("icmp6-multicastlistenerreportv2", 143),
    ("icmp6-homeagentdiscoveryrequest", 144),
    ("icmp6-homeagentdiscoveryreply", 145),
    ("icmp6-mobileprefixsolicit", 146),
    ("icmp6-mobileprefixadvert", 147),
    ("icmp6-certpathsolicit", 148),
    ("icmp6-certpathadvert", 149),
    ("icmp6-multicastrouteradvert", 151),
    ("icmp6-multicastroutersolicit", 152),
    ("icmp6-multicastrouterterm", 153),
    ("tcpflags", 13),
    ("tcp-fin", 0x01),
    ("tcp-syn", 0x02),
    ("tcp-rst", 0x04),
    ("tcp-push", 0x08),
    ("tcp-ack", 0x10),
    ("tcp-urg", 0x20),
    ("tcp-ece", 0x40),
    ("tcp-cwr", 0x80),
];

/// Characters of libpcap's identifier pattern `[A-Za-z0-9]([-_.A-Za-z0-9]*[.A-Za-z0-9])?`.
pub(crate) fn is_word_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// Splits `input` into tokens with their byte spans; the last token is [`Tok::Eof`].
pub(crate) fn tokenize(input: &str) -> Result<Vec<(Tok, Span)>, FilterError> {
    let b = input.as_bytes();
    let mut out: Vec<(Tok, Span)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        // The operand of `after`/`before` is a time, read verbatim.
        if matches!(out.last(), Some((Tok::Kw(Kw::After | Kw::Before), _))) && c != b'(' {
            let mut j = i;
            while j < b.len() && !b[j].is_ascii_whitespace() && b[j] != b'(' && b[j] != b')' {
                j += 1;
            }
            out.push((Tok::Time(input[i..j].to_string()), Span::new(i, j)));
            i = j;
            continue;
        }
        let two = if i + 1 < b.len() { &b[i..i + 2] } else { &b[i..i + 1] };
        let op2 = match two {
            b">=" => Some(Tok::Ge),
            b"<=" => Some(Tok::Le),
            b"!=" => Some(Tok::Ne),
            b"==" => Some(Tok::Eq),
            b"<<" => Some(Tok::Shl),
            b">>" => Some(Tok::Shr),
            b"&&" => Some(Tok::And),
            b"||" => Some(Tok::Or),
            _ => None,
        };
        if let Some(t) = op2 {
            out.push((t, Span::new(i, i + 2)));
            i += 2;
            continue;
        }
        let op1 = match c {
            b'(' => Some(Tok::LParen),
            b')' => Some(Tok::RParen),
            b'[' => Some(Tok::LBrack),
            b']' => Some(Tok::RBrack),
            b':' if !(i + 1 < b.len() && b[i + 1] == b':') => Some(Tok::Colon),
            b'+' => Some(Tok::Plus),
            b'-' => Some(Tok::Minus),
            b'*' => Some(Tok::Star),
            b'/' => Some(Tok::Slash),
            b'%' => Some(Tok::Percent),
            b'&' => Some(Tok::Amp),
            b'|' => Some(Tok::Pipe),
            b'^' => Some(Tok::Caret),
            b'>' => Some(Tok::Gt),
            b'<' => Some(Tok::Lt),
            b'=' => Some(Tok::Eq),
            b'!' => Some(Tok::Not),
            _ => None,
        };
        if let Some(t) = op1 {
            out.push((t, Span::new(i, i + 1)));
            i += 1;
            continue;
        }
        if c == b'\\' {
            // libpcap: "\\"[^ !()\n\t]+ is an identifier without the backslash.
            let mut j = i + 1;
            while j < b.len() && !matches!(b[j], b' ' | b'!' | b'(' | b')' | b'\n' | b'\t') {
                j += 1;
            }
            if j == i + 1 {
                return Err(FilterError::new(ErrorKind::IllegalChar('\\'), Span::new(i, j)));
            }
            out.push((Tok::Id(input[i + 1..j].to_string()), Span::new(i, j)));
            i = j;
            continue;
        }
        if !(c.is_ascii_alphanumeric() || c == b':') {
            let ch = input[i..].chars().next().unwrap_or('?');
            return Err(FilterError::new(ErrorKind::IllegalChar(ch), Span::new(i, i + ch.len_utf8())));
        }
        // Longest match among: a word (identifier, keyword, number, dotted IPv4, MAC with '-' or '.'),
        // and the colon forms (IPv6, MAC with ':').
        let mut w = i;
        if c.is_ascii_alphanumeric() {
            while w < b.len() && is_word_char(b[w]) {
                w += 1;
            }
            // An identifier ends with a letter, digit or '.'.
            while w > i + 1 && matches!(b[w - 1], b'-' | b'_') {
                w -= 1;
            }
        }
        let mut colon_end = i;
        while colon_end < b.len() && (b[colon_end].is_ascii_hexdigit() || matches!(b[colon_end], b':' | b'.')) {
            colon_end += 1;
        }
        let colon_tok = if input[i..colon_end].contains(':') { colon_form(&input[i..colon_end]) } else { None };
        if let Some((tok, len)) = colon_tok
            && len >= w - i
        {
            out.push((tok, Span::new(i, i + len)));
            i += len;
            continue;
        }
        if w == i {
            return Err(FilterError::new(ErrorKind::IllegalChar(':'), Span::new(i, i + 1)));
        }
        let word = &input[i..w];
        let span = Span::new(start, w);
        out.push((classify(word, span)?, span));
        i = w;
    }
    out.push((Tok::Eof, Span::new(b.len(), b.len())));
    Ok(out)
}

/// The longest prefix of `s` that is an IPv6 address or a colon-separated MAC address.
fn colon_form(s: &str) -> Option<(Tok, usize)> {
    let mut best = None;
    // Try every prefix ending at a hex digit, '.' or ':' boundary, longest first.
    for end in (1..=s.len()).rev() {
        let p = &s[..end];
        if !p.contains(':') {
            break;
        }
        if let Some(mac) = parse_mac_sep(p, ':') {
            best = Some((Tok::Eid(mac), end));
            break;
        }
        if let Ok(a) = p.parse::<std::net::Ipv6Addr>() {
            best = Some((Tok::Hid6(u128::from(a)), end));
            break;
        }
    }
    best
}

/// `{B}:{B}:{B}:{B}:{B}:{B}` (one or two hex digits each) with the given separator.
fn parse_mac_sep(s: &str, sep: char) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(sep).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// `{B2}.{B2}.{B2}`: three groups of four hex digits.
fn parse_mac_dotted(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| p.len() == 4 && p.bytes().all(|b| b.is_ascii_hexdigit())) {
        return None;
    }
    let mut mac = [0u8; 6];
    for (k, p) in parts.iter().enumerate() {
        let v = u16::from_str_radix(p, 16).ok()?;
        mac[2 * k..2 * k + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(mac)
}

fn is_num(s: &str) -> bool {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())
    } else {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }
}

/// libpcap's `stoulen`: decimal, `0x` hex or leading-zero octal, at most 32 bits.
fn parse_num(s: &str, span: Span) -> Result<u32, FilterError> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if radix == 8 && !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(FilterError::new(ErrorKind::BadNumber(s.to_string(), "contains a non-octal digit"), span));
    }
    u32::from_str_radix(digits, radix)
        .map_err(|_| FilterError::new(ErrorKind::BadNumber(s.to_string(), "does not fit in 32 bits"), span))
}

/// libpcap's `__pcap_atoin`: 2 to 4 decimal parts, each at most 255; the value right-aligned.
fn parse_hid(s: &str, span: Span) -> Result<(u32, u8), FilterError> {
    let mut v: u32 = 0;
    let mut bits = 0u8;
    for part in s.split('.') {
        // libpcap reads each part as decimal digits (a hex or octal spelling is not an address).
        let n = part.bytes().try_fold(0u32, |n, b| {
            let n = n * 10 + u32::from(b.wrapping_sub(b'0'));
            (b.is_ascii_digit() && n <= 255).then_some(n)
        });
        match n {
            Some(n) if !part.is_empty() => v = (v << 8) | n,
            _ => return Err(FilterError::new(ErrorKind::BadAddress(s.to_string()), span)),
        }
        bits += 8;
    }
    Ok((v, bits))
}

fn classify(word: &str, span: Span) -> Result<Tok, FilterError> {
    match word {
        "and" => return Ok(Tok::And),
        "or" => return Ok(Tok::Or),
        "not" => return Ok(Tok::Not),
        _ => {}
    }
    if let Some(&(_, kw)) = KEYWORDS.iter().find(|(w, _)| *w == word) {
        return Ok(Tok::Kw(kw));
    }
    if let Some(&w) = UNSUPPORTED.iter().find(|w| **w == word) {
        return Ok(Tok::Kw(Kw::Unsupported(w)));
    }
    if let Some(&(_, v)) = CONSTANTS.iter().find(|(w, _)| *w == word) {
        return Ok(Tok::Num(v));
    }
    if is_num(word) {
        return parse_num(word, span).map(Tok::Num);
    }
    let parts: Vec<&str> = word.split('.').collect();
    if (2..=4).contains(&parts.len()) && parts.iter().all(|p| is_num(p)) {
        return parse_hid(word, span).map(|(v, b)| Tok::Hid(v, b));
    }
    if let Some(mac) = parse_mac_sep(word, '-').or_else(|| parse_mac_dotted(word)) {
        return Ok(Tok::Eid(mac));
    }
    Ok(Tok::Id(word.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        tokenize(s).unwrap().into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn words_numbers_and_addresses() {
        assert_eq!(toks("tcp-syn"), vec![Tok::Num(2), Tok::Eof]);
        assert_eq!(toks("0x10 010 10"), vec![Tok::Num(16), Tok::Num(8), Tok::Num(10), Tok::Eof]);
        assert_eq!(toks("10.1"), vec![Tok::Hid(0x0a01, 16), Tok::Eof]);
        assert_eq!(toks("1:2:3:4:5:6"), vec![Tok::Eid([1, 2, 3, 4, 5, 6]), Tok::Eof]);
        assert_eq!(toks("::1"), vec![Tok::Hid6(1), Tok::Eof]);
        assert_eq!(toks("ip6[1:2]")[2..5], [Tok::Num(1), Tok::Colon, Tok::Num(2)]);
        assert_eq!(toks("foo-bar"), vec![Tok::Id("foo-bar".into()), Tok::Eof]);
        assert_eq!(toks("\\tcp"), vec![Tok::Id("tcp".into()), Tok::Eof]);
        assert_eq!(toks("a&&b||!c")[1], Tok::And);
        assert_eq!(toks("after 2024-01-01T00:00:00Z")[1], Tok::Time("2024-01-01T00:00:00Z".into()));
        assert!(tokenize("08").is_err());
        assert!(tokenize("1.2.3.256").is_err());
        assert!(tokenize("host $").is_err());
    }
}
