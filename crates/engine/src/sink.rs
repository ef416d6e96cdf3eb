//! Where an answer's records go: the [`Sink`] trait (ripgrep's `Sink` is the model), a trace writer that takes
//! its format and compression from the output's name, a counter, a channel and the caller's closure.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;

use pcaptool_packet::{
    Compression, Compressor, Interface, LinkType, OutputFormat, Record, TraceWriter, TsPrecision, WriteError,
    precision_for,
};

use crate::SinkError;
use crate::positional::Positional;

/// The container a source's records come from, which an output keeps unless told otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NativeFormat {
    /// Legacy pcap of this timestamp precision.
    Pcap(TsPrecision),
    /// pcapng.
    PcapNg,
}

/// What an answer's records refer to, given to [`Sink::begin`] before the first record.
#[derive(Clone, Copy, Debug)]
pub struct Layout<'a> {
    /// The interfaces known before the first record; a record's `iface` indexes the interfaces passed with it
    /// (a pcapng stream may declare more as it goes).
    pub interfaces: &'a [Interface],
    /// The source's own container.
    pub native: NativeFormat,
    /// Whether `interfaces` is every interface the answer can refer to (a store's; a trace's only when it is
    /// pcap).
    pub complete: bool,
}

/// A receiver of the records an answer selects, in the answer's order.
///
/// The engine calls [`begin`](Sink::begin) once, [`record`](Sink::record) for each match (up to the request's
/// limit), then [`finish`](Sink::finish); on an error it calls [`abandon`](Sink::abandon) instead of `finish`.
pub trait Sink {
    /// Called once, before any record.
    fn begin(&mut self, layout: &Layout<'_>) -> Result<(), SinkError> {
        let _ = layout;
        Ok(())
    }

    /// Takes one record; `ifaces` describes the interfaces its `iface` refers to. `Ok(false)` stops the answer
    /// (a closed channel, a caller that has seen enough).
    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError>;

    /// Called once after the last record.
    fn finish(&mut self, ifaces: &[Interface]) -> Result<(), SinkError> {
        let _ = ifaces;
        Ok(())
    }

    /// Called instead of [`finish`](Sink::finish) when the answer failed: a file output removes what it wrote.
    fn abandon(&mut self) {}

    /// A pcap file that takes records at offsets computed in advance, written by several threads at once
    /// (pcapWT's parallel extraction), if this sink is one. The engine asks before the first record, and only
    /// for answers whose records all have the first interface of `ifaces`; the bytes must be those
    /// [`record`](Sink::record) would write.
    fn positional(&mut self, ifaces: &[Interface]) -> Result<Option<&mut Positional>, SinkError> {
        let _ = ifaces;
        Ok(None)
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn begin(&mut self, layout: &Layout<'_>) -> Result<(), SinkError> {
        (**self).begin(layout)
    }
    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        (**self).record(rec, ifaces)
    }
    fn finish(&mut self, ifaces: &[Interface]) -> Result<(), SinkError> {
        (**self).finish(ifaces)
    }
    fn abandon(&mut self) {
        (**self).abandon()
    }
    fn positional(&mut self, ifaces: &[Interface]) -> Result<Option<&mut Positional>, SinkError> {
        (**self).positional(ifaces)
    }
}

/// Counts records and keeps nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counter {
    /// Records taken.
    pub records: u64,
    /// Their captured bytes.
    pub bytes: u64,
}

impl Sink for Counter {
    fn record(&mut self, rec: &Record<'_>, _: &[Interface]) -> Result<bool, SinkError> {
        self.records += 1;
        self.bytes += rec.data.len() as u64;
        Ok(true)
    }
}

/// The caller's closure as a sink: it gets each record and says whether to go on.
pub struct FnSink<F>(pub F);

impl<F: FnMut(&Record<'_>, &[Interface]) -> bool> Sink for FnSink<F> {
    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        Ok((self.0)(rec, ifaces))
    }
}

impl<F> std::fmt::Debug for FnSink<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnSink")
    }
}

