//! `pcaptool convert`: pcap ↔ pcapng, µs ↔ ns, compressed or not, with a snaplen cut and a packet-exact time window.
//! Packet bytes are copied unchanged (unless `--snaplen` cuts them); timestamps are converted as libpcap does.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::ValueEnum;
use pcaptool_packet::{
    Compression, Compressor, FileFormat, OutputFormat, Record, TraceReader, TraceWriter, TsPrecision, precision_for,
};

use crate::args::{Compress, Format, parse_time_arg};
use crate::cmd::same_file;
use crate::progress;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Precision {
    Us,
    Ns,
}

/// Arguments of `pcaptool convert`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Input capture (any format pcaptool reads; `-` for standard input).
    input: PathBuf,
    /// Output file (`-` for standard output).
    output: PathBuf,
    /// Output container. Default: from the output name (`.pcapng` or `.pcap`), else the input's.
    #[arg(long, short = 'F', value_enum)]
    format: Option<Format>,
    /// Timestamp precision. Default: the input's (pcapng keeps each interface's).
    #[arg(long, value_enum)]
    precision: Option<Precision>,
    /// Compression of the output. Default: from the output name (`.gz`, `.zst`, `.lz4`), else none.
    #[arg(long, value_enum)]
    compress: Option<Compress>,
    /// Cut every packet to at most this many captured bytes (the wire length is kept).
    #[arg(long, short = 's')]
    snaplen: Option<u32>,
    /// Keep packets at or after this time (RFC 3339 or epoch seconds).
    #[arg(long, value_parser = parse_time_arg)]
    after: Option<u64>,
    /// Keep packets strictly before this time (RFC 3339 or epoch seconds).
    #[arg(long, value_parser = parse_time_arg)]
    before: Option<u64>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let out =
        Some(if args.output.as_os_str() == "-" { "standard output".into() } else { args.output.display().to_string() });
    run_inner(args).map_err(|e| crate::cmd::name_output(e, out))
}

fn run_inner(args: Args) -> anyhow::Result<ExitCode> {
    if args.output.as_os_str() != "-" && same_file(&args.input, &args.output) {
        bail!(
            "{} is both the input and the output: writing it would destroy the capture being read; choose another output",
            args.input.display()
        );
    }
    // A store's compressed segment is read through its index: every block checked, elided bytes filled in.
    let segment = pcaptool_flowstore::Segment::of_data_file(&args.input)
        .with_context(|| format!("cannot read the segment {}", args.input.display()))?
        .filter(|s| s.stage1.codec.is_compressed());
    let mut reader = match segment {
        Some(seg) => TraceReader::from_bytes(
            seg.plain_data().with_context(|| format!("cannot read the segment {}", args.input.display()))?,
            Some(args.input.clone()),
        ),
        None => TraceReader::open(&args.input)?,
    };
    reader.read_header()?;
    let container = args.format.unwrap_or(match pcaptool_engine::container_for_name(&args.output) {
        Some(pcaptool_engine::Container::PcapNg) => Format::Pcapng,
        Some(_) => Format::Pcap,
        None => match reader.format() {
            Some(FileFormat::PcapNg { .. }) => Format::Pcapng,
            _ => Format::Pcap,
        },
    });
    let forced = args.precision.map(|p| match p {
        Precision::Us => TsPrecision::Micro,
        Precision::Ns => TsPrecision::Nano,
    });
    let format = match container {
        Format::Pcapng => OutputFormat::PcapNg(forced),
        Format::Pcap => OutputFormat::Pcap(forced.unwrap_or_else(|| match reader.format() {
            Some(FileFormat::Pcap { precision, .. }) => precision,
            _ => reader.interfaces().first().map_or(TsPrecision::Micro, |i| precision_for(i.tsresol)),
        })),
    };
    let compression = match args.compress {
        Some(c) => c.compression(),
        None => pcaptool_engine::compression_for_name(&args.output),
    };
    if let (Some(a), Some(b)) = (args.after, args.before)
        && a >= b
    {
        bail!("--after must be earlier than --before: the window is empty");
    }

    let to_stdout = args.output.as_os_str() == "-";
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(io::stdout().lock())
    } else {
        Box::new(File::create(&args.output).with_context(|| format!("cannot create {}", args.output.display()))?)
    };
    let result = copy(&mut reader, sink, format, compression, &args);
    match result {
        Ok((written, damage)) => {
            if let Some(e) = damage {
                eprintln!(
                    "pcaptool: error: {}; the {written} packets before it were written to {}",
                    pcaptool_packet::Chain(&e),
                    args.output.display()
                );
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if !to_stdout {
                let _ = std::fs::remove_file(&args.output);
            }
            Err(e)
        }
    }
}

/// Copies the selected records; returns how many were written and the input damage that ended reading, if any.
fn copy(
    reader: &mut TraceReader,
    sink: Box<dyn Write>,
    format: OutputFormat,
    compression: Option<Compression>,
    args: &Args,
) -> anyhow::Result<(u64, Option<pcaptool_packet::TraceError>)> {
    let total = std::fs::metadata(&args.input).ok().filter(|m| m.is_file()).map(|m| m.len());
    let pb = progress::bytes(total, "convert");
    let comp = Compressor::new(sink, compression)?;
    let mut w = TraceWriter::new(comp, format)?;
    if let Some(s) = args.snaplen {
        w.snaplen(s);
    }
    let mut written = 0u64;
    let mut damage = None;
    let mut n = 0u64;
    let mut cut = Vec::new();
    loop {
        let (rec, ifaces) = match reader.next_with_interfaces() {
            None => break,
            Some(Err(e)) => {
                damage = Some(e);
                break;
            }
            Some(Ok(r)) => r,
        };
        n += 1;
        if n.is_multiple_of(65536) {
            pb.set_position(rec.offset);
        }
        if args.after.is_some_and(|a| rec.ts_ns < a) || args.before.is_some_and(|b| rec.ts_ns >= b) {
            continue;
        }
        let rec = match args.snaplen {
            Some(s) if rec.data.len() > s as usize => {
                cut.clear();
                cut.extend_from_slice(&rec.data[..s as usize]);
                Record { data: &cut, ..rec }
            }
            _ => rec,
        };
        w.write(&rec, ifaces).context("cannot write the output")?;
        written += 1;
    }
    pb.finish_and_clear();
    let comp = w.finish(reader.interfaces()).context("cannot write the output")?;
    let mut sink = comp.finish().context("cannot finish the compressed output")?;
    sink.flush().context("cannot write the output")?;
    Ok((written, damage))
}
