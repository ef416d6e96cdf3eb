//! `pcaptool info`: what capinfos tells about a capture, plus a protocol breakdown; text or `--json`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use pcaptool_packet::{
    Decoded, FileFormat, LinkType, Rfc3339, TraceReader, Transport, TsPrecision, TunnelKind, decode,
};
use serde::Serialize;

use crate::progress;

/// Arguments of `pcaptool info`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Capture files (pcap or pcapng, optionally gzip/zstd/lz4-compressed); `-` reads standard input.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print one JSON object per file (a JSON array) instead of text.
    #[arg(long)]
    json: bool,
    /// Skip the protocol breakdown (no per-packet decoding).
    #[arg(long)]
    no_protocols: bool,
}

#[derive(Debug, Serialize)]
struct LinkTypeCount {
    linktype: u32,
    name: Option<&'static str>,
    packets: u64,
}

/// The facts of one capture file.
#[derive(Debug, Default, Serialize)]
struct FileInfo {
    file: String,
    format: Option<&'static str>,
    byte_order: Option<&'static str>,
    version: Option<String>,
    timestamp_precision: Option<&'static str>,
    compression: Option<&'static str>,
    file_bytes: Option<u64>,
    link_types: Vec<LinkTypeCount>,
    interfaces: usize,
    snaplen: Option<u32>,
    packets: u64,
    truncated_packets: u64,
    captured_bytes: u64,
    wire_bytes: u64,
    first_ns: Option<u64>,
    last_ns: Option<u64>,
    earliest_ns: Option<u64>,
    latest_ns: Option<u64>,
    first_time: Option<String>,
    last_time: Option<String>,
    earliest_time: Option<String>,
    latest_time: Option<String>,
    duration_ns: Option<u64>,
    /// Packets whose timestamp is earlier than the previous packet's.
    out_of_order: u64,
    /// Packets without a timestamp (pcapng simple packet blocks).
    without_timestamp: u64,
    protocols: BTreeMap<&'static str, u64>,
    /// The damage that ended reading, if any; every complete record before it is counted.
    error: Option<String>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut infos = Vec::new();
    let mut failed = false;
    for path in &args.files {
        let info = summarize(path, !args.no_protocols)?;
        failed |= info.error.is_some();
        infos.push(info);
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &infos)?;
        writeln!(out)?;
    } else {
        for (i, info) in infos.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            print_text(&mut out, info)?;
        }
    }
    out.flush()?;
    drop(out);
    for info in &infos {
        if let Some(e) = &info.error {
            eprintln!("pcaptool: error: {e}");
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Reads one capture to the end (or to its damage) and gathers its facts. Errors only when it cannot be opened.
fn summarize(path: &PathBuf, protocols: bool) -> anyhow::Result<FileInfo> {
    let mut reader = TraceReader::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut info = FileInfo { file: path.display().to_string(), ..FileInfo::default() };
    info.compression = reader.compression().map(|c| c.name());
    info.file_bytes = std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len());
    let pb = progress::bytes(info.file_bytes, "info");
    let mut per_link: BTreeMap<u32, u64> = BTreeMap::new();
    // Runs of one link type are counted here and added to `per_link` when the link type changes.
    let mut run: Option<(u32, u64)> = None;
    let mut prev_ts: Option<u64> = None;
    let mut n = 0u64;
    let mut protos = ProtoCounts::new();
    while let Some(rec) = reader.next_record() {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                info.error = Some(e.to_string());
                break;
            }
        };
        n += 1;
        if n.is_multiple_of(65536) {
            pb.set_position(rec.offset);
        }
        info.packets += 1;
        info.captured_bytes += u64::from(rec.caplen());
        info.wire_bytes += u64::from(rec.wirelen);
        if rec.is_truncated() {
            info.truncated_packets += 1;
        }
        match &mut run {
            Some((lt, n)) if *lt == rec.linktype.0 => *n += 1,
            _ => {
                if let Some((lt, n)) = run.replace((rec.linktype.0, 1)) {
                    *per_link.entry(lt).or_default() += n;
                }
            }
        }
        if rec.has_ts {
            let t = rec.ts_ns;
            info.first_ns.get_or_insert(t);
            info.last_ns = Some(t);
            info.earliest_ns = Some(info.earliest_ns.map_or(t, |e| e.min(t)));
            info.latest_ns = Some(info.latest_ns.map_or(t, |l| l.max(t)));
            if prev_ts.is_some_and(|p| t < p) {
                info.out_of_order += 1;
            }
            prev_ts = Some(t);
        } else {
            info.without_timestamp += 1;
        }
        if protocols {
            classify(&decode(rec.linktype, rec.data), &mut protos);
        }
    }
    pb.finish_and_clear();
    info.protocols = protos.into_map();
    if let Some((lt, n)) = run {
        *per_link.entry(lt).or_default() += n;
    }
    info.interfaces = reader.interfaces().len();
    info.link_types = per_link
        .into_iter()
        .map(|(lt, packets)| LinkTypeCount { linktype: lt, name: LinkType(lt).name(), packets })
        .collect();
    match reader.format() {
        Some(FileFormat::Pcap { precision, big_endian, version, snaplen, linktype, .. }) => {
            info.byte_order = Some(if big_endian { "big-endian" } else { "little-endian" });
            info.version = Some(format!("{}.{}", version.0, version.1));
            info.timestamp_precision = Some(match precision {
                TsPrecision::Micro => "microseconds",
                TsPrecision::Nano => "nanoseconds",
            });
            info.snaplen = Some(snaplen);
            if info.link_types.is_empty() {
                info.link_types.push(LinkTypeCount { linktype: linktype.0, name: linktype.name(), packets: 0 });
            }
        }
        Some(FileFormat::PcapNg { big_endian }) => {
            info.byte_order = Some(if big_endian { "big-endian" } else { "little-endian" });
            info.version = Some("1.0".into());
            info.snaplen = reader.interfaces().iter().map(|i| i.snaplen).max();
        }
        None => {}
    }
    info.format = reader.format().map(|f| f.name());
    info.duration_ns = info.earliest_ns.zip(info.latest_ns).map(|(e, l)| l - e);
    info.first_time = info.first_ns.map(|t| Rfc3339(t).to_string());
    info.last_time = info.last_ns.map(|t| Rfc3339(t).to_string());
    info.earliest_time = info.earliest_ns.map(|t| Rfc3339(t).to_string());
    info.latest_time = info.latest_ns.map(|t| Rfc3339(t).to_string());
    Ok(info)
}