/// A record with its bytes owned, as [`ChannelSink`] sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedRecord {
    /// Timestamp, ns since the Unix epoch.
    pub ts_ns: u64,
    /// Length on the wire.
    pub wirelen: u32,
    /// Link type.
    pub linktype: LinkType,
    /// Interface, as in [`Record::iface`].
    pub iface: u32,
    /// Captured bytes.
    pub data: Vec<u8>,
}

/// Sends each record, owned, over a bounded channel (to another thread, or an async task); the answer stops when
/// the receiver is dropped.
#[derive(Debug)]
pub struct ChannelSink(pub SyncSender<OwnedRecord>);

impl Sink for ChannelSink {
    fn record(&mut self, rec: &Record<'_>, _: &[Interface]) -> Result<bool, SinkError> {
        let owned = OwnedRecord {
            ts_ns: rec.ts_ns,
            wirelen: rec.wirelen,
            linktype: rec.linktype,
            iface: rec.iface,
            data: rec.data.to_vec(),
        };
        Ok(self.0.send(owned).is_ok())
    }
}

/// An output container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Container {
    /// Legacy pcap: one link type.
    Pcap,
    /// pcapng: interfaces of any link types.
    PcapNg,
}

/// How a [`TraceSink`] writes; what is left `None` comes from the output's name, then from the source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The container (default: `.pcapng` or `.pcap` in the name, else the source's; pcap holds one link type).
    pub container: Option<Container>,
    /// Compression: `Some(None)` for none (default: `.gz`, `.zst`, `.lz4` at the end of the name, else none).
    pub compression: Option<Option<Compression>>,
    /// Whether to gather the output in a large buffer (1 MiB) before each write to the destination (default
    /// true: fewer system calls for files and pipes). A service streaming an answer turns it off, so that the
    /// first bytes (in pieces of the format writer's own 128 KiB) go out while the engine finds the rest.
    pub gather: Option<bool>,
}

impl WriteOptions {
    /// Options that take everything from the name and the source.
    pub fn new() -> WriteOptions {
        WriteOptions::default()
    }

    /// Forces the container.
    pub fn container(mut self, c: Container) -> WriteOptions {
        self.container = Some(c);
        self
    }

    /// Forces the compression (`None`: none).
    pub fn compression(mut self, c: Option<Compression>) -> WriteOptions {
        self.compression = Some(c);
        self
    }

    /// Whether to gather the output in a 1 MiB buffer before writing it (see [`WriteOptions::gather`]).
    pub fn gather(mut self, yes: bool) -> WriteOptions {
        self.gather = Some(yes);
        self
    }
}

/// The container a file name asks for by its extension, a compression extension aside (`x.pcap.gz` is pcap,
/// `x.pcapng` pcapng), if it asks.
pub fn container_for_name(path: &Path) -> Option<Container> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    let base = [".gz", ".zst", ".zstd", ".lz4"].iter().find_map(|c| name.strip_suffix(c)).unwrap_or(&name);
    match base.rsplit_once('.')?.1 {
        "pcapng" | "ntar" | "scap" => Some(Container::PcapNg),
        "pcap" | "cap" | "dmp" => Some(Container::Pcap),
        _ => None,
    }
}

/// The compression a file name asks for by its last extension.
pub fn compression_for_name(path: &Path) -> Option<Compression> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    if name.ends_with(".gz") {
        Some(Compression::Gzip)
    } else if name.ends_with(".zst") || name.ends_with(".zstd") {
        Some(Compression::Zstd)
    } else if name.ends_with(".lz4") {
        Some(Compression::Lz4)
    } else {
        None
    }
}

enum Dest {
    File(File),
    Other(Box<dyn Write + Send>),
}

enum State {
    /// Nothing written yet.
    Ready(Dest),
    /// The writer, once the format is known.
    Stream(Box<TraceWriter<Compressor<Box<dyn Write + Send>>>>),
    Positional(Positional),
    Done,
}

/// What [`Sink::begin`] decided.
#[derive(Clone, Copy, Debug)]
struct Chosen {
    format: OutputFormat,
    compression: Option<Compression>,
    snaplen: Option<u32>,
}

