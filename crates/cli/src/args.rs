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

/// How a store's new segments keep their packet data (`import`, `capture`, `compact`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Storage {
    /// Compress the segments' data: none (plain pcap that tcpdump opens), lz4 (fast, for capture), or zstd or
    /// zstd:LEVEL (smaller, for archives; level 1-22, default 3). Queries read any mix.
    #[arg(long, value_name = "CODEC", default_value = "none")]
    pub compress: pcaptool_flowstore::Codec,
    /// Raw bytes a compressed block aims at (4K to 1M; default 64K for lz4, 256K for zstd, and 64K for a
    /// deduplicated segment an eighth of whose data was left out): larger blocks compress better, smaller ones
    /// make a lookup of one flow decompress less.
    #[arg(long, value_name = "BYTES", value_parser = parse_block_size)]
    pub block_size: Option<usize>,
    /// Store a flow direction whose payload an earlier one of the same segment carried (the same file fetched
    /// twice) once: compared byte for byte, answers unchanged. Needs --compress lz4 or zstd.
    #[arg(long)]
    pub dedup: bool,
}

impl Storage {
    /// Refuses --dedup without compression.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.dedup && !self.compress.is_compressed() {
            anyhow::bail!("--dedup needs compressed segments: add --compress lz4 or --compress zstd");
        }
        Ok(())
    }
}

fn parse_block_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    let (min, max) = (pcaptool_flowstore::MIN_BLOCK_SIZE as u64, pcaptool_flowstore::MAX_BLOCK_SIZE as u64);
    if !(min..=max).contains(&n) {
        return Err(format!("a block size of {n} bytes: take 4K to 1M"));
    }
    Ok(n as usize)
}