/// Protocol labels of the breakdown, in a fixed order so that per-packet counting is an array increment.
const LABELS: [&str; 25] = [
    "ethernet",
    "vlan",
    "mpls",
    "pppoe",
    "arp",
    "ipv4",
    "ipv6",
    "ip-fragment",
    "tcp",
    "udp",
    "sctp",
    "icmp",
    "icmp6",
    "igmp",
    "other-transport",
    "esp",
    "ah",
    "ospf",
    "pim",
    "vrrp",
    "other-ip",
    "non-ip",
    "gre",
    "erspan",
    "headers-cut-by-snaplen",
];
const TUNNEL_LABELS: [&str; 5] = ["ip-in-ip", "vxlan", "geneve", "gtp-u", "tunnel"];

/// Per-packet protocol counts.
#[derive(Debug)]
struct ProtoCounts([u64; LABELS.len() + TUNNEL_LABELS.len()]);

impl ProtoCounts {
    fn new() -> ProtoCounts {
        ProtoCounts([0; LABELS.len() + TUNNEL_LABELS.len()])
    }

    fn into_map(self) -> BTreeMap<&'static str, u64> {
        LABELS.iter().chain(TUNNEL_LABELS.iter()).zip(self.0).filter(|(_, n)| *n > 0).map(|(l, n)| (*l, n)).collect()
    }
}

