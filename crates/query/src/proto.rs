//! The protocol qualifier, shared by the scanner (protocol names are keywords) and the expression.

/// The protocol qualifier (libpcap's `Q_*` protocol values that pcaptool evaluates).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Proto {
    /// None given.
    Default,
    /// `ether` (also spelled `link`, `fddi`, `tr`, `wlan`, `ppp`, `slip`).
    Link,
    /// `ip`
    Ip,
    /// `ip6`
    Ip6,
    /// `arp`
    Arp,
    /// `rarp`
    Rarp,
    /// `tcp`
    Tcp,
    /// `udp`
    Udp,
    /// `sctp`
    Sctp,
    /// `icmp`
    Icmp,
    /// `icmp6`
    Icmp6,
    /// `igmp`
    Igmp,
    /// `igrp`
    Igrp,
    /// `pim`
    Pim,
    /// `vrrp`
    Vrrp,
    /// `carp`
    Carp,
    /// `ah`
    Ah,
    /// `esp`
    Esp,
}

impl Proto {
    /// The keyword, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Default => "",
            Proto::Link => "ether",
            Proto::Ip => "ip",
            Proto::Ip6 => "ip6",
            Proto::Arp => "arp",
            Proto::Rarp => "rarp",
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
            Proto::Icmp => "icmp",
            Proto::Icmp6 => "icmp6",
            Proto::Igmp => "igmp",
            Proto::Igrp => "igrp",
            Proto::Pim => "pim",
            Proto::Vrrp => "vrrp",
            Proto::Carp => "carp",
            Proto::Ah => "ah",
            Proto::Esp => "esp",
        }
    }
}