/// Writes an answer as a trace file (or to any writer): pcap whenever one link type is involved, at the largest
/// snapshot length, pcapng when link types differ or when asked; the container and compression from the name,
/// as `pcaptool convert` does, unless [`WriteOptions`] say otherwise. An empty answer is still a file every
/// tool opens (pcapng gets its interfaces).
pub struct TraceSink {
    name: String,
    /// The file to remove when the answer fails.
    path: Option<PathBuf>,
    opts: WriteOptions,
    chosen: Option<Chosen>,
    /// Interfaces to declare up front (pcapng of a complete layout).
    declare: Vec<Interface>,
    state: State,
}

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSink").field("name", &self.name).field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl TraceSink {
    /// Creates (or truncates) the file `path`.
    pub fn create(path: &Path, opts: WriteOptions) -> Result<TraceSink, SinkError> {
        let name = path.display().to_string();
        let file = File::create(path).map_err(|source| SinkError::Io { to: name.clone(), source })?;
        let opts = WriteOptions {
            container: opts.container.or_else(|| container_for_name(path)),
            compression: Some(opts.compression.unwrap_or_else(|| compression_for_name(path))),
            gather: opts.gather,
        };
        Ok(TraceSink {
            name,
            path: Some(path.to_path_buf()),
            opts,
            chosen: None,
            declare: Vec::new(),
            state: State::Ready(Dest::File(file)),
        })
    }

    /// Writes to standard output.
    pub fn stdout(opts: WriteOptions) -> TraceSink {
        TraceSink::to_writer(Box::new(io::stdout()), "standard output", opts)
    }

    /// Writes to `w`, called `name` in errors.
    pub fn to_writer(w: Box<dyn Write + Send>, name: &str, opts: WriteOptions) -> TraceSink {
        TraceSink {
            name: name.to_string(),
            path: None,
            opts,
            chosen: None,
            declare: Vec::new(),
            state: State::Ready(Dest::Other(w)),
        }
    }

    /// The output's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn write_error(&self, source: WriteError) -> SinkError {
        match source {
            WriteError::LinkTypeMismatch { file, packet } => {
                SinkError::OneLinkType { to: self.name.clone(), linktypes: vec![file, packet] }
            }
            source => SinkError::Write { to: self.name.clone(), source },
        }
    }

    /// Builds the stream writer at the first use (kept out of the per-record path: building it takes a large
    /// stack frame, which every call would otherwise probe).
    #[cold]
    #[inline(never)]
    fn start_stream(&mut self) -> Result<(), SinkError> {
        if !matches!(self.state, State::Ready(_)) {
            return Err(SinkError::Io { to: self.name.clone(), source: io::Error::other("the output is finished") });
        }
        let State::Ready(dest) = std::mem::replace(&mut self.state, State::Done) else { unreachable!() };
        let chosen = self.chosen.unwrap_or(Chosen {
            format: OutputFormat::Pcap(TsPrecision::Micro),
            compression: None,
            snaplen: None,
        });
        let w: Box<dyn Write + Send> = match (dest, self.opts.gather.unwrap_or(true)) {
            (Dest::File(f), true) => Box::new(BufWriter::with_capacity(1 << 20, f)),
            (Dest::File(f), false) => Box::new(f),
            (Dest::Other(w), true) => Box::new(BufWriter::with_capacity(1 << 20, w)),
            (Dest::Other(w), false) => w,
        };
        let comp =
            Compressor::new(w, chosen.compression).map_err(|source| SinkError::Io { to: self.name.clone(), source })?;
        let mut tw = TraceWriter::new(comp, chosen.format).map_err(|e| self.write_error(e))?;
        if let Some(s) = chosen.snaplen {
            tw.snaplen(s);
        }
        if !self.declare.is_empty() {
            tw.declare(&self.declare).map_err(|e| self.write_error(e))?;
        }
        self.state = State::Stream(Box::new(tw));
        Ok(())
    }
}

/// The distinct link types (FCS bits aside) of `ifaces`, in order of first appearance.
fn linktypes(ifaces: &[Interface]) -> Vec<LinkType> {
    let mut out: Vec<LinkType> = Vec::new();
    for i in ifaces {
        if !out.iter().any(|l| l.base() == i.linktype.base()) {
            out.push(i.linktype.base());
        }
    }
    out
}