/// Index of a label, resolved at compile time.
const fn idx(label: &str) -> usize {
    let all = LABELS;
    let mut i = 0;
    while i < all.len() {
        if const_eq(all[i], label) {
            return i;
        }
        i += 1;
    }
    let mut j = 0;
    while j < TUNNEL_LABELS.len() {
        if const_eq(TUNNEL_LABELS[j], label) {
            return LABELS.len() + j;
        }
        j += 1;
    }
    panic!("unknown label")
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Counts the protocols a packet contains, outer headers and tunnels.
fn classify(d: &Decoded, counts: &mut ProtoCounts) {
    macro_rules! add {
        ($l:literal) => {{
            const I: usize = idx($l);
            counts.0[I] += 1;
        }};
    }
    if d.eth.is_some() {
        add!("ethernet");
    }
    if d.vlan_count > 0 {
        add!("vlan");
    }
    if d.mpls_count > 0 {
        add!("mpls");
    }
    if d.pppoe_session.is_some() {
        add!("pppoe");
    }
    if d.arp.is_some() {
        add!("arp");
    }
    match d.ip {
        Some(ip) => {
            if ip.version == 4 {
                add!("ipv4")
            } else {
                add!("ipv6")
            }
            if ip.fragment.is_some() {
                add!("ip-fragment");
            }
            match d.transport {
                Some(Transport::Tcp { .. }) => add!("tcp"),
                Some(Transport::Udp { .. }) => add!("udp"),
                Some(Transport::Sctp { .. }) => add!("sctp"),
                Some(Transport::Icmp { .. }) => add!("icmp"),
                Some(Transport::Icmpv6 { .. }) => add!("icmp6"),
                Some(Transport::Igmp { .. }) => add!("igmp"),
                Some(_) => add!("other-transport"),
                None if ip.fragment.is_some_and(|f| !f.is_first()) => {}
                None if d.tunnel.is_none() => match ip.proto.name() {
                    Some("esp") => add!("esp"),
                    Some("ah") => add!("ah"),
                    Some("ospf") => add!("ospf"),
                    Some("pim") => add!("pim"),
                    Some("vrrp") => add!("vrrp"),
                    _ => add!("other-ip"),
                },
                None => {}
            }
        }
        None if d.arp.is_none() => add!("non-ip"),
        None => {}
    }
    if let Some(t) = d.tunnel {
        match t.kind {
            TunnelKind::Gre => add!("gre"),
            TunnelKind::Erspan => add!("erspan"),
            TunnelKind::IpInIp => add!("ip-in-ip"),
            TunnelKind::Vxlan => add!("vxlan"),
            TunnelKind::Geneve => add!("geneve"),
            TunnelKind::GtpU => add!("gtp-u"),
            _ => add!("tunnel"),
        }
    }
    if d.is_truncated() {
        add!("headers-cut-by-snaplen");
    }
}

fn print_text(out: &mut impl Write, i: &FileInfo) -> io::Result<()> {
    let na = || "n/a".to_string();
    writeln!(out, "File name:           {}", i.file)?;
    let fmt = match (i.format, i.timestamp_precision) {
        (Some(f), Some(p)) => {
            format!("{f} ({p}, {}, version {})", i.byte_order.unwrap_or("?"), i.version.as_deref().unwrap_or("?"))
        }
        (Some(f), None) => {
            format!("{f} ({}, version {})", i.byte_order.unwrap_or("?"), i.version.as_deref().unwrap_or("?"))
        }
        _ => "unknown".into(),
    };
    writeln!(out, "File format:         {fmt}")?;
    writeln!(out, "Compression:         {}", i.compression.unwrap_or("none"))?;
    if let Some(b) = i.file_bytes {
        writeln!(out, "File size:           {b} bytes")?;
    }
    let lts: Vec<String> = i
        .link_types
        .iter()
        .map(|l| format!("{} ({}): {} packets", l.name.unwrap_or("unknown"), l.linktype, l.packets))
        .collect();
    writeln!(out, "Link types:          {}", if lts.is_empty() { na() } else { lts.join(", ") })?;
    writeln!(out, "Interfaces:          {}", i.interfaces)?;
    writeln!(out, "Snapshot length:     {}", i.snaplen.map_or_else(na, |s| s.to_string()))?;
    writeln!(out, "Packets:             {}", i.packets)?;
    writeln!(out, "Truncated packets:   {} (captured < wire length)", i.truncated_packets)?;
    writeln!(out, "Captured bytes:      {}", i.captured_bytes)?;
    writeln!(out, "Wire bytes:          {}", i.wire_bytes)?;
    writeln!(out, "First packet time:   {}", i.first_time.clone().unwrap_or_else(na))?;
    writeln!(out, "Last packet time:    {}", i.last_time.clone().unwrap_or_else(na))?;
    if i.out_of_order > 0 {
        writeln!(out, "Earliest time:       {}", i.earliest_time.clone().unwrap_or_else(na))?;
        writeln!(out, "Latest time:         {}", i.latest_time.clone().unwrap_or_else(na))?;
        writeln!(out, "Out of order:        {} packets earlier than their predecessor", i.out_of_order)?;
    }
    if i.without_timestamp > 0 {
        writeln!(out, "Without timestamp:   {} packets (pcapng simple packet blocks)", i.without_timestamp)?;
    }
    match i.duration_ns {
        Some(d) => {
            writeln!(out, "Duration:            {}.{:09} s", d / 1_000_000_000, d % 1_000_000_000)?;
            if d > 0 {
                let secs = d as f64 / 1e9;
                writeln!(
                    out,
                    "Average rate:        {:.1} packets/s, {:.0} bits/s",
                    i.packets as f64 / secs,
                    i.wire_bytes as f64 * 8.0 / secs
                )?;
            }
        }
        None => writeln!(out, "Duration:            n/a")?,
    }
    if !i.protocols.is_empty() {
        writeln!(out, "Protocols:")?;
        let mut v: Vec<_> = i.protocols.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (name, n) in v {
            let pct = if i.packets > 0 { *n as f64 * 100.0 / i.packets as f64 } else { 0.0 };
            writeln!(out, "  {name:<24} {n:>12} {pct:>6.1}%")?;
        }
    }
    if let Some(e) = &i.error {
        writeln!(out, "Damage:              {e}")?;
    }
    Ok(())
}
