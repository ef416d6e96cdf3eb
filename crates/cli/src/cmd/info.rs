//! `pcaptool info`: what capinfos tells about a capture, plus a protocol breakdown; text or `--json`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use pcaptool_packet::{
    Chain, Decoded, FileFormat, LinkType, Rfc3339, TraceReader, Transport, TsPrecision, TunnelKind, decode,
};
use serde::Serialize;

use crate::inputs::Input;
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
    if let [dir] = args.files.as_slice()
        && pcaptool_flowstore::is_store_dir(dir)
    {
        return crate::cmd::store::info(dir, args.json);
    }
    // Like capinfos: every file reported, one that cannot be opened or is damaged said on stderr, and the exit
    // status says whether any was. A pattern that matches nothing, or a store among files, is one such error.
    let mut infos = Vec::new();
    let mut failed = false;
    for item in &args.files {
        let inputs = match crate::inputs::expand(std::slice::from_ref(item)) {
            Ok(i) => i,
            Err(e) => {
                failed = true;
                infos.push(Err((item.display().to_string(), e)));
                continue;
            }
        };
        for input in inputs {
            let info = match &input {
                Input::Trace(path) => summarize(path, !args.no_protocols),
                Input::Store(dir) => Err((
                    dir.display().to_string(),
                    anyhow::anyhow!(
                        "{} is a flow store: `pcaptool info {}` describes it alone",
                        dir.display(),
                        dir.display()
                    ),
                )),
            };
            failed |= info.as_ref().map_or(true, |i| i.error.is_some());
            infos.push(info);
        }
    }
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        let values: Vec<serde_json::Value> = infos
            .iter()
            .map(|i| match i {
                Ok(info) => serde_json::to_value(info),
                Err((file, e)) => Ok(serde_json::json!({ "file": file, "error": format!("{e:#}") })),
            })
            .collect::<Result<_, _>>()?;
        serde_json::to_writer_pretty(&mut out, &values)?;
        writeln!(out)?;
    } else {
        for (i, info) in infos.iter().filter_map(|i| i.as_ref().ok()).enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            print_text(&mut out, info)?;
        }
    }
    out.flush()?;
    drop(out);
    for info in &infos {
        match info {
            Ok(FileInfo { error: Some(e), .. }) => eprintln!("pcaptool: error: {e}"),
            Err((_, e)) => eprintln!("pcaptool: error: {e:#}"),
            Ok(_) => {}
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Reads one capture to the end (or to its damage) and gathers its facts. Errors (with the file's name) only
/// when it cannot be opened.
fn summarize(path: &PathBuf, protocols: bool) -> Result<FileInfo, (String, anyhow::Error)> {
    let mut reader = TraceReader::open(path).map_err(|e| (path.display().to_string(), anyhow::Error::from(e)))?;
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
                info.error = Some(Chain(&e).to_string());
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

/// The protocols of the breakdown; the discriminant indexes [`Proto::LABELS`], so per-packet counting is an array
/// increment.
#[derive(Clone, Copy, Debug)]
enum Proto {
    Ethernet,
    Vlan,
    Mpls,
    Pppoe,
    Arp,
    Ipv4,
    Ipv6,
    IpFragment,
    Tcp,
    Udp,
    Sctp,
    Icmp,
    Icmp6,
    Igmp,
    OtherTransport,
    Esp,
    Ah,
    Ospf,
    Pim,
    Vrrp,
    OtherIp,
    NonIp,
    Gre,
    Erspan,
    IpInIp,
    Vxlan,
    Geneve,
    GtpU,
    Tunnel,
    HeadersCut,
}

impl Proto {
    /// Names as printed, in discriminant order.
    const LABELS: [&'static str; 30] = [
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
        "ip-in-ip",
        "vxlan",
        "geneve",
        "gtp-u",
        "tunnel",
        "headers-cut-by-snaplen",
    ];
}

/// Per-packet protocol counts.
#[derive(Debug)]
struct ProtoCounts([u64; Proto::LABELS.len()]);

impl ProtoCounts {
    fn new() -> ProtoCounts {
        ProtoCounts([0; Proto::LABELS.len()])
    }

    #[inline]
    fn add(&mut self, p: Proto) {
        self.0[p as usize] += 1;
    }

    fn into_map(self) -> BTreeMap<&'static str, u64> {
        Proto::LABELS.iter().zip(self.0).filter(|(_, n)| *n > 0).map(|(l, n)| (*l, n)).collect()
    }
}

/// Counts the protocols a packet contains, outer headers and tunnels.
fn classify(d: &Decoded, counts: &mut ProtoCounts) {
    if d.eth.is_some() {
        counts.add(Proto::Ethernet);
    }
    if d.vlan_count > 0 {
        counts.add(Proto::Vlan);
    }
    if d.mpls_count > 0 {
        counts.add(Proto::Mpls);
    }
    if d.pppoe_session.is_some() {
        counts.add(Proto::Pppoe);
    }
    if d.arp.is_some() {
        counts.add(Proto::Arp);
    }
    match d.ip {
        Some(ip) => {
            counts.add(if ip.version == 4 { Proto::Ipv4 } else { Proto::Ipv6 });
            if ip.fragment.is_some() {
                counts.add(Proto::IpFragment);
            }
            let transport = match d.transport {
                Some(Transport::Tcp { .. }) => Some(Proto::Tcp),
                Some(Transport::Udp { .. }) => Some(Proto::Udp),
                Some(Transport::Sctp { .. }) => Some(Proto::Sctp),
                Some(Transport::Icmp { .. }) => Some(Proto::Icmp),
                Some(Transport::Icmpv6 { .. }) => Some(Proto::Icmp6),
                Some(Transport::Igmp { .. }) => Some(Proto::Igmp),
                Some(_) => Some(Proto::OtherTransport),
                None if ip.fragment.is_some_and(|f| !f.is_first()) => None,
                None if d.tunnel.is_none() => Some(match ip.proto.name() {
                    Some("esp") => Proto::Esp,
                    Some("ah") => Proto::Ah,
                    Some("ospf") => Proto::Ospf,
                    Some("pim") => Proto::Pim,
                    Some("vrrp") => Proto::Vrrp,
                    _ => Proto::OtherIp,
                }),
                None => None,
            };
            if let Some(p) = transport {
                counts.add(p);
            }
        }
        None if d.arp.is_none() => counts.add(Proto::NonIp),
        None => {}
    }
    if let Some(t) = d.tunnel {
        counts.add(match t.kind {
            TunnelKind::Gre => Proto::Gre,
            TunnelKind::Erspan => Proto::Erspan,
            TunnelKind::IpInIp => Proto::IpInIp,
            TunnelKind::Vxlan => Proto::Vxlan,
            TunnelKind::Geneve => Proto::Geneve,
            TunnelKind::GtpU => Proto::GtpU,
            _ => Proto::Tunnel,
        });
    }
    if d.is_truncated() {
        counts.add(Proto::HeadersCut);
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