impl Sink for TraceSink {
    fn begin(&mut self, layout: &Layout<'_>) -> Result<(), SinkError> {
        let lts = linktypes(layout.interfaces);
        let container = self.opts.container.unwrap_or(match layout.native {
            NativeFormat::Pcap(_) => Container::Pcap,
            // One link type: pcap, as tcpdump writes; several: pcapng.
            NativeFormat::PcapNg if layout.complete && lts.len() == 1 => Container::Pcap,
            NativeFormat::PcapNg => Container::PcapNg,
        });
        let compression = self.opts.compression.flatten();
        let chosen = match container {
            Container::Pcap => {
                if lts.len() > 1 {
                    return Err(SinkError::OneLinkType { to: self.name.clone(), linktypes: lts });
                }
                let precision = match layout.native {
                    NativeFormat::Pcap(p) => p,
                    NativeFormat::PcapNg => {
                        if layout.interfaces.iter().any(|i| precision_for(i.tsresol) == TsPrecision::Nano) {
                            TsPrecision::Nano
                        } else {
                            TsPrecision::Micro
                        }
                    }
                };
                // Interfaces of one link type that differ in snapshot length: the largest (libpcap refuses a
                // pcapng whose interfaces differ, and a pcap has one).
                let snaplen = match layout.interfaces {
                    [_, _, ..] => layout.interfaces.iter().map(|i| i.snaplen).max().filter(|&s| s > 0),
                    _ => None,
                };
                Chosen { format: OutputFormat::Pcap(precision), compression, snaplen }
            }
            Container::PcapNg => {
                if layout.complete {
                    self.declare = layout.interfaces.to_vec();
                }
                Chosen { format: OutputFormat::PcapNg(None), compression, snaplen: None }
            }
        };
        self.chosen = Some(chosen);
        Ok(())
    }

    fn record(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<bool, SinkError> {
        if !matches!(self.state, State::Stream(_)) {
            self.start_stream()?;
        }
        let State::Stream(w) = &mut self.state else { unreachable!("started above") };
        match w.write(rec, ifaces) {
            Ok(()) => Ok(true),
            Err(e) => Err(self.write_error(e)),
        }
    }

    fn finish(&mut self, ifaces: &[Interface]) -> Result<(), SinkError> {
        if let State::Ready(_) = self.state {
            self.start_stream()?;
        }
        let name = self.name.clone();
        match std::mem::replace(&mut self.state, State::Done) {
            State::Stream(w) => {
                let comp = (*w).finish(ifaces).map_err(|e| self.write_error(e))?;
                let mut inner = comp.finish().map_err(|source| SinkError::Io { to: name.clone(), source })?;
                inner.flush().map_err(|source| SinkError::Io { to: name, source })
            }
            State::Positional(p) => p.finish().map_err(|source| SinkError::Io { to: name, source }),
            State::Ready(_) | State::Done => Ok(()),
        }
    }

    fn abandon(&mut self) {
        self.state = State::Done;
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }

    fn positional(&mut self, ifaces: &[Interface]) -> Result<Option<&mut Positional>, SinkError> {
        let Some(Chosen { format: OutputFormat::Pcap(precision), compression: None, snaplen: None }) = self.chosen
        else {
            return Ok(None);
        };
        if let State::Ready(Dest::File(f)) = &self.state {
            // Writing at offsets needs a file that takes them: a regular file or a device such as /dev/null, not
            // a pipe.
            let takes_offsets = f.metadata().is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_file() || m.file_type().is_char_device()
            });
            if !takes_offsets || ifaces.len() != 1 || ifaces[0].fcs_len.is_some() {
                return Ok(None);
            }
            let State::Ready(Dest::File(f)) = std::mem::replace(&mut self.state, State::Done) else { unreachable!() };
            let p = Positional::start(f, &self.name, precision, ifaces)?;
            self.state = State::Positional(p);
        }
        match &mut self.state {
            State::Positional(p) => Ok(Some(p)),
            _ => Ok(None),
        }
    }
}
