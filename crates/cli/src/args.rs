//! Parsers and value types of arguments that several commands share.

use clap::ValueEnum;
use pcaptool_packet::{Compression, parse_time};

/// A byte count with an optional unit: K, M, G, T (or KB, MB, GB, TB, KiB, MiB, GiB, TiB), all powers of 1024,
/// as tcpdump's `-C` and most disk tools count.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => 0,
    };
    num.parse::<u64>()
        .ok()
        .filter(|_| mult > 0)
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("`{s}` is not a size: give bytes, or a number with K, M, G or T (KB, MiB, ... also)"))
}

/// A time given as RFC 3339 or seconds since the epoch, in ns.
pub(crate) fn parse_time_arg(s: &str) -> Result<u64, String> {
    parse_time(s).map_err(|e| e.to_string())
}

/// An output container on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Pcap,
    Pcapng,
}

impl Format {
    pub(crate) fn container(self) -> pcaptool_engine::Container {
        match self {
            Format::Pcap => pcaptool_engine::Container::Pcap,
            Format::Pcapng => pcaptool_engine::Container::PcapNg,
        }
    }
}

/// An output compression on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Compress {
    None,
    Gzip,
    Zstd,
    Lz4,
}

impl Compress {
    pub(crate) fn compression(self) -> Option<Compression> {
        match self {
            Compress::None => None,
            Compress::Gzip => Some(Compression::Gzip),
            Compress::Zstd => Some(Compression::Zstd),
            Compress::Lz4 => Some(Compression::Lz4),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_the_usual_units() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("100MB"), Ok(100 << 20));
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1 TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4kb"), Ok(4 << 10));
        assert!(parse_size("0").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("10X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
